//! The document as written: the shape serde reads, field for field.
//!
//! Every struct denies unknown fields, so a misspelt key is an error with
//! its path rather than a silently ignored setting. Optional settings stay
//! `Option`s here; validation resolves them.

use serde::{Deserialize, Serialize};

use super::shape::{all_shape_errors, field_error};
use super::PolicyError;
use crate::balance::Scoring;

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
    /// Anthropic's Messages API (`POST /v1/messages`; the pool's key goes
    /// as `x-api-key`, with `anthropic-version: 2023-06-01`). Requests of
    /// another dialect are translated to it (`docs/dialects.md`).
    Anthropic,
    /// Azure OpenAI (`/openai/deployments/{deployment}/...?api-version=`;
    /// the pool's key goes as `api-key`). OpenAI's dialect.
    AzureOpenai,
    /// Google's Gemini API (`/v1beta/models/{model}:generateContent`; the
    /// pool's key goes as `x-goog-api-key`). Requests of another dialect
    /// are translated to it (`docs/dialects.md`).
    Gemini,
}

impl Provider {
    /// The provider's name in the policy (and spans).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Ollama => "ollama",
            Self::Vllm => "vllm",
            Self::Tgi => "tgi",
            Self::Anthropic => "anthropic",
            Self::AzureOpenai => "azure_openai",
            Self::Gemini => "gemini",
        }
    }

    /// Whether the pool speaks Anthropic's Messages dialect.
    pub const fn is_anthropic(self) -> bool {
        matches!(self, Self::Anthropic)
    }

    /// Whether the pool speaks Gemini's `generateContent` dialect.
    pub const fn is_gemini(self) -> bool {
        matches!(self, Self::Gemini)
    }

    /// Whether the pool speaks OpenAI's chat completions (every provider
    /// but `anthropic` and `gemini`; `azure_openai` too, on its own paths).
    pub const fn speaks_openai(self) -> bool {
        !matches!(self, Self::Anthropic | Self::Gemini)
    }

    /// The dialect the pool's endpoints speak.
    pub const fn dialect(self) -> router_dialect::Dialect {
        match self {
            Self::Anthropic => router_dialect::Dialect::Anthropic,
            Self::Gemini => router_dialect::Dialect::Gemini,
            _ => router_dialect::Dialect::OpenAi,
        }
    }
}

/// The Azure OpenAI `api-version` a pool sends when its policy names none
/// (a GA version).
pub const DEFAULT_AZURE_API_VERSION: &str = "2024-10-21";

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
    /// The old static approval token, for `requires_approval` routes
    /// (signed approvals need nothing here).
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
    /// Who may call (none: anyone who reaches the router).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantSpec>,
}

/// A tenant as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Unique name (route log, spans, metrics).
    pub name: String,
    /// Its keys' hashes, `sha256:<64 hex digits>` (never the keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// Routes it may use (default: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
    /// The highest risk class it may claim (default DESTRUCTIVE: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_risk: Option<Risk>,
    /// Requests without a key are this tenant's (at most one tenant).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub anonymous: bool,
    /// Its limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<TenantLimitsSpec>,
}

/// A tenant's limits as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsSpec {
    /// Requests per minute (fleet-wide with a shared store, else per
    /// proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// Requests that may come at once within `requests_per_minute`
    /// (default: five, or a twentieth of the limit when that is more,
    /// never more than the limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_burst: Option<u32>,
    /// While the shared store is unreachable: `open` (default: requests
    /// pass) or `closed` (refused with 503 shared_store_unavailable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_store_down: Option<StoreDown>,
    /// Input plus output tokens per minute (fleet-wide with a shared
    /// store, else per proxy); a call's worst case is counted before it is
    /// sent, its actual tokens after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
    /// Tokens that may be drawn at once within `tokens_per_minute`
    /// (default: a twentieth of the limit, at least one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_burst: Option<u32>,
    /// Requests in flight at once (fleet-wide with a shared store, else
    /// per proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_requests: Option<u32>,
    /// Spend budget per UTC day, USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_usd_per_day: Option<f64>,
    /// Spend budget per UTC month, USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_usd_per_month: Option<f64>,
    /// Budgets while the shared store is unreachable: `closed` (default:
    /// refused with 503 shared_store_unavailable) or `open`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_on_store_down: Option<StoreDown>,
}

