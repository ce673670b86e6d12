//! Stream translation with real-shaped upstream streams.

#![allow(clippy::unwrap_used)]

use router_dialect::check::{anthropic_stream, openai_stream};
use router_dialect::errors::ErrorKind;
use router_dialect::stream::{StreamOptions, StreamState, StreamTranslator};
use router_dialect::{Dialect, Usage};
use serde_json::{json, Value};

fn opts() -> StreamOptions {
    StreamOptions {
        id: "req_1".into(),
        created: 1_700_000_000,
        include_usage: true,
        ..StreamOptions::default()
    }
}

/// Feeds `bytes` in pieces of `step` bytes, then the end of the stream.
fn translate_with(
    from: Dialect,
    to: Dialect,
    bytes: &[u8],
    step: usize,
    o: StreamOptions,
) -> (Vec<u8>, StreamTranslator) {
    let mut t = StreamTranslator::new(from, to, o).unwrap();
    let mut out = Vec::new();
    for piece in bytes.chunks(step.max(1)) {
        t.feed(piece, &mut out);
    }
    t.finish(&mut out);
    (out, t)
}

fn translate(from: Dialect, to: Dialect, bytes: &[u8]) -> Vec<u8> {
    let whole = translate_with(from, to, bytes, bytes.len(), opts()).0;
    // Any split gives the same bytes.
    for step in [1, 2, 3, 7, 64] {
        assert_eq!(
            translate_with(from, to, bytes, step, opts()).0,
            whole,
            "split every {step} bytes"
        );
    }
    whole
}

fn event_types(anthropic: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(anthropic)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            let mut t = v["type"].as_str().unwrap().to_owned();
            if let Some(b) = v["content_block"]["type"].as_str() {
                t = format!("{t}:{b}");
            }
            if let Some(b) = v["delta"]["type"].as_str() {
                t = format!("{t}:{b}");
            }
            t
        })
        .collect()
}

fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": "qwen3",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

/// A vLLM-shaped stream: reasoning, text, two tool calls, usage with
/// cached tokens.
fn vllm_stream() -> String {
    let mut s = String::new();
    s += &chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    s += &chunk(
        json!({"reasoning_content": "The user wants weather."}),
        Value::Null,
    );
    s += &chunk(json!({"content": "I'll check."}), Value::Null);
    s += &chunk(
        json!({"tool_calls": [{"id": "chatcmpl-tool-1", "type": "function", "index": 0,
            "function": {"name": "get_weather", "arguments": ""}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls": [{"id": "chatcmpl-tool-2", "type": "function", "index": 1,
            "function": {"name": "get_time", "arguments": "{}"}}]}),
        Value::Null,
    );
    s += &chunk(json!({}), json!("tool_calls"));
    s += "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen3\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":40,\"total_tokens\":160,\"prompt_tokens_details\":{\"cached_tokens\":100}}}\n\n";
    s += "data: [DONE]\n\n";
    s
}

