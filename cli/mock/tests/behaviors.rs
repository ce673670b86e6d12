//! `router-mock`'s behaviours, observed from outside as a router would see
//! them: real sockets, a real HTTP/1.1 client, only the public API.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use router_mock::{Behavior, MockConfig, MockModel, MockStats, OverCap, MOCK_NAME_HEADER};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A one-shot HTTP/1.1 client on its own connection.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> hyper::Result<Response<Incoming>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("x-request-id", "req-1")
        .body(http_body_util::Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    sender.send_request(request).await
}

async fn post(addr: SocketAddr, body: &str) -> Response<Incoming> {
    send(addr, "POST", "/v1/chat/completions", body)
        .await
        .expect("response")
}

async fn body_bytes(response: Response<Incoming>) -> Bytes {
    response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
}

/// Polls `check` until it holds, failing after a few seconds.
async fn eventually(mock: &MockModel, check: impl Fn(&MockStats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = mock.stats();
        if check(&stats) {
            return;
        }
        assert!(Instant::now() < deadline, "condition never held: {stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn config(behavior: Behavior) -> MockConfig {
    MockConfig {
        name: "m1".to_owned(),
        behavior,
        ..MockConfig::default()
    }
}

#[tokio::test]
async fn json_answer_with_usage_and_recording() {
    let mock = MockModel::start(config(Behavior::Json))
        .await
        .expect("start");
    assert_eq!(mock.url(), format!("http://{}", mock.host_port()));
    let request_body = r#"{"model":"llama3","messages":[]}"#; // 32 bytes
    let response = send(
        mock.addr(),
        "POST",
        "/v1/chat/completions?a=1",
        request_body,
    )
    .await
    .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[MOCK_NAME_HEADER], "m1");
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    let answer: Value = serde_json::from_slice(&body_bytes(response).await).expect("json");
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["model"], "llama3");
    assert_eq!(answer["served_by"], "m1");
    assert_eq!(answer["request_id"], "req-1");
    assert_eq!(answer["choices"][0]["message"]["content"], "hello from m1");
    assert_eq!(answer["usage"]["prompt_tokens"], 8);
    assert_eq!(answer["usage"]["completion_tokens"], 5);
    assert_eq!(answer["usage"]["total_tokens"], 13);
    assert!(answer["id"].as_str().expect("id").starts_with("chatcmpl-"));

    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].path, "/v1/chat/completions?a=1");
    assert_eq!(requests[0].headers["x-request-id"], "req-1");
    assert_eq!(requests[0].body, request_body);
    eventually(&mock, |s| s.completed == 1).await;
    let stats = mock.stats();
    assert_eq!(
        (stats.received, stats.cancelled, stats.in_flight),
        (1, 0, 0)
    );

    // Without a JSON model field the answer names the model "mock".
    let answer: Value =
        serde_json::from_slice(&body_bytes(post(mock.addr(), "not json").await).await)
            .expect("json");
    assert_eq!(answer["model"], "mock");
    assert_eq!(answer["usage"]["prompt_tokens"], 2);
    mock.stop().await;
}

#[tokio::test]
async fn health_is_always_ok_and_not_counted() {
    let mock = MockModel::start(config(Behavior::Hang))
        .await
        .expect("start");
    let response = send(mock.addr(), "GET", "/health", "")
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[MOCK_NAME_HEADER], "m1");
    assert_eq!(body_bytes(response).await, r#"{"ok":true}"#);
    // Health checks are neither recorded nor counted (only the TCP
    // connection they came on is).
    assert_eq!(
        mock.stats(),
        MockStats {
            connections: 1,
            ..MockStats::default()
        }
    );
    assert!(mock.requests().is_empty());
    mock.stop().await;
}

