//! The validated policy: what the router acts on.
//!
//! These types hold no `Option` that a default could fill: defaults are
//! resolved during validation, so the data plane never re-derives them.

use std::time::Duration;

use crate::balance::Scoring;
use crate::endpoint::Endpoint;
use crate::engine_aware::EngineAware;

use super::{HedgeTarget, ProbeKind, Provider, RetryOn, Risk};

/// Resolved queue settings of a pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueSettings {
    /// Waiters held at most (at least 1).
    pub max_size: usize,
    /// How long a request may wait in the queue.
    pub timeout: Duration,
    /// EWMA threshold in seconds.
    pub latency_threshold_s: f64,
    /// EWMA smoothing factor in (0, 1].
    pub ewma_alpha: f64,
    /// Endpoint ranking.
    pub scoring: Scoring,
    /// Engine-aware settings (used with [`Scoring::EngineAware`]).
    pub engine: EngineAware,
}

impl Default for QueueSettings {
    /// The Hugging Face defaults, with the load-aware scoring.
    fn default() -> Self {
        Self {
            max_size: 1000,
            timeout: Duration::from_secs(1200),
            latency_threshold_s: 3.0,
            ewma_alpha: 0.3,
            scoring: Scoring::PeakEwma,
            engine: EngineAware::default(),
        }
    }
}

/// A validated pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// Unique name.
    pub name: String,
    /// API spoken by the endpoints.
    pub provider: Provider,
    /// Model rewritten into requests, if any.
    pub model: Option<String>,
    /// Endpoints (may be empty: filled later by `set-backends`).
    pub endpoints: Vec<Endpoint>,
    /// Per-endpoint concurrency limit.
    pub max_concurrency: Option<u32>,
    /// Queue settings.
    pub queue: QueueSettings,
    /// Longest attempt on this pool (wins over the route's).
    pub attempt_timeout: Option<Duration>,
    /// The whole pool is drained.
    pub drain: bool,
    /// Endpoints drained one by one.
    pub drained: Vec<Endpoint>,
    /// Gates.
    pub gates: Gates,
    /// Can produce structured output.
    pub structured_output: bool,
    /// Prices.
    pub price: Price,
    /// Environment variable with the API key.
    pub api_key_env: Option<String>,
    /// Environment variables of the pool's several keys (`api_keys_env`;
    /// empty without). Each endpoint of [`Pool::endpoints`] then names the
    /// key it is used with ([`Endpoint::key`]).
    pub api_keys_env: Vec<String>,
    /// Capacity probe.
    pub probe: Option<Probe>,
    /// Longest wait for a stream's first content (wins over the route's).
    pub first_token_timeout: Option<Duration>,
    /// Longest silence in a stream after its first token (wins over the
    /// route's).
    pub stall_timeout: Option<Duration>,
    /// Ask for usage in streams when the client did not.
    pub stream_usage: bool,
    /// Azure OpenAI's deployment and `api-version` (`provider:
    /// azure_openai` only).
    pub azure: Option<AzureDeployment>,
    /// Active health checks; `None`: off.
    pub health_check: Option<crate::health::HealthCheck>,
    /// Outlier ejection; `None`: off.
    pub outlier_ejection: Option<crate::health::OutlierEjection>,
    /// Session affinity; `None`: off.
    pub session_affinity: Option<SessionAffinity>,
}

impl Pool {
    /// `endpoints` as this pool balances them: with several keys
    /// (`api_keys_env`), each endpoint that names no key once per key
    /// (`https://api.openai.com#A_API_KEY`, `…#B_API_KEY`), in the order
    /// endpoint by endpoint, then key by key; one that names a key as it
    /// is. Without, `endpoints` unchanged. (The policy's own endpoints are
    /// already so; `set-backends` installs plain addresses, made so here.)
    pub fn keyed(&self, endpoints: &[Endpoint]) -> Vec<Endpoint> {
        if self.api_keys_env.is_empty() {
            return endpoints.to_vec();
        }
        let mut out = Vec::with_capacity(endpoints.len() * self.api_keys_env.len());
        for e in endpoints {
            if e.key().is_some() {
                if !out.contains(e) {
                    out.push(e.clone());
                }
                continue;
            }
            for k in &self.api_keys_env {
                let keyed = e.with_key(Some(k));
                if !out.contains(&keyed) {
                    out.push(keyed);
                }
            }
        }
        out
    }
}

