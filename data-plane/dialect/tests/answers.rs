//! Unstreamed answers across dialects, and the stop reason tables.

#![allow(clippy::unwrap_used)]

use router_dialect::{
    anthropic, gemini, openai, parse_answer, write_answer, Dialect, DialectError, Part, StopReason,
    Usage,
};
use serde_json::{json, Value};

fn translate(from: Dialect, v: &Value, to: Dialect) -> Result<Value, DialectError> {
    let a = parse_answer(from, &serde_json::to_vec(v).unwrap())?;
    Ok(serde_json::from_slice(&write_answer(&a, to, 1_700_000_000)?).unwrap())
}

fn openai_answer() -> Value {
    json!({
        "id": "chatcmpl-9", "object": "chat.completion", "created": 1, "model": "qwen3",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null, "message": {
            "role": "assistant", "content": "Let me look.", "reasoning_content": "Need the file.",
            "tool_calls": [{"id": "call_a", "type": "function",
                "function": {"name": "Read", "arguments": "{\"path\": \"a.rs\"}"}}]
        }}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
            "prompt_tokens_details": {"cached_tokens": 800}}
    })
}

#[test]
fn an_openai_answer_becomes_an_anthropic_message() {
    let a = translate(Dialect::OpenAi, &openai_answer(), Dialect::Anthropic).unwrap();
    assert_eq!(
        a,
        json!({
            "id": "chatcmpl-9", "type": "message", "role": "assistant", "model": "qwen3",
            "content": [
                {"type": "thinking", "thinking": "Need the file.", "signature": ""},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_a", "name": "Read", "input": {"path": "a.rs"}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            // 1000 prompt tokens of which 800 cached: 200 + 800, not 1000 + 800.
            "usage": {"input_tokens": 200, "output_tokens": 50,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 800}
        })
    );
}

#[test]
fn an_anthropic_message_becomes_an_openai_completion() {
    let msg = json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "Plan.", "signature": "sig"},
            {"type": "text", "text": "Here."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 20, "cache_creation_input_tokens": 5,
            "cache_read_input_tokens": 100}
    });
    let o = translate(Dialect::Anthropic, &msg, Dialect::OpenAi).unwrap();
    assert_eq!(
        o,
        json!({
            "id": "msg_01", "object": "chat.completion", "created": 1_700_000_000u64,
            "model": "claude-sonnet-4-5",
            "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Here.", "reasoning_content": "Plan.",
                "tool_calls": [{"id": "toolu_1", "type": "function",
                    "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]
            }}],
            "usage": {"prompt_tokens": 115, "completion_tokens": 20, "total_tokens": 135,
                "prompt_tokens_details": {"cached_tokens": 100}}
        })
    );
}

#[test]
fn a_gemini_answer_becomes_both() {
    let g = json!({
        "candidates": [{"content": {"role": "model", "parts": [
            {"text": "thinking...", "thought": true},
            {"text": "It is sunny.", "thoughtSignature": "dGV4dA=="}
        ]}, "finishReason": "MAX_TOKENS", "index": 0}],
        "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 7, "thoughtsTokenCount": 3,
            "totalTokenCount": 60},
        "modelVersion": "gemini-2.5-flash", "responseId": "abc"
    });
    let a = translate(Dialect::Gemini, &g, Dialect::Anthropic).unwrap();
    assert_eq!(a["stop_reason"], "max_tokens");
    assert_eq!(
        a["content"][1],
        json!({"type": "text", "text": "It is sunny."})
    );
    assert_eq!(a["content"][0]["thinking"], "thinking...");
    // A Gemini signature never appears as an Anthropic one.
    assert_eq!(a["content"][0]["signature"], "");
    assert_eq!(a["usage"]["output_tokens"], 10);
    let o = translate(Dialect::Gemini, &g, Dialect::OpenAi).unwrap();
    assert_eq!(o["choices"][0]["finish_reason"], "length");
    assert_eq!(o["choices"][0]["message"]["content"], "It is sunny.");
    assert_eq!(o["usage"]["total_tokens"], 60);
    // And Gemini to Gemini: the same parts and counts.
    let back = translate(Dialect::Gemini, &g, Dialect::Gemini).unwrap();
    assert_eq!(back["candidates"][0]["finishReason"], "MAX_TOKENS");
    assert_eq!(back["usageMetadata"]["totalTokenCount"], 60);
}