#[tokio::test]
async fn pages_are_served_whatever_the_behavior_and_counted_apart() {
    let mock = MockModel::start(config(Behavior::Hang))
        .await
        .expect("start");
    assert_eq!(mock.page_hits("/api/ps"), 0);
    mock.set_page("/api/ps", 200, r#"{"models":[]}"#);
    for _ in 0..2 {
        let response = send(mock.addr(), "GET", "/api/ps", "")
            .await
            .expect("response");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[MOCK_NAME_HEADER], "m1");
        assert_eq!(body_bytes(response).await, r#"{"models":[]}"#);
    }
    // Counted by the time the answer is out, whatever its status.
    assert_eq!(mock.page_hits("/api/ps"), 2);
    mock.set_page("/api/ps", 500, "oops");
    let response = send(mock.addr(), "GET", "/api/ps", "")
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body_bytes(response).await, "oops");
    assert_eq!(mock.page_hits("/api/ps"), 3);
    assert_eq!(mock.page_hits("/metrics"), 0);
    // Neither recorded nor counted as requests.
    assert!(mock.requests().is_empty());
    assert_eq!(mock.stats().received, 0);
    mock.stop().await;
}

#[tokio::test]
async fn queue_serves_one_at_a_time() {
    let mock = MockModel::start(MockConfig {
        latency: Duration::from_millis(50),
        max_concurrency: Some(1),
        over_cap: OverCap::Queue,
        ..MockConfig::default()
    })
    .await
    .expect("start");
    let started = Instant::now();
    let answers = futures_util::future::join_all((0..3).map(|_| post(mock.addr(), "{}"))).await;
    for response in answers {
        assert_eq!(response.status(), StatusCode::OK);
        body_bytes(response).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(150));
    eventually(&mock, |s| s.completed == 3).await;
    let stats = mock.stats();
    assert_eq!(stats.max_in_flight, 1);
    assert_eq!(
        (stats.received, stats.in_flight, stats.rejected_429),
        (3, 0, 0)
    );
    mock.stop().await;
}

#[tokio::test]
async fn reject429_past_the_cap() {
    let mock = MockModel::start(MockConfig {
        latency: Duration::from_millis(300),
        max_concurrency: Some(1),
        over_cap: OverCap::Reject429,
        ..MockConfig::default()
    })
    .await
    .expect("start");
    let addr = mock.addr();
    let first = tokio::spawn(async move { post(addr, "{}").await.status() });
    eventually(&mock, |s| s.in_flight == 1).await;
    let rejected = post(addr, "{}").await;
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(rejected.headers()[RETRY_AFTER], "1");
    assert_eq!(rejected.headers()[MOCK_NAME_HEADER], "mock");
    let error: Value = serde_json::from_slice(&body_bytes(rejected).await).expect("json");
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    assert_eq!(first.await.expect("first"), StatusCode::OK);
    eventually(&mock, |s| s.completed == 1).await;
    let stats = mock.stats();
    assert_eq!(
        (stats.received, stats.rejected_429, stats.max_in_flight),
        (2, 1, 1)
    );
    mock.stop().await;
}

#[tokio::test]
async fn hang_then_client_drop_counts_cancelled_and_frees_the_slot() {
    let mock = MockModel::start(MockConfig {
        max_concurrency: Some(1),
        behavior: Behavior::Hang,
        ..MockConfig::default()
    })
    .await
    .expect("start");
    let mut stream = TcpStream::connect(mock.addr()).await.expect("connect");
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .expect("write");
    eventually(&mock, |s| s.in_flight == 1).await;
    drop(stream);
    eventually(&mock, |s| s.cancelled == 1 && s.in_flight == 0).await;
    assert_eq!(mock.stats().completed, 0);

    // The slot is free again.
    mock.set_behavior(Behavior::Json);
    assert_eq!(post(mock.addr(), "{}").await.status(), StatusCode::OK);
    mock.stop().await;
}

