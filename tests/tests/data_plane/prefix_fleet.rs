//! Issue 31: longest-prefix affinity across a fleet of proxies. Two
//! proxies share one Redis; what one learns of where a conversation went
//! (the blocks it sent to an engine) reaches the other over the store's
//! publish/subscribe, so the next turn, sent through the other proxy,
//! goes to the engine that holds its prefix, and the other proxy's
//! explain shows those blocks held there.

use std::time::Duration;

use http::{Method, StatusCode};
use router_mock::MOCK_NAME_HEADER;
use router_proxy::Settings;
use router_tests::harness::TestProxy;
use router_tests::mocks::mock_engine;
use router_tests::redis::RedisServer;
use serde_json::json;

async fn explain(proxy: &TestProxy, prompt: &str) -> serde_json::Value {
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/_custom_router/explain"),
            &[("authorization", "Bearer admin")],
            json!({"model": "m", "prompt": prompt}).to_string(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_proxy_learns_of_a_conversation_the_other_routes_by() {
    let mut engines = Vec::new();
    for name in ["gpu-a", "gpu-b", "gpu-c"] {
        engines.push(mock_engine(name).await);
    }
    let urls: Vec<String> = engines.iter().map(|e| format!("\"{}\"", e.url())).collect();
    let policy = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: gpus\n      provider: vllm\n      endpoints: [{}]\n      capacity_probe: {{kind: vllm, interval_ms: 40}}\n      balance: engine_aware\n      engine_aware: {{affinity: prefix}}\n  routes:\n    - {{name: r, chain: [gpus]}}\n",
        urls.join(", ")
    );
    let redis = RedisServer::start("prefix-fleet").await;
    let admin = || Settings {
        admin_token: Some("admin".into()),
        ..Settings::default()
    };
    let a = TestProxy::on_store(&redis, admin(), &policy).await;
    let b = TestProxy::on_store(&redis, admin(), &policy).await;
    tokio::time::sleep(Duration::from_millis(120)).await;

    let system = "You are a careful assistant who plans trips. ".repeat(30);
    let opening = "Plan three days in Lisbon, with museums and food. ".repeat(8);
    let turn1 = json!({"model": "m", "max_tokens": 4, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": opening},
    ]})
    .to_string();
    // The next turn's prompt as the proxies hash it (roles and contents,
    // a line each): it extends the first turn's.
    let next_prompt =
        format!("system\n{system}\nuser\n{opening}\nassistant\nSure.\nuser\nAnd the hotels?\n");
    let first_blocks = (next_prompt.find("assistant\n").unwrap()) / 256;

    // Turn 1 through A; B learns where it went. (Sent again until B's
    // subscription is up: each placement is published.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let served_by = loop {
        let r = a.chat_with(&[], &turn1).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let served_by = r.header(MOCK_NAME_HEADER).unwrap().to_string();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let e = explain(&b, &next_prompt).await;
        let held: Vec<(String, u64)> = e["balance"]["signals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["addr"].as_str().unwrap().to_string(),
                    s["prefix_matched_blocks"].as_u64().unwrap(),
                )
            })
            .collect();
        let url = engines[["gpu-a", "gpu-b", "gpu-c"]
            .iter()
            .position(|n| *n == served_by)
            .unwrap()]
        .url();
        if held
            .iter()
            .any(|(addr, m)| *addr == url && *m as usize == first_blocks)
        {
            // Only there.
            assert!(
                held.iter().all(|(addr, m)| *addr == url || *m == 0),
                "{held:?}"
            );
            assert_eq!(e["balance"]["endpoint"].as_str(), Some(url.as_str()), "{e}");
            break served_by;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "B never learned: {e}"
        );
    };
    // The next turn through B goes to that engine.
    let turn2 = json!({"model": "m", "max_tokens": 4, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": opening},
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "And the hotels?"},
    ]})
    .to_string();
    let r = b.chat_with(&[], &turn2).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header(MOCK_NAME_HEADER), Some(served_by.as_str()));
}
