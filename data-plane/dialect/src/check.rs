//! Conformance checks of a client's stream: is this byte stream a
//! well-formed Anthropic (or OpenAI) stream, and what does it say?
//!
//! The tests of this crate (and the router's, through the real proxy) hold
//! translated streams to these rules; a violation is an `Err` naming the
//! event and the rule.
//!
//! Anthropic ([`anthropic_stream`]): every event's `event:` name is its
//! `data.type`; `message_start` exactly once and before anything else but
//! `ping` or `error`; `content_block_start` only when no block is open,
//! with the next index (0, 1, 2, ... without gaps); deltas only for the
//! open block's index and of its type (`text_delta` in `text`,
//! `input_json_delta` in `tool_use`, `thinking_delta` and
//! `signature_delta` in `thinking`); `content_block_stop` for the open
//! block; `message_delta` once, with no block open, with a `stop_reason`;
//! `message_stop` once, after it, and last. An `error` event ends the
//! stream (nothing may follow it). The stream must end with
//! `message_stop` or `error`.
//!
//! OpenAI ([`openai_stream`]): chunks of `object: chat.completion.chunk`;
//! the first delta has `role: assistant`; a tool call's first delta has
//! its `id`, `type: function` and name, at the next free `index`; one
//! chunk with a `finish_reason`; a usage chunk (empty `choices`) only after
//! it; `data: [DONE]` last, or an `event: error` last.

use serde_json::Value;

use crate::sse::{SseFrame, SseParser};
use crate::{DialectError, Usage};

/// What a well-formed stream said.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Said {
    /// All text, concatenated.
    pub text: String,
    /// All reasoning, concatenated.
    pub thinking: String,
    /// Tool calls in order: (id, name, arguments).
    pub tools: Vec<(String, String, String)>,
    /// The stop reason in the stream's dialect.
    pub stop_reason: Option<String>,
    /// The final usage, normalized.
    pub usage: Option<Usage>,
    /// The stream ended with an error event (its `data`).
    pub error: Option<Value>,
    /// Number of content blocks (Anthropic).
    pub blocks: usize,
}

/// Why a stream is not well formed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The bytes are not server-sent events.
    #[error(transparent)]
    Sse(#[from] DialectError),
    /// The bytes stop in the middle of an event.
    #[error("the stream ends inside an event")]
    EndsInsideEvent,
    /// An Anthropic event breaks a rule.
    #[error("event {index} ({event:?}): {rule}")]
    Event {
        /// The event's place in the stream, from 0.
        index: usize,
        /// Its `event:` name.
        event: Option<String>,
        /// The rule it breaks.
        rule: Rule,
    },
    /// An OpenAI chunk breaks a rule.
    #[error("chunk {index}: {rule}")]
    Chunk {
        /// The chunk's place in the stream, from 0.
        index: usize,
        /// The rule it breaks.
        rule: Rule,
    },
    /// An Anthropic stream that ends without `message_stop` or `error`.
    #[error("the stream ends without message_stop or error")]
    NoMessageStop,
    /// An OpenAI stream that ends without `[DONE]` or an error.
    #[error("the stream ends without [DONE] or error")]
    NoDone,
}