#[test]
fn a_gemini_prompt_blocked_before_any_candidate_is_an_empty_refusal() {
    let g = json!({"promptFeedback": {"blockReason": "SAFETY"},
        "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9}, "responseId": "r"});
    let a = parse_answer(Dialect::Gemini, &serde_json::to_vec(&g).unwrap()).unwrap();
    assert_eq!(a.stop_reason, StopReason::Refusal);
    assert!(a.content.is_empty());
    assert_eq!(a.usage.input, 9);
    let o = translate(Dialect::Gemini, &g, Dialect::OpenAi).unwrap();
    assert_eq!(o["choices"][0]["finish_reason"], "content_filter");
}

#[test]
fn tool_arguments_that_are_not_an_object_refuse_an_anthropic_answer() {
    let mut v = openai_answer();
    v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = json!("{\"path\": ");
    assert!(matches!(
        translate(Dialect::OpenAi, &v, Dialect::Anthropic),
        Err(DialectError::Invalid { .. })
    ));
    // OpenAI clients get them as they came.
    let o = translate(Dialect::OpenAi, &v, Dialect::OpenAi).unwrap();
    assert_eq!(
        o["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"path\": "
    );
}

#[test]
fn content_an_answer_dialect_cannot_carry_is_refused() {
    let g = json!({"candidates": [{"content": {"role": "model", "parts": [
        {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}, "finishReason": "STOP"}]});
    for to in [Dialect::Anthropic, Dialect::OpenAi] {
        assert!(matches!(
            translate(Dialect::Gemini, &g, to),
            Err(DialectError::CannotCarry(_))
        ));
    }
}

#[test]
fn stop_reasons_map_both_ways() {
    // OpenAI finish_reason -> neutral -> Anthropic stop_reason.
    for (finish, stop) in [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
    ] {
        assert_eq!(anthropic::stop_to(openai::stop_from(finish)), stop);
    }
    // Anthropic stop_reason -> neutral -> OpenAI finish_reason.
    for (stop, finish) in [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("pause_turn", "stop"),
        ("refusal", "content_filter"),
        ("model_context_window_exceeded", "length"),
    ] {
        assert_eq!(openai::stop_to(anthropic::stop_from(stop)), finish);
        // Anthropic to Anthropic is exact.
        assert_eq!(anthropic::stop_to(anthropic::stop_from(stop)), stop);
    }
    // Gemini finishReason -> neutral.
    for (reason, called, neutral) in [
        ("STOP", false, StopReason::EndTurn),
        ("STOP", true, StopReason::ToolUse),
        ("MAX_TOKENS", false, StopReason::MaxTokens),
        ("SAFETY", false, StopReason::Refusal),
        ("RECITATION", false, StopReason::Refusal),
        ("PROHIBITED_CONTENT", false, StopReason::Refusal),
        ("BLOCKLIST", false, StopReason::Refusal),
        ("SPII", false, StopReason::Refusal),
        ("LANGUAGE", false, StopReason::Refusal),
        ("IMAGE_SAFETY", false, StopReason::Refusal),
        ("MALFORMED_FUNCTION_CALL", false, StopReason::ToolError),
        ("UNEXPECTED_TOOL_CALL", false, StopReason::ToolError),
        ("TOO_MANY_TOOL_CALLS", false, StopReason::ToolError),
        ("OTHER", false, StopReason::Other),
        ("FINISH_REASON_UNSPECIFIED", false, StopReason::Other),
    ] {
        assert_eq!(gemini::stop_from(reason, called), neutral, "{reason}");
    }
    // Neutral -> each dialect, the rows of docs/dialects.md.
    for (neutral, o, a, g) in [
        (StopReason::EndTurn, "stop", "end_turn", "STOP"),
        (StopReason::MaxTokens, "length", "max_tokens", "MAX_TOKENS"),
        (StopReason::StopSequence, "stop", "stop_sequence", "STOP"),
        (StopReason::ToolUse, "tool_calls", "tool_use", "STOP"),
        (StopReason::Refusal, "content_filter", "refusal", "SAFETY"),
        (
            StopReason::ToolError,
            "stop",
            "end_turn",
            "MALFORMED_FUNCTION_CALL",
        ),
        (
            StopReason::ContextWindow,
            "length",
            "model_context_window_exceeded",
            "MAX_TOKENS",
        ),
        (StopReason::PauseTurn, "stop", "pause_turn", "STOP"),
    ] {
        assert_eq!(
            (
                openai::stop_to(neutral),
                anthropic::stop_to(neutral),
                gemini::stop_to(neutral)
            ),
            (o, a, g),
            "{neutral:?}"
        );
    }
    assert_eq!(gemini::stop_to(StopReason::ToolUse), "STOP");
    assert_eq!(gemini::stop_to(StopReason::Refusal), "SAFETY");
    assert_eq!(openai::stop_to(StopReason::ToolError), "stop");
    assert_eq!(anthropic::stop_to(StopReason::Other), "end_turn");
}

#[test]
fn an_anthropic_stop_sequence_is_kept_for_anthropic_clients() {
    let msg = json!({"id": "m", "type": "message", "role": "assistant", "model": "c",
        "content": [{"type": "text", "text": "a"}], "stop_reason": "stop_sequence",
        "stop_sequence": "END", "usage": {"input_tokens": 1, "output_tokens": 1}});
    let a = translate(Dialect::Anthropic, &msg, Dialect::Anthropic).unwrap();
    assert_eq!(a["stop_sequence"], "END");
    assert_eq!(a["stop_reason"], "stop_sequence");
}

#[test]
fn answers_parse_into_the_neutral_model() {
    let a = parse_answer(
        Dialect::OpenAi,
        &serde_json::to_vec(&openai_answer()).unwrap(),
    )
    .unwrap();
    assert_eq!(a.stop_reason, StopReason::ToolUse);
    assert_eq!(
        a.usage,
        Usage {
            input: 200,
            output: 50,
            cache_read: 800,
            cache_write: 0
        }
    );
    assert!(
        matches!(&a.content[2], Part::ToolUse { input, .. } if input == "{\"path\": \"a.rs\"}")
    );
    assert!(parse_answer(Dialect::OpenAi, br#"{"choices": []}"#).is_err());
}
