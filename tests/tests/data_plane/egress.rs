//! Pools of other providers than OpenAI-compatible servers (issue 29):
//! Azure OpenAI deployments (`provider: azure_openai`) and Gemini
//! (`provider: gemini`), each reached by OpenAI and Anthropic clients,
//! over real HTTP to mock endpoints that answer as those APIs do.

use std::time::Duration;

use http::{Method, StatusCode};
use router_dialect::check::{anthropic_stream, openai_stream};
use router_mock::{Behavior, StreamEnding, StreamScript};
use router_proxy::Settings;
use router_tests::harness::{TestProxy, TestResponse};
use router_tests::mocks::mock;

use crate::anthropic::{python_has, run_sdk_script_with};
use serde_json::{json, Value};

const MODEL: &str = "frontier";

/// A policy routing `frontier` through `pools` (YAML pool items, each
/// ending in a newline) in the order of `chain`.
fn policy(pools: &str, chain: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
{pools}  routes:
    - name: frontier
      match: {{model: ["{MODEL}"]}}
      chain: [{chain}]
"#
    )
}

/// An Azure OpenAI pool `azure` at `url` (deployment `gpt-4o-prod`, its
/// key in `TEST_AZURE_POOL_API_KEY`), with `extra` YAML lines.
fn azure_pool(url: &str, extra: &str) -> String {
    std::env::set_var("TEST_AZURE_POOL_API_KEY", "azure-pool-key");
    format!(
        "    - name: azure\n      provider: azure_openai\n      deployment: gpt-4o-prod\n      api_key_env: TEST_AZURE_POOL_API_KEY\n      endpoints: [\"{url}\"]\n{extra}"
    )
}

