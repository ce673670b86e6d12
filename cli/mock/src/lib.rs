//! `router-mock`: mock model endpoints, in-process HTTP/1.1 servers that
//! stand in for an OpenAI-compatible model server (Ollama, vLLM, TGI, a
//! cloud API).
//!
//! One implementation serves three users: `routerctl mock` (a mock by hand
//! or in the compose files), `routerctl drill` and `routerctl up` (their
//! built-in backends) and the cross-program tests (`router-tests`). It is a
//! crate of its own so that the tests and the drill exercise the very mock
//! an operator runs, and so that it does not drag the command line along.
//!
//! A [`MockModel`] listens on a real TCP socket, so the router under test talks
//! to it exactly as it would talk to a real backend. What it simulates:
//!
//! - **Service time**: every request takes [`MockConfig::latency`] (measured
//!   with `tokio::time::sleep`, so tests may pause or scale time).
//! - **Saturation**: with [`MockConfig::max_concurrency`] set, requests past the
//!   cap either wait for a slot ([`OverCap::Queue`], like a saturated vLLM) or
//!   are answered `429` at once with `Retry-After: 1` ([`OverCap::Reject429`]).
//!   A slot is held for the whole answer, including a streamed one.
//! - **Answer shapes** ([`Behavior`]): chat-completion JSON, an SSE token
//!   stream with one flushed frame per chunk, a chat server that answers
//!   the request it reads (text, tool calls, streamed or not), a request that never gets an
//!   answer, an error status, a broken JSON body, or a redirect. The behavior
//!   and the latency can be switched while the server runs.
//! - **A whole engine** ([`Behavior::Engine`]): a simulated vLLM-like engine
//!   ([`engine`]) with continuous batching, a paged KV cache with prefix
//!   caching, and vLLM's `/metrics`, so that engine-aware balancing can be
//!   tested against answers whose timing depends on load and cache state;
//!   [`workload`] generates the traffic for it (multi-turn sessions, Poisson
//!   arrivals) and measures an engine's capacity. `docs/simulator.md` has
//!   the model and its parameters.
//! - **Clients going away**: when the client disconnects mid-answer, hyper
//!   drops the handler or the response body; a drop guard then counts the
//!   request as cancelled and releases its slot.
//!
//! Every request except the health pages and the fixed pages is recorded
//! ([`MockModel::requests`]) and counted ([`MockModel::stats`]) before it is
//! served; a fixed page ([`MockModel::set_page`]) is counted apart
//! ([`MockModel::page_hits`]), and so are health pages
//! ([`MockModel::health_hits`]). Every response carries
//! `x-mock-name: <name>` so a test can tell which backend answered.
//! The health pages (`GET /health` as vLLM and TGI serve it, `/api/tags`
//! as Ollama does, `/v1/models` as OpenAI-compatible servers do) answer as
//! [`HealthMode`] says, whatever the behavior: `200` by default, a status,
//! or never (a server that accepts connections and hangs).
//!
//! [`MockModel::stop`] closes the listener and every live connection, so a
//! stopped mock refuses connections like a backend that went away.
//!
//! # Modules
//!
//! - this file: the public vocabulary ([`Behavior`], [`OverCap`],
//!   [`MockConfig`], [`MockStats`], [`ReceivedRequest`], [`Generation`]);
//! - `server`: [`MockModel`], the handle, and the accept loop that owns the
//!   connections;
//! - `answer`: one request from head to response: health and fixed pages,
//!   recording, the concurrency cap, then each [`Behavior`]'s answer
//!   (including the SSE events);
//! - `body`: the response body that produces its frames one by one, each
//!   after its own delay (what makes SSE stream) or as a simulated engine
//!   produces tokens, and the drop guard that settles a request's counters
//!   however it ends;
//! - [`engine`]: the simulated engine, a pure state machine on a virtual
//!   clock;
//! - `engine_http`: the task that runs it in real time behind the HTTP
//!   endpoints, the prompt-to-token-ids mapping ([`prompt_token_ids`])
//!   and the `/metrics` page;
//! - [`workload`]: the seeded workload generator and the capacity measures.
//! - `tls` (feature `tls`): an endpoint behind TLS with a certificate made
//!   on start, for tests of HTTPS upstreams.
//!
//! The behaviour tests, which use only this public API over real sockets,
//! are in `tests/behaviors.rs` and, for the engine, `tests/engine.rs`.

#![forbid(unsafe_code)]

mod answer;
mod body;
pub mod engine;
mod engine_http;
pub mod fixed;
pub mod gemini;
mod prompt_cache;
pub mod quota;
mod server;
#[cfg(feature = "tls")]
pub mod tls;
pub mod workload;

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::time::Instant;

pub use engine_http::prompt_token_ids;
pub use quota::{QuotaCounts, QuotaMock, QuotaStyle};
pub use server::MockModel;

