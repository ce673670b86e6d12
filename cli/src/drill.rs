//! `routerctl drill`: the fallback drill, replayed against the router.
//!
//! Two mock model endpoints stand in for a saturating primary and a small
//! fallback; a load generator sends a fixed schedule of requests (40 at 10
//! per second by default) through the router, each with its own request id;
//! then the drill checks what happened against the expectations of each
//! scenario and prints a verdict.
//!
//! | scenario | primary | fallback | expectation |
//! |---|---|---|---|
//! | `baseline` | cap 2, 6 s | 0.4 s | all 200, none from the primary (6 s never fits the 3 s attempt), p50 < 1 s, p95 < 3.5 s |
//! | `baseline-long-attempt` | cap 2, 6 s, 7 s attempt | 0.4 s | all 200, 1 to 3 from the primary |
//! | `fallback-degraded` | cap 2, 6 s | 7 s | nothing after the deadline (+100 ms); every failure `deadline_exhausted`; no generation completes after its deadline |
//! | `primary-hang` | accepts, answers after 30 s | 0.4 s | all 200 from the fallback, none later than attempt + fallback + 100 ms; once given up on, the primary is skipped at once |
//! | `drain` | cap 2, 0.2 s, drained mid-run | 0.4 s | all 200; no request sent after the drain reaches the primary |
//! | `stream-first-token` | cap 2, streams, first token after 6 s; `first_token_timeout_ms` 1 s | streams, first token after 0.4 s | all 200 and complete, all from the fallback; no primary generation completes; none waits more than attempt + 0.4 s + 2 × tolerance |
//! | `stream-stall` | cap 2, streams 2 tokens, then nothing; `stall_timeout_ms` 1 s | streams, 0.4 s | every stream ends, with `[DONE]` or one `stream_stalled` event, at least one cut; none waits more than attempt + 0.4 s + 1 s + 2 × tolerance |
//! | `stream-error` | cap 2, streams 2 tokens, then an error event | streams, 0.4 s | every stream ends, with `[DONE]` or one `stream_error` event, at least one cut; the backend's error text never reaches a client; none waits more than attempt + 0.4 s + 2 × tolerance |
//! | `all-down` | drained, then back; 0.4 s | drained, then back; 0.4 s | safe mode (`on_all_down: park`, see [`all_down`]): every request parked at once with a handle; after recovery every READ task answered once, fetched through another proxy; no SEND task sent without approval |
//!
//! The stream scenarios send `"stream": true` and read each answer to its
//! end. Once the primary has failed three times its circuit opens and the
//! fallback takes the rest: a stall or an error costs a few requests, not
//! all of them.
//!
//! Every scenario also counts *duplicate generations*: request ids that the
//! mocks answered in full more than once (the double spend the drill is
//! about). It must be 0.
//!
//! By default the drill starts the router in-process with the drill's
//! policy (see [`drill_policy`]). With `--target URL` it sends the same
//! load to an already running router, which must route to the drill's mock
//! ports (`--primary-port`, `--fallback-port`); `drain` needs the built-in
//! router and is skipped then.
//!
//! With `--proxies N --shared-store redis://...` the drill starts N
//! proxies sharing that store, and the load behaves like a client that
//! retries: each request carries an `Idempotency-Key`, goes first to
//! proxy `i mod N`, and when no answer comes within the client's timeout
//! (a third of the deadline by default), or the connection fails, or the
//! proxy answers `503`, it gives up on that proxy and sends the same
//! request, with the same key and what is left of its deadline, to the
//! next proxy (round robin, at most 3 tries). Duplicate generations must
//! still be 0: every retry joins the first request, replays its answer,
//! or (when the first never reached a backend) routes afresh.
//!
//! [`DrillConfig::scaled`] divides every duration (and multiplies the
//! rate), so the test suite replays the same scenarios at 1/20 scale.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_policy::document::load;
use router_policy::{Policy, QueueSettings};
use router_proxy::{Mode, ProxyOptions, RunningProxy, Settings};
use serde::Serialize;
use tokio::time::Instant;

use router_mock::{Behavior, MockConfig, MockModel, StreamEnding, StreamScript};

pub mod all_down;

