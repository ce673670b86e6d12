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
use crate::Usage;

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

fn frames(bytes: &[u8]) -> Result<Vec<SseFrame>, String> {
    let mut p = SseParser::new(usize::MAX);
    let mut out = Vec::new();
    p.push(bytes, &mut out).map_err(|e| e.to_string())?;
    if p.has_partial() {
        return Err("the stream ends inside an event".into());
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
pub fn anthropic_stream(bytes: &[u8]) -> Result<Said, String> {
    let mut said = Said::default();
    let mut started = false;
    let mut open: Option<(u64, Block)> = None;
    let mut next = 0u64;
    let mut delta_seen = false;
    let mut ended = false;
    let mut usage = Usage::default();
    for (i, f) in frames(bytes)?.into_iter().enumerate() {
        let at = |why: &str| format!("event {i} ({:?}): {why}", f.event);
        if ended {
            return Err(at("an event after the end of the stream"));
        }
        let v: Value = serde_json::from_str(&f.data).map_err(|e| at(&format!("not JSON: {e}")))?;
        let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
        if f.event.as_deref() != Some(ty) {
            return Err(at("the event name is not the data's type"));
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
            return Err(at("an event before message_start"));
        }
        let index = v.get("index").and_then(Value::as_u64);
        match ty {
            "message_start" => {
                if started {
                    return Err(at("a second message_start"));
                }
                started = true;
                let m = &v["message"];
                if m["type"] != "message" || m["role"] != "assistant" {
                    return Err(at("message_start without a message of the assistant"));
                }
                if m["content"].as_array().is_none_or(|c| !c.is_empty()) {
                    return Err(at("message_start with content"));
                }
                usage = Usage::from_anthropic(&m["usage"]);
            }
            "content_block_start" => {
                if open.is_some() {
                    return Err(at("a block opened while another is open"));
                }
                if delta_seen {
                    return Err(at("a block opened after message_delta"));
                }
                if index != Some(next) {
                    return Err(at(&format!("block index {index:?}, expected {next}")));
                }
                let b = &v["content_block"];
                let kind = match b["type"].as_str() {
                    Some("text") => Block::Text,
                    Some("tool_use") => {
                        let id = b["id"].as_str().unwrap_or("");
                        let name = b["name"].as_str().unwrap_or("");
                        if id.is_empty() || name.is_empty() || !b["input"].is_object() {
                            return Err(at("a tool_use block without id, name or input object"));
                        }
                        said.tools
                            .push((id.to_owned(), name.to_owned(), String::new()));
                        Block::Tool
                    }
                    Some("thinking") => Block::Thinking,
                    Some("redacted_thinking") => Block::Redacted,
                    _ => return Err(at("an unknown block type")),
                };
                open = Some((next, kind));
                next += 1;
                said.blocks += 1;
            }
            "content_block_delta" => {
                let Some((idx, kind)) = open else {
                    return Err(at("a delta with no block open"));
                };
                if index != Some(idx) {
                    return Err(at("a delta for a block that is not the open one"));
                }
                let d = &v["delta"];
                let s = |k: &str| d[k].as_str().map(str::to_owned);
                match (d["type"].as_str(), kind) {
                    (Some("text_delta"), Block::Text) => {
                        said.text.push_str(&s("text").ok_or_else(|| at("no text"))?)
                    }
                    (Some("input_json_delta"), Block::Tool) => {
                        let j = s("partial_json").ok_or_else(|| at("no partial_json"))?;
                        if let Some(t) = said.tools.last_mut() {
                            t.2.push_str(&j);
                        }
                    }
                    (Some("thinking_delta"), Block::Thinking) => said
                        .thinking
                        .push_str(&s("thinking").ok_or_else(|| at("no thinking"))?),
                    (Some("signature_delta"), Block::Thinking) => {}
                    _ => return Err(at("a delta of the wrong type for its block")),
                }
            }
            "content_block_stop" => match open {
                Some((idx, _)) if index == Some(idx) => open = None,
                _ => return Err(at("a stop for a block that is not open")),
            },
            "message_delta" => {
                if open.is_some() {
                    return Err(at("message_delta with a block open"));
                }
                if delta_seen {
                    return Err(at("a second message_delta"));
                }
                delta_seen = true;
                said.stop_reason = v["delta"]["stop_reason"].as_str().map(str::to_owned);
                if said.stop_reason.is_none() {
                    return Err(at("message_delta without a stop_reason"));
                }
                usage.overlay_anthropic(&v["usage"]);
                said.usage = Some(usage);
            }
            "message_stop" => {
                if !delta_seen {
                    return Err(at("message_stop before message_delta"));
                }
                ended = true;
            }
            _ => return Err(at("an unknown event")),
        }
    }
    if !ended {
        return Err("the stream ends without message_stop or error".into());
    }
    Ok(said)
}

/// Checks an OpenAI chat completions stream and says what it said.
pub fn openai_stream(bytes: &[u8]) -> Result<Said, String> {
    let mut said = Said::default();
    let mut first = true;
    let mut finished = false;
    let mut ended = false;
    for (i, f) in frames(bytes)?.into_iter().enumerate() {
        let at = |why: &str| format!("chunk {i}: {why}");
        if ended {
            return Err(at("a chunk after the end of the stream"));
        }
        if f.event.as_deref() == Some("error") {
            said.error = Some(serde_json::from_str(&f.data).map_err(|e| at(&e.to_string()))?);
            ended = true;
            continue;
        }
        if f.event.is_some() {
            return Err(at("an event name other than error"));
        }
        if f.data == "[DONE]" {
            if !finished {
                return Err(at("[DONE] before a finish_reason"));
            }
            ended = true;
            continue;
        }
        let v: Value = serde_json::from_str(&f.data).map_err(|e| at(&format!("not JSON: {e}")))?;
        if v["object"] != "chat.completion.chunk" {
            return Err(at("not a chat.completion.chunk"));
        }
        let choices = v["choices"].as_array().ok_or_else(|| at("no choices"))?;
        if choices.is_empty() {
            if !finished {
                return Err(at("a usage chunk before the finish_reason"));
            }
            said.usage = Some(Usage::from_openai(&v["usage"]));
            continue;
        }
        for c in choices {
            let d = &c["delta"];
            if first {
                if d["role"] != "assistant" {
                    return Err(at("the first delta has no role assistant"));
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
                        .ok_or_else(|| at("a tool call without index"))?
                        as usize;
                    let args = tc["function"]["arguments"].as_str().unwrap_or("");
                    if idx == said.tools.len() {
                        let id = tc["id"].as_str().unwrap_or("");
                        let name = tc["function"]["name"].as_str().unwrap_or("");
                        if id.is_empty() || name.is_empty() || tc["type"] != "function" {
                            return Err(at("a tool call's first delta without id, type or name"));
                        }
                        said.tools
                            .push((id.to_owned(), name.to_owned(), args.to_owned()));
                    } else if idx < said.tools.len() {
                        if tc.get("id").is_some() || tc["function"].get("name").is_some() {
                            return Err(at("a tool call started twice"));
                        }
                        said.tools[idx].2.push_str(args);
                    } else {
                        return Err(at("a tool call index that skips one"));
                    }
                }
            }
            if let Some(r) = c["finish_reason"].as_str() {
                if finished {
                    return Err(at("a second finish_reason"));
                }
                finished = true;
                said.stop_reason = Some(r.to_owned());
            }
        }
    }
    if !ended {
        return Err("the stream ends without [DONE] or error".into());
    }
    Ok(said)
}
