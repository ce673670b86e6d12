//! Secure by default (issue 14, items 4, 5, 6, 8, 9, 10): each test plays
//! the attack against a real proxy and mock endpoints that record what
//! they receive.
//!
//! - a pool's API key never reaches an endpoint `set-backends` installed
//!   (unless it is an origin the policy lists);
//! - `X-Router-*` headers (the approval token) never reach a backend;
//! - `set-backends` refuses link-local and cloud metadata addresses; a
//!   policy file naming an API key variable the proxy does not allow does
//!   not start;
//! - a backend's `Retry-After: 18446744073709551615` neither panics a
//!   request nor stops the proxy;
//! - a body whose model must be rewritten but cannot be re-encoded is
//!   refused, never forwarded with the client's own model.

use std::time::Duration;

use http::{Method, StatusCode};
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_proxy::{Mode, ProxyOptions, Settings};
use router_tests::harness::{LogCapture, TestProxy};
use router_tests::mocks::mock;

use crate::settings;

const ADMIN_TOKEN: &str = "keys-admin-token";
const CHAT: &str = r#"{"model":"client-model","messages":[{"role":"user","content":"hi"}]}"#;

/// Settings with the admin API locked by a token (another change locks the
/// admin API down; these tests send the token either way).
fn locked() -> Settings {
    let mut s = settings();
    s.admin_token = Some(ADMIN_TOKEN.into());
    s
}

/// `POST /_custom_router/set-backends` with the admin token; the answer.
async fn set_backends(
    proxy: &TestProxy,
    pool: Option<&str>,
    backends: &[String],
) -> router_tests::harness::TestResponse {
    let mut body = serde_json::json!({ "backends": backends });
    if let Some(p) = pool {
        body["pool"] = p.into();
    }
    let auth = format!("Bearer {ADMIN_TOKEN}");
    proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/_custom_router/set-backends"),
            &[("authorization", auth.as_str())],
            body.to_string(),
        )
        .await
}

/// Health checks of a pool with a key send it as requests do (a cloud
/// API's `/v1/models` answers 401 without it), to the origins the policy
/// lists only (issue 21).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_carry_the_pools_key_to_its_own_origins_only() {
    std::env::set_var("KEYS_TEST_CHECKED_API_KEY", "sk-checked-secret");
    let listed = mock("listed", Behavior::Json).await;
    listed.set_health(router_mock::HealthMode::RequiresKey(
        "sk-checked-secret".into(),
    ));
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: cloud
      endpoints: ["{}/v1"]
      api_key_env: KEYS_TEST_CHECKED_API_KEY
      health_check: {{interval_ms: 100, timeout_ms: 50}}
  routes:
    - name: r
      chain: [cloud]
"#,
        listed.url()
    );
    let proxy = TestProxy::with_policy(locked(), &policy).await;
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("listed"));
    let health = proxy.health().await;
    assert_eq!(health["backends"][0]["health"], "healthy", "{health}");

    // An endpoint set-backends installed is checked without the key: it
    // never passes a check that wants one, and never sees the key.
    let other = mock("other", Behavior::Json).await;
    other.set_health(router_mock::HealthMode::RequiresKey(
        "sk-checked-secret".into(),
    ));
    let r = set_backends(&proxy, Some("cloud"), &[other.url()]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let health = proxy
        .wait_health("three checks of the new endpoint", |_| {
            other.health_hits() >= 3
        })
        .await;
    assert_eq!(health["backends"][0]["addr"], other.url().as_str());
    assert_ne!(health["backends"][0]["health"], "healthy", "{health}");
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(other.stats().received, 0, "no real request went there");
}

/// Item 5: the key goes only to the origins the policy lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_key_never_reaches_an_endpoint_set_backends_installed() {
    std::env::set_var("KEYS_TEST_CLOUD_API_KEY", "sk-keys-test-secret");
    let listed = mock("listed", Behavior::Json).await;
    let evil = mock("evil", Behavior::Json).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: cloud
      endpoints: ["{}/v1"]
      api_key_env: KEYS_TEST_CLOUD_API_KEY
  routes:
    - name: r
      chain: [cloud]
