//! Requests across dialects, with real-shaped payloads. Each test backs a
//! row (or rows) of `docs/dialects.md`.

#![allow(clippy::unwrap_used)]

use router_dialect::{
    gemini, parse_request, uncarried, write_request, Dialect, DialectError, Uncarried, WriteOptions,
};
use serde_json::{json, Value};

const IMG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/// A turn of a Claude Code-like session: a system prompt with cache
/// breakpoints, tools, thinking, an image, a tool_use / tool_result turn.
fn claude_code_request() -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": true,
        "temperature": 1,
        "metadata": {"user_id": "user_abc_account_1_session_2"},
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "system": [
            {"type": "text", "text": "You are Claude Code."},
            {"type": "text", "text": "Project rules: be brief.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [
            {"name": "Read", "description": "Read a file", "input_schema": {
                "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}},
            {"name": "Bash", "description": "Run a command", "input_schema": {
                "type": "object", "properties": {"command": {"type": "string"}}},
             "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this screenshot, and read main.rs"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMG}}
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should read the file.", "signature": "EqQBCgIYAhIM"},
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"path": "main.rs"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "fn main() {}"},
                {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}
            ]}
        ]
    })
}

fn body(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn to(from: Dialect, v: &Value, to: Dialect, opts: &WriteOptions) -> Result<Value, DialectError> {
    let req = parse_request(from, &body(v))?;
    let out = write_request(&req, to, opts)?;
    Ok(serde_json::from_slice(&out).unwrap())
}

fn lost(from: Dialect, v: &Value, dest: Dialect) -> Vec<Uncarried> {
    let req = parse_request(from, &body(v)).unwrap();
    uncarried(&req, dest, &WriteOptions::default())
}

/// The fields of the list, sorted.
fn fields(l: &[Uncarried]) -> Vec<String> {
    let mut f: Vec<String> = l.iter().map(|u| u.field.clone()).collect();
    f.sort_unstable();
    f
}

#[test]
fn a_claude_code_turn_becomes_an_openai_request() {
    let opts = WriteOptions {
        model: Some("qwen3-coder".into()),
        ..WriteOptions::default()
    };
    let o = to(
        Dialect::Anthropic,
        &claude_code_request(),
        Dialect::OpenAi,
        &opts,
    )
    .unwrap();
    let data_url = format!("data:image/png;base64,{IMG}");
    assert_eq!(
        o,
        json!({
            "model": "qwen3-coder",
            "max_tokens": 32000,
            "stream": true,
            "stream_options": {"include_usage": true},
            "temperature": 1.0,
            "user": "user_abc_account_1_session_2",
            "messages": [
                // Two system blocks, one system message; cache breakpoints
                // dropped on purpose.
                {"role": "system", "content": [
                    {"type": "text", "text": "You are Claude Code."},
                    {"type": "text", "text": "Project rules: be brief."}
                ]},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in this screenshot, and read main.rs"},
                    {"type": "image_url", "image_url": {"url": data_url}}
                ]},
                // Anthropic's signed thinking is not sent to OpenAI.
                {"role": "assistant", "content": "Reading it.", "tool_calls": [
                    {"id": "toolu_01", "type": "function",
                     "function": {"name": "Read", "arguments": "{\"path\":\"main.rs\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "toolu_01", "content": "fn main() {}"},
                {"role": "user", "content": "Thanks"}
            ],
            "tools": [
                {"type": "function", "function": {"name": "Read", "description": "Read a file",
                    "parameters": claude_code_request()["tools"][0]["input_schema"]}},
                {"type": "function", "function": {"name": "Bash", "description": "Run a command",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
            ]
        })
    );
}

#[test]
fn a_claude_code_turn_becomes_a_gemini_request() {
    let g = to(
        Dialect::Anthropic,
        &claude_code_request(),
        Dialect::Gemini,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        g["systemInstruction"],
        json!({"parts": [{"text": "You are Claude Code."}, {"text": "Project rules: be brief."}]})
    );
    assert_eq!(
        g["contents"],
        json!([
            {"role": "user", "parts": [
                {"text": "What is in this screenshot, and read main.rs"},
                {"inlineData": {"mimeType": "image/png", "data": IMG}}
            ]},
            {"role": "model", "parts": [
                {"text": "Reading it."},
                {"functionCall": {"name": "Read", "args": {"path": "main.rs"}}}
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "Read", "response": {"output": "fn main() {}"}}},
                {"text": "Thanks"}
            ]}
        ])
    );
    assert_eq!(
        g["generationConfig"],
        json!({"maxOutputTokens": 32000, "temperature": 1.0,
            "thinkingConfig": {"thinkingBudget": 10000, "includeThoughts": true}})
    );
    assert_eq!(
        g["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"],
        claude_code_request()["tools"][0]["input_schema"]
    );
    // The model goes in the URL, the stream flag in the method.
    assert!(g.get("model").is_none() && g.get("stream").is_none());
    assert_eq!(
        gemini::endpoint_path("gemini-2.5-flash", true).unwrap(),
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    assert_eq!(
        gemini::endpoint_path("models/gemini-2.5-pro", false).unwrap(),
        "/v1beta/models/gemini-2.5-pro:generateContent"
    );
    assert!(gemini::endpoint_path("../admin?x=", false).is_err());
}

#[test]
fn an_anthropic_request_written_back_to_anthropic_is_unchanged() {
    let mut v = claude_code_request();
    // Fields the model does not map are kept for the same dialect.
    v["context_management"] = json!({"edits": [{"type": "clear_tool_uses_20250919"}]});
    v["messages"][0]["content"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}));
    let back = to(
        Dialect::Anthropic,
        &v,
        Dialect::Anthropic,
        &WriteOptions::default(),
    )
    .unwrap();
    let mut expect = v.clone();
    // The one normalization: a tool_result's string content becomes a text block.
    expect["messages"][2]["content"][0]["content"] =
        json!([{"type": "text", "text": "fn main() {}"}]);
    expect["temperature"] = json!(1.0);
    assert_eq!(back, expect);
}

fn openai_request() -> Value {
    json!({
        "model": "gpt-4.1",
        "messages": [
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": [
                {"type": "text", "text": "Weather in the photo's city?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/paris.jpg", "detail": "high"}}
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": ""}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "12:00"}]}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}, "strict": true}},
                  {"type": "function", "function": {"name": "get_time"}}],
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "max_completion_tokens": 500,
        "stop": "END",
        "top_p": 0.9,
        "n": 1,
        "user": "u-7",
        "store": false,
        "metadata": {"team": "a"},
        "stream": true,
        "stream_options": {"include_usage": false}
    })
}

#[test]
fn an_openai_request_becomes_an_anthropic_request() {
    let a = to(
        Dialect::OpenAi,
        &openai_request(),
        Dialect::Anthropic,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        a,
        json!({
            "model": "gpt-4.1",
            "system": "Be terse.",
            "max_tokens": 500,
            "stop_sequences": ["END"],
            "top_p": 0.9,
            "metadata": {"user_id": "u-7"},
            "stream": true,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "tools": [
                {"name": "get_weather", "input_schema": {"type": "object"}},
                {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
            ],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in the photo's city?"},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/paris.jpg"}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}}
                ]},
                // Consecutive tool messages: one user message of results.
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "18C"}]},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "12:00"}]}
                ]}
            ]
        })
    );
    // The client's own stream_options is read, not forwarded.
    let req = parse_request(Dialect::OpenAi, &body(&openai_request())).unwrap();
    assert!(req.stream && !req.stream_usage);
}

