//! `Behavior::Chat`'s answers in OpenAI's dialect: what to reply to the
//! request read (text, or a call of the tool it offers), whole or streamed.

use super::*;

/// What [`Behavior::Chat`] answers to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ChatReply {
    /// Text, in pieces (a stream sends one per chunk).
    Text(Vec<String>),
    /// A call of this tool with these arguments (JSON text), and its id.
    Tool {
        id: String,
        name: String,
        arguments: String,
    },
}

impl ChatReply {
    /// Completion tokens: one per piece.
    pub(super) fn tokens(&self) -> u64 {
        match self {
            Self::Text(pieces) => pieces.len() as u64,
            Self::Tool { .. } => 3,
        }
    }
}

/// The text of an OpenAI message's `content` (a string, or text parts).
pub(super) fn message_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// [`Behavior::Chat`]'s reply to the request `json` (the `n`-th).
pub(super) fn chat_reply(json: Option<&Value>, n: u64) -> ChatReply {
    let messages = super::messages(json);
    let last = messages.last();
    pub(super) fn role(m: Option<&Value>) -> Option<&str> {
        m.and_then(|m| m.get("role")).and_then(Value::as_str)
    }
    if role(last) == Some("tool") {
        let result = last.map(message_text).unwrap_or_default();
        return ChatReply::Text(vec!["tool said: ".into(), result]);
    }
    let user_text = messages
        .iter()
        .rev()
        .find(|m| role(Some(m)) == Some("user"))
        .map(message_text)
        .unwrap_or_default();
    let first_tool = json
        .and_then(|j| j.get("tools"))
        .and_then(Value::as_array)
        .and_then(|t| t.first())
        .and_then(|t| t.get("function"))
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str);
    if let Some(name) = first_tool {
        return ChatReply::Tool {
            id: format!("call_{n}"),
            name: name.to_owned(),
            arguments: json!({ "text": user_text }).to_string(),
        };
    }
    ChatReply::Text(vec!["echo: ".into(), user_text])
}

/// [`Behavior::Chat`]'s JSON answer.
pub(super) fn chat_answer(
    id: &str,
    model: &str,
    served_by: &str,
    reply: &ChatReply,
    prompt_tokens: u64,
) -> Value {
    let (message, finish) = match reply {
        ChatReply::Text(pieces) => (
            json!({"role": "assistant", "content": pieces.concat()}),
            "stop",
        ),
        ChatReply::Tool {
            id,
            name,
            arguments,
        } => (
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": id, "type": "function",
                "function": {"name": name, "arguments": arguments},
            }]}),
            "tool_calls",
        ),
    };
    let completion = reply.tokens();
    json!({
        "id": id,
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "served_by": served_by,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    })
}

/// [`Behavior::Chat`]'s stream: a role chunk, one chunk per piece (a
/// tool call: its head, then its arguments in two pieces), the
/// `finish_reason` chunk, the usage chunk when asked, `data: [DONE]`.
pub(super) fn chat_frames(
    id: &str,
    model: &str,
    reply: &ChatReply,
    asks_usage: bool,
    prompt_tokens: u64,
) -> VecDeque<(Duration, Bytes)> {
    let chunk = |delta: Value, finish: Value| {
        let event = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        (Duration::ZERO, Bytes::from(format!("data: {event}\n\n")))
    };
    let mut frames = VecDeque::new();
    frames.push_back(chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    ));
    let finish = match reply {
        ChatReply::Text(pieces) => {
            for p in pieces {
                frames.push_back(chunk(json!({ "content": p }), Value::Null));
            }
            "stop"
        }
        ChatReply::Tool {
            id,
            name,
            arguments,
        } => {
            frames.push_back(chunk(
                json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]}),
                Value::Null,
            ));
            let half = arguments
                .char_indices()
                .nth(arguments.chars().count() / 2)
                .map_or(arguments.len(), |(i, _)| i);
            for piece in [&arguments[..half], &arguments[half..]] {
                frames.push_back(chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    Value::Null,
                ));
            }
            "tool_calls"
        }
    };
    frames.push_back(chunk(json!({}), json!(finish)));
    if asks_usage {
        let completion = reply.tokens();
        let event = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            },
        });
        frames.push_back((Duration::ZERO, Bytes::from(format!("data: {event}\n\n"))));
    }
    frames.push_back((Duration::ZERO, Bytes::from_static(b"data: [DONE]\n\n")));
    frames
}