#[tokio::test]
async fn sse_streams_separate_chunks() {
    let interval = Duration::from_millis(100);
    let mock = MockModel::start(config(Behavior::Sse {
        chunks: 3,
        interval,
    }))
    .await
    .expect("start");
    let response = post(mock.addr(), r#"{"model":"m","stream":true}"#).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
    assert_eq!(response.headers()[CACHE_CONTROL], "no-cache");
    let mut body = response.into_body();
    let mut chunks = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            chunks.push((Instant::now(), data));
        }
    }
    let events: Vec<&str> = chunks
        .iter()
        .map(|(_, data)| std::str::from_utf8(data).expect("utf-8"))
        .collect();
    assert_eq!(events.len(), 4, "{events:?}");
    for (i, event) in events[..3].iter().enumerate() {
        let json = event
            .strip_prefix("data: ")
            .and_then(|e| e.strip_suffix("\n\n"))
            .expect("sse framing");
        let json: Value = serde_json::from_str(json).expect("json");
        assert_eq!(json["object"], "chat.completion.chunk");
        assert_eq!(json["served_by"], "m1");
        assert_eq!(json["choices"][0]["delta"]["content"], format!("tok{i} "));
    }
    assert_eq!(events[3], "data: [DONE]\n\n");
    // The first chunk arrived two intervals before the last one was sent.
    let spread = chunks[2].0 - chunks[0].0;
    assert!(
        spread >= interval * 2 - Duration::from_millis(20),
        "{spread:?}"
    );
    eventually(&mock, |s| s.completed == 1 && s.in_flight == 0).await;
    mock.stop().await;
}

#[tokio::test]
async fn sse_client_drop_mid_stream_counts_cancelled() {
    let mock = MockModel::start(config(Behavior::Sse {
        chunks: 10,
        interval: Duration::from_secs(10),
    }))
    .await
    .expect("start");
    let mut body = post(mock.addr(), "{}").await.into_body();
    body.frame().await.expect("first chunk").expect("frame");
    drop(body);
    eventually(&mock, |s| s.cancelled == 1 && s.in_flight == 0).await;
    mock.stop().await;
}

#[tokio::test]
async fn error_malformed_and_redirect_behaviors() {
    let mock = MockModel::start(config(Behavior::Status(503)))
        .await
        .expect("start");
    let response = post(mock.addr(), "{}").await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().get(RETRY_AFTER).is_none());
    let error: Value = serde_json::from_slice(&body_bytes(response).await).expect("json");
    assert_eq!(error["error"]["type"], "server_error");

    mock.set_behavior(Behavior::Status(429));
    let response = post(mock.addr(), "{}").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[RETRY_AFTER], "1");

    mock.set_behavior(Behavior::RateLimited("18446744073709551615".to_owned()));
    let response = post(mock.addr(), "{}").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[RETRY_AFTER], "18446744073709551615");
    let error: Value = serde_json::from_slice(&body_bytes(response).await).expect("json");
    assert_eq!(error["error"]["type"], "rate_limit_error");

    mock.set_behavior(Behavior::MalformedJson);
    let response = post(mock.addr(), "{}").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    assert!(serde_json::from_slice::<Value>(&body_bytes(response).await).is_err());

    mock.set_behavior(Behavior::Redirect("http://elsewhere/v1".to_owned()));
    let response = post(mock.addr(), "{}").await;
    assert_eq!(response.status(), StatusCode::FOUND);
    assert_eq!(response.headers()[LOCATION], "http://elsewhere/v1");
    assert_eq!(response.headers()[MOCK_NAME_HEADER], "m1");

    eventually(&mock, |s| s.completed == 5 && s.rejected_429 == 0).await;
    mock.stop().await;
}

#[tokio::test]
async fn stop_refuses_new_connections_and_closes_live_ones() {
    let mock = MockModel::start(config(Behavior::Json))
        .await
        .expect("start");
    let addr = mock.addr();
    // A keep-alive connection, idle after one answer.
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Empty<Bytes>,
    >(TokioIo::new(stream))
    .await
    .expect("handshake");
    let connection = tokio::spawn(connection);
    let request = Request::get("/v1/models").header("host", "x");
    let response = sender
        .send_request(request.body(http_body_util::Empty::new()).expect("request"))
        .await
        .expect("response");
    body_bytes(response).await;

    mock.stop().await;
    assert!(TcpStream::connect(addr).await.is_err());
    // The server closed the idle connection: the client side ends.
    tokio::time::timeout(Duration::from_secs(5), connection)
        .await
        .expect("connection closed")
        .expect("join")
        .expect("clean close");
}

