//! The `all-down` drill scenario: safe mode (`on_all_down: park`).
//!
//! Both pools of the drill's route are drained (every backend down, as
//! the router sees it) while the load arrives: every request must be
//! parked at once and get a handle (`202` with `Prefer: respond-async`).
//! Three requests in four are READ, the fourth SEND. Then the pools come
//! back (the policy is applied again without the drain, on every proxy):
//! every READ task must run exactly once, oldest first, and its answer be
//! fetched through a proxy other than the one that parked it; no SEND task
//! may be sent (they wait for an operator's approval). With `--proxies N
//! --shared-store` the tasks are shared by N proxies.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_mock::{MockConfig, MockModel};
use router_proxy::{Mode, ProxyOptions, RunningProxy, Settings};
use tokio::time::Instant;

use super::{
    check, parse_policy, percentile, secs, start, wait_for_store, DrillConfig, ScenarioReport,
};
use crate::error::CliError;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The scenario's policy: the drill's two pools, drained or not, behind a
/// route that parks.
fn policy(cfg: &DrillConfig, primary: &str, fallback: &str, drained: bool) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
metadata: {{name: drill-all-down}}
spec:
  defaults: {{deadline_ms: {deadline}}}
  pools:
    - name: primary
      provider: openai
      endpoints: ["{primary}"]
      drain: {drained}
    - name: fallback
      provider: openai
      endpoints: ["{fallback}"]
      drain: {drained}
  routes:
    - name: default
      chain: [primary, fallback]
      on_all_down: park
      park: {{ttl_s: 600, max_tasks: 1000}}
"#,
        deadline = cfg.deadline.as_millis().max(1),
    )
}

async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: &str,
) -> Result<(u16, http::HeaderMap, Bytes), CliError> {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    let req = b
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| CliError::Request(e.to_string()))?;
    const WAIT: Duration = Duration::from_secs(30);
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .map_err(|_| CliError::NoAnswer(WAIT))?
        .map_err(|e| CliError::Request(e.to_string()))?;
    let (head, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| CliError::Request(e.to_string()))?
        .to_bytes();
    Ok((head.status.as_u16(), head.headers, body))
}

/// One parked request.
struct Parked {
    id: String,
    send: bool,
    proxy: usize,
    task: Option<String>,
    status: u16,
    elapsed: Duration,
}

