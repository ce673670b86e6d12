//! OpenTelemetry end to end, against a real OTLP/gRPC receiver: a request
//! that falls back is one trace with the server span and two attempt
//! spans; the backend gets the trace context; a policy apply is traced.
//! (Its own test binary: the tracer provider is process-global.)

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http::StatusCode;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_proxy::Settings;
use router_tests::harness::TestProxy;
use router_tests::mocks::mock;
use router_tests::otlp::{attr, hex, OtlpReceiver};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

async fn wait_spans(
    receiver: &OtlpReceiver,
    provider: &opentelemetry_sdk::trace::SdkTracerProvider,
    pred: impl Fn(&[Span]) -> bool,
) -> Vec<Span> {
    for _ in 0..200 {
        let _ = provider.force_flush();
        let spans = receiver.spans();
        if pred(&spans) {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "spans did not arrive: {:#?}",
        receiver.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_is_one_trace_and_a_policy_apply_is_traced() {
    let receiver = OtlpReceiver::start().await.unwrap();
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
    std::env::set_var("OTEL_SERVICE_NAME", "router-proxy-test");
    let provider = router_proxy::telemetry::init("router-proxy")
        .unwrap()
        .expect("export is on");
    tracing_subscriber::registry()
        .with(router_proxy::telemetry::layer(&provider))
        .init();

    let primary = mock("primary", Behavior::Status(503)).await;
    let fallback = mock("fallback", Behavior::Json).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 1, open_duration_s: 60}}
  pools:
    - name: primary
      provider: vllm
      model: small
      endpoints: ["{}"]
    - name: fallback
      provider: openai
      model: big
      endpoints: ["{}"]
  routes:
    - name: default
      chain: [primary, fallback]
"#,
        primary.url(),
        fallback.url()
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let r = proxy
        .chat_with(
            &[
                ("traceparent", traceparent.as_str()),
                ("x-request-id", "traced-1"),
            ],
            r#"{"model":"client-model","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fallback"));

    // Both backends got the trace context, each from its own attempt span.
    let sent_primary = primary.requests()[0].headers["traceparent"]
        .to_str()
        .unwrap()
        .to_string();
    let sent_fallback = fallback.requests()[0].headers["traceparent"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        sent_primary.starts_with(&format!("00-{TRACE}-")),
        "{sent_primary}"
    );
    assert!(
        sent_fallback.starts_with(&format!("00-{TRACE}-")),
        "{sent_fallback}"
    );
    assert_ne!(sent_primary, sent_fallback);

    let spans = wait_spans(&receiver, &provider, |s| {
        s.iter().filter(|s| hex(&s.trace_id) == TRACE).count() >= 3
    })
    .await;
    let trace: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == TRACE).collect();
    let servers: Vec<&&Span> = trace
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(servers.len(), 1, "{trace:#?}");
    let server = servers[0];
    assert_eq!(
        hex(&server.parent_span_id),
        PARENT,
        "the client's span is the parent"
    );
    assert_eq!(attr(server, "router.route").as_deref(), Some("default"));
    assert_eq!(attr(server, "router.outcome").as_deref(), Some("ok"));
    assert_eq!(
        attr(server, "router.request_id").as_deref(),
        Some("traced-1")
    );
    assert_eq!(attr(server, "router.attempts").as_deref(), Some("2"));
    assert_eq!(
        attr(server, "router.config_version").as_deref(),
        Some("inline-1")
    );
    assert_eq!(
        attr(server, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(
        attr(server, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        attr(server, "gen_ai.request.model").as_deref(),
        Some("client-model")
    );
    assert!(attr(server, "router.reason")
        .unwrap()
        .contains("primary: status_5xx"));
    assert!(
        server.events.iter().any(|e| e.name == "fallback"),
        "{:?}",
        server.events
    );

    let mut clients: Vec<&&Span> = trace
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    clients.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(clients.len(), 2, "{trace:#?}");
    for c in &clients {
        assert_eq!(
            c.parent_span_id, server.span_id,
            "attempts are children of the server span"
        );
        assert_eq!(attr(c, "gen_ai.operation.name").as_deref(), Some("chat"));
    }
    assert_eq!(attr(clients[0], "router.pool").as_deref(), Some("primary"));
    assert_eq!(
        attr(clients[0], "router.outcome").as_deref(),
        Some("status_5xx")
    );
    assert_eq!(
        attr(clients[0], "http.response.status_code").as_deref(),
        Some("503")
    );
    assert_eq!(
        attr(clients[0], "gen_ai.provider.name").as_deref(),
        Some("vllm")
    );
    assert_eq!(
        attr(clients[0], "gen_ai.request.model").as_deref(),
        Some("small")
    );
    assert_eq!(attr(clients[1], "router.pool").as_deref(), Some("fallback"));
    assert_eq!(attr(clients[1], "router.outcome").as_deref(), Some("ok"));
    assert_eq!(
        attr(clients[1], "gen_ai.request.model").as_deref(),
        Some("big")
    );
    assert_eq!(
        attr(clients[1], "gen_ai.response.model").as_deref(),
        Some("big")
    );
    assert!(attr(clients[1], "gen_ai.usage.input_tokens").is_some());
    assert_eq!(
        attr(clients[1], "gen_ai.usage.output_tokens").as_deref(),
        Some("5")
    );
    assert!(sent_fallback.contains(&hex(&clients[1].span_id)));

    // The route decision log line names the trace.
    let line = &proxy.log.wait_for(1).await[0];
    assert_eq!(line["trace_id"], TRACE);

    // Config changes are traced: the proxy's apply carries the version...
    proxy.apply(&policy.replace("chain: [primary, fallback]", "chain: [fallback]"));
    let spans = wait_spans(&receiver, &provider, |s| {
        s.iter().any(|s| {
            s.name == "config.apply"
                && attr(s, "router.config_version").as_deref() == Some("test-2")
        })
    })
    .await;
    assert!(spans.iter().any(|s| s.name == "config.apply"));

    // ...and so is the control plane's apply, validation and push.
    let dir = std::env::temp_dir().join(format!("router-trace-cp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cp = router_control_plane::start(router_control_plane::ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: router_control_plane::StoreLocation::Embedded(dir.clone()),
        token: None,
        tls: None,
        guards: Default::default(),
        ..Default::default()
    })
    .await
    .unwrap();
    cp.hub()
        .apply_policy(&policy, false, 0, "test")
        .await
        .unwrap();
    let spans = wait_spans(&receiver, &provider, |s| {
        s.iter().any(|s| s.name == "policy.apply")
    })
    .await;
    let apply = spans.iter().find(|s| s.name == "policy.apply").unwrap();
    assert_eq!(attr(apply, "router.policy_version").as_deref(), Some("1"));
    let validate = spans.iter().find(|s| s.name == "policy.validate").unwrap();
    assert_eq!(validate.parent_span_id, apply.span_id);
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);

    // A hedged stream: one trace, the hedge's events on the server span,
    // the stream's usage (asked for by the router) and the tenant on it
    // too.
    let stream_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let script = |first_token_ms| router_mock::StreamScript {
        first_token: Duration::from_millis(first_token_ms),
        chunks: 2,
        interval: Duration::from_millis(1),
        ..router_mock::StreamScript::default()
    };
    let slow = router_tests::mocks::mock_stream("slow", script(3000)).await;
    let fast = router_tests::mocks::mock_stream("fast", script(0)).await;
    let hedged = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: slow\n      endpoints: [\"{}\"]\n    - name: fast\n      endpoints: [\"{}\"]\n  routes:\n    - name: default\n      chain: [slow, fast]\n      hedge: {{after_ms: 100}}\n  tenants:\n    - name: team-t\n      anonymous: true\n",
        slow.url(),
        fast.url()
    );
    let streams = TestProxy::with_policy(Settings::default(), &hedged).await;
    let traceparent = format!("00-{stream_trace}-{PARENT}-01");
    let r = streams
        .chat_with(
            &[("traceparent", traceparent.as_str())],
            r#"{"model":"m","stream":true,"messages":[]}"#,
        )
        .await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("fast"));
    let spans = wait_spans(&receiver, &provider, |s| {
        s.iter()
            .any(|s| hex(&s.trace_id) == stream_trace && s.kind == SpanKind::Server as i32)
    })
    .await;
    let server = spans
        .iter()
        .find(|s| hex(&s.trace_id) == stream_trace && s.kind == SpanKind::Server as i32)
        .unwrap();
    let events: Vec<&str> = server.events.iter().map(|e| e.name.as_str()).collect();
    assert!(events.contains(&"hedge_started"), "{events:?}");
    assert!(events.contains(&"hedge_won"), "{events:?}");
    assert_eq!(attr(server, "router.outcome").as_deref(), Some("ok"));
    assert_eq!(attr(server, "router.tenant").as_deref(), Some("team-t"));
    assert_eq!(
        attr(server, "gen_ai.usage.output_tokens").as_deref(),
        Some("2")
    );

    // An Anthropic pool with a prompt cache (issue 29): the second call
    // reads what the first wrote; the spans carry the whole prompt as the
    // input and the cache's part of it apart, with the pool's provider.
    std::env::set_var("TEST_TRACING_CLAUDE_API_KEY", "sk-ant-pool");
    let claude = mock("claude", Behavior::Anthropic).await;
    let cached = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: claude\n      provider: anthropic\n      endpoints: [\"{}\"]\n      api_key_env: TEST_TRACING_CLAUDE_API_KEY\n  routes:\n    - name: default\n      chain: [claude]\n",
        claude.url()
    );
    let anthropic = TestProxy::with_policy(Settings::default(), &cached).await;
    let body = serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
        "system": [{"type": "text", "text": "A long system prompt. ".repeat(50),
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let cache_trace = "6bf92f3577b34da6a3ce929d0e0e4738";
    for trace in ["6bf92f3577b34da6a3ce929d0e0e4739", cache_trace] {
        let traceparent = format!("00-{trace}-{PARENT}-01");
        let r = anthropic
            .client
            .send(
                http::Method::POST,
                &anthropic.url("/v1/messages"),
                &[
                    ("content-type", "application/json"),
                    ("anthropic-version", "2023-06-01"),
                    ("traceparent", traceparent.as_str()),
                ],
                body.clone(),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let spans = wait_spans(&receiver, &provider, |s| {
        s.iter().filter(|s| hex(&s.trace_id) == cache_trace).count() >= 2
    })
    .await;
    let of_kind = |kind: SpanKind| {
        spans
            .iter()
            .find(|s| hex(&s.trace_id) == cache_trace && s.kind == kind as i32)
            .unwrap()
    };
    let (server, client) = (of_kind(SpanKind::Server), of_kind(SpanKind::Client));
    assert_eq!(
        attr(client, "gen_ai.provider.name").as_deref(),
        Some("anthropic")
    );
    // The client's dialect, on the server span.
    assert_eq!(attr(server, "router.dialect").as_deref(), Some("anthropic"));
    for span in [server, client] {
        let input: u64 = attr(span, "gen_ai.usage.input_tokens")
            .unwrap()
            .parse()
            .unwrap();
        let read: u64 = attr(span, "gen_ai.usage.cache_read.input_tokens")
            .expect("the cache read")
            .parse()
            .unwrap();
        assert!(read > 100 && read < input, "read {read} of {input}");
        assert_eq!(attr(span, "gen_ai.usage.cache_creation.input_tokens"), None);
    }

    // A route with a response cache (issue 34): the server span says
    // whether the request was a miss or a hit.
    let answering = mock("answering", Behavior::Json).await;
    let with_cache = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: only\n      endpoints: [\"{}\"]\n  routes:\n    - name: r\n      chain: [only]\n      cache: {{ttl_s: 60}}\n",
        answering.url()
    );
    let caching = TestProxy::with_policy(Settings::default(), &with_cache).await;
    let traces = [
        "7bf92f3577b34da6a3ce929d0e0e4731",
        "7bf92f3577b34da6a3ce929d0e0e4732",
    ];
    for trace in traces {
        let traceparent = format!("00-{trace}-{PARENT}-01");
        let r = caching
            .chat_with(
                &[("traceparent", traceparent.as_str())],
                r#"{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let spans = wait_spans(&receiver, &provider, |s| {
        traces.iter().all(|t| {
            s.iter()
                .any(|s| hex(&s.trace_id) == *t && s.kind == SpanKind::Server as i32)
        })
    })
    .await;
    let server_of = |trace: &str| {
        spans
            .iter()
            .find(|s| hex(&s.trace_id) == trace && s.kind == SpanKind::Server as i32)
            .unwrap()
    };
    assert_eq!(
        attr(server_of(traces[0]), "router.cache").as_deref(),
        Some("miss")
    );
    assert_eq!(
        attr(server_of(traces[1]), "router.cache").as_deref(),
        Some("hit")
    );
    assert_eq!(answering.stats().received, 1);
    let _ = provider.shutdown();
}
