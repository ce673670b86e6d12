//! Field by field: the rows of `docs/dialects.md` not already held by the
//! end-to-end request tests.

#![allow(clippy::unwrap_used)]

use router_dialect::{parse_request, uncarried, write_request, Dialect, WriteOptions};
use serde_json::{json, Value};

fn opts() -> WriteOptions {
    WriteOptions {
        default_max_tokens: Some(100),
        ..WriteOptions::default()
    }
}

fn to(from: Dialect, v: &Value, to: Dialect) -> Value {
    let req = parse_request(from, &serde_json::to_vec(v).unwrap()).unwrap();
    serde_json::from_slice(&write_request(&req, to, &opts()).unwrap()).unwrap()
}

fn lost(from: Dialect, v: &Value, dest: Dialect) -> Vec<String> {
    let req = parse_request(from, &serde_json::to_vec(v).unwrap()).unwrap();
    let mut f: Vec<String> = uncarried(&req, dest, &opts())
        .into_iter()
        .map(|u| u.field)
        .collect();
    f.sort_unstable();
    f
}

fn openai(extra: Value) -> Value {
    let mut v = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[test]
fn tool_choice_maps_every_form() {
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    for (choice, anthropic, gemini) in [
        (
            json!("auto"),
            json!({"type": "auto"}),
            json!({"mode": "AUTO"}),
        ),
        (
            json!("none"),
            json!({"type": "none"}),
            json!({"mode": "NONE"}),
        ),
        (
            json!("required"),
            json!({"type": "any"}),
            json!({"mode": "ANY"}),
        ),
        (
            json!({"type": "function", "function": {"name": "f"}}),
            json!({"type": "tool", "name": "f"}),
            json!({"mode": "ANY", "allowedFunctionNames": ["f"]}),
        ),
    ] {
        let v = openai(json!({"tools": tools, "tool_choice": choice}));
        assert_eq!(
            to(Dialect::OpenAi, &v, Dialect::Anthropic)["tool_choice"],
            anthropic
        );
        assert_eq!(
            to(Dialect::OpenAi, &v, Dialect::Gemini)["toolConfig"]["functionCallingConfig"],
            gemini
        );
        // And back from each.
        let a = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": anthropic});
        assert_eq!(
            to(Dialect::Anthropic, &a, Dialect::OpenAi)["tool_choice"],
            choice
        );
        let g = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [{"name": "f"}]}],
            "toolConfig": {"functionCallingConfig": gemini}});
        assert_eq!(
            to(Dialect::Gemini, &g, Dialect::OpenAi)["tool_choice"],
            choice
        );
    }
    // Anthropic's disable_parallel_tool_use is OpenAI's parallel_tool_calls.
    let a = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}});
    assert_eq!(
        to(Dialect::Anthropic, &a, Dialect::OpenAi)["parallel_tool_calls"],
        false
    );
}

#[test]
fn openai_sampling_fields_map_to_anthropic_and_gemini() {
    let v = openai(
        json!({"temperature": 0.5, "top_p": 0.8, "stop": ["a", "b"], "max_tokens": 9,
        "presence_penalty": 0.1, "frequency_penalty": 0.2, "seed": 4}),
    );
    let g = to(Dialect::OpenAi, &v, Dialect::Gemini);
    assert_eq!(
        g["generationConfig"],
        json!({"temperature": 0.5, "topP": 0.8, "stopSequences": ["a", "b"], "maxOutputTokens": 9,
            "presencePenalty": 0.1, "frequencyPenalty": 0.2, "seed": 4})
    );
    let mut v = v;
    for k in ["presence_penalty", "frequency_penalty", "seed"] {
        v.as_object_mut().unwrap().remove(k);
    }
    let a = to(Dialect::OpenAi, &v, Dialect::Anthropic);
    assert_eq!(
        (
            &a["temperature"],
            &a["top_p"],
            &a["stop_sequences"],
            &a["max_tokens"]
        ),
        (&json!(0.5), &json!(0.8), &json!(["a", "b"]), &json!(9))
    );
    // A zero penalty is the default: nothing to carry.
    let z = openai(json!({"presence_penalty": 0, "frequency_penalty": 0.0}));
    assert!(lost(Dialect::OpenAi, &z, Dialect::Anthropic).is_empty());
}

