//! The policy document and its validation.
//!
//! A policy is written in the style of a Kubernetes resource (YAML or JSON):
//!
//! ```yaml
//! apiVersion: router/v1
//! kind: RoutingPolicy
//! metadata: {name: demo}
//! spec:
//!   queue: {max_size: 1000, timeout_s: 1200, latency_threshold_s: 3.0, ewma_alpha: 0.3, scoring: peak_ewma}
//!   pools:
//!     - name: local
//!       provider: ollama
//!       model: qwen3:8b
//!       endpoints: ["http://127.0.0.1:11434"]
//!       max_concurrency: 4
//!   routes:
//!     - name: default
//!       match: {}
//!       chain: [local]
//! ```
//!
//! Parsing is two steps. [`PolicyDocument::parse`] turns text into the
//! document's shape (unknown fields are errors, reported with their path).
//! [`PolicyDocument::validate`] checks meaning and resolves defaults into a
//! [`Policy`], the only form the router acts on. Validation collects every
//! problem before answering, each as a [`FieldError`] naming the field path
//! (`spec.pools[1].endpoints[0]`) and the reason, so an operator fixes a
//! document in one pass.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::balance::Scoring;
use crate::endpoint::Endpoint;

/// The API version this crate understands.
pub const API_VERSION: &str = "router/v1";
/// The resource kind of a policy document.
pub const KIND: &str = "RoutingPolicy";

/// One problem in a policy document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// Path of the offending field, e.g. `spec.routes[0].chain[1]`.
    pub field: String,
    /// Why it is wrong.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// A policy that cannot be used, with every reason found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// All problems found, in document order.
    pub errors: Vec<FieldError>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(
            f,
            "invalid policy ({n} error{}): ",
            if n == 1 { "" } else { "s" }
        )?;
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl PolicyError {
    fn one(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            errors: vec![FieldError {
                field: field.into(),
                reason: reason.into(),
            }],
        }
    }
}

/// Model-serving API spoken by a pool's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Any OpenAI-compatible API (cloud or local).
    #[default]
    Openai,
    /// Ollama.
    Ollama,
    /// vLLM's OpenAI-compatible server.
    Vllm,
    /// Hugging Face Text Generation Inference.
    Tgi,
}

/// The document as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    /// Must be `router/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Must be `RoutingPolicy`.
    pub kind: String,
    /// Name and labels.
    #[serde(default)]
    pub metadata: Metadata,
    /// The policy proper.
    pub spec: Spec,
}

/// Document metadata.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Policy name, shown in logs.
    #[serde(default)]
    pub name: String,
}

/// The policy's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Deadlines and timeouts for routes that do not set their own.
    #[serde(default)]
    pub defaults: DefaultsSpec,
    /// Queue settings for pools that do not set their own.
    #[serde(default)]
    pub queue: QueueSpec,
    /// Per-endpoint circuit breaker.
    #[serde(default)]
    pub circuit_breaker: CircuitSpec,
    /// Where the approval token for `requires_approval` routes comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalSpec>,
    /// Seconds a pool stays degraded for structured output after a
    /// malformed structured answer (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output_degrade_s: Option<f64>,
    /// Pools of endpoints.
    #[serde(default)]
    pub pools: Vec<PoolSpec>,
    /// Routes, matched in order.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
}

/// Queue settings as written; anything left out comes from the defaults
/// (the `CUSTOM_ROUTER_*` environment).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSpec {
    /// Waiters held at most; when full the oldest is evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<u64>,
    /// Seconds a request may wait in the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// EWMA latency (seconds) under which a busy endpoint still takes work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_threshold_s: Option<f64>,
    /// EWMA smoothing factor in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ewma_alpha: Option<f64>,
    /// `peak_ewma` (default) or `lowest_ewma`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoring: Option<Scoring>,
}

/// Request defaults as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultsSpec {
    /// End-to-end budget of a request without `X-Router-Deadline-Ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Longest single attempt (queue wait included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// Risk class of requests without `X-Router-Risk` (default READ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<Risk>,
}

/// The approval secret as written: the name of the environment variable
/// holding it (the value itself never appears in a policy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSpec {
    /// Environment variable with the token.
    pub token_env: String,
}

/// A request's risk class: what it may do if the model's answer is acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Risk {
    /// Fetch, list, read.
    Read,
    /// Write drafts, plans, summaries.
    Draft,
    /// Email, post, deploy, merge.
    Send,
    /// Delete, terminate, mutate production.
    Destructive,
}

impl Risk {
    /// Parses `READ`, `DRAFT`, `SEND`, `DESTRUCTIVE` (any case).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "READ" => Some(Self::Read),
            "DRAFT" => Some(Self::Draft),
            "SEND" => Some(Self::Send),
            "DESTRUCTIVE" => Some(Self::Destructive),
            _ => None,
        }
    }

    /// The name in headers and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "READ",
            Self::Draft => "DRAFT",
            Self::Send => "SEND",
            Self::Destructive => "DESTRUCTIVE",
        }
    }

    /// SEND and DESTRUCTIVE requests act on the world: one that may have
    /// reached a backend is never sent again.
    pub fn has_side_effects(self) -> bool {
        matches!(self, Self::Send | Self::Destructive)
    }

    /// Every class.
    pub const ALL: [Risk; 4] = [Risk::Read, Risk::Draft, Risk::Send, Risk::Destructive];
}