/// `POST path` with `body` and `headers`.
async fn post(
    proxy: &TestProxy,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> TestResponse {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    proxy
        .client
        .send(Method::POST, &proxy.url(path), &all, body.to_string())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_client_reaches_an_azure_deployment_as_it_sent_the_request() {
    let backend = mock("azure", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&azure_pool(&backend.url(), ""), "azure"),
    )
    .await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "logit_bias": {"50256": -100}});
    let r = post(
        &proxy,
        "/v1/chat/completions?client=1",
        &body,
        &[("authorization", "Bearer sk-client")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "echo: hi");
    let sent = &backend.requests()[0];
    // The deployment's path, the pool's api-version as the only query.
    assert_eq!(
        sent.path,
        "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
    );
    // The pool's key as api-key, never the client's Authorization.
    assert_eq!(sent.headers["api-key"], "azure-pool-key");
    assert!(sent.headers.get("authorization").is_none());
    // The body as the client sent it (a pass-through: no model rewrite).
    assert_eq!(serde_json::from_slice::<Value>(&sent.body).unwrap(), body);
    // A stream, its usage chunk asked for on the client's behalf.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = post(&proxy, "/v1/chat/completions", &streamed, &[]).await;
    let said = openai_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: hi");
    let lines = proxy.log.wait_for(2).await;
    assert_eq!(lines[1]["tokens_out"], 2, "{}", lines[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_pool_sends_its_own_api_version_and_an_anthropic_client_reaches_it() {
    let backend = mock("azure", Behavior::Chat).await;
    let pool = azure_pool(
        &backend.url(),
        "      model: gpt-4o\n      api_version: 2025-04-01-preview\n",
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&pool, "azure")).await;
    let body = json!({"model": MODEL, "max_tokens": 64,
        "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]});
    let r = post(
        &proxy,
        "/v1/messages",
        &body,
        &[
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "sk-ant-client"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "echo: hi");
    assert_eq!(v["stop_reason"], "end_turn");
    let sent = &backend.requests()[0];
    assert_eq!(
        sent.path,
        "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2025-04-01-preview"
    );
    assert_eq!(sent.headers["api-key"], "azure-pool-key");
    assert!(sent.headers.get("x-api-key").is_none());
    assert!(sent.headers.get("anthropic-version").is_none());
    // In OpenAI's dialect, the pool's model.
    let b: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(b["model"], "gpt-4o");
    assert_eq!(
        b["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    // Streamed: Anthropic events, well formed.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(
        &proxy,
        "/v1/messages",
        &streamed,
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: hi");
    // Azure's errors are OpenAI's: a 429 reaches an Anthropic client in its shape.
    let limited = mock("limited", Behavior::RateLimited("3".into())).await;
    proxy.apply(&policy(&azure_pool(&limited.url(), ""), "azure"));
    let r = post(
        &proxy,
        "/v1/messages",
        &body,
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(
        r.json()["error"]["type"],
        "rate_limit_error",
        "{}",
        r.text()
    );
    assert!(limited.requests()[0]
        .path
        .starts_with("/openai/deployments/gpt-4o-prod/"));
}

/// A Gemini pool `gemini` at `url` (model `gemini-2.5-flash`, its key in
/// `TEST_GEMINI_POOL_API_KEY`), with `extra` YAML lines.
fn gemini_pool(url: &str, extra: &str) -> String {
    std::env::set_var("TEST_GEMINI_POOL_API_KEY", "gemini-pool-key");
    format!(
        "    - name: gemini\n      provider: gemini\n      model: gemini-2.5-flash\n      api_key_env: TEST_GEMINI_POOL_API_KEY\n      endpoints: [\"{url}\"]\n{extra}"
    )
}

/// An OpenAI-compatible pool `local` at `url`.
fn local_pool(url: &str) -> String {
    format!("    - name: local\n      model: qwen3\n      endpoints: [\"{url}\"]\n")
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_client_reaches_a_gemini_pool_translated_both_ways() {
    let gemini = mock("gemini", Behavior::Gemini).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&gemini_pool(&gemini.url(), ""), "gemini"),
    )
    .await;
    let body = json!({"model": MODEL, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris"}]});
    let r = post(
        &proxy,
        "/v1/chat/completions",
        &body,
        &[("authorization", "Bearer sk-client")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "echo: Paris");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Gemini's cached tokens are inside its prompt count: counted once.
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 0);
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt / 2
    );
    assert_eq!(v["usage"]["completion_tokens"], 2);
    // The pool got Gemini's request: the model in the path, its key as
    // x-goog-api-key, never the client's Authorization.
    let sent = &gemini.requests()[0];
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(sent.headers["x-goog-api-key"], "gemini-pool-key");
    assert!(sent.headers.get("authorization").is_none());
    let b: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(
        b["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}]})
    );
    assert_eq!(
        b["contents"],
        json!([{"role": "user", "parts": [{"text": "Paris"}]}])
    );
    assert!(b.get("model").is_none(), "{b}");
    // The route log counts Gemini's usage.
    let line = &proxy.log.wait_for(1).await[0];
    assert_eq!(line["tokens_in"], prompt, "{line}");
    assert_eq!(line["tokens_out"], 2, "{line}");

    // Streamed, with a tool: OpenAI chunks; the call's thought signature
    // rides in its id.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    streamed["tools"] = weather_tool();
    let r = post(&proxy, "/v1/chat/completions", &streamed, &[]).await;
    let said = openai_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(
        gemini.requests()[1].path,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    assert_eq!(said.tools.len(), 1, "{}", r.text());
    let (id, name, args) = said.tools[0].clone();
    assert_eq!(name, "get_weather");
    assert_eq!(args, r#"{"text":"Paris"}"#);
    assert_eq!(
        router_dialect::gemini::signature_of_tool_id(&id).as_deref(),
        Some(router_mock::gemini::signature_for("get_weather").as_str()),
        "{id}"
    );
    assert_eq!(said.stop_reason.as_deref(), Some("tool_calls"));
    assert_eq!(said.usage.map(|u| u.output), Some(3));
    let line = &proxy.log.wait_for(2).await[1];
    assert_eq!(line["tokens_out"], 3, "{line}");

    // The next turn sends the call back; the pool (which refuses a call
    // without its signature, as Gemini 3 does) gets the signature back.
    let mut turn = body.clone();
    turn["tools"] = weather_tool();
    turn["messages"] = json!([
        {"role": "user", "content": "Paris"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": id, "content": "sunny"},
    ]);
    let r = post(&proxy, "/v1/chat/completions", &turn, &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "tool said: sunny"
    );
    let b: Value = serde_json::from_slice(&gemini.requests()[2].body).unwrap();
    assert_eq!(
        b["contents"][1]["parts"][0]["thoughtSignature"],
        router_mock::gemini::signature_for("get_weather"),
        "{b}"
    );
    // Without the signature (a client that rewrote the id): the pool's
    // 400, in the client's dialect.
    turn["messages"][1]["tool_calls"][0]["id"] = json!("call_1");
    turn["messages"][2]["tool_call_id"] = json!("call_1");
    let r = post(&proxy, "/v1/chat/completions", &turn, &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("thought_signature"));

    // Thinking asked for: Gemini's thoughts are output tokens.
    let mut thinking = body.clone();
    thinking["reasoning_effort"] = json!("low");
    let r = post(&proxy, "/v1/chat/completions", &thinking, &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let thoughts = router_mock::gemini::THOUGHT_TOKENS;
    assert_eq!(r.json()["usage"]["completion_tokens"], 2 + thoughts);
    let line = &proxy.log.wait_for(5).await[4];
    assert_eq!(line["tokens_out"], 2 + thoughts, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_client_reaches_a_gemini_pool_plain_streamed_and_with_tools() {
    let gemini = mock("gemini", Behavior::Gemini).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&gemini_pool(&gemini.url(), ""), "gemini"),
    )
    .await;
    let anthropic = [
        ("anthropic-version", "2023-06-01"),
        ("x-api-key", "sk-ant-client"),
    ];
    let body = json!({"model": MODEL, "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&proxy, "/v1/messages", &body, &anthropic).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "echo: hi");
    assert_eq!(v["stop_reason"], "end_turn");
    // Anthropic counts cache reads apart from input: never twice.
    let (input, cached) = (
        v["usage"]["input_tokens"].as_u64().unwrap(),
        v["usage"]["cache_read_input_tokens"].as_u64().unwrap(),
    );
    let line = &proxy.log.wait_for(1).await[0];
    assert_eq!(Some(input + cached), line["tokens_in"].as_u64(), "{line}");
    assert!(cached > 0);
    let sent = &gemini.requests()[0];
    assert_eq!(sent.headers["x-goog-api-key"], "gemini-pool-key");
    assert!(sent.headers.get("x-api-key").is_none());
    assert!(sent.headers.get("anthropic-version").is_none());
    let b: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(b["generationConfig"]["maxOutputTokens"], 64);

    // Streamed with a tool: well-formed Anthropic events as they flow.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["tools"] = json!([{"name": "get_weather",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}]);
    let r = post(&proxy, "/v1/messages", &streamed, &anthropic).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.tools.len(), 1, "{}", r.text());
    let (id, name, input) = said.tools[0].clone();
    assert_eq!(name, "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap(),
        json!({"text": "hi"})
    );
    assert_eq!(said.stop_reason.as_deref(), Some("tool_use"));
    // The tool_use id carries the signature back to Gemini.
    let mut turn = streamed.clone();
    turn["messages"] = json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "get_weather",
            "input": {"text": "hi"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "sunny"}]},
    ]);
    let r = post(&proxy, "/v1/messages", &turn, &anthropic).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "tool said: sunny");
    assert_eq!(said.stop_reason.as_deref(), Some("end_turn"));
    let line = &proxy.log.wait_for(3).await[2];
    assert_eq!(line["tokens_out"], 2, "{line}");
    assert!(line["tokens_in"].as_u64().unwrap() > 0, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_failures_fail_over_and_reach_the_client_in_its_dialect() {
    let local = mock("local", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&local_pool(&local.url()), "local"),
    )
    .await;
    // Each case its own Gemini endpoint (a failed one is suspect a while).
    let gemini_then_local = |behavior: Behavior| {
        let proxy = &proxy;
        let local = local.url();
        async move {
            let g = mock("gemini", behavior).await;
            let pools = format!(
                "{}{}",
                gemini_pool(
                    &g.url(),
                    "      first_token_timeout_ms: 300\n      stall_timeout_ms: 300\n",
                ),
                local_pool(&local)
            );
            proxy.apply(&policy(&pools, "gemini, local"));
            g
        }
    };
    let anthropic = [("anthropic-version", "2023-06-01")];
    let hello = |stream: bool| {
        json!({"model": MODEL, "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]})
    };
    // 429 RESOURCE_EXHAUSTED: the next pool answers.
    let _g = gemini_then_local(Behavior::RateLimited("2".into())).await;
    let r = post(&proxy, "/v1/messages", &hello(false), &anthropic).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-router-route"), Some("local"));
    let line = &proxy.log.wait_for(1).await[0];
    assert_eq!(line["attempts"][0]["outcome"], "status_429", "{line}");
    // 503 UNAVAILABLE, streamed: the same.
    let _g = gemini_then_local(Behavior::Status(503)).await;
    let r = post(&proxy, "/v1/messages", &hello(true), &anthropic).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: hi");
    let line = &proxy.log.wait_for(2).await[1];
    assert_eq!(line["attempts"][0]["outcome"], "status_5xx", "{line}");
    // An error in the stream before its first token: failed over.
    let _g = gemini_then_local(Behavior::Stream(StreamScript {
        chunks: 0,
        ending: StreamEnding::Error,
        ..StreamScript::default()
    }))
    .await;
    let r = post(&proxy, "/v1/messages", &hello(true), &anthropic).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: hi");
    let line = &proxy.log.wait_for(3).await[2];
    assert_eq!(line["attempts"][0]["outcome"], "stream_error", "{line}");
    // No first token within the pool's first_token_timeout: failed over.
    let _g = gemini_then_local(Behavior::Stream(StreamScript {
        first_token: Duration::from_secs(5),
        ..StreamScript::default()
    }))
    .await;
    let r = post(&proxy, "/v1/messages", &hello(true), &anthropic).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: hi");
    let line = &proxy.log.wait_for(4).await[3];
    assert_eq!(
        line["attempts"][0]["outcome"], "first_token_timeout",
        "{line}"
    );
    // An error after the first token: one error event in the client's
    // dialect, after the content.
    let _g = gemini_then_local(Behavior::Stream(StreamScript {
        chunks: 2,
        ending: StreamEnding::Error,
        ..StreamScript::default()
    }))
    .await;
    let r = post(&proxy, "/v1/messages", &hello(true), &anthropic).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "tok0 tok1 ");
    assert!(said.error.is_some(), "{}", r.text());
    assert_eq!(r.text().matches("event: error").count(), 1);
    // Silent after its first tokens: the stall watchdog cuts it, in the
    // client's dialect.
    let _g = gemini_then_local(Behavior::Stream(StreamScript {
        chunks: 2,
        ending: StreamEnding::Stall,
        ..StreamScript::default()
    }))
    .await;
    let r = post(&proxy, "/v1/messages", &hello(true), &anthropic).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "tok0 tok1 ");
    let error = said.error.expect("an error event");
    assert_eq!(error["error"]["code"], "stream_stalled", "{error}");
    // A field Gemini cannot carry: the pool is passed over, saying why.
    let _g = gemini_then_local(Behavior::Gemini).await;
    let chat = json!({"model": MODEL, "parallel_tool_calls": false, "tools": weather_tool(),
        "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&proxy, "/v1/chat/completions", &chat, &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-router-route"), Some("local"));
    let line = &proxy.log.wait_for(7).await[6];
    let reason = line["reason"].as_str().unwrap();
    assert!(
        reason.contains(
            "gemini: skipped, cannot carry field `parallel_tool_calls` to dialect gemini"
        ),
        "{reason}"
    );
    // A complete scripted stream: its usage counted.
    let _g = gemini_then_local(Behavior::Stream(StreamScript::default())).await;
    let chat = json!({"model": MODEL, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&proxy, "/v1/chat/completions", &chat, &[]).await;
    let said = openai_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "tok0 tok1 tok2 ");
    let line = &proxy.log.wait_for(8).await[7];
    assert_eq!(line["final_route"], "gemini", "{line}");
    assert_eq!(line["tokens_out"], 3, "{line}");
    // With no pool left, Gemini's error in the client's dialect.
    let g = mock("gemini", Behavior::Status(503)).await;
    proxy.apply(&policy(&gemini_pool(&g.url(), ""), "gemini"));
    let r = post(&proxy, "/v1/messages", &hello(false), &anthropic).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "overloaded_error");
    assert_eq!(r.json()["error"]["message"], "mock gemini answered 503");
    let g = mock("gemini", Behavior::Status(503)).await;
    proxy.apply(&policy(&gemini_pool(&g.url(), ""), "gemini"));
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&proxy, "/v1/chat/completions", &chat, &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.json()["error"]["message"], "mock gemini answered 503");
}

const OPENAI_SDK_STEPS: [&str; 4] = [
    "chat.completions.create",
    "stream",
    "tool call",
    "tool round trip",
];

/// The official `openai` Python SDK against a Gemini mock pool:
/// `chat.completions.create`, a stream with its usage chunk, a tool call
/// and its round trip (the thought signature carried back in the call's
/// id) (`tests/python/openai_sdk.py`). Skipped, saying so, when the
/// package is not installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_sdk_against_a_gemini_pool() {
    if !python_has("openai") {
        return;
    }
    let gemini = mock("gemini", Behavior::Gemini).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&gemini_pool(&gemini.url(), ""), "gemini"),
    )
    .await;
    run_sdk_script_with("openai_sdk.py", &proxy, &[MODEL], &OPENAI_SDK_STEPS).await;
    assert!(gemini.requests()[0]
        .path
        .starts_with("/v1beta/models/gemini-2.5-flash:"));
}

/// The same script against an Azure OpenAI mock pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_sdk_against_an_azure_pool() {
    if !python_has("openai") {
        return;
    }
    let azure = mock("azure", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&azure_pool(&azure.url(), ""), "azure"),
    )
    .await;
    run_sdk_script_with("openai_sdk.py", &proxy, &[MODEL], &OPENAI_SDK_STEPS).await;
    assert!(azure.requests().iter().all(
        |r| r.path == "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
    ));
}

/// The official `anthropic` Python SDK against a Gemini mock pool:
/// `messages.create`, `messages.stream(...)` with `get_final_message()`, a
/// tool-use round trip, `count_tokens`, `models.list` and a shed
/// (`tests/python/anthropic_sdk.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_python_sdk_against_a_gemini_pool() {
    if !python_has("anthropic") {
        return;
    }
    let gemini = mock("gemini", Behavior::Gemini).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&gemini_pool(&gemini.url(), ""), "gemini"),
    )
    .await;
    run_sdk_script_with(
        "anthropic_sdk.py",
        &proxy,
        &[MODEL],
        &[
            "messages.create",
            "messages.stream",
            "tool_use round trip",
            "count_tokens",
            "models.list",
            "overloaded",
        ],
    )
    .await;
    assert!(gemini.stats().received >= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_pool_without_a_model_calls_the_requests() {
    let gemini = mock("gemini", Behavior::Gemini).await;
    let pool = gemini_pool(&gemini.url(), "").replace("      model: gemini-2.5-flash\n", "");
    let yaml = policy(&pool, "gemini").replace(
        &format!("model: [\"{MODEL}\"]"),
        &format!("model: [\"{MODEL}\", \"bad/model\"]"),
    );
    let proxy = TestProxy::with_policy(Settings::default(), &yaml).await;
    let ask =
        |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&proxy, "/v1/chat/completions", &ask(MODEL), &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        gemini.requests()[0].path,
        format!("/v1beta/models/{MODEL}:generateContent")
    );
    // A model that would change the path: the attempt is never sent.
    let r = post(&proxy, "/v1/chat/completions", &ask("bad/model"), &[]).await;
    assert!(!r.status.is_success(), "{}", r.text());
    assert_eq!(gemini.stats().received, 1);
    let line = &proxy.log.wait_for(2).await[1];
    assert_eq!(line["attempts"][0]["outcome"], "invalid_request", "{line}");
}
