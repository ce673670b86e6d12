//! The Hugging Face sidecar contract: set-backends, health, metrics, admin token.

use tokio::time::Instant;

use http::{Method, StatusCode};
use router_mock::Behavior;
use router_tests::harness::TestProxy;
use router_tests::mocks::mock;

use crate::settings;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_set_backends_and_metrics_follow_the_contract() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let proxy = TestProxy::sidecar(settings()).await;

    let h = proxy.health().await;
    assert_eq!(h["ok"], true);
    assert_eq!(h["queue_depth"], 0);
    assert_eq!(h["backends"].as_array().unwrap().len(), 0);
    let v1 = h["config_version"].as_str().unwrap().to_string();

    // Both address forms are accepted.
    proxy.set_backends(&[a.host_port(), b.url()]).await;
    let h = proxy.health().await;
    assert_ne!(h["config_version"].as_str().unwrap(), v1);
    let backends = h["backends"].as_array().unwrap();
    assert_eq!(backends.len(), 2);
    for be in backends {
        assert_eq!(be["pool"], "default");
        assert_eq!(be["in_flight"], 0);
        assert!(
            be["ewma_latency"].is_null(),
            "untried backends have no EWMA yet"
        );
        assert_eq!(be["circuit"], "closed");
    }
    assert_eq!(backends[0]["addr"], a.url());
    assert_eq!(backends[1]["addr"], b.url());

    let r = proxy.chat("m").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-router-route"), Some("default"));
    assert_eq!(r.header("x-router-attempts"), Some("1"));
    assert_eq!(
        r.header("x-router-config-version"),
        h["config_version"].as_str()
    );
    let h = proxy.health().await;
    let sampled = h["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["ewma_latency"].is_number())
        .count();
    assert_eq!(sampled, 1, "the backend that answered has an EWMA sample");

    let m = proxy.metrics().await;
    for series in [
        "custom_router_queue_depth",
        "custom_router_backend_ewma_latency_seconds",
        "custom_router_backend_inflight_requests",
        "custom_router_requests_dispatched_total",
        "custom_router_requests_evicted_total",
        "custom_router_requests_timeout_total",
        "router_requests_total",
        "router_request_duration_seconds_bucket",
        "router_queue_oldest_age_seconds",
        "router_config_info",
    ] {
        assert!(m.contains(series), "metrics lack {series}:\n{m}");
    }
    let same = proxy
        .client
        .send(Method::GET, &proxy.url("/_custom_router/metrics"), &[], "")
        .await;
    assert!(same
        .text()
        .contains("custom_router_requests_dispatched_total{pool=\"default\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_set_backends_bodies_get_json_400s_and_change_nothing() {
    let proxy = TestProxy::sidecar(settings()).await;
    let before = proxy.health().await["config_version"].clone();
    let url = proxy.url("/_custom_router/set-backends");
    for (body, needle) in [
        ("{not json", "expected"),
        ("{\"backend\": []}", "backends"),
        (
            "{\"backends\": [\"127.0.0.1:1\", \"ftp://x:1\"]}",
            "backends[1]",
        ),
        ("{\"backends\": [\"10.0.0.1\"]}", "missing port"),
        ("{\"backends\": [], \"pool\": \"nope\"}", "unknown pool"),
    ] {
        let r = proxy.client.send(Method::POST, &url, &[], body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(r.error_type(), "invalid_request");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    let r = proxy.client.send(Method::GET, &url, &[], "").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    let r = proxy
        .client
        .send(Method::GET, &proxy.url("/_custom_router/nope"), &[], "")
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(proxy.health().await["config_version"], before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_token_guards_set_backends_but_not_health() {
    let mut s = settings();
    s.admin_token = Some("s3cret-token".into());
    let proxy = TestProxy::sidecar(s).await;
    let url = proxy.url("/_custom_router/set-backends");
    let body = r#"{"backends": ["127.0.0.1:9"]}"#;
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("s3cret-token"),
        Some("Bearer s3cret-token-x"),
    ] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let r = proxy.client.send(Method::POST, &url, &headers, body).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(r.error_type(), "unauthorized");
    }
    assert_eq!(
        proxy.health().await["backends"].as_array().unwrap().len(),
        0
    );
    let r = proxy
        .client
        .send(
            Method::POST,
            &url,
            &[("authorization", "Bearer s3cret-token")],
            body,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        proxy.health().await["backends"].as_array().unwrap().len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_backends_is_an_immediate_503_not_a_wait() {
    // The queue timeout stays at the 1200 s default.
    let proxy = TestProxy::sidecar(settings()).await;
    let started = Instant::now();
    let r = proxy.chat("m").await;
    assert!(started.elapsed().as_secs_f64() < 1.0);
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.error_type(), "no_backend");
    assert_eq!(r.header("retry-after"), Some("1"));
    let id = r.header("x-request-id").unwrap().to_string();
    assert_eq!(r.json()["error"]["request_id"], id.as_str());
}

/// A sidecar has no policy to set an attempt timeout, and used to have
/// none at all: a backend that accepts and never answers held the request
/// (and its slot) forever, and its circuit never learned of it. The
/// process's default (`CUSTOM_ROUTER_ATTEMPT_TIMEOUT`) now bounds every
/// attempt that nothing else bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_backend_cannot_hold_a_sidecar_request_forever() {
    let silent = mock("silent", Behavior::Hang).await;
    let proxy = TestProxy::sidecar(router_proxy::Settings {
        attempt_timeout: std::time::Duration::from_millis(300),
        ..settings()
    })
    .await;
    proxy.set_backends(&[silent.url()]).await;
    let started = Instant::now();
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), proxy.chat("m"))
        .await
        .expect("answered, not held forever");
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.text());
    assert_eq!(r.error_type(), "deadline_exhausted");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["first_outcome"], "timeout", "{l}");
    router_tests::harness::eventually(
        std::time::Duration::from_secs(5),
        "the abandoned attempt is cancelled",
        || silent.stats().cancelled == 1,
    )
    .await;
}