#[test]
fn openai_chunks_become_well_formed_anthropic_events() {
    let out = translate(
        Dialect::OpenAi,
        Dialect::Anthropic,
        vllm_stream().as_bytes(),
    );
    assert_eq!(
        event_types(&out),
        [
            "message_start",
            "content_block_start:thinking",
            "content_block_delta:thinking_delta",
            "content_block_stop",
            "content_block_start:text",
            "content_block_delta:text_delta",
            "content_block_stop",
            "content_block_start:tool_use",
            "content_block_delta:input_json_delta",
            "content_block_delta:input_json_delta",
            "content_block_stop",
            "content_block_start:tool_use",
            "content_block_delta:input_json_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let said = anthropic_stream(&out).unwrap();
    assert_eq!(said.text, "I'll check.");
    assert_eq!(said.thinking, "The user wants weather.");
    assert_eq!(
        said.tools,
        vec![
            (
                "chatcmpl-tool-1".into(),
                "get_weather".into(),
                "{\"city\": \"Paris\"}".into()
            ),
            ("chatcmpl-tool-2".into(), "get_time".into(), "{}".into()),
        ]
    );
    assert_eq!(said.stop_reason.as_deref(), Some("tool_use"));
    // prompt_tokens 120 includes the 100 cached: 20 uncached input.
    assert_eq!(
        said.usage,
        Some(Usage {
            input: 20,
            output: 40,
            cache_read: 100,
            cache_write: 0
        })
    );
}

const ANTHROPIC_STREAM: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":300,"cache_read_input_tokens":2000,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Weather tool."}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Checking the "}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"weather."}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":" \"Paris\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}

event: message_stop
data: {"type":"message_stop"}

"#;

#[test]
fn anthropic_events_become_openai_chunks_with_a_final_usage_chunk() {
    let out = translate(
        Dialect::Anthropic,
        Dialect::OpenAi,
        ANTHROPIC_STREAM.as_bytes(),
    );
    let said = openai_stream(&out).unwrap();
    assert_eq!(said.text, "Checking the weather.");
    assert_eq!(said.thinking, "Weather tool.");
    assert_eq!(
        said.tools,
        vec![(
            "toolu_01".into(),
            "get_weather".into(),
            "{\"location\": \"Paris\"}".into()
        )]
    );
    assert_eq!(said.stop_reason.as_deref(), Some("tool_calls"));
    // The usage chunk: every prompt token once, reads as cached; the
    // final output count is message_delta's cumulative 89, not 1 + 89.
    let last_usage = String::from_utf8(out.clone())
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["choices"].as_array().is_some_and(Vec::is_empty))
        .unwrap();
    assert_eq!(
        last_usage["usage"],
        json!({"prompt_tokens": 2325, "completion_tokens": 89, "total_tokens": 2414,
            "prompt_tokens_details": {"cached_tokens": 2000}})
    );
    assert!(String::from_utf8(out)
        .unwrap()
        .ends_with("data: [DONE]\n\n"));
}

#[test]
fn the_usage_chunk_is_sent_only_when_the_client_asked() {
    let o = StreamOptions {
        include_usage: false,
        ..opts()
    };
    let (out, t) = translate_with(
        Dialect::Anthropic,
        Dialect::OpenAi,
        ANTHROPIC_STREAM.as_bytes(),
        5,
        o,
    );
    assert!(openai_stream(&out).unwrap().usage.is_none());
    // The router still knows it.
    assert_eq!(
        t.usage(),
        Some(Usage {
            input: 25,
            output: 89,
            cache_read: 2000,
            cache_write: 300
        })
    );
    assert_eq!(t.state(), StreamState::Completed);
}

#[test]
fn anthropic_to_anthropic_keeps_blocks_signatures_and_usage() {
    let out = translate(
        Dialect::Anthropic,
        Dialect::Anthropic,
        ANTHROPIC_STREAM.as_bytes(),
    );
    let said = anthropic_stream(&out).unwrap();
    assert_eq!(said.blocks, 3);
    assert!(String::from_utf8_lossy(&out).contains("\"signature_delta\""));
    assert_eq!(said.usage.unwrap().cache_write, 300);
    assert_eq!(said.usage.unwrap().output, 89);
}

fn gemini_chunk(parts: Value, finish: Option<&str>, usage: Value) -> String {
    let mut c = json!({"candidates": [{"content": {"parts": parts, "role": "model"}, "index": 0}],
        "usageMetadata": usage, "modelVersion": "gemini-2.5-flash", "responseId": "resp1"});
    if let Some(f) = finish {
        c["candidates"][0]["finishReason"] = f.into();
    }
    format!("data: {c}\r\n\r\n")
}

fn gemini_stream() -> String {
    let u0 =
        json!({"promptTokenCount": 1200, "cachedContentTokenCount": 1000, "totalTokenCount": 1200});
    let u1 = json!({"promptTokenCount": 1200, "cachedContentTokenCount": 1000, "candidatesTokenCount": 20,
        "thoughtsTokenCount": 30, "totalTokenCount": 1250});
    gemini_chunk(
        json!([{"text": "Let me see.", "thought": true}]),
        None,
        u0.clone(),
    ) + &gemini_chunk(json!([{"text": "Checking."}]), None, u0)
        + &gemini_chunk(
            json!([{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "c2ln+/8="},
                   {"functionCall": {"name": "get_time", "args": {}}}]),
            Some("STOP"),
            u1,
        )
}