/// Resolved session affinity ([`crate::affinity::choose_session`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionAffinity {
    /// The header naming the session, lowercase.
    pub header: String,
    /// The bounded-load factor (at least 1).
    pub load_factor: f64,
}

/// Where an Azure OpenAI pool's requests go:
/// `/openai/deployments/{deployment}/...?api-version={api_version}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureDeployment {
    /// The deployment's name.
    pub deployment: String,
    /// The `api-version` query parameter.
    pub api_version: String,
}

/// Resolved gates.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Gates {
    /// Require health.
    pub healthy: bool,
    /// Queue depth limit (fails when greater).
    pub max_queue_depth: Option<u32>,
    /// Latency limit as a fraction of the deadline (fails when greater).
    pub max_latency_budget_fraction: Option<f64>,
    /// Free VRAM floor (fails at or below).
    pub min_vram_free_mb: Option<u64>,
    /// Time-per-output-token limit (fails when every endpoint that has
    /// one is above it).
    pub max_tpot: Option<Duration>,
}

/// Resolved prices.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    /// USD per 1,000 input tokens (prompt tokens no cache served).
    pub input_per_1k_usd: f64,
    /// USD per 1,000 output tokens.
    pub output_per_1k_usd: f64,
    /// USD per 1,000 prompt tokens read from a cache (the input price
    /// when the policy gives none).
    pub cache_read_per_1k_usd: f64,
    /// USD per 1,000 prompt tokens written to a cache (the input price
    /// when the policy gives none).
    pub cache_write_per_1k_usd: f64,
}

impl Price {
    /// Cost of a call with these token counts, every prompt token at the
    /// input price (an estimate before the answer says what was cached).
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> f64 {
        (input_tokens as f64 * self.input_per_1k_usd
            + output_tokens as f64 * self.output_per_1k_usd)
            / 1000.0
    }

    /// Cost of an answer's normalized tokens: each part of the prompt at
    /// its own price (`crate::usage`).
    pub fn cost_of(&self, t: &crate::usage::Tokens) -> f64 {
        (t.uncached_input() as f64 * self.input_per_1k_usd
            + t.cache_read as f64 * self.cache_read_per_1k_usd
            + t.cache_write as f64 * self.cache_write_per_1k_usd
            + t.output as f64 * self.output_per_1k_usd)
            / 1000.0
    }

    /// The highest price a prompt token can cost (input, cache read or
    /// cache write).
    pub fn max_prompt_per_1k_usd(&self) -> f64 {
        self.input_per_1k_usd
            .max(self.cache_read_per_1k_usd)
            .max(self.cache_write_per_1k_usd)
    }
}

/// A resolved capacity probe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// What to poll.
    pub kind: ProbeKind,
    /// Poll interval.
    pub interval: Duration,
    /// Longest one probe may take (its own setting, not the interval).
    pub timeout: Duration,
    /// Failed probes in a row that make an endpoint unusable (at least 1);
    /// see [`crate::probe`].
    pub unhealthy_after: u32,
    /// Total VRAM (Ollama).
    pub vram_total_mb: Option<u64>,
}

/// Resolved circuit breaker settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CircuitSettings {
    /// Consecutive failures that open the circuit (at least 1).
    pub consecutive_errors: u32,
    /// How long it stays open before a probe.
    pub open_duration: Duration,
}

impl Default for CircuitSettings {
    fn default() -> Self {
        Self {
            consecutive_errors: 3,
            open_duration: Duration::from_secs(60),
        }
    }
}

/// Validated match conditions.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteMatch {
    /// Models (exact, or prefix with trailing `*`); empty matches any.
    pub models: Vec<String>,
    /// Path prefix; `None` matches any.
    pub path_prefix: Option<String>,
    /// Risk classes; empty matches any.
    pub risks: Vec<Risk>,
}

impl RouteMatch {
    /// True when the request's risk, model and path fit.
    pub fn matches_risk(&self, risk: Risk, model: Option<&str>, path: &str) -> bool {
        (self.risks.is_empty() || self.risks.contains(&risk)) && self.matches(model, path)
    }

