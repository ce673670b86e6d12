//! HTTP proxy correctness: headers, redirects, SSE, keep-alive, limits and
//! timeouts against slow clients.

use std::time::Duration;

use tokio::time::Instant;

use http::{Method, StatusCode};
use http_body_util::BodyExt;
use router_mock::Behavior;
use router_tests::harness::{eventually, TestProxy};
use router_tests::mocks::{mock, mock_sse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::settings;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_forwarded_cleanly_with_the_request_id() {
    let backend = mock("b", Behavior::Json).await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/v1/chat/completions?trace=1"),
            &[
                ("connection", "keep-alive, x-hop-secret"),
                ("x-hop-secret", "must not pass"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("proxy-authorization", "Basic abc"),
                ("authorization", "Bearer end-to-end"),
                ("x-forwarded-for", "203.0.113.9"),
                ("x-request-id", "req-42"),
                ("content-type", "application/json"),
            ],
            r#"{"model":"m"}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-request-id"), Some("req-42"));
    let got = backend.requests();
    assert_eq!(got.len(), 1);
    let h = &got[0].headers;
    assert_eq!(got[0].path, "/v1/chat/completions?trace=1");
    for hop in ["x-hop-secret", "keep-alive", "te", "proxy-authorization"] {
        assert!(h.get(hop).is_none(), "{hop} was forwarded");
    }
    assert_eq!(h["authorization"], "Bearer end-to-end");
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-request-id"], "req-42");
    assert_eq!(h["idempotency-key"], "req-42");
    assert_eq!(h["host"], backend.host_port().as_str());
    assert_eq!(h["x-forwarded-host"], proxy.addr().to_string().as_str());
    // The body goes as it came, with its length.
    assert_eq!(got[0].body.as_ref(), br#"{"model":"m"}"#);
    assert_eq!(h["content-length"], "13");
    assert_eq!(h.get_all("content-length").iter().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_is_generated_when_absent() {
    let backend = mock("b", Behavior::Json).await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let r = proxy.chat("m").await;
    let id = r.header("x-request-id").unwrap().to_string();
    // UUIDv7: version nibble 7.
    assert_eq!(id.len(), 36);
    assert_eq!(&id[14..15], "7");
    assert_eq!(
        backend.requests()[0].headers["idempotency-key"],
        id.as_str()
    );
}

/// Issue 30 item 14: a provider's own `x-request-id` (the one its
/// support asks for) reaches the client as `x-upstream-request-id`, the
/// router's id keeping `x-request-id`, plain and streamed; the route log's
/// attempt records it, cut to 128 bytes; an answer without one has neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backends_request_id_reaches_the_client_beside_the_routers() {
    let backend = mock("provider", Behavior::Json).await;
    backend.set_request_id(Some("req_provider_1")).unwrap();
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    // Plain JSON.
    let r = proxy
        .chat_with(&[("x-request-id", "router-side-1")], r#"{"model":"m"}"#)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-request-id"), Some("router-side-1"));
    assert_eq!(r.header("x-upstream-request-id"), Some("req_provider_1"));
    // Streamed.
    backend.set_behavior(Behavior::Sse {
        chunks: 2,
        interval: Duration::from_millis(10),
    });
    let resp = proxy
        .client
        .stream(
            Method::POST,
            &proxy.url("/v1/chat/completions"),
            r#"{"model":"m","stream":true}"#,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let router_id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_ne!(router_id, "req_provider_1");
    assert_eq!(resp.headers()["x-upstream-request-id"], "req_provider_1");
    let _ = resp.into_body().collect().await.unwrap();
    // A long id is cut to 128 bytes, in the header and in the log.
    let long = "x".repeat(300);
    backend.set_request_id(Some(&long)).unwrap();
    backend.set_behavior(Behavior::Json);
    let r = proxy.chat("m").await;
    assert_eq!(r.header("x-upstream-request-id"), Some(&long[..128]));
    // No id from the backend: no header, no field.
    backend.set_request_id(None).unwrap();
    let r = proxy.chat("m").await;
    assert!(r.header("x-request-id").is_some());
    assert!(r.header("x-upstream-request-id").is_none());
    let lines = proxy.log.wait_for(4).await;
    let ids: Vec<_> = lines
        .iter()
        .map(|l| l["attempts"][0].get("upstream_request_id").cloned())
        .collect();
    let (streamed, plain): (Vec<_>, Vec<_>) = lines
        .iter()
        .partition(|l| l["request_id"].as_str() == Some(router_id.as_str()));
    assert_eq!(streamed.len(), 1);
    assert_eq!(
        streamed[0]["attempts"][0]["upstream_request_id"],
        "req_provider_1"
    );
    assert!(
        plain.iter().any(|l| l["request_id"] == "router-side-1"
            && l["attempts"][0]["upstream_request_id"] == "req_provider_1"),
        "{ids:?}"
    );
    assert!(
        ids.contains(&Some(serde_json::Value::String(long[..128].to_string()))),
        "{ids:?}"
    );
    assert_eq!(ids.iter().filter(|i| i.is_none()).count(), 1, "{ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_go_back_to_the_client_unfollowed() {
    let backend = mock(
        "mock",
        Behavior::Redirect("http://127.0.0.1:9/elsewhere".into()),
    )
    .await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let r = proxy.chat("m").await;
    assert_eq!(r.status, StatusCode::FOUND);
    assert_eq!(r.header("location"), Some("http://127.0.0.1:9/elsewhere"));
    assert_eq!(backend.stats().received, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_chunks_reach_the_client_before_the_stream_ends() {
    let backend = mock_sse("streamer", 5, 150).await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let started = Instant::now();
    let resp = proxy
        .client
        .stream(
            Method::POST,
            &proxy.url("/v1/chat/completions"),
            r#"{"model":"m","stream":true}"#,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let first = loop {
        let frame = body.frame().await.expect("a frame").expect("no error");
        if let Ok(data) = frame.into_data() {
            break data;
        }
    };
    let first_at = started.elapsed();
    assert!(String::from_utf8_lossy(&first).contains("tok0"));
    // The backend is still producing: the stream has not ended.
    assert_eq!(backend.stats().completed, 0);
    let rest = body.collect().await.unwrap().to_bytes();
    let ended_at = started.elapsed();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("tok4") && rest.contains("[DONE]"), "{rest}");
    assert!(
        ended_at >= first_at + Duration::from_millis(500),
        "first chunk at {first_at:?}, end at {ended_at:?}"
    );
    let lines = proxy.log.wait_for(1).await;
    // The latency sample is the time to the first byte, not to the end.
    let ttfb = lines[0]["attempts"][0]["latency_ms"].as_f64().unwrap();
    assert!(ttfb < 400.0, "ttfb {ttfb}");
    assert!(lines[0]["elapsed_ms"].as_f64().unwrap() >= 600.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_kept_alive() {
    let backend = mock("b", Behavior::Json).await;
    let mut s = settings();
    s.workers = 2;
    let proxy = TestProxy::sidecar(s).await;
    proxy.set_backends(&[backend.host_port()]).await;
    for _ in 0..20 {
        assert_eq!(proxy.chat("m").await.status, StatusCode::OK);
    }
    assert_eq!(backend.stats().received, 20);
    // Each worker thread keeps its own pool: at most one upstream
    // connection per worker, reused for every request.
    let connections = backend.stats().connections;
    assert!(
        (1..=2).contains(&connections),
        "{connections} connections for 20 requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_get_413() {
    let backend = mock("b", Behavior::Json).await;
    let mut s = settings();
    s.max_body_bytes = 1024;
    let proxy = TestProxy::sidecar(s).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let big = format!(r#"{{"model":"m","pad":"{}"}}"#, "x".repeat(2048));
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/v1/chat/completions"),
            &[],
            big.clone(),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.error_type(), "payload_too_large");

    // Chunked, with no Content-Length to check up front.
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    let chunk = format!("{:x}\r\n{}\r\n0\r\n\r\n", big.len(), big);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{chunk}"
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = conn.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert_eq!(backend.stats().received, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_gets_a_400_json_error() {
    let backend = mock("b", Behavior::Json).await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/v1/chat/completions"),
            &[],
            "{\"model\": ",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error_type(), "invalid_request");
    assert_eq!(backend.stats().received, 0);
    // Non-JSON paths pass through untouched.
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/generate"),
            &[],
            "not json at all",
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(backend.requests()[0].body, "not json at all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_timed_out() {
    let mut s = settings();
    s.client_body_timeout = Duration::from_millis(300);
    s.client_header_timeout = Duration::from_millis(300);
    let proxy = TestProxy::sidecar(s).await;

    // Headers, then only part of the promised body.
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    conn.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"model\"",
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let started = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(3), conn.read(&mut buf))
        .await
        .expect("answered before 3 s")
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"));
    assert!(started.elapsed() >= Duration::from_millis(250));

    // Headers that never finish: the connection is closed.
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(3), conn.read(&mut buf))
        .await
        .expect("closed before 3 s")
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
    eventually(Duration::from_secs(1), "log", || {
        proxy.log.lines().len() == 1
    })
    .await;
}