/// The drill's parameters (full scale by default).
#[derive(Debug, Clone, PartialEq)]
pub struct DrillConfig {
    /// Requests per second.
    pub rate: f64,
    /// Requests per scenario.
    pub count: usize,
    /// Primary service time.
    pub primary_service: Duration,
    /// Primary concurrency cap (requests past it wait at the primary).
    pub primary_cap: usize,
    /// Fallback service time.
    pub fallback_service: Duration,
    /// Fallback service time in `fallback-degraded`.
    pub degraded_fallback_service: Duration,
    /// How long the primary sleeps in `primary-hang`.
    pub hang: Duration,
    /// Primary service time in `drain` (healthy, so it carries traffic).
    pub drain_primary_service: Duration,
    /// End-to-end deadline of each request.
    pub deadline: Duration,
    /// The primary pool's attempt timeout.
    pub primary_attempt: Duration,
    /// The primary attempt timeout of `baseline-long-attempt`.
    pub long_primary_attempt: Duration,
    /// Slack allowed on timing checks (100 ms at full scale).
    pub tolerance: Duration,
    /// Send the load to this router instead of an in-process one.
    pub target: Option<String>,
    /// The scenario whose policy the router under `target` was set up
    /// with (`--print-policy --scenario NAME`); `None`: the default one.
    /// A scenario that needs another policy is skipped, with the reason.
    pub target_scenario: Option<Scenario>,
    /// Mock ports (0: any free port).
    pub primary_port: u16,
    /// Mock ports (0: any free port).
    pub fallback_port: u16,
    /// Proxies started (each request's retries go round robin over them).
    pub proxies: usize,
    /// The shared store of the proxies (`redis://...`), needed with more
    /// than one proxy.
    pub shared_store: Option<String>,
    /// How long the client waits for an answer before it retries on the
    /// next proxy (with more than one proxy; default a third of the
    /// deadline).
    pub client_timeout: Option<Duration>,
}

impl Default for DrillConfig {
    fn default() -> Self {
        Self {
            rate: 10.0,
            count: 40,
            primary_service: Duration::from_secs(6),
            primary_cap: 2,
            fallback_service: Duration::from_millis(400),
            degraded_fallback_service: Duration::from_secs(7),
            hang: Duration::from_secs(30),
            drain_primary_service: Duration::from_millis(200),
            deadline: Duration::from_secs(8),
            primary_attempt: Duration::from_secs(3),
            long_primary_attempt: Duration::from_secs(7),
            tolerance: Duration::from_millis(100),
            target: None,
            target_scenario: None,
            primary_port: 0,
            fallback_port: 0,
            proxies: 1,
            shared_store: None,
            client_timeout: None,
        }
    }
}

impl DrillConfig {
    /// The same drill with every duration divided by `factor` and the rate
    /// multiplied by it. Timing slack shrinks too, but not below 40 ms
    /// (scheduling noise does not scale).
    pub fn scaled(self, factor: f64) -> Self {
        let f = factor.max(1.0);
        let d = |x: Duration| x.div_f64(f);
        Self {
            rate: self.rate * f,
            primary_service: d(self.primary_service),
            fallback_service: d(self.fallback_service),
            degraded_fallback_service: d(self.degraded_fallback_service),
            hang: d(self.hang),
            drain_primary_service: d(self.drain_primary_service),
            deadline: d(self.deadline),
            primary_attempt: d(self.primary_attempt),
            long_primary_attempt: d(self.long_primary_attempt),
            tolerance: d(self.tolerance).max(Duration::from_millis(40)),
            client_timeout: self.client_timeout.map(d),
            ..self
        }
    }
}

/// A drill scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Saturated primary, healthy fallback.
    Baseline,
    /// Baseline with a primary attempt timeout long enough for its 6 s.
    BaselineLongAttempt,
    /// The fallback is slower than the deadline allows.
    FallbackDegraded,
    /// The primary accepts and never answers in time.
    PrimaryHang,
    /// The primary is drained halfway through.
    Drain,
    /// The primary's streams start too late: the first-token timeout.
    StreamFirstToken,
    /// The primary's streams stall after two tokens: the stall watchdog.
    StreamStall,
    /// The primary's streams fail after two tokens: an error inside a 200.
    StreamError,
    /// Every pool is down: safe mode parks the requests; they run when
    /// the pools come back (SEND ones only after approval).
    AllDown,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    pub const ALL: [Scenario; 9] = [
        Scenario::Baseline,
        Scenario::BaselineLongAttempt,
        Scenario::FallbackDegraded,
        Scenario::PrimaryHang,
        Scenario::Drain,
        Scenario::StreamFirstToken,
        Scenario::StreamStall,
        Scenario::StreamError,
        Scenario::AllDown,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Baseline => "baseline",
            Scenario::BaselineLongAttempt => "baseline-long-attempt",
            Scenario::FallbackDegraded => "fallback-degraded",
            Scenario::PrimaryHang => "primary-hang",
            Scenario::Drain => "drain",
            Scenario::StreamFirstToken => "stream-first-token",
            Scenario::StreamStall => "stream-stall",
            Scenario::StreamError => "stream-error",
            Scenario::AllDown => "all-down",
        }
    }

    /// A stream scenario (streamed requests, scripted streaming mocks).
    pub fn streams(self) -> bool {
        matches!(
            self,
            Scenario::StreamFirstToken | Scenario::StreamStall | Scenario::StreamError
        )
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// One check of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// What is expected.
    pub expect: String,
    /// What was seen.
    pub seen: String,
    /// Held or not.
    pub pass: bool,
}