/// What a limit does while the shared store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreDown {
    /// Requests pass.
    Open,
    /// Requests are refused.
    Closed,
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
    /// `peak_ewma` (default), `lowest_ewma`, `least_requests`,
    /// `round_robin` or `engine_aware`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoring: Option<Scoring>,
}

/// Prefix affinity on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AffinityKind {
    /// No affinity: the lowest cost wins.
    None,
    /// Requests sharing their leading prompt stick to one endpoint, within
    /// bounded loads.
    Prefix,
}

/// Engine-aware balancing settings as written (`balance: engine_aware`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineAwareSpec {
    /// More requests waiting inside an engine than this: saturated (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting: Option<u32>,
    /// A KV cache fuller than this fraction: saturated (default 0.8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_usage: Option<f64>,
    /// `prefix` or `none` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<AffinityKind>,
    /// Bounded-load factor `c` of the affinity ring, above 1 (default 1.25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_factor: Option<f64>,
    /// Bytes per block of the hashed prompt (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_block_bytes: Option<usize>,
    /// Blocks hashed at most (default 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_max_blocks: Option<usize>,
    /// Prompt bytes per token, the pool's tokenizer ratio (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_bytes_per_token: Option<f64>,
    /// Each endpoint's prefix cache in tokens when its engine does not
    /// report it (default 65,536; vLLM reports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache_tokens: Option<u64>,
    /// A prefix no endpoint holds goes to its home on the ring unless home
    /// is slower than the best by more than this fraction of the
    /// request's own prefill (default 0.25; 0: only when home is as good).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_home_slack: Option<f64>,
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

/// The old form of approval: one static shared token, named by the
/// environment variable holding it (the value never appears in a policy).
///
/// Approvals are signed per route and request id (`routerctl approve`,
/// checked with the proxy's `CUSTOM_ROUTER_APPROVAL_KEY`) and need no
/// section here. A static token approves every request of every route for
/// as long as it lives, so it is taken only with `allow_static_token: true`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSpec {
    /// Environment variable with the static token.
    pub token_env: String,
    /// The explicit opt-in to the static token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_static_token: bool,
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
    /// Fail when every endpoint's time per output token (EWMA, from
    /// streams) is above this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tpot_ms: Option<u64>,
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
    /// USD per 1,000 prompt tokens read from the provider's prompt cache
    /// (default: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_per_1k_usd: Option<f64>,
    /// USD per 1,000 prompt tokens written to the provider's prompt cache
    /// (default: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_1k_usd: Option<f64>,
}

/// Kind of capacity probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// Ollama's `/api/ps`: resident models and their VRAM.
    Ollama,
    /// vLLM's `/metrics`: waiting and running requests, KV-cache usage.
    Vllm,
    /// SGLang's `/metrics`: queued and running requests, token usage.
    Sglang,
    /// TGI's `/metrics`: queue size and batch size.
    Tgi,
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
    /// Longest one probe may take (default 1000 ms, whatever the interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Failed probes in a row that make an endpoint unusable (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_after: Option<u32>,
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
    /// The base URL as written.
    pub fn url(&self) -> &str {
        match self {
            Self::Url(u) => u,
            Self::Detailed(d) => &d.url,
        }
    }

    /// Drained one by one.
    pub fn drain(&self) -> bool {
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
    /// Several keys, each an environment variable: every (endpoint, key)
    /// pair is balanced as an endpoint of its own (`api_key_env` and this
    /// are never both set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys_env: Option<Vec<String>>,
    /// Capacity probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_probe: Option<ProbeSpec>,
    /// Queue settings for this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueSpec>,
    /// A streamed answer's first content must come this soon, or the
    /// attempt is abandoned and the next pool tried; overrides the route's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_timeout_ms: Option<u64>,
    /// A stream that sends nothing for this long after its first token is
    /// cut (`stream_stalled`); overrides the route's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout_ms: Option<u64>,
    /// Ask the endpoints for usage in streams
    /// (`stream_options.include_usage`) when the client did not (default
    /// true, false for `tgi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_usage: Option<bool>,
    /// The Azure OpenAI deployment the requests go to (required with
    /// `provider: azure_openai`, refused with any other).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// The Azure OpenAI `api-version` (default [`DEFAULT_AZURE_API_VERSION`];
    /// only with `provider: azure_openai`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,

    /// How an endpoint is chosen; wins over `queue.scoring`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<Scoring>,
    /// Engine-aware settings (with `balance: engine_aware`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_aware: Option<EngineAwareSpec>,

    /// Active health checks (on by default for `vllm`, `tgi` and `ollama`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckSpec>,
    /// Outlier ejection by error rate (off unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_ejection: Option<OutlierEjectionSpec>,
    /// Requests with the same value of a header go to the same endpoint
    /// (off unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionAffinitySpec>,
}

