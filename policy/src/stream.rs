//! What a streamed answer says, event by event.
//!
//! A streamed OpenAI-style answer is a sequence of server-sent events
//! (`text/event-stream`): `data: {json chunk}` lines separated by blank
//! lines, ended by `data: [DONE]`. The router reads it as it passes for
//! four reasons:
//!
//! 1. **When did the first token come?** The head of a streamed answer is
//!    held until its first event that carries content (a non-empty
//!    `delta.content`, `text`, `reasoning_content` or `refusal`, or any
//!    `tool_calls`/`function_call`). The first chunks of most engines carry
//!    only the role (`{"delta":{"role":"assistant","content":""}}`) and say
//!    nothing about whether generation started, so they do not count.
//!    Until then nothing has reached the client, and the attempt can still
//!    fail over (`first_token_timeout`).
//! 2. **Did the backend fail inside a 200?** An `event: error`, a chunk with
//!    an `error` object, or a `data:` payload that is not JSON is a failed
//!    attempt ([`SseEvent::Error`], [`SseEvent::Malformed`]).
//! 3. **How many tokens?** The usage chunk (`"usage": {...}`, with empty
//!    `choices` when the router asked for it with
//!    `stream_options.include_usage`) gives the counts; content events are
//!    counted as a fallback for time per output token.
//! 4. **Which events does the client get?** A usage chunk the client did
//!    not ask for is removed; everything else passes byte for byte.
//!
//! An Anthropic Messages stream (`provider: anthropic` pools) is read by
//! the same rules: a `content_block_delta` is content (the first token);
//! `message_start` (its message's usage: the input tokens) and
//! `message_delta` (its usage: the output tokens, cumulative) are usage
//! events, which [`crate::usage::ReportedUsage::merge`] merges (a later
//! count replaces an earlier one, an absent one keeps it; the cache
//! counts come with the input tokens); `event: error` is an error;
//! `ping`, block starts and stops and `message_stop` carry nothing.
//!
//! A Gemini stream (`provider: gemini` pools, `streamGenerateContent?alt=sse`)
//! too: each chunk is a `GenerateContentResponse`; one whose
//! `candidates[].content.parts` hold a non-empty `text` (a thought's
//! included), a `functionCall`, `inlineData` or code is content; its
//! `usageMetadata` is usage: `promptTokenCount` (with
//! `toolUsePromptTokenCount`) the input, cached tokens included as
//! OpenAI's `prompt_tokens` includes them, and `candidatesTokenCount` plus
//! `thoughtsTokenCount` the output (thoughts are billed as output). Each
//! chunk's counts are the totals so far, so [`StreamUsage::update`]'s
//! replacing keeps the last. An `error` object is an error. Gemini sends
//! no `[DONE]`: its stream ends with its bytes.
//!
//! [`SseScanner`] splits the byte stream into whole events (an event may
//! span frames, a frame may hold several events) without copying more than
//! the one partial event it carries between frames, and refuses an event
//! larger than its limit (a backend that never ends a line must not grow
//! the router's memory). [`classify`] says what one event is.
//!
//! Pure: no I/O, no clock. The proxy feeds frames and acts on the events.

use bytes::{Bytes, BytesMut};
use serde::Deserialize;

/// The largest single event the scanner holds (1 MiB).
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Token counts a stream reported: its usage events' fields, merged
/// (`crate::usage` says how they add up).
pub use crate::usage::ReportedUsage as StreamUsage;

/// What one server-sent event is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// A chunk that carries content (the first one is the first token).
    /// `usage` is set when the same chunk also reports usage.
    Content {
        /// Usage reported in the same chunk.
        usage: Option<StreamUsage>,
    },
    /// A chunk with usage and no content (the final usage chunk when it
    /// has no choices: `only_usage`).
    Usage {
        /// The counts.
        usage: StreamUsage,
        /// The chunk has no choices at all: it exists only to carry the
        /// usage (what `stream_options.include_usage` adds).
        only_usage: bool,
    },
    /// A valid chunk without content: the role chunk, a finish reason, a
    /// comment or keep-alive, an event with no data.
    NoContent,
    /// `data: [DONE]`.
    Done,
    /// The backend reported an error inside the stream.
    Error {
        /// The backend's message, if it gave one (at most 200 characters).
        message: String,
    },
    /// A `data:` payload that is not JSON.
    Malformed,
}

/// One whole event: its bytes as they came (blank line included) and what
/// it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent {
    /// The event's bytes, to pass on as they are.
    pub bytes: Bytes,
    /// What it is.
    pub kind: SseEvent,
}

