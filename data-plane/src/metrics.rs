//! Prometheus metrics.
//!
//! Two families of series:
//!
//! - The Hugging Face names, so existing dashboards keep working:
//!   `custom_router_queue_depth`, `custom_router_backend_ewma_latency_seconds`,
//!   `custom_router_backend_inflight_requests`,
//!   `custom_router_requests_{dispatched,evicted,timeout}_total`. We add a
//!   `pool` label (a query without it still sums as before).
//! - `router_*` series: requests and latency by route, pool and outcome,
//!   sheds by reason, queue wait, the age of the oldest waiter per pool,
//!   the applied config version and reloads, circuit overrides from the
//!   control plane skipped as invalid.
//!
//! Gauges that describe live state (queue depth, EWMA, in-flight, oldest
//! waiter) are rebuilt from the pools at every scrape rather than updated
//! on the request path: they cost nothing per request and a removed
//! backend's series disappears with it (no stale series).

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use router_policy::Outcome;

use crate::pool::{PoolCounters, PoolStatus};

/// Label set `{pool}`.
/// `router_idempotency_events`' label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EventLabel {
    /// What happened to a keyed request.
    pub event: &'static str,
}

/// `router_stream_events`' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StreamEventLabels {
    /// Pool of the attempt.
    pub pool: String,
    /// What happened (`first_token_timeout`, `stream_error`,
    /// `stream_stalled`, `hedge_started`, `hedge_won`, `hedge_cancelled`,
    /// `retry_budget_exhausted`, `usage_missing`).
    pub event: &'static str,
}

/// `router_endpoint_quota_remaining`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QuotaLabels {
    /// Pool.
    pub pool: String,
    /// The endpoint (with several keys, `url#KEY_VARIABLE`).
    pub endpoint: String,
    /// `requests` or `tokens`.
    pub kind: &'static str,
}

/// `router_parked_tasks`' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TaskLabels {
    /// The route the task was parked on.
    pub route: String,
    /// The state it entered (`router_policy::park::TaskState`).
    pub state: &'static str,
}

/// `router_tenant_requests`' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantLabels {
    /// A tenant's name from the policy.
    pub tenant: String,
    /// How the request ended.
    pub outcome: &'static str,
}

/// `router_tenant_cost_usd`'s label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantName {
    /// A tenant's name from the policy.
    pub tenant: String,
}

/// `router_shared_store_errors`' label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OpLabel {
    /// The store call that failed.
    pub op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolLabel {
    /// Pool name.
    pub pool: String,
}

/// Label set `{pool, addr}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendLabels {
    /// Pool name.
    pub pool: String,
    /// Endpoint address.
    pub addr: String,
}

/// Label set `{route, pool, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// Route name (empty when none matched).
    pub route: String,
    /// Pool that answered or shed (empty when none).
    pub pool: String,
    /// `ok`, an upstream status class, or an error type.
    pub outcome: String,
}

/// Label set `{pool, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ShedLabels {
    /// Pool (empty when the request never reached one).
    pub pool: String,
    /// Error type.
    pub reason: String,
}

/// Label set `{from, to}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FallbackLabels {
    /// First pool tried.
    pub from: String,
    /// Pool that gave the final answer (empty when none did).
    pub to: String,
}

/// Label set `{pool, kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TokenLabels {
    /// Pool.
    pub pool: String,
    /// `input` or `output`.
    pub kind: String,
}

/// Label set `{version}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VersionLabel {
    /// Config version.
    pub version: String,
}

/// Label set `{result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    /// `applied` or `rejected`.
    pub result: String,
}

/// Label set `{pool, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CheckLabels {
    /// Pool name.
    pub pool: String,
    /// `passed` or `failed`.
    pub result: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Handles of one `{route, pool, outcome}` series pair.
struct RequestSeries {
    metrics: u64,
    route: Box<str>,
    pool: Box<str>,
    outcome: Outcome,
    requests: Counter,
    duration: Histogram,
}

/// Handles of one pool's series, made on first use.
struct PoolSeries {
    metrics: u64,
    pool: Box<str>,
    queue_wait: Option<Histogram>,
    tokens: Option<(Counter, Counter)>,
    cost: Option<Counter<f64, AtomicU64>>,
}