"#,
        listed.url()
    );
    let proxy = TestProxy::with_policy(locked(), &policy).await;

    // The listed endpoint gets the key, in place of the client's.
    let r = proxy
        .chat_with(&[("authorization", "Bearer client-key")], CHAT)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        listed.requests()[0].headers["authorization"],
        "Bearer sk-keys-test-secret"
    );

    // Traffic moved to an address of the caller's choosing.
    let r = set_backends(&proxy, Some("cloud"), &[evil.url()]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = proxy
        .chat_with(&[("authorization", "Bearer client-key")], CHAT)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("evil"));
    let seen = evil.requests();
    assert_eq!(seen.len(), 1);
    for (name, value) in &seen[0].headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        assert!(
            !value.contains("sk-keys-test-secret"),
            "the key reached the set-backends endpoint in {name}"
        );
    }
    // Neither the key nor the client's credential it would have replaced.
    assert!(seen[0].headers.get("authorization").is_none());

    // The listed origin set again (another path, same scheme, host and
    // port): the key goes with it.
    let r = set_backends(&proxy, Some("cloud"), &[format!("{}/other", listed.url())]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("listed"));
    let last = listed.requests().pop().unwrap();
    assert_eq!(last.headers["authorization"], "Bearer sk-keys-test-secret");
}

/// Item 6: the router's own headers stay with the router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_headers_never_reach_a_backend() {
    let backend = mock("backend", Behavior::Json).await;
    let proxy = TestProxy::sidecar(locked()).await;
    let r = set_backends(&proxy, None, &[backend.url()]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = proxy
        .chat_with(
            &[
                ("x-router-approval", "approval-secret-token"),
                ("x-router-risk", "READ"),
                ("x-router-deadline-ms", "5000"),
                ("x-router-trace-note", "internal"),
                ("idempotency-key", "key-6"),
            ],
            CHAT,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let got = &backend.requests()[0];
    let router_headers: Vec<&str> = got
        .headers
        .keys()
        .map(|n| n.as_str())
        .filter(|n| n.starts_with("x-router-"))
        .collect();
    assert!(router_headers.is_empty(), "forwarded: {router_headers:?}");
    for (name, value) in &got.headers {
        assert!(
            !String::from_utf8_lossy(value.as_bytes()).contains("approval-secret-token"),
            "the approval token reached the backend in {name}"
        );
    }
    // The request id goes on, as the contract says.
    assert_eq!(got.headers["idempotency-key"], "key-6");
    assert_eq!(got.headers["x-request-id"], "key-6");
}

/// Item 8: set-backends refuses link-local and metadata addresses unless
/// the operator names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_backends_refuses_link_local_and_metadata_addresses() {
    let proxy = TestProxy::sidecar(locked()).await;
    for address in [
        "169.254.169.254:80",
        "http://169.254.169.254/latest/meta-data",
        "http://[fd00:ec2::254]:80",
        "http://[fe80::1]:8080",
        "http://[::ffff:169.254.169.254]:80",
        "2852039166:80",
    ] {
        let r = set_backends(&proxy, None, &[address.to_string()]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{address}: {}", r.text());
        assert_eq!(r.error_type(), "invalid_request", "{address}");
        let message = r.json()["error"]["message"].to_string();
        assert!(
            message.contains("CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS"),
            "{address}: {message}"
        );
    }
    assert_eq!(
        proxy.health().await["backends"].as_array().map(Vec::len),
        Some(0)
    );
    // Named by the operator: accepted.
    let mut s = locked();
    s.guards = router_policy::Guards::from_lookup(|k| {
        (k == "CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS").then(|| "169.254.169.254".into())
    })
    .unwrap();
    let allowed = TestProxy::sidecar(s).await;
    let r = set_backends(&allowed, None, &["169.254.169.254:80".to_string()]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

/// Item 4: a policy file asking for a variable the proxy does not allow
/// does not start it, and says which field and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_naming_a_variable_the_proxy_does_not_allow_is_refused() {
    let dir = std::env::temp_dir().join(format!("router-test-{}-keys", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.yaml");
    std::fs::write(
        &path,
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: exfil
      endpoints: ["http://127.0.0.1:9"]
      api_key_env: AWS_SECRET_ACCESS_KEY
  routes:
    - name: r
      chain: [exfil]
"#,
    )
    .unwrap();
    let start = |settings: Settings| {
        let mut settings = settings;
        settings.bind = [127, 0, 0, 1].into();
        settings.port = 0;
        router_proxy::start(ProxyOptions {
            settings,
            mode: Mode::Standalone {
                policy: path.clone(),
            },
            route_log: Box::new(LogCapture::default()),
        })
    };
    let err = match start(settings()).await {
        Ok(_) => panic!("a proxy started with api_key_env: AWS_SECRET_ACCESS_KEY"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("spec.pools[0].api_key_env") && err.contains("AWS_SECRET_ACCESS_KEY"),
        "{err}"
    );
    // The operator's extension allows it.
    let mut s = settings();
    s.guards = router_policy::Guards::from_lookup(|k| {
        (k == "CUSTOM_ROUTER_API_KEY_ENV_ALLOW").then(|| "AWS_SECRET_ACCESS_KEY".into())
    })
    .unwrap();
    assert!(start(s).await.is_ok());
}

/// Item 9: a backend's huge `Retry-After` used to overflow the clock and
/// panic the request's task (its client got no answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_neither_panics_nor_stops_the_proxy() {
    let limited = mock(
        "limited",
        Behavior::RateLimited("18446744073709551615".into()),
    )
    .await;
    let backup = mock("backup", Behavior::Json).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 1, open_duration_s: 1}}
  pools:
    - name: limited
      endpoints: ["{}"]
    - name: backup
      endpoints: ["{}"]
  routes:
    - name: r
      chain: [limited, backup]
"#,
        limited.url(),
        backup.url()
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    // The request gets one answer: the 429 moves it to the next pool.
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("backup"));
    assert_eq!(limited.stats().received, 1);
    // The proxy goes on serving; the limited endpoint stays shut out (for
    // at most an hour: longer than the one-second open period).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..3 {
        let r = proxy.chat_with(&[], CHAT).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("backup"));
    }
    assert_eq!(limited.stats().received, 1);
    let health = proxy.health().await;
    let limited_state = health["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["pool"] == "limited")
        .map(|b| b["circuit"].clone());
    assert_eq!(limited_state, Some("open".into()));
}