/// The scanner was given an event larger than [`MAX_EVENT_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a server-sent event larger than {limit} bytes")]
pub struct EventTooLarge {
    /// The limit.
    pub limit: usize,
}

/// Splits a byte stream into whole server-sent events.
#[derive(Debug, Default)]
pub struct SseScanner {
    /// The bytes of the event not yet ended.
    partial: BytesMut,
    /// Where the last unfinished line of `partial` starts (searched from
    /// there when more comes).
    searched: usize,
}

impl SseScanner {
    /// A scanner with nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `chunk` and appends every event it completes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<RawEvent>) -> Result<(), EventTooLarge> {
        self.partial.extend_from_slice(chunk);
        loop {
            match event_end(&self.partial, self.searched) {
                Ok(end) => {
                    let bytes = self.partial.split_to(end).freeze();
                    self.searched = 0;
                    let kind = classify(&bytes);
                    out.push(RawEvent { bytes, kind });
                }
                // Next time, search from the unfinished line's start.
                Err(line_start) => {
                    self.searched = line_start;
                    break;
                }
            }
        }
        if self.partial.len() > MAX_EVENT_BYTES {
            return Err(EventTooLarge {
                limit: MAX_EVENT_BYTES,
            });
        }
        Ok(())
    }

    /// The bytes of an unfinished event still held (a stream that ends
    /// here ended mid-event).
    pub fn held(&self) -> &[u8] {
        &self.partial
    }

    /// Takes what is held, leaving the scanner empty (to pass a stream's
    /// last, unterminated bytes on as they are).
    pub fn take_held(&mut self) -> Bytes {
        self.searched = 0;
        self.partial.split().freeze()
    }
}

/// Where the first event in `buf` ends (just past its blank line), or,
/// when no event ends yet, `Err` with the start of the last unfinished
/// line (where to search from next). `from` must be a line start. Lines
/// end with `\n`, `\r\n` or `\r`.
fn event_end(buf: &[u8], from: usize) -> Result<usize, usize> {
    let mut line_start = from;
    let mut i = from;
    while i < buf.len() {
        match buf[i] {
            b'\n' | b'\r' => {
                let end = if buf[i] == b'\r' {
                    match buf.get(i + 1) {
                        Some(b'\n') => i + 2,
                        Some(_) => i + 1,
                        // A CR at the end: "\r\n" or a lone "\r"? Wait.
                        None => return Err(line_start),
                    }
                } else {
                    i + 1
                };
                if i == line_start {
                    return Ok(end);
                }
                line_start = end;
                i = end;
            }
            _ => i += 1,
        }
    }
    Err(line_start)
}

/// What one whole event (its raw bytes) is.
pub fn classify(event: &[u8]) -> SseEvent {
    let mut data: Vec<&[u8]> = Vec::new();
    let mut error_event = false;
    for line in event.split(|b| *b == b'\n' || *b == b'\r') {
        if line.is_empty() || line[0] == b':' {
            continue;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => data.push(value),
            b"event" => error_event = value == b"error",
            _ => {}
        }
    }
    if data.is_empty() {
        return if error_event {
            SseEvent::Error {
                message: String::new(),
            }
        } else {
            SseEvent::NoContent
        };
    }
    let payload = data.join(&b'\n');
    if payload.as_slice() == b"[DONE]" {
        return SseEvent::Done;
    }
    let Ok(chunk) = serde_json::from_slice::<Chunk>(&payload) else {
        return if error_event {
            SseEvent::Error {
                message: short(&String::from_utf8_lossy(&payload)),
            }
        } else {
            SseEvent::Malformed
        };
    };
    if error_event || chunk.error.as_ref().is_some_and(|e| !e.is_null()) {
        return SseEvent::Error {
            message: chunk.error.as_ref().map(error_message).unwrap_or_default(),
        };
    }
    let usage = chunk
        .usage
        .or_else(|| chunk.message.and_then(|m| m.usage))
        .map(|u| StreamUsage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_tokens: u
                .prompt_tokens_details
                .or(u.input_tokens_details)
                .and_then(|d| d.cached_tokens),
            cache_read_input_tokens: u.cache_read_input_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
        })
        .or_else(|| chunk.usage_metadata.map(GeminiUsage::counts));
    if chunk.choices.iter().any(Choice::has_content)
        || chunk.kind == Some(Kind::ContentBlockDelta)
        || chunk.candidates.iter().any(Candidate::has_content)
    {
        return SseEvent::Content { usage };
    }
    match usage {
        Some(usage) => SseEvent::Usage {
            usage,
            only_usage: chunk.choices.is_empty(),
        },
        None => SseEvent::NoContent,
    }
}

