//! A ramp across replicas: the leader judges each step on the reports of
//! the proxies connected to every replica (shared as running totals
//! through etcd), any replica answers `rollout status` with the leader's
//! windows, and a pause is stored in the shared state, so every replica
//! and the next leader keep it (docs/traffic.md "Ramps").

use std::time::Duration;

use router_mock::Behavior;
use router_tests::control::{
    managed_proxy_reporting, ramp_versions, split_weight, wait_split_weight,
};
use router_tests::harness::eventually;
use router_tests::mocks::mock_latency;
use router_tests::steady::Steady;

use super::*;

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// Steps 10, 50, 100 of one second each, judged on 20 requests a side.
fn ramped(new: &str, old: &str, last: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 1000}}
  pools:
    - {{name: new, endpoints: ["{new}"]}}
    - {{name: old, endpoints: ["{old}"]}}
    - {{name: last, endpoints: ["{last}"]}}
  routes:
    - name: default
      chain: [{{split: [{{pool: new, weight: 10}}, {{pool: old, weight: 90}}], ramp: {{steps: [10, 50, 100], step_s: 1, guard: {{min_requests: 20}}}}}}, last]
"#
    )
}

async fn rollout(cp: &RunningControlPlane, action: &str) -> pb::RolloutResponse {
    admin(cp.local_addr(), Some(TOKEN))
        .await
        .rollout(pb::RolloutRequest {
            route: "default".into(),
            action: action.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramp_counts_the_proxies_of_every_replica_and_its_pause_is_shared() {
    let etcd = EtcdServer::start("ramp").await;
    let (a, b) = two_replicas(&etcd).await;
    let holder = wait_singleton(&etcd, None).await;
    let (leader, follower) = if holder == "cp-a" { (a, b) } else { (b, a) };
    let follower_name = if holder == "cp-a" { "cp-b" } else { "cp-a" };
    eventually(Duration::from_secs(5), "the holder leads", || {
        leader.hub().leading()
    })
    .await;
    let (new, old, last) = (
        mock_latency("new", 20).await,
        mock_latency("old", 20).await,
        mock_latency("last", 20).await,
    );
    let applied = apply(
        follower.local_addr(),
        ramped(&new.url(), &old.url(), &last.url()),
        0,
    )
    .await
    .unwrap();
    assert!(applied.applied, "{applied:?}");
    // The only proxy talks to the replica that does not lead.
    let proxy = managed_proxy_reporting(
        follower.local_addr(),
        "ramp-proxy",
        Duration::from_millis(100),
    )
    .await;
    assert_eq!(connected_proxies(leader.local_addr()).await.len(), 0);

    // Paused through the leader: stored, so the follower knows it too.
    assert!(rollout(&leader, "pause").await.ramps[0].paused);
    eventually(
        Duration::from_secs(5),
        "the follower sees the pause",
        || follower.hub().ramp_paused("default"),
    )
    .await;

    let traffic = Steady::start(proxy.url("/v1/chat/completions"), BODY, 4);

    // The leader's window counts the follower's proxy, and the follower
    // answers status with the leader's window.
    let mut status = None;
    for _ in 0..100 {
        let s = rollout(&follower, "status").await;
        let r = s.ramps[0].clone();
        if r.window && r.new_requests >= 20 && r.old_requests >= 20 {
            status = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = status.expect("the follower never showed the leader's window with evidence");
    assert_eq!((r.weight, r.paused), (10, true), "{r:?}");
    assert_eq!(r.verdict, "advance", "paused, so it holds: {r:?}");
    let lead_view = leader.hub().ramp_windows(Some("default"));
    assert!(lead_view[0].new.requests >= 20, "{lead_view:?}");
    assert!(
        follower.hub().ramp_windows(None).is_empty(),
        "the follower keeps none"
    );
    assert_eq!(split_weight(&leader), Some(10), "paused: nothing moved");

    // Resumed through the follower: the leader advances.
    assert!(!rollout(&follower, "resume").await.ramps[0].paused);
    wait_split_weight(&leader, 50, 10).await;
    // The new side fails: rolled back on the follower's proxy's reports.
    new.set_behavior(Behavior::Status(500));
    wait_split_weight(&leader, 0, 10).await;
    wait_split_weight(&follower, 0, 5).await;
    let (sent, failed) = traffic.stop().await;
    assert_eq!(failed, 0, "of {sent}");
    let notes: Vec<String> = ramp_versions(&leader).into_iter().map(|v| v.1).collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("ramp: route default new 10% -> 50% ("),
        "{notes:?}"
    );
    assert!(
        notes[1].starts_with("ramp: route default rolled back to 0 from 50%: error rate "),
        "{notes:?}"
    );

    // The pause outlives the leader: paused again, the leader goes, the
    // follower leads and keeps it.
    rollout(&follower, "pause").await;
    leader.shutdown().await;
    wait_singleton(&etcd, Some(follower_name)).await;
    eventually(Duration::from_secs(5), "the follower leads", || {
        follower.hub().leading()
    })
    .await;
    let r = rollout(&follower, "status").await;
    assert!(r.ramps[0].paused, "{r:?}");
    follower.shutdown().await;
}