/// Gates as written: conditions under which a pool may take a request.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatesSpec {
    /// Require a closed circuit and a fresh, healthy capacity probe (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// Fail when the queue holds more than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue_depth: Option<u32>,
    /// Fail when observed latency is more than this fraction of the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_latency_budget_fraction: Option<f64>,
    /// Fail when free VRAM is at or below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_vram_free_mb: Option<u64>,
}

/// Prices as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceSpec {
    /// USD per 1,000 input tokens.
    #[serde(default)]
    pub input_per_1k_usd: f64,
    /// USD per 1,000 output tokens.
    #[serde(default)]
    pub output_per_1k_usd: f64,
}

/// Kind of capacity probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// Ollama's `/api/ps`: resident models and their VRAM.
    Ollama,
    /// vLLM's `/metrics`: waiting requests, KV-cache usage.
    Vllm,
}

/// A capacity probe as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// What to poll.
    pub kind: ProbeKind,
    /// Poll interval (default 1000 ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// Total VRAM of the endpoint's GPUs (Ollama), to derive the free VRAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_total_mb: Option<u64>,
}

/// Circuit breaker settings as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CircuitSpec {
    /// Consecutive failures that open an endpoint's circuit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_errors: Option<u32>,
    /// Seconds it stays open before one probe is let through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_duration_s: Option<f64>,
}

/// An endpoint as written: a base URL, or `{url, drain}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EndpointSpec {
    /// Just the base URL.
    Url(String),
    /// With options.
    Detailed(EndpointOptions),
}

/// An endpoint with options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointOptions {
    /// Base URL.
    pub url: String,
    /// Drained: no new requests; those in flight finish.
    #[serde(default)]
    pub drain: bool,
}

impl EndpointSpec {
    fn url(&self) -> &str {
        match self {
            Self::Url(u) => u,
            Self::Detailed(d) => &d.url,
        }
    }

    fn drain(&self) -> bool {
        matches!(self, Self::Detailed(d) if d.drain)
    }
}

/// A pool as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    /// Unique pool name.
    pub name: String,
    /// API spoken by the endpoints.
    #[serde(default)]
    pub provider: Provider,
    /// Model name sent upstream (the request's `model` is rewritten to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Base URLs of the endpoints.
    #[serde(default)]
    pub endpoints: Vec<EndpointSpec>,
    /// Requests in flight per endpoint at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// Longest attempt on this pool; overrides the route's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// Drain the whole pool: no new requests; those in flight finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
    /// Conditions for taking a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<GatesSpec>,
    /// Whether the pool can produce structured output (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<bool>,
    /// Prices for cost estimates and accounting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<PriceSpec>,
    /// Environment variable holding the API key sent to the endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Capacity probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_probe: Option<ProbeSpec>,
    /// Queue settings for this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueSpec>,
}

/// A route as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Unique route name.
    pub name: String,
    /// What requests the route takes; empty matches everything.
    #[serde(rename = "match", default)]
    pub matches: MatchSpec,
    /// Pools to try, in order.
    #[serde(default)]
    pub chain: Vec<String>,
    /// End-to-end budget of a request without `X-Router-Deadline-Ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Longest single attempt (a pool's own setting wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// Failures that move the request to the next pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<Vec<RetryOn>>,
    /// Fall back along the chain at all (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<bool>,
    /// Requests need a valid `X-Router-Approval` token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_approval: bool,
    /// `false`: the request never moves off the chain's first pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_downgrade: Option<bool>,
    /// Estimated cost above which a pool is gated out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_ceiling_per_call_usd: Option<f64>,
}

/// A failure that may move a request to the next pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// The endpoint could not be reached (refused, reset before an answer, TLS).
    ConnectError,
    /// The attempt ran out of time (queue wait included).
    Timeout,
    /// The endpoint answered 429.
    #[serde(rename = "status_429")]
    Status429,
    /// The endpoint answered 5xx.
    #[serde(rename = "status_5xx")]
    Status5xx,
    /// A JSON answer that does not parse.
    MalformedJson,
}

impl RetryOn {
    /// The default set: everything but `malformed_json`.
    pub const DEFAULT: [RetryOn; 4] = [
        RetryOn::ConnectError,
        RetryOn::Timeout,
        RetryOn::Status429,
        RetryOn::Status5xx,
    ];
}

/// Match conditions as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    /// Request models (exact, or a prefix ending in `*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model: Vec<String>,
    /// Request path prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Risk classes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub risk: Vec<Risk>,
}

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
    /// Capacity probe.
    pub probe: Option<Probe>,
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
}