#[test]
fn an_openai_request_written_back_to_openai_keeps_its_fields() {
    let mut v = openai_request();
    v["logit_bias"] = json!({"50256": -100});
    v["messages"][1]["content"][0]["text"] = json!("hi");
    let o = to(
        Dialect::OpenAi,
        &v,
        Dialect::OpenAi,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(o["logit_bias"], v["logit_bias"]);
    assert_eq!(o["store"], false);
    assert_eq!(o["metadata"], v["metadata"]);
    assert_eq!(o["max_completion_tokens"], 500);
    assert!(o.get("max_tokens").is_none());
    assert_eq!(o["messages"][1], v["messages"][1], "image detail kept");
    assert_eq!(
        o["messages"][2]["tool_calls"],
        v["messages"][2]["tool_calls"]
    );
    assert_eq!(o["messages"][3], v["messages"][3]);
    assert_eq!(o["tools"], v["tools"]);
    assert_eq!(o["tool_choice"], "required");
    assert_eq!(o["parallel_tool_calls"], false);
    // Upstream, usage is always asked for.
    assert_eq!(o["stream_options"], json!({"include_usage": true}));
}

#[test]
fn anthropic_requires_max_tokens_a_default_or_a_refusal_naming_it() {
    let v = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let l = lost(Dialect::OpenAi, &v, Dialect::Anthropic);
    assert_eq!(fields(&l), ["max_tokens"]);
    assert_eq!(l[0].to, Dialect::Anthropic);
    let opts = WriteOptions {
        default_max_tokens: Some(4096),
        ..WriteOptions::default()
    };
    let a = to(Dialect::OpenAi, &v, Dialect::Anthropic, &opts).unwrap();
    assert_eq!(a["max_tokens"], 4096);
}

#[test]
fn fields_a_dialect_cannot_carry_are_reported_never_dropped() {
    let v = json!({
        "model": "m", "max_tokens": 10,
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "late system"},
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}}]}
        ],
        "logit_bias": {"1": 2},
        "seed": 7,
        "temperature": 1.5,
        "presence_penalty": 0.5,
        "response_format": {"type": "json_object"},
        "service_tier": "flex",
        "store": true
    });
    let l = lost(Dialect::OpenAi, &v, Dialect::Anthropic);
    let f = fields(&l);
    assert_eq!(
        f,
        [
            "logit_bias",
            "messages[2]",
            "messages[3].content[0] (type input_audio)",
            "presence_penalty",
            "response_format",
            "seed",
            "service_tier",
            "temperature"
        ]
    );
    // The error names each: what the router answers with 400.
    let req = parse_request(Dialect::OpenAi, &body(&v)).unwrap();
    let e = write_request(&req, Dialect::Anthropic, &WriteOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("cannot carry field `logit_bias` to dialect anthropic"),
        "{msg}"
    );
    // Gemini carries seed, penalties, temperature 1.5 and JSON mode.
    let g = fields(&lost(Dialect::OpenAi, &v, Dialect::Gemini));
    assert_eq!(
        g,
        [
            "logit_bias",
            "messages[2]",
            "messages[3].content[0] (type input_audio)",
            "service_tier"
        ]
    );
}

