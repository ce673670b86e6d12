//! The policy engine through the proxy: approval, cost ceilings,
//! structured output, circuits with Retry-After, capacity probes,
//! credentials, side-effect safety, explain.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tokio::time::Instant;

use http::{Method, StatusCode};
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_proxy::Settings;
use router_tests::harness::{eventually, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::mock;

mod tenants;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const STRUCTURED: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}}"#;

fn two(
    a: &str,
    b: &str,
    spec_extra: &str,
    a_extra: &str,
    b_extra: &str,
    route_extra: &str,
) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  {spec_extra}
  pools:
    - name: local
      endpoints: ["{a}"]
      {a_extra}
    - name: strong
      endpoints: ["{b}"]
      {b_extra}
  routes:
    - name: default
      chain: [local, strong]
      {route_extra}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_approval_token_passes_only_where_the_policy_opts_in() {
    std::env::set_var("TEST_APPROVAL_TOKEN_A", "let-it-through");
    let strong = mock("strong", Behavior::Json).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  approval: {{token_env: TEST_APPROVAL_TOKEN_A, allow_static_token: true}}
  pools:
    - name: strong
      endpoints: ["{}"]
  routes:
    - name: governed
      match: {{risk: [SEND, DESTRUCTIVE]}}
      chain: [strong]
      requires_approval: true
      allow_downgrade: false
    - name: default
      chain: [strong]
"#,
        strong.url()
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    let r = proxy.chat_with(&[("x-router-risk", "SEND")], CHAT).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.error_type(), "approval_required");
    let r = proxy
        .chat_with(
            &[
                ("x-router-risk", "send"),
                ("x-router-approval", "let-it-through-not"),
            ],
            CHAT,
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(strong.stats().received, 0);
    let r = proxy
        .chat_with(
            &[
                ("x-router-risk", "DESTRUCTIVE"),
                ("x-router-approval", "let-it-through"),
            ],
            CHAT,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    // READ needs nothing.
    assert_eq!(proxy.chat_with(&[], CHAT).await.status, StatusCode::OK);
    let r = proxy.chat_with(&[("x-router-risk", "PANIC")], CHAT).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let lines = proxy.log.wait_for(5).await;
    assert_eq!(lines[2]["risk"], "DESTRUCTIVE");
    assert_eq!(lines[2]["route"], "governed");
    for l in &lines {
        assert!(
            !l.to_string().contains("let-it-through\""),
            "the token is never logged"
        );
    }
}

/// The governed/default policy of the approval tests, on `strong`.
fn governed(strong: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: strong
      endpoints: ["{strong}"]
  routes:
    - name: governed
      match: {{risk: [SEND, DESTRUCTIVE]}}
      chain: [strong]
      requires_approval: true
    - name: default
      chain: [strong]
"#
    )
}

const APPROVAL_KEY: &str = "policy-tests-approval-key-0123456789abcdef";

/// A token from `routerctl approve`'s own code, as the operator would mint it.
fn approve(route: &str, request_id: &str, ttl: Duration) -> String {
    let args = routerctl::approve_cmd::ApproveArgs {
        route: route.into(),
        request_id: request_id.into(),
        ttl,
        key_file: None,
    };
    // The token's expiry is wall time.
    let now = router_policy::wall_clock::since_epoch().as_secs();
    routerctl::approve_cmd::mint(&args, Some(APPROVAL_KEY.into()), now)
        .unwrap()
        .0
}