/// The message of a backend's `error` value (an object with `message`, or
/// a string), shortened.
fn error_message(error: &serde_json::Value) -> String {
    let text = match error {
        serde_json::Value::String(s) => s.as_str(),
        other => other
            .get("message")
            .and_then(|m| m.as_str())
            .unwrap_or_default(),
    };
    short(text)
}

fn short(text: &str) -> String {
    text.chars().take(200).collect()
}

/// The part of a chunk the router reads.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageFields>,
    #[serde(default)]
    error: Option<serde_json::Value>,
    /// An Anthropic event's type.
    #[serde(default, rename = "type")]
    kind: Option<Kind>,
    /// Anthropic's `message_start` carries the message (and its usage).
    #[serde(default)]
    message: Option<MessageFields>,
    /// A Gemini chunk's candidates.
    #[serde(default)]
    candidates: Vec<Candidate>,
    /// A Gemini chunk's usage.
    #[serde(default, rename = "usageMetadata")]
    usage_metadata: Option<GeminiUsage>,
}

/// A Gemini candidate: its content's parts.
#[derive(Deserialize)]
struct Candidate {
    #[serde(default)]
    content: Option<GeminiContent>,
}

#[derive(Deserialize)]
struct GeminiContent {
    #[serde(default)]
    parts: Vec<GeminiPart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GeminiPart {
    #[serde(default)]
    text: Option<serde_json::Value>,
    #[serde(default)]
    function_call: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    inline_data: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    executable_code: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    code_execution_result: Option<serde::de::IgnoredAny>,
}

impl Candidate {
    fn has_content(&self) -> bool {
        self.content.as_ref().is_some_and(|c| {
            c.parts.iter().any(|p| {
                p.text.as_ref().is_some_and(non_empty)
                    || p.function_call.is_some()
                    || p.inline_data.is_some()
                    || p.executable_code.is_some()
                    || p.code_execution_result.is_some()
            })
        })
    }
}

/// Gemini's `usageMetadata` (the counts the router reads).
#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct GeminiUsage {
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    tool_use_prompt_token_count: Option<u64>,
    #[serde(default)]
    candidates_token_count: Option<u64>,
    #[serde(default)]
    thoughts_token_count: Option<u64>,
    #[serde(default)]
    cached_content_token_count: Option<u64>,
}

impl GeminiUsage {
    /// The whole prompt: the prompt (cached tokens are inside it, as in
    /// OpenAI's spelling) and the prompt of Gemini's own tool calls;
    /// output: candidates and thoughts.
    fn counts(self) -> StreamUsage {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        StreamUsage {
            prompt_tokens: sum(self.prompt_token_count, self.tool_use_prompt_token_count),
            completion_tokens: sum(self.candidates_token_count, self.thoughts_token_count),
            cached_tokens: self.cached_content_token_count,
            ..StreamUsage::default()
        }
    }
}

/// The Anthropic event types the router tells apart.
#[derive(Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Kind {
    ContentBlockDelta,
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct MessageFields {
    #[serde(default)]
    usage: Option<UsageFields>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    /// Completions (`/v1/completions`) stream `text`.
    #[serde(default)]
    text: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<serde_json::Value>,
    #[serde(default)]
    reasoning_content: Option<serde_json::Value>,
    #[serde(default)]
    refusal: Option<serde_json::Value>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    function_call: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct UsageFields {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<DetailsFields>,
    #[serde(default)]
    input_tokens_details: Option<DetailsFields>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize, Clone, Copy)]