/// Session affinity as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionAffinitySpec {
    /// The header whose value names the session
    /// (`x-claude-code-session-id`).
    pub header: String,
    /// How far above the pool's average load a session's endpoint may be
    /// before the session spills (default 1.25; at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_factor: Option<f64>,
}

/// Active health checks as written; every field optional (the provider's
/// defaults).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckSpec {
    /// `false` turns the provider's default checks off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Path requested with `GET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Time between two checks of one endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// Longest a check may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Failed checks in a row before an endpoint takes no traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_after: Option<u32>,
    /// Passed checks in a row before it takes traffic again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_after: Option<u32>,
}

/// Outlier ejection as written; every field optional.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierEjectionSpec {
    /// Window the error rates are measured over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// Requests an endpoint must have had in the window to be judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_requests: Option<u32>,
    /// Error rate (0..=1) at or above which an endpoint can be an outlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_error_rate: Option<f64>,
    /// How many times the rest of the pool's error rate it must reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Largest share of the pool ejected at once, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<u32>,
    /// How long an ejection lasts (doubled for each one in a row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ejection_ms: Option<u64>,
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
    /// Pools to try, in order: each step a pool's name or a split.
    #[serde(default)]
    pub chain: Vec<ChainStepSpec>,
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
    /// A request with an `Idempotency-Key` whose client goes away is
    /// finished and its answer stored for the retry (default true);
    /// `false` cancels it at once, as a request without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_on_client_gone: Option<bool>,
    /// A streamed answer's first content must come this soon (a pool's
    /// own setting wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_timeout_ms: Option<u64>,
    /// A stream silent this long after its first token is cut (a pool's
    /// own setting wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout_ms: Option<u64>,
    /// Hedged requests (READ and DRAFT only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeSpec>,
    /// The share of recent requests that retries and hedges may add.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<RetryBudgetSpec>,
    /// What a request gets when no pool of the chain can take it:
    /// `no_backend` (the default) or `park` (safe mode: stored as a task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_all_down: Option<OnAllDown>,
    /// Bounds of parked tasks (with `on_all_down: park`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<ParkSpec>,
    /// The response cache (off without it; see `router_policy::cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
}

/// One step of a route's chain as written: a pool's name (`fast`), or a
/// split (`{split: [{pool: new, weight: 10}, {pool: old, weight: 90}],
/// sticky: tenant}`). A name reads and writes as a plain string, so a
/// chain of names is the same document it always was.
#[derive(Debug, Clone, PartialEq)]
pub enum ChainStepSpec {
    /// A pool, by name.
    Pool(String),
    /// A weighted split ([`crate::split`]).
    Split(SplitSpec),
}

impl From<&str> for ChainStepSpec {
    fn from(name: &str) -> Self {
        Self::Pool(name.to_owned())
    }
}

impl Serialize for ChainStepSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Pool(name) => s.serialize_str(name),
            Self::Split(split) => split.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ChainStepSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Step;
        impl<'de> serde::de::Visitor<'de> for Step {
            type Value = ChainStepSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a pool name (quoted if YAML reads it as a number or a boolean) or a split ({split: [{pool, weight}, ...]})",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ChainStepSpec::Pool(v.to_owned()))
            }
            // A pool named `7` in YAML is a number to `deserialize_any`
            // (a plain integer's text is its value's; other numbers and
            // booleans must be quoted).
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(ChainStepSpec::Pool(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(ChainStepSpec::Pool(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                // The map's own deserializer: unknown fields and bad
                // values keep their paths.
                SplitSpec::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ChainStepSpec::Split)
            }
        }
        d.deserialize_any(Step)
    }
}