#[test]
fn gemini_sse_becomes_anthropic_events_with_the_thought_signature_in_the_tool_id() {
    let out = translate(
        Dialect::Gemini,
        Dialect::Anthropic,
        gemini_stream().as_bytes(),
    );
    let said = anthropic_stream(&out).unwrap();
    assert_eq!(said.thinking, "Let me see.");
    assert_eq!(said.text, "Checking.");
    assert_eq!(
        said.tools,
        vec![
            (
                "call_resp1_0__thought__c2ln-_8".into(),
                "get_weather".into(),
                "{\"city\":\"Paris\"}".into()
            ),
            ("call_resp1_1".into(), "get_time".into(), "{}".into()),
        ]
    );
    // Gemini says STOP with function calls; the client hears tool_use.
    assert_eq!(said.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(
        said.usage,
        Some(Usage {
            input: 200,
            output: 50,
            cache_read: 1000,
            cache_write: 0
        })
    );
    assert_eq!(
        router_dialect::gemini::signature_of_tool_id(&said.tools[0].0).as_deref(),
        Some("c2ln+/8=")
    );
}

#[test]
fn gemini_sse_becomes_openai_chunks() {
    let out = translate(Dialect::Gemini, Dialect::OpenAi, gemini_stream().as_bytes());
    let said = openai_stream(&out).unwrap();
    assert_eq!(said.text, "Checking.");
    assert_eq!(said.tools.len(), 2);
    assert_eq!(said.stop_reason.as_deref(), Some("tool_calls"));
    let u = said.usage.unwrap();
    assert_eq!((u.prompt(), u.cache_read, u.output), (1200, 1000, 50));
}

#[test]
fn a_gemini_stream_cut_before_its_finish_reason_is_an_error_for_the_client() {
    let s = gemini_stream();
    let cut = s.split("data: ").take(3).collect::<Vec<_>>().join("data: ");
    let out = translate(Dialect::Gemini, Dialect::Anthropic, cut.as_bytes());
    let said = anthropic_stream(&out).unwrap();
    let e = said.error.unwrap();
    assert_eq!(e["error"]["code"], "upstream_reset");
}

#[test]
fn an_upstream_error_mid_stream_reaches_the_client_as_an_error_event_in_its_dialect() {
    let mut s = String::new();
    s += &chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    s += &chunk(json!({"content": "Hel"}), Value::Null);
    s += "data: {\"error\":{\"message\":\"CUDA out of memory\",\"type\":\"server_error\"}}\n\n";
    s += &chunk(json!({"content": "lo"}), Value::Null);
    let (out, t) = translate_with(Dialect::OpenAi, Dialect::Anthropic, s.as_bytes(), 9, opts());
    assert_eq!(t.state(), StreamState::Failed);
    let said = anthropic_stream(&out).unwrap();
    assert_eq!(said.text, "Hel");
    let e = said.error.unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "api_error");
    assert_eq!(e["error"]["message"], "CUDA out of memory");
    assert_eq!(
        event_types(&out).last().map(String::as_str),
        Some("error"),
        "nothing follows the error"
    );
}

#[test]
fn an_anthropic_overloaded_error_in_the_stream_stays_overloaded_for_an_anthropic_client() {
    let s = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"c\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n\
             event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let out = translate(Dialect::Anthropic, Dialect::Anthropic, s.as_bytes());
    let e = anthropic_stream(&out).unwrap().error.unwrap();
    assert_eq!(e["error"]["type"], "overloaded_error");
    let out = translate(Dialect::Anthropic, Dialect::OpenAi, s.as_bytes());
    let e = openai_stream(&out).unwrap().error.unwrap();
    assert_eq!(e["error"]["type"], "stream_error");
    assert_eq!(e["error"]["message"], "Overloaded");
}

