//! The per-proxy dispatcher of parked tasks.
//!
//! Every [`POLL`] while the policy has a route that parks (else every 10 s,
//! for tasks an earlier policy parked) it reads the live tasks' records,
//! oldest first, at most [`SCAN`] (never their bodies: a body is read only
//! to run its task), and for each:
//!
//! - a waiting task past its TTL or deadline is marked `expired`;
//! - a running task whose runner's lease ran out (a proxy that died
//!   holding it) is taken back ([`router_policy::park::on_lease_lost`]:
//!   READ/DRAFT wait again, SEND/DESTRUCTIVE fail, never sent twice);
//! - a task that may run ([`router_policy::park::may_run`]: waiting for
//!   capacity, approved if it has side effects, inside its time) whose
//!   route has a pool that can take work now is claimed (compare-and-set:
//!   one proxy wins) and run, at most [`MAX_RUNS`] at a time per proxy
//!   (none while the proxy drains). A run whose loopback connection cannot
//!   be made sent nothing: its task waits again. A run shed with a
//!   `Retry-After` (a tenant's rate limit) is not claimed again before it
//!   has passed.
//!
//! A run is the parked request sent to this proxy over loopback (see the
//! module docs of [`super`]); while it runs, its lease is renewed every
//! third of the lease. A renewal that finds the task changed (an operator
//! dropped it) abandons the run. Its answer (read up to the replay cap,
//! `CUSTOM_ROUTER_IDEMPOTENCY_MAX_ANSWER_BYTES`) is stored with the task:
//! [`router_policy::park::after_run`] says whether it is done, failed, or
//! back in line (the router shed it again before sending anything).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_policy::park::{
    after_run, may_run, Event, RouterError, RunEnd, TaskAnswer, TaskState, Wait,
};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{unix_ms, RunError, Tasks, Versioned, TASK_RUN};
use crate::config::Snapshot;
use crate::Shared;

/// How often the live tasks are read.
pub(crate) const POLL: Duration = Duration::from_millis(250);
/// Most live tasks read per poll.
pub(crate) const SCAN: usize = 256;
/// Most runs at a time per proxy.
pub(crate) const MAX_RUNS: usize = 4;
/// Without a parking route in the policy, the live tasks are read every
/// this many polls (10 s) only.
const IDLE_EVERY: u64 = 40;

/// The router's own answers that mean nothing was sent, and that the task
/// may wait out (a tenant's `rate_limited` among them: a rate or
/// concurrency limit; a spent budget, `budget_exceeded`, fails the task).
const SHED_BEFORE_SEND: [&str; 7] = [
    "no_backend",
    "queue_full",
    "queue_timeout",
    "overloaded",
    "parked",
    "shared_store_unavailable",
    "rate_limited",
];

/// The longest `Retry-After` a shed run waits (a longer one waits this
/// long, then is tried again).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

type SelfClient = Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// The client of this proxy's own listener: over TLS when the listener
/// speaks it, trusting exactly the certificate it presents.
fn self_client(shared: &Shared) -> Result<(SelfClient, &'static str), rustls::Error> {
    let (config, scheme) = match &shared.tls {
        Some(tls) => (tls.loopback_client()?, "https"),
        // Never used for a handshake: the URIs are `http`.
        None => (
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
            "http",
        ),
    };
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .build();
    Ok((
        Client::builder(TokioExecutor::new()).build(connector),
        scheme,
    ))
}

