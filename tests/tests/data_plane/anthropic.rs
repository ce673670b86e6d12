//! Anthropic Messages clients in front of OpenAI-compatible pools (issue
//! 29): `POST /v1/messages` translated and routed as a chat completion,
//! its answer and stream translated back (the stream as it flows), the
//! router's own errors in Anthropic's shape, a tenant key as `x-api-key`,
//! `count_tokens` and `GET /v1/models`; then the official `anthropic`
//! Python SDK through the router.

use std::time::Duration;

use http::{Method, StatusCode};
use http_body_util::BodyExt;
use router_dialect::check::anthropic_stream;
use router_mock::{Behavior, StreamEnding, StreamScript};
use router_policy::tenant::key_hash_text;
use router_proxy::Settings;
use router_tests::harness::{TestProxy, TestResponse};
use router_tests::mocks::{mock, mock_stream};
use serde_json::{json, Value};
use tokio::time::Instant;

const MODEL: &str = "claude-sonnet-4-5";

/// A policy routing `claude-sonnet-4-5` through `chain` (pool name, URL;
/// each pool's model `qwen3`); `route_extra` and `spec_extra` are YAML
/// lines for the route and the spec.
fn policy(chain: &[(&str, String)], route_extra: &str, spec_extra: &str) -> String {
    let pools: String = chain
        .iter()
        .map(|(n, u)| format!("    - name: {n}\n      model: qwen3\n      endpoints: [\"{u}\"]\n"))
        .collect();
    let names = chain.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
{spec_extra}
  pools:
{pools}  routes:
    - name: agents
      match: {{model: ["{MODEL}"]}}
      chain: [{names}]
{route_extra}
"#
    )
}

async fn start(chain: &[(&str, String)]) -> TestProxy {
    TestProxy::with_policy(Settings::default(), &policy(chain, "", "")).await
}

/// `POST path` as Anthropic's SDKs send it, with `extra` headers.
async fn send(proxy: &TestProxy, path: &str, body: &Value, extra: &[(&str, &str)]) -> TestResponse {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
    ];
    headers.extend_from_slice(extra);
    proxy
        .client
        .send(Method::POST, &proxy.url(path), &headers, body.to_string())
        .await
}

fn hello(text: &str, stream: bool) -> Value {
    json!({"model": MODEL, "max_tokens": 64, "stream": stream,
        "messages": [{"role": "user", "content": text}]})
}

