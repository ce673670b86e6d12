//! Streams translated as they flow: an incremental state machine fed the
//! upstream's bytes (split anywhere) or its parsed events, emitting the
//! client's dialect at once. Nothing is buffered whole.
//!
//! ```text
//! upstream bytes ─▶ SseParser ─▶ Decoder (upstream dialect) ─▶ Event ─▶ Encoder (client dialect) ─▶ client bytes
//! ```
//!
//! [`Event`] is the neutral stream: a start, text / thinking / tool-call
//! fragments, block boundaries where the upstream has them, usage
//! snapshots, the stop reason, the end, or a failure.
//!
//! # Decoders
//!
//! - **OpenAI chunks**: the first chunk is the start; `delta.content`,
//!   `delta.refusal` (text), `delta.reasoning_content` / `reasoning`
//!   (thinking) and `delta.tool_calls[]` are fragments; a tool call starts
//!   when its first delta with a name arrives (arguments before the name
//!   are held, bounded); `finish_reason` is the stop; a chunk's `usage` is a
//!   snapshot; `data: [DONE]` is the end. A stream that ends after a
//!   `finish_reason` without `[DONE]` is complete; before one, cut.
//! - **Anthropic events**: `message_start` (usage with input and cache
//!   counts), `content_block_start` / `_delta` / `_stop`,
//!   `message_delta` (stop reason; usage **cumulative**: it replaces, never
//!   adds), `message_stop`; `ping` is ignored; `citations_delta` is dropped
//!   on purpose (citations come only with documents, which are refused
//!   across dialects); a block type this crate does not know fails the
//!   stream rather than losing it.
//! - **Gemini SSE** (`streamGenerateContent?alt=sse`): every chunk is a
//!   `GenerateContentResponse`; its parts are fragments (a `functionCall`
//!   arrives whole: start, arguments and end at once), `usageMetadata` a
//!   snapshot, `finishReason` the stop. Gemini has no end marker: the end
//!   is the end of the bytes after a stop; without a stop it is a cut.
//!
//! # Encoders
//!
//! - **Anthropic events**, well-formed whatever the upstream did:
//!   `message_start` exactly once and first (held until the first
//!   fragment, so that usage the upstream gave up front is in it); each
//!   content block opened by `content_block_start` before its deltas and
//!   closed by `content_block_stop` before the next opens, indexes from 0
//!   without gaps; a text fragment opens a `text` block, a thinking
//!   fragment a `thinking` block, a tool call a `tool_use` block whose
//!   arguments are `input_json_delta`s; `message_delta` with the stop reason
//!   and the final usage (all four counts: Anthropic's SDKs read input and
//!   cache counts there too), then exactly one `message_stop`. Arguments
//!   for a tool call whose block is already closed (interleaved parallel
//!   calls, which no known upstream sends) cannot be written as
//!   Anthropic events: the stream fails with an error rather than corrupt
//!   the call.
//! - **OpenAI chunks**: a role chunk first; text as `content`, thinking as
//!   `reasoning_content` (Anthropic's signatures and redacted thinking have
//!   no OpenAI reader and are dropped on purpose); a tool call's first
//!   delta carries its `index`, `id`, `type` and name, later ones its
//!   argument fragments; one chunk with `finish_reason`; the usage chunk
//!   (`choices: []`) when the client asked for it
//!   ([`StreamOptions::include_usage`]); `data: [DONE]`.
//!
//! # Failures
//!
//! An upstream error event, data that is not JSON, an event over the size
//! limit, or the bytes ending before the stream's end become one
//! `event: error` in the client's dialect ([`crate::errors::stream_event`])
//! and nothing after it; [`StreamTranslator::fail`] does the same for the
//! router's own cuts (stall, deadline). An Anthropic upstream's
//! `overloaded_error` stays `overloaded_error` for an Anthropic client.
//!
//! # Bounds
//!
//! The SSE parser holds at most one event ([`StreamOptions::max_event_bytes`]);
//! tool calls per answer are capped at [`MAX_TOOL_CALLS`] (past it the
//! stream fails); held arguments of a nameless OpenAI tool call count
//! toward the event limit. Error messages passed on are cut to
//! [`MAX_MESSAGE_CHARS`] characters.

mod chunk;
mod decode;
mod encode;

mod collect;
pub use collect::collect_answer;
pub use decode::Decoder;
pub use encode::Encoder;

