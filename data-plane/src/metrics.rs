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
//!   the applied config version and reloads.
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

use crate::pool::{PoolCounters, PoolStatus};

/// Label set `{pool}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// Pool name.
    pub pool: String,
}

/// Label set `{pool, addr}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// Pool name.
    pub pool: String,
    /// Endpoint address.
    pub addr: String,
}

/// Label set `{route, pool, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Route name (empty when none matched).
    pub route: String,
    /// Pool that answered or shed (empty when none).
    pub pool: String,
    /// `ok`, an upstream status class, or an error type.
    pub outcome: String,
}

/// Label set `{pool, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    /// Pool (empty when the request never reached one).
    pub pool: String,
    /// Error type.
    pub reason: String,
}

/// Label set `{from, to}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    /// First pool tried.
    pub from: String,
    /// Pool that gave the final answer (empty when none did).
    pub to: String,
}

/// Label set `{pool, kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// Pool.
    pub pool: String,
    /// `input` or `output`.
    pub kind: String,
}

/// Label set `{version}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    /// Config version.
    pub version: String,
}

/// Label set `{result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `applied` or `rejected`.
    pub result: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every series the proxy exports.
pub struct Metrics {
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
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every series.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
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
        Self { registry, ..m }
    }

    /// The counters a pool increments itself.
    pub fn pool_counters(&self, pool: &str) -> PoolCounters {
        let l = PoolLabel {
            pool: pool.to_string(),
        };
        PoolCounters {
            events: None,
            dispatched: self.dispatched.get_or_create(&l).clone(),
            evicted: self.evicted.get_or_create(&l).clone(),
            timed_out: self.timed_out.get_or_create(&l).clone(),
        }
    }

    /// Counts one finished request.
    pub fn request_done(&self, labels: &RequestLabels, seconds: f64) {
        self.requests.get_or_create(labels).inc();
        self.duration.get_or_create(labels).observe(seconds);
    }

    /// Counts one shed.
    pub fn shed(&self, pool: &str, reason: &str) {
        self.sheds
            .get_or_create(&ShedLabels {
                pool: pool.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Accounts tokens and cost of one answer.
    pub fn usage(&self, pool: &str, input: u64, output: u64, cost_usd: f64) {
        for (kind, n) in [("input", input), ("output", output)] {
            self.tokens
                .get_or_create(&TokenLabels {
                    pool: pool.to_string(),
                    kind: kind.to_string(),
                })
                .inc_by(n);
        }
        if cost_usd > 0.0 {
            self.cost
                .get_or_create(&PoolLabel {
                    pool: pool.to_string(),
                })
                .inc_by(cost_usd);
        }
    }

    /// Counts a request that needed a fallback.
    pub fn fallback(&self, from: &str, to: &str) {
        self.fallbacks
            .get_or_create(&FallbackLabels {
                from: from.to_string(),
                to: to.to_string(),
            })
            .inc();
    }

    /// Records a queue wait.
    pub fn queue_wait(&self, pool: &str, seconds: f64) {
        self.queue_wait
            .get_or_create(&PoolLabel {
                pool: pool.to_string(),
            })
            .observe(seconds);
    }

    /// Records a config change applied (with its version) or rejected.
    pub fn config_change(&self, applied_version: Option<&str>) {
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
    pub fn route_log_dropped(&self) {
        self.route_log_dropped.inc();
    }

    /// Renders the text exposition, with live gauges rebuilt from `pools`.
    pub fn render(&self, pools: &[PoolStatus]) -> String {
        let _one_scrape_at_a_time = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        self.queue_depth.clear();
        self.oldest_age.clear();
        self.ewma.clear();
        self.inflight.clear();
        self.circuit_open.clear();
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
                self.inflight.get_or_create(&bl).set(i64::from(e.in_flight));
                let circuit = match e.circuit {
                    crate::pool::CircuitState::Closed => 0,
                    crate::pool::CircuitState::Open => 1,
                    crate::pool::CircuitState::HalfOpen => 2,
                };
                self.circuit_open.get_or_create(&bl).set(circuit);
            }
        }
        let mut out = String::with_capacity(8192);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
