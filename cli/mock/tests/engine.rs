//! `Behavior::Engine` over real HTTP: streamed and plain answers timed by the
//! simulated engine, vLLM's `/metrics`, and the prefix cache seen from a
//! client (a shared system prompt answers sooner the second time).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use router_mock::engine::EngineConfig;
use router_mock::{Behavior, MockConfig, MockModel};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// One request on its own connection.
async fn send(addr: SocketAddr, method: &str, path: &str, body: String) -> Response<Incoming> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .expect("request");
    sender.send_request(request).await.expect("response")
}

async fn text(response: Response<Incoming>) -> String {
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8(body.to_vec()).expect("utf-8")
}

/// The value of `name{model_name="engine"}` on the mock's `/metrics` page.
async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let page = text(send(addr, "GET", "/metrics", String::new()).await).await;
    let prefix = format!("{name}{{model_name=\"engine\"}} ");
    page.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} missing from {page}"))
        .parse()
        .expect("a number")
}

fn chat(system: &str, user: &str, max_tokens: Option<u32>, stream: bool) -> String {
    let mut body = json!({
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
        "stream": stream,
        "stream_options": {"include_usage": true},
    });
    if let Some(max_tokens) = max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    body.to_string()
}

/// A streamed answer: its SSE `data:` payloads and when the first token came.
struct Streamed {
    events: Vec<String>,
    first_token_after: Duration,
    total: Duration,
}

async fn stream(addr: SocketAddr, body: String) -> Streamed {
    let started = Instant::now();
    let response = send(addr, "POST", "/v1/chat/completions", body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
    let mut body = response.into_body();
    let mut events = Vec::new();
    let mut first_token_after = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("frame");
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let chunk = String::from_utf8(data.to_vec()).expect("utf-8");
        for event in chunk.split("\n\n").filter(|e| !e.is_empty()) {
            let payload = event.strip_prefix("data: ").expect("an SSE data event");
            if payload.contains("\"content\"") {
                first_token_after.get_or_insert_with(|| started.elapsed());
            }
            events.push(payload.to_owned());
        }
    }
    Streamed {
        events,
        first_token_after: first_token_after.expect("a token"),
        total: started.elapsed(),
    }
}

async fn engine_mock(config: EngineConfig) -> MockModel {
    MockModel::start(MockConfig {
        name: "engine".into(),
        behavior: Behavior::Engine(config),
        ..MockConfig::default()
    })
    .await
    .expect("mock")
}