/// What a scenario did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioReport {
    /// Scenario name.
    pub scenario: String,
    /// Requests sent.
    pub requests: usize,
    /// Final route (pool in `x-router-route`, or `shed`) → count.
    pub routes: BTreeMap<String, usize>,
    /// Shed reason (error type) → count.
    pub sheds: BTreeMap<String, usize>,
    /// Request ids generated in full more than once.
    pub duplicate_generations: usize,
    /// Generations started at a mock and cancelled (the router gave up on
    /// them); wasted work, but not paid twice.
    pub abandoned: u64,
    /// Elapsed time percentiles, seconds.
    pub p50_s: f64,
    /// 95th percentile, seconds.
    pub p95_s: f64,
    /// Slowest, seconds.
    pub max_s: f64,
    /// Client retries sent to another proxy (with several proxies).
    pub client_retries: usize,
    /// Every check.
    pub checks: Vec<Check>,
    /// All checks held.
    pub pass: bool,
    /// Why the scenario was not run, when it was not.
    pub skipped: Option<String>,
}

/// One request's result.
#[derive(Debug, Clone)]
struct Outcome {
    id: String,
    sent_at: Instant,
    status: u16,
    route: Option<String>,
    error: Option<String>,
    elapsed: Duration,
    /// Sends to another proxy after the first.
    retries: usize,
    /// How a streamed answer ended: `done`, an error event's type, or
    /// `unfinished`.
    ending: Option<String>,
    /// A streamed answer carried text only a backend's error has.
    leaked: bool,
}

/// The drill's policy: primary then fallback, the deadline as the default,
/// the attempt timeout on the primary pool only (the fallback is bounded by
/// the deadline alone).
pub fn drill_policy(
    cfg: &DrillConfig,
    primary: &str,
    fallback: &str,
    primary_attempt: Duration,
    drain_primary: bool,
) -> String {
    scenario_policy(cfg, primary, fallback, primary_attempt, drain_primary, "")
}

/// The first-token or stall timeout of a stream scenario's primary pool
/// (a second at full scale), as a policy line.
fn primary_extra(scenario: Scenario, cfg: &DrillConfig) -> String {
    let second = (cfg.deadline.as_millis() / 8).max(1);
    match scenario {
        Scenario::StreamFirstToken | Scenario::StreamError => {
            format!("first_token_timeout_ms: {second}")
        }
        Scenario::StreamStall => {
            format!("first_token_timeout_ms: {second}\n      stall_timeout_ms: {second}")
        }
        _ => String::new(),
    }
}

/// [`drill_policy`] with `primary_extra` added to the primary pool.
fn scenario_policy(
    cfg: &DrillConfig,
    primary: &str,
    fallback: &str,
    primary_attempt: Duration,
    drain_primary: bool,
    primary_extra: &str,
) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
metadata: {{name: drill}}
spec:
  defaults: {{deadline_ms: {deadline}}}
  circuit_breaker: {{consecutive_errors: 3, open_duration_s: 30}}
  pools:
    - name: primary
      provider: openai
      endpoints: ["{primary}"]
      max_concurrency: {cap}
      attempt_timeout_ms: {attempt}
      drain: {drain_primary}
      {primary_extra}
    - name: fallback
      provider: openai
      endpoints: ["{fallback}"]
  routes:
    - name: default
      chain: [primary, fallback]
      retry_on: [connect_error, timeout, status_429, status_5xx]
"#,
        deadline = cfg.deadline.as_millis().max(1),
        cap = cfg.primary_cap,
        attempt = primary_attempt.as_millis().max(1),
    )
}

fn parse_policy(text: &str) -> Result<Policy, String> {
    load(text, &QueueSettings::default()).map_err(|e| e.to_string())
}

/// The primary attempt timeout of `scenario`'s policy.
pub fn primary_attempt_of(scenario: Scenario, cfg: &DrillConfig) -> Duration {
    match scenario {
        Scenario::BaselineLongAttempt => cfg.long_primary_attempt,
        _ => cfg.primary_attempt,
    }
}

/// The policy a router under `--target` needs for `scenario`, with the
/// mocks on their ports (`--print-policy --scenario NAME`).
pub fn target_policy(scenario: Scenario, cfg: &DrillConfig) -> String {
    let p = format!("http://127.0.0.1:{}", cfg.primary_port);
    let f = format!("http://127.0.0.1:{}", cfg.fallback_port);
    let extra = primary_extra(scenario, cfg);
    scenario_policy(
        cfg,
        &p,
        &f,
        primary_attempt_of(scenario, cfg),
        false,
        &extra,
    )
}

