//! Never fail a request a healthy endpoint could have answered (issue #21),
//! measured from outside: a control plane, ten managed proxies, one pool
//! with a failing endpoint beside a healthy one, two hundred requests
//! round-robin over the proxies. No client sees an error, and the failing
//! endpoint gets at most three real requests across the whole fleet: the
//! first proxy to see it fail retries on the healthy endpoint and reports
//! it suspect, and the control plane tells every other proxy.

use std::time::Duration;

use http::StatusCode;
use router_mock::{Behavior, HealthMode, MockModel, MOCK_NAME_HEADER};
use router_proto::v1 as pb;
use router_tests::control::{admin, managed_proxy, wait_revision, TOKEN};
use router_tests::harness::TestProxy;
use router_tests::mocks::mock;

use super::{control_plane, temp};

const PROXIES: usize = 10;
const REQUESTS: usize = 200;

/// One pool, `bad` and `good`, a route with a deadline; `pool_extra` on
/// the pool. (Each proxy's first pick between the two untried endpoints
/// is random: about half the proxies would find `bad` with their first
/// request without the suspicion.)
fn policy(bad: &str, good: &str, pool_extra: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 3, open_duration_s: 30}}
  pools:
    - name: gpu
      endpoints: ["{bad}", "{good}"]
      attempt_timeout_ms: 400
      {pool_extra}
  routes:
    - name: default
      chain: [gpu]
      deadline_ms: 5000
"#
    )
}

/// A control plane serving `policy`, and [`PROXIES`] managed proxies that
/// applied it.
async fn fleet(
    name: &str,
    policy: String,
) -> (router_control_plane::RunningControlPlane, Vec<TestProxy>) {
    let dir = temp(name);
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let addr = cp.local_addr();
    let mut admin = admin(addr, Some(TOKEN)).await;
    let r = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.applied, "{r:?}");
    let mut proxies = Vec::new();
    for i in 0..PROXIES {
        proxies.push(managed_proxy(&[addr], &format!("p{i}"), None).await);
    }
    for p in &proxies {
        wait_revision(p, r.revision).await;
    }
    (cp, proxies)
}

/// Sends [`REQUESTS`] requests round-robin over `proxies`, one at a time;
/// every one must be answered 200 by `good`, inside its deadline.
async fn all_answered_by_good(proxies: &[TestProxy]) {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    for i in 0..REQUESTS {
        let p = &proxies[i % proxies.len()];
        let started = tokio::time::Instant::now();
        let r = p.chat_with(&[("x-router-deadline-ms", "5000")], body).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("good"), "request {i}");
        assert!(started.elapsed() < Duration::from_secs(5), "request {i}");
    }
}

/// The `backends` entry of the endpoint `url` in a health page.
fn backend(health: &serde_json::Value, url: &str) -> serde_json::Value {
    health["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|e| e["addr"] == url))
        .cloned()
        .unwrap_or_else(|| panic!("no backend {url} in {health}"))
}

async fn measure(name: &str, bad_url: String, bad: Option<&MockModel>) {
    let good = mock("good", Behavior::Json).await;
    let (_cp, proxies) = fleet(name, policy(&bad_url, &good.url(), "")).await;
    all_answered_by_good(&proxies).await;
    if let Some(bad) = bad {
        let reached = bad.stats().received;
        eprintln!("{name}: {reached} of {REQUESTS} requests reached the failing endpoint");
        assert!(
            reached <= 3,
            "{reached} real requests reached the failing endpoint across the fleet"
        );
        assert!(reached >= 1, "the failing endpoint was never tried");
    }
    // The fleet's suspicion is visible in every proxy's health.
    let health = proxies[PROXIES - 1].health().await;
    assert_eq!(backend(&health, &bad_url)["suspect"], "attempt", "{health}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_answering_endpoint_beside_a_healthy_one_fails_no_client() {
    let bad = mock("bad", Behavior::Status(500)).await;
    measure("fleet-500", bad.url(), Some(&bad)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_endpoint_beside_a_healthy_one_fails_no_client() {
    let bad = mock("bad", Behavior::Hang).await;
    measure("fleet-hang", bad.url(), Some(&bad)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_endpoint_beside_a_healthy_one_fails_no_client() {
    // A port nothing listens on: connections are refused.
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    measure("fleet-refused", format!("http://{refused}"), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_failing_its_health_checks_takes_no_real_request() {
    let bad = mock("bad", Behavior::Status(500)).await;
    bad.set_health(HealthMode::Status(503));
    let good = mock("good", Behavior::Json).await;
    let checks = "provider: vllm\n      health_check: {interval_ms: 100, timeout_ms: 50}";
    let (_cp, proxies) = fleet("fleet-checks", policy(&bad.url(), &good.url(), checks)).await;
    // Each proxy waits for its first passing check before it sends the
    // healthy endpoint anything; the failing one never passes.
    all_answered_by_good(&proxies).await;
    assert_eq!(bad.stats().received, 0, "no real request reached it");
    assert!(
        bad.health_hits() >= PROXIES as u64,
        "every proxy checked it"
    );
    let health = proxies[0].health().await;
    assert_eq!(
        backend(&health, &good.url())["health"],
        "healthy",
        "{health}"
    );
    assert_ne!(
        backend(&health, &bad.url())["health"],
        "healthy",
        "{health}"
    );
    assert_eq!(backend(&health, &bad.url())["suspect"], "check", "{health}");
}

/// Issue 28, item 11: the second shape. A pool whose only endpoint answers
/// 500, a healthy pool after it in the chain. Before, the soft marks never
/// emptied the failing pool, so every proxy kept trying it (21 real
/// requests across the fleet, measured from outside); now a pool whose every
/// endpoint is suspect counts as down for a walk that has a clean pool
/// later: at most three real requests reach it, and no client fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pool_before_a_healthy_one_fails_no_client() {
    let bad = mock("bad", Behavior::Status(500)).await;
    let good = mock("good", Behavior::Json).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 3, open_duration_s: 30}}
  pools:
    - name: gpu
      endpoints: ["{}"]
      attempt_timeout_ms: 400
    - name: spare
      endpoints: ["{}"]
  routes:
    - name: default
      chain: [gpu, spare]
      deadline_ms: 5000
"#,
        bad.url(),
        good.url()
    );
    let (_cp, proxies) = fleet("fleet-pool-500", policy).await;
    all_answered_by_good(&proxies).await;
    let reached = bad.stats().received;
    eprintln!("fleet-pool-500: {reached} of {REQUESTS} requests reached the failing pool");
    assert!(
        reached <= 3,
        "{reached} real requests reached the failing pool's endpoint across the fleet"
    );
    assert!(reached >= 1, "the failing pool was never tried");
    let health = proxies[PROXIES - 1].health().await;
    assert_eq!(
        backend(&health, &bad.url())["suspect"],
        "attempt",
        "{health}"
    );
}
