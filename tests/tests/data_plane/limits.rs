//! The proxy's own caps: buffered request bytes and open connections.
//! Past either, a typed `503 overloaded` with `Retry-After`, at once, and
//! the client sees that answer (not a reset connection).

use std::time::Duration;

use http::{Method, StatusCode};
use router_proxy::Settings;
use router_tests::harness::{TestClient, TestProxy};
use router_tests::mocks::mock_latency;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A chat request whose body is about `bytes` long.
fn body_of(bytes: usize) -> String {
    let filler = "a".repeat(bytes.saturating_sub(80));
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{filler}"}}]}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_buffered_bytes_cap_are_answered_overloaded() {
    let backend = mock_latency("slow", 600).await;
    let settings = Settings {
        max_buffered_bytes: 1 << 20,
        ..crate::settings()
    };
    let proxy = TestProxy::sidecar(settings).await;
    proxy.set_backends(&[backend.url()]).await;
    let url = proxy.url("/v1/chat/completions");

    // Alone, a body over the cap is refused before it is read.
    let big = body_of(2 << 20);
    let r = TestClient::new().send(Method::POST, &url, &[], big).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.error_type(), "overloaded");
    assert_eq!(r.header("retry-after"), Some("1"));

    // Two 600 KiB bodies at once: the first holds its bytes while the
    // backend works; the second does not fit beside it.
    let first = tokio::spawn({
        let url = url.clone();
        async move {
            TestClient::new()
                .send(Method::POST, &url, &[], body_of(600 << 10))
                .await
        }
    });
    router_tests::harness::eventually(Duration::from_secs(10), "first in flight", || {
        backend.stats().received == 1
    })
    .await;
    let second = TestClient::new()
        .send(Method::POST, &url, &[], body_of(600 << 10))
        .await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(second.error_type(), "overloaded");
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    // The first one's bytes were given back: the same body fits now.
    let third = TestClient::new()
        .send(Method::POST, &url, &[], body_of(600 << 10))
        .await;
    assert_eq!(third.status, StatusCode::OK);
    let m = proxy.metrics().await;
    assert!(
        m.contains(r#"reason="overloaded""#),
        "sheds are counted: {m}"
    );
}

/// Sends a health check on a new raw connection and reads until the
/// proxy closes it or answers: the first line of the answer.
async fn health_on_a_new_connection(addr: std::net::SocketAddr) -> (tokio::net::TcpStream, String) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /_custom_router/health HTTP/1.1\r\nhost: r\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
        .await
        .expect("an answer at once")
        .unwrap_or(0);
    (conn, String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_get_a_canned_overloaded_answer() {
    const CAP: usize = 3;
    let settings = Settings {
        max_connections: CAP,
        ..crate::settings()
    };
    let proxy = TestProxy::sidecar(settings).await;
    // Open keep-alive connections until one is refused: at the latest the
    // (CAP + 1)th (the harness may hold one of its own).
    let mut held = Vec::new();
    let refused = loop {
        let (conn, answer) = health_on_a_new_connection(proxy.addr()).await;
        if answer.starts_with("HTTP/1.1 200") {
            held.push(conn);
            assert!(held.len() <= CAP, "more than {CAP} connections served");
            continue;
        }
        break answer;
    };
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    assert!(refused.contains("retry-after: 1"), "{refused}");
    let body = refused.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["type"], "overloaded");
    // A place comes free when a connection closes.
    drop(held);
    let mut served = false;
    for _ in 0..100 {
        let (_conn, answer) = health_on_a_new_connection(proxy.addr()).await;
        if answer.starts_with("HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "served again once connections closed");
}
