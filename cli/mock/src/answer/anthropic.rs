//! The same replies in Anthropic's Messages dialect (`Behavior::Anthropic`),
//! whole or as its SSE events.

use super::*;

/// The text of an Anthropic message's `content` (a string, or its text
/// blocks; a `tool_result`'s own content likewise).
pub(super) fn anthropic_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| match b.get("type").and_then(Value::as_str) {
                Some("text") => b.get("text").and_then(Value::as_str).map(str::to_owned),
                Some("tool_result") => Some(anthropic_text(b.get("content"))),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// [`Behavior::Anthropic`]'s reply to the request `json` (the `n`-th).
pub(super) fn anthropic_reply(json: Option<&Value>, n: u64) -> ChatReply {
    let messages = super::messages(json);
    let last = messages.last();
    let has_tool_result = last
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .is_some_and(|b| {
            b.iter()
                .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        });
    let text = anthropic_text(last.and_then(|m| m.get("content")));
    if has_tool_result {
        return ChatReply::Text(vec!["tool said: ".into(), text]);
    }
    let first_tool = json
        .and_then(|j| j.get("tools"))
        .and_then(Value::as_array)
        .and_then(|t| t.first())
        .and_then(|t| t.get("name"))
        .and_then(Value::as_str);
    if let Some(name) = first_tool {
        return ChatReply::Tool {
            id: format!("toolu_{n}"),
            name: name.to_owned(),
            arguments: json!({ "text": text }).to_string(),
        };
    }
    ChatReply::Text(vec!["echo: ".into(), text])
}

/// [`Behavior::Anthropic`]'s `message` answer.
pub(super) fn anthropic_answer(
    n: u64,
    model: &str,
    reply: &ChatReply,
    input_tokens: CacheUsage,
) -> Value {
    let (content, stop) = match reply {
        ChatReply::Text(pieces) => (
            json!([{"type": "text", "text": pieces.concat()}]),
            "end_turn",
        ),
        ChatReply::Tool {
            id,
            name,
            arguments,
        } => {
            let input: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
            (
                json!([{"type": "tool_use", "id": id, "name": name, "input": input}]),
                "tool_use",
            )
        }
    };
    json!({
        "id": format!("msg_{n}"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": {
            "input_tokens": input_tokens.input,
            "output_tokens": reply.tokens(),
            "cache_creation_input_tokens": input_tokens.cache_write,
            "cache_read_input_tokens": input_tokens.cache_read,
        },
    })
}

/// [`Behavior::Anthropic`]'s event stream.
pub(super) fn anthropic_frames(
    n: u64,
    model: &str,
    reply: &ChatReply,
    input_tokens: CacheUsage,
) -> VecDeque<(Duration, Bytes)> {
    let event = |name: &str, data: Value| {
        (
            Duration::ZERO,
            Bytes::from(format!("event: {name}\ndata: {data}\n\n")),
        )
    };
    let mut frames = VecDeque::new();
    frames.push_back(event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens.input, "output_tokens": 1,
                "cache_creation_input_tokens": input_tokens.cache_write,
                "cache_read_input_tokens": input_tokens.cache_read}}}),
    ));
    let delta = |delta: Value| {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        )
    };
    let stop = match reply {
        ChatReply::Text(pieces) => {
            frames.push_back(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            frames.push_back(event("ping", json!({"type": "ping"})));
            for p in pieces {
                frames.push_back(delta(json!({"type": "text_delta", "text": p})));
            }
            "end_turn"
        }
        ChatReply::Tool {
            id,
            name,
            arguments,
        } => {
            frames.push_back(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
            ));
            let half = arguments
                .char_indices()
                .nth(arguments.chars().count() / 2)
                .map_or(arguments.len(), |(i, _)| i);
            for piece in [&arguments[..half], &arguments[half..]] {
                frames.push_back(delta(
                    json!({"type": "input_json_delta", "partial_json": piece}),
                ));
            }
            "tool_use"
        }
    };
    frames.push_back(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    frames.push_back(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": reply.tokens()}}),
    ));
    frames.push_back(event("message_stop", json!({"type": "message_stop"})));
    frames
}
