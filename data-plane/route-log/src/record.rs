//! The records: one request's routing story ([`RouteRecord`]) and its
//! parts, the fields in the order the line writes them.
//!
//! Fields are cheap to fill on the request path: shared names
//! (`Arc<str>`), outcomes as [`Outcome`], and a timestamp formatted only
//! when the line is written. The `Serialize` derives are the reference the
//! hand-written encoder (`encode.rs`) is checked against, byte for byte.

use std::sync::Arc;
use std::time::SystemTime;

use router_policy::{Outcome, Risk};
use serde::Serialize;

/// A closed set of names written as JSON strings: the enum, its
/// `as_str`, its `ALL` and a `Serialize` that writes the name.
macro_rules! named {
    ($(#[$meta:meta])* $name:ident {
        $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The name the line writes.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

named! {
    /// An attempt's part in a hedged request: the first attempt
    /// (`primary`) or the second (`hedge`), and how it ended.
    HedgeRole {
        /// The first attempt answered first.
        PrimaryWon => "primary_won",
        /// The first attempt failed.
        PrimaryFailed => "primary_failed",
        /// The first attempt was cancelled: the hedge answered first.
        PrimaryCancelled => "primary_cancelled",
        /// The hedge answered first.
        HedgeWon => "hedge_won",
        /// The hedge failed.
        HedgeFailed => "hedge_failed",
        /// The hedge was cancelled: the first attempt answered first.
        HedgeCancelled => "hedge_cancelled",
    }
}

named! {
    /// Why a walk stopped early, when a limit stopped it.
    Stopped {
        /// The route's retry budget had no room for another attempt (a
        /// retry or a hedge).
        RetryBudgetExhausted => "retry_budget_exhausted",
    }
}

named! {
    /// What a request's `Idempotency-Key` did.
    IdempotencyRole {
        /// The first request with the key: it ran.
        Lead => "lead",
        /// The first, with the shared store down: it ran, claimed in this
        /// process only.
        LeadLocal => "lead_local",
        /// Waited for the first request and passed its answer on.
        Join => "join",
        /// Replayed the stored answer of a finished request.
        Replay => "replay",
    }
}

/// One attempt to send the request to an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AttemptRecord {
    /// Pool.
    pub pool: Arc<str>,
    /// Endpoint address.
    pub endpoint: Arc<str>,
    /// How the attempt ended.
    pub outcome: Outcome,
    /// Upstream HTTP status, if one came back.
    pub status: Option<u16>,
    /// Time to the answer's first byte (or to the failure), after the queue.
    pub latency_ms: f64,
    /// Time spent in the pool's queue before this attempt was sent.
    pub queue_wait_ms: f64,
    /// The attempt's timeout, when it had one.
    pub timeout_ms: Option<u64>,
    /// Input tokens the answer's `usage` reported (logged per request).
    #[serde(skip)]
    pub tokens_in: Option<u64>,
    /// Output tokens the answer's `usage` reported (logged per request).
    #[serde(skip)]
    pub tokens_out: Option<u64>,
    /// The part of `tokens_in` read from a prompt cache (logged per
    /// request).
    #[serde(skip)]
    pub cache_read_tokens: Option<u64>,
    /// The part of `tokens_in` written to a prompt cache (logged per
    /// request).
    #[serde(skip)]
    pub cache_write_tokens: Option<u64>,
    /// Cost from `usage` and the pool's prices (logged per request).
    #[serde(skip)]
    pub cost_usd: Option<f64>,
    /// The model the answer says it came from.
    #[serde(skip)]
    pub response_model: Option<String>,
    /// What the backend generated for this attempt, for the tenant's
    /// settlement (`router_policy::tenant::Charge`).
    #[serde(skip)]
    pub generated: router_policy::tenant::Charge,
    /// Its part in a hedged request (`primary_won`, `hedge_cancelled`...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeRole>,
    /// How session affinity placed it, when it did: `session_kept`,
    /// `session_placed`, `session_spilled`
    /// (`router_policy::affinity::SessionPlacement`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<&'static str>,
    /// How longest-prefix affinity placed it, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixRecord>,
    /// The dialect the attempt spoke to its pool, for a request whose
    /// client or pools speak another than OpenAI chat (`openai`,
    /// `anthropic`, `gemini`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialect: Option<&'static str>,
    /// The backend's own `x-request-id`, when its answer carried one
    /// (a provider's id, for its support), cut to
    /// [`UPSTREAM_REQUEST_ID_MAX`] bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_request_id: Option<Box<str>>,
}

/// How longest-prefix affinity placed an attempt: the prompt's blocks, the
/// blocks the chosen endpoint likely held and its expected time to first
/// token, and the same for the runner-up
/// (`router_policy::engine_aware::pick`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrefixRecord {
    /// `prefix_matched`, `prefix_home` or `prefix_scored`.
    pub placement: &'static str,
    /// Whole blocks in the prompt.
    pub blocks: usize,
    /// Leading blocks the chosen endpoint likely held.
    pub matched: usize,
    /// Its expected time to first token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// The best other endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_up: Option<Arc<str>>,
    /// Leading blocks it likely held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_up_matched: Option<usize>,
    /// Its expected time to first token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_up_ttft_ms: Option<f64>,
}

/// The longest backend request id kept (in the route log and the
/// client's `x-upstream-request-id`): longer ones are cut to it.
pub const UPSTREAM_REQUEST_ID_MAX: usize = 128;

/// What a streamed (server-sent events) answer told of itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StreamRecord {
    /// Time to the first token (after the queue).
    pub ttft_ms: f64,
    /// Time per output token, when two tokens or more came.
    pub tpot_ms: Option<f64>,
    /// Content events passed on.
    pub content_events: u64,
    /// The stream's usage chunk; `null` when the backend sent none.
    pub usage: Option<UsageRecord>,
}