/// Runs the dispatcher until the proxy stops (its runs are aborted with it).
pub(crate) async fn run(shared: Arc<Shared>, tasks: Arc<Tasks>, target: SocketAddr) {
    let (client, scheme) = match self_client(&shared) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "parked tasks cannot run: no client for the listener");
            return;
        }
    };
    // `http://127.0.0.1:PORT`, or https over the listener's TLS.
    let target: Arc<str> = format!("{scheme}://{target}").into();
    let mut running: JoinSet<()> = JoinSet::new();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut store_down = false;
    let mut idle_ticks: u64 = 0;
    loop {
        tick.tick().await;
        while running.try_join_next().is_some() {}
        let snapshot = shared.config.load();
        // Without a parking route only leftovers (tasks parked under an
        // earlier policy) are looked at, to expire them: every IDLE_EVERY
        // ticks.
        if !snapshot.policy.routes.iter().any(|r| r.park.is_some()) {
            idle_ticks += 1;
            if idle_ticks < IDLE_EVERY {
                continue;
            }
        }
        idle_ticks = 0;
        let listed = match tasks.store.live(SCAN).await {
            Ok(listed) => {
                store_down = false;
                listed
            }
            Err(e) => {
                if !store_down {
                    tracing::warn!(error = %e, "parked tasks: the store cannot be read; retrying");
                    store_down = true;
                }
                continue;
            }
        };
        let mut live: std::collections::HashMap<(String, &'static str), i64> =
            std::collections::HashMap::new();
        for mut v in listed {
            let id = v.task.id.clone();
            let now = unix_ms();
            *live
                .entry((v.task.route.clone(), v.task.state.as_str()))
                .or_default() += 1;
            if v.task.state == TaskState::Running {
                if v.task.lease_until_ms.is_some_and(|l| l <= now) {
                    let runner = v.task.claimed_by.clone().unwrap_or_default();
                    let r = tasks
                        .change(&mut v, Event::LeaseLost, |t| {
                            if t.state == TaskState::Failed {
                                t.error = Some(format!("its runner ({runner}) stopped while running it; a {} task that may have reached its backend is not sent again", t.risk.as_str()));
                            }
                        })
                        .await;
                    if let Ok(Some(_)) = r {
                        tracing::warn!(task = %id, runner, state = v.task.state.as_str(), "parked task: its runner's lease ran out; taken back");
                    }
                }
                continue;
            }
            match may_run(v.task.facts(), v.task.times(), now) {
                Wait::Expired => {
                    let _ = tasks
                        .change(&mut v, Event::Expire, |t| {
                            t.error = Some(
                                "its park TTL or its deadline passed before it could run".into(),
                            );
                        })
                        .await;
                }
                Wait::Run
                    if running.len() < MAX_RUNS
                        && !draining(&shared)
                        && chain_ready(&snapshot, &v.task.route) =>
                {
                    let lease_until = now.saturating_add(millis(tasks.lease));
                    let me = tasks.proxy_id.clone();
                    let claimed = tasks
                        .change(&mut v, Event::Claim, |t| {
                            t.claimed_by = Some(me);
                            t.lease_until_ms = Some(lease_until);
                            t.runs = t.runs.saturating_add(1);
                            t.run_request_id = Some(t.request_id.clone());
                        })
                        .await;
                    if let Ok(Some(_)) = claimed {
                        tracing::info!(task = %id, route = %v.task.route, run = v.task.runs, "parked task: claimed; running it");
                        running.spawn(run_one(
                            Arc::clone(&shared),
                            Arc::clone(&tasks),
                            client.clone(),
                            Arc::clone(&target),
                            v,
                        ));
                    }
                }
                _ => {}
            }
        }
        tasks.metrics.parked_live(&live);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A draining proxy claims nothing more (its listener is closing).
fn draining(shared: &Shared) -> bool {
    shared.draining.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a pool of `route`'s chain can take work now (a split's side
/// of weight 0 takes none).
fn chain_ready(snapshot: &Snapshot, route: &str) -> bool {
    let Some(route) = snapshot.policy.routes.iter().find(|r| r.name == route) else {
        return false;
    };
    let now = Instant::now();
    route.serving_pools().any(|name| {
        snapshot
            .pools
            .get(name)
            .is_some_and(|p| p.ready_outlook_at(now).is_ok())
    })
}

/// How a run ended.
enum Ran {
    /// An answer (status, headers, body), and how the task takes it.
    Answer(RunEnd, TaskAnswer),
    /// The answer was larger than the cap.
    TooLarge(u16),
    /// The loopback call failed after the request may have been sent.
    Failed(String),
    /// The loopback connection could not be made (the proxy is stopping):
    /// nothing was sent.
    NotSent(String),
}

/// Runs one claimed task and stores its end.
async fn run_one(
    shared: Arc<Shared>,
    tasks: Arc<Tasks>,
    client: SelfClient,
    target: Arc<str>,
    mut v: Versioned,
) {
    let id = v.task.id.clone();
    let cap = shared.settings.idempotency_max_answer_bytes;
    let bound = shared
        .settings
        .attempt_timeout
        .saturating_add(Duration::from_secs(10));
    let built = match tasks.body(&v.task).await {
        Ok(Some(body)) => build_request(&tasks, &v, body, &target),
        Ok(None) => Err(RunError::BodyGone),
        Err(e) => Err(e),
    };
    let request = match built {
        Ok(r) => r,
        Err(why) => {
            let _ = tasks
                .change(&mut v, Event::RunFailed, |t| {
                    t.error = Some(why.to_string())
                })
                .await;
            return;
        }
    };
    let call = async {
        let resp = match client.request(request).await {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Ok(Ran::NotSent(e.to_string())),
            Err(e) => return Err(e.to_string()),
        };
        let (head, body) = resp.into_parts();
        let status = head.status.as_u16();
        let body = match Limited::new(body, cap).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return Ok(Ran::TooLarge(status)),
        };
        let router_error = head.headers.get(crate::handler::X_ROUTER_ROUTE).is_none();
        let error_type = router_error
            .then(|| serde_json::from_slice::<serde_json::Value>(&body).ok())
            .flatten()
            .and_then(|v| v["error"]["type"].as_str().map(str::to_string));
        let end = run_end(error_type.as_deref(), status);
        let headers = head
            .headers
            .iter()
            .filter(|(n, _)| {
                let n = n.as_str();
                !(n.starts_with("x-router-task")
                    || matches!(
                        n,
                        "connection" | "keep-alive" | "transfer-encoding" | "content-length"
                    ))
            })
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        Ok::<_, String>(Ran::Answer(
            end,
            TaskAnswer {
                status,
                headers,
                body_b64: base64::engine::general_purpose::STANDARD.encode(&body),
            },
        ))
    };
    let call = tokio::time::timeout(bound, call);
    tokio::pin!(call);
    // The lease is renewed while the run lasts; a renewal that finds the
    // task changed (dropped) abandons the run.
    let mut beat = tokio::time::interval((tasks.lease / 3).max(Duration::from_millis(50)));
    beat.tick().await;
    let ran = loop {
        tokio::select! {
            r = &mut call => break match r {
                Ok(Ok(ran)) => ran,
                Ok(Err(e)) => Ran::Failed(e),
                Err(_) => Ran::Failed(format!("no answer within {} s", bound.as_secs())),
            },
            _ = beat.tick() => {
                let mut next = v.task.clone();
                next.lease_until_ms = Some(unix_ms().saturating_add(millis(tasks.lease)));
                match tasks.store.cas(v.rev, &next, super::keep_for(&next)).await {
                    Ok(Some(rev)) => {
                        v.rev = rev;
                        v.task = next;
                    }
                    Ok(None) => {
                        tracing::warn!(task = %id, "parked task: changed while running (dropped?); the run is abandoned");
                        return;
                    }
                    // The store is down: keep running; the final write
                    // says whether the claim still held.
                    Err(_) => {}
                }
            }
        }
    };
    let mut not_before = None;
    let (event, answer, error) = match ran {
        Ran::Answer(end, answer) => {
            let event = after_run(end);
            let status = answer.status;
            match event {
                Event::Requeue => {
                    not_before = retry_after(&answer)
                        .map(|d| unix_ms().saturating_add(millis(d.min(MAX_RETRY_AFTER))));
                    (
                        event,
                        None,
                        Some(format!(
                            "the run was shed by the router ({status}) before anything was sent: waiting again"
                        )),
                    )
                }
                _ => (event, Some(answer), None),
            }
        }
        Ran::TooLarge(status) => (
            if (200..300).contains(&status) {
                Event::Answered
            } else {
                Event::RunFailed
            },
            None,
            Some(format!(
                "the answer ({status}) was larger than {cap} bytes (CUSTOM_ROUTER_IDEMPOTENCY_MAX_ANSWER_BYTES) and is not kept"
            )),
        ),
        // The loopback call broke: as if the runner had gone away.
        Ran::Failed(e) => (Event::LeaseLost, None, Some(format!("the run failed: {e}"))),
        Ran::NotSent(e) => (
            Event::Requeue,
            None,
            Some(format!("the run could not start ({e}): waiting again")),
        ),
    };
    let r = tasks
        .change(&mut v, event, |t| {
            t.answer = answer;
            t.error = error;
            t.not_before_ms = not_before;
        })
        .await;
    match r {
        Ok(Some(_)) => {
            tracing::info!(task = %id, state = v.task.state.as_str(), "parked task: run ended");
        }
        Ok(None) => {
            tracing::warn!(task = %id, "parked task: changed while running (dropped?); its answer is not kept");
        }
        Err(e) => {
            tracing::warn!(task = %id, error = %e, "parked task: its end could not be stored")
        }
    }
}

/// How a run ended: the router's own answer (`error_type`, its error's
/// `type`) or a backend's (`status`).
fn run_end(error_type: Option<&str>, status: u16) -> RunEnd {
    match error_type {
        Some(t) if SHED_BEFORE_SEND.contains(&t) => RunEnd::Router {
            error_type: RouterError::ShedBeforeSend,
        },
        Some(_) => RunEnd::Router {
            error_type: RouterError::Other,
        },
        None => RunEnd::Backend { status },
    }
}

/// The `Retry-After` (seconds) of a shed run's answer.
fn retry_after(answer: &TaskAnswer) -> Option<Duration> {
    answer
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// The parked request, as this proxy's own run of it: the client's kept
/// headers as they came (its `Idempotency-Key`, `X-Request-Id`,
/// `Content-Type`...), the request id when the client gave none (the one
/// the router made when it parked), its risk, and the run's mark.
fn build_request(
    tasks: &Tasks,
    v: &Versioned,
    body: Bytes,
    target: &str,
) -> Result<http::Request<Full<Bytes>>, RunError> {
    let t = &v.task;
    let mut b = http::Request::builder()
        .method(t.method.as_str())
        .uri(format!("{target}{}", t.path));
    let mut has_id = false;
    for (n, val) in &t.headers {
        has_id |=
            n.eq_ignore_ascii_case("idempotency-key") || n.eq_ignore_ascii_case("x-request-id");
        b = b.header(n.as_str(), val.as_str());
    }
    if !has_id {
        b = b.header(crate::handler::X_REQUEST_ID, t.request_id.as_str());
    }
    b = b.header("x-router-risk", t.risk.as_str());
    if let Some(h) = tasks.run_header(t) {
        b = b.header(TASK_RUN, h);
    }
    if let Some(d) = t.deadline_at_ms {
        let left = d.saturating_sub(unix_ms());
        if left == 0 {
            return Err(RunError::DeadlinePassed);
        }
        b = b.header("x-router-deadline-ms", left);
    }
    b.body(Full::new(body)).map_err(RunError::Unsendable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_request_that_cannot_be_built_says_why() {
        let store: Arc<dyn super::super::TaskStore> =
            Arc::new(router_shared_state::tasks::LocalTasks::open(None).unwrap());
        let tasks = Tasks::new(
            store,
            Arc::new(crate::metrics::Metrics::default()),
            Duration::from_secs(1),
            1,
        );
        let mut task = router_shared_state::testing::task("abc", "r", 1);
        let body = Bytes::from_static(b"{}");
        let v = Versioned {
            rev: 1,
            task: task.clone(),
        };
        let built = build_request(&tasks, &v, body.clone(), "http://127.0.0.1:9");
        assert!(built.is_ok(), "{built:?}");
        task.deadline_at_ms = Some(1);
        let v = Versioned {
            rev: 1,
            task: task.clone(),
        };
        let err = build_request(&tasks, &v, body.clone(), "http://127.0.0.1:9").unwrap_err();
        assert!(matches!(err, RunError::DeadlinePassed), "{err:?}");
        task.deadline_at_ms = None;
        task.headers = vec![("bad header".into(), "x".into())];
        let v = Versioned { rev: 1, task };
        let err = build_request(&tasks, &v, body, "http://127.0.0.1:9").unwrap_err();
        assert!(matches!(err, RunError::Unsendable(_)), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("the stored request cannot be sent: "),
            "{err}"
        );
    }

    /// What the router's own answers to a run do to its task: a shed
    /// before any send (a tenant's rate or concurrency limit among them)
    /// waits, a refusal that waiting does not cure (a spent budget, a
    /// tenant gone or forbidden) fails it.
    #[test]
    fn the_routers_own_answers_wait_or_fail_a_run() {
        for waits in ["no_backend", "queue_full", "rate_limited", "overloaded"] {
            assert_eq!(
                after_run(run_end(Some(waits), 503)),
                Event::Requeue,
                "{waits}"
            );
        }
        for fails in [
            "budget_exceeded",
            "forbidden",
            "unauthorized",
            "outcome_unknown",
        ] {
            assert_eq!(
                after_run(run_end(Some(fails), 402)),
                Event::RunFailed,
                "{fails}"
            );
        }
        assert_eq!(after_run(run_end(None, 200)), Event::Answered);
        assert_eq!(after_run(run_end(None, 500)), Event::RunFailed);
        let limited = TaskAnswer {
            status: 429,
            headers: vec![("Retry-After".into(), "3".into())],
            body_b64: String::new(),
        };
        assert_eq!(retry_after(&limited), Some(Duration::from_secs(3)));
    }
}
