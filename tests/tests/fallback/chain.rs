//! Walking the chain: failover on retryable failures with the same request
//! id, cancellation of the abandoned attempt, configurable retry_on, the
//! fallback switch, circuits, draining.

use std::time::Duration;

use tokio::time::Instant;

use http::StatusCode;
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_tests::harness::{eventually, TestProxy};
use router_tests::mocks::{mock, mock_latency};

use crate::{settings, two_pools};

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_primary_is_given_up_at_the_attempt_timeout_and_cancelled() {
    let primary = mock("primary", Behavior::Hang).await;
    let fallback = mock_latency("fallback", 20).await;
    let policy = two_pools(
        &primary.url(),
        &fallback.url(),
        "",
        "attempt_timeout_ms: 200",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;

    let started = Instant::now();
    let r = proxy
        .chat_with(
            &[("x-request-id", "one-id"), ("x-router-deadline-ms", "2000")],
            BODY,
        )
        .await;
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));
    assert_eq!(r.header("x-router-route"), Some("fallback"));
    assert_eq!(r.header("x-router-attempts"), Some("2"));
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(600),
        "{took:?}"
    );
    // The abandoned attempt's connection was closed: the primary can stop.
    eventually(Duration::from_secs(2), "primary cancelled", || {
        primary.stats().cancelled == 1
    })
    .await;
    assert_eq!(primary.stats().completed, 0);
    // Same request id on both attempts, as both headers.
    for m in [&primary, &fallback] {
        let req = &m.requests()[0];
        assert_eq!(req.headers["x-request-id"], "one-id");
        assert_eq!(req.headers["idempotency-key"], "one-id");
    }
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["first_route"], "primary");
    assert_eq!(l["first_outcome"], "timeout");
    assert_eq!(l["fallback_outcome"], "ok");
    assert_eq!(l["final_route"], "fallback");
    assert_eq!(l["deadline_ms"], 2000);
    assert_eq!(l["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(l["attempts"][0]["timeout_ms"], 200);
    assert_eq!(l["attempts"][1]["pool"], "fallback");
    let m = proxy.metrics().await;
    assert!(
        m.contains("router_fallbacks_total{from=\"primary\",to=\"fallback\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_can_set_the_attempt_timeout_too() {
    let primary = mock("primary", Behavior::Hang).await;
    let fallback = mock("fallback", Behavior::Json).await;
    let policy = two_pools(
        &primary.url(),
        &fallback.url(),
        "attempt_timeout_ms: 150",
        "",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let started = Instant::now();
    let r = proxy.chat_with(&[], BODY).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_millis(450),
        "{took:?}"
    );
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["attempts"][0]["timeout_ms"], 150);
    assert_eq!(l["deadline_ms"], serde_json::Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_in_retry_on_fail_over_and_others_are_passed_back() {
    let primary = mock("primary", Behavior::Status(503)).await;
    let fallback = mock("fallback", Behavior::Json).await;
    // A circuit that does not open here: this test is about retry_on.
    let no_breaker = |p: String| {
        p.replace(
            "spec:\n",
            "spec:\n  circuit_breaker: {consecutive_errors: 100}\n",
        )
    };
    let policy = no_breaker(two_pools(&primary.url(), &fallback.url(), "", ""));
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    // The primary answers once first: a failure on an endpoint that never
    // answered would make it suspect, and the walk would pass over it.
    primary.set_behavior(Behavior::Json);
    assert_eq!(proxy.chat_with(&[], BODY).await.status, StatusCode::OK);
    primary.set_behavior(Behavior::Status(503));
    let r = proxy.chat_with(&[], BODY).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));

    primary.set_behavior(Behavior::Status(429));
    let r = proxy.chat_with(&[], BODY).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));

    // 429 is no longer in retry_on: the primary's answer goes back as is.
    proxy.apply(&no_breaker(two_pools(
        &primary.url(),
        &fallback.url(),
        "retry_on: [timeout, status_5xx]",
        "",
    )));
    let r = proxy.chat_with(&[], BODY).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("primary"));
    assert_eq!(r.header("retry-after"), Some("1"));

    // A client error (400) is an answer, not a failure.
    primary.set_behavior(Behavior::Status(400));
    let r = proxy.chat_with(&[], BODY).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(fallback.stats().received, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_failure_is_passed_back_when_every_pool_fails() {
    let primary = mock("primary", Behavior::Status(500)).await;
    let fallback = mock("fallback", Behavior::Status(502)).await;
    let proxy = TestProxy::with_policy(
        settings(),
        &two_pools(&primary.url(), &fallback.url(), "", ""),
    )
    .await;
    let r = proxy.chat_with(&[], BODY).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));
    assert_eq!(r.header("x-router-attempts"), Some("2"));
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["first_outcome"], "status_5xx");
    assert_eq!(l["fallback_outcome"], "status_5xx");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_is_switched_off_and_on_by_a_file_reload() {
    let primary = mock("primary", Behavior::Status(503)).await;
    let fallback = mock("fallback", Behavior::Json).await;
    let dir = std::env::temp_dir().join(format!("router-fallback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.yaml");
    std::fs::write(
        &path,
        two_pools(&primary.url(), &fallback.url(), "fallback: false", ""),
    )
    .unwrap();
    let mut s = settings();
    s.policy_poll_interval = Duration::from_millis(30);
    let proxy = TestProxy::start(
        s,
        router_proxy::Mode::Standalone {
            policy: path.clone(),
        },
    )
    .await;
    let r = proxy.chat_with(&[], BODY).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("primary"));
    assert_eq!(fallback.stats().received, 0);

    std::fs::write(
        &path,
        two_pools(&primary.url(), &fallback.url(), "fallback: true", ""),
    )
    .unwrap();
    let mut served = None;
    for _ in 0..200 {
        let r = proxy.chat_with(&[], BODY).await;
        if r.status == StatusCode::OK {
            served = r.header(MOCK_NAME_HEADER).map(str::to_string);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served.as_deref(), Some("fallback"));
    let _ = std::fs::remove_file(&path);
}

/// Issue 30 item 6, recovery in seconds: a backend killed under traffic
/// (its circuit opens for a minute) and brought back on its address gets
/// traffic again within 5 s of its first passing health check: the check
/// ends the circuit's wait, and the next request is its probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_brought_back_gets_traffic_within_seconds_of_its_first_passing_check() {
    let primary = mock("primary", Behavior::Json).await;
    let addr = primary.addr();
    let fallback = mock("fallback", Behavior::Json).await;
    let policy = two_pools(
        &primary.url(),
        &fallback.url(),
        "",
        "health_check: {interval_ms: 100, timeout_ms: 50}",
    )
    .replace(
        "spec:\n",
        "spec:\n  circuit_breaker: {consecutive_errors: 1, open_duration_s: 60}\n",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let served_by =
        |r: &router_tests::harness::TestResponse| r.header(MOCK_NAME_HEADER).map(str::to_string);
    // The primary answers (after its first check), then dies.
    let until = Instant::now() + Duration::from_secs(5);
    while served_by(&proxy.chat_with(&[], BODY).await).as_deref() != Some("primary") {
        assert!(Instant::now() < until, "the primary never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    primary.stop().await;
    let circuit = || async {
        let h = proxy.health().await;
        h["backends"]
            .as_array()
            .and_then(|b| b.iter().find(|b| b["pool"] == "primary"))
            .map(|b| b["circuit"].clone())
    };
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let r = proxy.chat_with(&[], BODY).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        if circuit().await == Some("open".into()) {
            break;
        }
        assert!(Instant::now() < until, "the primary's circuit never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Back on its address, after a few failed checks.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let back = router_mock::MockModel::start_on(
        addr,
        router_mock::MockConfig {
            name: "primary".into(),
            ..router_mock::MockConfig::default()
        },
    )
    .await
    .unwrap();
    eventually(Duration::from_secs(5), "a check reaches it", || {
        back.health_hits() >= 1
    })
    .await;
    let first_check = Instant::now();
    let mut served = None;
    while first_check.elapsed() < Duration::from_secs(8) {
        let r = proxy.chat_with(&[], BODY).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        if served_by(&r).as_deref() == Some("primary") {
            served = Some(first_check.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = served.expect("the primary got traffic again");
    eprintln!("the primary got traffic {served:?} after its first passing check");
    assert!(served < Duration::from_secs(5), "after {served:?}");
    assert_eq!(circuit().await, Some("closed".into()));
    assert!(back.stats().received >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_is_skipped_at_once() {
    let primary = mock("primary", Behavior::Status(500)).await;
    let fallback = mock("fallback", Behavior::Json).await;
    let policy = two_pools(&primary.url(), &fallback.url(), "", "").replace(
        "spec:\n",
        "spec:\n  circuit_breaker: {consecutive_errors: 3, open_duration_s: 60}\n",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    // The primary answers once first (else its first failure makes it
    // suspect, and the walk passes over it before the circuit opens).
    primary.set_behavior(Behavior::Json);
    assert_eq!(proxy.chat_with(&[], BODY).await.status, StatusCode::OK);
    primary.set_behavior(Behavior::Status(500));
    for _ in 0..3 {
        assert_eq!(proxy.chat_with(&[], BODY).await.status, StatusCode::OK);
    }
    assert_eq!(primary.stats().received, 4);
    let h = proxy.health().await;
    let primary_health = h["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["pool"] == "primary")
        .unwrap()
        .clone();
    assert_eq!(primary_health["circuit"], "open");
    for _ in 0..5 {
        let r = proxy.chat_with(&[], BODY).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("x-router-attempts"), Some("1"));
    }
    assert_eq!(primary.stats().received, 4, "no traffic to an open circuit");
    let l = proxy.log.wait_for(9).await;
    assert!(
        l[8]["reason"]
            .as_str()
            .unwrap()
            .contains("primary skipped: unhealthy (circuits open"),
        "{}",
        l[7]
    );
    let m = proxy.metrics().await;
    assert!(
        m.contains(&format!(
            "router_circuit_state{{pool=\"primary\",addr=\"{}\"}} 1",
            primary.url()
        )),
        "{m}"
    );
    // Issue 30, item 5: the passed-over primary still counts as a
    // fallback from it (RouterFallbackSpike sees a dead primary): the 3
    // failed-then-fallen-back requests and the 5 that skipped it.
    assert!(
        m.contains("router_fallbacks_total{from=\"primary\",to=\"fallback\"} 8"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_endpoint_takes_no_new_requests_and_finishes_its_own() {
    let a = mock_latency("a", 300).await;
    let b = mock("b", Behavior::Json).await;
    let policy = |endpoints: String| {
        format!(
            r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: p
      endpoints: [{endpoints}]
  routes:
    - name: r
      chain: [p]
"#
        )
    };
    let proxy = TestProxy::with_policy(settings(), &policy(format!("\"{}\"", a.url()))).await;
    let slow = tokio::spawn({
        let client = proxy.client.clone();
        let url = proxy.url("/v1/chat/completions");
        async move { client.send(http::Method::POST, &url, &[], BODY).await }
    });
    eventually(Duration::from_secs(2), "a busy", || {
        a.stats().in_flight == 1
    })
    .await;
    // Drain a (a config change) and add b.
    proxy.apply(&policy(format!(
        "{{url: \"{}\", drain: true}}, \"{}\"",
        a.url(),
        b.url()
    )));
    for _ in 0..10 {
        let r = proxy.chat_with(&[], BODY).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("b"));
    }
    assert_eq!(
        a.stats().received,
        1,
        "a drained endpoint takes nothing new"
    );
    assert_eq!(
        slow.await.unwrap().status,
        StatusCode::OK,
        "in-flight work finishes"
    );
    let h = proxy.health().await;
    let drained: Vec<bool> = h["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["draining"].as_bool().unwrap())
        .collect();
    assert_eq!(drained, vec![true, false]);
}
