//! Exactly once across the fleet: two proxies sharing one real Redis
//! (`CUSTOM_ROUTER_SHARED_STORE`); a retry that reaches the other proxy
//! never generates again.

use std::time::Duration;

use http::StatusCode;
use router_mock::Behavior;
use router_proxy::SharedStore;
use router_tests::harness::{eventually, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::{mock, mock_latency, mock_sse};
use router_tests::redis::RedisServer;
use tokio::io::AsyncWriteExt;

use crate::settings;

fn policy(url: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["{url}"]
  routes:
    - name: send
      match: {{risk: [SEND, DESTRUCTIVE]}}
      chain: [only]
    - name: r
      chain: [only]
"#
    )
}

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"pay once"}]}"#;

/// Two proxies on one store, with `policy(url)`.
async fn fleet(redis: &RedisServer, url: &str) -> (TestProxy, TestProxy) {
    let mut s = settings();
    s.shared_store = Some(SharedStore::new(&redis.url()).unwrap());
    let a = TestProxy::with_policy(s.clone(), &policy(url)).await;
    let b = TestProxy::with_policy(s, &policy(url)).await;
    // Both connected (the first connection is made in the background).
    for p in [&a, &b] {
        let key = format!("warm-{}", p.addr().port());
        let body = r#"{"model":"m","messages":[]}"#;
        let mut ok = false;
        for _ in 0..200 {
            let r = p
                .chat_with(
                    &[("idempotency-key", &key), ("x-router-risk", "SEND")],
                    body,
                )
                .await;
            if r.status == StatusCode::OK {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ok, "proxy did not reach the shared store");
    }
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_the_other_proxy_joins_the_request_in_flight() {
    let redis = RedisServer::start("join").await;
    let m = mock_latency("m", 400).await;
    let (a, b) = fleet(&redis, &m.url()).await;
    let before = m.stats().received;
    let key = [("idempotency-key", "join-1")];
    let first = async {
        let r = a.chat_with(&key, BODY).await;
        (r, tokio::time::Instant::now())
    };
    let retry = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = b.chat_with(&key, BODY).await;
        (r, tokio::time::Instant::now())
    };
    let ((first, first_at), (retry, retry_at)) = tokio::join!(first, retry);
    // The joiner polls the store (2 ms doubling to 50 ms): it answers at
    // most one poll interval after the first, plus scheduling.
    let lag = retry_at.saturating_duration_since(first_at);
    println!("join lag: {lag:?}");
    assert!(lag < Duration::from_millis(150), "join lag {lag:?}");
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.body, first.body, "the same bytes");
    assert_eq!(retry.header("x-router-replayed"), Some("true"));
    assert_eq!(m.stats().received - before, 1, "generated once");
    let lines = b.log.wait_for(2).await;
    let joined = lines.iter().find(|l| l["request_id"] == "join-1").unwrap();
    assert_eq!(joined["idempotency"], "join");
    assert_eq!(joined["outcome"], "replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_answer_is_replayed_by_the_other_proxy_and_mismatches_refused() {
    let redis = RedisServer::start("replay").await;
    let m = mock("m", Behavior::Json).await;
    let (a, b) = fleet(&redis, &m.url()).await;
    let before = m.stats().received;
    let key = [("idempotency-key", "replay-1")];
    let first = a.chat_with(&key, BODY).await;
    assert_eq!(first.status, StatusCode::OK);
    let retry = b.chat_with(&key, BODY).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.header("x-router-replayed"), Some("true"));
    assert_eq!(
        retry.header("x-router-route"),
        first.header("x-router-route")
    );
    assert_eq!(m.stats().received - before, 1);
    // Another body, or the same body from another caller: 422.
    let other = b
        .chat_with(
            &key,
            r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
        )
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.error_type(), "idempotency_mismatch");
    let stranger = b
        .chat_with(
            &[
                ("idempotency-key", "replay-1"),
                ("authorization", "Bearer someone-else"),
            ],
            BODY,
        )
        .await;
    assert_eq!(stranger.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(m.stats().received - before, 1);
    let lines = b.log.wait_for(4).await;
    assert!(lines
        .iter()
        .any(|l| l["request_id"] == "replay-1" && l["idempotency"] == "replay"));
    assert!(b
        .metrics()
        .await
        .contains(r#"router_idempotency_events_total{event="replay"} 1"#));
}

/// Sends a keyed request on a raw connection and closes it after `after`.
async fn send_and_leave(proxy: &TestProxy, key: &str, body: &str, after: Duration) {
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nidempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_left_gets_the_finished_answer_from_the_other_proxy() {
    let redis = RedisServer::start("gone").await;
    let m = mock_latency("m", 400).await;
    let (a, b) = fleet(&redis, &m.url()).await;
    let before = m.stats();
    send_and_leave(&a, "gone-1", BODY, Duration::from_millis(100)).await;
    // The generation is not cancelled: it completes.
    eventually(WAIT_AT_MOST, "the first generation completes", || {
        m.stats().completed == before.completed + 1
    })
    .await;
    assert_eq!(m.stats().cancelled, before.cancelled, "not cancelled");
    let retry = b.chat_with(&[("idempotency-key", "gone-1")], BODY).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.header("x-router-replayed"), Some("true"));
    assert_eq!(m.stats().received - before.received, 1, "generated once");

    // Without a key, a client that leaves cancels its generation at once.
    let mut s = tokio::net::TcpStream::connect(a.addr()).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let received = m.stats().received;
    eventually(WAIT_AT_MOST, "the unkeyed request reaches the mock", || {
        m.stats().received == received + 1
    })
    .await;
    drop(s);
    eventually(WAIT_AT_MOST, "the unkeyed generation is cancelled", || {
        m.stats().cancelled == before.cancelled + 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_may_have_acted_is_never_sent_again() {
    let redis = RedisServer::start("unknown").await;
    let m = mock("m", Behavior::Json).await;
    let (a, b) = fleet(&redis, &m.url()).await;
    m.set_behavior(Behavior::Status(500));
    let before = m.stats().received;
    let send = [("idempotency-key", "send-1"), ("x-router-risk", "SEND")];
    let first = a.chat_with(&send, BODY).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    m.set_behavior(Behavior::Json);
    let retry = b.chat_with(&send, BODY).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{}", retry.text());
    assert_eq!(retry.error_type(), "outcome_unknown");
    let first_request = &retry.json()["error"]["first_request"];
    assert_eq!(first_request["request_id"], "send-1");
    assert_eq!(first_request["attempts"][0]["pool"], "only");
    assert_eq!(first_request["attempts"][0]["outcome"], "status_5xx");
    assert_eq!(m.stats().received - before, 1, "never a second send");
    // A READ that failed the same way releases its key: the retry routes.
    m.set_behavior(Behavior::Status(500));
    let read = [("idempotency-key", "read-1")];
    assert_eq!(
        a.chat_with(&read, BODY).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    m.set_behavior(Behavior::Json);
    assert_eq!(b.chat_with(&read, BODY).await.status, StatusCode::OK);
    assert_eq!(m.stats().received - before, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_is_replayed_as_a_stream_by_the_other_proxy() {
    let redis = RedisServer::start("stream").await;
    let m = mock_sse("m", 4, 20).await;
    let (a, b) = fleet(&redis, &m.url()).await;
    let before = m.stats().received;
    let key = [("idempotency-key", "stream-9")];
    let body = r#"{"model":"m","stream":true}"#;
    let first = a.chat_with(&key, body).await;
    assert_eq!(first.status, StatusCode::OK);
    let retry = b.chat_with(&key, body).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.header("x-router-replayed"), Some("true"));
    assert_eq!(retry.body, first.body, "the same SSE frames");
    assert!(retry
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    assert_eq!(m.stats().received - before, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_fails_send_closed_and_read_open_then_recovers() {
    let mut redis = RedisServer::start("outage").await;
    let m = mock("m", Behavior::Json).await;
    let (a, b) = fleet(&redis, &m.url()).await;
    // Traffic all along: keyed READ, keyed SEND and unkeyed requests on
    // both proxies before Redis dies, while it is down, and after it is
    // back. Each answer is kept with the phase its request was sent in;
    // the traffic stops only after a few rounds in the last phase, so the
    // check does not depend on how fast a loaded machine runs the loop.
    const BEFORE: u8 = 0;
    const DOWN: u8 = 1;
    const BACK: u8 = 2;
    let phase = std::sync::atomic::AtomicU8::new(BEFORE);
    let traffic = async {
        let mut seen: Vec<(u8, &'static str, StatusCode, String)> = Vec::new();
        let mut rounds_back = 0;
        let mut i = 0;
        while rounds_back < 3 {
            i += 1;
            let now = phase.load(std::sync::atomic::Ordering::SeqCst);
            let p = if i % 2 == 0 { &a } else { &b };
            let rk = format!("load-read-{i}");
            let r = p.chat_with(&[("idempotency-key", &rk)], BODY).await;
            seen.push((now, "read", r.status, r.error_type()));
            let sk = format!("load-send-{i}");
            let r = p
                .chat_with(&[("idempotency-key", &sk), ("x-router-risk", "SEND")], BODY)
                .await;
            seen.push((now, "send", r.status, r.error_type()));
            let r = p.chat("m").await;
            seen.push((now, "unkeyed", r.status, r.error_type()));
            if now == BACK {
                rounds_back += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        seen
    };
    let outage = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.stop();
        phase.store(DOWN, std::sync::atomic::Ordering::SeqCst);
        // SEND with a key: refused, with Retry-After, never sent.
        let before = m.stats().received;
        let send = [("idempotency-key", "down-send"), ("x-router-risk", "SEND")];
        let r = a.chat_with(&send, BODY).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
        assert_eq!(r.error_type(), "shared_store_unavailable");
        // The answer names the cause (issue 30).
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains("Idempotency-Key"), "{message}");
        assert!(r.header("retry-after").is_some());
        assert!(m.stats().received >= before);
        // READ with a key: served from the proxy's own store.
        let read = [("idempotency-key", "down-read")];
        assert_eq!(b.chat_with(&read, BODY).await.status, StatusCode::OK);
        // Unkeyed requests never touch the store.
        assert_eq!(a.chat("m").await.status, StatusCode::OK);
        let metrics = b.metrics().await;
        assert!(
            metrics.contains(r#"router_idempotency_events_total{event="fail_open"}"#),
            "{metrics}"
        );
        assert!(metrics.contains("router_shared_store_errors_total"));
        assert_eq!(a.health().await["shared_store"]["reachable"], false);
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Back on the same port: both proxies reconnect on their own.
        redis.resume().await;
        for p in [&a, &b] {
            let mut status = StatusCode::SERVICE_UNAVAILABLE;
            for i in 0..300 {
                let key = format!("after-{}-{i}", p.addr().port());
                let r = p
                    .chat_with(
                        &[("idempotency-key", &key), ("x-router-risk", "SEND")],
                        BODY,
                    )
                    .await;
                status = r.status;
                if status == StatusCode::OK {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(status, StatusCode::OK, "recovered without a restart");
        }
        phase.store(BACK, std::sync::atomic::Ordering::SeqCst);
    };
    let (seen, ()) = tokio::join!(traffic, outage);
    // Nothing but SEND was refused, and SEND only for the store (one sent
    // just before Redis died may be refused too: its claim was cut).
    for (_, kind, status, error) in &seen {
        match *kind {
            "send" => assert!(
                *status == StatusCode::OK || error == "shared_store_unavailable",
                "{kind}: {status} {error}"
            ),
            _ => assert_eq!(*status, StatusCode::OK, "{kind}: {error}"),
        }
    }
    let sends_refused = seen
        .iter()
        .filter(|(_, k, s, _)| *k == "send" && *s != StatusCode::OK)
        .count();
    assert!(sends_refused > 0, "the outage was seen by the traffic");
    for p in [BEFORE, DOWN, BACK] {
        assert!(
            seen.iter().any(|(when, ..)| *when == p),
            "traffic ran in phase {p}: {seen:?}"
        );
    }
    assert_eq!(a.health().await["shared_store"]["reachable"], true);
    // And the fleet shares keys again.
    let key = [("idempotency-key", "after-both")];
    let before = m.stats().received;
    assert_eq!(a.chat_with(&key, BODY).await.status, StatusCode::OK);
    let again = b.chat_with(&key, BODY).await;
    assert_eq!(again.header("x-router-replayed"), Some("true"));
    assert_eq!(m.stats().received - before, 1);
    assert!(redis.dbsize() >= 1);
}

/// A policy whose one route keeps no request alive for its retry.
fn no_finish_policy(url: &str) -> String {
    policy(url).replace(
        "    - name: r\n      chain: [only]\n",
        "    - name: r\n      chain: [only]\n      finish_on_client_gone: false\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_can_turn_finishing_for_the_retry_off() {
    let m = mock_latency("m", 400).await;
    let proxy = TestProxy::with_policy(settings(), &no_finish_policy(&m.url())).await;
    send_and_leave(&proxy, "off-1", BODY, Duration::from_millis(100)).await;
    eventually(WAIT_AT_MOST, "the generation is cancelled", || {
        m.stats().cancelled == 1
    })
    .await;
    // The key was released: the retry routes (and generates).
    let retry = proxy.chat_with(&[("idempotency-key", "off-1")], BODY).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.header("x-router-replayed"), None);
    assert_eq!(m.stats().received, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_never_reached_a_backend_releases_its_key() {
    // Nothing listens there: the connection is refused, nothing was sent.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let proxy = TestProxy::with_policy(settings(), &policy(&url)).await;
    let send = [("idempotency-key", "never-sent"), ("x-router-risk", "SEND")];
    let first = proxy.chat_with(&send, BODY).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY, "{}", first.text());
    // Routed again (a fresh try), not refused as outcome_unknown.
    let retry = proxy.chat_with(&send, BODY).await;
    assert_eq!(retry.status, StatusCode::BAD_GATEWAY, "{}", retry.text());
    assert_eq!(retry.error_type(), "upstream_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_left_is_finished_and_replayed_by_the_other_proxy() {
    let redis = RedisServer::start("stream-gone").await;
    let m = mock_sse("m", 6, 60).await;
    let (a, b) = fleet(&redis, &m.url()).await;
    let before = m.stats();
    let body = r#"{"model":"m","stream":true}"#;
    // The client reads nothing and leaves while the stream is half way.
    send_and_leave(&a, "stream-gone-1", body, Duration::from_millis(120)).await;
    eventually(WAIT_AT_MOST, "the stream is generated to its end", || {
        m.stats().completed == before.completed + 1
    })
    .await;
    assert_eq!(m.stats().cancelled, before.cancelled, "not cancelled");
    let retry = b
        .chat_with(&[("idempotency-key", "stream-gone-1")], body)
        .await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.header("x-router-replayed"), Some("true"));
    let text = retry.text();
    assert_eq!(
        text.matches("data: ").count(),
        7,
        "6 chunks and [DONE]: {text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(m.stats().received - before.received, 1, "generated once");
    // The first proxy's log says the client left and the answer was kept.
    eventually(WAIT_AT_MOST, "the first request's log line", || {
        a.log
            .lines()
            .iter()
            .any(|l| l["request_id"] == "stream-gone-1")
    })
    .await;
    let lines = a.log.lines();
    let first = lines
        .iter()
        .find(|l| l["request_id"] == "stream-gone-1")
        .unwrap();
    assert_eq!(first["outcome"], "client_cancelled");
    assert!(first["reason"]
        .as_str()
        .unwrap()
        .contains("kept for its retry"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_carries_the_keys_and_an_untrusted_certificate_is_refused() {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let redis =
        RedisServer::start_tls("tls", &ck.cert.pem(), &ck.signing_key.serialize_pem()).await;
    let m = mock("m", Behavior::Json).await;
    // A self-signed certificate nobody trusts: refused (the proxy never
    // connects, so keyed SEND requests fail closed).
    let mut s = settings();
    s.shared_store = Some(SharedStore::new(&redis.url()).unwrap());
    let strict = TestProxy::with_policy(s, &policy(&m.url())).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!strict.proxy.shared_store_connected());
    let r = strict
        .chat_with(
            &[("idempotency-key", "tls-0"), ("x-router-risk", "SEND")],
            BODY,
        )
        .await;
    assert_eq!(r.error_type(), "shared_store_unavailable");
    // Told to skip verification (`#insecure`, for tests): TLS carries the
    // keys across proxies.
    let mut s = settings();
    let insecure = format!("{}#insecure", redis.url());
    s.shared_store = Some(SharedStore::new(&insecure).unwrap());
    let a = TestProxy::with_policy(s.clone(), &policy(&m.url())).await;
    let b = TestProxy::with_policy(s, &policy(&m.url())).await;
    eventually(WAIT_AT_MOST, "both proxies connected over TLS", || {
        a.proxy.shared_store_connected() && b.proxy.shared_store_connected()
    })
    .await;
    let before = m.stats().received;
    let key = [("idempotency-key", "tls-1")];
    let first = a.chat_with(&key, BODY).await;
    assert_eq!(first.status, StatusCode::OK);
    let retry = b.chat_with(&key, BODY).await;
    assert_eq!(retry.header("x-router-replayed"), Some("true"));
    assert_eq!(retry.body, first.body);
    assert_eq!(m.stats().received - before, 1);
}

/// Issue 30, item 3: a proxy process whose Redis restarts without
/// persistence says so, once, at warn (the epoch marker is checked every
/// 5 s): the log names what is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_lost_its_data_is_logged_once_at_warn() {
    let mut redis = RedisServer::start("reset-log").await;
    let backend = mock("only", Behavior::Json).await;
    let store = redis.url();
    let proxy = router_tests::proxy_process::ProxyProcess::start(
        "reset-log",
        &policy(&backend.url()),
        &[("CUSTOM_ROUTER_SHARED_STORE", store.as_str())],
    );
    eventually(WAIT_AT_MOST, "the epoch marker written", || {
        redis.get("router:store:epoch").is_some()
    })
    .await;
    redis.stop();
    redis.resume().await;
    let said = "the shared store lost its data: spend since";
    eventually(Duration::from_secs(15), "the loss logged", || {
        proxy.stderr().contains(said)
    })
    .await;
    // Once: the next checks find the marker written after the loss.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let log = proxy.stderr();
    assert_eq!(log.matches(said).count(), 1, "{log}");
    assert!(log.contains("WARN"), "{log}");
    assert!(
        redis
            .get("router:store:epoch")
            .is_some_and(|m| m.contains("\"replaces\"")),
        "the new marker names the lost epoch"
    );
}
