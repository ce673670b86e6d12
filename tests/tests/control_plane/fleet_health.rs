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

/// Issue 30 item 6 in a fleet: a proxy's open circuit is shared as an
/// override that holds every proxy (this one too) out of the endpoint.
/// When a passing check ends the circuit's wait here, the proxy withdraws
/// its report, so a backend killed and brought back gets traffic on every
/// proxy within 5 s of its first passing check, its circuit open for 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_brought_back_gets_fleet_traffic_within_seconds_of_its_checks() {
    let primary = mock("primary", Behavior::Json).await;
    let addr = primary.addr();
    let fallback = mock("fallback", Behavior::Json).await;
    let policy = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 1, open_duration_s: 60}}
  pools:
    - name: primary
      endpoints: ["{}"]
      health_check: {{interval_ms: 100, timeout_ms: 50}}
    - name: fallback
      endpoints: ["{}"]
  routes:
    - name: default
      chain: [primary, fallback]
"#,
        primary.url(),
        fallback.url()
    );
    let dir = temp("fleet-recovery");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let cp_addr = cp.local_addr();
    let mut admin = admin(cp_addr, Some(TOKEN)).await;
    let r = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.applied, "{r:?}");
    let p1 = managed_proxy(&[cp_addr], "p1", None).await;
    let p2 = managed_proxy(&[cp_addr], "p2", None).await;
    wait_revision(&p1, r.revision).await;
    wait_revision(&p2, r.revision).await;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let served_by =
        |r: &router_tests::harness::TestResponse| r.header(MOCK_NAME_HEADER).map(str::to_string);
    // p1 is answered by the primary, which then dies: p1's circuit opens
    // and the control plane holds p2 out too.
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while served_by(&p1.chat_with(&[], body).await).as_deref() != Some("primary") {
        assert!(tokio::time::Instant::now() < until, "never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    primary.stop().await;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = p1.chat_with(&[], body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let circuits = admin
            .list_circuits(pb::ListCircuitsRequest {})
            .await
            .unwrap()
            .into_inner()
            .circuits;
        if circuits.iter().any(|c| c.suspect.is_empty() && c.open) {
            break;
        }
        assert!(tokio::time::Instant::now() < until, "no circuit reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let back = MockModel::start_on(
        addr,
        router_mock::MockConfig {
            name: "primary".into(),
            ..router_mock::MockConfig::default()
        },
    )
    .await
    .unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while back.health_hits() == 0 {
        assert!(tokio::time::Instant::now() < until, "never checked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first_check = tokio::time::Instant::now();
    for (name, p) in [("p1", &p1), ("p2", &p2)] {
        let mut served = None;
        while first_check.elapsed() < Duration::from_secs(8) {
            let r = p.chat_with(&[], body).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            if served_by(&r).as_deref() == Some("primary") {
                served = Some(first_check.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let served = served.unwrap_or_else(|| panic!("{name}: no traffic to the primary"));
        eprintln!("{name}: the primary got traffic {served:?} after its first passing check");
        assert!(served < Duration::from_secs(5), "{name}: after {served:?}");
    }
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}