    /// True when the request's model and path fit (risk not considered).
    pub fn matches(&self, model: Option<&str>, path: &str) -> bool {
        if let Some(prefix) = &self.path_prefix {
            if !path.starts_with(prefix.as_str()) {
                return false;
            }
        }
        if self.models.is_empty() {
            return true;
        }
        let Some(model) = model else { return false };
        self.models.iter().any(|m| match m.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix),
            None => m == model,
        })
    }

    pub(super) fn is_catch_all(&self) -> bool {
        self.risks.is_empty()
            && self.models.is_empty()
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| p == "/" || p.is_empty())
    }
}

/// A validated route.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Unique name.
    pub name: String,
    /// What it takes.
    pub matches: RouteMatch,
    /// The chain's steps, in order: pools and splits. Each pool is named
    /// once in the whole chain. Read it through [`Route::order`] (the
    /// pools one request tries, in order), [`Route::pools`] (every pool
    /// the route can reach) and [`Route::pool_at`] (a chain position's
    /// pool).
    pub chain: Vec<ChainStep>,
    /// Deadline of requests without a deadline header.
    pub deadline: Option<Duration>,
    /// Longest single attempt.
    pub attempt_timeout: Option<Duration>,
    /// Failures that move a request to the next pool.
    pub retry_on: Vec<RetryOn>,
    /// Whether the request may move past the first pool that takes it.
    pub fallback: bool,
    /// Needs a valid approval token.
    pub requires_approval: bool,
    /// `false`: only the chain's first pool is ever used.
    pub allow_downgrade: bool,
    /// Estimated-cost ceiling per call.
    pub cost_ceiling_per_call_usd: Option<f64>,
    /// A keyed request whose client left is finished and stored for the
    /// retry (`finish_on_client_gone`, default true).
    pub finish_on_client_gone: bool,
    /// Longest wait for a stream's first content.
    pub first_token_timeout: Option<Duration>,
    /// Longest silence in a stream after its first token.
    pub stall_timeout: Option<Duration>,
    /// Hedged requests.
    pub hedge: Option<Hedge>,
    /// The budget retries and hedges draw on.
    pub retry_budget: crate::retry_budget::BudgetSettings,
    /// `on_all_down: park`: the bounds of its parked tasks; `None`:
    /// `no_backend` when every pool is down.
    pub park: Option<ParkSettings>,
    /// The response cache; `None`: off.
    pub cache: Option<crate::cache::CacheSettings>,
}

/// One step of a route's chain.
#[derive(Debug, Clone, PartialEq)]
pub enum ChainStep {
    /// A pool, by name.
    Pool(String),
    /// A weighted split between pools ([`crate::split`]).
    Split(crate::split::Split),
}

impl From<&str> for ChainStep {
    fn from(name: &str) -> Self {
        Self::Pool(name.to_owned())
    }
}

impl ChainStep {
    /// The step's pools as written (a split's sides in order).
    pub fn pools(&self) -> impl Iterator<Item = &str> + '_ {
        let (one, sides) = match self {
            Self::Pool(name) => (Some(name.as_str()), None),
            Self::Split(s) => (None, Some(s.sides.iter().map(|s| s.pool.as_str()))),
        };
        one.into_iter().chain(sides.into_iter().flatten())
    }
}

/// A parking route's bounds, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParkSettings {
    /// How long a parked task waits.
    pub ttl: Duration,
    /// Most live parked tasks of the route.
    pub max_tasks: u32,
    /// Most bytes the route's live parked tasks hold
    /// ([`crate::park::task_bytes`]).
    pub max_bytes: u64,
}

impl ParkSettings {
    /// The default TTL: one hour.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
    /// The default cap.
    pub const DEFAULT_MAX_TASKS: u32 = 100;
    /// The default byte cap: 64 MiB.
    pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
}

/// A route's hedging, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hedge {
    /// When the second attempt starts.
    pub after: HedgeDelay,
    /// Where it goes.
    pub to: HedgeTarget,
}

/// When a hedge starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HedgeDelay {
    /// A fixed delay.
    Fixed(Duration),
    /// The first pool's recent p95 (no hedge while it has no samples).
    PoolP95,
}

