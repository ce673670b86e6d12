//! Hedged requests: a second attempt when the first has no first token
//! after a delay; the first to produce one wins and the other is
//! cancelled; never for SEND or DESTRUCTIVE; bounded, with retries, by the
//! route's retry budget. Each test counts the mocks' generations.

use http::StatusCode;
use router_mock::{StreamScript, MOCK_NAME_HEADER};
use router_tests::harness::{eventually, TestProxy};
use router_tests::mocks::{mock, mock_stream};

use crate::{metric, ms, settings, two_pools};

const STREAM: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn first_token_after(n: u64) -> StreamScript {
    StreamScript {
        first_token: ms(n),
        chunks: 2,
        interval: ms(1),
        ..StreamScript::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_wins_over_a_slow_first_token_and_the_primary_is_cancelled() {
    let primary = mock_stream("primary", first_token_after(3000)).await;
    let fallback = mock_stream("fallback", first_token_after(0)).await;
    let policy = two_pools(
        &primary.url(),
        &fallback.url(),
        "hedge: {after_ms: 100}",
        "",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let started = tokio::time::Instant::now();
    let r = proxy.chat_with(&[("x-request-id", "h-1")], STREAM).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));
    assert!(started.elapsed() < ms(2000), "{:?}", started.elapsed());
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    // One generation: the primary's was cancelled when the hedge won.
    eventually(ms(2000), "primary cancelled", || {
        primary.stats().cancelled == 1
    })
    .await;
    assert_eq!(primary.stats().completed, 0);
    assert_eq!(fallback.stats().completed, 1);
    for m in [&primary, &fallback] {
        assert_eq!(m.requests()[0].headers["x-request-id"], "h-1");
    }
    let l = &proxy.log.wait_for(1).await[0];
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{l}");
    assert_eq!(attempts[0]["pool"], "primary");
    assert_eq!(attempts[0]["outcome"], "hedge_cancelled");
    assert_eq!(attempts[0]["hedge"], "primary_cancelled");
    assert!(attempts[0]["latency_ms"].as_f64().unwrap() >= 100.0);
    assert_eq!(attempts[1]["pool"], "fallback");
    assert_eq!(attempts[1]["hedge"], "hedge_won");
    assert_eq!(l["outcome"], "ok");
    assert_eq!(l["final_route"], "fallback");
    let m = proxy.metrics().await;
    for (pool, event) in [
        ("fallback", "hedge_started"),
        ("fallback", "hedge_won"),
        ("primary", "hedge_cancelled"),
    ] {
        let series = format!(r#"router_stream_events_total{{pool="{pool}",event="{event}"}}"#);
        assert_eq!(metric(&m, &series), Some(1.0), "{series} in {m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_starts_first_wins_and_the_hedge_is_cancelled() {
    let primary = mock_stream("primary", first_token_after(300)).await;
    let fallback = mock_stream("fallback", first_token_after(3000)).await;
    let policy = two_pools(&primary.url(), &fallback.url(), "hedge: {after_ms: 50}", "");
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let r = proxy.chat_with(&[], STREAM).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("primary"));
    eventually(ms(2000), "hedge cancelled", || {
        fallback.stats().cancelled == 1
    })
    .await;
    assert_eq!(primary.stats().completed, 1);
    assert_eq!(fallback.stats().completed, 0);
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["attempts"][0]["hedge"], "hedge_cancelled");
    assert_eq!(l["attempts"][0]["pool"], "fallback");
    assert_eq!(l["attempts"][1]["hedge"], "primary_won");
    assert_eq!(l["final_route"], "primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_answers_and_send_requests_are_never_hedged() {
    let primary = mock_stream("primary", first_token_after(0)).await;
    let fallback = mock_stream("fallback", first_token_after(0)).await;
    let policy = two_pools(
        &primary.url(),
        &fallback.url(),
        "hedge: {after_ms: 100}",
        "",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    for _ in 0..3 {
        let r = proxy.chat_with(&[], STREAM).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("primary"));
    }
    // A slow SEND: waited for, never sent twice.
    primary.set_behavior(router_mock::Behavior::Stream(first_token_after(400)));
    let r = proxy.chat_with(&[("x-router-risk", "SEND")], STREAM).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("primary"));
    assert_eq!(fallback.stats().received, 0);
    assert_eq!(primary.stats().completed, 4);
    // A route taking only SEND requests cannot be given a hedge.
    let bad = two_pools(
        &primary.url(),
        &fallback.url(),
        "hedge: {after: p95}\n      match: {risk: [SEND]}",
        "",
    );
    let err = router_policy::document::load(&bad, &Default::default()).expect_err("refused");
    assert!(err.to_string().contains("spec.routes[0].hedge"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_inside_the_pool_goes_to_another_endpoint() {
    let slow = mock_stream("slow", first_token_after(3000)).await;
    let fast = mock_stream("fast", first_token_after(0)).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
metadata: {{name: test}}
spec:
  pools:
    - name: gpu
      endpoints: ["{}", "{}"]
  routes:
    - name: default
      chain: [gpu]
      hedge: {{after_ms: 100, to: same_pool}}
"#,
        slow.url(),
        fast.url()
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    // Until the slow endpoint has been tried once (an untried endpoint
    // scores best), every answer still comes from the fast one.
    for _ in 0..3 {
        let r = proxy.chat_with(&[], STREAM).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("fast"));
    }
    eventually(ms(2000), "slow cancelled", || slow.stats().cancelled >= 1).await;
    assert_eq!(slow.stats().completed, 0);
    let lines = proxy.log.wait_for(3).await;
    let hedged: Vec<_> = lines
        .iter()
        .filter(|l| l["attempts"].as_array().unwrap().len() == 2)
        .collect();
    assert!(!hedged.is_empty(), "{lines:?}");
    let a = &hedged[0]["attempts"];
    assert_eq!(a[0]["hedge"], "primary_cancelled");
    assert_eq!(a[0]["endpoint"], slow.url());
    assert_eq!(a[1]["hedge"], "hedge_won");
    assert_eq!(a[1]["endpoint"], fast.url());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_stop_when_the_retry_budget_is_spent() {
    let primary = mock_stream("primary", first_token_after(150)).await;
    let fallback = mock_stream("fallback", first_token_after(3000)).await;
    // One extra attempt per four requests, no floor.
    let route = "hedge: {after_ms: 20}\n      retry_budget: {ratio: 0.25, min_per_second: 0}";
    let policy = two_pools(&primary.url(), &fallback.url(), route, "");
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    for _ in 0..8 {
        let r = proxy.chat_with(&[], STREAM).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("primary"));
    }
    // The 4th and the 8th request could pay for a hedge.
    assert_eq!(fallback.stats().received, 2);
    let m = proxy.metrics().await;
    let series = r#"router_stream_events_total{pool="primary",event="retry_budget_exhausted"}"#;
    assert_eq!(metric(&m, series), Some(6.0), "{m}");
    let lines = proxy.log.wait_for(8).await;
    let stopped = lines
        .iter()
        .filter(|l| l["stopped"] == "retry_budget_exhausted");
    assert_eq!(stopped.count(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_after_failures_draw_on_the_same_budget() {
    let primary = mock("primary", router_mock::Behavior::Status(503)).await;
    let fallback = mock("fallback", router_mock::Behavior::Json).await;
    let route = "retry_budget: {ratio: 0.5, min_per_second: 0}";
    let policy = two_pools(&primary.url(), &fallback.url(), route, "").replace(
        "spec:\n",
        "spec:\n  circuit_breaker: {consecutive_errors: 100}\n",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let body = r#"{"model":"m","messages":[]}"#;
    // The primary answers once first: a failure on an endpoint that never
    // answered would make it suspect, and the walk would pass over it.
    primary.set_behavior(router_mock::Behavior::Json);
    assert_eq!(proxy.chat_with(&[], body).await.status.as_u16(), 200);
    primary.set_behavior(router_mock::Behavior::Status(503));
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(proxy.chat_with(&[], body).await.status.as_u16());
    }
    // Every second request pays for a retry; the others get the 503.
    assert_eq!(statuses, [200, 503, 200, 503]);
    assert_eq!(fallback.stats().received, 2);
    let lines = proxy.log.wait_for(5).await;
    assert_eq!(lines[2]["stopped"], "retry_budget_exhausted");
    assert!(lines[1].get("stopped").is_none());
    let walk = lines[2]["walk"].as_array().unwrap();
    assert_eq!(walk.last().unwrap()["note"], "stopped", "{walk:?}");
    assert_eq!(
        walk.last().unwrap()["why"],
        "retry_budget_exhausted",
        "{walk:?}"
    );
    let reason = lines[2]["reason"].as_str().unwrap();
    assert!(reason.contains("retry budget"), "{reason}");
}
