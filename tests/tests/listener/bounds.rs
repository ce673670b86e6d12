//! The listener's caps over HTTP/2 and TLS: the head cap (HTTP/2's header
//! list), the body cap, requests at once on one HTTP/2 connection, the
//! header timeout over a TLS handshake or an HTTP/2 preface that never
//! finishes (the connection held against its peer's cap meanwhile), and
//! the variables that stop startup.

use std::time::Duration;

use http::StatusCode;
use router_proxy::{Mode, ProxyOptions, Settings, StartError, TlsFiles};
use router_tests::harness::{eventually, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::mock_latency;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::protocols::tls_proxy;
use crate::CHAT;
use crate::{base, chat, h2_client, read, temp_dir, tls_base, tls_connect, tls_settings, Pair};

/// A chat request over HTTP/2 with one header of `bytes` bytes.
fn with_header(base: &str, bytes: usize) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut req = chat(base, CHAT);
    req.headers_mut()
        .insert("x-filler", "a".repeat(bytes).parse().unwrap());
    req
}

/// `CUSTOM_ROUTER_MAX_HEADER_BYTES` bounds an HTTP/2 request's header
/// list: past it, that stream is answered 431 and the connection goes on
/// serving; under it (but past hyper's own 16 KiB default) the request is
/// served. The body cap holds as over HTTP/1.1 (413).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_and_body_caps_hold_over_h2() {
    let backend = mock_latency("b", 0).await;
    let settings = Settings {
        max_header_bytes: 32 * 1024,
        max_body_bytes: 4096,
        max_buffered_bytes: 3000,
        ..Settings::default()
    };
    let proxy = TestProxy::sidecar(settings).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let url = base(proxy.addr());
    let mut h2 = h2_client(TcpStream::connect(proxy.addr()).await.unwrap()).await;
    let a = read(h2.send_request(with_header(&url, 24 * 1024)).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::OK, "a 24 KiB head is under the cap");
    let a = read(h2.send_request(with_header(&url, 40 * 1024)).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(backend.stats().received, 1, "the large head went nowhere");
    // The connection is still serving.
    let a = read(h2.send_request(chat(&url, CHAT)).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::OK);
    // A body past the cap.
    let big = format!(r#"{{"model":"m","pad":"{}"}}"#, "a".repeat(8192));
    let a = read(h2.send_request(chat(&url, &big)).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert!(v["error"]["type"].is_string(), "{v}");
    // Under the body cap, past the buffered-bytes cap.
    let over = format!(r#"{{"model":"m","pad":"{}"}}"#, "a".repeat(3500));
    let a = read(h2.send_request(chat(&url, &over)).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["error"]["type"], "overloaded", "{v}");
    assert_eq!(backend.stats().received, 2);
}

/// One HTTP/2 connection has at most `CUSTOM_ROUTER_H2_MAX_CONCURRENT_STREAMS`
/// requests open at once: the third of three concurrent requests waits
/// until one of the first two is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_h2_connection_holds_at_most_the_stream_cap() {
    let backend = mock_latency("slow", 600).await;
    let settings = Settings {
        h2_max_concurrent_streams: 2,
        ..Settings::default()
    };
    let proxy = TestProxy::sidecar(settings).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let url = base(proxy.addr());
    // A new endpoint takes one request until its latency is known.
    assert_eq!(proxy.chat("m").await.status, StatusCode::OK);
    let h2 = h2_client(TcpStream::connect(proxy.addr()).await.unwrap()).await;
    // The server's SETTINGS arrive right after the handshake.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let all = (0..3).map(|_| {
        let mut h2 = h2.clone();
        let req = chat(&url, CHAT);
        tokio::spawn(async move { read(h2.send_request(req).await.unwrap()).await.status })
    });
    let all: Vec<_> = all.collect();
    eventually(WAIT_AT_MOST, "two requests at the backend", || {
        backend.stats().received >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(backend.stats().received, 3, "the third waits for a stream");
    for r in all {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(backend.stats().received, 4);
    assert_eq!(backend.stats().max_in_flight, 2);
}

/// A TLS handshake that never finishes is cut at the header timeout, and
/// meanwhile its connection counts against its peer's cap (a second one
/// from the same address is closed unanswered); once it is cut, the peer
/// is served again. The same for a plaintext connection that sends the
/// HTTP/2 preface and nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_handshake_is_cut_at_the_header_timeout() {
    let backend = mock_latency("b", 0).await;
    let pair = Pair::generate();
    let files = pair.write(&temp_dir("stall"));
    let settings = Settings {
        client_header_timeout: Duration::from_millis(500),
        max_connections_per_peer: Some(1),
        ..tls_settings(files)
    };
    let policy = router_policy::document::load(
        &crate::one_pool(&backend.url()),
        &router_policy::QueueSettings::default(),
    )
    .unwrap();
    let proxy = TestProxy::start(settings, Mode::Inline(Box::new(policy))).await;
    // Connected, no ClientHello.
    let mut stalled = TcpStream::connect(proxy.addr()).await.unwrap();
    let started = tokio::time::Instant::now();
    // The peer's one place is taken: a second connection is closed.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tls_connect(proxy.addr(), &[&pair], &[b"h2"]).await.is_err());
    // Cut at the header timeout.
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf))
        .await
        .expect("the stalled connection is closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    // The place is free again.
    let mut served = false;
    for _ in 0..50 {
        if let Ok(tls) = tls_connect(proxy.addr(), &[&pair], &[b"h2"]).await {
            let mut h2 = h2_client(tls).await;
            let a = read(
                h2.send_request(chat(&tls_base(proxy.addr()), CHAT))
                    .await
                    .unwrap(),
            )
            .await;
            served = a.status == StatusCode::OK;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_preface_without_a_request_is_cut_at_the_header_timeout() {
    let settings = Settings {
        client_header_timeout: Duration::from_millis(500),
        ..Settings::default()
    };
    let proxy = TestProxy::sidecar(settings).await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut seen))
        .await
        .expect("the connection is closed")
        .ok();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    // The server spoke HTTP/2: its SETTINGS frame first (type 4 at byte
    // 3), then nothing but its acknowledgement of ours, if anything.
    assert_eq!(seen.get(3), Some(&4), "{seen:?}");
    let len = usize::from(seen[0]) << 16 | usize::from(seen[1]) << 8 | usize::from(seen[2]);
    let settings: Vec<(u16, u32)> = seen[9..9 + len]
        .chunks(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    // MAX_CONCURRENT_STREAMS (3), INITIAL_WINDOW_SIZE (4),
    // MAX_HEADER_LIST_SIZE (6): the defaults.
    assert!(settings.contains(&(3, 100)), "{settings:?}");
    assert!(settings.contains(&(4, 65_535)), "{settings:?}");
    assert!(settings.contains(&(6, 65_536)), "{settings:?}");
    // No WINDOW_UPDATE (type 8): the connection's window stays 65,535.
    let mut at = 9 + len;
    while at + 9 <= seen.len() {
        let n = usize::from(seen[at]) << 16
            | usize::from(seen[at + 1]) << 8
            | usize::from(seen[at + 2]);
        assert_ne!(seen[at + 3], 8, "a WINDOW_UPDATE: {seen:?}");
        at += 9 + n;
    }
}

/// A pair that cannot be used stops startup, naming the variable and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_certificate_or_key_stops_startup() {
    let dir = temp_dir("bad");
    let a = Pair::generate().write(&dir);
    let b_dir = dir.join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    let b = Pair::generate().write(&b_dir);
    let cases = [
        (
            TlsFiles {
                cert: dir.join("nope.crt"),
                key: a.key.clone(),
            },
            "CUSTOM_ROUTER_TLS_CERT_FILE",
            "cannot read it",
        ),
        (
            TlsFiles {
                cert: a.cert.clone(),
                key: a.cert.clone(),
            },
            "CUSTOM_ROUTER_TLS_KEY_FILE",
            "no PEM private key",
        ),
        (
            TlsFiles {
                cert: a.cert.clone(),
                key: b.key.clone(),
            },
            "CUSTOM_ROUTER_TLS_KEY_FILE",
            "does not match",
        ),
    ];
    for (files, var, reason) in cases {
        let settings = Settings {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            ..tls_settings(files)
        };
        let started = router_proxy::start(ProxyOptions {
            settings,
            mode: Mode::Sidecar,
            route_log: Box::new(std::io::sink()),
        })
        .await;
        let Err(e) = started else {
            panic!("started with an unusable pair ({var})");
        };
        assert!(matches!(e, StartError::Tls { .. }), "{e}");
        let text = e.to_string();
        assert!(text.starts_with(var) && text.contains(reason), "{text}");
    }
    // A good pair starts.
    let proxy = tls_proxy("good", &Pair::generate(), "http://127.0.0.1:9").await;
    assert!(proxy.addr().port() > 0);
}