impl Route {
    /// Every pool the route can reach, in the order written (a split's
    /// sides in place, weight 0 included): the chain positions. For gates,
    /// validation and pages that list a route's pools; the order one
    /// request tries them in is [`Route::order`].
    pub fn pools(&self) -> impl Iterator<Item = &str> + '_ {
        self.chain.iter().flat_map(ChainStep::pools)
    }

    /// The pools that take traffic: [`Route::pools`] without a split's
    /// sides of weight 0 (which no request tries, not even as a fallback).
    pub fn serving_pools(&self) -> impl Iterator<Item = &str> + '_ {
        self.chain.iter().flat_map(|step| {
            let (one, sides) = match step {
                ChainStep::Pool(name) => (Some(name.as_str()), None),
                ChainStep::Split(s) => (
                    None,
                    Some(
                        s.sides
                            .iter()
                            .filter(|s| s.weight > 0)
                            .map(|s| s.pool.as_str()),
                    ),
                ),
            };
            one.into_iter().chain(sides.into_iter().flatten())
        })
    }

    /// The pool at chain position `at` (an index into [`Route::pools`]).
    /// A walk over the steps without iterator adapters: the walk asks for
    /// its pool on every step (callgrind: `pools().nth` cost about 460
    /// instructions a request on a one-pool route).
    pub fn pool_at(&self, mut at: usize) -> Option<&str> {
        for step in &self.chain {
            match step {
                ChainStep::Pool(name) if at == 0 => return Some(name),
                ChainStep::Pool(_) => at -= 1,
                ChainStep::Split(s) => match s.sides.get(at) {
                    Some(side) => return Some(&side.pool),
                    None => at -= s.sides.len(),
                },
            }
        }
        None
    }

    /// How many pools the route can reach.
    pub fn pool_count(&self) -> usize {
        self.chain
            .iter()
            .map(|s| match s {
                ChainStep::Pool(_) => 1,
                ChainStep::Split(s) => s.sides.len(),
            })
            .sum()
    }

    /// The first pool written (a split's first side): what a route is
    /// named by when one pool must stand for it.
    pub fn first_pool(&self) -> Option<&str> {
        self.pools().next()
    }

    /// Whether the chain has a split.
    pub fn has_split(&self) -> bool {
        self.chain.iter().any(|s| matches!(s, ChainStep::Split(_)))
    }

    /// The pools one request tries, in order, as chain positions
    /// ([`crate::split`]): each pool step in place; each split as its
    /// chosen side for `keys`, then its other sides of non-zero weight,
    /// heaviest first; then the next steps. Without a split, `0..n` and
    /// nothing allocated.
    pub fn order(&self, keys: &crate::split::SplitKeys<'_>) -> crate::split::ChainOrder {
        use crate::split::{choose, fallback_sides, ChainOrder, SplitChoice};
        if !self.has_split() {
            return ChainOrder::identity(self.pool_count());
        }
        let mut positions = Vec::with_capacity(self.pool_count());
        let mut splits = Vec::new();
        let mut base = 0;
        for step in &self.chain {
            match step {
                ChainStep::Pool(_) => {
                    positions.push(base);
                    base += 1;
                }
                ChainStep::Split(split) => {
                    if let Some((side, key, sticky_missing)) = choose(&self.name, split, keys) {
                        positions.push(base + side);
                        positions.extend(fallback_sides(split, side).into_iter().map(|i| base + i));
                        splits.push(SplitChoice {
                            at: base + side,
                            side,
                            weight: split.sides[side].weight,
                            total: split.total(),
                            key,
                            sticky_missing,
                        });
                    }
                    base += split.sides.len();
                }
            }
        }
        ChainOrder::of(positions, splits)
    }

    /// True when `failure` moves the request on.
    pub fn retries_on(&self, failure: RetryOn) -> bool {
        self.fallback && self.retry_on.contains(&failure)
    }
}

/// A validated policy: the only form the router acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// `metadata.name`.
    pub name: String,
    /// Pools, in document order.
    pub pools: Vec<Pool>,
    /// Routes, in match order.
    pub routes: Vec<Route>,
    /// Circuit breaker settings.
    pub circuit: CircuitSettings,
    /// Risk of requests without `X-Router-Risk`.
    pub default_risk: Risk,
    /// Environment variable with the approval token.
    pub approval_token_env: Option<String>,
    /// How long a pool stays degraded for structured output.
    pub structured_degrade: Duration,
    /// Who may call; `None`: tenancy is off (anyone may).
    pub tenants: Option<crate::tenant::Tenants>,
}