/// Runs one scenario.
pub async fn run_scenario(scenario: Scenario, cfg: &DrillConfig) -> Result<ScenarioReport, String> {
    if scenario == Scenario::AllDown {
        if cfg.target.is_some() {
            return Ok(skipped(
                scenario,
                "all-down drains and restores the router's pools: it needs the built-in router",
            ));
        }
        return all_down::run(cfg).await;
    }
    if scenario == Scenario::Drain && cfg.target.is_some() {
        return Ok(skipped(
            scenario,
            "drain changes the router's config: it needs the built-in router",
        ));
    }
    if cfg.target.is_some() {
        let set_up = target_policy(cfg.target_scenario.unwrap_or(Scenario::Baseline), cfg);
        if target_policy(scenario, cfg) != set_up {
            return Ok(skipped(
                scenario,
                &format!(
                    "needs another policy: run it alone against a router set up with `routerctl drill --print-policy --scenario {}`",
                    scenario.name()
                ),
            ));
        }
    }
    let primary_latency = match scenario {
        Scenario::PrimaryHang => cfg.hang,
        Scenario::Drain => cfg.drain_primary_service,
        _ => cfg.primary_service,
    };
    let fallback_latency = match scenario {
        Scenario::FallbackDegraded => cfg.degraded_fallback_service,
        _ => cfg.fallback_service,
    };
    let primary_attempt = primary_attempt_of(scenario, cfg);
    let (primary_behavior, fallback_behavior) = behaviors(scenario, cfg);
    let primary = MockModel::start_on(
        SocketAddr::from((Ipv4Addr::LOCALHOST, cfg.primary_port)),
        MockConfig {
            name: "primary".into(),
            latency: primary_latency,
            max_concurrency: Some(cfg.primary_cap),
            behavior: primary_behavior,
            ..MockConfig::default()
        },
    )
    .await
    .map_err(|e| format!("cannot start the primary mock: {e}"))?;
    let fallback = MockModel::start_on(
        SocketAddr::from((Ipv4Addr::LOCALHOST, cfg.fallback_port)),
        MockConfig {
            name: "fallback".into(),
            latency: fallback_latency,
            behavior: fallback_behavior,
            ..MockConfig::default()
        },
    )
    .await
    .map_err(|e| format!("cannot start the fallback mock: {e}"))?;

    let mut proxies = Vec::new();
    let bases: Vec<String> = match &cfg.target {
        Some(url) => vec![url.trim_end_matches('/').to_string()],
        None => {
            let extra = primary_extra(scenario, cfg);
            let text = scenario_policy(
                cfg,
                &primary.url(),
                &fallback.url(),
                primary_attempt,
                false,
                &extra,
            );
            let policy = parse_policy(&text)?;
            let shared_store = match &cfg.shared_store {
                Some(url) => Some(
                    router_proxy::SharedStore::new(url).map_err(|e| format!("--shared-store: {e}"))?,
                ),
                None if cfg.proxies > 1 => {
                    return Err(
                        "--proxies above 1 needs --shared-store redis://HOST:PORT (the proxies share their Idempotency-Keys there)".into(),
                    )
                }
                None => None,
            };
            let settings = Settings {
                bind: [127, 0, 0, 1].into(),
                port: 0,
                shared_store,
                ..Settings::default()
            };
            let mut bases = Vec::new();
            for _ in 0..cfg.proxies.max(1) {
                let proxy = router_proxy::start(ProxyOptions {
                    settings: settings.clone(),
                    mode: Mode::Inline(Box::new(policy.clone())),
                    route_log: Box::new(std::io::sink()),
                })
                .await
                .map_err(|e| format!("cannot start the router: {e}"))?;
                bases.push(format!("http://{}", proxy.local_addr()));
                proxies.push(proxy);
            }
            if cfg.shared_store.is_some() {
                wait_for_store(&proxies).await?;
            }
            bases
        }
    };
    let retrying = bases.len() > 1;
    // Keys stay in the shared store for its TTL: a run of its own, so that
    // a second drill is not answered with the first one's replays.
    let run = if retrying {
        use std::hash::{BuildHasher, Hasher};
        let nonce = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        format!("{nonce:016x}-")
    } else {
        String::new()
    };
    let client_timeout = cfg.client_timeout.unwrap_or(cfg.deadline / 3);

    let started = Instant::now();
    let run_length = Duration::from_secs_f64(cfg.count as f64 / cfg.rate);
    let drain_at = started + run_length / 2;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut tasks = Vec::with_capacity(cfg.count);
    for i in 0..cfg.count {
        let at = started + Duration::from_secs_f64(i as f64 / cfg.rate);
        let client = client.clone();
        let urls: Vec<String> = bases
            .iter()
            .map(|b| format!("{b}/v1/chat/completions"))
            .collect();
        let id = format!("drill-{run}{}-{i}", scenario.name());
        let deadline = cfg.deadline;
        let stream = scenario.streams();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            if retrying {
                send_retrying(&client, &urls, i, id, at, deadline, client_timeout, stream).await
            } else {
                send(&client, &urls[0], id, at, None, stream).await
            }
        }));
    }
    let drained = if scenario == Scenario::Drain {
        tokio::time::sleep_until(drain_at).await;
        let text = drill_policy(cfg, &primary.url(), &fallback.url(), primary_attempt, true);
        let policy = parse_policy(&text)?;
        for p in &proxies {
            p.config().apply_policy(policy.clone(), "drill");
        }
        Some(Instant::now())
    } else {
        None
    };
    let mut outcomes = Vec::with_capacity(cfg.count);
    for t in tasks {
        outcomes.push(t.await.map_err(|e| format!("load task failed: {e}"))?);
    }
    // Let abandoned work at the mocks settle, so a late double generation
    // would be counted.
    let settle_until = Instant::now() + primary_latency.min(cfg.deadline) + cfg.tolerance;
    while Instant::now() < settle_until
        && (primary.stats().in_flight > 0 || fallback.stats().in_flight > 0)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = judge(
        scenario,
        cfg,
        primary_attempt,
        fallback_latency,
        &outcomes,
        &primary,
        &fallback,
        drained,
    );
    for p in proxies {
        stop(Some(p));
    }
    primary.stop().await;
    fallback.stop().await;
    Ok(report)
}