/// A stream's reported usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct UsageRecord {
    /// Prompt tokens.
    pub input_tokens: Option<u64>,
    /// Completion tokens.
    pub output_tokens: Option<u64>,
}

/// A cache count that is absent or zero is left out of the line.
fn no_tokens(n: &Option<u64>) -> bool {
    n.is_none_or(|n| n == 0)
}

/// A wall-clock time, written as RFC 3339 with milliseconds (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timestamp(pub SystemTime);

impl Default for Timestamp {
    fn default() -> Self {
        Self(SystemTime::UNIX_EPOCH)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(self.0))
    }
}

fn serialize_method<S: serde::Serializer>(m: &http::Method, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(m.as_str())
}

/// One thing that happened on the walk along the chain
/// ([`router_policy::walk::Note`]), with its pool's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WalkNote {
    /// What happened (`split`: a split of the chain chose this pool;
    /// `gated`: the policy's decision passed the pool over before the
    /// walk; then the walk's `failed`, `shed`,
    /// `retried_in_pool`, `unavailable`, `skipped_for_time`,
    /// `passed_over_marked`, `tried_as_hedge`, `stopped`).
    pub note: &'static str,
    /// The pool, when the note is about one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<Arc<str>>,
    /// The attempt's outcome (or the failure the route does not retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// Why (the pool's unavailability, the skip, the stop).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<&'static str>,
    /// `split`: the chosen side's weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// `split`: what the choice was keyed on (`request_id`,
    /// `idempotency_key`, `tenant`, `header`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<&'static str>,
}

impl WalkNote {
    /// `pool` passed over by the policy's decision, for `why` (the gate's
    /// label, `router_policy::decide::Gated::label`).
    pub fn gated(pool: Arc<str>, why: &'static str) -> Self {
        Self {
            note: "gated",
            pool: Some(pool),
            outcome: None,
            why: Some(why),
            weight: None,
            key: None,
        }
    }

    /// A split of the chain chose `pool` (its side's `weight`), keyed on
    /// `key` (`router_policy::split::KeyKind::label`).
    pub fn split(pool: Arc<str>, weight: u32, key: &'static str) -> Self {
        Self {
            note: "split",
            pool: Some(pool),
            outcome: None,
            why: None,
            weight: Some(weight),
            key: Some(key),
        }
    }

    /// `note` with its pool's name from `pool` (by chain position).
    pub fn of(note: &router_policy::walk::Note, pool: impl Fn(usize) -> Option<Arc<str>>) -> Self {
        let f = note.fields();
        Self {
            note: f.note,
            pool: f.at.and_then(pool),
            outcome: f.outcome,
            why: f.why,
            weight: None,
            key: None,
        }
    }
}