/// Header echoed on every response with the mock's [`MockConfig::name`].
pub const MOCK_NAME_HEADER: &str = "x-mock-name";

/// How a mock answers a (non-health) request.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Behavior {
    /// OpenAI chat-completion JSON after `latency`.
    #[default]
    Json,
    /// Chat-completion JSON whose message content is this text (e.g. a
    /// JSON document, or not, for structured-output tests).
    Content(String),
    /// `text/event-stream`: `chunks` SSE `data: {...}` events, `interval`
    /// apart (the first after `latency`), then `data: [DONE]`.
    ///
    /// The response head is sent at once; each event is its own body frame.
    Sse {
        /// Number of `chat.completion.chunk` events before `[DONE]`.
        chunks: usize,
        /// Pause between two consecutive events.
        interval: Duration,
    },
    /// A scripted `text/event-stream` answer, as an engine streams: the
    /// head and a role-only chunk at once, content chunks from
    /// `first_token` on, then the script's ending (see [`StreamScript`]).
    /// `latency` does not apply.
    Stream(StreamScript),
    /// Accept the request and never answer (until the client goes away).
    Hang,
    /// Answer this status with an OpenAI-style JSON error body after
    /// `latency` (e.g. 500, 503). A 429 also carries `Retry-After: 1`.
    /// A code outside 100..=999 is answered as 500. On Anthropic's
    /// `/v1/messages` path the body is in Anthropic's error shape
    /// (`{"type": "error", "error": {"type", "message"}}`, `529`
    /// `overloaded_error`); on a Gemini model call in Gemini's
    /// (`{"error": {"code", "message", "status"}}`).
    Status(u16),
    /// A 429 rate-limit error after `latency`, with this `Retry-After`
    /// value as given (a provider at its quota saying when to come back,
    /// or a hostile one: `18446744073709551615`). A value that is not a
    /// valid header value is answered as 500.
    RateLimited(String),
    /// 200 with content-type `application/json` but a body that is not valid
    /// JSON, after `latency`.
    MalformedJson,
    /// Chat-completion JSON (as [`Behavior::Json`]) whose `usage` value is
    /// this text, verbatim: a backend reporting usage the router cannot
    /// read or must not believe (`{"prompt_tokens":-5}`, `NaN`, `1e308`,
    /// `"12"`, twenty digits).
    JsonUsage(String),
    /// A simulated vLLM-like engine answers (see [`engine`]): chat
    /// completions, streamed or not, timed by the engine's continuous
    /// batching, prefill and decode steps (`latency` does not apply), and
    /// `GET /metrics` with vLLM's metric names, labelled
    /// `model_name="<mock name>"` (unless a page is set for `/metrics`).
    Engine(engine::EngineConfig),
    /// An OpenAI-compatible chat server that reads the request (after
    /// `latency`): a JSON answer, or a stream when the request says
    /// `stream: true` (with a usage chunk when it asks,
    /// `stream_options.include_usage`). It answers `echo: TEXT`, TEXT the
    /// last user message's text; when the request offers `tools` and its
    /// last message is not a tool's result, it calls the first tool with
    /// the arguments `{"text": TEXT}` (`finish_reason: tool_calls`); after
    /// a tool's result it answers `tool said: RESULT`. Usage: the body's
    /// bytes / 4 as prompt tokens, one completion token per content piece
    /// (text words, tool call pieces).
    Chat,
    /// [`Behavior::Chat`] in Anthropic's Messages dialect, written from its
    /// public API reference: a `message` JSON answer, or its event stream
    /// (`message_start`, each content block started, its deltas, stopped,
    /// `message_delta` with the stop reason and usage, `message_stop`)
    /// when the request says `stream: true`. The same replies: `echo:
    /// TEXT`, a `tool_use` of the first tool with `{"text": TEXT}`, `tool
    /// said: RESULT` after a `tool_result`. Usage: the body's bytes / 4 as
    /// `input_tokens`, one output token per piece.
    Anthropic,
    /// [`Behavior::Chat`] in Gemini's `generateContent` dialect, written
    /// from its public API reference (see [`gemini`]): on
    /// `/v1beta/models/{model}:generateContent` a `GenerateContentResponse`,
    /// on `:streamGenerateContent?alt=sse` its SSE chunks; the same
    /// replies (a `functionCall` with a `thoughtSignature`, which a later
    /// turn must send back), usage with cached and thought tokens.
    Gemini,
    /// 302 redirect with `Location` set to the given URL, after `latency`.
    /// A URL that is not a valid header value is answered as 500.
    Redirect(String),
}