/// Resolved prices.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    /// USD per 1,000 input tokens.
    pub input_per_1k_usd: f64,
    /// USD per 1,000 output tokens.
    pub output_per_1k_usd: f64,
}

impl Price {
    /// Cost of a call with these token counts.
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> f64 {
        (input_tokens as f64 * self.input_per_1k_usd
            + output_tokens as f64 * self.output_per_1k_usd)
            / 1000.0
    }
}

/// A resolved capacity probe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// What to poll.
    pub kind: ProbeKind,
    /// Poll interval.
    pub interval: Duration,
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

    fn is_catch_all(&self) -> bool {
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
    /// Pool names, in order; each names a pool of the policy.
    pub chain: Vec<String>,
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
}

impl Route {
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
                probe: None,
            }],
            routes: vec![Route {
                name: "default".into(),
                matches: RouteMatch::default(),
                chain: vec!["default".into()],
                deadline: None,
                attempt_timeout: None,
                retry_on: RetryOn::DEFAULT.to_vec(),
                fallback: true,
                requires_approval: false,
                allow_downgrade: true,
                cost_ceiling_per_call_usd: None,
            }],
            circuit: CircuitSettings::default(),
            default_risk: Risk::Read,
            approval_token_env: None,
            structured_degrade: Duration::from_secs(60),
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

    /// The pool of that name.
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }
}

