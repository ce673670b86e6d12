//! The bounded FIFO: eviction, timeout, disconnects, and 2,000 at once.

use std::time::Duration;

use tokio::time::Instant;

use futures_util::future::join_all;
use http::{Method, StatusCode};
use router_tests::harness::{eventually, health_in_flight, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::mock_latency;

use crate::settings;

fn chat_body() -> &'static str {
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_evicts_its_oldest_waiter() {
    let backend = mock_latency("slow", 400).await;
    let mut s = settings();
    s.max_concurrency = Some(1);
    s.queue.max_size = 2;
    let proxy = TestProxy::sidecar(s).await;
    proxy.set_backends(&[backend.host_port()]).await;

    let url = proxy.url("/v1/chat/completions");
    let mut tasks = Vec::new();
    // r0 is dispatched; r1, r2 queue; r3 arrives at a full queue: r1 goes.
    // Each is sent once the one before is where it should be.
    for i in 0..4 {
        let client = proxy.client.clone();
        let url = url.clone();
        let id = format!("r{i}");
        tasks.push(tokio::spawn(async move {
            client
                .send(
                    Method::POST,
                    &url,
                    &[("x-request-id", id.as_str())],
                    chat_body(),
                )
                .await
        }));
        match i {
            0 => {
                eventually(WAIT_AT_MOST, "r0 at the backend", || {
                    backend.stats().received == 1
                })
                .await
            }
            1 | 2 => {
                proxy
                    .wait_health(&format!("r{i} queued"), |h| h["queue_depth"] == i)
                    .await;
            }
            _ => {}
        }
    }
    let results: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let statuses: Vec<u16> = results.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(statuses, vec![200, 503, 200, 200]);
    assert_eq!(results[1].error_type(), "queue_full");
    assert_eq!(results[1].header("x-request-id"), Some("r1"));
    assert_eq!(results[1].header("retry-after"), Some("1"));
    let m = proxy.metrics().await;
    assert!(
        m.contains("custom_router_requests_evicted_total{pool=\"default\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("router_sheds_total{pool=\"default\",reason=\"queue_full\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_past_the_queue_timeout_gets_503() {
    let backend = mock_latency("slow", 1500).await;
    let mut s = settings();
    s.max_concurrency = Some(1);
    s.queue.timeout = Duration::from_millis(200);
    let proxy = TestProxy::sidecar(s).await;
    proxy.set_backends(&[backend.host_port()]).await;

    let first = tokio::spawn({
        let client = proxy.client.clone();
        let url = proxy.url("/v1/chat/completions");
        async move { client.send(Method::POST, &url, &[], chat_body()).await }
    });
    eventually(WAIT_AT_MOST, "the first request at the backend", || {
        backend.stats().received == 1
    })
    .await;
    let started = Instant::now();
    let r = proxy.chat("m").await;
    let waited = started.elapsed();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.error_type(), "queue_timeout");
    assert!(waited >= Duration::from_millis(190), "{waited:?}");
    assert!(waited < Duration::from_millis(1000), "{waited:?}");
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    let m = proxy.metrics().await;
    assert!(
        m.contains("custom_router_requests_timeout_total{pool=\"default\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_leaves_the_queue_at_once() {
    let backend = mock_latency("slow", 800).await;
    let mut s = settings();
    s.max_concurrency = Some(1);
    let proxy = TestProxy::sidecar(s).await;
    proxy.set_backends(&[backend.host_port()]).await;

    let first = tokio::spawn({
        let client = proxy.client.clone();
        let url = proxy.url("/v1/chat/completions");
        async move { client.send(Method::POST, &url, &[], chat_body()).await }
    });
    eventually(WAIT_AT_MOST, "the first request at the backend", || {
        backend.stats().received == 1
    })
    .await;
    // The second client gives up once it waits in the queue: its request
    // future (and connection) is dropped.
    let second = tokio::spawn({
        let client = proxy.client.clone();
        let url = proxy.url("/v1/chat/completions");
        async move { client.send(Method::POST, &url, &[], chat_body()).await }
    });
    proxy
        .wait_health("the second request queued", |h| h["queue_depth"] == 1)
        .await;
    second.abort();
    let gave_up = second.await;
    assert!(
        matches!(&gave_up, Err(e) if e.is_cancelled()),
        "the second request was answered: {gave_up:?}"
    );
    let started = Instant::now();
    loop {
        if proxy.health().await["queue_depth"] == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "waiter still queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    // The abandoned request was never sent to the backend.
    assert_eq!(backend.stats().received, 1);
    let lines = proxy.log.wait_for(2).await;
    assert!(lines
        .iter()
        .any(|l| l["outcome"] == "client_cancelled" && l["status"] == 499));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_concurrent_requests_into_a_queue_of_ten() {
    let backend = mock_latency("slow", 20).await;
    let mut s = settings();
    s.max_concurrency = Some(2);
    s.queue.max_size = 10;
    let proxy = TestProxy::sidecar(s).await;
    proxy.set_backends(&[backend.host_port()]).await;

    let url = proxy.url("/v1/chat/completions");
    let tasks: Vec<_> = (0..2000)
        .map(|_| {
            // One client (connection pool) per request: 2,000 connections.
            let client = router_tests::harness::TestClient::new();
            let url = url.clone();
            tokio::spawn(async move { client.send(Method::POST, &url, &[], chat_body()).await })
        })
        .collect();
    let mut ok = 0;
    let mut shed = 0;
    for t in join_all(tasks).await {
        let r = t.unwrap();
        match r.status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(r.error_type(), "queue_full");
                shed += 1;
            }
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert_eq!(ok + shed, 2000);
    assert!(ok >= 10, "at least the queue's worth is served: {ok}");
    assert!(shed > 0);
    assert_eq!(backend.stats().received, ok);

    let health = proxy.health().await;
    assert_eq!(health["queue_depth"], 0);
    assert_eq!(health_in_flight(&health), 0);
    let m = proxy.metrics().await;
    let gauge_line = m
        .lines()
        .find(|l| l.starts_with("custom_router_backend_inflight_requests{"))
        .unwrap();
    assert!(gauge_line.ends_with(" 0"), "{gauge_line}");
    let lines = proxy.log.wait_for(2000).await;
    assert_eq!(lines.len(), 2000, "one route log line per request");
    eventually(Duration::from_secs(2), "mock idle", || {
        backend.stats().in_flight == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_every_backend_answers_the_queued_at_once() {
    let backend = mock_latency("slow", 600).await;
    let mut s = settings();
    s.max_concurrency = Some(1);
    let proxy = TestProxy::sidecar(s).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let url = proxy.url("/v1/chat/completions");
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let client = proxy.client.clone();
            let url = url.clone();
            tokio::spawn(async move { client.send(Method::POST, &url, &[], chat_body()).await })
        })
        .collect();
    let health = proxy
        .wait_health("one request in flight, two queued", |h| {
            h["queue_depth"] == 2 && health_in_flight(h) == 1
        })
        .await;
    assert_eq!(health["queue_depth"], 2);
    let started = Instant::now();
    proxy.set_backends(&[]).await;
    let results: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let mut statuses: Vec<u16> = results.iter().map(|r| r.status.as_u16()).collect();
    statuses.sort();
    // The request in flight finishes; the two queued ones are told at once.
    assert_eq!(statuses, vec![200, 503, 503]);
    for r in results.iter().filter(|r| r.status != StatusCode::OK) {
        assert_eq!(r.error_type(), "no_backend");
    }
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert_eq!(health_in_flight(&proxy.health().await), 0);
}