#[test]
fn anthropic_only_content_and_tools_are_reported_elsewhere() {
    let v = json!({
        "model": "m", "max_tokens": 10, "top_k": 5,
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}},
            {"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMG}}]}
        ]}]
    });
    let f = fields(&lost(Dialect::Anthropic, &v, Dialect::OpenAi));
    assert_eq!(
        f,
        [
            "messages[0].content[0] (type document)",
            "messages[0].content[1].content[0]",
            "tools[0]",
            "top_k"
        ]
    );
    // Gemini takes top_k, not the tool result for a call it never saw.
    let g = fields(&lost(Dialect::Anthropic, &v, Dialect::Gemini));
    assert_eq!(
        g,
        [
            "messages[0].content[0] (type document)",
            "messages[0].content[1]",
            "tools[0]"
        ]
    );
}

#[test]
fn fields_dropped_on_purpose_are_not_reported() {
    // store, metadata (OpenAI's own storage), cache_control (each
    // provider caches by its own rules), strict, image detail,
    // stream_options (the router asks for usage itself).
    assert!(
        lost(Dialect::OpenAi, &openai_request(), Dialect::Gemini)
            .iter()
            .all(|u| u.field == "parallel_tool_calls"
                || u.field.starts_with("messages[1].content[1]"))
    );
    let l = lost(Dialect::Anthropic, &claude_code_request(), Dialect::OpenAi);
    assert!(l.is_empty(), "{l:?}");
    // user has no Gemini field: dropped on purpose.
    let l = lost(Dialect::Anthropic, &claude_code_request(), Dialect::Gemini);
    assert!(l.is_empty(), "{l:?}");
}