impl PolicyDocument {
    /// Parses YAML or JSON. Shape errors (unknown fields, wrong types) come
    /// back with their field path.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let trimmed = text.trim_start();
        if trimmed.starts_with('{') {
            let mut de = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut de).map_err(|e| shape_error(e.path(), e.inner()))
        } else {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| shape_error(e.path(), e.inner()))
        }
    }

    /// Checks meaning and resolves defaults. Every problem is reported.
    pub fn validate(&self, defaults: &QueueSettings) -> Result<Policy, PolicyError> {
        let mut errs = Errors::default();
        if self.api_version != API_VERSION {
            errs.push("apiVersion", format!("must be {API_VERSION:?}"));
        }
        if self.kind != KIND {
            errs.push("kind", format!("must be {KIND:?}"));
        }
        let spec_queue = resolve_queue(&self.spec.queue, defaults, "spec.queue", &mut errs);
        let default_deadline = millis(
            self.spec.defaults.deadline_ms,
            "spec.defaults.deadline_ms",
            &mut errs,
        );
        let default_attempt = millis(
            self.spec.defaults.attempt_timeout_ms,
            "spec.defaults.attempt_timeout_ms",
            &mut errs,
        );
        let mut circuit = CircuitSettings::default();
        if let Some(n) = self.spec.circuit_breaker.consecutive_errors {
            if n == 0 {
                errs.push(
                    "spec.circuit_breaker.consecutive_errors",
                    "must be at least 1",
                );
            } else {
                circuit.consecutive_errors = n;
            }
        }
        if let Some(t) = self.spec.circuit_breaker.open_duration_s {
            match positive_duration(t) {
                Some(d) => circuit.open_duration = d,
                None => errs.push(
                    "spec.circuit_breaker.open_duration_s",
                    "must be a positive number of seconds",
                ),
            }
        }

        if self.spec.pools.is_empty() {
            errs.push("spec.pools", "at least one pool is required");
        }
        let mut pools = Vec::new();
        let mut pool_names = HashSet::new();
        for (i, p) in self.spec.pools.iter().enumerate() {
            let at = format!("spec.pools[{i}]");
            check_name(&p.name, &format!("{at}.name"), &mut errs);
            if !pool_names.insert(p.name.as_str()) {
                errs.push(
                    format!("{at}.name"),
                    format!("duplicate pool name {:?}", p.name),
                );
            }
            let mut endpoints = Vec::new();
            let mut drained = Vec::new();
            for (j, e) in p.endpoints.iter().enumerate() {
                match Endpoint::parse(e.url()) {
                    Ok(ep) if endpoints.contains(&ep) => errs.push(
                        format!("{at}.endpoints[{j}]"),
                        format!("duplicate endpoint {ep}"),
                    ),
                    Ok(ep) => {
                        if e.drain() {
                            drained.push(ep.clone());
                        }
                        endpoints.push(ep);
                    }
                    Err(err) => errs.push(format!("{at}.endpoints[{j}]"), err.to_string()),
                }
            }
            let attempt_timeout = millis(
                p.attempt_timeout_ms,
                &format!("{at}.attempt_timeout_ms"),
                &mut errs,
            );
            if p.max_concurrency == Some(0) {
                errs.push(
                    format!("{at}.max_concurrency"),
                    "must be at least 1 (leave it out for no limit)",
                );
            }
            if let Some(m) = &p.model {
                if m.trim().is_empty() {
                    errs.push(format!("{at}.model"), "must not be empty");
                }
            }
            let g = p.gates.clone().unwrap_or_default();
            let gates = Gates {
                healthy: g.healthy.unwrap_or(true),
                max_queue_depth: g.max_queue_depth,
                max_latency_budget_fraction: g.max_latency_budget_fraction,
                min_vram_free_mb: g.min_vram_free_mb,
            };
            if let Some(f) = g.max_latency_budget_fraction {
                if !(f.is_finite() && f > 0.0) {
                    errs.push(
                        format!("{at}.gates.max_latency_budget_fraction"),
                        "must be a positive fraction: at 0 or below the gate can never hold",
                    );
                }
            }
            let price = p.price.clone().map_or(Price::default(), |pr| Price {
                input_per_1k_usd: pr.input_per_1k_usd,
                output_per_1k_usd: pr.output_per_1k_usd,
            });
            for (field, v) in [
                ("input_per_1k_usd", price.input_per_1k_usd),
                ("output_per_1k_usd", price.output_per_1k_usd),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    errs.push(
                        format!("{at}.price.{field}"),
                        "must be a non-negative number",
                    );
                }
            }
            if let Some(env) = &p.api_key_env {
                if env.is_empty() || !env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    errs.push(
                        format!("{at}.api_key_env"),
                        "must be an environment variable name",
                    );
                }
            }
            let probe = p.capacity_probe.as_ref().map(|c| Probe {
                kind: c.kind,
                interval: Duration::from_millis(c.interval_ms.unwrap_or(1000).max(1)),
                vram_total_mb: c.vram_total_mb,
            });
            if let Some(c) = &p.capacity_probe {
                if c.interval_ms == Some(0) {
                    errs.push(
                        format!("{at}.capacity_probe.interval_ms"),
                        "must be positive",
                    );
                }
                if c.kind == ProbeKind::Ollama
                    && c.vram_total_mb.is_none()
                    && g.min_vram_free_mb.is_some()
                {
                    errs.push(
                        format!("{at}.capacity_probe.vram_total_mb"),
                        "needed to derive free VRAM for gates.min_vram_free_mb",
                    );
                }
                if c.kind == ProbeKind::Vllm && g.min_vram_free_mb.is_some() {
                    errs.push(
                        format!("{at}.gates.min_vram_free_mb"),
                        "a vllm probe does not report free VRAM: the gate could never be checked",
                    );
                }
            }
            if let (Some(min), Some(total)) = (
                g.min_vram_free_mb,
                p.capacity_probe.as_ref().and_then(|c| c.vram_total_mb),
            ) {
                if min >= total {
                    errs.push(
                        format!("{at}.gates.min_vram_free_mb"),
                        format!(
                            "{min} MB can never be free on {total} MB: the gate can never hold"
                        ),
                    );
                }
            }
            if g.min_vram_free_mb.is_some() && p.capacity_probe.is_none() {
                errs.push(
                    format!("{at}.gates.min_vram_free_mb"),
                    "needs a capacity_probe to measure free VRAM",
                );
            }
            let queue = match &p.queue {
                Some(q) => resolve_queue(q, &spec_queue, &format!("{at}.queue"), &mut errs),
                None => spec_queue,
            };
            pools.push(Pool {
                name: p.name.clone(),
                provider: p.provider,
                model: p.model.clone(),
                endpoints,
                max_concurrency: p.max_concurrency,
                queue,
                attempt_timeout,
                drain: p.drain,
                drained,
                gates,
                structured_output: p.structured_output.unwrap_or(true),
                price,
                api_key_env: p.api_key_env.clone(),
                probe,
            });
        }

        if self.spec.routes.is_empty() {
            errs.push("spec.routes", "at least one route is required");
        }
        let mut routes: Vec<Route> = Vec::new();
        let mut route_names = HashSet::new();
        for (i, r) in self.spec.routes.iter().enumerate() {
            let at = format!("spec.routes[{i}]");
            check_name(&r.name, &format!("{at}.name"), &mut errs);
            if !route_names.insert(r.name.as_str()) {
                errs.push(
                    format!("{at}.name"),
                    format!("duplicate route name {:?}", r.name),
                );
            }
            if r.chain.is_empty() {
                errs.push(format!("{at}.chain"), "must name at least one pool");
            }
            let mut seen = HashSet::new();
            for (j, name) in r.chain.iter().enumerate() {
                if !pool_names.contains(name.as_str()) {
                    errs.push(format!("{at}.chain[{j}]"), format!("unknown pool {name:?}"));
                } else if !seen.insert(name.as_str()) {
                    errs.push(
                        format!("{at}.chain[{j}]"),
                        format!("pool {name:?} appears twice"),
                    );
                }
            }
            for (j, m) in r.matches.model.iter().enumerate() {
                if m.is_empty() || m == "*" {
                    errs.push(
                        format!("{at}.match.model[{j}]"),
                        "empty or bare \"*\" pattern; leave model out to match any model",
                    );
                }
            }
            if let Some(p) = &r.matches.path_prefix {
                if !p.starts_with('/') {
                    errs.push(format!("{at}.match.path_prefix"), "must start with '/'");
                }
            }
            let matches = RouteMatch {
                models: r.matches.model.clone(),
                path_prefix: r.matches.path_prefix.clone(),
                risks: r.matches.risk.clone(),
            };
            if let Some(c) = r.cost_ceiling_per_call_usd {
                if !(c.is_finite() && c >= 0.0) {
                    errs.push(
                        format!("{at}.cost_ceiling_per_call_usd"),
                        "must be a non-negative number",
                    );
                }
            }
            if r.requires_approval && self.spec.approval.is_none() {
                errs.push(
                    format!("{at}.requires_approval"),
                    "needs spec.approval.token_env: without a token no request could ever pass",
                );
            }
            if let Some(earlier) = routes.iter().find(|e| e.matches.is_catch_all()) {
                errs.push(
                    format!("{at}.match"),
                    format!(
                        "can never match: route {:?} before it matches every request",
                        earlier.name
                    ),
                );
            }
            let deadline =
                millis(r.deadline_ms, &format!("{at}.deadline_ms"), &mut errs).or(default_deadline);
            let attempt_timeout = millis(
                r.attempt_timeout_ms,
                &format!("{at}.attempt_timeout_ms"),
                &mut errs,
            )
            .or(default_attempt);
            let retry_on = match &r.retry_on {
                Some(list) => {
                    let mut out: Vec<RetryOn> = Vec::new();
                    for (j, f) in list.iter().enumerate() {
                        if out.contains(f) {
                            errs.push(format!("{at}.retry_on[{j}]"), "listed twice");
                        } else {
                            out.push(*f);
                        }
                    }
                    out
                }
                None => RetryOn::DEFAULT.to_vec(),
            };
            routes.push(Route {
                name: r.name.clone(),
                matches,
                chain: r.chain.clone(),
                deadline,
                attempt_timeout,
                retry_on,
                fallback: r.fallback.unwrap_or(true),
                requires_approval: r.requires_approval,
                allow_downgrade: r.allow_downgrade.unwrap_or(true),
                cost_ceiling_per_call_usd: r.cost_ceiling_per_call_usd,
            });
        }

        let structured_degrade = match self.spec.structured_output_degrade_s {
            None => Duration::from_secs(60),
            Some(t) => positive_duration(t).unwrap_or_else(|| {
                errs.push(
                    "spec.structured_output_degrade_s",
                    "must be a positive number of seconds",
                );
                Duration::from_secs(60)
            }),
        };
        let approval_token_env = self.spec.approval.as_ref().map(|a| a.token_env.clone());
        if let Some(env) = &approval_token_env {
            if env.is_empty() || !env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                errs.push(
                    "spec.approval.token_env",
                    "must be an environment variable name",
                );
            }
        }
        errs.finish(Policy {
            name: self.metadata.name.clone(),
            pools,
            routes,
            circuit,
            default_risk: self.spec.defaults.risk.unwrap_or(Risk::Read),
            approval_token_env,
            structured_degrade,
        })
    }
}

