//! `router-dialect`: translation between the LLM API dialects the router
//! speaks, as pure functions (no I/O, no clock, no async).
//!
//! Three dialects: OpenAI chat completions ([`openai`]), Anthropic
//! Messages ([`anthropic`]) and Gemini `generateContent` ([`gemini`]).
//! Every translation goes through a neutral model ([`model`]): a request is
//! parsed from its dialect into a [`Request`] and written out in another
//! one; answers ([`Answer`]) the same way; streams are translated event by
//! event as they flow ([`stream`]), never buffered whole. Usage is
//! normalized to four disjoint counts ([`Usage`]) so that a budget is
//! exact whatever the dialect, and the router's own errors are rendered in
//! the client's dialect ([`errors`]).
//!
//! # Nothing is dropped silently
//!
//! Each field of each dialect is either mapped, dropped on purpose (a
//! documented reason: it does not change the answer, or the target has no
//! reader for it), or reported: [`write_request`] fails with
//! [`DialectError::CannotCarry`], a typed list of [`Uncarried`] ("cannot
//! carry field X to dialect Y: why"), and [`uncarried`] gives the same list
//! without writing, so the router can skip a pool at decision time (and
//! say why) or answer 400 naming the field. `docs/dialects.md` lists every
//! field and its fate, each row backed by a test here.
//!
//! Fields a dialect's parser does not know are kept in [`Request::extra`]
//! (and [`Message::extra`], [`Part::Other`], [`Tool::Other`]) with the
//! dialect they came from: written back unchanged to the same dialect,
//! reported as uncarried to another.
//!
//! # Checking streams
//!
//! [`check`] holds the rules a client's stream must keep (one
//! `message_start`, blocks opened before their deltas and closed before
//! the next, one `message_stop`, ...) as functions over bytes; every
//! stream test and property test here runs the translated stream through
//! them, and the router's own tests can too.
//!
//! # Same dialect in and out
//!
//! The router passes a request whose dialect is the pool's through
//! without this crate (the body unchanged but for the model). Parsing and
//! writing back the same dialect is nevertheless faithful for the fields
//! the model holds and keeps unknown fields, and the tests check it.

#![forbid(unsafe_code)]

pub mod anthropic;
pub mod check;
mod error;
pub mod errors;
pub mod gemini;
mod json;
pub mod model;
pub mod openai;
pub mod sse;
pub mod stream;
mod usage;

use serde_json::{Map, Value};

pub use error::{DialectError, Uncarried};
pub use model::{
    Answer, ImageSource, MaxTokensField, Message, Part, Reasoning, Request, ResponseFormat, Role,
    StopReason, TextBlock, Tool, ToolChoice,
};
pub use usage::Usage;

/// An LLM API dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Dialect {
    /// OpenAI chat completions (and every OpenAI-compatible server).
    #[default]
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Gemini `generateContent`.
    Gemini,
}

impl Dialect {
    /// Its name in logs, explain and errors.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Gemini => "gemini",
        }
    }

    /// The request fields of this dialect dropped on purpose when written
    /// to another one.
    pub const fn dropped_elsewhere(self) -> &'static [&'static str] {
        match self {
            Self::OpenAi => openai::DROPPED_ELSEWHERE,
            Self::Anthropic => anthropic::DROPPED_ELSEWHERE,
            Self::Gemini => gemini::DROPPED_ELSEWHERE,
        }
    }
}

/// What the writer of a request needs besides the request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// The model to ask for (the pool's), in place of the request's.
    pub model: Option<String>,
    /// The token limit to send to Anthropic when the request has none
    /// (Anthropic requires one). Without it such a request is refused.
    pub default_max_tokens: Option<u64>,
    /// Which OpenAI field carries the token limit; by default the one
    /// the client used (OpenAI to OpenAI), else `max_tokens`.
    pub openai_max_tokens_field: Option<MaxTokensField>,
}