#[test]
fn openai_defaults_are_read_as_absent_and_other_values_refused() {
    let d = openai(json!({"n": 1, "logprobs": false}));
    assert!(lost(Dialect::OpenAi, &d, Dialect::Anthropic).is_empty());
    assert!(lost(Dialect::OpenAi, &d, Dialect::Gemini).is_empty());
    let n = openai(json!({"n": 2, "logprobs": true, "top_logprobs": 2}));
    assert_eq!(
        lost(Dialect::OpenAi, &n, Dialect::Anthropic),
        ["logprobs", "n", "top_logprobs"]
    );
    assert_eq!(
        lost(Dialect::OpenAi, &n, Dialect::Gemini),
        ["logprobs", "n", "top_logprobs"]
    );
    // OpenAI keeps them.
    let o = to(Dialect::OpenAi, &n, Dialect::OpenAi);
    assert_eq!(
        (o["n"].clone(), o["top_logprobs"].clone()),
        (json!(2), json!(2))
    );
}

#[test]
fn openai_storage_and_tracking_fields_are_dropped_on_purpose_elsewhere() {
    let v = openai(
        json!({"store": true, "metadata": {"k": "v"}, "prompt_cache_key": "p",
        "safety_identifier": "s"}),
    );
    assert!(lost(Dialect::OpenAi, &v, Dialect::Anthropic).is_empty());
    assert!(lost(Dialect::OpenAi, &v, Dialect::Gemini).is_empty());
    let a = to(Dialect::OpenAi, &v, Dialect::Anthropic);
    assert!(a.get("store").is_none() && a.get("prompt_cache_key").is_none());
}

#[test]
fn json_mode_goes_to_gemini_and_is_refused_by_anthropic() {
    let v = openai(json!({"response_format": {"type": "json_object"}}));
    assert_eq!(
        to(Dialect::OpenAi, &v, Dialect::Gemini)["generationConfig"],
        json!({"responseMimeType": "application/json"})
    );
    assert_eq!(
        lost(Dialect::OpenAi, &v, Dialect::Anthropic),
        ["response_format"]
    );
    let t = openai(json!({"response_format": {"type": "text"}}));
    assert!(lost(Dialect::OpenAi, &t, Dialect::Anthropic).is_empty());
    // Gemini's JSON mode comes back to OpenAI.
    let g = json!({"contents": [{"parts": [{"text": "hi"}]}],
        "generationConfig": {"responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "STRING"}}}}});
    assert_eq!(
        to(Dialect::Gemini, &g, Dialect::OpenAi)["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "response",
            "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}})
    );
}

#[test]
fn an_openai_data_url_is_an_inline_image_everywhere() {
    let v = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/webp;base64,UklGR"}}]}]});
    assert_eq!(
        to(Dialect::OpenAi, &v, Dialect::Anthropic)["messages"][0]["content"][0],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklGR"}})
    );
    assert_eq!(
        to(Dialect::OpenAi, &v, Dialect::Gemini)["contents"][0]["parts"][0],
        json!({"inlineData": {"mimeType": "image/webp", "data": "UklGR"}})
    );
    // And an Anthropic URL image is an OpenAI URL image.
    let a = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]});
    assert_eq!(
        to(Dialect::Anthropic, &a, Dialect::OpenAi)["messages"][0]["content"][0],
        json!({"type": "image_url", "image_url": {"url": "https://x/y.png"}})
    );
}

#[test]
fn openai_message_details_map_or_are_named() {
    let v = json!({"model": "m", "messages": [
        {"role": "user", "content": "q", "name": "alice"},
        {"role": "assistant", "content": null, "refusal": "I can't help with that.", "audio": {"id": "a1"}},
        {"role": "assistant", "content": "ok", "reasoning_content": "r"},
        {"role": "user", "content": "q2"}
    ]});
    assert_eq!(
        lost(Dialect::OpenAi, &v, Dialect::Anthropic),
        ["messages[0].name", "messages[1].audio"]
    );
    assert_eq!(
        lost(Dialect::OpenAi, &v, Dialect::Gemini),
        ["messages[0].name", "messages[1].audio"]
    );
    let mut v = v;
    v["messages"][0].as_object_mut().unwrap().remove("name");
    v["messages"][1].as_object_mut().unwrap().remove("audio");
    // A refusal is the assistant's text; reasoning is not sent to Gemini.
    let g = to(Dialect::OpenAi, &v, Dialect::Gemini);
    assert_eq!(
        g["contents"][1]["parts"],
        json!([{"text": "I can't help with that."}, {"text": "ok"}])
    );
    // A name is kept for OpenAI.
    let mut n = v.clone();
    n["messages"][0]["name"] = json!("alice");
    assert_eq!(
        to(Dialect::OpenAi, &n, Dialect::OpenAi)["messages"][0]["name"],
        "alice"
    );
}

#[test]
fn openai_non_function_tools_are_refused_elsewhere() {
    let v = openai(json!({"tools": [{"type": "custom", "custom": {"name": "grammar"}}]}));
    assert_eq!(lost(Dialect::OpenAi, &v, Dialect::Anthropic), ["tools[0]"]);
    assert_eq!(lost(Dialect::OpenAi, &v, Dialect::Gemini), ["tools[0]"]);
    assert_eq!(
        to(Dialect::OpenAi, &v, Dialect::OpenAi)["tools"],
        v["tools"]
    );
}

#[test]
fn anthropic_tool_results_errors_and_redacted_thinking() {
    let a = json!({"model": "m", "max_tokens": 5, "stop_sequences": ["###"], "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "EmwKAhgB"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "false"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "is_error": true, "content": "exit 1"}]}
    ]});
    let g = to(Dialect::Anthropic, &a, Dialect::Gemini);
    assert_eq!(
        g["contents"][2]["parts"][0],
        json!({"functionResponse": {"name": "Bash", "response": {"error": "exit 1"}}})
    );
    // Redacted thinking has no reader elsewhere: dropped on purpose.
    assert_eq!(g["contents"][1]["parts"].as_array().unwrap().len(), 1);
    assert_eq!(g["generationConfig"]["stopSequences"], json!(["###"]));
    let o = to(Dialect::Anthropic, &a, Dialect::OpenAi);
    // OpenAI tool messages have no error flag: the text says it.
    assert_eq!(
        o["messages"][2],
        json!({"role": "tool", "tool_call_id": "t1", "content": "exit 1"})
    );
    assert_eq!(o["messages"][1]["content"], Value::Null);
    assert_eq!(o["stop"], json!(["###"]));
    // Anthropic keeps all of it.
    let back = to(Dialect::Anthropic, &a, Dialect::Anthropic);
    assert_eq!(back["messages"][1], a["messages"][1]);
    assert_eq!(back["messages"][2]["content"][0]["is_error"], true);
}