/// Parses and validates in one step.
pub fn load(text: &str, defaults: &QueueSettings) -> Result<Policy, PolicyError> {
    PolicyDocument::parse(text)?.validate(defaults)
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            reason: reason.into(),
        });
    }

    fn finish<T>(self, value: T) -> Result<T, PolicyError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(PolicyError { errors: self.0 })
        }
    }
}

fn shape_error(path: &serde_path_to_error::Path, inner: &dyn fmt::Display) -> PolicyError {
    let field = path.to_string();
    let field = if field == "." || field.is_empty() {
        "(document)".to_string()
    } else {
        field
    };
    // Some deserializers already prefix their message with the path.
    let reason = inner.to_string();
    let reason = reason
        .strip_prefix(&format!("{field}: "))
        .map(str::to_string)
        .unwrap_or(reason);
    PolicyError::one(field, reason)
}

fn check_name(name: &str, field: &str, errs: &mut Errors) {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if !ok {
        errs.push(
            field,
            "must be 1-63 characters of letters, digits, '-', '_' or '.'",
        );
    }
}

fn resolve_queue(
    q: &QueueSpec,
    base: &QueueSettings,
    at: &str,
    errs: &mut Errors,
) -> QueueSettings {
    let mut out = *base;
    if let Some(n) = q.max_size {
        if n == 0 {
            errs.push(format!("{at}.max_size"), "must be at least 1");
        } else {
            out.max_size = usize::try_from(n).unwrap_or(usize::MAX);
        }
    }
    if let Some(t) = q.timeout_s {
        match positive_duration(t) {
            Some(d) => out.timeout = d,
            None => errs.push(
                format!("{at}.timeout_s"),
                "must be a positive number of seconds",
            ),
        }
    }
    if let Some(t) = q.latency_threshold_s {
        if t.is_finite() && t > 0.0 {
            out.latency_threshold_s = t;
        } else {
            errs.push(
                format!("{at}.latency_threshold_s"),
                "must be a positive number of seconds",
            );
        }
    }
    if let Some(a) = q.ewma_alpha {
        if a > 0.0 && a <= 1.0 {
            out.ewma_alpha = a;
        } else {
            errs.push(format!("{at}.ewma_alpha"), "must be in (0, 1]");
        }
    }
    if let Some(s) = q.scoring {
        out.scoring = s;
    }
    out
}