/// The rule an event or chunk breaks ([`CheckError::Event`],
/// [`CheckError::Chunk`]).
#[derive(Debug, thiserror::Error)]
pub enum Rule {
    /// The data is not JSON.
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    /// An OpenAI error event whose data is not JSON.
    #[error("{0}")]
    ErrorNotJson(serde_json::Error),
    /// A field the event or chunk must have (`text`, `partial_json`,
    /// `thinking`, `choices`).
    #[error("no {0}")]
    Missing(&'static str),
    /// `content_block_start` at another index than the next.
    #[error("block index {index:?}, expected {expected}")]
    BlockIndex {
        /// The index given, if any.
        index: Option<u64>,
        /// The next index.
        expected: u64,
    },
    /// An Anthropic event after `message_stop` or `error`.
    #[error("an event after the end of the stream")]
    EventAfterEnd,
    /// An event whose `event:` name is not its `data.type`.
    #[error("the event name is not the data's type")]
    EventNameNotType,
    /// An event other than `ping` or `error` before `message_start`.
    #[error("an event before message_start")]
    BeforeMessageStart,
    /// `message_start` again.
    #[error("a second message_start")]
    SecondMessageStart,
    /// `message_start` whose message is not the assistant's.
    #[error("message_start without a message of the assistant")]
    NotAssistantMessage,
    /// `message_start` whose message already has content.
    #[error("message_start with content")]
    MessageStartWithContent,
    /// `content_block_start` while a block is open.
    #[error("a block opened while another is open")]
    BlockWhileOpen,
    /// `content_block_start` after `message_delta`.
    #[error("a block opened after message_delta")]
    BlockAfterMessageDelta,
    /// A `tool_use` block without its id, name or input object.
    #[error("a tool_use block without id, name or input object")]
    ToolUseIncomplete,
    /// A block of a type this check does not know.
    #[error("an unknown block type")]
    UnknownBlock,
    /// `content_block_delta` with no block open.
    #[error("a delta with no block open")]
    DeltaWithoutBlock,
    /// `content_block_delta` for another block than the open one.
    #[error("a delta for a block that is not the open one")]
    DeltaForOtherBlock,
    /// A delta of another type than its block's.
    #[error("a delta of the wrong type for its block")]
    DeltaWrongType,
    /// `content_block_stop` for a block that is not open.
    #[error("a stop for a block that is not open")]
    StopNotOpen,
    /// `message_delta` while a block is open.
    #[error("message_delta with a block open")]
    MessageDeltaWithBlockOpen,
    /// `message_delta` again.
    #[error("a second message_delta")]
    SecondMessageDelta,
    /// `message_delta` without a `stop_reason`.
    #[error("message_delta without a stop_reason")]
    NoStopReason,
    /// `message_stop` before `message_delta`.
    #[error("message_stop before message_delta")]
    MessageStopBeforeDelta,
    /// An event this check does not know.
    #[error("an unknown event")]
    UnknownEvent,
    /// An OpenAI chunk after `[DONE]` or an error.
    #[error("a chunk after the end of the stream")]
    ChunkAfterEnd,
    /// An OpenAI event named other than `error`.
    #[error("an event name other than error")]
    EventNotError,
    /// `[DONE]` before a `finish_reason`.
    #[error("[DONE] before a finish_reason")]
    DoneBeforeFinish,
    /// Data whose `object` is not `chat.completion.chunk`.
    #[error("not a chat.completion.chunk")]
    NotAChunk,
    /// A usage chunk (empty `choices`) before the `finish_reason`.
    #[error("a usage chunk before the finish_reason")]
    UsageBeforeFinish,
    /// The first delta without `role: assistant`.
    #[error("the first delta has no role assistant")]
    FirstDeltaNoRole,
    /// A tool call delta without its `index`.
    #[error("a tool call without index")]
    ToolCallNoIndex,
    /// A tool call's first delta without its id, `type: function` or name.
    #[error("a tool call's first delta without id, type or name")]
    ToolCallIncomplete,
    /// A tool call's id or name again.
    #[error("a tool call started twice")]
    ToolCallTwice,
    /// A tool call index past the next free one.
    #[error("a tool call index that skips one")]
    ToolCallSkips,
    /// A `finish_reason` again.
    #[error("a second finish_reason")]
    SecondFinish,
}

fn frames(bytes: &[u8]) -> Result<Vec<SseFrame>, CheckError> {
    let mut p = SseParser::new(usize::MAX);
    let mut out = Vec::new();
    p.push(bytes, &mut out)?;
    if p.has_partial() {
        return Err(CheckError::EndsInsideEvent);
    }
    Ok(out)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Block {
    Text,
    Tool,
    Thinking,
    Redacted,
}

/// Checks an Anthropic Messages stream and says what it said.
pub fn anthropic_stream(bytes: &[u8]) -> Result<Said, CheckError> {
    let mut said = Said::default();
    let mut started = false;
    let mut open: Option<(u64, Block)> = None;
    let mut next = 0u64;
    let mut delta_seen = false;
    let mut ended = false;
    let mut usage = Usage::default();
    for (i, f) in frames(bytes)?.into_iter().enumerate() {
        let at = |rule: Rule| CheckError::Event {
            index: i,
            event: f.event.clone(),
            rule,
        };
        if ended {
            return Err(at(Rule::EventAfterEnd));
        }
        let v: Value = serde_json::from_str(&f.data).map_err(|e| at(Rule::NotJson(e)))?;
        let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
        if f.event.as_deref() != Some(ty) {
            return Err(at(Rule::EventNameNotType));
        }
        if ty == "error" {
            said.error = Some(v);
            ended = true;
            continue;
        }
        if ty == "ping" {
            continue;
        }
        if !started && ty != "message_start" {
            return Err(at(Rule::BeforeMessageStart));
        }
        let index = v.get("index").and_then(Value::as_u64);
        match ty {
            "message_start" => {
                if started {
                    return Err(at(Rule::SecondMessageStart));
                }
                started = true;
                let m = &v["message"];
                if m["type"] != "message" || m["role"] != "assistant" {
                    return Err(at(Rule::NotAssistantMessage));
                }
                if m["content"].as_array().is_none_or(|c| !c.is_empty()) {
                    return Err(at(Rule::MessageStartWithContent));
                }
                usage = Usage::from_anthropic(&m["usage"]);
            }
            "content_block_start" => {
                if open.is_some() {
                    return Err(at(Rule::BlockWhileOpen));
                }
                if delta_seen {
                    return Err(at(Rule::BlockAfterMessageDelta));
                }
                if index != Some(next) {
                    return Err(at(Rule::BlockIndex {
                        index,
                        expected: next,
                    }));
                }
                let b = &v["content_block"];
                let kind = match b["type"].as_str() {
                    Some("text") => Block::Text,
                    Some("tool_use") => {
                        let id = b["id"].as_str().unwrap_or("");
                        let name = b["name"].as_str().unwrap_or("");
                        if id.is_empty() || name.is_empty() || !b["input"].is_object() {
                            return Err(at(Rule::ToolUseIncomplete));
                        }
                        said.tools
                            .push((id.to_owned(), name.to_owned(), String::new()));
                        Block::Tool
                    }
                    Some("thinking") => Block::Thinking,
                    Some("redacted_thinking") => Block::Redacted,
                    _ => return Err(at(Rule::UnknownBlock)),
                };
                open = Some((next, kind));
                next += 1;
                said.blocks += 1;
            }
            "content_block_delta" => {
                let Some((idx, kind)) = open else {
                    return Err(at(Rule::DeltaWithoutBlock));
                };
                if index != Some(idx) {
                    return Err(at(Rule::DeltaForOtherBlock));
                }
                let d = &v["delta"];
                let s = |k: &str| d[k].as_str().map(str::to_owned);
                match (d["type"].as_str(), kind) {
                    (Some("text_delta"), Block::Text) => said
                        .text
                        .push_str(&s("text").ok_or_else(|| at(Rule::Missing("text")))?),
                    (Some("input_json_delta"), Block::Tool) => {
                        let j =
                            s("partial_json").ok_or_else(|| at(Rule::Missing("partial_json")))?;
                        if let Some(t) = said.tools.last_mut() {
                            t.2.push_str(&j);
                        }
                    }
                    (Some("thinking_delta"), Block::Thinking) => said
                        .thinking
                        .push_str(&s("thinking").ok_or_else(|| at(Rule::Missing("thinking")))?),
                    (Some("signature_delta"), Block::Thinking) => {}
                    _ => return Err(at(Rule::DeltaWrongType)),
                }
            }
            "content_block_stop" => match open {
                Some((idx, _)) if index == Some(idx) => open = None,
                _ => return Err(at(Rule::StopNotOpen)),
            },
            "message_delta" => {
                if open.is_some() {
                    return Err(at(Rule::MessageDeltaWithBlockOpen));
                }
                if delta_seen {
                    return Err(at(Rule::SecondMessageDelta));
                }
                delta_seen = true;
                said.stop_reason = v["delta"]["stop_reason"].as_str().map(str::to_owned);
                if said.stop_reason.is_none() {
                    return Err(at(Rule::NoStopReason));
                }
                usage.overlay_anthropic(&v["usage"]);
                said.usage = Some(usage);
            }
            "message_stop" => {
                if !delta_seen {
                    return Err(at(Rule::MessageStopBeforeDelta));
                }
                ended = true;
            }
            _ => return Err(at(Rule::UnknownEvent)),
        }
    }
    if !ended {
        return Err(CheckError::NoMessageStop);
    }
    Ok(said)
}

/// Checks an OpenAI chat completions stream and says what it said.
pub fn openai_stream(bytes: &[u8]) -> Result<Said, CheckError> {
    let mut said = Said::default();
    let mut first = true;
    let mut finished = false;
    let mut ended = false;
    for (i, f) in frames(bytes)?.into_iter().enumerate() {
        let at = |rule: Rule| CheckError::Chunk { index: i, rule };
        if ended {
            return Err(at(Rule::ChunkAfterEnd));
        }
        if f.event.as_deref() == Some("error") {
            said.error =
                Some(serde_json::from_str(&f.data).map_err(|e| at(Rule::ErrorNotJson(e)))?);
            ended = true;
            continue;
        }
        if f.event.is_some() {
            return Err(at(Rule::EventNotError));
        }
        if f.data == "[DONE]" {
            if !finished {
                return Err(at(Rule::DoneBeforeFinish));
            }
            ended = true;
            continue;
        }
        let v: Value = serde_json::from_str(&f.data).map_err(|e| at(Rule::NotJson(e)))?;
        if v["object"] != "chat.completion.chunk" {
            return Err(at(Rule::NotAChunk));
        }
        let choices = v["choices"]
            .as_array()
            .ok_or_else(|| at(Rule::Missing("choices")))?;
        if choices.is_empty() {
            if !finished {
                return Err(at(Rule::UsageBeforeFinish));
            }
            said.usage = Some(Usage::from_openai(&v["usage"]));
            continue;
        }
        for c in choices {
            let d = &c["delta"];
            if first {
                if d["role"] != "assistant" {
                    return Err(at(Rule::FirstDeltaNoRole));
                }
                first = false;
            }
            if let Some(t) = d["content"].as_str() {
                said.text.push_str(t);
            }
            if let Some(t) = d["reasoning_content"].as_str() {
                said.thinking.push_str(t);
            }
            if let Some(calls) = d["tool_calls"].as_array() {
                for tc in calls {
                    let idx = tc["index"]
                        .as_u64()
                        .ok_or_else(|| at(Rule::ToolCallNoIndex))?
                        as usize;
                    let args = tc["function"]["arguments"].as_str().unwrap_or("");
                    if idx == said.tools.len() {
                        let id = tc["id"].as_str().unwrap_or("");
                        let name = tc["function"]["name"].as_str().unwrap_or("");
                        if id.is_empty() || name.is_empty() || tc["type"] != "function" {
                            return Err(at(Rule::ToolCallIncomplete));
                        }
                        said.tools
                            .push((id.to_owned(), name.to_owned(), args.to_owned()));
                    } else if idx < said.tools.len() {
                        if tc.get("id").is_some() || tc["function"].get("name").is_some() {
                            return Err(at(Rule::ToolCallTwice));
                        }
                        said.tools[idx].2.push_str(args);
                    } else {
                        return Err(at(Rule::ToolCallSkips));
                    }
                }
            }
            if let Some(r) = c["finish_reason"].as_str() {
                if finished {
                    return Err(at(Rule::SecondFinish));
                }
                finished = true;
                said.stop_reason = Some(r.to_owned());
            }
        }
    }
    if !ended {
        return Err(CheckError::NoDone);
    }
    Ok(said)
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{}}}\n\n";