#[test]
fn a_cut_upstream_is_an_error_event_not_a_silent_end() {
    let s = vllm_stream();
    let cut = &s.as_bytes()[..s.len() / 2];
    let out = translate(Dialect::OpenAi, Dialect::Anthropic, cut);
    let e = anthropic_stream(&out).unwrap().error.unwrap();
    assert_eq!(e["error"]["code"], "upstream_reset");
    let a = ANTHROPIC_STREAM.as_bytes();
    let out = translate(Dialect::Anthropic, Dialect::OpenAi, &a[..a.len() - 40]);
    let e = openai_stream(&out).unwrap().error.unwrap();
    assert_eq!(e["error"]["code"], "upstream_reset");
}

#[test]
fn an_openai_stream_with_a_finish_reason_and_no_done_is_complete() {
    let s = vllm_stream().replace("data: [DONE]\n\n", "");
    let out = translate(Dialect::OpenAi, Dialect::Anthropic, s.as_bytes());
    let said = anthropic_stream(&out).unwrap();
    assert!(said.error.is_none());
    assert_eq!(said.stop_reason.as_deref(), Some("tool_use"));
}

#[test]
fn the_router_cutting_a_stream_sends_one_error_event_and_nothing_after() {
    let mut t = StreamTranslator::new(Dialect::OpenAi, Dialect::Anthropic, opts()).unwrap();
    let mut out = Vec::new();
    let s = vllm_stream();
    t.feed(&s.as_bytes()[..300], &mut out);
    t.fail(
        ErrorKind::StreamStalled,
        "the backend sent nothing for 30 s",
        &mut out,
    );
    t.feed(&s.as_bytes()[300..], &mut out);
    t.finish(&mut out);
    assert_eq!(t.state(), StreamState::Failed);
    let e = anthropic_stream(&out).unwrap().error.unwrap();
    assert_eq!(e["error"]["type"], "timeout_error");
    assert_eq!(e["error"]["code"], "stream_stalled");
}

#[test]
fn a_duplicate_message_start_from_upstream_is_not_passed_on() {
    let (first, rest) = ANTHROPIC_STREAM.split_once("\n\n").unwrap();
    let doubled = format!("{first}\n\n{first}\n\n{rest}");
    let out = translate(Dialect::Anthropic, Dialect::Anthropic, doubled.as_bytes());
    assert!(anthropic_stream(&out).unwrap().error.is_none());
    assert_eq!(
        event_types(&out)
            .iter()
            .filter(|t| *t == "message_start")
            .count(),
        1
    );
}

#[test]
fn interleaved_parallel_tool_arguments_fail_the_stream_rather_than_corrupt_a_call() {
    let mut s = String::new();
    s += &chunk(
        json!({"tool_calls": [{"id": "a", "type": "function", "index": 0, "function": {"name": "f", "arguments": "{\"x\""}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls": [{"id": "b", "type": "function", "index": 1, "function": {"name": "g", "arguments": "{}"}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
        Value::Null,
    );
    s += &chunk(json!({}), json!("tool_calls"));
    s += "data: [DONE]\n\n";
    let out = translate(Dialect::OpenAi, Dialect::Anthropic, s.as_bytes());
    let said = anthropic_stream(&out).unwrap();
    assert!(said.error.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("interleaved"));
    // To an OpenAI client the same stream is fine.
    let out = translate(Dialect::OpenAi, Dialect::OpenAi, s.as_bytes());
    let said = openai_stream(&out).unwrap();
    assert_eq!(said.tools[0].2, "{\"x\":1}");
}

#[test]
fn tool_arguments_before_the_name_are_held_until_it_comes() {
    let mut s = String::new();
    s += &chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":"}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "search", "arguments": "\"x\"}"}}]}),
        Value::Null,
    );
    s += &chunk(json!({}), json!("tool_calls"));
    s += "data: [DONE]\n\n";
    let out = translate(Dialect::OpenAi, Dialect::Anthropic, s.as_bytes());
    let said = anthropic_stream(&out).unwrap();
    assert_eq!(
        said.tools,
        vec![("c1".into(), "search".into(), "{\"q\":\"x\"}".into())]
    );
}

#[test]
fn an_over_long_upstream_event_is_an_error_not_unbounded_memory() {
    let o = StreamOptions {
        max_event_bytes: 256,
        ..opts()
    };
    let big = chunk(json!({"content": "x".repeat(1000)}), Value::Null);
    let (out, t) = translate_with(Dialect::OpenAi, Dialect::Anthropic, big.as_bytes(), 16, o);
    assert_eq!(t.state(), StreamState::Failed);
    let e = anthropic_stream(&out).unwrap().error.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("256"));
}