/// A split as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSpec {
    /// The sides, at least two (a ramp's new side first).
    pub split: Vec<SplitSideSpec>,
    /// Whose requests stay on one side: absent (each request, by its
    /// `Idempotency-Key` or request id), `tenant`, or `header:NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticky: Option<String>,
    /// Move the first (new) side up step by step while it behaves
    /// ([`crate::ramp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp: Option<RampSpec>,
}

/// A split's ramp as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RampSpec {
    /// The new side's weights, strictly increasing, each in 1..=100.
    pub steps: Vec<u32>,
    /// How long a step lasts at least, seconds.
    pub step_s: u64,
    /// What a step must show to advance.
    #[serde(default)]
    pub guard: RampGuardSpec,
}

/// A ramp's guard as written; every field optional.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RampGuardSpec {
    /// How far the new side's error rate may exceed the old side's, in
    /// [0, 1] (default 0.01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_error_rate: Option<f64>,
    /// The new side's p95 over the old side's, at most (default 1.5;
    /// 0: latency not guarded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_p95_ratio: Option<f64>,
    /// Requests a side needs in a step before it is judged (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_requests: Option<u64>,
}

/// One side of a split as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSideSpec {
    /// The pool.
    pub pool: String,
    /// Its weight: a non-negative integer (the share is weight / sum).
    pub weight: u32,
}

/// A route's response cache as written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSpec {
    /// How long an entry is kept, in seconds (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Largest answer kept, in bytes (default 1 MiB, at most 16 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entry_bytes: Option<u64>,
    /// Whose entries are shared: `tenant` (the default), `route`, or
    /// `header:<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Cache sampled requests (`temperature` above 0, or absent) too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sampled: bool,
    /// Whether a hit counts against the tenant's request rate limit
    /// (default true; a hit never draws on the token rate, the
    /// concurrency cap or the budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_hits: Option<bool>,
}

/// What a route does when every pool of its chain is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnAllDown {
    /// `503 no_backend` at once.
    #[default]
    NoBackend,
    /// Park the request as a task (see `router_policy::park`).
    Park,
}

/// Parked tasks' bounds as written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParkSpec {
    /// How long a parked task waits before it expires (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Most live parked tasks of the route; past it, `no_backend`
    /// (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tasks: Option<u32>,
    /// Most bytes the route's live parked tasks hold (bodies, paths,
    /// headers); past it, `no_backend` (default 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// A route's hedging as written: `{after_ms: 300}` or `{after: p95}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HedgeSpec {
    /// Start the second attempt after this many milliseconds without a
    /// first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_ms: Option<u64>,
    /// Start it after the first pool's recent latency quantile (`p95`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<HedgeQuantile>,
    /// Where the second attempt goes (default `next_pool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<HedgeTarget>,
}

/// A latency quantile a hedge waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HedgeQuantile {
    /// The pool's p95 of recent answers.
    P95,
}

/// Where a hedge goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HedgeTarget {
    /// The next eligible pool of the chain.
    #[default]
    NextPool,
    /// Another endpoint of the same pool.
    SamePool,
}

/// A route's retry budget as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryBudgetSpec {
    /// Extra attempts per request, in (0, 1] (default 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Extra attempts always allowed per second (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_per_second: Option<u32>,
    /// How long requests and extra attempts count (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
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

impl PolicyDocument {
    /// Parses YAML or JSON. Shape errors (unknown fields, wrong types) come
    /// back with their field path, every one at once (see `shape`).
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        Self::parse_repairing(text).map_err(|(e, _)| e)
    }

    /// [`PolicyDocument::parse`]; on shape errors that are all unknown
    /// fields, also the document without them, for validation to report
    /// the rest in the same answer.
    pub(crate) fn parse_repairing(text: &str) -> Result<Self, (PolicyError, Option<Box<Self>>)> {
        let trimmed = text.trim_start();
        let first = if trimmed.starts_with('{') {
            let mut de = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut de)
                .map_err(|e| field_error(&e.path().to_string(), &e.inner().to_string()))
        } else {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de)
                .map_err(|e| field_error(&e.path().to_string(), &e.inner().to_string()))
        };
        first.map_err(|first| all_shape_errors(text, first))
    }
}