    #[test]
    fn an_anthropic_stream_that_breaks_a_rule_names_the_event_and_the_rule() {
        let skip = format!(
            "{START}event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n"
        );
        let err = anthropic_stream(skip.as_bytes()).unwrap_err();
        assert!(
            matches!(
                &err,
                CheckError::Event {
                    index: 1,
                    rule: Rule::BlockIndex {
                        index: Some(1),
                        expected: 0
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "event 1 (Some(\"content_block_start\")): block index Some(1), expected 0"
        );
        let twice = format!("{START}{START}");
        let err = anthropic_stream(twice.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                CheckError::Event {
                    rule: Rule::SecondMessageStart,
                    ..
                }
            ),
            "{err:?}"
        );
        let not_json = "event: ping\ndata: {\n\n";
        let err = anthropic_stream(not_json.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                CheckError::Event {
                    rule: Rule::NotJson(_),
                    ..
                }
            ),
            "{err:?}"
        );
        let err = anthropic_stream(START.as_bytes()).unwrap_err();
        assert!(matches!(err, CheckError::NoMessageStop), "{err:?}");
        let err = anthropic_stream(b"event: ping\ndata: {}").unwrap_err();
        assert!(matches!(err, CheckError::EndsInsideEvent), "{err:?}");
    }

    #[test]
    fn an_openai_stream_that_breaks_a_rule_names_the_chunk_and_the_rule() {
        let chunk = |delta: &str, finish: &str| {
            format!("data: {{\"object\":\"chat.completion.chunk\",\"choices\":[{{\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n")
        };
        let no_role = chunk("{\"content\":\"hi\"}", "null");
        let err = openai_stream(no_role.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                CheckError::Chunk {
                    index: 0,
                    rule: Rule::FirstDeltaNoRole
                }
            ),
            "{err:?}"
        );
        let early = format!(
            "{}data: [DONE]\n\n",
            chunk("{\"role\":\"assistant\"}", "null")
        );
        let err = openai_stream(early.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                CheckError::Chunk {
                    index: 1,
                    rule: Rule::DoneBeforeFinish
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "chunk 1: [DONE] before a finish_reason");
        let bad_error = "event: error\ndata: {\n\n";
        let err = openai_stream(bad_error.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                CheckError::Chunk {
                    rule: Rule::ErrorNotJson(_),
                    ..
                }
            ),
            "{err:?}"
        );
        let no_choices = "data: {\"object\":\"chat.completion.chunk\"}\n\n";
        let err = openai_stream(no_choices.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                CheckError::Chunk {
                    rule: Rule::Missing("choices"),
                    ..
                }
            ),
            "{err:?}"
        );
        let unfinished = chunk("{\"role\":\"assistant\"}", "\"stop\"");
        let err = openai_stream(unfinished.as_bytes()).unwrap_err();
        assert!(matches!(err, CheckError::NoDone), "{err:?}");
        let done = format!("{unfinished}data: [DONE]\n\n");
        let said = openai_stream(done.as_bytes()).unwrap();
        assert_eq!(said.stop_reason.as_deref(), Some("stop"));
    }
}
