//! Which protocols the listener speaks: HTTP/1.1 unchanged, h2c with prior
//! knowledge on the same port, TLS with ALPN `h2` and `http/1.1`; requests
//! that came over HTTP/2 reach HTTP/1.1 backends as HTTP/1.1 requests, and
//! answers over HTTP/2 carry no connection-specific header.

use std::time::Duration;

use http::{StatusCode, Version};
use http_body_util::BodyExt;
use router_proxy::Mode;
use router_tests::harness::{eventually, health_in_flight, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::{mock_latency, mock_sse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{
    base, chat, h1_client, h2_client, one_pool, read, tls_base, tls_connect, tls_settings,
};
use crate::{temp_dir, Pair, CHAT};

/// Connection-specific headers (RFC 9113 §8.2.2): never in an HTTP/2
/// answer.
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_plaintext_port_serves_http1_and_h2c_with_prior_knowledge() {
    let backend = mock_latency("b", 0).await;
    let proxy = TestProxy::sidecar(Settings::default()).await;
    proxy.set_backends(&[backend.host_port()]).await;

    // HTTP/1.1, as before.
    let r = proxy.chat("m").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // h2c: the HTTP/2 preface straight away, on the same port.
    let mut h2 = h2_client(TcpStream::connect(proxy.addr()).await.unwrap()).await;
    let a = read(
        h2.send_request(chat(&base(proxy.addr()), CHAT))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.version, Version::HTTP_2);
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["object"], "chat.completion");
    for name in CONNECTION_SPECIFIC {
        assert!(
            !a.headers.contains_key(name),
            "{name} over h2: {:?}",
            a.headers
        );
    }
    // Several requests on the one connection, at once.
    let many = futures_util::future::join_all((0..8).map(|_| {
        let mut h2 = h2.clone();
        let req = chat(&base(proxy.addr()), CHAT);
        async move { h2.send_request(req).await.unwrap().status() }
    }))
    .await;
    assert!(many.iter().all(|s| *s == StatusCode::OK), "{many:?}");

    // The backend got HTTP/1.1 requests: its own Host, the client's
    // authority as X-Forwarded-Host.
    let seen = backend.requests();
    let last = seen.last().unwrap();
    assert_eq!(
        last.headers["host"].to_str().unwrap(),
        backend.host_port(),
        "the backend's own host"
    );
    assert_eq!(
        last.headers["x-forwarded-host"].to_str().unwrap(),
        format!("127.0.0.1:{}", proxy.addr().port())
    );
    assert_eq!(last.headers["x-forwarded-proto"], "http");
    assert_eq!(backend.stats().received, 10);
    let lines = proxy.log.wait_for(10).await;
    assert_eq!(lines.len(), 10, "one route decision line per request");
}

/// A TLS proxy of one pool, `backend_url`, presenting `pair`.
pub(crate) async fn tls_proxy(name: &str, pair: &Pair, backend_url: &str) -> TestProxy {
    let files = pair.write(&temp_dir(name));
    let policy = router_policy::document::load(
        &one_pool(backend_url),
        &router_policy::QueueSettings::default(),
    )
    .unwrap();
    TestProxy::start(tls_settings(files), Mode::Inline(Box::new(policy))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_h2_and_http1_by_alpn() {
    let backend = mock_latency("b", 0).await;
    let pair = Pair::generate();
    let proxy = tls_proxy("alpn", &pair, &backend.url()).await;
    let url = tls_base(proxy.addr());

    // ALPN h2 (offered first, as browsers and httpx do).
    let tls = tls_connect(proxy.addr(), &[&pair], &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut h2 = h2_client(tls).await;
    let a = read(h2.send_request(chat(&url, CHAT)).await.unwrap()).await;
    assert_eq!((a.status, a.version), (StatusCode::OK, Version::HTTP_2));
    for name in CONNECTION_SPECIFIC {
        assert!(
            !a.headers.contains_key(name),
            "{name} over h2: {:?}",
            a.headers
        );
    }

    // ALPN http/1.1, and no ALPN at all: HTTP/1.1.
    for alpn in [&[&b"http/1.1"[..]][..], &[]] {
        let tls = tls_connect(proxy.addr(), &[&pair], alpn).await.unwrap();
        let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        assert_eq!(negotiated, alpn.first().map(|p| p.to_vec()));
        let mut h1 = h1_client(tls).await;
        let mut req = chat("", CHAT);
        req.headers_mut().insert(
            "host",
            format!("localhost:{}", proxy.addr().port())
                .parse()
                .unwrap(),
        );
        let a = read(h1.send_request(req).await.unwrap()).await;
        assert_eq!((a.status, a.version), (StatusCode::OK, Version::HTTP_11));
    }

    // The backend hears the client came over TLS.
    let seen = backend.requests();
    assert_eq!(seen.len(), 3);
    for r in &seen {
        assert_eq!(r.headers["x-forwarded-proto"], "https");
        assert_eq!(
            r.headers["x-forwarded-host"].to_str().unwrap(),
            format!("localhost:{}", proxy.addr().port())
        );
    }

    // Plaintext to a TLS listener gets no HTTP answer.
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    raw.write_all(b"GET /_custom_router/health HTTP/1.1\r\nhost: r\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut got)).await;
    assert!(
        !got.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // An untrusted certificate is refused by the client: the proxy
    // presents the pair it was given.
    let other = Pair::generate();
    assert!(tls_connect(proxy.addr(), &[&other], &[b"h2"])
        .await
        .is_err());
}

/// Streaming over HTTP/2, and a client that resets its stream (RST_STREAM)
/// mid-answer: settled as an HTTP/1.1 client that disconnects is (the
/// slot freed, the backend cancelled, `client_cancelled` logged), while
/// the connection goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_over_h2_settles_like_a_disconnect() {
    let backend = mock_sse("mock", 100, 50).await;
    let proxy = TestProxy::sidecar(Settings::default()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let mut h2 = h2_client(TcpStream::connect(proxy.addr()).await.unwrap()).await;
    let resp = h2
        .send_request(chat(&base(proxy.addr()), r#"{"model":"m","stream":true}"#))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), Version::HTTP_2);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    let text = String::from_utf8_lossy(first.data_ref().unwrap()).into_owned();
    assert!(text.starts_with("data: "), "{text}");
    assert_eq!(health_in_flight(&proxy.health().await), 1);
    // Dropping the body resets the stream (RST_STREAM CANCEL).
    drop(body);
    eventually(Duration::from_secs(2), "upstream cancelled", || {
        backend.stats().cancelled == 1
    })
    .await;
    assert_eq!(backend.stats().completed, 0);
    assert_eq!(health_in_flight(&proxy.health().await), 0);
    let lines = proxy.log.wait_for(1).await;
    assert_eq!(lines[0]["outcome"], "client_cancelled");
    // The connection itself is fine: a whole stream on it.
    let resp = h2
        .send_request(chat(&base(proxy.addr()), r#"{"model":"m","stream":true}"#))
        .await
        .unwrap();
    let whole = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&whole);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(text.matches("data: ").count(), 101);
}

/// A drain over HTTP/2: the connection is told to go away (GOAWAY), the
/// request in flight on it is answered, a new one is not taken, and the
/// drain finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_h2_streams_finish_and_sends_goaway() {
    let backend = mock_latency("slow", 400).await;
    let proxy = TestProxy::sidecar(Settings::default()).await;
    proxy.set_backends(&[backend.host_port()]).await;
    let addr = proxy.addr();
    let h2 = h2_client(TcpStream::connect(addr).await.unwrap()).await;
    let in_flight = tokio::spawn({
        let mut h2 = h2.clone();
        async move { read(h2.send_request(chat(&base(addr), CHAT)).await.unwrap()).await }
    });
    eventually(WAIT_AT_MOST, "the request at the backend", || {
        backend.stats().received == 1
    })
    .await;
    let TestProxy { proxy, .. } = proxy;
    let drained = tokio::spawn(proxy.drain(Duration::from_secs(5)));
    let answered = in_flight.await.unwrap();
    assert_eq!(answered.status, StatusCode::OK);
    assert!(drained.await.unwrap(), "the drain finished in time");
    // The connection is gone: nothing more is taken on it.
    let mut h2 = h2;
    let later = h2.send_request(chat(&base(addr), CHAT)).await;
    assert!(later.is_err(), "a request after the drain was taken");
    assert_eq!(backend.stats().received, 1);
}

use router_proxy::Settings;

/// The official `openai` Python SDK over the TLS listener, trusting the
/// router's certificate through its HTTP client (`tests/python/openai_tls.py`):
/// a completion and a stream. Skipped, saying so, when the package is not
/// installed (`scripts/install-test-deps` installs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_over_tls() {
    let has = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        eprintln!("SKIPPED: the `openai` Python package is not installed");
        return;
    }
    let backend = router_tests::mocks::mock("chat", router_mock::Behavior::Chat).await;
    let pair = Pair::generate();
    let dir = temp_dir("sdk-ca");
    let proxy = tls_proxy("sdk", &pair, &backend.url()).await;
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, &pair.cert_pem).unwrap();
    let script = format!("{}/python/openai_tls.py", env!("CARGO_MANIFEST_DIR"));
    let url = tls_base(proxy.addr());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(url)
            .arg("m")
            .arg(ca)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for step in ["chat.completions.create", "stream", "untrusted refused"] {
        assert!(stdout.contains(&format!("ok {step}")), "{step}: {stdout}");
    }
    assert_eq!(backend.stats().received, 2);
}
