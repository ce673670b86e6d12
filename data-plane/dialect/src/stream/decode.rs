//! Upstream stream events to neutral [`Event`]s, one decoder per dialect.

use std::borrow::Cow;

use serde_json::Value;

use super::chunk::{Chunk, Delta};
use super::{Event, Failure, StreamOptions, MAX_TOOL_CALLS};
use crate::errors::ErrorKind;
use crate::sse::SseFrame;
use crate::{anthropic, gemini, openai, Dialect, Part, StopReason, Usage};

/// A decoder of one dialect's stream.
#[derive(Debug)]
pub struct Decoder {
    dialect: Dialect,
    id: String,
    started: bool,
    stopped: bool,
    ended: bool,
    max_held: usize,
    /// OpenAI: tool calls by index: (index, started, arguments held until
    /// the name arrives).
    tools: Vec<(u64, bool, String)>,
    /// Anthropic: the usage so far (message_start, then message_delta's
    /// cumulative counts laid over it).
    usage: Usage,
    /// Gemini: function calls so far.
    calls: usize,
}

fn message_of(v: &Value) -> String {
    let e = v.get("error").unwrap_or(v);
    match e.get("message").and_then(Value::as_str) {
        Some(m) => m.to_owned(),
        None => match e {
            Value::String(s) => s.clone(),
            _ => "the upstream reported an error in its stream".to_owned(),
        },
    }
}

impl Decoder {
    /// A decoder of `dialect`'s stream.
    pub fn new(dialect: Dialect, opts: &StreamOptions) -> Self {
        Self {
            dialect,
            id: opts.id.clone(),
            started: false,
            stopped: false,
            ended: false,
            max_held: opts.max_event_bytes,
            tools: Vec::new(),
            usage: Usage::default(),
            calls: 0,
        }
    }

    /// Decodes one upstream event into `out`.
    pub fn decode(&mut self, frame: &SseFrame, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        let n = out.len();
        match self.dialect {
            Dialect::OpenAi => self.openai(frame, out),
            Dialect::Anthropic => self.anthropic(frame, out),
            Dialect::Gemini => self.gemini(frame, out),
        }
        if out[n..]
            .iter()
            .any(|e| matches!(e, Event::End | Event::Failed(_)))
        {
            self.ended = true;
        }
    }

    /// The upstream's bytes ended (`cut`: in the middle of an event).
    pub fn finish(&mut self, cut: bool, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        self.ended = true;
        // OpenAI without `[DONE]` and Gemini (which has no end marker) are
        // complete once they said why they stopped.
        if !cut && self.stopped && self.dialect != Dialect::Anthropic {
            out.push(Event::End);
        } else {
            out.push(Event::Failed(Failure::new(
                ErrorKind::UpstreamReset,
                "the upstream's stream ended before the answer did",
            )));
        }
    }

    fn fail(&mut self, out: &mut Vec<Event>, kind: ErrorKind, message: impl Into<String>) {
        out.push(Event::Failed(Failure::new(kind, message)));
    }

    fn json(&mut self, frame: &SseFrame, out: &mut Vec<Event>) -> Option<Value> {
        match serde_json::from_str::<Value>(&frame.data) {
            Ok(v) => Some(v),
            Err(e) => {
                self.fail(
                    out,
                    ErrorKind::MalformedJson,
                    format!("an event of the upstream's stream is not JSON: {e}"),
                );
                None
            }
        }
    }

    fn upstream_error(&mut self, v: &Value, out: &mut Vec<Event>) {
        let mut f = Failure::new(ErrorKind::StreamError, message_of(v));
        let ty = v
            .get("error")
            .and_then(|e| e.get("type").or_else(|| e.get("status")))
            .and_then(Value::as_str);
        f.overloaded = matches!(ty, Some("overloaded_error" | "UNAVAILABLE"))
            || v.get("error")
                .and_then(|e| e.get("code"))
                .and_then(Value::as_u64)
                .is_some_and(|c| c == 503 || c == 529);
        out.push(Event::Failed(f));
    }

    fn start(&mut self, v: &Value, id_key: &str, model_key: &str, out: &mut Vec<Event>) {
        self.start_with(
            v.get(id_key).and_then(Value::as_str),
            v.get(model_key).and_then(Value::as_str),
            out,
        );
    }

    fn start_with(&mut self, id: Option<&str>, model: Option<&str>, out: &mut Vec<Event>) {
        if self.started {
            return;
        }
        self.started = true;
        if let Some(id) = id.filter(|s| !s.is_empty()) {
            id.clone_into(&mut self.id);
        }
        out.push(Event::Start {
            id: self.id.clone(),
            model: model.unwrap_or_default().to_owned(),
        });
    }

