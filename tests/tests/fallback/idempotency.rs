//! A client retry with an `Idempotency-Key` never generates twice.

use futures_util::future::join_all;
use http::StatusCode;
use router_mock::Behavior;
use router_tests::harness::TestProxy;
use router_tests::mocks::{mock, mock_latency, mock_sse};

use crate::settings;

fn policy(url: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["{url}"]
  routes:
    - name: r
      chain: [only]
"#
    )
}

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"pay once"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_flight_joins_and_a_later_one_gets_the_stored_answer() {
    let m = mock_latency("m", 200).await;
    let proxy = TestProxy::with_policy(settings(), &policy(&m.url())).await;
    let key = [("idempotency-key", "order-77")];
    let both = join_all((0..3).map(|_| proxy.chat_with(&key, BODY))).await;
    for r in &both {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, both[0].body, "every copy is the one answer");
    }
    assert_eq!(m.stats().received, 1, "generated once");
    // Nothing to wait for: the first request stored its answer before
    // answering, so a retry from now on is a replay.
    let again = proxy.chat_with(&key, BODY).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.header("x-router-replayed"), Some("true"));
    assert_eq!(again.body, both[0].body);
    assert_eq!(m.stats().received, 1);
    // The same key with another request is a client bug.
    let other = proxy
        .chat_with(
            &key,
            r#"{"model":"m","messages":[{"role":"user","content":"pay twice"}]}"#,
        )
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.error_type(), "idempotency_mismatch");
    let lines = proxy.log.wait_for(5).await;
    assert_eq!(
        lines.iter().filter(|l| l["outcome"] == "replayed").count(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_is_replayed_not_generated_again() {
    let m = mock_sse("m", 3, 10).await;
    let proxy = TestProxy::with_policy(settings(), &policy(&m.url())).await;
    let key = [("idempotency-key", "stream-1")];
    let body = r#"{"model":"m","stream":true}"#;
    let first = proxy.chat_with(&key, body).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.text().contains("data: [DONE]"), "{}", first.text());
    // The stream's frames are stored once it ends (a task settles it).
    let mut retry = proxy.chat_with(&key, body).await;
    for _ in 0..100 {
        if retry.header("x-router-replayed").is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        retry = proxy.chat_with(&key, body).await;
    }
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.header("x-router-replayed"), Some("true"));
    assert_eq!(retry.body, first.body, "the same frames, byte for byte");
    assert_eq!(
        retry.header("content-type"),
        first.header("content-type"),
        "replayed as a stream"
    );
    assert_eq!(m.stats().received, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_cap_is_not_replayable() {
    let m = mock_latency("m", 0).await;
    let mut s = settings();
    s.idempotency_max_answer_bytes = 16;
    let proxy = TestProxy::with_policy(s, &policy(&m.url())).await;
    let key = [("idempotency-key", "big-1")];
    assert_eq!(proxy.chat_with(&key, BODY).await.status, StatusCode::OK);
    let retry = proxy.chat_with(&key, BODY).await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(retry.error_type(), "not_replayable");
    assert_eq!(retry.json()["error"]["request_id"], "big-1");
    assert_eq!(m.stats().received, 1, "not generated twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_larger_than_the_stores_byte_budget_is_not_replayable_and_counted() {
    // Under the answer cap, over the whole in-process store's budget.
    let m = mock("m", Behavior::Content("x".repeat(1_100_000))).await;
    let mut s = settings();
    s.idempotency_max_answer_bytes = 4 * 1024 * 1024;
    s.idempotency_max_bytes = 1024 * 1024;
    let proxy = TestProxy::with_policy(s, &policy(&m.url())).await;
    let key = [("idempotency-key", "huge-1")];
    let first = proxy.chat_with(&key, BODY).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(
        first.body.len() > 1_100_000,
        "the client got the whole answer"
    );
    let retry = proxy.chat_with(&key, BODY).await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(retry.error_type(), "not_replayable");
    assert_eq!(m.stats().received, 1, "not generated twice");
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("router_idempotency_events_total{event=\"over_budget\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_request_does_not_block_its_retry() {
    let m = mock("m", Behavior::Status(503)).await;
    let proxy = TestProxy::with_policy(settings(), &policy(&m.url())).await;
    let key = [("idempotency-key", "retry-me")];
    assert_eq!(
        proxy.chat_with(&key, BODY).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    m.set_behavior(Behavior::Json);
    let r = proxy.chat_with(&key, BODY).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "nothing was generated the first time: route again"
    );
    assert_eq!(m.stats().received, 2);
}
