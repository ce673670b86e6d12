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
//! | `stream-first-token` | cap 2, streams, first token after 6 s; `first_token_timeout_ms` 1 s | streams, first token after 0.4 s | all 200 and complete, all from the fallback; no primary generation completes; none waits more than attempt + 0.4 s + the stream's body + 2 × tolerance |
//! | `stream-stall` | cap 2, streams 2 tokens, then nothing; `stall_timeout_ms` 1 s | streams, 0.4 s | every stream ends, with `[DONE]` or one `stream_stalled` event, at least one cut; none waits more than attempt + 0.4 s + the stream's body + 1 s + 2 × tolerance |
//! | `stream-error` | cap 2, streams 2 tokens, then an error event | streams, 0.4 s | every stream ends, with `[DONE]` or one `stream_error` event, at least one cut; the backend's error text never reaches a client; none waits more than attempt + 0.4 s + the stream's body + 2 × tolerance |
//! | `all-down` | drained, then back; 0.4 s | drained, then back; 0.4 s | safe mode (`on_all_down: park`, see [`all_down`]): every request parked at once with a handle; after recovery every READ task answered once, fetched through another proxy; no SEND task sent without approval |
//!
//! The stream scenarios send `"stream": true` and read each answer to its
//! end. A stream's *body* is its five chunks after the first token, a
//! quarter of the tolerance apart (125 ms at full scale), and a client
//! waits for it too. Once the primary has failed three times its circuit opens and the
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

use crate::error::CliError;
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
mod judge;
mod report;
mod send;

use judge::judge;
pub use report::render_table;
use report::{check, secs};
use send::{percentile, send, send_retrying};

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

fn parse_policy(text: &str) -> Result<Policy, CliError> {
    Ok(load(text, &QueueSettings::default())?)
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
pub async fn run_scenario(
    scenario: Scenario,
    cfg: &DrillConfig,
) -> Result<ScenarioReport, CliError> {
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
    .map_err(|e| start("primary mock", e))?;
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
    .map_err(|e| start("fallback mock", e))?;

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
                Some(url) => Some(router_proxy::SharedStore::new(url)?),
                None if cfg.proxies > 1 => return Err(CliError::ProxiesNeedStore),
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
                .map_err(|e| start("router", e))?;
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
        outcomes.push(t.await?);
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

/// How many chunks a drill stream has after its first token.
const STREAM_CHUNKS: u32 = 5;

/// The time between a drill stream's chunks.
fn chunk_interval(cfg: &DrillConfig) -> Duration {
    cfg.tolerance / 4
}

/// A whole drill stream's chunks after its first token: a client waits
/// for them too, so the stream scenarios' latency bound counts them.
pub(crate) fn stream_body(cfg: &DrillConfig) -> Duration {
    chunk_interval(cfg) * STREAM_CHUNKS
}

/// The mocks' behaviours: plain JSON, or, in a stream scenario, scripted
/// streams (the primary's failing as the scenario says).
fn behaviors(scenario: Scenario, cfg: &DrillConfig) -> (Behavior, Behavior) {
    let tokens = |first_token: Duration| StreamScript {
        first_token,
        chunks: STREAM_CHUNKS as usize,
        interval: chunk_interval(cfg),
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
async fn wait_for_store(proxies: &[RunningProxy]) -> Result<(), CliError> {
    const WAIT: Duration = Duration::from_secs(10);
    let until = Instant::now() + WAIT;
    while !proxies.iter().all(RunningProxy::shared_store_connected) {
        if Instant::now() > until {
            return Err(CliError::StoreNotReached(WAIT));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A part of the drill that did not start.
fn start(what: &'static str, e: impl std::fmt::Display) -> CliError {
    CliError::Start {
        what,
        reason: e.to_string(),
    }
}

/// Runs several scenarios one after another.
pub async fn run_all(
    scenarios: &[Scenario],
    cfg: &DrillConfig,
) -> Result<Vec<ScenarioReport>, CliError> {
    let mut reports = Vec::new();
    for s in scenarios {
        reports.push(run_scenario(*s, cfg).await?);
    }
    Ok(reports)
}