#[test]
fn anthropic_metadata_beyond_user_id_and_unknown_fields_are_named() {
    let a = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "u", "other": 1}, "service_tier": "auto", "mcp_servers": []});
    assert_eq!(
        lost(Dialect::Anthropic, &a, Dialect::OpenAi),
        ["mcp_servers", "metadata", "service_tier"]
    );
    let back = to(Dialect::Anthropic, &a, Dialect::Anthropic);
    assert_eq!(back["metadata"], a["metadata"]);
}

#[test]
fn a_tool_result_for_no_earlier_call_cannot_go_to_gemini() {
    let v = json!({"model": "m", "messages": [
        {"role": "tool", "tool_call_id": "nowhere", "content": "r"}]});
    assert_eq!(
        lost(Dialect::OpenAi, &v, Dialect::Gemini),
        ["messages[0].content[0]"]
    );
}

#[test]
fn anthropic_strict_tools_keep_strict_for_openai_only() {
    let a = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "strict": true}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}});
    assert_eq!(
        to(Dialect::Anthropic, &a, Dialect::OpenAi)["tools"][0]["function"]["strict"],
        true
    );
    // Gemini: strict dropped on purpose, one-call-at-most refused.
    assert_eq!(
        lost(Dialect::Anthropic, &a, Dialect::Gemini),
        ["tool_choice.disable_parallel_tool_use"]
    );
}

#[test]
fn a_tool_result_image_is_refused_by_gemini() {
    let a = json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "text", "text": "here"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}]});
    assert_eq!(
        lost(Dialect::Anthropic, &a, Dialect::Gemini),
        ["messages[1].content[0].content[1]"]
    );
}