/// The mocks' behaviours: plain JSON, or, in a stream scenario, scripted
/// streams (the primary's failing as the scenario says).
fn behaviors(scenario: Scenario, cfg: &DrillConfig) -> (Behavior, Behavior) {
    let tokens = |first_token: Duration| StreamScript {
        first_token,
        chunks: 5,
        interval: cfg.tolerance / 4,
        ..StreamScript::default()
    };
    let fallback = Behavior::Stream(tokens(cfg.fallback_service));
    let primary = match scenario {
        Scenario::StreamFirstToken => tokens(cfg.primary_service),
        Scenario::StreamStall => StreamScript {
            chunks: 2,
            ending: StreamEnding::Stall,
            ..tokens(cfg.fallback_service)
        },
        Scenario::StreamError => StreamScript {
            chunks: 2,
            ending: StreamEnding::Error,
            ..tokens(cfg.fallback_service)
        },
        _ => return (Behavior::Json, Behavior::Json),
    };
    (Behavior::Stream(primary), fallback)
}

fn stop(proxy: Option<RunningProxy>) {
    if let Some(p) = proxy {
        p.shutdown();
    }
}

fn skipped(scenario: Scenario, why: &str) -> ScenarioReport {
    ScenarioReport {
        scenario: scenario.name().into(),
        requests: 0,
        routes: BTreeMap::new(),
        sheds: BTreeMap::new(),
        duplicate_generations: 0,
        abandoned: 0,
        p50_s: 0.0,
        p95_s: 0.0,
        max_s: 0.0,
        client_retries: 0,
        checks: Vec::new(),
        pass: true,
        skipped: Some(why.into()),
    }
}