/// One request's routing story.
///
/// Written as one JSON line by [`RouteRecord::write_json`] (by hand, field
/// by field, in the order below: the same bytes as `serde_json` would
/// write from the `Serialize` derive, which the tests check, and a pinned
/// line guards the format). Hand-written because it was measured: with
/// `serde_json::to_writer` the writer thread spent 11.6k instructions per
/// line instead of 3.2k (`bench/callgrind.sh`), and on two cores that
/// thread shares the CPU with the workers: the wrk yardstick lost 6% of
/// its throughput (docs/benchmarks.md, "Data-plane reshape"). Fields are
/// cheap to fill on the request path: shared names (`Arc<str>`), outcomes
/// as [`Outcome`], and a timestamp formatted only when the line is written.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RouteRecord {
    /// Request id (client's `Idempotency-Key`/`X-Request-Id`, or generated).
    pub request_id: String,
    /// When the request arrived (RFC 3339, UTC).
    pub offered_at: Timestamp,
    /// HTTP method.
    #[serde(serialize_with = "serialize_method")]
    pub method: http::Method,
    /// Request path.
    pub path: String,
    /// Route that matched.
    pub route: Option<String>,
    /// First pool chosen.
    pub first_route: Option<Arc<str>>,
    /// Outcome of the first attempt (or the shed reason).
    pub first_outcome: Option<Outcome>,
    /// Outcome of a fallback attempt, when there was one.
    pub fallback_outcome: Option<Outcome>,
    /// Pool that gave the final answer.
    pub final_route: Option<Arc<str>>,
    /// Final outcome: `ok`, an upstream failure, or the error type.
    pub outcome: Outcome,
    /// HTTP status sent to the client.
    pub status: u16,
    /// Time from arrival to the end of the answer.
    pub elapsed_ms: f64,
    /// The request's deadline, when it had one.
    pub deadline_ms: Option<u64>,
    /// Time spent waiting in a queue.
    pub queue_wait_ms: f64,
    /// Every attempt, in order.
    pub attempts: Vec<AttemptRecord>,
    /// Risk class (`READ`, `DRAFT`, `SEND`, `DESTRUCTIVE`).
    pub risk: Option<Risk>,
    /// Why this route and pool were chosen.
    pub reason: String,
    /// What happened on the walk along the chain, typed (the same notes
    /// `reason` tells in prose); absent when nothing did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub walk: Vec<WalkNote>,
    /// The request's `model`, when it had one.
    pub model: Option<Arc<str>>,
    /// Input (prompt) tokens reported by the backend, cached ones
    /// included (`router_policy::usage`).
    pub tokens_in: Option<u64>,
    /// Output tokens reported by the backend.
    pub tokens_out: Option<u64>,
    /// The part of `tokens_in` read from a prompt cache (written when the
    /// backend reported any).
    #[serde(skip_serializing_if = "no_tokens")]
    pub cache_read_tokens: Option<u64>,
    /// The part of `tokens_in` written to a prompt cache (written when
    /// the backend reported any).
    #[serde(skip_serializing_if = "no_tokens")]
    pub cache_write_tokens: Option<u64>,
    /// Estimated cost.
    pub cost_usd: Option<f64>,
    /// A streamed answer's timing and usage (streams only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamRecord>,
    /// Why the walk stopped early, when a limit stopped it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Stopped>,
    /// Trace id, when tracing is on.
    pub trace_id: Option<String>,
    /// What the `Idempotency-Key` did; absent without a key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<IdempotencyRole>,
    /// What the route's response cache did: `hit`, `miss`, `bypass` or
    /// `refresh`; absent on a route without a cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<&'static str>,
    /// On a cache hit: what the answer cost when it was generated (its
    /// tokens are `tokens_in` and `tokens_out`; this request's
    /// `cost_usd` is 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_saved_usd: Option<f64>,
    /// The client's dialect when it is not OpenAI's (`anthropic`: the
    /// request was translated to the pools' and its answer back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialect: Option<&'static str>,
    /// The tenant the request's key named (tenancy on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Arc<str>>,
    /// The parked task this request parked, or the task this request is a
    /// run of (`on_all_down: park`): the link between the two lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parked_task: Option<String>,
    /// Config version that routed the request.
    pub config_version: Arc<str>,
}