#[tokio::test]
async fn stop_drops_hanging_requests() {
    let mock = MockModel::start(config(Behavior::Hang))
        .await
        .expect("start");
    let addr = mock.addr();
    let pending = tokio::spawn(async move { send(addr, "POST", "/", "{}").await });
    eventually(&mock, |s| s.in_flight == 1).await;
    tokio::time::timeout(Duration::from_secs(5), mock.stop())
        .await
        .expect("stop returns");
    let outcome = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("client sees the close")
        .expect("join");
    assert!(outcome.is_err(), "no answer expected: {outcome:?}");
}

#[tokio::test]
async fn set_latency_applies_to_new_requests() {
    let mock = MockModel::start(config(Behavior::Json))
        .await
        .expect("start");
    mock.set_latency(Duration::from_millis(100));
    let started = Instant::now();
    body_bytes(post(mock.addr(), "{}").await).await;
    assert!(started.elapsed() >= Duration::from_millis(100));
    mock.stop().await;
}

#[tokio::test]
async fn invalid_name_is_rejected() {
    let config = MockConfig {
        name: "bad\nname".to_owned(),
        ..MockConfig::default()
    };
    let error = MockModel::start(config).await.expect_err("invalid name");
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn chat_answers_the_request_it_reads_with_text_or_a_tool_call() {
    let mock = MockModel::start(config(Behavior::Chat))
        .await
        .expect("start");
    let addr = mock.addr();
    let json = |b: Bytes| -> Value { serde_json::from_slice(&b).expect("JSON") };
    // Text: an echo of the last user message.
    let a = json(
        body_bytes(
            post(
                addr,
                r#"{"model":"m","messages":[{"role":"user","content":"hi there"}]}"#,
            )
            .await,
        )
        .await,
    );
    assert_eq!(a["choices"][0]["message"]["content"], "echo: hi there");
    assert_eq!(a["choices"][0]["finish_reason"], "stop");
    assert_eq!(a["usage"]["completion_tokens"], 2);
    // Tools offered: a call of the first, with the user's text.
    let tools = r#""tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]"#;
    let a = json(
        body_bytes(
            post(
                addr,
                &format!(
                    r#"{{"model":"m",{tools},"messages":[{{"role":"user","content":"paris"}}]}}"#
                ),
            )
            .await,
        )
        .await,
    );
    let call = &a["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup");
    assert_eq!(call["function"]["arguments"], r#"{"text":"paris"}"#);
    assert_eq!(a["choices"][0]["finish_reason"], "tool_calls");
    // After the tool's result: what it said.
    let a = json(body_bytes(post(addr, &format!(r#"{{"model":"m",{tools},"messages":[{{"role":"user","content":"paris"}},{{"role":"tool","tool_call_id":"call_1","content":"sunny"}}]}}"#)).await).await);
    assert_eq!(a["choices"][0]["message"]["content"], "tool said: sunny");
    // Streamed when asked, with usage when asked: the same reply in chunks.
    let r = post(addr, &format!(r#"{{"model":"m","stream":true,"stream_options":{{"include_usage":true}},{tools},"messages":[{{"role":"user","content":"paris"}}]}}"#)).await;
    assert_eq!(r.headers()[CONTENT_TYPE], "text/event-stream");
    let text = String::from_utf8(body_bytes(r).await.to_vec()).expect("UTF-8");
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect();
    let args: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, r#"{"text":"paris"}"#);
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
    assert_eq!(
        chunks
            .last()
            .map(|c| c["usage"]["completion_tokens"].clone()),
        Some(Value::from(3))
    );
    assert!(text.ends_with("data: [DONE]\n\n"));
}