/// The Anthropic error of an answer: (status, error type, router code).
fn anthropic_error(r: &TestResponse) -> (u16, String, String) {
    let v = r.json();
    assert_eq!(v["type"], "error", "{}", r.text());
    (
        r.status.as_u16(),
        v["error"]["type"].as_str().unwrap_or_default().to_owned(),
        v["error"]["code"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_request_is_routed_as_a_chat_completion_and_answered_in_anthropics_shape() {
    let backend = mock("local", Behavior::Chat).await;
    let proxy = start(&[("local", backend.url())]).await;
    let body = json!({"model": MODEL, "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": "u-1"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    // Claude Code sends `?beta=true` and its key as `x-api-key`.
    let r = send(
        &proxy,
        "/v1/messages?beta=true",
        &body,
        &[("x-api-key", "sk-ant-client-key")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-router-route"), Some("local"));
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["content"], json!([{"type": "text", "text": "echo: hi"}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["output_tokens"], 2);
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );

    // The pool got an OpenAI chat completion: at its path, with its model,
    // without the client's Anthropic headers (its key above all).
    let sent = &backend.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    let b: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(b["model"], "qwen3");
    assert_eq!(
        b["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(b["user"], "u-1");
    assert_eq!(b["max_tokens"], 64);
    for h in ["x-api-key", "anthropic-version"] {
        assert!(
            sent.headers.get(h).is_none(),
            "{h} sent: {:?}",
            sent.headers
        );
    }
    assert_eq!(
        sent.headers["content-length"],
        sent.body.len().to_string().as_str()
    );

    // One route line, naming the client's dialect and path.
    let line = &proxy.log.wait_for(1).await[0];
    assert_eq!(line["dialect"], "anthropic");
    assert_eq!(line["path"], "/v1/messages");
    assert_eq!(line["route"], "agents");
    assert_eq!(line["model"], MODEL);
    assert_eq!(line["tokens_out"], 2);
    assert_eq!(line["outcome"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_translated_as_it_flows_into_well_formed_anthropic_events() {
    let backend = mock_stream(
        "local",
        StreamScript {
            chunks: 4,
            interval: Duration::from_millis(200),
            ..StreamScript::default()
        },
    )
    .await;
    let proxy = start(&[("local", backend.url())]).await;
    let t0 = Instant::now();
    let resp = proxy
        .client
        .stream(
            Method::POST,
            &proxy.url("/v1/messages"),
            hello("hi", true).to_string(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    let mut first_text = None;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            bytes.extend_from_slice(&data);
            if first_text.is_none() && String::from_utf8_lossy(&bytes).contains("text_delta") {
                first_text = Some(t0.elapsed());
            }
        }
    }
    let all = t0.elapsed();
    // The first text reached the client while the rest was generated
    // (three more chunks, 200 ms apart): never buffered whole.
    let first = first_text.expect("a text delta");
    assert!(
        all.saturating_sub(first) >= Duration::from_millis(500),
        "first text at {first:?}, end at {all:?}"
    );
    let said = anthropic_stream(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    assert_eq!(said.text, "tok0 tok1 tok2 tok3 ");
    assert_eq!(said.stop_reason.as_deref(), Some("end_turn"));
    assert_eq!(said.error, None);
    // Usage was asked of the pool for the client, and reached it.
    let sent: Value = serde_json::from_slice(&backend.requests()[0].body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(said.usage.map(|u| u.output), Some(4));
    let line = &proxy.log.wait_for(1).await[0];
    assert_eq!(line["tokens_out"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_use_round_trip_streamed_and_not() {
    let backend = mock("local", Behavior::Chat).await;
    let proxy = start(&[("local", backend.url())]).await;
    let tools = json!([{"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}]);
    let ask = |stream: bool| {
        json!({"model": MODEL, "max_tokens": 64, "stream": stream, "tools": tools,
            "messages": [{"role": "user", "content": "Paris"}]})
    };
    // Streamed: one tool_use block, its arguments as input_json_delta.
    let r = send(&proxy, "/v1/messages", &ask(true), &[]).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.tools.len(), 1, "{}", r.text());
    let (id, name, input) = &said.tools[0];
    assert_eq!(
        (name.as_str(), input.as_str()),
        ("get_weather", r#"{"text":"Paris"}"#)
    );
    assert_eq!(said.stop_reason.as_deref(), Some("tool_use"));
    // Not streamed: the same call, its input an object.
    let r = send(&proxy, "/v1/messages", &ask(false), &[]).await;
    let v = r.json();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["content"][0]["type"], "tool_use");
    assert_eq!(v["content"][0]["input"], json!({"text": "Paris"}));
    // The result goes back as an OpenAI tool message; the answer uses it.
    let turn = json!({"model": MODEL, "max_tokens": 64, "tools": tools, "messages": [
        {"role": "user", "content": "Paris"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "get_weather", "input": {"text": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "sunny"}]}]});
    let r = send(&proxy, "/v1/messages", &turn, &[]).await;
    assert_eq!(
        r.json()["content"][0]["text"],
        "tool said: sunny",
        "{}",
        r.text()
    );
    let sent: Value = serde_json::from_slice(&backend.requests()[2].body).unwrap();
    assert_eq!(sent["messages"][1]["tool_calls"][0]["id"], id.as_str());
    assert_eq!(sent["messages"][2]["role"], "tool");
    assert_eq!(sent["messages"][2]["tool_call_id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_answers_json_to_a_streamed_request_is_still_a_stream_for_the_client() {
    // The mock's JSON behaviour ignores `stream`.
    let backend = mock("local", Behavior::Json).await;
    let proxy = start(&[("local", backend.url())]).await;
    let r = send(&proxy, "/v1/messages", &hello("hi", true), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "hello from local");
    assert_eq!(said.usage.map(|u| u.output), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_and_upstream_failures_reach_an_anthropic_client_in_its_shape() {
    // A 503 first: the next pool answers, the client sees one clean stream.
    let down = mock("down", Behavior::Status(503)).await;
    let up = mock("up", Behavior::Chat).await;
    let proxy = start(&[("down", down.url()), ("up", up.url())]).await;
    let r = send(&proxy, "/v1/messages", &hello("again", true), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-router-route"), Some("up"));
    assert_eq!(r.header("x-router-attempts"), Some("2"));
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: again");

    // An error before the first token fails over too (first-token failover).
    down.set_behavior(Behavior::Stream(StreamScript {
        chunks: 0,
        ending: StreamEnding::Error,
        ..StreamScript::default()
    }));
    let r = send(&proxy, "/v1/messages", &hello("x", true), &[]).await;
    assert_eq!(r.header("x-router-route"), Some("up"));
    assert!(anthropic_stream(&r.body).is_ok(), "{}", r.text());

    // No pool answers: the last failure, in Anthropic's shape, its status kept.
    up.set_behavior(Behavior::Status(503));
    down.set_behavior(Behavior::Status(429));
    let r = send(&proxy, "/v1/messages", &hello("x", false), &[]).await;
    assert_eq!(anthropic_error(&r).0, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "overloaded_error");
    assert_eq!(r.json()["error"]["message"], "mock up answered 503");

    // A 4xx is passed on at once, in Anthropic's shape.
    up.set_behavior(Behavior::Status(400));
    let solo = start(&[("up", up.url())]).await;
    let r = send(&solo, "/v1/messages", &hello("x", true), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_the_first_event_is_one_anthropic_error_event() {
    let backend = mock_stream(
        "local",
        StreamScript {
            chunks: 2,
            ending: StreamEnding::Error,
            ..StreamScript::default()
        },
    )
    .await;
    let proxy = start(&[("local", backend.url())]).await;
    let r = send(&proxy, "/v1/messages", &hello("hi", true), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "tok0 tok1 ");
    let error = said.error.expect("an error event");
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
    assert_eq!(error["error"]["code"], "stream_error");
    assert!(r.text().ends_with("\n\n"));
    assert_eq!(r.text().matches("event: error").count(), 1);

    // The deadline cuts a stream in the client's dialect too.
    backend.set_behavior(Behavior::Stream(StreamScript {
        chunks: 50,
        interval: Duration::from_millis(50),
        ..StreamScript::default()
    }));
    let r = send(
        &proxy,
        "/v1/messages",
        &hello("hi", true),
        &[("x-router-deadline-ms", "400")],
    )
    .await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    let error = said.error.expect("an error event");
    assert_eq!(error["error"]["type"], "timeout_error");
    assert_eq!(error["error"]["code"], "deadline_exhausted");
    assert!(!said.text.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_own_errors_are_in_anthropics_shape() {
    let backend = mock("local", Behavior::Chat).await;
    let spec = format!(
        r#"  tenants:
    - name: team-a
      keys: ["{}"]
      limits:
        requests_per_minute: 40
        requests_burst: 2"#,
        key_hash_text("rt_team_a_key")
    );
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&[("local", backend.url())], "", &spec),
    )
    .await;
    let key = [("x-api-key", "rt_team_a_key")];
    // A model no route serves: a capacity shed, 529 overloaded_error.
    let mut other = hello("hi", false);
    other["model"] = json!("claude-other");
    let r = send(&proxy, "/v1/messages", &other, &key).await;
    assert_eq!(
        anthropic_error(&r),
        (529, "overloaded_error".into(), "no_backend".into())
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    // A field no pool of the chain can carry: 400 naming it.
    let mut top_k = hello("hi", false);
    top_k["top_k"] = json!(5);
    let r = send(&proxy, "/v1/messages", &top_k, &key).await;
    assert_eq!(
        anthropic_error(&r),
        (
            400,
            "invalid_request_error".into(),
            "invalid_request".into()
        )
    );
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`top_k`"));
    // Not JSON: 400.
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/v1/messages"),
            &[("x-api-key", "rt_team_a_key")],
            "{",
        )
        .await;
    assert_eq!(anthropic_error(&r).0, 400);
    // A key that is not a tenant's: 401 authentication_error.
    let r = send(
        &proxy,
        "/v1/messages",
        &hello("hi", false),
        &[("x-api-key", "nope")],
    )
    .await;
    assert_eq!(
        anthropic_error(&r),
        (401, "authentication_error".into(), "unauthorized".into())
    );
    // The tenant's burst of two (40 a minute): the 400 above was one of
    // them (the pools' dialects are known once routed and admitted), then
    // 429 rate_limit_error.
    let r = send(&proxy, "/v1/messages", &hello("hi", false), &key).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = send(&proxy, "/v1/messages", &hello("hi", false), &key).await;
    assert_eq!(
        anthropic_error(&r),
        (429, "rate_limit_error".into(), "rate_limited".into())
    );
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    // Only the one admitted request reached the pool.
    assert_eq!(backend.stats().received, 1);
    // OpenAI clients keep the router's own shape.
    let r = proxy
        .chat_with(&[], r#"{"model":"claude-other","messages":[]}"#)
        .await;
    assert_eq!(r.status.as_u16(), 503);
    assert_eq!(r.error_type(), "no_backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_key_may_come_as_x_api_key_and_never_reaches_a_pool() {
    let backend = mock("local", Behavior::Chat).await;
    let spec = format!(
        "  tenants:\n    - name: team-a\n      keys: [\"{}\"]\n    - name: team-b\n      keys: [\"{}\"]",
        key_hash_text("rt_a"),
        key_hash_text("rt_b")
    );
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&[("local", backend.url())], "", &spec),
    )
    .await;
    let r = send(
        &proxy,
        "/v1/messages",
        &hello("hi", false),
        &[("x-api-key", "rt_a")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // On the OpenAI path too.
    let openai =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let r = proxy.chat_with(&[("x-api-key", "rt_b")], &openai).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    for sent in backend.requests() {
        assert!(
            sent.headers.get("x-api-key").is_none(),
            "{:?}",
            sent.headers
        );
        assert!(sent.headers.get("authorization").is_none());
    }
    // Two keys naming two tenants: refused.
    let r = send(
        &proxy,
        "/v1/messages",
        &hello("hi", false),
        &[("x-api-key", "rt_a"), ("authorization", "Bearer rt_b")],
    )
    .await;
    assert_eq!(anthropic_error(&r).0, 401);
    let lines = proxy.log.wait_for(3).await;
    assert_eq!(lines[0]["tenant"], "team-a");
    assert_eq!(lines[1]["tenant"], "team-b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_and_the_model_list_are_the_routers_own_answers() {
    let backend = mock("local", Behavior::Chat).await;
    let proxy = start(&[("local", backend.url())]).await;
    let body = json!({"model": MODEL, "system": "Be brief.",
        "messages": [{"role": "user", "content": "how many tokens is this?"}]});
    let r = send(&proxy, "/v1/messages/count_tokens", &body, &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // The router's own estimate: the body's bytes / 4, rounded up.
    assert_eq!(
        r.json(),
        json!({"input_tokens": (body.to_string().len() as u64).div_ceil(4)})
    );
    let r = send(
        &proxy,
        "/v1/messages/count_tokens",
        &json!({"messages": 3}),
        &[],
    )
    .await;
    assert_eq!(anthropic_error(&r).0, 400);

    // The models the routes serve: Anthropic's shape with anthropic-version.
    let get = |headers: Vec<(&'static str, &'static str)>, path: &'static str| {
        let proxy = &proxy;
        async move {
            proxy
                .client
                .send(Method::GET, &proxy.url(path), &headers, "")
                .await
        }
    };
    let r = get(vec![("anthropic-version", "2023-06-01")], "/v1/models").await;
    assert_eq!(
        r.json(),
        json!({"data": [{"type": "model", "id": MODEL, "display_name": MODEL,
            "created_at": "1970-01-01T00:00:00Z"}],
            "has_more": false, "first_id": MODEL, "last_id": MODEL})
    );
    // OpenAI's otherwise.
    let r = get(vec![], "/v1/models").await;
    assert_eq!(
        r.json(),
        json!({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "router"}]})
    );
    // Neither reached a backend.
    assert_eq!(backend.stats().received, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_translated_stream_is_replayed_in_the_clients_dialect() {
    let backend = mock("local", Behavior::Chat).await;
    let proxy = start(&[("local", backend.url())]).await;
    let key = [("idempotency-key", "k-anthropic-1")];
    let first = send(&proxy, "/v1/messages", &hello("once", true), &key).await;
    assert!(anthropic_stream(&first.body).is_ok(), "{}", first.text());
    let again = send(&proxy, "/v1/messages", &hello("once", true), &key).await;
    assert_eq!(again.header("x-router-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(backend.stats().received, 1);
}

/// Whether `python3` can import `package`; if not, the test says it is
/// skipped.
pub(crate) fn python_has(package: &str) -> bool {
    let installed = std::process::Command::new("python3")
        .args(["-c", &format!("import {package}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        eprintln!(
            "SKIPPED: the `{package}` Python package is not installed (scripts/install-test-deps installs it)"
        );
    }
    installed
}

/// Runs `tests/python/SCRIPT` against `proxy` and checks that it passed
/// each of `steps`.
async fn run_sdk_script(script: &str, proxy: &TestProxy, steps: &[&str]) {
    run_sdk_script_with(script, proxy, &[MODEL], steps).await;
}

/// Runs `tests/python/SCRIPT BASE_URL ARGS...` and checks that it passed
/// each of `steps`.
pub(crate) async fn run_sdk_script_with(
    script: &str,
    proxy: &TestProxy,
    args: &[&str],
    steps: &[&str],
) {
    let script = format!("{}/python/{script}", env!("CARGO_MANIFEST_DIR"));
    // The script bounds its own calls (a timeout per request).
    let url = proxy.url("");
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(url)
            .args(args)
            .output()
    })
    .await
    .expect("joined")
    .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    eprintln!("{stdout}");
    for step in steps {
        assert!(stdout.contains(&format!("ok {step}")), "{step}: {stdout}");
    }
}

const ANTHROPIC_SDK_STEPS: [&str; 6] = [
    "messages.create",
    "messages.stream",
    "tool_use round trip",
    "count_tokens",
    "models.list",
    "overloaded",
];

/// The official `anthropic` Python SDK through the router, against an
/// OpenAI-compatible mock pool: `messages.create`, `messages.stream(...)`
/// with `get_final_message()`, a tool-use round trip, `count_tokens`,
/// `models.list` and a shed as the SDK's `529` error
/// (`tests/python/anthropic_sdk.py`). Skipped, saying so, when the
/// package is not installed (`scripts/install-test-deps` installs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_python_sdk_through_the_router() {
    if !python_has("anthropic") {
        return;
    }
    let backend = mock("local", Behavior::Chat).await;
    let proxy = start(&[("local", backend.url())]).await;
    run_sdk_script("anthropic_sdk.py", &proxy, &ANTHROPIC_SDK_STEPS).await;
}

/// The same script against an Anthropic mock pool (`provider: anthropic`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_python_sdk_against_an_anthropic_pool() {
    if !python_has("anthropic") {
        return;
    }
    let claude = mock("claude", Behavior::Anthropic).await;
    let proxy =
        TestProxy::with_policy(Settings::default(), &egress_policy(&claude.url(), None)).await;
    run_sdk_script("anthropic_sdk.py", &proxy, &ANTHROPIC_SDK_STEPS).await;
    assert!(claude.stats().received >= 5);
}

/// The official `openai` Python SDK against an Anthropic mock pool:
/// `chat.completions.create`, a stream with its usage chunk, a tool call
/// (`tests/python/openai_sdk.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_sdk_against_an_anthropic_pool() {
    if !python_has("openai") {
        return;
    }
    let claude = mock("claude", Behavior::Anthropic).await;
    let proxy =
        TestProxy::with_policy(Settings::default(), &egress_policy(&claude.url(), None)).await;
    run_sdk_script(
        "openai_sdk.py",
        &proxy,
        &[
            "chat.completions.create",
            "stream",
            "tool call",
            "tool round trip",
        ],
    )
    .await;
    assert_eq!(claude.requests()[0].path, "/v1/messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_takes_no_stream_options_is_not_sent_the_routers() {
    let backend = mock("local", Behavior::Chat).await;
    let yaml = policy(&[("local", backend.url())], "", "").replace(
        "      model: qwen3\n",
        "      model: qwen3\n      stream_usage: false\n",
    );
    let proxy = TestProxy::with_policy(Settings::default(), &yaml).await;
    let r = send(&proxy, "/v1/messages", &hello("hi", true), &[]).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: hi");
    let sent: Value = serde_json::from_slice(&backend.requests()[0].body).unwrap();
    assert_eq!(sent["stream"], true);
    assert!(sent.get("stream_options").is_none(), "{sent}");
    // Its usage then reads zero.
    assert_eq!(said.usage.map(|u| u.output), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_names_no_model_and_passes_the_model_list_to_its_backend() {
    let backend = mock("local", Behavior::Json).await;
    let proxy = TestProxy::sidecar(Settings::default()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let r = proxy
        .client
        .send(Method::GET, &proxy.url("/v1/models"), &[], "")
        .await;
    assert_eq!(r.status, StatusCode::OK);
    // The backend's own page (the mock serves /v1/models as a health page).
    assert_eq!(r.json(), json!({"ok": true}));
    assert_eq!(backend.health_hits(), 1);
}

/// A policy whose route for `claude-sonnet-4-5` tries the Anthropic pool
/// `claude` (model `claude-sonnet-4-5-20250929`, its key in
/// `TEST_ANTHROPIC_POOL_API_KEY`) first, then, when given, the OpenAI pool
/// `local`.
fn egress_policy(claude: &str, local: Option<&str>) -> String {
    std::env::set_var("TEST_ANTHROPIC_POOL_API_KEY", "sk-ant-pool-key");
    let (local_pool, chain) = match local {
        Some(u) => (
            format!("    - name: local\n      model: qwen3\n      endpoints: [\"{u}\"]\n"),
            "claude, local",
        ),
        None => (String::new(), "claude"),
    };
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: claude
      provider: anthropic
      model: claude-sonnet-4-5-20250929
      endpoints: ["{claude}"]
      api_key_env: TEST_ANTHROPIC_POOL_API_KEY
{local_pool}  routes:
    - name: agents
      match: {{model: ["{MODEL}"]}}
      chain: [{chain}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_client_reaches_an_anthropic_pool_as_it_sent_the_request() {
    let claude = mock("claude", Behavior::Anthropic).await;
    let proxy =
        TestProxy::with_policy(Settings::default(), &egress_policy(&claude.url(), None)).await;
    // Fields OpenAI could not carry (top_k, cache_control) pass through.
    let body = json!({"model": MODEL, "max_tokens": 64, "top_k": 5,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}]});
    let r = send(
        &proxy,
        "/v1/messages",
        &body,
        &[
            ("x-api-key", "sk-ant-client"),
            ("anthropic-beta", "prompt-caching-2024-07-31"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["content"][0]["text"], "echo: hi");
    assert_eq!(v["model"], "claude-sonnet-4-5-20250929");
    let sent = &claude.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    // The body unchanged but for the pool's model.
    let mut expected = body.clone();
    expected["model"] = json!("claude-sonnet-4-5-20250929");
    assert_eq!(
        serde_json::from_slice::<Value>(&sent.body).unwrap(),
        expected
    );
    // The pool's key as x-api-key, the client's anthropic-* headers kept.
    assert_eq!(sent.headers["x-api-key"], "sk-ant-pool-key");
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert_eq!(sent.headers["anthropic-beta"], "prompt-caching-2024-07-31");
    assert!(sent.headers.get("authorization").is_none());
    // Streamed: the pool's events pass as they came, usage counted.
    let r = send(&proxy, "/v1/messages", &hello("hi", true), &[]).await;
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: hi");
    let lines = proxy.log.wait_for(2).await;
    assert_eq!(lines[1]["tokens_out"], 2);
    assert!(lines[1]["tokens_in"].as_u64().unwrap() > 0, "{}", lines[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_client_reaches_an_anthropic_pool_translated_both_ways() {
    let claude = mock("claude", Behavior::Anthropic).await;
    let proxy =
        TestProxy::with_policy(Settings::default(), &egress_policy(&claude.url(), None)).await;
    let chat = |stream: bool, tools: bool| {
        let mut b = json!({"model": MODEL, "max_tokens": 64, "stream": stream,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris"}]});
        if stream {
            b["stream_options"] = json!({"include_usage": true});
        }
        if tools {
            b["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]);
        }
        b.to_string()
    };
    let r = proxy
        .chat_with(
            &[("authorization", "Bearer sk-openai-client")],
            &chat(false, false),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "echo: Paris");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    // The pool got an Anthropic request: system apart, its key, no client key.
    let sent = &claude.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    let b: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(b["system"], "Be brief.");
    assert_eq!(b["model"], "claude-sonnet-4-5-20250929");
    assert_eq!(b["max_tokens"], 64);
    assert!(b.get("stream_options").is_none(), "{b}");
    assert_eq!(sent.headers["x-api-key"], "sk-ant-pool-key");
    assert!(sent.headers.get("authorization").is_none());
    // Streamed with a tool call: OpenAI chunks, the usage chunk asked for.
    let r = proxy.chat_with(&[], &chat(true, true)).await;
    let said = router_dialect::check::openai_stream(&r.body)
        .unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.tools.len(), 1, "{}", r.text());
    assert_eq!(said.tools[0].1, "get_weather");
    assert_eq!(said.tools[0].2, r#"{"text":"Paris"}"#);
    assert_eq!(said.stop_reason.as_deref(), Some("tool_calls"));
    assert_eq!(said.usage.map(|u| u.output), Some(3));
    // Without max_tokens, which Anthropic requires: 400 naming it.
    let r = proxy
        .chat_with(
            &[],
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).to_string(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("`max_tokens`"), "{}", r.text());
    assert_eq!(claude.stats().received, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_pool_answering_529_falls_over_to_an_openai_pool_in_the_clients_dialect() {
    let claude = mock("claude", Behavior::Status(529)).await;
    let local = mock("local", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &egress_policy(&claude.url(), Some(&local.url())),
    )
    .await;
    // An Anthropic client, streamed: Claude is overloaded, the local pool answers.
    let r = send(&proxy, "/v1/messages", &hello("hi", true), &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-router-route"), Some("local"));
    let said = anthropic_stream(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    assert_eq!(said.text, "echo: hi");
    assert_eq!(claude.stats().received, 1);
    let line = &proxy.log.wait_for(1).await[0];
    assert_eq!(line["attempts"][0]["outcome"], "status_5xx");
    assert_eq!(line["attempts"][0]["status"], 529);
    // A field only Anthropic can carry: the local pool is passed over,
    // saying why, and Claude's 529 reaches the client in its shape.
    let mut top_k = hello("hi", false);
    top_k["top_k"] = json!(5);
    let r = send(&proxy, "/v1/messages", &top_k, &[]).await;
    assert_eq!(anthropic_error(&r).0, 529, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "overloaded_error");
    assert_eq!(r.json()["error"]["message"], "mock claude answered 529");
    let line = &proxy.log.wait_for(2).await[1];
    let reason = line["reason"].as_str().unwrap();
    assert!(
        reason.contains("local: skipped, cannot carry field `top_k` to dialect openai"),
        "{reason}"
    );
    assert_eq!(local.stats().received, 1);
}
