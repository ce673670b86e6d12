//! Item 1: `POST /v1/chat/completion%73` (or `/v1/%63hat/completions`)
//! reached a backend that decodes the path, with the client's own model
//! and the operator's key, and the route log saw no usage. The path is now
//! normalized once, and that path is matched and forwarded.

use http::{Method, StatusCode};
use router_mock::Behavior;
use router_tests::harness::TestClient;
use router_tests::mocks::mock;
use router_tests::proxy_process::ProxyProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_path_is_read_rewritten_and_forwarded_normalized() {
    let backend = mock("local", Behavior::Json).await;
    let doc = super::policy(
        &[(
            "local",
            &backend.url(),
            "model: pinned-model\napi_key_env: ATTACKS_POOL_API_KEY",
        )],
        "",
        &[],
    );
    let proxy = ProxyProcess::start(
        "paths",
        &doc,
        &[("ATTACKS_POOL_API_KEY", "sk-operator-key")],
    );
    let client = TestClient::new();
    let body = r#"{"model":"gpt-very-expensive","messages":[{"role":"user","content":"hi"}]}"#;
    let headers = [("content-type", "application/json")];
    let shapes = [
        "/v1/chat/completion%73",
        "/v1/%63hat/completions",
        "/%76%31/chat/completions",
        "//v1/./chat/completions/",
        "/v1/x/../chat/completions",
        "/v1/x/%2e%2E/chat/completions",
    ];
    for (i, path) in shapes.iter().enumerate() {
        let r = client
            .send(Method::POST, &proxy.url(path), &headers, body)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
        let sent = &backend.requests()[i];
        assert_eq!(sent.path, "/v1/chat/completions", "{path}");
        let json: serde_json::Value = serde_json::from_slice(&sent.body).unwrap();
        assert_eq!(json["model"], "pinned-model", "{path}: the pool's model");
        assert_eq!(
            sent.headers
                .get("authorization")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer sk-operator-key"),
            "{path}"
        );
    }
    // Every one was read as a chat call: its usage is in the route log.
    let lines = proxy.wait_for_lines(shapes.len());
    for l in &lines {
        assert_eq!(l["path"], "/v1/chat/completions", "{l}");
        assert!(l["tokens_in"].as_u64().is_some(), "no usage read: {l}");
    }
    // What cannot be normalized without guessing is refused, unsent.
    for path in [
        "/v1/chat%2Fcompletions",
        "/v1%5Cchat/completions",
        "/v1/chat/completions%00",
        "/v1/chat/completion%7",
    ] {
        let r = client
            .send(Method::POST, &proxy.url(path), &headers, body)
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.text());
        assert_eq!(r.error_type(), "invalid_request", "{path}");
    }
    assert_eq!(backend.stats().received, shapes.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_path_is_held_to_the_tenants_routes() {
    // A tenant allowed only the `other` route cannot reach `chat` (matched
    // by path) by encoding the path.
    let backend = mock("local", Behavior::Json).await;
    let doc = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: local\n      endpoints: [\"{}\"]\n  routes:\n    - name: chat\n      match: {{path_prefix: /v1/chat}}\n      chain: [local]\n    - name: other\n      chain: [local]\n  tenants:\n    - name: team-a\n      keys: [\"{}\"]\n      routes: [other]\n",
        backend.url(),
        router_policy::tenant::key_hash_text("rt_a")
    );
    let proxy = ProxyProcess::start("paths-tenant", &doc, &[]);
    let client = TestClient::new();
    let body = super::chat_body("");
    for path in [
        "/v1/chat/completions",
        "/v1/%63hat/completions",
        "/v1//chat/completions",
    ] {
        let r = client
            .send(
                Method::POST,
                &proxy.url(path),
                &[
                    ("content-type", "application/json"),
                    ("authorization", "Bearer rt_a"),
                ],
                body.clone(),
            )
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {}", r.text());
    }
    assert_eq!(backend.stats().received, 0);
}
