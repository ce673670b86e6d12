//! Neutral [`Event`]s to the client's stream, one encoder per dialect.

use std::io::Write as _;

use serde_json::{json, Value};

use super::{Event, Failure, StreamOptions, MAX_TOOL_CALLS};
use crate::errors::{stream_event, ErrorKind};
use crate::{anthropic, openai, Dialect, DialectError, StopReason, Usage};

/// An encoder of one dialect's stream.
#[derive(Debug)]
pub struct Encoder {
    dialect: Dialect,
    id: String,
    model: Option<String>,
    created: u64,
    include_usage: bool,
    started: bool,
    finished: bool,
    failed: bool,
    usage: Usage,
    stop: Option<(StopReason, Option<String>)>,
    /// Anthropic: the open block and the next block index.
    open: Open,
    next_index: u64,
    /// Tool calls by key: (key, OpenAI index or `closed` for Anthropic).
    tools: Vec<(u64, bool)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Text,
    Thinking,
    Tool(u64),
}

/// A JSON string (quoted and escaped).
fn json_str(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn sse(out: &mut Vec<u8>, event: Option<&str>, data: &Value) {
    if let Some(e) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    // Writing a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, data);
    out.extend_from_slice(b"\n\n");
}

impl Encoder {
    /// An encoder of `dialect`'s stream (OpenAI or Anthropic).
    pub fn new(dialect: Dialect, opts: &StreamOptions) -> Result<Self, DialectError> {
        if dialect == Dialect::Gemini {
            return Err(DialectError::Unsupported(
                "streams are written in OpenAI's or Anthropic's dialect",
            ));
        }
        Ok(Self {
            dialect,
            id: opts.id.clone(),
            model: opts.model.clone(),
            created: opts.created,
            include_usage: opts.include_usage,
            started: false,
            finished: false,
            failed: false,
            usage: Usage::default(),
            stop: None,
            open: Open::None,
            next_index: 0,
            tools: Vec::new(),
        })
    }

    /// The encoder ended the stream with an error event.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Encodes one event, appending the client's bytes to `out`.
    pub fn encode(&mut self, ev: Event, out: &mut Vec<u8>) {
        if self.finished {
            return;
        }
        match ev {
            Event::Start { id, model } => {
                if !self.started {
                    if !id.is_empty() {
                        self.id = id;
                    }
                    if self.model.is_none() && !model.is_empty() {
                        self.model = Some(model);
                    }
                }
            }
            Event::Usage(u) => self.usage = u,
            Event::Failed(f) => self.error(f, out),
            Event::Stop { reason, sequence } => {
                self.ensure_started(out);
                self.close(out);
                if self.dialect == Dialect::OpenAi && self.stop.is_none() {
                    self.chunk(out, json!({}), Some(openai::stop_to(reason)));
                }
                self.stop.get_or_insert((reason, sequence));
            }
            Event::End => self.end(out),
            ev => {
                self.ensure_started(out);
                match self.dialect {
                    Dialect::Anthropic => self.anthropic(ev, out),
                    _ => self.openai(ev, out),
                }
            }
        }
    }

    fn error(&mut self, f: Failure, out: &mut Vec<u8>) {
        out.extend_from_slice(&stream_event(
            self.dialect,
            f.kind,
            f.overloaded,
            &f.message,
        ));
        self.finished = true;
        self.failed = true;
    }

    fn model(&self) -> &str {
        self.model.as_deref().unwrap_or("")
    }

    fn ensure_started(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        match self.dialect {
            Dialect::Anthropic => {
                let start = json!({
                    "type": "message_start",
                    "message": {
                        "id": self.id,
                        "type": "message",
                        "role": "assistant",
                        "model": self.model(),
                        "content": [],
                        "stop_reason": null,
                        "stop_sequence": null,
                        "usage": self.usage.to_anthropic(),
                    },
                });
                sse(out, Some("message_start"), &start);
            }
            _ => self.chunk(out, json!({"role": "assistant", "content": ""}), None),
        }
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        self.ensure_started(out);
        self.close(out);
        let (reason, sequence) = self.stop.clone().unwrap_or((StopReason::EndTurn, None));
        match self.dialect {
            Dialect::Anthropic => {
                let delta = json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": anthropic::stop_to(reason), "stop_sequence": sequence},
                    "usage": self.usage.to_anthropic(),
                });
                sse(out, Some("message_delta"), &delta);
                sse(out, Some("message_stop"), &json!({"type": "message_stop"}));
            }
            _ => {
                if self.stop.is_none() {
                    self.chunk(out, json!({}), Some(openai::stop_to(reason)));
                }
                if self.include_usage {
                    let chunk = json!({
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model(),
                        "choices": [],
                        "usage": self.usage.to_openai(),
                    });
                    sse(out, None, &chunk);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
        }
        self.finished = true;
    }

    /// One OpenAI chunk, written directly (no JSON tree is built for the
    /// chunks that carry text).
    fn chunk_with(
        &self,
        out: &mut Vec<u8>,
        delta: impl FnOnce(&mut Vec<u8>),
        finish: Option<&str>,
    ) {
        out.extend_from_slice(b"data: {\"id\":");
        json_str(out, &self.id);
        out.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        let _ = write!(out, "{}", self.created);
        out.extend_from_slice(b",\"model\":");
        json_str(out, self.model());
        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":");
        delta(out);
        out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":");
        match finish {
            Some(f) => json_str(out, f),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b"}]}\n\n");
    }

    fn chunk(&self, out: &mut Vec<u8>, delta: Value, finish: Option<&str>) {
        self.chunk_with(
            out,
            |out| {
                let _ = serde_json::to_writer(&mut *out, &delta);
            },
            finish,
        );
    }

    /// A chunk whose delta is `{key: text}`.
    fn text_chunk(&self, out: &mut Vec<u8>, key: &str, text: &str) {
        self.chunk_with(
            out,
            |out| {
                out.push(b'{');
                json_str(out, key);
                out.push(b':');
                json_str(out, text);
                out.push(b'}');
            },
            None,
        );
    }

    fn openai(&mut self, ev: Event, out: &mut Vec<u8>) {
        match ev {
            Event::Text(t) if !t.is_empty() => self.text_chunk(out, "content", &t),
            Event::Thinking(t) if !t.is_empty() => self.text_chunk(out, "reasoning_content", &t),
            Event::ToolStart { key, id, name } => {
                if self.tools.iter().any(|t| t.0 == key) {
                    return;
                }
                if self.tools.len() >= MAX_TOOL_CALLS {
                    return self.error(
                        Failure::new(
                            ErrorKind::StreamError,
                            format!("more than {MAX_TOOL_CALLS} tool calls in one answer"),
                        ),
                        out,
                    );
                }
                let index = self.tools.len();
                self.tools.push((key, false));
                self.chunk(
                    out,
                    json!({"tool_calls": [{
                        "index": index,
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }]}),
                    None,
                );
            }
            Event::ToolArgs { key, json } => {
                let Some(index) = self.tools.iter().position(|t| t.0 == key) else {
                    return self.error(
                        Failure::new(
                            ErrorKind::StreamError,
                            "the upstream sent arguments for a tool call that never started",
                        ),
                        out,
                    );
                };
                if !json.is_empty() {
                    self.chunk(
                        out,
                        json!({"tool_calls": [{"index": index, "function": {"arguments": json}}]}),
                        None,
                    );
                }
            }
            // Signatures and redacted thinking have no OpenAI reader:
            // dropped on purpose. Block ends have no OpenAI event.
            _ => {}
        }
    }

    fn open_block(&mut self, block: Value, open: Open, out: &mut Vec<u8>) {
        self.close(out);
        let start = json!({"type": "content_block_start", "index": self.next_index, "content_block": block});
        sse(out, Some("content_block_start"), &start);
        self.open = open;
    }

    /// A `content_block_delta` of type `ty` carrying `value` as `key`,
    /// written directly.
    fn delta(&self, ty: &str, key: &str, value: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
        );
        let _ = write!(out, "{}", self.next_index);
        out.extend_from_slice(b",\"delta\":{\"type\":");
        json_str(out, ty);
        out.push(b',');
        json_str(out, key);
        out.push(b':');
        json_str(out, value);
        out.extend_from_slice(b"}}\n\n");
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if self.dialect != Dialect::Anthropic || self.open == Open::None {
            return;
        }
        if let Open::Tool(key) = self.open {
            if let Some(t) = self.tools.iter_mut().find(|t| t.0 == key) {
                t.1 = true;
            }
        }
        sse(
            out,
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": self.next_index}),
        );
        self.next_index += 1;
        self.open = Open::None;
    }

    fn anthropic(&mut self, ev: Event, out: &mut Vec<u8>) {
        match ev {
            Event::Text(t) => {
                if t.is_empty() {
                    return;
                }
                if self.open != Open::Text {
                    self.open_block(json!({"type": "text", "text": ""}), Open::Text, out);
                }
                self.delta("text_delta", "text", &t, out);
            }
            Event::Thinking(t) => {
                if self.open != Open::Thinking {
                    self.open_block(
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        Open::Thinking,
                        out,
                    );
                }
                if !t.is_empty() {
                    self.delta("thinking_delta", "thinking", &t, out);
                }
            }
            Event::Signature(s) => {
                if self.open != Open::Thinking {
                    self.open_block(
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        Open::Thinking,
                        out,
                    );
                }
                if !s.is_empty() {
                    self.delta("signature_delta", "signature", &s, out);
                }
            }
            Event::RedactedThinking(data) => {
                self.open_block(
                    json!({"type": "redacted_thinking", "data": data}),
                    Open::Thinking,
                    out,
                );
                self.close(out);
            }
            Event::ToolStart { key, id, name } => {
                if self.open == Open::Tool(key) {
                    return;
                }
                if self.tools.iter().any(|t| t.0 == key) {
                    return self.error(
                        Failure::new(
                            ErrorKind::StreamError,
                            "the upstream started a tool call twice",
                        ),
                        out,
                    );
                }
                if self.tools.len() >= MAX_TOOL_CALLS {
                    return self.error(
                        Failure::new(
                            ErrorKind::StreamError,
                            format!("more than {MAX_TOOL_CALLS} tool calls in one answer"),
                        ),
                        out,
                    );
                }
                self.tools.push((key, false));
                self.open_block(
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    Open::Tool(key),
                    out,
                );
            }
            Event::ToolArgs { key, json } => {
                if self.open != Open::Tool(key) {
                    let why = if self.tools.iter().any(|t| t.0 == key) {
                        "the upstream interleaved the arguments of parallel tool calls, which Anthropic events cannot carry"
                    } else {
                        "the upstream sent arguments for a tool call that never started"
                    };
                    return self.error(Failure::new(ErrorKind::StreamError, why), out);
                }
                if !json.is_empty() {
                    self.delta("input_json_delta", "partial_json", &json, out);
                }
            }
            Event::BlockEnd => self.close(out),
            _ => {}
        }
    }
}