/// Runs the scenario.
pub(super) async fn run(cfg: &DrillConfig) -> Result<ScenarioReport, CliError> {
    let start_mock = |name: &str| MockConfig {
        name: name.into(),
        latency: cfg.fallback_service,
        ..MockConfig::default()
    };
    let primary = MockModel::start(start_mock("primary"))
        .await
        .map_err(|e| start("primary mock", e))?;
    let fallback = MockModel::start(start_mock("fallback"))
        .await
        .map_err(|e| start("fallback mock", e))?;
    let down = parse_policy(&policy(cfg, &primary.url(), &fallback.url(), true))?;
    let up = parse_policy(&policy(cfg, &primary.url(), &fallback.url(), false))?;
    let shared_store = match &cfg.shared_store {
        Some(url) => Some(router_proxy::SharedStore::new(url)?),
        None if cfg.proxies > 1 => return Err(CliError::ProxiesNeedStore),
        None => None,
    };
    let mut proxies: Vec<RunningProxy> = Vec::new();
    for _ in 0..cfg.proxies.max(1) {
        let p = router_proxy::start(ProxyOptions {
            settings: Settings {
                bind: [127, 0, 0, 1].into(),
                port: 0,
                shared_store: shared_store.clone(),
                ..Settings::default()
            },
            mode: Mode::Inline(Box::new(down.clone())),
            route_log: Box::new(std::io::sink()),
        })
        .await
        .map_err(|e| start("router", e))?;
        proxies.push(p);
    }
    if shared_store.is_some() {
        wait_for_store(&proxies).await?;
    }
    let bases: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://{}", p.local_addr()))
        .collect();
    let n = bases.len();
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let run_id = format!("{:x}", rand_tag());

    // Every backend down: the load arrives.
    let gap = Duration::from_secs_f64(1.0 / cfg.rate);
    let t0 = Instant::now();
    let mut sent = Vec::new();
    for i in 0..cfg.count {
        tokio::time::sleep_until(t0 + gap.mul_f64(i as f64)).await;
        let send_risk = i % 4 == 3;
        let id = format!("all-down-{run_id}-{i}");
        let client = client.clone();
        let url = format!("{}/v1/chat/completions", bases[i % n]);
        sent.push(tokio::spawn(async move {
            let headers = [
                ("content-type", "application/json".to_string()),
                ("prefer", "respond-async".to_string()),
                ("x-request-id", id.clone()),
                (
                    "x-router-risk",
                    if send_risk { "SEND" } else { "READ" }.to_string(),
                ),
            ];
            let body = format!(
                r#"{{"model":"drill","messages":[{{"role":"user","content":"task {i}"}}]}}"#
            );
            let at = Instant::now();
            let r = send(&client, Method::POST, &url, &headers, &body).await;
            let (status, task) = match r {
                Ok((status, _, body)) => (
                    status,
                    serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v["id"].as_str().map(str::to_string)),
                ),
                Err(_) => (0, None),
            };
            Parked {
                id,
                send: send_risk,
                proxy: i % n,
                task,
                status,
                elapsed: at.elapsed(),
            }
        }));
    }
    let mut parked = Vec::new();
    for s in sent {
        parked.push(s.await?);
    }

    // The backends come back, on every proxy.
    for p in &proxies {
        p.config().apply_policy(up.clone(), "drill: backends back");
    }
    let recovered = Instant::now();
    // Each READ task is fetched through another proxy than the one that
    // parked it, until it is done (or the wait is over).
    let wait = cfg.deadline.saturating_mul(4) + Duration::from_secs(5);
    let mut answers: HashMap<String, (u16, Option<String>, Duration)> = HashMap::new();
    let reads: Vec<&Parked> = parked
        .iter()
        .filter(|p| !p.send && p.task.is_some())
        .collect();
    while answers.len() < reads.len() && recovered.elapsed() < wait {
        for p in &reads {
            let Some(task) = &p.task else { continue };
            if answers.contains_key(task) {
                continue;
            }
            let url = format!("{}/v1/router/tasks/{task}", bases[(p.proxy + 1) % n]);
            if let Ok((status, headers, _)) = send(&client, Method::GET, &url, &[], "").await {
                let state = headers
                    .get("x-router-task-state")
                    .and_then(|v| v.to_str().ok());
                if matches!(state, Some("done" | "failed")) {
                    let route = headers
                        .get("x-router-route")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    answers.insert(task.clone(), (status, route, recovered.elapsed()));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The SEND tasks a while later: still waiting for an operator.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut send_states: BTreeMap<String, usize> = BTreeMap::new();
    for p in parked.iter().filter(|p| p.send) {
        let state = match &p.task {
            Some(task) => {
                let url = format!("{}/v1/router/tasks/{task}", bases[(p.proxy + 1) % n]);
                match send(&client, Method::GET, &url, &[], "").await {
                    Ok((_, headers, _)) => headers
                        .get("x-router-task-state")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("?")
                        .to_string(),
                    Err(_) => "unreachable".into(),
                }
            }
            None => "not parked".into(),
        };
        *send_states.entry(state).or_default() += 1;
    }

    // Generations per request id, at the mocks.
    let mut generations: HashMap<String, usize> = HashMap::new();
    for g in primary
        .generations()
        .into_iter()
        .chain(fallback.generations())
    {
        if let Some(id) = g.request_id {
            *generations.entry(id).or_default() += 1;
        }
    }
    for p in proxies {
        p.shutdown();
    }

    let total = parked.len();
    let accepted = parked
        .iter()
        .filter(|p| p.status == 202 && p.task.is_some())
        .count();
    let read_count = parked.iter().filter(|p| !p.send).count();
    let send_count = total - read_count;
    let done_ok = answers.values().filter(|(s, _, _)| *s == 200).count();
    let duplicates = generations.values().filter(|&&c| c > 1).count();
    let sends_sent = parked
        .iter()
        .filter(|p| p.send && generations.contains_key(&p.id))
        .count();
    let reads_run = parked
        .iter()
        .filter(|p| !p.send && generations.get(&p.id) == Some(&1))
        .count();
    let last_done = answers
        .values()
        .map(|(_, _, d)| *d)
        .max()
        .unwrap_or_default();
    let mut routes = BTreeMap::new();
    for (_, route, _) in answers.values() {
        *routes
            .entry(route.clone().unwrap_or_else(|| "?".into()))
            .or_default() += 1;
    }
    let mut sheds = BTreeMap::new();
    sheds.insert("parked".to_string(), accepted);
    let mut elapsed: Vec<Duration> = parked.iter().map(|p| p.elapsed).collect();
    elapsed.sort_unstable();

    let mut checks = Vec::new();
    check(
        &mut checks,
        "no duplicate generations",
        duplicates.to_string(),
        duplicates == 0,
    );
    check(
        &mut checks,
        format!("all {total} parked at once while every pool is down (202 and a task)"),
        format!("{accepted}/{total}"),
        accepted == total,
    );
    let quick = cfg.tolerance.saturating_mul(5);
    check(
        &mut checks,
        format!("each handle comes within {}", secs(quick)),
        secs(elapsed.last().copied().unwrap_or_default()),
        elapsed.last().is_none_or(|e| *e <= quick),
    );
    check(
        &mut checks,
        format!(
            "after recovery, all {read_count} READ tasks answered 200{}",
            if n > 1 { " through another proxy" } else { "" }
        ),
        format!("{done_ok}/{read_count} in {}", secs(last_done)),
        done_ok == read_count,
    );
    check(
        &mut checks,
        "each READ task generated exactly once",
        format!("{reads_run}/{read_count}"),
        reads_run == read_count,
    );
    check(
        &mut checks,
        format!("no SEND task sent without approval; all {send_count} waiting_approval"),
        format!(
            "{sends_sent} sent; {}",
            send_states
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        sends_sent == 0 && send_states.get("waiting_approval") == Some(&send_count),
    );
    let pass = checks.iter().all(|c| c.pass);
    Ok(ScenarioReport {
        scenario: super::Scenario::AllDown.name().into(),
        requests: total,
        routes,
        sheds,
        duplicate_generations: duplicates,
        abandoned: primary.stats().cancelled + fallback.stats().cancelled,
        p50_s: percentile(&elapsed, 0.50).as_secs_f64(),
        p95_s: percentile(&elapsed, 0.95).as_secs_f64(),
        max_s: elapsed.last().copied().unwrap_or_default().as_secs_f64(),
        client_retries: 0,
        checks,
        pass,
        skipped: None,
    })
}

/// A tag that keeps request ids of runs sharing a store apart.
fn rand_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish()
}
