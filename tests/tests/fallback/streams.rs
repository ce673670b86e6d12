//! Streams that never hang: the first token's timeout fails over before
//! the client has seen anything; an error inside a 200 fails over before
//! content and ends the stream with one router error event after it; a
//! stalled stream is cut by a timer; usage is asked for, kept out of the
//! client's stream and recorded; time per output token is measured and
//! can gate a pool. Each test counts the generations the mocks produced.

use http::StatusCode;
use http_body_util::BodyExt;
use router_mock::{StreamEnding, StreamScript, UsageMode, MOCK_NAME_HEADER};
use router_tests::harness::{eventually, TestClient, TestProxy};
use router_tests::mocks::mock_stream;

use crate::{metric, ms, settings, two_pools};

const STREAM: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn quick() -> StreamScript {
    StreamScript {
        chunks: 3,
        interval: ms(2),
        ..StreamScript::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_first_token_fails_over_before_the_client_has_seen_anything() {
    // The primary sends its head and role chunk at once, and its first
    // token only after 3 s.
    let primary = mock_stream(
        "primary",
        StreamScript {
            first_token: ms(3000),
            ..quick()
        },
    )
    .await;
    let fallback = mock_stream("fallback", quick()).await;
    let policy = two_pools(
        &primary.url(),
        &fallback.url(),
        "",
        "first_token_timeout_ms: 200",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let r = proxy.chat_with(&[("x-request-id", "ft-1")], STREAM).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));
    let body = r.text();
    // One role chunk: the primary's was held back, never sent.
    assert_eq!(body.matches("\"role\":\"assistant\"").count(), 1, "{body}");
    assert!(
        body.contains("tok0") && body.ends_with("data: [DONE]\n\n"),
        "{body}"
    );
    // The abandoned attempt was cancelled: one generation in all.
    eventually(ms(2000), "primary cancelled", || {
        primary.stats().cancelled == 1
    })
    .await;
    assert_eq!(primary.stats().completed, 0);
    assert_eq!(fallback.stats().completed, 1);
    assert_eq!(fallback.requests()[0].headers["x-request-id"], "ft-1");
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["first_outcome"], "first_token_timeout");
    assert_eq!(l["outcome"], "ok");
    assert_eq!(l["attempts"][0]["outcome"], "first_token_timeout");
    assert!(l["attempts"][0]["latency_ms"].as_f64().unwrap() >= 200.0);
    assert_eq!(l["final_route"], "fallback");
    let m = proxy.metrics().await;
    let series = r#"router_stream_events_total{pool="primary",event="first_token_timeout"}"#;
    assert_eq!(metric(&m, series), Some(1.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_inside_a_200_before_any_content_fails_over_like_a_5xx() {
    for ending in [StreamEnding::Error, StreamEnding::Malformed] {
        let primary = mock_stream(
            "primary",
            StreamScript {
                chunks: 0,
                ending,
                ..quick()
            },
        )
        .await;
        let fallback = mock_stream("fallback", quick()).await;
        let policy = two_pools(&primary.url(), &fallback.url(), "", "");
        let proxy = TestProxy::with_policy(settings(), &policy).await;
        let r = proxy.chat_with(&[], STREAM).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"), "{ending:?}");
        let body = r.text();
        assert!(
            !body.contains("CUDA") && !body.contains("event: error"),
            "{body}"
        );
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        let l = &proxy.log.wait_for(1).await[0];
        assert_eq!(l["first_outcome"], "stream_error", "{ending:?}");
        assert_eq!(l["outcome"], "ok");
        assert_eq!(fallback.stats().completed, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_after_content_ends_the_stream_with_one_router_error_event() {
    let primary = mock_stream(
        "primary",
        StreamScript {
            chunks: 2,
            ending: StreamEnding::Error,
            ..quick()
        },
    )
    .await;
    let fallback = mock_stream("fallback", quick()).await;
    let policy = two_pools(&primary.url(), &fallback.url(), "", "");
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let r = proxy.chat_with(&[], STREAM).await;
    assert_eq!(r.status, StatusCode::OK);
    let body = r.text();
    // The client keeps what it got, then one error event of ours.
    assert!(body.contains("tok0") && body.contains("tok1"), "{body}");
    assert_eq!(body.matches("event: error").count(), 1, "{body}");
    assert!(body.contains(r#""type":"stream_error""#), "{body}");
    assert!(!body.contains("CUDA") && !body.contains("[DONE]"), "{body}");
    // Content had been sent: no failover, one generation (a failed one).
    assert_eq!(fallback.stats().received, 0);
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["outcome"], "stream_error");
    assert_eq!(l["attempts"][0]["outcome"], "stream_error");
    let m = proxy.metrics().await;
    let series = r#"router_stream_events_total{pool="primary",event="stream_error"}"#;
    assert_eq!(metric(&m, series), Some(1.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_cut_by_its_timer_even_while_the_client_does_not_read() {
    let primary = mock_stream(
        "primary",
        StreamScript {
            chunks: 2,
            ending: StreamEnding::Stall,
            ..quick()
        },
    )
    .await;
    let fallback = mock_stream("fallback", quick()).await;
    let policy = two_pools(&primary.url(), &fallback.url(), "stall_timeout_ms: 300", "");
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let client = TestClient::new();
    let resp = client
        .stream(
            http::Method::POST,
            &proxy.url("/v1/chat/completions"),
            STREAM,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    // Not reading: the router's timer cuts the backend anyway.
    eventually(ms(3000), "stalled upstream cancelled", || {
        primary.stats().cancelled == 1
    })
    .await;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("tok1"), "{body}");
    assert!(body.ends_with(
        "event: error\ndata: {\"error\":{\"type\":\"stream_stalled\",\"code\":\"stream_stalled\",\"message\":\"the backend sent nothing for the stall timeout; the stream was cut\"}}\n\n"
    ), "{body}");
    assert_eq!(primary.stats().completed, 0);
    assert_eq!(fallback.stats().received, 0);
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["outcome"], "stream_stalled");
    let m = proxy.metrics().await;
    let series = r#"router_stream_events_total{pool="primary",event="stream_stalled"}"#;
    assert_eq!(metric(&m, series), Some(1.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_usage_is_asked_for_kept_from_the_client_and_recorded() {
    let primary = mock_stream("primary", quick()).await;
    let fallback = mock_stream("fallback", quick()).await;
    let policy = two_pools(
        &primary.url(),
        &fallback.url(),
        "",
        "price: {input_per_1k_usd: 1.0, output_per_1k_usd: 2.0}",
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;

    // The client did not ask: the router asks, records, and strips it.
    let r = proxy.chat_with(&[], STREAM).await;
    let body = r.text();
    assert!(!body.contains("\"usage\""), "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    let sent: serde_json::Value = serde_json::from_slice(&primary.requests()[0].body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["tokens_out"], 3);
    assert!(l["tokens_in"].as_u64().unwrap() > 0);
    assert!(l["cost_usd"].as_f64().unwrap() > 0.0);
    assert_eq!(l["stream"]["usage"]["output_tokens"], 3);
    assert_eq!(l["stream"]["content_events"], 3);

    // The client asked: it gets the usage chunk.
    let asked =
        r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
    let body = proxy.chat_with(&[], asked).await.text();
    assert!(body.contains("\"completion_tokens\":3"), "{body}");

    // A backend that never reports usage: said so, never guessed.
    primary.set_behavior(router_mock::Behavior::Stream(StreamScript {
        usage: UsageMode::Never,
        ..quick()
    }));
    proxy.chat_with(&[], STREAM).await;
    let l = &proxy.log.wait_for(3).await[2];
    assert!(l["stream"]["usage"].is_null(), "{l}");
    assert!(l["tokens_out"].is_null() && l["cost_usd"].is_null(), "{l}");
    let m = proxy.metrics().await;
    let tokens = r#"router_tokens_total{pool="primary",kind="output"}"#;
    assert_eq!(metric(&m, tokens), Some(6.0), "{m}");
    let missing = r#"router_stream_events_total{pool="primary",event="usage_missing"}"#;
    assert_eq!(metric(&m, missing), Some(1.0), "{m}");
    // A pool whose endpoints do not take stream_options is not asked.
    let policy = two_pools(&primary.url(), &fallback.url(), "", "stream_usage: false");
    proxy.apply(&policy);
    proxy.chat_with(&[], STREAM).await;
    let last = primary.requests().pop().unwrap();
    let sent: serde_json::Value = serde_json::from_slice(&last.body).unwrap();
    assert!(sent.get("stream_options").is_none(), "{sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_per_output_token_is_measured_per_endpoint_and_gates_a_pool() {
    let slow = StreamScript {
        chunks: 6,
        interval: ms(40),
        ..StreamScript::default()
    };
    let primary = mock_stream("primary", slow).await;
    let fallback = mock_stream("fallback", quick()).await;
    let policy = two_pools(&primary.url(), &fallback.url(), "", "");
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let r = proxy.chat_with(&[], STREAM).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("primary"));
    let l = &proxy.log.wait_for(1).await[0];
    let tpot = l["stream"]["tpot_ms"].as_f64().unwrap();
    assert!((35.0..200.0).contains(&tpot), "{tpot}");
    let m = proxy.metrics().await;
    let series = format!(
        r#"router_endpoint_tpot_seconds{{pool="primary",addr="{}"}}"#,
        primary.url()
    );
    let gauge = metric(&m, &series).unwrap_or_else(|| panic!("{series} in {m}"));
    assert!((0.035..0.2).contains(&gauge), "{gauge}");

    // A gate under it sends the next request to the fallback, and says why.
    let gated = two_pools(
        &primary.url(),
        &fallback.url(),
        "",
        "gates: {max_tpot_ms: 10}",
    );
    proxy.apply(&gated);
    let r = proxy.chat_with(&[], STREAM).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));
    let l = &proxy.log.wait_for(2).await[1];
    assert_eq!(l["walk"][0]["note"], "gated", "{l}");
    assert_eq!(l["walk"][0]["pool"], "primary", "{l}");
    assert_eq!(l["walk"][0]["why"], "tpot", "{l}");
    let reason = l["reason"].as_str().unwrap();
    assert!(reason.contains("time per output token"), "{reason}");
}