/// Issue #14, item 7: a signed approval approves one request on one route,
/// until it expires; every refusal says why and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_approval_passes_for_its_route_and_request_id_only() {
    let strong = mock("strong", Behavior::Json).await;
    let settings = Settings {
        approval_key: Some(router_policy::ApprovalKey::new(APPROVAL_KEY).unwrap()),
        ..Settings::default()
    };
    let proxy = TestProxy::with_policy(settings, &governed(&strong.url())).await;
    let send = |token: String, id: &'static str| {
        let proxy = &proxy;
        async move {
            proxy
                .chat_with(
                    &[
                        ("x-router-risk", "SEND"),
                        ("idempotency-key", id),
                        ("x-router-approval", token.as_str()),
                    ],
                    CHAT,
                )
                .await
        }
    };
    let refused = |r: &router_tests::harness::TestResponse, why: &str| {
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
        assert_eq!(r.error_type(), "approval_required");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.starts_with("route governed requires approval"), "{msg}");
        assert!(msg.contains(why), "{msg}");
    };

    // None given.
    let r = proxy
        .chat_with(
            &[("x-router-risk", "SEND"), ("idempotency-key", "req-1")],
            CHAT,
        )
        .await;
    refused(&r, "send an X-Router-Approval token");
    // Minted for this route and request id: it passes.
    let token = approve("governed", "req-1", Duration::from_secs(600));
    let r = send(token.clone(), "req-1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(strong.stats().received, 1);
    // The same token for another request id, or minted for another route.
    refused(
        &send(token.clone(), "req-2").await,
        "not valid for this route and request id",
    );
    let other_route = approve("default", "req-3", Duration::from_secs(600));
    refused(
        &send(other_route, "req-3").await,
        "not valid for this route and request id",
    );
    // Signed with another key.
    let forged = router_policy::ApprovalKey::new("someone-elses-key-0123456789abcdefgh")
        .unwrap()
        .sign("governed", "req-4", u64::MAX / 2);
    refused(
        &send(forged, "req-4").await,
        "not valid for this route and request id",
    );
    // Expired: signed with the right key, for a time already past.
    let expired = router_policy::ApprovalKey::new(APPROVAL_KEY).unwrap().sign(
        "governed",
        "req-5",
        1_000_000_000,
    );
    refused(&send(expired, "req-5").await, "expired");
    // The old static form is not a signed token.
    refused(&send("let-it-through".into(), "req-6").await, "malformed");
    assert_eq!(
        strong.stats().received,
        1,
        "a refused request reached the backend"
    );
    // READ needs nothing.
    assert_eq!(proxy.chat_with(&[], CHAT).await.status, StatusCode::OK);

    // The route log records each refusal as approval_required.
    let lines = proxy.log.wait_for(8).await;
    let refusals = lines
        .iter()
        .filter(|l| l["outcome"] == "approval_required")
        .count();
    assert_eq!(refusals, 6, "{lines:?}");
    for l in &lines {
        assert!(!l.to_string().contains(&token), "the token is never logged");
    }
}