/// Parses a request body of `dialect`.
pub fn parse_request(dialect: Dialect, body: &[u8]) -> Result<Request, DialectError> {
    match dialect {
        Dialect::OpenAi => openai::parse_request(body),
        Dialect::Anthropic => anthropic::parse_request(body),
        Dialect::Gemini => gemini::parse_request(body),
    }
}

fn write_value(
    req: &Request,
    to: Dialect,
    opts: &WriteOptions,
    lost: &mut Vec<Uncarried>,
) -> Value {
    match to {
        Dialect::OpenAi => openai::write_request(req, opts, lost),
        Dialect::Anthropic => anthropic::write_request(req, opts, lost),
        Dialect::Gemini => gemini::write_request(req, opts, lost),
    }
}

/// Writes `req` as a request body of dialect `to`, or refuses it with the
/// list of fields `to` cannot carry.
pub fn write_request(
    req: &Request,
    to: Dialect,
    opts: &WriteOptions,
) -> Result<Vec<u8>, DialectError> {
    let mut lost = Vec::new();
    let v = write_value(req, to, opts, &mut lost);
    if !lost.is_empty() {
        return Err(DialectError::CannotCarry(lost));
    }
    Ok(serde_json::to_vec(&v)?)
}

/// The fields of `req` that dialect `to` cannot carry (empty when it can
/// be written): what a decision needs to skip a pool.
pub fn uncarried(req: &Request, to: Dialect, opts: &WriteOptions) -> Vec<Uncarried> {
    let mut lost = Vec::new();
    write_value(req, to, opts, &mut lost);
    lost
}

/// Parses an unstreamed answer body of `dialect`.
pub fn parse_answer(dialect: Dialect, body: &[u8]) -> Result<Answer, DialectError> {
    match dialect {
        Dialect::OpenAi => openai::parse_answer(body),
        Dialect::Anthropic => anthropic::parse_answer(body),
        Dialect::Gemini => gemini::parse_answer(body),
    }
}

/// Writes an answer in dialect `to`. `created` (Unix seconds) is OpenAI's
/// `created` field: this crate has no clock.
pub fn write_answer(answer: &Answer, to: Dialect, created: u64) -> Result<Vec<u8>, DialectError> {
    let v = match to {
        Dialect::OpenAi => openai::write_answer(answer, created)?,
        Dialect::Anthropic => anthropic::write_answer(answer)?,
        Dialect::Gemini => gemini::write_answer(answer)?,
    };
    Ok(serde_json::to_vec(&v)?)
}

/// Carries the unknown fields `extra` of a request (or of one of its
/// messages, at `at`) into `out` when writing the dialect they came from;
/// otherwise reports each, except those its dialect drops on purpose.
pub(crate) fn carry_extra(
    req: &Request,
    extra: &Map<String, Value>,
    at: &str,
    to: Dialect,
    out: &mut Map<String, Value>,
    lost: &mut Vec<Uncarried>,
) {
    if req.origin == to {
        for (k, v) in extra {
            out.insert(k.clone(), v.clone());
        }
        return;
    }
    for k in extra.keys() {
        if at.is_empty() && req.origin.dropped_elsewhere().contains(&k.as_str()) {
            continue;
        }
        lost.push(Uncarried::new(
            json::path(at, k),
            to,
            "a field of the client's dialect with no equivalent in the pool's",
        ));
    }
}

/// The name of a neutral request field in the client's dialect (for the
/// paths of uncarried fields).
pub(crate) fn field_name(origin: Dialect, neutral: &'static str) -> &'static str {
    match (origin, neutral) {
        (Dialect::Gemini, "seed") => "generationConfig.seed",
        (Dialect::Gemini, "presence_penalty") => "generationConfig.presencePenalty",
        (Dialect::Gemini, "frequency_penalty") => "generationConfig.frequencyPenalty",
        (Dialect::Gemini, "response_format") => "generationConfig.responseMimeType",
        (Dialect::Gemini, "reasoning_effort") => "generationConfig.thinkingConfig.thinkingLevel",
        (Dialect::Anthropic, "parallel_tool_calls") => "tool_choice.disable_parallel_tool_use",
        (_, n) => n,
    }
}