use crate::errors::ErrorKind;
use crate::sse::{SseFrame, SseParser, DEFAULT_MAX_EVENT_BYTES};
use crate::{Dialect, DialectError, StopReason, Usage};

/// Most tool calls in one streamed answer.
pub const MAX_TOOL_CALLS: usize = 1024;

/// Most characters of an upstream's error message passed on.
pub const MAX_MESSAGE_CHARS: usize = 200;

/// One neutral stream event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The answer began.
    Start {
        /// The upstream's id for it.
        id: String,
        /// The model answering.
        model: String,
    },
    /// A text fragment.
    Text(String),
    /// A reasoning fragment.
    Thinking(String),
    /// (A fragment of) the signature closing a thinking block.
    Signature(String),
    /// Anthropic's encrypted reasoning, whole.
    RedactedThinking(String),
    /// A tool call begins; `key` names it among the answer's calls.
    ToolStart {
        /// Its key (OpenAI's index, Anthropic's block index, Gemini's
        /// ordinal).
        key: u64,
        /// Its id.
        id: String,
        /// The tool's name.
        name: String,
    },
    /// A fragment of a tool call's arguments (JSON text).
    ToolArgs {
        /// The call's key.
        key: u64,
        /// The fragment.
        json: String,
    },
    /// The upstream closed its current content block.
    BlockEnd,
    /// Usage so far (a snapshot: totals, not increments).
    Usage(Usage),
    /// Why the model stopped.
    Stop {
        /// The reason.
        reason: StopReason,
        /// The stop sequence produced, when known.
        sequence: Option<String>,
    },
    /// The answer is complete.
    End,
    /// The stream failed.
    Failed(Failure),
}

/// Why a stream failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The kind (`stream_error`, `upstream_reset`, `malformed_json`, ...).
    pub kind: ErrorKind,
    /// The upstream said it is overloaded (retry elsewhere or later).
    pub overloaded: bool,
    /// What happened, for the client (at most [`MAX_MESSAGE_CHARS`]).
    pub message: String,
}

impl Failure {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let message: String = message.into();
        let message = if message.chars().count() > MAX_MESSAGE_CHARS {
            cut_message(&message)
        } else {
            message
        };
        Self {
            kind,
            overloaded: false,
            message,
        }
    }
}

/// `message`, cut to [`MAX_MESSAGE_CHARS`] characters.
pub(crate) fn cut_message(message: &str) -> String {
    message.chars().take(MAX_MESSAGE_CHARS).collect()
}

/// Options of a translated stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOptions {
    /// The answer's id when the upstream gives none (and the base of
    /// synthesized tool call ids).
    pub id: String,
    /// The model name the client sees, in place of the upstream's.
    pub model: Option<String>,
    /// OpenAI's `created` (Unix seconds: this crate has no clock).
    pub created: u64,
    /// An OpenAI client asked for the final usage chunk.
    pub include_usage: bool,
    /// The largest upstream event held.
    pub max_event_bytes: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            id: "msg_router".to_owned(),
            model: None,
            created: 0,
            include_usage: false,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
        }
    }
}

/// A whole answer written as a stream of dialect `to` (OpenAI or
/// Anthropic): for a client that asked for a stream from an upstream that
/// answered with one JSON body. The same encoder as a translated stream
/// writes it, so it keeps the same rules (one `message_start`, each block
/// opened and closed, `message_delta` with the usage, one
/// `message_stop`). An answer the client's dialect cannot carry (see
/// [`crate::write_answer`]) is refused.
pub fn answer_stream(
    answer: &crate::Answer,
    to: Dialect,
    opts: &StreamOptions,
) -> Result<Vec<u8>, DialectError> {
    // The same refusals as a whole answer (an image, arguments that are
    // not an object for Anthropic).
    crate::write_answer(answer, to, opts.created)?;
    let mut encoder = Encoder::new(to, opts)?;
    let mut out = Vec::new();
    let mut events = vec![
        Event::Start {
            id: answer.id.clone(),
            model: answer.model.clone(),
        },
        Event::Usage(answer.usage),
    ];
    for (key, part) in answer.content.iter().enumerate() {
        match part {
            crate::Part::Text { text, .. } => events.push(Event::Text(text.clone())),
            crate::Part::Thinking { text, signature } => {
                events.push(Event::Thinking(text.clone()));
                if let Some(s) = signature.as_ref().filter(|s| !s.is_empty()) {
                    events.push(Event::Signature(s.clone()));
                }
            }
            crate::Part::RedactedThinking { data } => {
                events.push(Event::RedactedThinking(data.clone()))
            }
            crate::Part::ToolUse {
                id, name, input, ..
            } => {
                let key = key as u64;
                events.push(Event::ToolStart {
                    key,
                    id: id.clone(),
                    name: name.clone(),
                });
                events.push(Event::ToolArgs {
                    key,
                    json: input.clone(),
                });
            }
            // Refused above for a dialect that cannot carry them.
            _ => {}
        }
        events.push(Event::BlockEnd);
    }
    events.push(Event::Stop {
        reason: answer.stop_reason,
        sequence: answer.stop_sequence.clone(),
    });
    events.push(Event::End);
    for ev in events {
        encoder.encode(ev, &mut out);
    }
    Ok(out)
}