/// Waits (up to 10 s) until every proxy has connected to its shared
/// store (the first connection is made in the background).
async fn wait_for_store(proxies: &[RunningProxy]) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(10);
    while !proxies.iter().all(RunningProxy::shared_store_connected) {
        if Instant::now() > until {
            return Err("the proxies did not reach the shared store within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// How long past the deadline a retrying client waits on its last try.
const LAST_TRY_GRACE: Duration = Duration::from_millis(250);

/// A client that retries: the request goes to proxy `first mod N`; with no
/// answer within `client_timeout`, a failed connection or a `503`, the
/// same request (same key, what is left of `deadline`) goes to the next
/// proxy, at most 3 tries. The outcome is the last try's, timed from the
/// first send.
#[allow(clippy::too_many_arguments)]
async fn send_retrying(
    client: &Client<HttpConnector, Full<Bytes>>,
    urls: &[String],
    first: usize,
    id: String,
    at: Instant,
    deadline: Duration,
    client_timeout: Duration,
    stream: bool,
) -> Outcome {
    let mut last = None;
    for try_no in 0..3 {
        let left = deadline.saturating_sub(at.elapsed());
        if left.is_zero() {
            break;
        }
        let url = &urls[(first + try_no) % urls.len()];
        // The last try waits for the router's own answer at the deadline
        // (a 504 arrives just as `left` runs out), with a grace a real
        // client allows: giving up at the same instant is a race the
        // drill would count as the router's failure.
        let wait = if try_no == 2 || client_timeout >= left {
            left + LAST_TRY_GRACE
        } else {
            client_timeout
        };
        let sent = send(client, url, id.clone(), at, Some(left), stream);
        match tokio::time::timeout(wait, sent).await {
            Ok(out) if out.status == 503 || out.status == 0 => {
                last = Some(Outcome {
                    retries: try_no,
                    ..out
                })
            }
            Ok(out) => {
                return Outcome {
                    retries: try_no,
                    ..out
                }
            }
            // The client gives up on this proxy (its request is dropped:
            // the connection closes) and retries on the next.
            Err(_) => {}
        }
    }
    last.unwrap_or(Outcome {
        id,
        sent_at: at,
        status: 0,
        route: None,
        error: Some("client timeout".into()),
        elapsed: at.elapsed(),
        retries: 2,
        ending: None,
        leaked: false,
    })
}

/// Sends one request; `deadline_left`: a retry's `X-Router-Deadline-Ms`
/// and `Idempotency-Key` (else the request id goes as `X-Request-Id`).
async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    id: String,
    at: Instant,
    deadline_left: Option<Duration>,
    stream: bool,
) -> Outcome {
    let body = format!(
        r#"{{"model":"drill","stream":{stream},"messages":[{{"role":"user","content":"request {id}"}}]}}"#
    );
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json");
    req = match deadline_left {
        Some(left) => req.header("idempotency-key", id.as_str()).header(
            "x-router-deadline-ms",
            left.as_millis().clamp(1, u128::from(u64::MAX)).to_string(),
        ),
        None => req.header("x-request-id", id.as_str()),
    };
    let req = req.body(Full::new(Bytes::from(body)));
    let mut out = Outcome {
        id,
        sent_at: at,
        status: 0,
        route: None,
        error: None,
        elapsed: Duration::ZERO,
        retries: 0,
        ending: None,
        leaked: false,
    };
    let Ok(req) = req else {
        out.error = Some("bad request".into());
        return out;
    };
    match client.request(req).await {
        Ok(resp) => {
            out.status = resp.status().as_u16();
            out.route = resp
                .headers()
                .get("x-router-route")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            out.elapsed = at.elapsed();
            if stream && out.status == 200 {
                let text = body
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                out.ending = Some(stream_ending(&text));
                // The mocks' error text: a backend's, never to be passed on.
                out.leaked = text.contains("CUDA");
            }
            if out.status != StatusCode::OK.as_u16() {
                out.error = body
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| v["error"]["type"].as_str().map(str::to_string))
                    .or_else(|| Some(format!("status_{}", out.status)));
            }
        }
        Err(e) => {
            out.elapsed = at.elapsed();
            out.error = Some(format!("transport: {e}"));
        }
    }
    out
}

/// How a streamed answer's text ends: `done`, the type of its last error
/// event, or `unfinished`.
fn stream_ending(text: &str) -> String {
    if text.ends_with("data: [DONE]\n\n") {
        return "done".into();
    }
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    if last.starts_with("event: error") {
        if let Some(data) = last.split("data: ").nth(1) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(data) {
                if let Some(t) = v["error"]["type"].as_str() {
                    return t.to_string();
                }
            }
        }
    }
    "unfinished".into()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[rank]
}