fn millis(value: Option<u64>, field: &str, errs: &mut Errors) -> Option<Duration> {
    match value {
        Some(0) => {
            errs.push(field, "must be a positive number of milliseconds");
            None
        }
        Some(ms) => Some(Duration::from_millis(ms)),
        None => None,
    }
}

/// A positive, finite number of seconds as a duration.
pub fn positive_duration(seconds: f64) -> Option<Duration> {
    if seconds.is_finite() && seconds > 0.0 && seconds < 1e9 {
        Some(Duration::from_secs_f64(seconds))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: router/v1
kind: RoutingPolicy
metadata: {name: demo}
spec:
  queue: {max_size: 10, timeout_s: 5}
  pools:
    - name: fast
      provider: vllm
      model: small
      endpoints: ["127.0.0.1:9001", "http://127.0.0.1:9002"]
      max_concurrency: 2
    - name: cloud
      endpoints: ["https://api.example.com/v1"]
      queue: {ewma_alpha: 0.5, scoring: lowest_ewma}
  routes:
    - name: chat
      match: {model: ["gpt-*"], path_prefix: /v1}
      chain: [fast, cloud]
    - name: default
      chain: [cloud]
"#;

    #[test]
    fn parses_and_resolves_defaults() {
        let p = load(GOOD, &QueueSettings::default()).unwrap();
        assert_eq!(p.name, "demo");
        assert_eq!(p.pools.len(), 2);
        let fast = p.pool("fast").unwrap();
        assert_eq!(fast.queue.max_size, 10);
        assert_eq!(fast.queue.timeout, Duration::from_secs(5));
        assert_eq!(fast.queue.ewma_alpha, 0.3);
        assert_eq!(fast.provider, Provider::Vllm);
        let cloud = p.pool("cloud").unwrap();
        assert_eq!(cloud.queue.ewma_alpha, 0.5);
        assert_eq!(cloud.queue.max_size, 10);
        assert_eq!(cloud.queue.scoring, Scoring::LowestEwma);
        assert_eq!(
            p.route_for(Some("gpt-4o"), "/v1/chat/completions")
                .unwrap()
                .name,
            "chat"
        );
        assert_eq!(
            p.route_for(Some("llama"), "/v1/chat/completions")
                .unwrap()
                .name,
            "default"
        );
        assert_eq!(p.route_for(None, "/health").unwrap().name, "default");
    }

    #[test]
    fn json_is_accepted() {
        let doc = PolicyDocument::parse(GOOD).unwrap();
        let json = serde_json::to_string(&doc).unwrap();
        assert_eq!(PolicyDocument::parse(&json).unwrap(), doc);
    }

    #[test]
    fn unknown_field_is_reported_with_its_path() {
        let text = GOOD.replace("max_concurrency: 2", "max_concurency: 2");
        let err = PolicyDocument::parse(&text).unwrap_err();
        assert_eq!(err.errors.len(), 1);
        assert_eq!(err.errors[0].field, "spec.pools[0].max_concurency");
        assert!(err.errors[0].reason.contains("max_concurency"), "{err}");
    }

    #[test]
    fn every_error_at_once() {
        let text = r#"
apiVersion: router/v2
kind: RoutingPolicy
spec:
  queue: {ewma_alpha: 1.5}
  pools:
    - name: a
      endpoints: ["ftp://x:1", "h:1", "h:1"]
      max_concurrency: 0
    - name: a
  routes:
    - name: all
      chain: [a, b]
    - name: never
      match: {model: [x]}
      chain: []
"#;
        let err = load(text, &QueueSettings::default()).unwrap_err();
        let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "apiVersion",
                "spec.queue.ewma_alpha",
                "spec.pools[0].endpoints[0]",
                "spec.pools[0].endpoints[2]",
                "spec.pools[0].max_concurrency",
                "spec.pools[1].name",
                "spec.routes[0].chain[1]",
                "spec.routes[1].chain",
                "spec.routes[1].match",
            ],
            "{err}"
        );
        assert!(err.to_string().contains("unknown pool \"b\""));
    }

    #[test]
    fn deadlines_retries_and_draining() {
        let text = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  defaults: {deadline_ms: 8000, attempt_timeout_ms: 5000}
  circuit_breaker: {consecutive_errors: 2, open_duration_s: 10}
  pools:
    - name: a
      endpoints: ["h:1", {url: "h:2", drain: true}]
      attempt_timeout_ms: 3000
    - name: b
      endpoints: ["h:3"]
      drain: true
  routes:
    - name: s
      match: {model: [x]}
      chain: [b]
    - name: r
      chain: [a, b]
      retry_on: [timeout, status_429]
      fallback: false
"#;
        let p = load(text, &QueueSettings::default()).unwrap();
        let a = p.pool("a").unwrap();
        assert_eq!(a.attempt_timeout, Some(Duration::from_secs(3)));
        assert_eq!(a.drained, vec![Endpoint::parse("h:2").unwrap()]);
        assert!(p.pool("b").unwrap().drain);
        let r = &p.routes[1];
        assert_eq!(r.deadline, Some(Duration::from_secs(8)));
        assert_eq!(r.attempt_timeout, Some(Duration::from_secs(5)));
        assert_eq!(r.retry_on, vec![RetryOn::Timeout, RetryOn::Status429]);
        assert!(!r.fallback);
        assert!(
            !r.retries_on(RetryOn::Timeout),
            "fallback off: nothing retries"
        );
        assert_eq!(p.routes[0].retry_on, RetryOn::DEFAULT.to_vec());
        assert!(p.routes[0].retries_on(RetryOn::Status5xx));
        assert_eq!(p.circuit.consecutive_errors, 2);

        let bad = text
            .replace("status_429]", "status_418]")
            .replace("8000", "0");
        let err = load(&bad, &QueueSettings::default()).unwrap_err();
        assert_eq!(err.errors[0].field, "spec.routes[1].retry_on[1]");
        assert!(
            err.errors[0]
                .reason
                .starts_with("unknown variant `status_418`"),
            "{err}"
        );
    }

    /// Every check `validate` makes, each failing once: the field paths,
    /// the reasons and their order are the operator-facing contract.
    #[test]
    fn every_check_reports_its_field_and_reason_in_order() {
        let text = r#"
apiVersion: router/v2
kind: Policy
spec:
  defaults: {deadline_ms: 0, attempt_timeout_ms: 0}
  queue: {max_size: 0, timeout_s: -1, latency_threshold_s: .nan, ewma_alpha: 0}
  circuit_breaker: {consecutive_errors: 0, open_duration_s: 0}
  approval: {token_env: "BAD-NAME"}
  structured_output_degrade_s: -5
  pools:
    - name: "bad name"
      model: " "
      endpoints: ["ftp://x:1", "h:1", {url: "h:1", drain: true}]
      attempt_timeout_ms: 0
      max_concurrency: 0
      gates: {max_latency_budget_fraction: 0, min_vram_free_mb: 100}
      price: {input_per_1k_usd: -1, output_per_1k_usd: .inf}
      api_key_env: "a-b"
      queue: {max_size: 0, timeout_s: 0, latency_threshold_s: -1, ewma_alpha: 2}
    - name: "bad name"
      endpoints: ["h:2"]
      capacity_probe: {kind: ollama, interval_ms: 0}
      gates: {min_vram_free_mb: 1}
    - name: v
      capacity_probe: {kind: vllm, vram_total_mb: 8}
      gates: {min_vram_free_mb: 8}
    - name: o
      capacity_probe: {kind: ollama, vram_total_mb: 8}
      gates: {min_vram_free_mb: 9}
  routes:
    - name: ""
      match: {model: ["", "*"], path_prefix: "v1"}
      chain: [v, nope, v]
      deadline_ms: 0
      attempt_timeout_ms: 0
      retry_on: [timeout, timeout]
      cost_ceiling_per_call_usd: -0.5
      requires_approval: true
    - name: all
      chain: []
    - name: all
      chain: [o]
"#;
        let err = load(text, &QueueSettings::default()).unwrap_err();
        let got: Vec<(&str, &str)> = err
            .errors
            .iter()
            .map(|e| (e.field.as_str(), e.reason.as_str()))
            .collect();
        let want: Vec<(&str, &str)> = vec![
            ("apiVersion", "must be \"router/v1\""),
            ("kind", "must be \"RoutingPolicy\""),
            ("spec.queue.max_size", "must be at least 1"),
            (
                "spec.queue.timeout_s",
                "must be a positive number of seconds",
            ),
            (
                "spec.queue.latency_threshold_s",
                "must be a positive number of seconds",
            ),
            ("spec.queue.ewma_alpha", "must be in (0, 1]"),
            (
                "spec.defaults.deadline_ms",
                "must be a positive number of milliseconds",
            ),
            (
                "spec.defaults.attempt_timeout_ms",
                "must be a positive number of milliseconds",
            ),
            (
                "spec.circuit_breaker.consecutive_errors",
                "must be at least 1",
            ),
            (
                "spec.circuit_breaker.open_duration_s",
                "must be a positive number of seconds",
            ),
            (
                "spec.pools[0].name",
                "must be 1-63 characters of letters, digits, '-', '_' or '.'",
            ),
            (
                "spec.pools[0].endpoints[0]",
                "unsupported scheme \"ftp\" (use http or https)",
            ),
            (
                "spec.pools[0].endpoints[2]",
                "duplicate endpoint http://h:1",
            ),
            (
                "spec.pools[0].attempt_timeout_ms",
                "must be a positive number of milliseconds",
            ),
            (
                "spec.pools[0].max_concurrency",
                "must be at least 1 (leave it out for no limit)",
            ),
            ("spec.pools[0].model", "must not be empty"),
            (
                "spec.pools[0].gates.max_latency_budget_fraction",
                "must be a positive fraction: at 0 or below the gate can never hold",
            ),
            (
                "spec.pools[0].price.input_per_1k_usd",
                "must be a non-negative number",
            ),
            (
                "spec.pools[0].price.output_per_1k_usd",
                "must be a non-negative number",
            ),
            (
                "spec.pools[0].api_key_env",
                "must be an environment variable name",
            ),
            (
                "spec.pools[0].gates.min_vram_free_mb",
                "needs a capacity_probe to measure free VRAM",
            ),
            ("spec.pools[0].queue.max_size", "must be at least 1"),
            (
                "spec.pools[0].queue.timeout_s",
                "must be a positive number of seconds",
            ),
            (
                "spec.pools[0].queue.latency_threshold_s",
                "must be a positive number of seconds",
            ),
            ("spec.pools[0].queue.ewma_alpha", "must be in (0, 1]"),
            (
                "spec.pools[1].name",
                "must be 1-63 characters of letters, digits, '-', '_' or '.'",
            ),
            ("spec.pools[1].name", "duplicate pool name \"bad name\""),
            (
                "spec.pools[1].capacity_probe.interval_ms",
                "must be positive",
            ),
            (
                "spec.pools[1].capacity_probe.vram_total_mb",
                "needed to derive free VRAM for gates.min_vram_free_mb",
            ),
            (
                "spec.pools[2].gates.min_vram_free_mb",
                "a vllm probe does not report free VRAM: the gate could never be checked",
            ),
            (
                "spec.pools[2].gates.min_vram_free_mb",
                "8 MB can never be free on 8 MB: the gate can never hold",
            ),
            (
                "spec.pools[3].gates.min_vram_free_mb",
                "9 MB can never be free on 8 MB: the gate can never hold",
            ),
            (
                "spec.routes[0].name",
                "must be 1-63 characters of letters, digits, '-', '_' or '.'",
            ),
            ("spec.routes[0].chain[1]", "unknown pool \"nope\""),
            ("spec.routes[0].chain[2]", "pool \"v\" appears twice"),
            (
                "spec.routes[0].match.model[0]",
                "empty or bare \"*\" pattern; leave model out to match any model",
            ),
            (
                "spec.routes[0].match.model[1]",
                "empty or bare \"*\" pattern; leave model out to match any model",
            ),
            ("spec.routes[0].match.path_prefix", "must start with '/'"),
            (
                "spec.routes[0].cost_ceiling_per_call_usd",
                "must be a non-negative number",
            ),
            (
                "spec.routes[0].deadline_ms",
                "must be a positive number of milliseconds",
            ),
            (
                "spec.routes[0].attempt_timeout_ms",
                "must be a positive number of milliseconds",
            ),
            ("spec.routes[0].retry_on[1]", "listed twice"),
            ("spec.routes[1].chain", "must name at least one pool"),
            ("spec.routes[2].name", "duplicate route name \"all\""),
            (
                "spec.routes[2].match",
                "can never match: route \"all\" before it matches every request",
            ),
            (
                "spec.structured_output_degrade_s",
                "must be a positive number of seconds",
            ),
            (
                "spec.approval.token_env",
                "must be an environment variable name",
            ),
        ];
        assert_eq!(got, want, "{err}");

        // The checks that need what the first document has: no pools or
        // routes at all, and an approval route without a token.
        let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec: {}\n";
        let err = load(text, &QueueSettings::default()).unwrap_err();
        assert_eq!(
            err.errors,
            vec![
                FieldError {
                    field: "spec.pools".into(),
                    reason: "at least one pool is required".into(),
                },
                FieldError {
                    field: "spec.routes".into(),
                    reason: "at least one route is required".into(),
                },
            ]
        );
        let text = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools: [{name: a}]
  routes: [{name: r, chain: [a], requires_approval: true}]
"#;
        let err = load(text, &QueueSettings::default()).unwrap_err();
        assert_eq!(
            err.errors,
            vec![FieldError {
                field: "spec.routes[0].requires_approval".into(),
                reason: "needs spec.approval.token_env: without a token no request could ever pass"
                    .into(),
            }]
        );
    }

    #[test]
    fn sidecar_policy_has_one_default_route() {
        let p = Policy::sidecar(QueueSettings::default(), None);
        assert_eq!(p.route_for(Some("m"), "/x").unwrap().chain, vec!["default"]);
        assert!(p.pool("default").unwrap().endpoints.is_empty());
    }
}
