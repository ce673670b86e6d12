//! Exactly one answer per request, whatever happens meanwhile; gauges back
//! to zero; the route decision log has one line per request.

use std::time::Duration;

use futures_util::future::join_all;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use router_mock::Behavior;
use router_tests::harness::{eventually, health_in_flight, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::{mock, mock_latency, mock_sse};

use crate::settings;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_backend_with_requests_in_flight() {
    let a = mock_latency("a", 300).await;
    let b = mock_latency("b", 300).await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[a.host_port(), b.host_port()]).await;
    // Warm both so traffic spreads.
    join_all((0..2).map(|_| proxy.chat("m"))).await;

    let requests = join_all((0..20).map(|_| proxy.chat("m")));
    let removal = async {
        // Once all 20 are at the backends (each takes 300 ms there).
        eventually(WAIT_AT_MOST, "the 20 requests at the backends", || {
            a.stats().received + b.stats().received == 22
        })
        .await;
        proxy.set_backends(&[b.host_port()]).await;
    };
    let (results, ()) = tokio::join!(requests, removal);
    assert_eq!(results.len(), 20);
    for r in &results {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    assert!(
        a.stats().received >= 2,
        "a had requests in flight when removed"
    );
    let h = proxy.health().await;
    assert_eq!(h["backends"].as_array().unwrap().len(), 1);
    assert_eq!(health_in_flight(&h), 0);
    // No stale series for the removed backend.
    let m = proxy.metrics().await;
    assert!(!m.contains(&a.url()), "{m}");
    assert!(m.contains(&b.url()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_frees_the_slot_and_cancels_upstream() {
    let backend = mock_sse("mock", 100, 50).await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let resp = proxy
        .client
        .stream(
            Method::POST,
            &proxy.url("/v1/chat/completions"),
            r#"{"model":"m"}"#,
        )
        .await;
    let mut body = resp.into_body();
    let _first = body.frame().await.unwrap().unwrap();
    assert_eq!(health_in_flight(&proxy.health().await), 1);
    drop(body);
    eventually(Duration::from_secs(2), "upstream cancelled", || {
        backend.stats().cancelled == 1
    })
    .await;
    assert_eq!(backend.stats().completed, 0);
    assert_eq!(health_in_flight(&proxy.health().await), 0);
    let lines = proxy.log.wait_for(1).await;
    assert_eq!(lines[0]["outcome"], "client_cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_are_passed_back_and_counted_as_failures() {
    let backend = mock("mock", Behavior::Status(503)).await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let r = proxy.chat("m").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let h = proxy.health().await;
    // A failure is a slow sample: at least the 3 s threshold.
    assert!(h["backends"][0]["ewma_latency"].as_f64().unwrap() >= 3.0);
    let lines = proxy.log.wait_for(1).await;
    assert_eq!(lines[0]["outcome"], "status_5xx");
    assert_eq!(lines[0]["attempts"][0]["status"], 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_decision_log_has_every_contract_field() {
    let backend = mock_latency("b", 10).await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/v1/chat/completions"),
            &[("idempotency-key", "idem-1")],
            r#"{"model":"llama"}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let lines = proxy.log.wait_for(1).await;
    let l = &lines[0];
    for field in [
        "request_id",
        "offered_at",
        "first_route",
        "first_outcome",
        "fallback_outcome",
        "final_route",
        "elapsed_ms",
        "deadline_ms",
        "queue_wait_ms",
        "attempts",
        "risk",
        "reason",
        "model",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "trace_id",
        "config_version",
    ] {
        assert!(l.get(field).is_some(), "route log lacks {field}: {l}");
    }
    assert_eq!(l["request_id"], "idem-1");
    assert_eq!(l["first_route"], "default");
    assert_eq!(l["final_route"], "default");
    assert_eq!(l["first_outcome"], "ok");
    assert_eq!(l["model"], "llama");
    assert_eq!(l["attempts"][0]["endpoint"], backend.url().as_str());
    assert_eq!(l["attempts"][0]["status"], 200);
    assert!(l["attempts"][0]["latency_ms"].as_f64().unwrap() >= 10.0);
    assert!(l["offered_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        l["config_version"],
        r.header("x-router-config-version").unwrap()
    ); // The mock's usage: prompt = ceil(body bytes / 4), completion = 5.
    assert_eq!(l["tokens_in"], 5);
    assert_eq!(l["tokens_out"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_finishes_requests_in_flight_then_stops() {
    let backend = mock_latency("slow", 400).await;
    let TestProxy { proxy, client, .. } = TestProxy::sidecar(settings()).await;
    let addr = proxy.local_addr();
    let url = format!("http://{addr}");
    let body = serde_json::json!({"backends": [backend.host_port()]}).to_string();
    let r = client
        .send(
            Method::POST,
            &format!("{url}/_custom_router/set-backends"),
            &[],
            body,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let in_flight = tokio::spawn({
        let client = client.clone();
        let url = format!("{url}/v1/chat/completions");
        async move {
            client
                .send(Method::POST, &url, &[], r#"{"model":"m"}"#)
                .await
        }
    });
    eventually(WAIT_AT_MOST, "the request at the backend", || {
        backend.stats().received == 1
    })
    .await;
    let started = tokio::time::Instant::now();
    assert!(proxy.drain(Duration::from_secs(5)).await, "drained in time");
    // The request in flight was answered, then the proxy stopped.
    assert_eq!(in_flight.await.unwrap().status, StatusCode::OK);
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(backend.stats().completed, 1);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no new connections after a drain"
    );
}
