//! Retry inside the pool first (issue #21, item 1): a failed attempt is
//! retried on another endpoint of the same pool, at once, before the chain
//! moves on; READ and DRAFT for any retryable failure, SEND only for one
//! that provably never reached a backend.

use http::StatusCode;
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_tests::harness::TestProxy;
use router_tests::mocks::mock;

use crate::settings;

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// One pool of `endpoints`, no circuit breaking in the way (this is about
/// retries), `route_extra` on its route.
fn one_pool(endpoints: &[String], route_extra: &str) -> String {
    let list = endpoints
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 1000}}
  pools:
    - name: gpu
      endpoints: [{list}]
  routes:
    - name: default
      chain: [gpu]
      {route_extra}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_endpoint_beside_a_healthy_one_fails_no_client() {
    let bad = mock("bad", Behavior::Status(500)).await;
    let good = mock("good", Behavior::Json).await;
    let proxy = TestProxy::with_policy(settings(), &one_pool(&[bad.url(), good.url()], "")).await;
    for i in 0..20 {
        let id = format!("r-{i}");
        let r = proxy
            .chat_with(&[("x-request-id", id.as_str())], BODY)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("good"));
    }
    // The bad endpoint was tried, and every request it failed was answered
    // by the other, with the same request id.
    let tried_bad = bad.stats().received;
    assert!(tried_bad >= 1);
    let lines = proxy.log.wait_for(20).await;
    let retried: Vec<_> = lines
        .iter()
        .filter(|l| l["attempts"].as_array().unwrap().len() == 2)
        .collect();
    assert_eq!(retried.len() as u64, tried_bad);
    let l = retried[0];
    assert_eq!(l["attempts"][0]["endpoint"], bad.url());
    assert_eq!(l["attempts"][0]["outcome"], "status_5xx");
    assert_eq!(l["attempts"][1]["endpoint"], good.url());
    assert_eq!(l["outcome"], "ok");
    // The walk's typed notes: failed on the pool, then retried in it.
    assert_eq!(l["walk"][0]["note"], "failed", "{l}");
    assert_eq!(l["walk"][0]["outcome"], "status_5xx", "{l}");
    assert_eq!(l["walk"][1]["note"], "retried_in_pool", "{l}");
    assert_eq!(l["walk"][1]["pool"], l["attempts"][0]["pool"], "{l}");
    let reason = l["reason"].as_str().unwrap();
    assert!(reason.contains("retried on another endpoint"), "{reason}");
    let id = l["request_id"].as_str().unwrap();
    assert!(bad
        .requests()
        .iter()
        .any(|r| r.headers["x-request-id"] == id));
    assert!(good
        .requests()
        .iter()
        .any(|r| r.headers["x-request-id"] == id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_endpoint_costs_no_client_an_error() {
    let good = mock("good", Behavior::Json).await;
    let refused = format!(
        "http://127.0.0.1:{}",
        router_tests::server_process::free_port()
    );
    let policy = one_pool(&[refused, good.url()], "deadline_ms: 3000");
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    for _ in 0..6 {
        let r = proxy.chat_with(&[], BODY).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("good"));
    }
    let lines = proxy.log.wait_for(6).await;
    assert!(lines
        .iter()
        .any(|l| l["attempts"][0]["outcome"] == "connect_error"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_request_is_retried_in_the_pool_only_when_it_never_reached_a_backend() {
    let bad = mock("bad", Behavior::Status(500)).await;
    let good = mock("good", Behavior::Json).await;
    let refused = format!(
        "http://127.0.0.1:{}",
        router_tests::server_process::free_port()
    );
    // A refused connection never reached a backend: retried.
    let proxy = TestProxy::with_policy(settings(), &one_pool(&[refused, good.url()], "")).await;
    for _ in 0..4 {
        let r = proxy.chat_with(&[("x-router-risk", "SEND")], BODY).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    // A 500 may have acted: never sent again, the client gets it.
    let proxy = TestProxy::with_policy(settings(), &one_pool(&[bad.url(), good.url()], "")).await;
    let before = good.stats().received;
    let mut failed = 0;
    for _ in 0..6 {
        let r = proxy.chat_with(&[("x-router-risk", "SEND")], BODY).await;
        if r.status == StatusCode::INTERNAL_SERVER_ERROR {
            failed += 1;
        }
    }
    // Some went to the bad endpoint first and were not retried.
    assert!(failed >= 1);
    assert_eq!(good.stats().received - before, 6 - failed);
    assert_eq!(bad.stats().received, failed);
}
