//! Cheap fuzzing: arbitrary bytes, arbitrary JSON and mutated real
//! payloads never panic the parsers, writers or stream translators.

#![allow(clippy::unwrap_used)]

use proptest::collection::vec;
use proptest::prelude::*;
use router_dialect::sse::SseParser;
use router_dialect::stream::{StreamOptions, StreamTranslator};
use router_dialect::{
    parse_answer, parse_request, uncarried, write_answer, write_request, Dialect, WriteOptions,
};
use serde_json::{json, Value};

const DIALECTS: [Dialect; 3] = [Dialect::OpenAi, Dialect::Anthropic, Dialect::Gemini];

/// Everything a body can go through.
fn exercise(body: &[u8]) {
    let opts = WriteOptions {
        default_max_tokens: Some(16),
        ..WriteOptions::default()
    };
    for from in DIALECTS {
        if let Ok(req) = parse_request(from, body) {
            for to in DIALECTS {
                let _ = uncarried(&req, to, &opts);
                let _ = write_request(&req, to, &opts);
            }
        }
        if let Ok(a) = parse_answer(from, body) {
            for to in DIALECTS {
                let _ = write_answer(&a, to, 0);
            }
        }
    }
}

/// Every stream translation of `bytes`, fed in pieces of `step`.
fn exercise_stream(bytes: &[u8], step: usize) {
    let mut p = SseParser::new(4096);
    let mut frames = Vec::new();
    for c in bytes.chunks(step.max(1)) {
        if p.push(c, &mut frames).is_err() {
            break;
        }
    }
    for from in DIALECTS {
        for to in [Dialect::OpenAi, Dialect::Anthropic] {
            let mut t = StreamTranslator::new(
                from,
                to,
                StreamOptions {
                    max_event_bytes: 4096,
                    include_usage: true,
                    ..StreamOptions::default()
                },
            )
            .unwrap();
            let mut out = Vec::new();
            for c in bytes.chunks(step.max(1)) {
                t.feed(c, &mut out);
            }
            t.finish(&mut out);
        }
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[a-z_]{0,8}".prop_map(Value::from),
        // The words the parsers look for.
        prop_oneof![
            Just("user"),
            Just("assistant"),
            Just("model"),
            Just("system"),
            Just("tool"),
            Just("text"),
            Just("image"),
            Just("image_url"),
            Just("tool_use"),
            Just("tool_result"),
            Just("thinking"),
            Just("function"),
            Just("data:image/png;base64,AAAA"),
            Just("STOP"),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        let key = prop_oneof![
            Just("role"),
            Just("content"),
            Just("type"),
            Just("text"),
            Just("messages"),
            Just("contents"),
            Just("parts"),
            Just("tools"),
            Just("tool_calls"),
            Just("function"),
            Just("arguments"),
            Just("name"),
            Just("id"),
            Just("input"),
            Just("source"),
            Just("tool_use_id"),
            Just("functionCall"),
            Just("functionResponse"),
            Just("args"),
            Just("system"),
            Just("max_tokens"),
            Just("thinking"),
            Just("budget_tokens"),
            Just("choices"),
            Just("message"),
            Just("candidates"),
            Just("usage"),
            Just("generationConfig"),
            Just("thinkingConfig"),
            Just("tool_choice"),
            Just("image_url"),
            Just("url"),
            Just("stop"),
            Just("inlineData"),
            Just("x"),
        ];
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec((key, inner), 0..5).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..1024), step in 1usize..64) {
        exercise(&bytes);
        exercise_stream(&bytes, step);
    }

    #[test]
    fn arbitrary_json_never_panics(v in json_value(), step in 1usize..64) {
        let body = serde_json::to_vec(&v).unwrap();
        exercise(&body);
        let sse = format!("data: {v}\n\nevent: x\ndata: {v}\n\n");
        exercise_stream(sse.as_bytes(), step);
    }

    #[test]
    fn mutated_real_payloads_never_panic(
        which in 0usize..4,
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let payloads = [
            json!({"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}]}),
            json!({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "r"}], "tools": [{"type": "function", "function": {"name": "f"}}]}),
            json!({"contents": [{"role": "user", "parts": [{"text": "q"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "c2ln"}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "r"}}}]}]}),
            json!({"candidates": [{"content": {"parts": [{"text": "a"}]}, "finishReason": "STOP"}],
                "choices": [{"message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}],
                "content": [{"type": "text", "text": "a"}], "stop_reason": "end_turn"}),
        ];
        let mut body = serde_json::to_vec(&payloads[which]).unwrap();
        for (i, b) in flips {
            let at = i.index(body.len());
            body[at] = b;
        }
        exercise(&body);
        let mut sse = b"data: ".to_vec();
        sse.extend_from_slice(&body);
        sse.extend_from_slice(b"\n\n");
        exercise_stream(&sse, 7);
    }
}