/// Item 10: bodies the request scanner accepts (as serde_json does when
/// it skips a value) but serde_json cannot re-encode with the pool's
/// model. Before: forwarded as they came, with the client's model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_whose_model_cannot_be_rewritten_is_refused_never_forwarded() {
    let backend = mock("backend", Behavior::Json).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: p
      model: pool-model
      endpoints: ["{}"]
  routes:
    - name: r
      chain: [p]
"#,
        backend.url()
    );
    let proxy = TestProxy::with_policy(settings(), &policy).await;
    let deep = format!(
        r#"{{"model":"client-model","messages":[],"x":{}1{}}}"#,
        "[".repeat(300),
        "]".repeat(300)
    );
    let mut bad_utf8 =
        br#"{"model":"client-model","messages":[{"role":"user","content":""#.to_vec();
    bad_utf8.extend_from_slice(&[0xff, 0xc0, 0x80]);
    bad_utf8.extend_from_slice(br#""}]}"#);
    let lone_surrogate =
        br#"{"model":"client-model","messages":[{"role":"user","content":"\ud800"}]}"#.to_vec();
    for (what, body) in [
        ("nesting past serde_json's limit", deep.into_bytes()),
        ("invalid UTF-8", bad_utf8),
        ("a lone surrogate", lone_surrogate),
    ] {
        let r = proxy
            .client
            .send(
                Method::POST,
                &proxy.url("/v1/chat/completions"),
                &[("content-type", "application/json")],
                body,
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{what}: {}", r.text());
        assert_eq!(r.error_type(), "invalid_request", "{what}");
    }
    assert_eq!(backend.requests().len(), 0, "a body was forwarded");
    // A body that can be re-encoded goes with the pool's model.
    let r = proxy.chat_with(&[], CHAT).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let sent: serde_json::Value = serde_json::from_slice(&backend.requests()[0].body).unwrap();
    assert_eq!(sent["model"], "pool-model");
}