    fn openai(&mut self, frame: &SseFrame, out: &mut Vec<Event>) {
        if frame.data.trim() == "[DONE]" {
            out.push(Event::End);
            return;
        }
        if frame.event.as_deref() == Some("error") {
            if let Some(v) = self.json(frame, out) {
                self.upstream_error(&v, out);
            }
            return;
        }
        let c = match serde_json::from_str::<Chunk<'_>>(&frame.data) {
            Ok(c) => c,
            Err(e) => {
                return self.fail(
                    out,
                    ErrorKind::MalformedJson,
                    format!("an event of the upstream's stream is not a chunk: {e}"),
                )
            }
        };
        if let Some(e) = c.error.filter(|e| !e.is_null()) {
            return self.upstream_error(&serde_json::json!({ "error": e }), out);
        }
        self.start_with(c.id.0.as_deref(), c.model.0.as_deref(), out);
        for choice in c.choices.unwrap_or_default() {
            if choice.index.0.unwrap_or(0) != 0 {
                return self.fail(
                    out,
                    ErrorKind::StreamError,
                    "the upstream streamed several choices; one is carried",
                );
            }
            if let Some(d) = choice.delta {
                if !self.openai_delta(d, out) {
                    return;
                }
            }
            if let Some(r) = choice.finish_reason.0 {
                if let Some(held) = self.tools.iter().find(|t| !t.1) {
                    let idx = held.0;
                    return self.fail(
                        out,
                        ErrorKind::StreamError,
                        format!("tool call {idx} of the upstream's stream has no name"),
                    );
                }
                self.stopped = true;
                out.push(Event::Stop {
                    reason: openai::stop_from(&r),
                    sequence: None,
                });
            }
        }
        if let Some(u) = c.usage.filter(Value::is_object) {
            out.push(Event::Usage(Usage::from_openai(&u)));
        }
    }

    /// False when the stream failed.
    fn openai_delta(&mut self, d: Delta<'_>, out: &mut Vec<Event>) -> bool {
        if let Some(t) = d.reasoning_content.0.or(d.reasoning.0) {
            if !t.is_empty() {
                out.push(Event::Thinking(t.into_owned()));
            }
        }
        for t in [d.content.0, d.refusal.0].into_iter().flatten() {
            if !t.is_empty() {
                out.push(Event::Text(t.into_owned()));
            }
        }
        for (pos, tc) in d.tool_calls.unwrap_or_default().into_iter().enumerate() {
            let index = tc.index.0.unwrap_or(pos as u64);
            let (name, args) = match tc.function {
                Some(f) => (f.name.0, f.arguments.0.unwrap_or_default()),
                None => (None, Cow::Borrowed("")),
            };
            let slot = match self.tools.iter().position(|t| t.0 == index) {
                Some(i) => i,
                None => {
                    if self.tools.len() >= MAX_TOOL_CALLS {
                        self.fail(
                            out,
                            ErrorKind::StreamError,
                            format!("more than {MAX_TOOL_CALLS} tool calls in one answer"),
                        );
                        return false;
                    }
                    self.tools.push((index, false, String::new()));
                    self.tools.len() - 1
                }
            };
            if !self.tools[slot].1 {
                match name.filter(|n| !n.is_empty()) {
                    Some(name) => {
                        let id = tc
                            .id
                            .0
                            .filter(|s| !s.is_empty())
                            .map(Cow::into_owned)
                            .unwrap_or_else(|| format!("call_{}_{index}", self.id));
                        self.tools[slot].1 = true;
                        out.push(Event::ToolStart {
                            key: index,
                            id,
                            name: name.into_owned(),
                        });
                        let held = std::mem::take(&mut self.tools[slot].2);
                        if !held.is_empty() {
                            out.push(Event::ToolArgs {
                                key: index,
                                json: held,
                            });
                        }
                    }
                    None => {
                        let held: usize = self.tools.iter().map(|t| t.2.len()).sum();
                        if held + args.len() > self.max_held {
                            self.fail(
                                out,
                                ErrorKind::StreamError,
                                "arguments of a tool call without a name exceed the event limit",
                            );
                            return false;
                        }
                        self.tools[slot].2.push_str(&args);
                        continue;
                    }
                }
            }
            if !args.is_empty() {
                out.push(Event::ToolArgs {
                    key: index,
                    json: args.into_owned(),
                });
            }
        }
        true
    }

    fn anthropic(&mut self, frame: &SseFrame, out: &mut Vec<Event>) {
        let Some(v) = self.json(frame, out) else {
            return;
        };
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .or(frame.event.as_deref())
            .unwrap_or("");
        match ty {
            "message_start" => {
                let m = v.get("message").cloned().unwrap_or(Value::Null);
                self.start(&m, "id", "model", out);
                if let Some(u) = m.get("usage") {
                    self.usage = Usage::from_anthropic(u);
                    out.push(Event::Usage(self.usage));
                }
            }
            "content_block_start" => {
                let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                let b = v.get("content_block").cloned().unwrap_or(Value::Null);
                let text = |k: &str| b.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                match b.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text" => {
                        let t = text("text");
                        if !t.is_empty() {
                            out.push(Event::Text(t));
                        }
                    }
                    "tool_use" => {
                        out.push(Event::ToolStart {
                            key: index,
                            id: text("id"),
                            name: text("name"),
                        });
                        if let Some(i) = b.get("input").filter(|i| i.as_object().is_some_and(|o| !o.is_empty())) {
                            out.push(Event::ToolArgs {
                                key: index,
                                json: i.to_string(),
                            });
                        }
                    }
                    "thinking" => {
                        let t = text("thinking");
                        let s = text("signature");
                        // An empty thinking block still opens one.
                        out.push(Event::Thinking(t));
                        if !s.is_empty() {
                            out.push(Event::Signature(s));
                        }
                    }
                    "redacted_thinking" => out.push(Event::RedactedThinking(text("data"))),
                    other => self.fail(
                        out,
                        ErrorKind::StreamError,
                        format!("the upstream sent a `{other}` content block, which the client's dialect cannot carry"),
                    ),
                }
            }
            "content_block_delta" => {
                let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                let d = v.get("delta").cloned().unwrap_or(Value::Null);
                let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                match d.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text_delta" => out.push(Event::Text(s("text"))),
                    "input_json_delta" => out.push(Event::ToolArgs {
                        key: index,
                        json: s("partial_json"),
                    }),
                    "thinking_delta" => out.push(Event::Thinking(s("thinking"))),
                    "signature_delta" => out.push(Event::Signature(s("signature"))),
                    "citations_delta" => {}
                    other => self.fail(
                        out,
                        ErrorKind::StreamError,
                        format!("the upstream sent a `{other}` delta, which the client's dialect cannot carry"),
                    ),
                }
            }
            "content_block_stop" => out.push(Event::BlockEnd),
            "message_delta" => {
                if let Some(u) = v.get("usage") {
                    self.usage.overlay_anthropic(u);
                    out.push(Event::Usage(self.usage));
                }
                let d = v.get("delta");
                if let Some(r) = d.and_then(|d| d.get("stop_reason")).and_then(Value::as_str) {
                    self.stopped = true;
                    out.push(Event::Stop {
                        reason: anthropic::stop_from(r),
                        sequence: d
                            .and_then(|d| d.get("stop_sequence"))
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    });
                }
            }
            "message_stop" => out.push(Event::End),
            "ping" => {}
            "error" => self.upstream_error(&v, out),
            other => self.fail(
                out,
                ErrorKind::StreamError,
                format!("the upstream sent a `{other}` event, which this router does not know"),
            ),
        }
    }

    fn gemini(&mut self, frame: &SseFrame, out: &mut Vec<Event>) {
        let Some(v) = self.json(frame, out) else {
            return;
        };
        if v.get("error").is_some_and(|e| !e.is_null()) {
            self.upstream_error(&v, out);
            return;
        }
        self.start(&v, "responseId", "modelVersion", out);
        let candidate = v
            .get("candidates")
            .and_then(Value::as_array)
            .and_then(|c| c.first());
        if let Some(c) = candidate {
            if let Some(parts) = c
                .get("content")
                .and_then(|c| c.get("parts"))
                .and_then(Value::as_array)
            {
                let mut key = self.calls as u64;
                let parts = match gemini::answer_parts(parts, &self.id, &mut self.calls) {
                    Ok(p) => p,
                    Err(e) => {
                        self.fail(out, ErrorKind::StreamError, e.to_string());
                        return;
                    }
                };
                if self.calls > MAX_TOOL_CALLS {
                    self.fail(
                        out,
                        ErrorKind::StreamError,
                        format!("more than {MAX_TOOL_CALLS} tool calls in one answer"),
                    );
                    return;
                }
                for p in parts {
                    match p {
                        Part::Text { text, .. } => {
                            if !text.is_empty() {
                                out.push(Event::Text(text));
                            }
                        }
                        Part::Thinking { text, .. } => out.push(Event::Thinking(text)),
                        Part::ToolUse {
                            id, name, input, ..
                        } => {
                            out.push(Event::ToolStart { key, id, name });
                            out.push(Event::ToolArgs { key, json: input });
                            out.push(Event::BlockEnd);
                            key += 1;
                        }
                        _ => {
                            self.fail(
                                out,
                                ErrorKind::StreamError,
                                "the upstream streamed content (an image, a code part) the client's dialect cannot carry",
                            );
                            return;
                        }
                    }
                }
            }
        }
        if let Some(u) = v.get("usageMetadata") {
            out.push(Event::Usage(Usage::from_gemini(u)));
        }
        let reason = candidate
            .and_then(|c| c.get("finishReason"))
            .and_then(Value::as_str);
        if let Some(r) = reason {
            self.stopped = true;
            out.push(Event::Stop {
                reason: gemini::stop_from(r, self.calls > 0),
                sequence: None,
            });
        } else if candidate.is_none()
            && v.get("promptFeedback")
                .and_then(|f| f.get("blockReason"))
                .is_some()
        {
            self.stopped = true;
            out.push(Event::Stop {
                reason: StopReason::Refusal,
                sequence: None,
            });
        }
    }
}