/// Without a key (and no static token) an approval route refuses every
/// request and says what the proxy lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_approval_key_approval_routes_refuse_and_say_why() {
    let strong = mock("strong", Behavior::Json).await;
    let proxy = TestProxy::with_policy(Settings::default(), &governed(&strong.url())).await;
    let token = approve("governed", "req-1", Duration::from_secs(600));
    let r = proxy
        .chat_with(
            &[
                ("x-router-risk", "SEND"),
                ("idempotency-key", "req-1"),
                ("x-router-approval", token.as_str()),
            ],
            CHAT,
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        r.text().contains("CUSTOM_ROUTER_APPROVAL_KEY"),
        "{}",
        r.text()
    );
    assert_eq!(strong.stats().received, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_ceiling_answers_402() {
    let local = mock("local", Behavior::Json).await;
    let strong = mock("strong", Behavior::Json).await;
    let policy = two(
        &local.url(),
        &strong.url(),
        "",
        "price: {input_per_1k_usd: 0.01, output_per_1k_usd: 0.03}",
        "price: {input_per_1k_usd: 0.1, output_per_1k_usd: 0.3}",
        "cost_ceiling_per_call_usd: 0.05",
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    // 100 output tokens: local 0.003 fits.
    let small = r#"{"model":"m","messages":[],"max_tokens":100}"#;
    let r = proxy.chat_with(&[], small).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("local"));
    let l = &proxy.log.wait_for(1).await[0];
    assert!(
        l["cost_usd"].as_f64().unwrap() > 0.0,
        "cost accounted from usage: {l}"
    );
    // 10,000 output tokens: 0.3 on local, 3.0 on strong: nothing fits.
    let big = r#"{"model":"m","messages":[],"max_tokens":10000}"#;
    let r = proxy.chat_with(&[], big).await;
    assert_eq!(r.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(r.error_type(), "budget_exceeded");
    assert!(r.text().contains("ceiling"));
    assert_eq!(local.stats().received + strong.stats().received, 1);
    let m = proxy.metrics().await;
    assert!(
        m.contains("router_sheds_total{pool=\"\",reason=\"budget_exceeded\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("router_tokens_total{pool=\"local\",kind=\"output\"} 5"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_structured_answer_moves_to_the_strong_pool_and_degrades_local() {
    let local = mock("local", Behavior::Content("Sure! {\"half\": ".into())).await;
    let strong = mock("strong", Behavior::Content("{\"ok\": true}".into())).await;
    let policy = two(
        &local.url(),
        &strong.url(),
        "structured_output_degrade_s: 60",
        "",
        "",
        "retry_on: [connect_error, timeout, status_429, status_5xx, malformed_json]",
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    let r = proxy.chat_with(&[], STRUCTURED).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"));
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "{\"ok\": true}"
    );
    let l = &proxy.log.wait_for(1).await[0];
    assert_eq!(l["first_outcome"], "malformed_json");
    assert_eq!(l["fallback_outcome"], "ok");
    // One malformed answer does not degrade the pool (issue 28, item 7):
    // the backend's pattern does, three within the period.
    for _ in 0..2 {
        let r = proxy.chat_with(&[], STRUCTURED).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"));
    }
    assert_eq!(local.stats().received, 3);
    // Local is degraded for structured requests: skipped at once now...
    let r = proxy.chat_with(&[], STRUCTURED).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"));
    assert_eq!(local.stats().received, 3);
    let l = &proxy.log.wait_for(4).await[3];
    assert!(
        l["reason"]
            .as_str()
            .unwrap()
            .contains("local skipped: degraded for structured output"),
        "{l}"
    );
    // ...but still serves plain requests.
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("local"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_429s_open_the_circuit_and_one_probe_closes_it() {
    let local = mock("local", Behavior::Status(429)).await;
    let strong = mock("strong", Behavior::Json).await;
    let policy = two(
        &local.url(),
        &strong.url(),
        "circuit_breaker: {consecutive_errors: 3, open_duration_s: 0.3}",
        "",
        "",
        "",
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    for _ in 0..3 {
        let r = proxy.chat_with(&[], CHAT).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"));
    }
    assert_eq!(local.stats().received, 3);
    let h = proxy.health().await;
    assert_eq!(h["backends"][0]["circuit"], "open");
    // Open: traffic moves on without touching local. The mock's 429 said
    // Retry-After: 1, which outlasts the 0.3 s open period.
    let opened = Instant::now();
    // A real wait, and the point of the test: past the 0.3 s open period,
    // short of Retry-After's 1 s (the proxy's clock is its own, not pausable).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"));
    assert_eq!(
        local.stats().received,
        3,
        "Retry-After kept the circuit open"
    );
    // After Retry-After: one probe; it succeeds and closes the circuit.
    local.set_behavior(Behavior::Json);
    // A real wait, the behaviour under test: until Retry-After has elapsed.
    let wait = Duration::from_millis(1050).saturating_sub(opened.elapsed());
    tokio::time::sleep(wait).await;
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("local"), "the probe");
    assert_eq!(proxy.health().await["backends"][0]["circuit"], "closed");
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("local"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ollama_probe_gates_on_free_vram_and_failing_probes_mark_unhealthy() {
    let local = mock("local", Behavior::Json).await;
    let strong = mock("strong", Behavior::Json).await;
    let gib = 1024u64 * 1024 * 1024;
    let ps = |used_gib: u64| {
        format!(
            r#"{{"models":[{{"name":"qwen3:8b","model":"qwen3:8b","size_vram":{}}}]}}"#,
            used_gib * gib
        )
    };
    local.set_page("/api/ps", 200, &ps(50));
    let policy = two(
        &local.url(),
        &strong.url(),
        "",
        "model: qwen3:8b\n      gates: {min_vram_free_mb: 22000}\n      capacity_probe: {kind: ollama, interval_ms: 40, vram_total_mb: 65536}",
        "",
        "",
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    // 64 GiB - 50 GiB = 14 GiB free: at or below 22,000 MB. A second poll
    // starts only once the first one's reading is recorded.
    eventually(WAIT_AT_MOST, "the first capacity probe reading", || {
        local.page_hits("/api/ps") >= 2
    })
    .await;
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"));
    let l = &proxy.log.wait_for(1).await[0];
    assert!(
        l["reason"]
            .as_str()
            .unwrap()
            .contains("local skipped: free VRAM 14336 MB <= 22000 MB"),
        "{l}"
    );
    // The GPU frees up.
    local.set_page("/api/ps", 200, &ps(6));
    let mut served = String::new();
    for _ in 0..50 {
        let r = proxy.chat_with(&[], CHAT).await;
        served = r.header(MOCK_NAME_HEADER).unwrap_or("").to_string();
        if served == "local" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served, "local");
    // The probe starts failing: the pool is unhealthy, not "unknown = fine".
    local.set_page("/api/ps", 500, "oops");
    let mut line = serde_json::Value::Null;
    for _ in 0..100 {
        let r = proxy.chat_with(&[], CHAT).await;
        if r.header(MOCK_NAME_HEADER) == Some("strong") {
            let id = r.header("x-request-id").unwrap().to_string();
            for _ in 0..100 {
                let lines = proxy.log.lines();
                if let Some(l) = lines.iter().find(|l| l["request_id"] == id.as_str()) {
                    line = l.clone();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The decision's gate, typed, and the same in the reason's words.
    assert_eq!(line["walk"][0]["note"], "gated", "{line}");
    assert_eq!(line["walk"][0]["pool"], "local", "{line}");
    assert_eq!(line["walk"][0]["why"], "unhealthy", "{line}");
    let reason = line["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("local skipped: unhealthy"), "{reason}");
}

/// Issue 18 (engine signals, the simulator part): the vLLM capacity probe
/// reads a simulated vLLM engine's `/metrics`: requests waiting inside the
/// engine count in the pool's queue depth, so a pool whose engine is
/// backed up is skipped before the router adds to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_probe_reads_a_simulated_engines_waiting_requests() {
    use router_mock::engine::EngineConfig;
    // One sequence at a time, 20 tokens at 50 ms a step: 1 s a request.
    let engine = EngineConfig {
        max_batch: 1,
        decode_step_base: Duration::from_millis(50),
        decode_step_per_seq: Duration::ZERO,
        default_output_tokens: 20,
        ..EngineConfig::default()
    };
    let local = mock("local", Behavior::Engine(engine)).await;
    let strong = mock("strong", Behavior::Json).await;
    let policy = two(
        &local.url(),
        &strong.url(),
        "",
        "gates: {max_queue_depth: 1}\n      capacity_probe: {kind: vllm, interval_ms: 40}",
        "",
        "",
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    // Others load the engine directly: one runs, three wait inside it.
    let client = router_tests::harness::TestClient::new();
    let url = format!("{}/v1/chat/completions", local.url());
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.send(Method::POST, &url, &[], CHAT).await })
        })
        .collect();
    let metrics = format!("{}/metrics", local.url());
    let mut engine = String::new();
    for _ in 0..100 {
        engine = client.send(Method::GET, &metrics, &[], "").await.text();
        if engine.contains("vllm:num_requests_waiting{model_name=\"local\"} 3") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        engine.contains("vllm:num_requests_waiting{model_name=\"local\"} 3"),
        "{engine}"
    );
    // The proxy polls every 40 ms: five polls' time for it to read that.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"), "{}", r.text());
    let line = &proxy.log.wait_for(1).await[0];
    assert!(
        line["reason"]
            .as_str()
            .unwrap()
            .contains("local skipped: queue depth 3 > 1"),
        "{line}"
    );
    for l in load {
        assert_eq!(l.await.unwrap().status, StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_api_key_replaces_the_clients_and_is_never_logged() {
    std::env::set_var("TEST_POOL_B_API_KEY", "sk-very-secret");
    let cloud = mock("cloud", Behavior::Json).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: cloud
      provider: openai
      model: provider-model
      endpoints: ["{}/api/v1"]
      api_key_env: TEST_POOL_B_API_KEY
  routes:
    - name: r
      chain: [cloud]
"#,
        cloud.url()
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    let r = proxy
        .chat_with(&[("authorization", "Bearer client-key")], CHAT)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let got = &cloud.requests()[0];
    assert_eq!(got.headers["authorization"], "Bearer sk-very-secret");
    assert_eq!(got.path, "/api/v1/chat/completions");
    let body: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(body["model"], "provider-model");
    // The rewritten body goes with its own length, not the client's.
    assert_ne!(got.body.len(), CHAT.len());
    assert_eq!(
        got.headers["content-length"],
        got.body.len().to_string().as_str()
    );
    let l = proxy.log.wait_for(1).await;
    assert!(!l[0].to_string().contains("sk-very-secret"));
    assert!(!proxy.metrics().await.contains("sk-very-secret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_request_that_may_have_reached_a_backend_is_never_resent() {
    let local = mock("local", Behavior::Status(503)).await;
    let strong = mock("strong", Behavior::Json).await;
    let policy = two(&local.url(), &strong.url(), "", "", "", "");
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    // SEND: local may have acted on it; the 503 goes back, strong never sees it.
    let r = proxy.chat_with(&[("x-router-risk", "SEND")], CHAT).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("local"));
    assert_eq!(strong.stats().received, 0);
    // READ falls over as usual (local, suspect now, is passed over for
    // strong, the clean pool after it).
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"));
    assert_eq!(strong.stats().received, 1);
    // The route log says why the walk stopped.
    let l = &proxy.log.wait_for(2).await[0];
    let stop = l["walk"]
        .as_array()
        .and_then(|w| w.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(stop["note"], "stopped", "{l}");
    assert_eq!(stop["why"], "may_have_reached", "{l}");
    assert!(
        l["reason"].as_str().unwrap().contains(
            "stopped: a SEND request that may have reached its backend is not sent again"
        ),
        "{l}"
    );
    // A refused connection never reached anything: SEND may move on.
    let local_url = local.url();
    local.stop().await;
    let proxy2 = TestProxy::with_policy(
        Settings::default(),
        &two(&local_url, &strong.url(), "", "", "", ""),
    )
    .await;
    let r = proxy2.chat_with(&[("x-router-risk", "SEND")], CHAT).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("strong"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_answers_without_sending_anything() {
    let local = mock("local", Behavior::Json).await;
    let policy = include_str!("../../../deploy/examples/agents.yaml");
    let s = Settings {
        admin_token: Some("admin".into()),
        ..Settings::default()
    };
    let proxy = TestProxy::with_policy(s, policy).await;
    let situation = r#"{"risk": "READ", "model": "any", "structured_output": false, "deadline_ms": 2000,
        "pools": {"local-medium": {"vram_free_mb": 30000, "queue_depth": 1, "latency_ms": 300, "healthy": true}}}"#;
    let url = proxy.url("/_custom_router/explain");
    let r = proxy.client.send(Method::POST, &url, &[], situation).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = proxy
        .client
        .send(
            Method::POST,
            &url,
            &[("authorization", "Bearer admin")],
            situation,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let e = r.json();
    assert_eq!(e["pool"], "local-medium");
    assert_eq!(e["model"], "qwen3.6:27b-q4_K_M");
    assert_eq!(e["provider"], "ollama");
    assert_eq!(e["requires_approval"], false);
    assert_eq!(
        e["reason"],
        "route \"default\" (risk READ); local-medium chosen"
    );
    assert_eq!(e["skipped"].as_array().unwrap().len(), 0);
    let r = proxy
        .client
        .send(
            Method::POST,
            &url,
            &[("authorization", "Bearer admin")],
            r#"{"risk": "SEND", "pools": {}}"#,
        )
        .await;
    assert_eq!(r.json()["pool"], "cloud-strong");
    assert_eq!(r.json()["requires_approval"], true);
    let r = proxy
        .client
        .send(
            Method::POST,
            &url,
            &[("authorization", "Bearer admin")],
            r#"{"risk": "MAYBE"}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(local.stats().received, 0);
}

/// Issue 18: an engine-aware pool with prefix affinity through the proxy,
/// against two simulated vLLM engines: the turns of one conversation go
/// to one engine (its KV cache holds their prefix), and the proxy's
/// explain shows the engines' signals it goes by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_aware_affinity_keeps_a_conversation_on_one_engine_and_explain_shows_the_signals() {
    let a = router_tests::mocks::mock_engine("gpu-a").await;
    let b = router_tests::mocks::mock_engine("gpu-b").await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: gpus
      provider: vllm
      endpoints: ["{}", "{}"]
      capacity_probe: {{kind: vllm, interval_ms: 40}}
      balance: engine_aware
      engine_aware: {{affinity: prefix}}
  routes:
    - {{name: r, chain: [gpus]}}
"#,
        a.url(),
        b.url()
    );
    let s = Settings {
        admin_token: Some("admin".into()),
        ..Settings::default()
    };
    let proxy = TestProxy::with_policy(s, &policy).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let system = "You are a careful assistant who plans trips. ".repeat(20);
    let turn = |more: &[&str]| {
        let mut messages = vec![
            serde_json::json!({"role": "system", "content": system}),
            serde_json::json!({"role": "user", "content": "Plan three days in Lisbon."}),
        ];
        for m in more {
            messages.push(serde_json::json!({"role": "assistant", "content": "Sure."}));
            messages.push(serde_json::json!({"role": "user", "content": m}));
        }
        serde_json::json!({"model": "m", "max_tokens": 4, "messages": messages}).to_string()
    };
    let first = proxy.chat_with(&[], &turn(&[])).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let engine = first.header(MOCK_NAME_HEADER).unwrap().to_string();
    for more in [&["And the hotels?"][..], &["And the hotels?", "And food?"]] {
        let r = proxy.chat_with(&[], &turn(more)).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some(engine.as_str()));
    }
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/_custom_router/explain"),
            &[("authorization", "Bearer admin")],
            r#"{"model": "m"}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let e = r.json();
    assert_eq!(e["balance"]["balance"], "engine_aware", "{e}");
    let signals = e["balance"]["signals"].as_array().unwrap();
    assert_eq!(signals.len(), 2, "{e}");
    for s in signals {
        // Read from the engines' /metrics (the last scrape may still show
        // the last request running: the router's own count, fresher, has
        // seen it end, and the estimate says so).
        assert!(s["running"].is_u64() && s["waiting"].is_u64(), "{e}");
        assert!(s["kv_usage"].is_f64(), "{e}");
        assert_eq!(s["in_flight"], 0, "{e}");
        assert_eq!(s["estimated_load"], 0, "{e}");
        assert_eq!(s["saturated"], false, "{e}");
    }
    assert!(e["balance"]["endpoint"].is_string(), "{e}");
    // Issue 31: with the prompt's text (roles and contents, a line each),
    // explain shows how many of its blocks each engine likely holds, the
    // placement and the runner-up.
    let mut prompt = format!("system\n{system}\nuser\nPlan three days in Lisbon.\n");
    prompt.push_str("assistant\nSure.\nuser\nAnd the hotels?\nassistant\nSure.\nuser\nAnd food?\n");
    let held_by = if engine == "gpu-a" { a.url() } else { b.url() };
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/_custom_router/explain"),
            &[("authorization", "Bearer admin")],
            serde_json::json!({"model": "m", "prompt": prompt}).to_string(),
        )
        .await;
    let e = r.json();
    let balance = &e["balance"];
    assert_eq!(balance["placement"], "prefix_matched", "{e}");
    assert_eq!(balance["endpoint"].as_str(), Some(held_by.as_str()), "{e}");
    let blocks = balance["prefix_blocks"].as_u64().unwrap();
    assert_eq!(blocks as usize, prompt.len() / 256, "{e}");
    for s in balance["signals"].as_array().unwrap() {
        let matched = s["prefix_matched_blocks"].as_u64().unwrap();
        if s["addr"].as_str() == Some(held_by.as_str()) {
            assert_eq!(matched, blocks, "{e}");
        } else {
            assert_eq!(matched, 0, "{e}");
        }
        assert!(s["expected_ttft_s"].is_f64(), "{e}");
    }
    assert!(
        balance["runner_up"].is_string() && balance["runner_up_ttft_s"].is_f64(),
        "{e}"
    );
}
