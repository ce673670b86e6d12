//! Shedding against the deadline: 504 at once when nothing fits, never an
//! answer after the deadline, streams cut cleanly.

use std::time::Duration;

use tokio::time::Instant;

use http::{Method, StatusCode};
use http_body_util::BodyExt;
use router_mock::Behavior;
use router_tests::harness::{eventually, TestProxy};
use router_tests::mocks::{mock, mock_latency, mock_sse};

use crate::settings;

fn one_pool(url: &str, defaults: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  defaults: {{{defaults}}}
  pools:
    - name: only
      endpoints: ["{url}"]
  routes:
    - name: r
      chain: [only]
"#
    )
}

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_answered_after_the_deadline() {
    let slow = mock_latency("slow", 500).await;
    let proxy = TestProxy::with_policy(settings(), &one_pool(&slow.url(), "")).await;
    let started = Instant::now();
    let r = proxy
        .chat_with(&[("x-router-deadline-ms", "200")], BODY)
        .await;
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(r.error_type(), "deadline_exhausted");
    assert!(took >= Duration::from_millis(195), "{took:?}");
    assert!(
        took <= Duration::from_millis(260),
        "answered {took:?} after a 200 ms deadline"
    );
    eventually(Duration::from_secs(2), "upstream cancelled", || {
        slow.stats().cancelled == 1
    })
    .await;
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["outcome"], "deadline_exhausted");
    assert_eq!(l["deadline_ms"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_cannot_fit_is_shed_at_once() {
    let slow = mock_latency("slow", 300).await;
    let proxy =
        TestProxy::with_policy(settings(), &one_pool(&slow.url(), "deadline_ms: 5000")).await;
    // The route's default deadline (5 s) lets the first one through and
    // measures the pool (p95 300 ms).
    assert_eq!(proxy.chat_with(&[], BODY).await.status, StatusCode::OK);
    let started = Instant::now();
    let r = proxy
        .chat_with(&[("x-router-deadline-ms", "150")], BODY)
        .await;
    assert!(
        started.elapsed() < Duration::from_millis(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(r.error_type(), "deadline_exhausted");
    assert_eq!(slow.stats().received, 1, "nothing was sent");
    let l = &proxy.log.wait_for(2).await[1];
    assert_eq!(l["walk"][0]["note"], "skipped_for_time", "{l}");
    assert_eq!(l["walk"][0]["why"], "too_slow", "{l}");
    assert!(
        l["reason"].as_str().unwrap().contains("does not fit"),
        "{l}"
    );
    assert_eq!(l["attempts"].as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_deadline_header_is_a_400() {
    let m = mock("m", Behavior::Json).await;
    let proxy = TestProxy::with_policy(settings(), &one_pool(&m.url(), "")).await;
    for bad in ["soon", "0", "-5", "99999999999"] {
        let r = proxy
            .chat_with(&[("x-router-deadline-ms", bad)], BODY)
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.error_type(), "invalid_request");
    }
    assert_eq!(m.stats().received, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_deadline_is_cut_with_one_error_event() {
    let streamer = mock_sse("streamer", 20, 50).await;
    let proxy = TestProxy::with_policy(settings(), &one_pool(&streamer.url(), "")).await;
    let req = http::Request::builder()
        .method(Method::POST)
        .uri(proxy.url("/v1/chat/completions"))
        .header("x-router-deadline-ms", "300")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            r#"{"model":"m","stream":true}"#,
        )))
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let started = Instant::now();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("a clean end, not an error")
        .to_bytes();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("tok0"),
        "the client keeps what it got: {text}"
    );
    assert!(!text.contains("[DONE]"));
    assert_eq!(text.matches("event: error").count(), 1, "{text}");
    assert!(
        text.trim_end().ends_with("}"),
        "the error event is the last thing: {text}"
    );
    assert!(text.contains("deadline_exhausted"));
    assert!(took < Duration::from_millis(400), "{took:?}");
    eventually(Duration::from_secs(2), "upstream cancelled", || {
        streamer.stats().cancelled == 1
    })
    .await;
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["outcome"], "deadline_exhausted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_does_not_fail_over_after_its_first_byte() {
    let primary = mock_sse("primary", 50, 20).await;
    let fallback = mock("fallback", Behavior::Json).await;
    let proxy = TestProxy::with_policy(
        settings(),
        &crate::two_pools(&primary.url(), &fallback.url(), "", ""),
    )
    .await;
    let resp = proxy
        .client
        .stream(
            Method::POST,
            &proxy.url("/v1/chat/completions"),
            r#"{"model":"m","stream":true}"#,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    // The primary dies mid-stream.
    primary.stop().await;
    let rest = body.collect().await;
    assert!(
        rest.is_err(),
        "the client sees a broken stream, not a second answer"
    );
    assert_eq!(
        fallback.stats().received,
        0,
        "no failover after the first byte"
    );
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["outcome"], "upstream_reset");
}

/// A client that reads the answer's head and then stops reading: once the
/// socket buffers are full nothing polls the answer's body, yet at the
/// deadline the backend is cancelled and the endpoint's slot is freed.
/// (Before the relay, the deadline was only checked when the body was
/// polled: the generation went on and the lease was held for as long as
/// the client stalled.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_does_not_hold_the_backend_past_the_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // ~150 bytes an event, as fast as it can: far more than the socket
    // buffers between a stalled client and the proxy hold.
    let streamer = mock_sse("streamer", 200_000, 0).await;
    let proxy = TestProxy::with_policy(settings(), &one_pool(&streamer.url(), "")).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(proxy.addr()).await.unwrap();
    let body = r#"{"model":"m","stream":true}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n\
         x-router-deadline-ms: 5000\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    // The head (and a little of the body), then no more reading.
    let mut head = [0u8; 512];
    let n = conn.read(&mut head).await.unwrap();
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    // The stream is under way and its slot taken.
    proxy
        .wait_health("the stream holds its slot", |h| {
            router_tests::harness::health_in_flight(h) == 1
        })
        .await;
    // Past the deadline, with the client still not reading: the backend
    // saw the cancellation and the slot is free again.
    eventually(Duration::from_secs(5), "upstream cancelled", || {
        streamer.stats().cancelled == 1
    })
    .await;
    proxy
        .wait_health("the slot is released", |h| {
            router_tests::harness::health_in_flight(h) == 0
        })
        .await;
    assert_eq!(streamer.stats().completed, 0, "never generated to the end");
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["outcome"], "deadline_exhausted");
    drop(conn);
}