impl Policy {
    /// The sidecar policy: one empty pool named `default` behind one
    /// catch-all route, filled by `set-backends`.
    pub fn sidecar(queue: QueueSettings, max_concurrency: Option<u32>) -> Self {
        Self {
            name: "sidecar".into(),
            pools: vec![Pool {
                name: "default".into(),
                provider: Provider::Openai,
                model: None,
                endpoints: Vec::new(),
                max_concurrency,
                queue,
                attempt_timeout: None,
                drain: false,
                drained: Vec::new(),
                gates: Gates {
                    healthy: true,
                    ..Gates::default()
                },
                structured_output: true,
                price: Price::default(),
                api_key_env: None,
                api_keys_env: Vec::new(),
                probe: None,
                first_token_timeout: None,
                stall_timeout: None,
                stream_usage: true,
                azure: None,
                health_check: None,
                outlier_ejection: None,
                session_affinity: None,
            }],
            routes: vec![Route {
                name: "default".into(),
                matches: RouteMatch::default(),
                chain: vec![ChainStep::Pool("default".into())],
                deadline: None,
                attempt_timeout: None,
                retry_on: RetryOn::DEFAULT.to_vec(),
                fallback: true,
                requires_approval: false,
                allow_downgrade: true,
                cost_ceiling_per_call_usd: None,
                finish_on_client_gone: true,
                first_token_timeout: None,
                stall_timeout: None,
                hedge: None,
                retry_budget: crate::retry_budget::BudgetSettings::default(),
                park: None,
                cache: None,
            }],
            circuit: CircuitSettings::default(),
            default_risk: Risk::Read,
            approval_token_env: None,
            structured_degrade: Duration::from_secs(60),
            tenants: None,
        }
    }

    /// The first route that fits the request.
    pub fn route_for(&self, model: Option<&str>, path: &str) -> Option<&Route> {
        self.route_for_risk(self.default_risk, model, path)
    }

    /// The first route that fits the request (risk, model, path).
    pub fn route_for_risk(&self, risk: Risk, model: Option<&str>, path: &str) -> Option<&Route> {
        self.routes
            .iter()
            .find(|r| r.matches.matches_risk(risk, model, path))
    }

    /// The models the router serves on `path` (its own `GET /v1/models`):
    /// each exact model name a route matches (a `prefix*` pattern names
    /// no model) and each pool's `model`, in policy order without
    /// repeats, kept when a request for it at the default risk class is
    /// routed (the first route that fits it) and `may_use` that route (a
    /// tenant's allowed routes). A catch-all route takes any model but
    /// names none: a sidecar, whose one pool has no model, lists nothing.
    pub fn served_models(&self, path: &str, may_use: impl Fn(&Route) -> bool) -> Vec<&str> {
        let named = self.routes.iter().flat_map(|r| {
            let exact = r
                .matches
                .models
                .iter()
                .filter(|m| !m.ends_with('*'))
                .map(String::as_str);
            let pools = r
                .pools()
                .filter_map(|p| self.pool(p).and_then(|p| p.model.as_deref()));
            exact.chain(pools)
        });
        let mut out: Vec<&str> = Vec::new();
        for m in named {
            if out.contains(&m) {
                continue;
            }
            if self.route_for(Some(m), path).is_some_and(&may_use) {
                out.push(m);
            }
        }
        out
    }

    /// The pool of that name.
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
impl Route {
    /// A route over `chain` with the defaults a document gives, for the
    /// crate's unit tests.
    pub(crate) fn for_tests(chain: Vec<String>, fallback: bool, retry_on: &[RetryOn]) -> Self {
        Self {
            name: "r".into(),
            matches: RouteMatch::default(),
            chain: chain.into_iter().map(ChainStep::Pool).collect(),
            deadline: None,
            attempt_timeout: None,
            retry_on: retry_on.to_vec(),
            fallback,
            requires_approval: false,
            allow_downgrade: true,
            cost_ceiling_per_call_usd: None,
            finish_on_client_gone: true,
            first_token_timeout: None,
            stall_timeout: None,
            hedge: None,
            retry_budget: crate::retry_budget::BudgetSettings::default(),
            park: None,
            cache: None,
        }
    }
}
