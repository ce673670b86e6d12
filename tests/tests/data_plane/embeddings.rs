//! Embeddings through the router (issue 30, item 10): `POST
//! /v1/embeddings` routed like a chat completion, the answer's usage
//! counted (tokens, cost, the tenant's spend), and the official `openai`
//! SDK's `embeddings.create` against it.

use http::StatusCode;
use router_mock::Behavior;
use router_proxy::Settings;
use router_tests::harness::{tenant_item, TestProxy};
use router_tests::mocks::mock;

fn policy(url: &str) -> String {
    format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: embed\n      model: nomic-embed-text\n      endpoints: [\"{url}\"]\n      price: {{input_per_1k_usd: 0.5, output_per_1k_usd: 0}}\n  routes:\n    - name: embeddings\n      match: {{path_prefix: /v1/embeddings}}\n      chain: [embed]\n  tenants:\n{}",
        tenant_item("team-a", "rt_embed_key", "")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_routed_and_their_usage_is_counted() {
    let backend = mock("embed", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&backend.url())).await;
    let body = r#"{"model":"text-embedding-3-small","input":["alpha beta gamma","delta"]}"#;
    let r = proxy
        .client
        .send(
            http::Method::POST,
            &proxy.url("/v1/embeddings"),
            &[
                ("content-type", "application/json"),
                ("authorization", "Bearer rt_embed_key"),
            ],
            body.to_string(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    // The pool's model went to the backend; the key did not.
    let sent = &backend.requests()[0];
    assert_eq!(sent.path, "/v1/embeddings");
    let sent_body: serde_json::Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(sent_body["model"], "nomic-embed-text");
    assert!(sent.headers.get("authorization").is_none());
    // Usage: "alpha beta gamma" (16 bytes: 4 tokens) + "delta" (2), no
    // output; priced at the input rate; the tenant's cost counted.
    let line = &proxy.log.wait_for(1).await[0];
    assert_eq!(line["route"], "embeddings");
    assert_eq!(line["tokens_in"], 6);
    assert_eq!(line["tokens_out"], serde_json::Value::Null);
    assert_eq!(line["cost_usd"].as_f64(), Some(6.0 * 0.5 / 1000.0));
    assert_eq!(line["tenant"], "team-a");
    let m = proxy.metrics().await;
    assert!(
        m.contains(r#"router_tokens_total{pool="embed",kind="input"} 6"#),
        "{m}"
    );
    assert!(
        m.contains(r#"router_tenant_cost_usd_total{tenant="team-a"} 0.003"#),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_creates_embeddings_through_the_router() {
    if !super::anthropic::python_has("openai") {
        return;
    }
    let backend = mock("embed", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&backend.url())).await;
    super::anthropic::run_sdk_script_with(
        "openai_embeddings.py",
        &proxy,
        &["text-embedding-3-small", "rt_embed_key"],
        &["embeddings.create", "embeddings batch"],
    )
    .await;
    assert_eq!(backend.stats().received, 2);
}