/// Series handles a thread has used: the request path finds its series
/// here (a few string compares, no lock) instead of hashing a fresh label
/// set into the family's locked map for every request. Families on the
/// request path are never cleared, so a handle stays the series it names.
#[derive(Default)]
struct SeriesCache {
    requests: Vec<RequestSeries>,
    pools: Vec<PoolSeries>,
}

/// Entries a thread keeps at most (then it starts over).
const SERIES_CACHE_MAX: usize = 256;

thread_local! {
    static SERIES: std::cell::RefCell<SeriesCache> = std::cell::RefCell::new(SeriesCache::default());
}

fn with_cache<T>(f: impl FnOnce(&mut SeriesCache) -> T) -> T {
    SERIES.with(|c| {
        let mut c = c.borrow_mut();
        if c.requests.len() + c.pools.len() > SERIES_CACHE_MAX {
            *c = SeriesCache::default();
        }
        f(&mut c)
    })
}

/// Tells `Metrics` instances apart in the thread-local caches.
static NEXT_METRICS_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Every series the proxy exports.
pub(crate) struct Metrics {
    /// Its key in the thread-local series caches.
    id: u64,
    registry: Registry,
    scrape: Mutex<()>,
    queue_depth: Family<PoolLabel, Gauge>,
    ewma: Family<BackendLabels, FloatGauge>,
    inflight: Family<BackendLabels, Gauge>,
    dispatched: Family<PoolLabel, Counter>,
    evicted: Family<PoolLabel, Counter>,
    timed_out: Family<PoolLabel, Counter>,
    oldest_age: Family<PoolLabel, FloatGauge>,
    requests: Family<RequestLabels, Counter>,
    duration: Family<RequestLabels, Histogram, fn() -> Histogram>,
    queue_wait: Family<PoolLabel, Histogram, fn() -> Histogram>,
    sheds: Family<ShedLabels, Counter>,
    fallbacks: Family<FallbackLabels, Counter>,
    tokens: Family<TokenLabels, Counter>,
    cost: Family<PoolLabel, Counter<f64, AtomicU64>>,
    circuit_open: Family<BackendLabels, Gauge>,
    config_info: Family<VersionLabel, Gauge>,
    config_reloads: Family<ResultLabel, Counter>,
    route_log_dropped: Counter,
    circuit_overrides_skipped: Counter,
    idempotency: Family<EventLabel, Counter>,
    cache: Family<EventLabel, Counter>,
    store_errors: Family<OpLabel, Counter>,
    store_resets: Counter,
    stream_events: Family<StreamEventLabels, Counter>,
    tenant_requests: Family<TenantLabels, Counter>,
    tenant_cost: Family<TenantName, Counter<f64, AtomicU64>>,
    tpot: Family<BackendLabels, FloatGauge>,
    health_checks: Family<CheckLabels, Counter>,
    endpoint_health: Family<BackendLabels, Gauge>,
    endpoint_suspect: Family<BackendLabels, Gauge>,
    endpoint_ejected: Family<BackendLabels, Gauge>,
    ejections: Family<PoolLabel, Counter>,
    parked_tasks: Family<TaskLabels, Counter>,
    parked_live: Family<TaskLabels, Gauge>,
    quota_remaining: Family<QuotaLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every series.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            id: NEXT_METRICS_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            registry: Registry::default(),
            scrape: Mutex::new(()),
            queue_depth: Family::default(),
            ewma: Family::default(),
            inflight: Family::default(),
            dispatched: Family::default(),
            evicted: Family::default(),
            timed_out: Family::default(),
            oldest_age: Family::default(),
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            queue_wait: Family::new_with_constructor(latency_histogram),
            sheds: Family::default(),
            fallbacks: Family::default(),
            tokens: Family::default(),
            cost: Family::default(),
            circuit_open: Family::default(),
            config_info: Family::default(),
            config_reloads: Family::default(),
            route_log_dropped: Counter::default(),
            circuit_overrides_skipped: Counter::default(),
            idempotency: Family::default(),
            cache: Family::default(),
            store_errors: Family::default(),
            store_resets: Counter::default(),
            stream_events: Family::default(),
            parked_tasks: Family::default(),
            parked_live: Family::default(),
            quota_remaining: Family::default(),
            tenant_requests: Family::default(),
            tenant_cost: Family::default(),
            tpot: Family::default(),
            health_checks: Family::default(),
            endpoint_health: Family::default(),
            endpoint_suspect: Family::default(),
            endpoint_ejected: Family::default(),
            ejections: Family::default(),
        };
        registry.register(
            "custom_router_queue_depth",
            "Requests waiting in the queue",
            m.queue_depth.clone(),
        );
        registry.register(
            "custom_router_backend_ewma_latency_seconds",
            "EWMA latency per backend",
            m.ewma.clone(),
        );
        registry.register(
            "custom_router_backend_inflight_requests",
            "Requests in flight per backend",
            m.inflight.clone(),
        );
        registry.register(
            "custom_router_requests_dispatched",
            "Requests forwarded to a backend",
            m.dispatched.clone(),
        );
        registry.register(
            "custom_router_requests_evicted",
            "Requests evicted from a full queue",
            m.evicted.clone(),
        );
        registry.register(
            "custom_router_requests_timeout",
            "Requests dropped at the queue timeout",
            m.timed_out.clone(),
        );
        registry.register(
            "router_queue_oldest_age_seconds",
            "How long the oldest queued request has waited",
            m.oldest_age.clone(),
        );
        registry.register(
            "router_requests",
            "Requests by route, pool and outcome",
            m.requests.clone(),
        );
        registry.register(
            "router_request_duration_seconds",
            "End-to-end request duration by route, pool and outcome",
            m.duration.clone(),
        );
        registry.register(
            "router_queue_wait_seconds",
            "Time spent waiting in a pool's queue",
            m.queue_wait.clone(),
        );
        registry.register("router_sheds", "Requests shed, by reason", m.sheds.clone());
        registry.register(
            "router_fallbacks",
            "Requests that needed more than one attempt, by first and final pool",
            m.fallbacks.clone(),
        );
        registry.register(
            "router_tokens",
            "Tokens reported by backends' usage, by pool and kind",
            m.tokens.clone(),
        );
        registry.register(
            "router_cost_usd",
            "Cost of answered calls from usage and pool prices, USD",
            m.cost.clone(),
        );
        registry.register(
            "router_endpoint_quota_remaining",
            "What the provider's rate-limit headers said is left of an endpoint's key's quota, less what was sent since, until its reset (kind: requests, tokens)",
            m.quota_remaining.clone(),
        );
        registry.register(
            "router_circuit_state",
            "Circuit breaker per endpoint: 0 closed, 1 open, 2 half-open",
            m.circuit_open.clone(),
        );
        registry.register(
            "router_config_info",
            "The config version applied (value 1)",
            m.config_info.clone(),
        );
        registry.register(
            "router_config_reloads",
            "Config changes applied or rejected",
            m.config_reloads.clone(),
        );
        registry.register(
            "router_route_log_dropped",
            "Route decision log lines dropped because stdout could not keep up",
            m.route_log_dropped.clone(),
        );
        registry.register(
            "router_config_circuit_overrides_skipped",
            "Circuit overrides from the control plane skipped as invalid (the rest of the snapshot applied)",
            m.circuit_overrides_skipped.clone(),
        );
        registry.register(
            "router_idempotency_events",
            "Idempotency-Key requests by event: claim, join, replay, mismatch, not_replayable, outcome_unknown (stored), outcome_unknown_refused (a retry told), store, store_not_replayable, over_budget (an answer larger than CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES, kept as not replayable), release, fail_open, fail_closed",
            m.idempotency.clone(),
        );
        registry.register(
            "router_cache_events",
            "Response cache events: hit, miss, bypass, refresh (what a request on a cached route did); join (waited for an identical request in flight), store (an answer kept), store_not_replayable (an answer not kept: not a whole success, or too large), release, over_budget",
            m.cache.clone(),
        );
        registry.register(
            "router_shared_store_errors",
            "Failed calls to the shared store, by call (claim, get, settle, rate_limit, spend, epoch)",
            m.store_errors.clone(),
        );
        registry.register(
            "router_shared_store_resets",
            "Times this proxy found that the shared store had lost its data (its epoch marker gone or replaced): tenants' spend, rate-limit windows, idempotency records and parked tasks written before are gone",
            m.store_resets.clone(),
        );
        registry.register(
            "router_stream_events",
            "Stream and hedging events by pool: first_token_timeout, stream_error, stream_stalled, hedge_started, hedge_won, hedge_cancelled, retry_budget_exhausted, usage_missing",
            m.stream_events.clone(),
        );
        registry.register(
            "router_parked_tasks",
            "Parked tasks (on_all_down: park) entering each state on this proxy, by route: waiting_capacity, waiting_approval (parked), running (claimed), done, failed, expired, dropped",
            m.parked_tasks.clone(),
        );
        registry.register(
            "router_parked_tasks_live",
            "Live parked tasks by route and state (waiting_capacity, waiting_approval, running), as this proxy's dispatcher last read them from the store (the fleet's, with a shared store)",
            m.parked_live.clone(),
        );
        registry.register(
            "router_tenant_requests",
            "Requests by tenant (names from the policy) and outcome",
            m.tenant_requests.clone(),
        );
        registry.register(
            "router_tenant_cost_usd",
            "What a tenant's requests generated, USD, from the answers' usage and the pools' prices (every attempt that generated; an answer without usage adds nothing here)",
            m.tenant_cost.clone(),
        );
        registry.register(
            "router_endpoint_tpot_seconds",
            "Time per output token per endpoint (EWMA over its streams)",
            m.tpot.clone(),
        );
        registry.register(
            "router_health_checks",
            "Active health checks by pool and result (passed, failed)",
            m.health_checks.clone(),
        );
        registry.register(
            "router_endpoint_health",
            "What the health checks say per endpoint (pools with checks only): 0 unknown (no check passed yet), 1 healthy, 2 unhealthy",
            m.endpoint_health.clone(),
        );
        registry.register(
            "router_endpoint_suspect",
            "1 while an endpoint is suspect (this proxy's mark or the fleet's): it takes no new traffic while its pool has another endpoint",
            m.endpoint_suspect.clone(),
        );
        registry.register(
            "router_endpoint_ejected",
            "1 while an endpoint is ejected as an outlier",
            m.endpoint_ejected.clone(),
        );
        registry.register(
            "router_outlier_ejections",
            "Outlier ejections by pool",
            m.ejections.clone(),
        );
        Self { registry, ..m }
    }

    /// Counts a request of a tenant.
    pub(crate) fn tenant_request(&self, tenant: &str, outcome: Outcome) {
        self.tenant_requests
            .get_or_create(&TenantLabels {
                tenant: tenant.to_string(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Adds what a tenant's request generated (micro-USD).
    pub(crate) fn tenant_cost(&self, tenant: &str, micros: u64) {
        if micros > 0 {
            self.tenant_cost
                .get_or_create(&TenantName {
                    tenant: tenant.to_string(),
                })
                .inc_by(micros as f64 / 1e6);
        }
    }

    /// Counts a stream or hedging event of a pool.
    pub(crate) fn stream_event(&self, pool: &str, event: &'static str) {
        self.stream_events
            .get_or_create(&StreamEventLabels {
                pool: pool.to_string(),
                event,
            })
            .inc();
    }

    /// Counts a parked task entering `state` on `route`.
    pub(crate) fn parked_task(&self, route: &str, state: &'static str) {
        self.parked_tasks
            .get_or_create(&TaskLabels {
                route: route.to_string(),
                state,
            })
            .inc();
    }

    /// The live parked tasks by route and state, as last read.
    pub(crate) fn parked_live(
        &self,
        counts: &std::collections::HashMap<(String, &'static str), i64>,
    ) {
        self.parked_live.clear();
        for ((route, state), n) in counts {
            self.parked_live
                .get_or_create(&TaskLabels {
                    route: route.clone(),
                    state,
                })
                .set(*n);
        }
    }

    /// The counters a pool increments itself.
    pub(crate) fn pool_counters(&self, pool: &str) -> PoolCounters {
        let l = PoolLabel {
            pool: pool.to_string(),
        };
        // Apart from the struct below: a family's guard lives to the end of
        // the statement that took it, and a second insert into the same
        // family while it lives would deadlock (a closure's guard ends
        // when it returns).
        let check = |result: &str| {
            let labels = CheckLabels {
                pool: pool.to_string(),
                result: result.into(),
            };
            self.health_checks.get_or_create(&labels).clone()
        };
        let checks_passed = check("passed");
        let checks_failed = check("failed");
        PoolCounters {
            events: None,
            dispatched: self.dispatched.get_or_create(&l).clone(),
            evicted: self.evicted.get_or_create(&l).clone(),
            timed_out: self.timed_out.get_or_create(&l).clone(),
            checks_passed,
            checks_failed,
            ejections: self.ejections.get_or_create(&l).clone(),
        }
    }

    /// Counts one finished request.
    pub(crate) fn request_done(&self, route: &str, pool: &str, outcome: Outcome, seconds: f64) {
        let (requests, duration) = with_cache(|c| {
            let found = c.requests.iter().find(|s| {
                s.metrics == self.id
                    && *s.route == *route
                    && *s.pool == *pool
                    && s.outcome == outcome
            });
            if let Some(s) = found {
                return (s.requests.clone(), s.duration.clone());
            }
            let labels = RequestLabels {
                route: route.to_string(),
                pool: pool.to_string(),
                outcome: outcome.as_str().to_string(),
            };
            let s = RequestSeries {
                metrics: self.id,
                requests: self.requests.get_or_create(&labels).clone(),
                duration: self.duration.get_or_create(&labels).clone(),
                route: labels.route.into(),
                pool: labels.pool.into(),
                outcome,
            };
            let handles = (s.requests.clone(), s.duration.clone());
            c.requests.push(s);
            handles
        });
        requests.inc();
        duration.observe(seconds);
    }

    /// This pool's cached series handles.
    fn pool_series<T>(&self, pool: &str, f: impl FnOnce(&mut PoolSeries) -> T) -> T {
        with_cache(|c| {
            let i = match c
                .pools
                .iter()
                .position(|s| s.metrics == self.id && *s.pool == *pool)
            {
                Some(i) => i,
                None => {
                    c.pools.push(PoolSeries {
                        metrics: self.id,
                        pool: pool.into(),
                        queue_wait: None,
                        tokens: None,
                        cost: None,
                    });
                    c.pools.len() - 1
                }
            };
            f(&mut c.pools[i])
        })
    }

    /// Counts one shed.
    pub(crate) fn shed(&self, pool: &str, reason: Outcome) {
        self.sheds
            .get_or_create(&ShedLabels {
                pool: pool.to_string(),
                reason: reason.as_str().to_string(),
            })
            .inc();
    }

    /// Accounts tokens and cost of one answer: `kind="input"` every
    /// prompt token (cached ones included, as `gen_ai.usage.input_tokens`
    /// counts them), `output`, and the parts of the input read from and
    /// written to a prompt cache (`cache_read`, `cache_write`; their
    /// series appear with the first such token).
    pub(crate) fn usage(&self, pool: &str, tokens: router_policy::usage::Tokens, cost_usd: f64) {
        let counter = |kind: &str| {
            self.tokens
                .get_or_create(&TokenLabels {
                    pool: pool.to_string(),
                    kind: kind.to_string(),
                })
                .clone()
        };
        let (tokens_in, tokens_out) = self.pool_series(pool, |s| {
            s.tokens
                .get_or_insert_with(|| (counter("input"), counter("output")))
                .clone()
        });
        tokens_in.inc_by(tokens.prompt);
        tokens_out.inc_by(tokens.output);
        // Rare (a prompt cache's pools): looked up when there is one.
        for (kind, n) in [
            ("cache_read", tokens.cache_read),
            ("cache_write", tokens.cache_write),
        ] {
            if n > 0 {
                counter(kind).inc_by(n);
            }
        }
        if cost_usd > 0.0 {
            let cost = self.pool_series(pool, |s| {
                s.cost
                    .get_or_insert_with(|| {
                        self.cost
                            .get_or_create(&PoolLabel {
                                pool: pool.to_string(),
                            })
                            .clone()
                    })
                    .clone()
            });
            cost.inc_by(cost_usd);
        }
    }

    /// Counts a request that needed a fallback.
    pub(crate) fn fallback(&self, from: &str, to: &str) {
        self.fallbacks
            .get_or_create(&FallbackLabels {
                from: from.to_string(),
                to: to.to_string(),
            })
            .inc();
    }

    /// Records a queue wait.
    pub(crate) fn queue_wait(&self, pool: &str, seconds: f64) {
        let histogram = self.pool_series(pool, |s| {
            s.queue_wait
                .get_or_insert_with(|| {
                    self.queue_wait
                        .get_or_create(&PoolLabel {
                            pool: pool.to_string(),
                        })
                        .clone()
                })
                .clone()
        });
        histogram.observe(seconds);
    }

    /// Records a config change applied (with its version) or rejected.
    pub(crate) fn config_change(&self, applied_version: Option<&str>) {
        let result = if applied_version.is_some() {
            "applied"
        } else {
            "rejected"
        };
        self.config_reloads
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
        if let Some(v) = applied_version {
            self.config_info.clear();
            self.config_info
                .get_or_create(&VersionLabel {
                    version: v.to_string(),
                })
                .set(1);
        }
    }

    /// Counts a route log line that was dropped.
    pub(crate) fn route_log_dropped(&self) {
        self.route_log_dropped.inc();
    }

    /// Counts circuit overrides skipped as invalid.
    pub(crate) fn circuit_overrides_skipped(&self, n: usize) {
        self.circuit_overrides_skipped.inc_by(n as u64);
    }

    /// Renders the text exposition, with live gauges rebuilt from `pools`.
    pub(crate) fn render(&self, pools: &[PoolStatus]) -> String {
        let _one_scrape_at_a_time = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        self.queue_depth.clear();
        self.oldest_age.clear();
        self.ewma.clear();
        self.tpot.clear();
        self.inflight.clear();
        self.circuit_open.clear();
        self.endpoint_health.clear();
        self.endpoint_suspect.clear();
        self.endpoint_ejected.clear();
        self.quota_remaining.clear();
        for p in pools {
            let pl = PoolLabel {
                pool: p.name.to_string(),
            };
            self.queue_depth
                .get_or_create(&pl)
                .set(i64::try_from(p.queue_depth).unwrap_or(i64::MAX));
            self.oldest_age
                .get_or_create(&pl)
                .set(p.oldest_wait.map_or(0.0, |d| d.as_secs_f64()));
            for e in &p.endpoints {
                let bl = BackendLabels {
                    pool: p.name.to_string(),
                    addr: e.addr.to_string(),
                };
                if let Some(ewma) = e.ewma_s {
                    self.ewma.get_or_create(&bl).set(ewma);
                }
                if let Some(tpot) = e.tpot_s {
                    self.tpot.get_or_create(&bl).set(tpot);
                }
                self.inflight.get_or_create(&bl).set(i64::from(e.in_flight));
                let circuit = match e.circuit {
                    crate::pool::CircuitState::Closed => 0,
                    crate::pool::CircuitState::Open => 1,
                    crate::pool::CircuitState::HalfOpen => 2,
                };
                self.circuit_open.get_or_create(&bl).set(circuit);
                if let Some(h) = e.health {
                    use router_policy::health::Health;
                    let v = match h {
                        Health::Unknown => 0,
                        Health::Healthy => 1,
                        Health::Unhealthy => 2,
                    };
                    self.endpoint_health.get_or_create(&bl).set(v);
                }
                self.endpoint_suspect
                    .get_or_create(&bl)
                    .set(i64::from(e.suspect.is_some()));
                self.endpoint_ejected
                    .get_or_create(&bl)
                    .set(i64::from(e.ejected));
                if let Some(q) = &e.quota {
                    for (kind, left) in [
                        ("requests", q.requests_remaining),
                        ("tokens", q.tokens_remaining),
                    ] {
                        if let Some(left) = left {
                            let labels = QuotaLabels {
                                pool: p.name.to_string(),
                                endpoint: e.addr.to_string(),
                                kind,
                            };
                            self.quota_remaining
                                .get_or_create(&labels)
                                .set(i64::try_from(left).unwrap_or(i64::MAX));
                        }
                    }
                }
            }
        }
        let mut out = String::with_capacity(8192);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The shared state's events (`router_shared_state`), counted here.
impl Metrics {
    /// Counts a response cache event.
    pub(crate) fn cache_event(&self, event: &'static str) {
        self.cache.get_or_create(&EventLabel { event }).inc();
    }
}

/// The response cache's store events: counted as cache events, not as
/// `Idempotency-Key` ones (the cache's store is built the same way).
pub(crate) struct CacheEvents(pub(crate) std::sync::Arc<Metrics>);

impl router_shared_state::StoreEvents for CacheEvents {
    fn idempotency(&self, event: &'static str) {
        // What a request did is counted where it is decided (hit, miss);
        // the store's own events here.
        if matches!(
            event,
            "join" | "store" | "store_not_replayable" | "release" | "over_budget"
        ) {
            self.0.cache_event(event);
        }
    }
    fn store_error(&self, op: &'static str) {
        router_shared_state::StoreEvents::store_error(&*self.0, op);
    }
    fn store_reset(&self) {}
}

impl router_shared_state::StoreEvents for Metrics {
    /// Counts an `Idempotency-Key` event.
    fn idempotency(&self, event: &'static str) {
        self.idempotency.get_or_create(&EventLabel { event }).inc();
    }

    /// Counts a failed shared-store call.
    fn store_error(&self, op: &'static str) {
        self.store_errors.get_or_create(&OpLabel { op }).inc();
    }

    /// Counts a shared store found to have lost its data.
    fn store_reset(&self) {
        self.store_resets.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn cached_series_stay_with_their_registry_and_labels() {
        let (a, b) = (Metrics::new(), Metrics::new());
        for _ in 0..3 {
            a.request_done("r", "p", Outcome::Ok, 0.01);
            a.queue_wait("p", 0.0);
        }
        a.request_done("r", "p", Outcome::Status5xx, 0.01);
        b.request_done("r", "p", Outcome::Ok, 0.01);
        let tokens = |prompt, output, cache_read| router_policy::usage::Tokens {
            prompt,
            output,
            cache_read,
            cache_write: 0,
        };
        a.usage("p", tokens(5, 7, 0), 0.0);
        b.usage("p", tokens(1, 2, 0), 0.5);
        b.usage("p", tokens(100, 0, 64), 0.0);
        let (ta, tb) = (a.render(&[]), b.render(&[]));
        let ok = r#"router_requests_total{route="r",pool="p",outcome="ok"}"#;
        assert_eq!(line(&ta, ok), Some(&*format!("{ok} 3")));
        assert_eq!(line(&tb, ok), Some(&*format!("{ok} 1")));
        let failed = r#"router_requests_total{route="r",pool="p",outcome="status_5xx"}"#;
        assert_eq!(line(&ta, failed), Some(&*format!("{failed} 1")));
        assert_eq!(line(&tb, failed), None);
        assert!(ta.contains(r#"router_queue_wait_seconds_count{pool="p"} 3"#));
        assert!(ta.contains(r#"router_tokens_total{pool="p",kind="output"} 7"#));
        assert!(tb.contains(r#"router_tokens_total{pool="p",kind="input"} 101"#));
        // Cache series only where a cache was used.
        assert!(tb.contains(r#"router_tokens_total{pool="p",kind="cache_read"} 64"#));
        assert!(!tb.contains("cache_write"));
        assert!(!ta.contains("cache_read"));
        // No cost series until a cost is counted.
        assert!(!ta.contains("router_cost_usd_total{"));
        assert!(tb.contains(r#"router_cost_usd_total{pool="p"} 0.5"#));
    }
}
