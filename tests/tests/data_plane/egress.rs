//! Pools of other providers than OpenAI-compatible servers (issue 29):
//! Azure OpenAI deployments (`provider: azure_openai`) and Gemini
//! (`provider: gemini`), each reached by OpenAI and Anthropic clients,
//! over real HTTP to mock endpoints that answer as those APIs do.

use http::{Method, StatusCode};
use router_dialect::check::{anthropic_stream, openai_stream};
use router_mock::Behavior;
use router_proxy::Settings;
use router_tests::harness::{TestProxy, TestResponse};
use router_tests::mocks::mock;
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
