//! Items 7 and 8: a `json_object` request answered with prose. Before, one
//! such answer degraded the pool for structured output for every tenant
//! (the next tenant's request got `503 no_backend`), and with `retry_on:
//! [malformed_json]` every pool of the chain generated, paid by the
//! operator and settled at zero.

use std::time::Duration;

use http::StatusCode;
use router_mock::Behavior;
use router_tests::harness::eventually;
use router_tests::mocks::mock;
use router_tests::proxy_process::ProxyProcess;
use router_tests::redis::RedisServer;

use super::{chat_body, micros, policy, tenant};

async fn structured(proxy: &ProxyProcess, key: &str, body: &str) -> StatusCode {
    super::send_as(proxy, key, body).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_switch_structured_output_off_and_every_generation_is_paid() {
    let redis = RedisServer::start("attacks-structured").await;
    let a = mock("a", Behavior::Content("Sure! Here is your JSON.".into())).await;
    let b = mock("b", Behavior::Content("Of course: no JSON today.".into())).await;
    let doc = policy(
        &[("a", &a.url(), ""), ("b", &b.url(), "")],
        "retry_on: [connect_error, timeout, status_5xx, malformed_json]",
        &[
            tenant("team-1", "rt_1", "budget_usd_per_day: 100"),
            tenant("team-2", "rt_2", "budget_usd_per_day: 100"),
        ],
    );
    let proxy = ProxyProcess::start(
        "structured",
        &doc,
        &[("CUSTOM_ROUTER_SHARED_STORE", redis.url().as_str())],
    );
    redis.wait_for_a_client().await;
    let body = chat_body(r#""max_tokens":100,"response_format":{"type":"json_object"},"#);
    // team-1's prose answers, many of them: both pools generate each time.
    for _ in 0..4 {
        let status = structured(&proxy, "rt_1", &body).await;
        assert_ne!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!((a.stats().received, b.stats().received), (4, 4));
    // team-2 is still served by the pools (item 7): one tenant's requests
    // are not the backend's failure pattern.
    let status = structured(&proxy, "rt_2", &body).await;
    assert_ne!(status, StatusCode::SERVICE_UNAVAILABLE, "team-2 was shed");
    assert_eq!(a.stats().received, 5, "team-2's request reached pool a");
    // Item 8: team-1 paid for the eight generations (each answer's usage:
    // the mock's prompt tokens and 5 completion tokens), not zero.
    let prompt = (body.len() as u64).div_ceil(4);
    let key = format!("router:spend:team-1:{}", super::today());
    let want = 8 * micros(prompt + 5);
    eventually(Duration::from_secs(10), "team-1's spend settled", || {
        redis.get(&key) == Some(want.to_string())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_the_request_explains_degrades_nothing() {
    // A `max_tokens` the answer reached explains its malformed JSON: even
    // from two tenants, such failures never degrade the pool.
    let a = mock("a", Behavior::Content("{\"cut\": ".into())).await;
    let b = mock("b", Behavior::Json).await;
    let doc = policy(
        &[("a", &a.url(), ""), ("b", &b.url(), "")],
        "retry_on: [connect_error, timeout, status_5xx, malformed_json]",
        &[tenant("team-1", "rt_1", ""), tenant("team-2", "rt_2", "")],
    );
    let proxy = ProxyProcess::start("structured-explained", &doc, &[]);
    // The mock reports 5 completion tokens: a cap of 5 was reached.
    let body = chat_body(r#""max_tokens":5,"response_format":{"type":"json_object"},"#);
    for key in ["rt_1", "rt_2", "rt_1", "rt_2", "rt_1", "rt_2"] {
        structured(&proxy, key, &body).await;
    }
    assert_eq!(a.stats().received, 6, "pool a was never degraded");
}