struct DetailsFields {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl Choice {
    fn has_content(&self) -> bool {
        if self.text.as_ref().is_some_and(non_empty) {
            return true;
        }
        let Some(d) = &self.delta else {
            return false;
        };
        d.tool_calls.is_some()
            || d.function_call.is_some()
            || [&d.content, &d.reasoning_content, &d.refusal]
                .into_iter()
                .flatten()
                .any(non_empty)
    }
}

/// A string that is not empty, or an array (content parts) that is not.
fn non_empty(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => !s.is_empty(),
        serde_json::Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

/// Time per output token: the time from the first token to the last,
/// spread over the tokens after the first. `None` with fewer than two
/// tokens (there is no interval to measure).
pub fn time_per_output_token(
    first_to_last: std::time::Duration,
    output_tokens: u64,
) -> Option<std::time::Duration> {
    let intervals = output_tokens.checked_sub(1).filter(|n| *n > 0)?;
    let intervals = u32::try_from(intervals).unwrap_or(u32::MAX);
    Some(first_to_last / intervals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kinds(stream: &[u8], split_at: &[usize]) -> (Vec<SseEvent>, Vec<u8>) {
        let mut s = SseScanner::new();
        let mut out = Vec::new();
        let mut last = 0;
        for &at in split_at.iter().chain(std::iter::once(&stream.len())) {
            let at = at.clamp(last, stream.len());
            s.feed(&stream[last..at], &mut out).expect("small events");
            last = at;
        }
        let mut bytes: Vec<u8> = out.iter().flat_map(|e| e.bytes.to_vec()).collect();
        bytes.extend_from_slice(s.held());
        (out.into_iter().map(|e| e.kind).collect(), bytes)
    }

    const VLLM: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":14,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

    #[test]
    fn a_vllm_stream_reads_as_role_content_usage_done() {
        let (k, bytes) = kinds(VLLM.as_bytes(), &[]);
        assert_eq!(
            k,
            vec![
                SseEvent::NoContent,
                SseEvent::Content { usage: None },
                SseEvent::Content { usage: None },
                SseEvent::Usage {
                    usage: StreamUsage {
                        prompt_tokens: Some(12),
                        completion_tokens: Some(2),
                        ..StreamUsage::default()
                    },
                    only_usage: true
                },
                SseEvent::Done,
            ]
        );
        assert_eq!(bytes, VLLM.as_bytes());
    }

    /// An Anthropic Messages stream, as its API reference shows it.
    const ANTHROPIC: &str = "event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2000,\"output_tokens\":1}}}\n\n\
event: content_block_start\n\
data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\n\
data: {\"type\": \"ping\"}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n\
event: content_block_stop\n\
data: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n\
event: message_stop\n\
data: {\"type\":\"message_stop\"}\n\n";

    #[test]
    fn an_anthropic_stream_reads_as_usage_content_usage_and_merges_its_counts() {
        let (k, bytes) = kinds(ANTHROPIC.as_bytes(), &[]);
        let start = StreamUsage {
            input_tokens: Some(25),
            output_tokens: Some(1),
            cache_read_input_tokens: Some(2000),
            cache_creation_input_tokens: Some(0),
            ..StreamUsage::default()
        };
        let delta = StreamUsage {
            output_tokens: Some(15),
            ..StreamUsage::default()
        };
        assert_eq!(
            k,
            vec![
                SseEvent::Usage {
                    usage: start,
                    only_usage: true
                },
                SseEvent::NoContent,
                SseEvent::NoContent,
                SseEvent::Content { usage: None },
                SseEvent::NoContent,
                SseEvent::Usage {
                    usage: delta,
                    only_usage: true
                },
                SseEvent::NoContent,
            ]
        );
        assert_eq!(bytes, ANTHROPIC.as_bytes());
        // The input and the cache counts from message_start, the output
        // from message_delta: the cache read is part of the prompt, once.
        assert_eq!(
            start.merge(delta).tokens(0),
            crate::usage::Tokens {
                prompt: 2025,
                output: 15,
                cache_read: 2000,
                cache_write: 0,
            }
        );
        // OpenAI's cached tokens come inside the usage chunk's prompt.
        assert_eq!(
            classify(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":90,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n"),
            SseEvent::Usage {
                usage: StreamUsage {
                    prompt_tokens: Some(90),
                    completion_tokens: Some(3),
                    cached_tokens: Some(64),
                    ..StreamUsage::default()
                },
                only_usage: true
            }
        );
        // Anthropic's error event, mid-stream.
        assert_eq!(
            classify(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"),
            SseEvent::Error {
                message: "Overloaded".into()
            }
        );
    }

    /// A Gemini stream as `streamGenerateContent?alt=sse` sends it
    /// (`\r\n\r\n` between events, no end marker): a thought, text,
    /// the last chunk with the finish reason and the whole usage.
    const GEMINI: &str = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Let me think.\",\"thought\": true}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 40,\"totalTokenCount\": 52,\"thoughtsTokenCount\": 12},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"r1\"}\r\n\r\n\
data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hello\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 40,\"candidatesTokenCount\": 1,\"totalTokenCount\": 53,\"thoughtsTokenCount\": 12},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"r1\"}\r\n\r\n\
data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 40,\"candidatesTokenCount\": 5,\"totalTokenCount\": 57,\"cachedContentTokenCount\": 32,\"thoughtsTokenCount\": 12},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"r1\"}\r\n\r\n";

    #[test]
    fn a_gemini_stream_reads_as_content_and_its_last_usage_counts_thoughts_as_output() {
        for split in [vec![], vec![7], vec![100, 101, 400]] {
            let (k, bytes) = kinds(GEMINI.as_bytes(), &split);
            assert_eq!(bytes, GEMINI.as_bytes());
            let usage = |o: u64| StreamUsage {
                prompt_tokens: Some(40),
                completion_tokens: Some(o),
                ..StreamUsage::default()
            };
            assert_eq!(
                k,
                vec![
                    // A thought is content: generation started.
                    SseEvent::Content {
                        usage: Some(usage(12))
                    },
                    SseEvent::Content {
                        usage: Some(usage(13))
                    },
                    // The last chunk: no content, the whole usage (the
                    // cached tokens inside the prompt's 40, not added).
                    SseEvent::Usage {
                        usage: StreamUsage {
                            cached_tokens: Some(32),
                            ..usage(17)
                        },
                        only_usage: true
                    },
                ]
            );
        }
        // A function call is content; an error object is an error.
        assert_eq!(
            classify(b"data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"f\",\"args\":{}},\"thoughtSignature\":\"c2ln\"}],\"role\":\"model\"}}]}\r\n\r\n"),
            SseEvent::Content { usage: None }
        );
        assert_eq!(
            classify(b"data: {\"error\":{\"code\":503,\"message\":\"The model is overloaded.\",\"status\":\"UNAVAILABLE\"}}\n\n"),
            SseEvent::Error {
                message: "The model is overloaded.".into()
            }
        );
        // Gemini's own tool prompt counts as input.
        assert_eq!(
            classify(b"data: {\"usageMetadata\":{\"promptTokenCount\":10,\"toolUsePromptTokenCount\":5,\"candidatesTokenCount\":2}}\n\n"),
            SseEvent::Usage {
                usage: StreamUsage {
                    prompt_tokens: Some(15),
                    completion_tokens: Some(2),
                    ..StreamUsage::default()
                },
                only_usage: true
            }
        );
    }

    #[test]
    fn errors_and_malformed_payloads_are_told_apart() {
        let c = |s: &str| classify(s.as_bytes());
        assert_eq!(
            c("event: error\ndata: {\"error\":{\"message\":\"CUDA out of memory\"}}\n\n"),
            SseEvent::Error {
                message: "CUDA out of memory".into()
            }
        );
        assert_eq!(
            c("data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n"),
            SseEvent::Error {
                message: "overloaded".into()
            }
        );
        assert_eq!(
            c("data: {\"error\":\"boom\"}\n\n"),
            SseEvent::Error {
                message: "boom".into()
            }
        );
        assert_eq!(
            c("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"\n\n"),
            SseEvent::Malformed
        );
        assert_eq!(c(": keep-alive\n\n"), SseEvent::NoContent);
        assert_eq!(
            c("data: {\"error\":null,\"choices\":[]}\n\n"),
            SseEvent::NoContent
        );
        assert_eq!(
            c("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n"),
            SseEvent::Content { usage: None }
        );
        assert_eq!(
            c("data: {\"choices\":[{\"text\":\"x\",\"index\":0}]}\r\n\r\n"),
            SseEvent::Content { usage: None }
        );
        assert_eq!(
            c("data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n"),
            SseEvent::Content { usage: None }
        );
    }

    #[test]
    fn an_event_over_the_limit_is_refused() {
        let mut s = SseScanner::new();
        let mut out = Vec::new();
        let line = vec![b'a'; 64 * 1024];
        s.feed(b"data: ", &mut out).expect("small");
        let mut refused = false;
        for _ in 0..20 {
            if s.feed(&line, &mut out).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
        assert!(out.is_empty());
    }

    #[test]
    fn tpot_spreads_the_time_after_the_first_token() {
        let ms = std::time::Duration::from_millis;
        assert_eq!(time_per_output_token(ms(900), 10), Some(ms(100)));
        assert_eq!(time_per_output_token(ms(900), 1), None);
        assert_eq!(time_per_output_token(ms(900), 0), None);
    }

    proptest! {
        /// However the stream is cut into frames, the same events come out
        /// and not a byte is lost or added.
        #[test]
        fn framing_does_not_change_the_events(
            cuts in proptest::collection::vec(0usize..VLLM.len(), 0..12),
            crlf in any::<bool>(),
        ) {
            let text = if crlf { VLLM.replace('\n', "\r\n") } else { VLLM.to_string() };
            let mut cuts = cuts;
            cuts.sort_unstable();
            let (whole, _) = kinds(text.as_bytes(), &[]);
            let (framed, bytes) = kinds(text.as_bytes(), &cuts);
            prop_assert_eq!(whole, framed);
            prop_assert_eq!(bytes, text.as_bytes());
        }
    }
}
