//! Session affinity (issue 29, item 7): a pool with
//! `session_affinity: {header: x-claude-code-session-id}` keeps each
//! session on one endpoint (where its prompt cache is), spills a session
//! whose endpoint is full and brings it back once there is room, spreads
//! different sessions, and balances requests without the header as before;
//! also for an Anthropic client translated to an OpenAI-compatible pool.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use http::{Method, StatusCode};
use router_mock::{Behavior, MockConfig, MockModel};
use router_proxy::Settings;
use router_tests::harness::{TestProxy, TestResponse};
use router_tests::mocks::{mock, start};
use serde_json::{json, Value};

const SESSION: &str = "x-claude-code-session-id";

/// A pool of `endpoints` with session affinity (`pool_extra`: more YAML
/// lines of the pool).
fn policy(endpoints: &[&MockModel], pool_extra: &str) -> String {
    let urls: Vec<String> = endpoints
        .iter()
        .map(|m| format!("\"{}\"", m.url()))
        .collect();
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: gpus
      endpoints: [{}]
      session_affinity: {{header: X-Claude-Code-Session-Id}}
{pool_extra}
  routes:
    - name: chat
      chain: [gpus]
"#,
        urls.join(", ")
    )
}

async fn chat(proxy: &TestProxy, session: Option<&str>) -> TestResponse {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(s) = session {
        headers.push((SESSION, s));
    }
    proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/v1/chat/completions"),
            &headers,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.to_string(),
        )
        .await
}

/// The endpoint and the affinity note of route-log line `line`.
fn placed(line: &Value) -> (String, Option<String>) {
    let a = &line["attempts"][0];
    (
        a["endpoint"].as_str().unwrap_or_default().to_owned(),
        a["affinity"].as_str().map(str::to_owned),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_stays_on_one_endpoint_and_sessions_spread() {
    let a = mock("a", Behavior::Chat).await;
    let b = mock("b", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&[&a, &b], "")).await;
    // Twenty requests of each of two sessions, interleaved.
    for _ in 0..20 {
        for s in ["session-a", "session-b"] {
            assert_eq!(chat(&proxy, Some(s)).await.status, StatusCode::OK);
        }
    }
    let lines = proxy.log.wait_for(40).await;
    let mut by_session: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        let (endpoint, how) = placed(line);
        by_session.entry(i % 2).or_default().insert(endpoint);
        let expected = if i < 2 {
            "session_placed"
        } else {
            "session_kept"
        };
        assert_eq!(how.as_deref(), Some(expected), "request {i}: {line}");
        // The session's value is never logged.
        assert!(!line.to_string().contains("session-a"), "{line}");
    }
    assert!(
        by_session.values().all(|e| e.len() == 1),
        "each session on one endpoint: {by_session:?}"
    );

    // Many sessions spread over both endpoints.
    let before = (a.stats().received, b.stats().received);
    for n in 0..32 {
        chat(&proxy, Some(&format!("user-{n}"))).await;
    }
    let (got_a, got_b) = (a.stats().received - before.0, b.stats().received - before.1);
    assert_eq!(got_a + got_b, 32);
    assert!(
        got_a >= 4 && got_b >= 4,
        "32 sessions: a {got_a}, b {got_b}"
    );

    // Without the header: balanced as before (by the pool's scoring), no
    // affinity note.
    for _ in 0..10 {
        assert_eq!(chat(&proxy, None).await.status, StatusCode::OK);
    }
    let lines = proxy.log.wait_for(82).await;
    assert!(lines[72..].iter().all(|l| placed(l).1.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_endpoint_is_full_spills_and_comes_back() {
    let slow = |name: &str| MockConfig {
        name: name.into(),
        behavior: Behavior::Chat,
        latency: Duration::from_millis(600),
        ..MockConfig::default()
    };
    let a = start(slow("a")).await;
    let b = start(slow("b")).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&[&a, &b], "      max_concurrency: 1"),
    )
    .await;
    // The session's first request holds its endpoint's only slot...
    let first = chat(&proxy, Some("busy-session"));
    let second = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        chat(&proxy, Some("busy-session")).await
    };
    let (r1, r2) = tokio::join!(first, second);
    assert_eq!((r1.status, r2.status), (StatusCode::OK, StatusCode::OK));
    let lines = proxy.log.wait_for(2).await;
    // (Lines come in the order the requests finished.)
    let mut seen: Vec<(String, Option<String>)> = lines.iter().map(placed).collect();
    seen.sort_by_key(|(_, how)| how.clone());
    let (home, placed_note) = &seen[0];
    let (visited, spill_note) = &seen[1];
    assert_eq!(placed_note.as_deref(), Some("session_placed"), "{seen:?}");
    // ... so the second, arriving meanwhile, spills to the other one
    // instead of waiting.
    assert_eq!(spill_note.as_deref(), Some("session_spilled"), "{seen:?}");
    assert_ne!(home, visited);
    // Once there is room, the session goes home.
    chat(&proxy, Some("busy-session")).await;
    let lines = proxy.log.wait_for(3).await;
    let (endpoint, how) = placed(&lines[2]);
    assert_eq!((&endpoint, how.as_deref()), (home, Some("session_kept")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_client_keeps_its_session_on_one_openai_endpoint() {
    let a = mock("a", Behavior::Chat).await;
    let b = mock("b", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&[&a, &b], "")).await;
    for turn in 0..6 {
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true,
            "messages": [{"role": "user", "content": format!("turn {turn}")}]});
        let r = proxy
            .client
            .send(
                Method::POST,
                &proxy.url("/v1/messages"),
                &[
                    ("content-type", "application/json"),
                    ("anthropic-version", "2023-06-01"),
                    (SESSION, "claude-code-session-7"),
                ],
                body.to_string(),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        router_dialect::check::anthropic_stream(&r.body)
            .unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    }
    let served = (a.stats().received, b.stats().received);
    assert!(served == (6, 0) || served == (0, 6), "{served:?}");
}