fn check(checks: &mut Vec<Check>, expect: impl Into<String>, seen: impl Into<String>, pass: bool) {
    checks.push(Check {
        expect: expect.into(),
        seen: seen.into(),
        pass,
    });
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

#[allow(clippy::too_many_arguments)]
fn judge(
    scenario: Scenario,
    cfg: &DrillConfig,
    primary_attempt: Duration,
    fallback_latency: Duration,
    outcomes: &[Outcome],
    primary: &MockModel,
    fallback: &MockModel,
    drained: Option<Instant>,
) -> ScenarioReport {
    let mut routes: BTreeMap<String, usize> = BTreeMap::new();
    let mut sheds: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes {
        let key = if o.status == 200 {
            o.route.clone().unwrap_or_else(|| "?".into())
        } else {
            "shed".into()
        };
        *routes.entry(key).or_default() += 1;
        if let Some(e) = &o.error {
            *sheds.entry(e.clone()).or_default() += 1;
        }
    }
    let mut generations: HashMap<String, Vec<Instant>> = HashMap::new();
    for g in primary
        .generations()
        .into_iter()
        .chain(fallback.generations())
    {
        if let Some(id) = g.request_id {
            generations.entry(id).or_default().push(g.at);
        }
    }
    let duplicates = generations.values().filter(|v| v.len() > 1).count();
    let retries: usize = outcomes.iter().map(|o| o.retries).sum();
    let mut elapsed: Vec<Duration> = outcomes.iter().map(|o| o.elapsed).collect();
    elapsed.sort_unstable();
    let (p50, p95, max) = (
        percentile(&elapsed, 0.50),
        percentile(&elapsed, 0.95),
        elapsed.last().copied().unwrap_or_default(),
    );
    let n = outcomes.len();
    let ok = outcomes.iter().filter(|o| o.status == 200).count();
    let by = |pool: &str| {
        outcomes
            .iter()
            .filter(|o| o.status == 200 && o.route.as_deref() == Some(pool))
            .count()
    };
    let scale = cfg.deadline.as_secs_f64() / 8.0;
    let tol = cfg.tolerance;
    let mut checks = Vec::new();
    check(
        &mut checks,
        "no duplicate generations",
        duplicates.to_string(),
        duplicates == 0,
    );
    if cfg.proxies > 1 {
        // Not a pass condition (how many time out depends on the
        // scenario): shows that retries did reach other proxies.
        check(
            &mut checks,
            format!("client retries spread over {} proxies", cfg.proxies),
            retries.to_string(),
            true,
        );
    }
    // How the streams ended (stream scenarios).
    let mut endings: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes.iter().filter_map(|o| o.ending.as_ref()) {
        *endings.entry(o.clone()).or_default() += 1;
    }
    let endings_seen = format!("{endings:?}");
    // Every scenario but the degraded fallback must answer everything.
    if scenario != Scenario::FallbackDegraded {
        check(
            &mut checks,
            format!("all {n} answered 200"),
            format!("{ok}/{n}"),
            ok == n,
        );
    }
    match scenario {
        Scenario::Baseline => {
            check(
                &mut checks,
                "none served by the primary",
                by("primary").to_string(),
                by("primary") == 0,
            );
            check(
                &mut checks,
                "no sheds",
                sheds.values().sum::<usize>().to_string(),
                sheds.is_empty(),
            );
            let p50_max = Duration::from_secs_f64(1.0 * scale);
            let p95_max = Duration::from_secs_f64(3.5 * scale);
            // Each proxy learns the primary's latency on its own: with N
            // proxies, N first requests probe it (one does with one
            // proxy); p95 is taken without the N-1 extra probes.
            let extra_probes = cfg.proxies.max(1) - 1;
            let p95 = percentile(&elapsed[..elapsed.len().saturating_sub(extra_probes)], 0.95);
            let p95_label = if extra_probes > 0 {
                format!(
                    "p95 under {} (without the {extra_probes} extra proxies' first probes)",
                    secs(p95_max)
                )
            } else {
                format!("p95 under {}", secs(p95_max))
            };
            check(
                &mut checks,
                format!("p50 under {}", secs(p50_max)),
                secs(p50),
                p50 < p50_max,
            );
            check(&mut checks, p95_label, secs(p95), p95 < p95_max);
        }
        Scenario::BaselineLongAttempt => {
            let p = by("primary");
            check(
                &mut checks,
                "1 to 3 served by the primary",
                p.to_string(),
                (1..=3).contains(&p),
            );
            check(
                &mut checks,
                "the rest by the fallback",
                by("fallback").to_string(),
                by("fallback") + p == n,
            );
            check(
                &mut checks,
                "no sheds",
                sheds.values().sum::<usize>().to_string(),
                sheds.is_empty(),
            );
        }
        Scenario::FallbackDegraded => {
            let limit = cfg.deadline + tol;
            check(
                &mut checks,
                format!("no answer after {}", secs(limit)),
                secs(max),
                max <= limit,
            );
            let bad: Vec<&String> = sheds
                .keys()
                .filter(|k| *k != "deadline_exhausted")
                .collect();
            check(
                &mut checks,
                "every non-200 is deadline_exhausted",
                if bad.is_empty() {
                    "yes".into()
                } else {
                    format!("{bad:?}")
                },
                bad.is_empty(),
            );
            let sent: HashMap<&str, Instant> = outcomes
                .iter()
                .map(|o| (o.id.as_str(), o.sent_at))
                .collect();
            let late = generations
                .iter()
                .filter(|(id, ats)| {
                    sent.get(id.as_str()).is_some_and(|s| {
                        ats.iter().any(|a| a.saturating_duration_since(*s) > limit)
                    })
                })
                .count();
            check(
                &mut checks,
                "no generation completes after its deadline",
                late.to_string(),
                late == 0,
            );
        }
        Scenario::PrimaryHang => {
            check(
                &mut checks,
                "all by the fallback",
                by("fallback").to_string(),
                by("fallback") == n,
            );
            // A retry that joined the first request sees its answer at the
            // next poll of the shared store (at most 50 ms later).
            let join_poll = if cfg.proxies > 1 {
                router_policy::idempotency::JoinBackoff::DEFAULT.max
            } else {
                Duration::ZERO
            };
            let limit = primary_attempt + fallback_latency + tol + join_poll;
            check(
                &mut checks,
                format!("none waits more than {}", secs(limit)),
                secs(max),
                max <= limit,
            );
            // After the first attempt was given up on, the primary is
            // skipped at once: later requests take the fallback's time only.
            let first_sent = outcomes.first().map(|o| o.sent_at);
            let later_slow = outcomes
                .iter()
                .filter(|o| first_sent.is_some_and(|f| o.sent_at > f + primary_attempt + tol))
                .filter(|o| o.elapsed > fallback_latency + tol)
                .count();
            check(
                &mut checks,
                "after the first timeout the primary is skipped at once",
                format!("{later_slow} later requests waited on it"),
                later_slow == 0,
            );
        }
        // Judged below, with the other stream checks.
        Scenario::StreamFirstToken
        | Scenario::StreamStall
        | Scenario::StreamError
        | Scenario::AllDown => {}
        Scenario::Drain => {
            // Judged by when the client sent each request: one sent before
            // the drain may still be on its way to the primary when the
            // drain lands, and that is allowed; one sent after must not.
            let at = drained.unwrap_or_else(Instant::now);
            let sent_after: std::collections::HashSet<&str> = outcomes
                .iter()
                .filter(|o| o.sent_at >= at)
                .map(|o| o.id.as_str())
                .collect();
            let at_primary = primary.requests();
            let after = at_primary
                .iter()
                .filter(|r| {
                    r.headers
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|id| sent_after.contains(id))
                })
                .count();
            let before = at_primary.len() - after;
            check(
                &mut checks,
                "the primary carried traffic before the drain",
                before.to_string(),
                before > 0,
            );
            check(
                &mut checks,
                "no request sent after the drain reaches the primary",
                after.to_string(),
                after == 0,
            );
        }
    }
    if scenario.streams() {
        // A request may wait for the primary's slots for its attempt
        // timeout, then be answered by the fallback; a stall adds its
        // timeout. Without the watchdogs a stream would end at the
        // deadline instead.
        let (cut, extra) = match scenario {
            Scenario::StreamFirstToken => ("", Duration::ZERO),
            Scenario::StreamStall => ("stream_stalled", cfg.deadline / 8),
            _ => ("stream_error", Duration::ZERO),
        };
        let limit = primary_attempt + fallback_latency + extra + cfg.tolerance * 2;
        check(
            &mut checks,
            format!("none waits more than {}", secs(limit)),
            secs(max),
            max <= limit,
        );
        let ended = endings.get("done").copied().unwrap_or(0)
            + if cut.is_empty() {
                0
            } else {
                endings.get(cut).copied().unwrap_or(0)
            };
        let expect = if cut.is_empty() {
            format!("all {n} streams complete")
        } else {
            format!("every stream ends: [DONE] or one {cut} event")
        };
        check(&mut checks, expect, endings_seen.clone(), ended == n);
        match scenario {
            Scenario::StreamFirstToken => {
                check(
                    &mut checks,
                    "all by the fallback",
                    by("fallback").to_string(),
                    by("fallback") == n,
                );
                let done = primary.stats().completed;
                check(
                    &mut checks,
                    "no primary generation completes",
                    done.to_string(),
                    done == 0,
                );
            }
            _ => {
                let cuts = endings.get(cut).copied().unwrap_or(0);
                check(
                    &mut checks,
                    format!("at least one stream cut with {cut}"),
                    cuts.to_string(),
                    cuts > 0,
                );
                let leaked = outcomes.iter().filter(|o| o.leaked).count();
                check(
                    &mut checks,
                    "no backend error text reaches a client",
                    leaked.to_string(),
                    leaked == 0,
                );
            }
        }
    }
    let pass = checks.iter().all(|c| c.pass);
    ScenarioReport {
        scenario: scenario.name().into(),
        requests: n,
        routes,
        sheds,
        duplicate_generations: duplicates,
        abandoned: primary.stats().cancelled + fallback.stats().cancelled,
        p50_s: p50.as_secs_f64(),
        p95_s: p95.as_secs_f64(),
        max_s: max.as_secs_f64(),
        client_retries: retries,
        checks,
        pass,
        skipped: None,
    }
}