#[test]
fn gemini_refuses_image_urls_and_at_most_one_tool_call() {
    let f = fields(&lost(Dialect::OpenAi, &openai_request(), Dialect::Gemini));
    assert_eq!(f, ["messages[1].content[1]", "parallel_tool_calls"]);
}

#[test]
fn an_openai_request_becomes_a_gemini_request() {
    let mut v = openai_request();
    v["messages"][1]["content"]
        .as_array_mut()
        .unwrap()
        .truncate(1);
    v.as_object_mut().unwrap().remove("parallel_tool_calls");
    v["reasoning_effort"] = json!("low");
    v["seed"] = json!(3);
    v["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": true}});
    let g = to(
        Dialect::OpenAi,
        &v,
        Dialect::Gemini,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        g["systemInstruction"],
        json!({"parts": [{"text": "Be terse."}]})
    );
    assert_eq!(
        g["contents"][1],
        json!({"role": "model", "parts": [
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
            {"functionCall": {"name": "get_time", "args": {}}}
        ]})
    );
    assert_eq!(
        g["contents"][2],
        json!({"role": "user", "parts": [
            {"functionResponse": {"name": "get_weather", "response": {"output": "18C"}}},
            {"functionResponse": {"name": "get_time", "response": {"output": "12:00"}}}
        ]})
    );
    assert_eq!(
        g["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY"}})
    );
    assert_eq!(
        g["generationConfig"],
        json!({
            "maxOutputTokens": 500, "stopSequences": ["END"], "topP": 0.9, "seed": 3,
            "responseMimeType": "application/json", "responseJsonSchema": {"type": "object"},
            "thinkingConfig": {"thinkingLevel": "low", "includeThoughts": true}
        })
    );
}