/// How the health pages answer ([`MockModel::set_health`]).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum HealthMode {
    /// `200` with a small JSON body.
    #[default]
    Ok,
    /// This status (a code outside 100..=999 is answered as 500).
    Status(u16),
    /// Never answer (until the client goes away).
    Hang,
    /// `200` with `Authorization: Bearer <this key>`, else `401`, as a
    /// cloud API's `/v1/models` does.
    RequiresKey(String),
}

/// The paths served as health pages.
pub const HEALTH_PATHS: [&str; 3] = ["/health", "/api/tags", "/v1/models"];

/// A scripted stream ([`Behavior::Stream`]): what a backend's stream can
/// do to a router (delay its first token, fail inside a 200, stall, send
/// usage or not), deterministically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamScript {
    /// Time from the head to the first content chunk.
    pub first_token: Duration,
    /// Every `one_in`-th request (by the mock's count of requests) waits
    /// this long for its first token instead (a heavy tail); `None`: none.
    pub tail: Option<(u32, Duration)>,
    /// Content chunks (one token each) before the ending.
    pub chunks: usize,
    /// Time between two content chunks.
    pub interval: Duration,
    /// What comes after the content chunks.
    pub ending: StreamEnding,
    /// When a usage chunk is sent before `[DONE]`.
    pub usage: UsageMode,
    /// The usage chunk's `usage` value, verbatim, instead of the counts
    /// (usage the router cannot read: `{"completion_tokens":-1}`).
    pub usage_text: Option<String>,
}

impl Default for StreamScript {
    fn default() -> Self {
        Self {
            first_token: Duration::ZERO,
            tail: None,
            chunks: 3,
            interval: Duration::from_millis(1),
            ending: StreamEnding::Done,
            usage: UsageMode::WhenAsked,
            usage_text: None,
        }
    }
}

/// How a scripted stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StreamEnding {
    /// The usage chunk (per [`UsageMode`]), then `data: [DONE]`: a
    /// complete answer.
    #[default]
    Done,
    /// An `event: error` with an error object (as vLLM and TGI send when
    /// generation fails after the head).
    Error,
    /// A `data:` line that is not JSON.
    Malformed,
    /// Nothing more, ever (until the client goes away).
    Stall,
}

/// When a scripted stream reports its usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UsageMode {
    /// Never (an engine without `stream_options` support).
    Never,
    /// When the request asks (`stream_options.include_usage: true`), as
    /// OpenAI and vLLM do.
    #[default]
    WhenAsked,
    /// Always.
    Always,
}

/// What happens to a request that arrives while `max_concurrency` requests
/// are being served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OverCap {
    /// Wait for a slot, like a saturated vLLM queueing requests.
    #[default]
    Queue,
    /// Answer `429` at once with `Retry-After: 1`.
    Reject429,
}

/// Configuration of a [`MockModel`].
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Name echoed in `x-mock-name` and in the `served_by` answer field.
    /// Must be a valid HTTP header value.
    pub name: String,
    /// Service time of each request (see [`Behavior`] for where it applies).
    pub latency: Duration,
    /// How many requests are served at once; `None` means no limit.
    pub max_concurrency: Option<usize>,
    /// What happens to requests past `max_concurrency`.
    pub over_cap: OverCap,
    /// How requests are answered.
    pub behavior: Behavior,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            name: "mock".to_owned(),
            latency: Duration::ZERO,
            max_concurrency: None,
            over_cap: OverCap::Queue,
            behavior: Behavior::Json,
        }
    }
}

/// Counters of a [`MockModel`], as returned by [`MockModel::stats`].
///
/// Health checks are not counted. Once the mock is idle,
/// `received == completed + cancelled + rejected_429`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MockStats {
    /// Requests received (their body fully read).
    pub received: u64,
    /// Requests whose full answer was produced.
    pub completed: u64,
    /// Requests whose client went away before the answer finished, including
    /// requests dropped while queued or hanging.
    pub cancelled: u64,
    /// Requests currently holding a slot (being served, not queued).
    pub in_flight: u64,
    /// Highest `in_flight` seen.
    pub max_in_flight: u64,
    /// Requests answered 429 because the concurrency cap was reached with
    /// [`OverCap::Reject429`] (a 429 from [`Behavior::Status`] counts as
    /// completed instead).
    pub rejected_429: u64,
    /// TCP connections accepted (a keep-alive client reuses them).
    pub connections: u64,
}

/// A request as the mock received it.
#[derive(Clone, Debug)]
pub struct ReceivedRequest {
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// Path and query, e.g. `/v1/chat/completions?x=1`.
    pub path: String,
    /// Request headers.
    pub headers: HeaderMap,
    /// The full request body.
    pub body: Bytes,
    /// When it arrived.
    pub received_at: Instant,
}

/// A request whose answer the mock produced in full: a generation paid for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The request's `X-Request-Id`, if it had one.
    pub request_id: Option<String>,
    /// When the last byte of the answer was produced.
    pub at: Instant,
}