#[test]
fn gemini_signed_thoughts_go_back_to_gemini_only() {
    let g = json!({"contents": [
        {"role": "user", "parts": [{"text": "q"}]},
        {"role": "model", "parts": [{"text": "hmm", "thought": true, "thoughtSignature": "c2ln"}, {"text": "a"}]},
        {"role": "user", "parts": [{"text": "q2"}]}]});
    assert_eq!(
        to(Dialect::Gemini, &g, Dialect::Gemini)["contents"][1],
        g["contents"][1]
    );
    assert_eq!(
        to(Dialect::Gemini, &g, Dialect::Anthropic)["messages"][1]["content"],
        json!([{"type": "text", "text": "a"}])
    );
    assert_eq!(
        to(Dialect::Gemini, &g, Dialect::OpenAi)["messages"][1]["content"],
        "a"
    );
}

#[test]
fn a_gemini_request_becomes_openai_and_anthropic_requests() {
    let g = json!({
        "systemInstruction": {"parts": [{"text": "sys"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "done"}}}]}
        ],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
        "generationConfig": {"stopSequences": ["x"], "maxOutputTokens": 7, "temperature": 0.3, "topP": 0.9,
            "topK": 3, "seed": 1, "presencePenalty": 0.4}
    });
    let mut g1 = g.clone();
    g1["generationConfig"]
        .as_object_mut()
        .unwrap()
        .remove("topK");
    let o = to(Dialect::Gemini, &g1, Dialect::OpenAi);
    assert_eq!(
        o["messages"][0],
        json!({"role": "system", "content": "sys"})
    );
    assert_eq!(
        o["messages"][1]["content"][1],
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
    );
    let call_id = o["messages"][2]["tool_calls"][0]["id"].clone();
    assert_eq!(
        o["messages"][2]["tool_calls"][0]["function"]["arguments"],
        "{\"a\":1}"
    );
    assert_eq!(
        o["messages"][3],
        json!({"role": "tool", "tool_call_id": call_id, "content": "done"})
    );
    assert_eq!(
        o["tools"][0]["function"]["parameters"],
        json!({"type": "object"})
    );
    assert_eq!(
        (
            &o["stop"],
            &o["max_tokens"],
            &o["temperature"],
            &o["top_p"],
            &o["seed"],
            &o["presence_penalty"]
        ),
        (
            &json!(["x"]),
            &json!(7),
            &json!(0.3),
            &json!(0.9),
            &json!(1),
            &json!(0.4)
        )
    );
    // OpenAI has no top_k; Anthropic no seed nor penalties.
    assert_eq!(
        lost(Dialect::Gemini, &g, Dialect::OpenAi),
        ["generationConfig.topK"]
    );
    assert_eq!(
        lost(Dialect::Gemini, &g, Dialect::Anthropic),
        ["generationConfig.presencePenalty", "generationConfig.seed"]
    );
    let mut g2 = g.clone();
    for k in ["seed", "presencePenalty"] {
        g2["generationConfig"].as_object_mut().unwrap().remove(k);
    }
    let a = to(Dialect::Gemini, &g2, Dialect::Anthropic);
    assert_eq!(a["system"], "sys");
    assert_eq!(
        (
            &a["stop_sequences"],
            &a["max_tokens"],
            &a["temperature"],
            &a["top_p"],
            &a["top_k"]
        ),
        (
            &json!(["x"]),
            &json!(7),
            &json!(0.3),
            &json!(0.9),
            &json!(3)
        )
    );
    assert_eq!(a["messages"][0]["content"][1]["source"]["type"], "base64");
}

#[test]
fn max_completion_tokens_wins_over_max_tokens() {
    let v = openai(json!({"max_tokens": 10, "max_completion_tokens": 20}));
    assert_eq!(
        to(Dialect::OpenAi, &v, Dialect::Anthropic)["max_tokens"],
        20
    );
}

#[test]
fn thinking_disabled_has_nothing_to_carry_to_openai_and_url_images_stop_at_gemini() {
    let a = json!({"model": "m", "max_tokens": 5, "thinking": {"type": "disabled"}, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]});
    assert!(lost(Dialect::Anthropic, &a, Dialect::OpenAi).is_empty());
    assert!(to(Dialect::Anthropic, &a, Dialect::OpenAi)
        .get("reasoning_effort")
        .is_none());
    assert_eq!(
        lost(Dialect::Anthropic, &a, Dialect::Gemini),
        ["messages[0].content[0]"]
    );
    // The client's stream_options never reaches Gemini.
    let v = openai(json!({"stream": true, "stream_options": {"include_usage": true}}));
    assert!(to(Dialect::OpenAi, &v, Dialect::Gemini)
        .get("stream_options")
        .is_none());
}