#[test]
fn data_that_is_not_json_is_an_error_event() {
    let s = chunk(json!({"content": "a"}), Value::Null) + "data: {not json\n\n";
    let out = translate(Dialect::OpenAi, Dialect::Anthropic, s.as_bytes());
    let e = anthropic_stream(&out).unwrap().error.unwrap();
    assert_eq!(e["error"]["code"], "malformed_json");
}

#[test]
fn stop_reasons_cross_the_stream_both_ways() {
    for (finish, stop) in [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
    ] {
        let s = chunk(json!({"content": "a"}), Value::Null)
            + &chunk(json!({}), json!(finish))
            + "data: [DONE]\n\n";
        let a = translate(Dialect::OpenAi, Dialect::Anthropic, s.as_bytes());
        assert_eq!(
            anthropic_stream(&a).unwrap().stop_reason.as_deref(),
            Some(stop)
        );
        let o = translate(Dialect::Anthropic, Dialect::OpenAi, &a);
        assert_eq!(
            openai_stream(&o).unwrap().stop_reason.as_deref(),
            Some(finish)
        );
    }
}

#[test]
fn a_stream_is_never_written_in_geminis_dialect() {
    assert!(StreamTranslator::new(Dialect::OpenAi, Dialect::Gemini, opts()).is_err());
}

#[test]
fn parsed_events_fed_one_by_one_give_the_same_bytes_as_raw_bytes() {
    let mut parser = router_dialect::sse::SseParser::default();
    let mut frames = Vec::new();
    parser
        .push(ANTHROPIC_STREAM.as_bytes(), &mut frames)
        .unwrap();
    let mut t = StreamTranslator::new(Dialect::Anthropic, Dialect::OpenAi, opts()).unwrap();
    let mut out = Vec::new();
    for f in &frames {
        t.feed_frame(f, &mut out);
    }
    t.finish(&mut out);
    assert_eq!(
        out,
        translate(
            Dialect::Anthropic,
            Dialect::OpenAi,
            ANTHROPIC_STREAM.as_bytes()
        )
    );
    assert_eq!(t.state(), StreamState::Completed);
}

#[test]
fn a_whole_answer_becomes_a_well_formed_stream_for_a_client_that_asked_for_one() {
    use router_dialect::stream::answer_stream;
    // An upstream that ignored `stream: true` and answered one JSON body.
    let body = json!({
        "id": "chatcmpl-9", "object": "chat.completion", "created": 1, "model": "qwen3",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me look.",
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
            "prompt_tokens_details": {"cached_tokens": 10}}
    })
    .to_string();
    let answer = router_dialect::parse_answer(Dialect::OpenAi, body.as_bytes()).unwrap();
    let events = answer_stream(&answer, Dialect::Anthropic, &opts()).unwrap();
    let said = anthropic_stream(&events).unwrap();
    assert_eq!(said.text, "Let me look.");
    assert_eq!(
        said.tools,
        vec![(
            "call_1".to_owned(),
            "get_weather".to_owned(),
            "{\"city\":\"Paris\"}".to_owned()
        )]
    );
    assert_eq!(said.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(said.blocks, 2);
    assert_eq!(
        said.usage,
        Some(Usage {
            input: 20,
            output: 12,
            cache_read: 10,
            cache_write: 0
        })
    );
    // And for an OpenAI client, a well-formed chunk stream.
    let chunks = answer_stream(&answer, Dialect::OpenAi, &opts()).unwrap();
    let said = openai_stream(&chunks).unwrap();
    assert_eq!(said.text, "Let me look.");
    assert_eq!(said.stop_reason.as_deref(), Some("tool_calls"));
    // Arguments that are not an object cannot be an Anthropic tool_use.
    let bad = body.replace("{\\\"city\\\":\\\"Paris\\\"}", "[1]");
    let answer = router_dialect::parse_answer(Dialect::OpenAi, bad.as_bytes()).unwrap();
    assert!(answer_stream(&answer, Dialect::Anthropic, &opts()).is_err());
}