/// The drill's table, as printed.
pub fn render_table(reports: &[ScenarioReport]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<22} {:>4} {:>8} {:>9} {:<26} {:>4} {:>9} {:>8} {:>8} {:>8}  {}\n",
        "scenario",
        "reqs",
        "primary",
        "fallback",
        "sheds",
        "dup",
        "abandoned",
        "p50",
        "p95",
        "max",
        "verdict"
    ));
    for r in reports {
        if let Some(why) = &r.skipped {
            out.push_str(&format!("{:<22} SKIPPED: {why}\n", r.scenario));
            continue;
        }
        let sheds = if r.sheds.is_empty() {
            "-".to_string()
        } else {
            r.sheds
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        out.push_str(&format!(
            "{:<22} {:>4} {:>8} {:>9} {:<26} {:>4} {:>9} {:>7.3}s {:>7.3}s {:>7.3}s  {}\n",
            r.scenario,
            r.requests,
            r.routes.get("primary").copied().unwrap_or(0),
            r.routes.get("fallback").copied().unwrap_or(0),
            sheds,
            r.duplicate_generations,
            r.abandoned,
            r.p50_s,
            r.p95_s,
            r.max_s,
            if r.pass { "PASS" } else { "FAIL" }
        ));
        for c in &r.checks {
            out.push_str(&format!(
                "    {} {} (seen: {})\n",
                if c.pass { "ok  " } else { "FAIL" },
                c.expect,
                c.seen
            ));
        }
    }
    out
}

/// Runs several scenarios one after another.
pub async fn run_all(
    scenarios: &[Scenario],
    cfg: &DrillConfig,
) -> Result<Vec<ScenarioReport>, String> {
    let mut reports = Vec::new();
    for s in scenarios {
        reports.push(run_scenario(*s, cfg).await?);
    }
    Ok(reports)
}