#[tokio::test]
async fn tokens_stream_at_the_decode_pace_and_metrics_show_running_and_waiting() {
    let mock = engine_mock(EngineConfig {
        max_batch: 1,
        kv_capacity_tokens: 16_384,
        block_size: 16,
        prefill_tokens_per_s: 100_000,
        decode_step_base: Duration::from_millis(10),
        decode_step_per_seq: Duration::ZERO,
        default_output_tokens: 5,
    })
    .await;
    let addr = mock.addr();
    assert_eq!(metric(addr, "vllm:num_requests_running").await, 0.0);

    let first = tokio::spawn(stream(addr, chat("be brief", "count", Some(30), true)));
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(addr, "vllm:num_requests_running").await < 1.0 {
        assert!(Instant::now() < deadline, "the first request never ran");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The batch holds one: a second request waits.
    let second = tokio::spawn(async move {
        let body = chat("be brief", "again", Some(3), false);
        text(send(addr, "POST", "/v1/chat/completions", body).await).await
    });
    let mut saw_waiting = false;
    while Instant::now() < deadline && !saw_waiting {
        saw_waiting = metric(addr, "vllm:num_requests_waiting").await == 1.0
            && metric(addr, "vllm:num_requests_running").await == 1.0;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(saw_waiting, "never saw one running and one waiting");
    assert!(metric(addr, "vllm:kv_cache_usage_perc").await > 0.0);

    let streamed = first.await.expect("first");
    // 30 tokens, 29 of them after a 10 ms decode step each.
    assert!(
        streamed.total >= Duration::from_millis(290),
        "{:?}",
        streamed.total
    );
    let events: Vec<Value> = streamed.events[..streamed.events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("JSON event"))
        .collect();
    assert_eq!(streamed.events.last().map(String::as_str), Some("[DONE]"));
    let tokens = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["content"].is_string())
        .count();
    assert_eq!(tokens, 30);
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let finish = &events[events.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &events[events.len() - 1]["usage"];
    assert_eq!(usage["completion_tokens"], 30);
    assert!(usage["prompt_tokens"].as_u64().expect("prompt tokens") > 0);

    let answer: Value = serde_json::from_str(&second.await.expect("second")).expect("JSON");
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "tok0 tok1 tok2 "
    );
    assert_eq!(answer["usage"]["completion_tokens"], 3);

    assert_eq!(metric(addr, "vllm:num_requests_running").await, 0.0);
    assert_eq!(metric(addr, "vllm:num_requests_waiting").await, 0.0);
    assert_eq!(metric(addr, "vllm:gpu_cache_usage_perc").await, 0.0);
    let response = send(addr, "GET", "/metrics", String::new()).await;
    assert!(response.headers()[CONTENT_TYPE]
        .to_str()
        .expect("ascii")
        .starts_with("text/plain"));
    assert_eq!(mock.stats().completed, 2);
    mock.stop().await;
}

#[tokio::test]
async fn a_shared_system_prompt_hits_the_prefix_cache_and_answers_sooner() {
    let mock = engine_mock(EngineConfig {
        max_batch: 8,
        kv_capacity_tokens: 65_536,
        block_size: 16,
        prefill_tokens_per_s: 4_000,
        decode_step_base: Duration::from_millis(5),
        decode_step_per_seq: Duration::ZERO,
        default_output_tokens: 4,
    })
    .await;
    let addr = mock.addr();
    // About 2000 tokens (4 bytes each): half a second of prefill.
    let system = "You are the support assistant of a large shop. ".repeat(170);

    let cold = stream(addr, chat(&system, "where is my parcel?", None, true)).await;
    let warm = stream(addr, chat(&system, "can I return shoes?", None, true)).await;
    assert!(
        cold.first_token_after >= Duration::from_millis(450),
        "cold {:?}",
        cold.first_token_after
    );
    assert!(
        warm.first_token_after * 4 < cold.first_token_after,
        "warm {:?} vs cold {:?}",
        warm.first_token_after,
        cold.first_token_after
    );
    let usage: Value = serde_json::from_str(&warm.events[warm.events.len() - 2]).expect("JSON");
    let cached = usage["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(cached >= 1900, "{cached} cached tokens");
    let hits = metric(addr, "vllm:prefix_cache_hits_total").await;
    let queries = metric(addr, "vllm:prefix_cache_queries_total").await;
    assert_eq!(hits, cached as f64);
    assert!(queries >= 4000.0, "{queries} queried tokens");
    mock.stop().await;
}

#[tokio::test]
async fn a_client_that_goes_away_frees_its_place_in_the_engine() {
    let mock = engine_mock(EngineConfig {
        max_batch: 1,
        decode_step_base: Duration::from_millis(10),
        ..EngineConfig::default()
    })
    .await;
    let addr = mock.addr();
    let response = send(
        addr,
        "POST",
        "/v1/chat/completions",
        chat("be brief", "talk for a long time", Some(10_000), true),
    )
    .await;
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert!(first.data_ref().is_some());
    assert!(metric(addr, "vllm:kv_cache_usage_perc").await > 0.0);
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(addr, "vllm:num_requests_running").await > 0.0 {
        assert!(
            Instant::now() < deadline,
            "the abandoned request kept running"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(metric(addr, "vllm:kv_cache_usage_perc").await, 0.0);
    // The batch of one is free again: the next request is answered.
    let body = chat("be brief", "hi", Some(2), false);
    let answer: Value =
        serde_json::from_str(&text(send(addr, "POST", "/v1/chat/completions", body).await).await)
            .expect("JSON");
    assert_eq!(answer["usage"]["completion_tokens"], 2);
    assert_eq!(mock.stats().cancelled, 1);
    mock.stop().await;
}

#[tokio::test]
async fn a_request_longer_than_the_kv_cache_is_answered_400() {
    let mock = engine_mock(EngineConfig {
        kv_capacity_tokens: 256,
        ..EngineConfig::default()
    })
    .await;
    let body = chat(&"long ".repeat(400), "hi", Some(4), false);
    let response = send(mock.addr(), "POST", "/v1/chat/completions", body).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_str(&text(response).await).expect("JSON");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    mock.stop().await;
}

/// vLLM's `vllm:cache_config_info`: an info gauge of 1 whose labels carry
/// the block size and the number of KV blocks (so a router can size its
/// view of the engine's cache), as text, with `engine` and no `model_name`.
#[tokio::test]
async fn metrics_carry_the_cache_config_as_vllm_labels_it() {
    let mock = engine_mock(EngineConfig {
        kv_capacity_tokens: 20_000,
        block_size: 32,
        ..EngineConfig::default()
    })
    .await;
    let page = text(send(mock.addr(), "GET", "/metrics", String::new()).await).await;
    assert!(
        page.contains("# TYPE vllm:cache_config_info gauge\n"),
        "{page}"
    );
    let line = page
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap_or_else(|| panic!("no cache_config_info in {page}"));
    let (labels, value) = line
        .strip_prefix("vllm:cache_config_info{")
        .and_then(|rest| rest.split_once("} "))
        .expect("labels and a value");
    assert_eq!(value.parse::<f64>().expect("a number"), 1.0);
    let labels: std::collections::HashMap<&str, &str> = labels
        .split(',')
        .map(|pair| {
            let (name, value) = pair.split_once('=').expect("name=value");
            (name, value.trim_matches('"'))
        })
        .collect();
    assert_eq!(labels["block_size"], "32");
    // 20,000 tokens in blocks of 32: 625 blocks.
    assert_eq!(labels["num_gpu_blocks"], "625");
    assert_eq!(labels["enable_prefix_caching"], "True");
    assert_eq!(labels["engine"], "0");
    assert!(!labels.contains_key("model_name"));
    mock.stop().await;
}