#[test]
fn reasoning_maps_where_it_can_and_is_dropped_where_a_number_would_be_invented() {
    let anth = json!({"model": "m", "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "hi"}]});
    // A budget has no OpenAI field: dropped on purpose, not reported.
    let o = to(
        Dialect::Anthropic,
        &anth,
        Dialect::OpenAi,
        &WriteOptions::default(),
    )
    .unwrap();
    assert!(o.get("reasoning_effort").is_none());
    let oa = json!({"model": "m", "max_tokens": 2000, "reasoning_effort": "high",
        "messages": [{"role": "user", "content": "hi"}]});
    // An effort word has no Anthropic budget: dropped on purpose.
    let a = to(
        Dialect::OpenAi,
        &oa,
        Dialect::Anthropic,
        &WriteOptions::default(),
    )
    .unwrap();
    assert!(a.get("thinking").is_none());
    // Gemini takes both; an effort it has no level for is refused.
    let g = to(
        Dialect::OpenAi,
        &oa,
        Dialect::Gemini,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        g["generationConfig"]["thinkingConfig"]["thinkingLevel"],
        "high"
    );
    let mut none = oa.clone();
    none["reasoning_effort"] = json!("none");
    assert_eq!(
        fields(&lost(Dialect::OpenAi, &none, Dialect::Gemini)),
        ["reasoning_effort"]
    );
    // Adaptive and disabled.
    let mut ad = anth.clone();
    ad["thinking"] = json!({"type": "adaptive"});
    let g = to(
        Dialect::Anthropic,
        &ad,
        Dialect::Gemini,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        g["generationConfig"]["thinkingConfig"]["thinkingBudget"],
        -1
    );
    let mut off = anth.clone();
    off["thinking"] = json!({"type": "disabled"});
    let g = to(
        Dialect::Anthropic,
        &off,
        Dialect::Gemini,
        &WriteOptions::default(),
    )
    .unwrap();
    assert!(g["generationConfig"].get("thinkingConfig").is_none());
    // Gemini's budget comes back to Anthropic as a budget.
    let gem = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": {"maxOutputTokens": 3000, "thinkingConfig": {"thinkingBudget": 2048, "includeThoughts": true}}});
    let a = to(
        Dialect::Gemini,
        &gem,
        Dialect::Anthropic,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        a["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    assert_eq!(a["max_tokens"], 3000);
}

#[test]
fn unsigned_reasoning_from_another_provider_is_not_sent_to_anthropic() {
    let v = json!({"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "thought from vLLM"},
        {"role": "user", "content": "q2"}
    ]});
    let a = to(
        Dialect::OpenAi,
        &v,
        Dialect::Anthropic,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        a["messages"][1]["content"],
        json!([{"type": "text", "text": "a"}])
    );
    // Back to OpenAI it goes with the message it came in.
    let o = to(
        Dialect::OpenAi,
        &v,
        Dialect::OpenAi,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(o["messages"][1]["reasoning_content"], "thought from vLLM");
}

#[test]
fn a_gemini_thought_signature_comes_back_to_gemini_through_the_tool_id() {
    // Turn 1: Gemini's answer, as an Anthropic client sees it.
    let answer = json!({"candidates": [{"content": {"role": "model", "parts": [
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "CiQB+x/zAA=="}]},
        "finishReason": "STOP"}], "responseId": "r9", "modelVersion": "gemini-3-pro"});
    let a = router_dialect::parse_answer(Dialect::Gemini, &body(&answer)).unwrap();
    let client: Value =
        serde_json::from_slice(&router_dialect::write_answer(&a, Dialect::Anthropic, 0).unwrap())
            .unwrap();
    let id = client["content"][0]["id"].as_str().unwrap().to_owned();
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "{id}"
    );
    assert_eq!(client["stop_reason"], "tool_use");
    // Turn 2: the client sends the call and its result back.
    let next = json!({"model": "m", "max_tokens": 100, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [client["content"][0].clone()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "18C"}]}
    ]});
    let g = to(
        Dialect::Anthropic,
        &next,
        Dialect::Gemini,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        g["contents"][1]["parts"][0],
        json!({"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "CiQB+x/zAA=="})
    );
    assert_eq!(
        g["contents"][2]["parts"][0],
        json!({"functionResponse": {"name": "get_weather", "response": {"output": "18C"}}})
    );
}

#[test]
fn a_gemini_request_parses_and_writes_back() {
    let v = json!({
        "system_instruction": {"parts": [{"text": "sys"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}, {"inline_data": {"mime_type": "image/jpeg", "data": IMG}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": "c2ln"}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"error": "boom"}}}]},
            {"role": "user", "parts": [{"executableCode": {"language": "PYTHON", "code": "1"}}]}
        ],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT", "properties": {"a": {"type": "INTEGER"}}}}]},
                  {"googleSearch": {}}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
        "generationConfig": {"temperature": 0.2, "topK": 40, "candidateCount": 1, "responseModalities": ["TEXT"]}
    });
    let req = parse_request(Dialect::Gemini, &body(&v)).unwrap();
    let g: Value = serde_json::from_slice(
        &write_request(&req, Dialect::Gemini, &WriteOptions::default()).unwrap(),
    )
    .unwrap();
    assert_eq!(g["systemInstruction"], v["system_instruction"]);
    assert_eq!(
        g["contents"][0]["parts"][1],
        json!({"inlineData": {"mimeType": "image/jpeg", "data": IMG}})
    );
    assert_eq!(g["contents"][1], v["contents"][1]);
    assert_eq!(g["contents"][2]["parts"][0], v["contents"][2]["parts"][0]);
    assert_eq!(g["contents"][2]["parts"][1], v["contents"][3]["parts"][0]);
    assert_eq!(g["tools"][1], json!({"googleSearch": {}}));
    // Gemini's upper-case schema types are JSON Schema's lower case.
    assert_eq!(
        g["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"],
        json!({"type": "object", "properties": {"a": {"type": "integer"}}})
    );
    assert_eq!(g["toolConfig"], v["toolConfig"]);
    assert_eq!(g["safetySettings"], v["safetySettings"]);
    assert_eq!(
        g["generationConfig"],
        json!({"temperature": 0.2, "topK": 40, "responseModalities": ["TEXT"]})
    );
    // To Anthropic: the function response is a failed tool result; the
    // Gemini-only parts and settings are named.
    let f = fields(&uncarried(
        &req,
        Dialect::Anthropic,
        &WriteOptions {
            default_max_tokens: Some(1),
            ..WriteOptions::default()
        },
    ));
    assert_eq!(
        f,
        [
            "generationConfig.responseModalities",
            "messages[3].content[0] (unknown part)",
            "safetySettings",
            "tools[1]"
        ]
    );
    let a: Value = serde_json::from_slice(
        &write_request(
            &{
                let mut r = req.clone();
                r.messages.truncate(3);
                r.tools.truncate(1);
                r.extra.clear();
                r
            },
            Dialect::Anthropic,
            &WriteOptions {
                default_max_tokens: Some(100),
                ..WriteOptions::default()
            },
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        a["messages"][2]["content"][0],
        json!({"type": "tool_result", "tool_use_id": a["messages"][1]["content"][0]["id"], "is_error": true,
            "content": [{"type": "text", "text": "boom"}]})
    );
    assert_eq!(a["tool_choice"], json!({"type": "tool", "name": "f"}));
}

#[test]
fn a_tool_call_with_arguments_that_are_not_an_object_is_refused_where_an_object_is_required() {
    let v = json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "x"}
    ]});
    assert_eq!(
        fields(&lost(Dialect::OpenAi, &v, Dialect::Anthropic)),
        ["messages[0].content[0]"]
    );
    assert_eq!(
        fields(&lost(Dialect::OpenAi, &v, Dialect::Gemini)),
        ["messages[0].content[0]", "messages[1].content[0]"]
    );
}