/// Where a translated stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamState {
    /// Still flowing.
    Open,
    /// Ended well (the client got the end of the answer).
    Completed,
    /// Ended by a failure (the client got an error event).
    Failed,
}

/// A stream translator from one dialect to another.
#[derive(Debug)]
pub struct StreamTranslator {
    sse: SseParser,
    decoder: Decoder,
    encoder: Encoder,
    frames: Vec<SseFrame>,
    events: Vec<Event>,
    usage: Option<Usage>,
    state: StreamState,
}

impl StreamTranslator {
    /// Translates `from`'s stream to `to`'s (OpenAI or Anthropic: no client
    /// of this router streams Gemini).
    pub fn new(from: Dialect, to: Dialect, opts: StreamOptions) -> Result<Self, DialectError> {
        Ok(Self {
            sse: SseParser::new(opts.max_event_bytes),
            decoder: Decoder::new(from, &opts),
            encoder: Encoder::new(to, &opts)?,
            frames: Vec::new(),
            events: Vec::new(),
            usage: None,
            state: StreamState::Open,
        })
    }

    /// Where the stream is.
    pub fn state(&self) -> StreamState {
        self.state
    }

    /// The upstream's latest usage snapshot, normalized.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Feeds upstream bytes; the client's bytes are appended to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        if self.state != StreamState::Open {
            return;
        }
        let mut frames = std::mem::take(&mut self.frames);
        let parsed = self.sse.push(bytes, &mut frames);
        for f in frames.drain(..) {
            self.decoder.decode(&f, &mut self.events);
            self.flush(out);
        }
        self.frames = frames;
        if let Err(e) = parsed {
            let kind = match e {
                DialectError::EventTooLarge { .. } => ErrorKind::StreamError,
                _ => ErrorKind::MalformedJson,
            };
            self.events
                .push(Event::Failed(Failure::new(kind, e.to_string())));
            self.flush(out);
        }
    }

    /// Feeds one upstream event already parsed.
    pub fn feed_frame(&mut self, frame: &SseFrame, out: &mut Vec<u8>) {
        if self.state != StreamState::Open {
            return;
        }
        self.decoder.decode(frame, &mut self.events);
        self.flush(out);
    }

    /// The upstream's bytes ended: completes the answer, or fails it when
    /// the upstream had not finished.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.state != StreamState::Open {
            return;
        }
        let cut = self.sse.has_partial();
        self.decoder.finish(cut, &mut self.events);
        self.flush(out);
    }

    /// The router ends the stream with a failure of its own (a stall, the
    /// deadline): one error event in the client's dialect.
    pub fn fail(&mut self, kind: ErrorKind, message: &str, out: &mut Vec<u8>) {
        if self.state != StreamState::Open {
            return;
        }
        self.events.push(Event::Failed(Failure::new(kind, message)));
        self.flush(out);
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        for ev in self.events.drain(..) {
            if self.state != StreamState::Open {
                break;
            }
            match &ev {
                Event::Usage(u) => self.usage = Some(*u),
                Event::End => self.state = StreamState::Completed,
                Event::Failed(_) => self.state = StreamState::Failed,
                _ => {}
            }
            self.encoder.encode(ev, out);
            if self.encoder.failed() && self.state == StreamState::Open {
                self.state = StreamState::Failed;
            }
        }
        self.events.clear();
    }
}
