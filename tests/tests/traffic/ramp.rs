//! Ramps driven by the control plane: a real control plane, a managed
//! proxy that reports each side's outcomes on a short heartbeat, mock
//! pools, steady traffic; each step and each rollback a policy version
//! authored `ramp` with its reason (docs/traffic.md "Ramps").

use std::time::Duration;

use router_mock::Behavior;
use router_proto::v1 as pb;
use router_tests::control::{
    control_plane_applying, managed_proxy_reporting, ramp_versions, split_weight,
    wait_split_weight, TOKEN,
};
use router_tests::harness::TestProxy;
use router_tests::mocks::mock_latency;
use router_tests::steady::Steady;

use crate::policy;

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// Steps 10, 50, 100 of one second each, judged on 20 requests a side.
const RAMPED: &str = "[{split: [{pool: new, weight: 10}, {pool: old, weight: 90}], ramp: {steps: [10, 50, 100], step_s: 1, guard: {min_requests: 20}}}, last]";

/// A control plane with `doc` applied, and a managed proxy on it that
/// reports every 100 ms.
async fn fleet(name: &str, doc: &str) -> (router_control_plane::RunningControlPlane, TestProxy) {
    let (cp, _) = control_plane_applying(&format!("ramp-{name}"), doc).await;
    let proxy = managed_proxy_reporting(cp.local_addr(), name, Duration::from_millis(100)).await;
    (cp, proxy)
}

/// Four clients sending [`BODY`] to the proxy's chat path.
fn traffic(proxy: &TestProxy) -> Steady {
    Steady::start(proxy.url("/v1/chat/completions"), BODY, 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_new_side_walks_every_step_to_100_each_a_version_with_its_evidence() {
    // Both sides answer in 20 ms: the default p95 guard (1.5) holds.
    let (new, old, last) = (
        mock_latency("new", 20).await,
        mock_latency("old", 20).await,
        mock_latency("last", 20).await,
    );
    let doc = policy(&new.url(), &old.url(), &last.url(), RAMPED, "");
    let (cp, proxy) = fleet("healthy", &doc).await;
    let traffic = traffic(&proxy);
    wait_split_weight(&cp, 50, 20).await;
    wait_split_weight(&cp, 100, 20).await;
    let (sent, failed) = traffic.stop().await;
    assert_eq!(failed, 0, "of {sent}");
    let versions = ramp_versions(&cp);
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert!(
        versions[0].1.starts_with(
            "ramp: route default new 10% -> 50% (errors 0.0% <= 1.0% + old 0.0%, p95 ratio "
        ),
        "{versions:?}"
    );
    assert!(
        versions[1]
            .1
            .starts_with("ramp: route default new 50% -> 100% (errors 0.0% <= 1.0% + old 0.0%"),
        "{versions:?}"
    );
    // Done: nothing moves any more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(ramp_versions(&cp).len(), 2);
    assert!(new.stats().received > 0 && old.stats().received > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_side_that_fails_at_the_second_step_is_rolled_back_within_the_step() {
    let (new, old, last) = (
        mock_latency("new", 20).await,
        mock_latency("old", 20).await,
        mock_latency("last", 20).await,
    );
    let doc = policy(&new.url(), &old.url(), &last.url(), RAMPED, "");
    let (cp, proxy) = fleet("failing", &doc).await;
    let traffic = traffic(&proxy);
    wait_split_weight(&cp, 50, 20).await;
    new.set_behavior(Behavior::Status(500));
    let failing_since = tokio::time::Instant::now();
    wait_split_weight(&cp, 0, 10).await;
    let took = failing_since.elapsed();
    // Within one step (1 s), plus a heartbeat and a tick.
    assert!(took < Duration::from_millis(2500), "{took:?}");
    // Stopped at 0: no traffic to the new side, nothing moves.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let received = new.stats().received;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        new.stats().received,
        received,
        "weight 0: the new side is out"
    );
    let (sent, failed) = traffic.stop().await;
    // The split's other side absorbed every failure of the new one.
    assert_eq!(failed, 0, "of {sent}");
    let versions = ramp_versions(&cp);
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert!(
        versions[0]
            .1
            .starts_with("ramp: route default new 10% -> 50% ("),
        "{versions:?}"
    );
    assert!(
        versions[1]
            .1
            .starts_with("ramp: route default rolled back to 0 from 50%: error rate "),
        "{versions:?}"
    );
    assert_eq!(split_weight(&cp), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_status_pause_resume_and_abort_and_a_paused_ramp_still_rolls_back() {
    let (new, old, last) = (
        mock_latency("new", 20).await,
        mock_latency("old", 20).await,
        mock_latency("last", 20).await,
    );
    let doc = policy(&new.url(), &old.url(), &last.url(), RAMPED, "");
    let (cp, proxy) = fleet("rollout", &doc).await;
    let mut admin =
        routerctl::admin_cmd::connect(&cp.local_addr().to_string(), Some(TOKEN.into()), None)
            .await
            .unwrap();
    let ask = |action: &str| pb::RolloutRequest {
        route: "default".into(),
        action: action.into(),
    };
    let paused = admin.rollout(ask("pause")).await.unwrap().into_inner();
    assert!(paused.ramps[0].paused, "{paused:?}");
    let traffic = traffic(&proxy);
    // Paused: the step's evidence comes, nothing moves.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let s = admin.rollout(ask("status")).await.unwrap().into_inner();
    let r = &s.ramps[0];
    assert_eq!((r.weight, r.paused, r.window), (10, true, true), "{r:?}");
    assert!(r.new_requests >= 20 && r.old_requests >= 20, "{r:?}");
    assert_eq!(r.new_errors, 0);
    assert_eq!(r.verdict, "advance", "{r:?}");
    assert!(r.detail.starts_with("10% -> 50%: errors 0.0%"), "{r:?}");
    assert!(ramp_versions(&cp).is_empty());
    let text = routerctl::rollout_cmd::table(&s);
    assert!(
        text.contains(
            "route default step 0: new 10% / old 90% (steps 10, 50, 100, 1 s each), PAUSED"
        ),
        "{text}"
    );
    // Resumed: the next tick advances.
    admin.rollout(ask("resume")).await.unwrap();
    wait_split_weight(&cp, 50, 5).await;
    // Aborted: at 0 at once, noted, and stopped.
    let aborted = admin.rollout(ask("abort")).await.unwrap().into_inner();
    assert_eq!(aborted.ramps[0].weight, 0, "{aborted:?}");
    assert_eq!(aborted.ramps[0].verdict, "stopped");
    let versions = ramp_versions(&cp);
    assert_eq!(
        versions.last().map(|v| v.1.as_str()),
        Some("ramp: aborted by operator"),
        "{versions:?}"
    );
    // Started again by an apply at the first step, and paused: a new side
    // that fails is still rolled back.
    let applied = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: doc.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(applied.applied, "{applied:?}");
    assert_eq!(split_weight(&cp), Some(10));
    admin.rollout(ask("pause")).await.unwrap();
    new.set_behavior(Behavior::Status(500));
    wait_split_weight(&cp, 0, 5).await;
    let versions = ramp_versions(&cp);
    assert!(
        versions.last().is_some_and(|v| v
            .1
            .starts_with("ramp: route default rolled back to 0 from 10%: ")),
        "{versions:?}"
    );
    let (sent, failed) = traffic.stop().await;
    assert_eq!(failed, 0, "of {sent}");
    // A route without a ramp, an unknown action: refused.
    let e = admin
        .rollout(pb::RolloutRequest {
            route: "nope".into(),
            action: "status".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = admin.rollout(ask("faster")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
}