#[test]
fn malformed_requests_are_refused_naming_the_field() {
    for (dialect, v, field) in [
        (
            Dialect::OpenAi,
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            Dialect::OpenAi,
            json!({"messages": [{"role": "user", "content": 3}]}),
            "messages[0].content",
        ),
        (
            Dialect::OpenAi,
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
        (
            Dialect::OpenAi,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,abc"}}]}]}),
            "messages[0].content[0].image_url.url",
        ),
        (
            Dialect::Anthropic,
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]}),
            "messages[0].content[0].source.media_type",
        ),
        (
            Dialect::Anthropic,
            json!({"thinking": {"type": "enabled"}, "messages": []}),
            "thinking.budget_tokens",
        ),
        (
            Dialect::Anthropic,
            json!({"max_tokens": -1, "messages": []}),
            "max_tokens",
        ),
        (
            Dialect::Gemini,
            json!({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}),
            "contents[0].parts[0].functionCall.name",
        ),
    ] {
        match parse_request(dialect, &body(&v)) {
            Err(DialectError::Invalid { field: f, .. }) => assert_eq!(f, field, "{v}"),
            other => panic!("{v}: {other:?}"),
        }
    }
    assert!(matches!(
        parse_request(Dialect::OpenAi, b"{\"messages\": ["),
        Err(DialectError::Json(_))
    ));
    assert!(parse_request(Dialect::Anthropic, b"[]").is_err());
}
