//! Several control-plane replicas on one real etcd (Debian's
//! `etcd-server`, started on 127.0.0.1 by the test), with managed proxies
//! split across them: changes made through one replica reach proxies on
//! every replica; a replica killed hands its proxies to another without a
//! failed request; concurrent applies race fairly; an etcd restart and a
//! compaction are survived without restarting anything. `secure.rs`: the
//! same etcd over TLS, with client certificates and users.

#![allow(clippy::unwrap_used)]

mod console;
mod ramp;
mod secure;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use router_control_plane::store::etcd::{EtcdAddress, EtcdStore};
use router_control_plane::store::{PolicyRecord, State, Store, StoreChange, StoreEvent};
use router_control_plane::{
    start, ControlPlaneOptions, Limits, RunningControlPlane, StoreLocation,
};
use router_etcd::pb::etcdserverpb::RangeRequest;
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_proto::v1 as pb;
use router_tests::control::{admin, managed_proxy, policy, version_of, wait_version, TOKEN};
use router_tests::etcd::EtcdServer;
use router_tests::harness::eventually;
use router_tests::mocks::mock;

async fn replica(etcd: &EtcdServer, node: &str) -> RunningControlPlane {
    replica_with(etcd, node, Limits::default()).await
}

async fn replica_with(etcd: &EtcdServer, node: &str, limits: Limits) -> RunningControlPlane {
    start(ControlPlaneOptions {
        limits,
        ..replica_options(etcd, node)
    })
    .await
    .unwrap()
}

/// A replica `node` on `etcd` (prefix `/router`), on loopback, with the
/// tests' token.
fn replica_options(etcd: &EtcdServer, node: &str) -> ControlPlaneOptions {
    ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: StoreLocation::Etcd {
            address: EtcdAddress::parse(&etcd.store_url("router")).unwrap(),
            node_id: node.into(),
            access: Default::default(),
        },
        token: Some(TOKEN.into()),
        ..Default::default()
    }
}

/// The replica holding the singleton lease, as etcd says.
async fn singleton_holder(etcd: &EtcdServer) -> Option<String> {
    etcd.client()
        .await
        .range(RangeRequest::key("/router/singleton"))
        .await
        .unwrap()
        .kvs
        .first()
        .map(|kv| kv.value_str().unwrap().to_string())
}

/// Waits (5 s at most) until `want` holds the singleton lease, or anyone
/// when `want` is `None`; returns the holder.
async fn wait_singleton(etcd: &EtcdServer, want: Option<&str>) -> String {
    for _ in 0..50 {
        if let Some(h) = singleton_holder(etcd).await {
            if want.is_none_or(|w| w == h) {
                return h;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "singleton lease not held by {want:?}: {:?}",
        singleton_holder(etcd).await
    );
}

/// Every proxy of the fleet, as the replica at `cp` lists it.
async fn fleet(cp: SocketAddr) -> Vec<pb::ProxyStatus> {
    admin(cp, Some(TOKEN))
        .await
        .list_proxies(pb::ListProxiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .proxies
}

/// Replicas `cp-a` and `cp-b` on `etcd`.
async fn two_replicas(etcd: &EtcdServer) -> (RunningControlPlane, RunningControlPlane) {
    (replica(etcd, "cp-a").await, replica(etcd, "cp-b").await)
}

async fn apply(
    cp: SocketAddr,
    document: String,
    expected_version: u64,
) -> Result<pb::ApplyPolicyResponse, tonic::Status> {
    admin(cp, Some(TOKEN))
        .await
        .apply_policy(pb::ApplyPolicyRequest {
            document,
            dry_run: false,
            expected_version,
            author: "test".into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn connected_proxies(cp: SocketAddr) -> Vec<pb::ProxyStatus> {
    let mut proxies = fleet(cp).await;
    proxies.retain(|p| p.connected);
    proxies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_replica_reaches_proxies_on_every_replica() {
    let etcd = EtcdServer::start("reach").await;
    let x = mock("x", Behavior::Json).await;
    let y = mock("y", Behavior::Json).await;
    let (a, b) = two_replicas(&etcd).await;
    let (ra, rb) = (a.local_addr(), b.local_addr());
    let on_a = [
        managed_proxy(&[ra, rb], "p1", None).await,
        managed_proxy(&[ra, rb], "p2", None).await,
    ];
    let on_b = [
        managed_proxy(&[rb, ra], "p3", None).await,
        managed_proxy(&[rb, ra], "p4", None).await,
    ];

    let r = apply(ra, policy(&x.url(), &y.url()), 0).await.unwrap();
    assert!(r.applied, "{r:?}");
    assert_eq!(r.version, 1);
    // Every replica names the state with the same etcd revision.
    let v = format!("cp-{}", r.revision);
    for p in on_a.iter().chain(&on_b) {
        wait_version(p, &v).await;
        assert_eq!(p.chat("m").await.header(MOCK_NAME_HEADER), Some("x"));
    }
    // Each replica serves its own proxies, and either lists the whole fleet.
    for cp in [ra, rb] {
        let mut fleet = Vec::new();
        for _ in 0..100 {
            fleet = connected_proxies(cp).await;
            if fleet.len() == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut seen: Vec<(String, String)> = fleet
            .into_iter()
            .map(|p| (p.node_id, p.control_plane))
            .collect();
        seen.sort();
        let want = [
            ("p1", "cp-a"),
            ("p2", "cp-a"),
            ("p3", "cp-b"),
            ("p4", "cp-b"),
        ];
        assert_eq!(
            seen,
            want.map(|(n, c)| (n.to_string(), c.to_string())),
            "the fleet as {cp} lists it"
        );
    }

    // The other way round: backends set through B reach the proxies on A,
    // and B's history has A's version.
    let history = admin(rb, Some(TOKEN))
        .await
        .history(pb::HistoryRequest {})
        .await
        .unwrap()
        .into_inner()
        .versions;
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].author, "test");
    let z = mock("z", Behavior::Json).await;
    let changed = admin(rb, Some(TOKEN))
        .await
        .set_backends(pb::SetBackendsRequest {
            pool: "primary".into(),
            endpoints: vec![z.url()],
            drained: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let v2 = format!("cp-{}", changed.revision);
    for p in on_a.iter().chain(&on_b) {
        wait_version(p, &v2).await;
        assert_eq!(p.chat("m").await.header(MOCK_NAME_HEADER), Some("z"));
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_applies_with_the_same_expected_version_have_one_winner() {
    let etcd = EtcdServer::start("race").await;
    let x = mock("x", Behavior::Json).await;
    let (a, b) = two_replicas(&etcd).await;
    let (ra, rb) = (a.local_addr(), b.local_addr());
    apply(ra, policy(&x.url(), &x.url()), 0).await.unwrap();
    eventually(Duration::from_secs(5), "B has version 1", || {
        b.hub().state().policy_version == 1
    })
    .await;

    // Ten applies, five through each replica, all expecting version 1.
    let mut racers = Vec::new();
    for i in 0..10u32 {
        let cp = if i % 2 == 0 { ra } else { rb };
        let doc = policy(&x.url(), &x.url()).replace(
            "consecutive_errors: 2",
            &format!("consecutive_errors: {}", i + 3),
        );
        racers.push(tokio::spawn(async move { apply(cp, doc, 1).await }));
    }
    let mut won = Vec::new();
    let mut conflicts = 0;
    for r in racers {
        match r.await.unwrap() {
            Ok(resp) => {
                assert!(resp.applied);
                won.push(resp);
            }
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Aborted, "{s}");
                conflicts += 1;
            }
        }
    }
    assert_eq!(won.len(), 1, "exactly one winner: {won:?}");
    assert_eq!(conflicts, 9);
    assert_eq!(won[0].version, 2);
    // Both replicas agree on the result.
    for cp in [&a, &b] {
        eventually(Duration::from_secs(5), "replicas agree", || {
            let s = cp.hub().state();
            s.policy_version == 2 && s.revision == won[0].revision && cp.hub().history().len() == 2
        })
        .await;
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_hands_its_proxies_over_without_a_failed_request() {
    let etcd = EtcdServer::start("kill").await;
    let x = mock("x", Behavior::Json).await;
    let y = mock("y", Behavior::Json).await;
    let (a, b) = two_replicas(&etcd).await;
    let (ra, rb) = (a.local_addr(), b.local_addr());
    let r1 = apply(ra, policy(&x.url(), &y.url()), 0).await.unwrap();
    let v1 = format!("cp-{}", r1.revision);
    let proxies = Arc::new([
        managed_proxy(&[ra, rb], "p1", None).await,
        managed_proxy(&[ra, rb], "p2", None).await,
        managed_proxy(&[rb, ra], "p3", None).await,
    ]);
    for p in proxies.iter() {
        wait_version(p, &v1).await;
    }
    assert_eq!(a.hub().proxies().len(), 2, "p1 and p2 on A");

    // Traffic through every proxy for the whole test.
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (proxies, sent, failed, stop) =
            (proxies.clone(), sent.clone(), failed.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for p in proxies.iter() {
                    let status = p.chat("m").await.status;
                    sent.fetch_add(1, Ordering::Relaxed);
                    if status != StatusCode::OK {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };

    a.shutdown().await;
    // A's proxies keep their config and move to B.
    for p in proxies.iter() {
        assert_eq!(version_of(p).await, v1);
    }
    let mut on_b = Vec::new();
    for _ in 0..100 {
        on_b = connected_proxies(rb).await;
        on_b.retain(|p| p.control_plane == "cp-b");
        if on_b.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(on_b.len(), 3, "{on_b:?}");
    // B answers from the same state: the revision the proxies hold is current.
    assert!(
        on_b.iter().all(|p| p.applied_revision == r1.revision),
        "{on_b:?}"
    );
    // And a change through B reaches all of them.
    let r2 = apply(rb, policy(&y.url(), &x.url()), 1).await.unwrap();
    for p in proxies.iter() {
        wait_version(p, &format!("cp-{}", r2.revision)).await;
    }
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(
        sent.load(Ordering::Relaxed) > 30,
        "too little traffic: {}",
        sent.load(Ordering::Relaxed)
    );
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "failed requests during the failover"
    );
    assert_eq!(
        proxies[0].chat("m").await.header(MOCK_NAME_HEADER),
        Some("y")
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_recover_from_an_etcd_restart_without_restarting() {
    let mut etcd = EtcdServer::start("restart").await;
    let x = mock("x", Behavior::Json).await;
    let y = mock("y", Behavior::Json).await;
    let (a, b) = two_replicas(&etcd).await;
    let (ra, rb) = (a.local_addr(), b.local_addr());
    let r1 = apply(ra, policy(&x.url(), &y.url()), 0).await.unwrap();
    let on_b = managed_proxy(&[rb], "p-b", None).await;
    let on_a = managed_proxy(&[ra], "p-a", None).await;
    wait_version(&on_b, &format!("cp-{}", r1.revision)).await;
    wait_version(&on_a, &format!("cp-{}", r1.revision)).await;

    etcd.stop();
    // Writes fail with a clear error; proxies keep serving.
    let err = apply(ra, policy(&y.url(), &x.url()), 0).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    assert!(err.message().contains("store"), "{err}");
    assert_eq!(on_a.chat("m").await.status, StatusCode::OK);
    assert_eq!(on_b.chat("m").await.status, StatusCode::OK);

    etcd.resume().await;
    // The same replicas, untouched, write and follow again.
    let mut r2 = None;
    for _ in 0..100 {
        match apply(ra, policy(&y.url(), &x.url()), 0).await {
            Ok(r) => {
                r2 = Some(r);
                break;
            }
            Err(e) => assert_eq!(e.code(), tonic::Code::Unavailable, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r2 = r2.expect("replica A could not write after etcd came back");
    let v2 = format!("cp-{}", r2.revision);
    wait_version(&on_a, &v2).await;
    // B's watch resumed: the change made through A reaches B's proxy.
    eventually(Duration::from_secs(10), "B follows again", || {
        b.hub().state().revision == r2.revision
    })
    .await;
    wait_version(&on_b, &v2).await;
    assert_eq!(on_b.chat("m").await.header(MOCK_NAME_HEADER), Some("y"));
    a.shutdown().await;
    b.shutdown().await;
}

fn state(policy_version: u64) -> State {
    State {
        policy_version,
        ..State::default()
    }
}

fn record(version: u64) -> PolicyRecord {
    PolicyRecord {
        version,
        document: format!("doc {version}"),
        applied_at_unix_ms: 0,
        author: "test".into(),
        note: "apply".into(),
        ..Default::default()
    }
}

async fn next_change(rx: &mut tokio::sync::mpsc::Receiver<StoreChange>) -> StoreChange {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no change within 10 s")
        .expect("the feed ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_watch_relists_and_misses_nothing() {
    let etcd = EtcdServer::start("compact").await;
    let address = EtcdAddress::parse(&etcd.store_url("router")).unwrap();
    let writer = EtcdStore::connect(&address, &Default::default(), "w")
        .await
        .unwrap();
    let reader = EtcdStore::connect(&address, &Default::default(), "r")
        .await
        .unwrap();
    let mut revision = writer.commit(0, &state(1), Some(&record(1))).await.unwrap();
    let resume_at = reader.etcd_revision().await.unwrap() + 1;

    // Without a compaction, resuming replays each change in order.
    revision = writer
        .commit(revision, &state(2), Some(&record(2)))
        .await
        .unwrap();
    let mut resumed = reader.follow_from(resume_at);
    match next_change(&mut resumed).await {
        StoreChange::Changed(events) => {
            assert!(
                events.contains(&StoreEvent::Policy(record(2))),
                "{events:?}"
            );
            assert!(events
                .iter()
                .any(|e| matches!(e, StoreEvent::State(s) if s.revision == revision)));
        }
        other => panic!("expected the change itself, got {other:?}"),
    }
    drop(resumed);

    // Two more changes, then the history they are in is compacted away:
    // resuming from before them must relist, and the listing has them all.
    for v in 3..=4 {
        revision = writer
            .commit(revision, &state(v), Some(&record(v)))
            .await
            .unwrap();
    }
    etcd.compact().await;
    let mut resumed = reader.follow_from(resume_at);
    match next_change(&mut resumed).await {
        StoreChange::Relisted(contents) => {
            assert_eq!(contents.state.revision, revision);
            assert_eq!(contents.state.policy_version, 4);
            assert_eq!(
                contents
                    .history
                    .iter()
                    .map(|p| p.version)
                    .collect::<Vec<_>>(),
                [1, 2, 3, 4]
            );
        }
        other => panic!("expected a relist, got {other:?}"),
    }
    // And it follows on from the listing: the next write arrives as a change.
    revision = writer
        .commit(revision, &state(5), Some(&record(5)))
        .await
        .unwrap();
    match next_change(&mut resumed).await {
        StoreChange::Changed(events) => {
            assert!(events.iter().any(|e| matches!(e, StoreEvent::State(s) if s.revision == revision && s.policy_version == 5)));
        }
        other => panic!("expected the next change, got {other:?}"),
    }
    // A writer that read an old revision loses.
    assert!(matches!(
        writer.commit(revision - 1, &state(9), None).await,
        Err(router_control_plane::store::StoreError::Conflict { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuit_reports_through_both_replicas_form_one_fleet_view() {
    let etcd = EtcdServer::start("circuits").await;
    let x = mock("x", Behavior::Json).await;
    let (a, b) = two_replicas(&etcd).await;
    // A pool of twenty endpoints (reports must name endpoints of their pool).
    let endpoints: Vec<String> = (0..20).map(|i| format!("http://10.0.0.{i}:8000")).collect();
    let document = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {{name: primary, endpoints: {endpoints:?}}}\n    - {{name: fallback, endpoints: [\"{}\"]}}\n  routes: [{{name: default, chain: [primary, fallback]}}]\n",
        x.url()
    );
    apply(a.local_addr(), document, 0).await.unwrap();
    // Reports are checked against the policy, so `b` must have seen it.
    eventually(Duration::from_secs(5), "the policy on replica b", || {
        b.hub().policy(0).is_some()
    })
    .await;
    // Twenty proxies report at once, half through each replica: no report
    // is lost to a lost update.
    let until = router_control_plane::hub::now_ms() + 60_000;
    let mut reports = Vec::new();
    for i in 0..20 {
        let hub = if i % 2 == 0 {
            a.hub().clone()
        } else {
            b.hub().clone()
        };
        reports.push(tokio::spawn(async move {
            hub.report_circuit(
                &format!("proxy-{i}"),
                &pb::CircuitReport {
                    pool: "primary".into(),
                    endpoint: format!("http://10.0.0.{i}:8000"),
                    open: true,
                    until_unix_ms: until,
                    suspect: String::new(),
                },
            )
            .await
        }));
    }
    for r in reports {
        r.await.unwrap().unwrap();
    }
    for cp in [&a, &b] {
        eventually(
            Duration::from_secs(5),
            "every report on both replicas",
            || cp.hub().state().circuits.len() == 20,
        )
        .await;
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_only_work_runs_on_the_lease_holder_and_moves_when_it_stops() {
    let etcd = EtcdServer::start("lease").await;
    let x = mock("x", Behavior::Json).await;
    let (a, b) = two_replicas(&etcd).await;
    apply(a.local_addr(), policy(&x.url(), &x.url()), 0)
        .await
        .unwrap();
    let first = wait_singleton(&etcd, None).await;
    // An override that expires is pruned (by the holder) from both replicas' state.
    a.hub()
        .set_circuit("primary", &x.url(), true, 1, "operator")
        .await
        .unwrap();
    for cp in [&a, &b] {
        eventually(Duration::from_secs(5), "override pruned", || {
            cp.hub().state().circuits.is_empty()
        })
        .await;
    }
    // The holder stops: the other replica takes the lease over.
    let (stopping, staying, other) = if first == "cp-a" {
        (a, b, "cp-b")
    } else {
        (b, a, "cp-a")
    };
    stopping.shutdown().await;
    wait_singleton(&etcd, Some(other)).await;
    staying
        .hub()
        .set_circuit("primary", &x.url(), true, 1, "operator")
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "pruned by the new holder", || {
        staying.hub().state().circuits.is_empty()
    })
    .await;
    staying.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_replica_loses_its_leases_when_they_expire() {
    let etcd = EtcdServer::start("crash").await;
    let x = mock("x", Behavior::Json).await;
    let a = replica(&etcd, "cp-a").await;
    apply(a.local_addr(), policy(&x.url(), &x.url()), 0)
        .await
        .unwrap();
    // A alone holds the singleton lease and serves `lonely`.
    let lonely = managed_proxy(&[a.local_addr()], "lonely", None).await;
    wait_singleton(&etcd, Some("cp-a")).await;
    let b = replica(&etcd, "cp-b").await;
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen = fleet(b.local_addr()).await;
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen.len(), 1, "B sees A's proxy: {seen:?}");

    // A crashes: no goodbye, its leases are simply no longer renewed.
    let crashed_at = tokio::time::Instant::now();
    drop(a);
    let mut took_over = None;
    let mut vanished = None;
    while crashed_at.elapsed() < Duration::from_secs(25)
        && (took_over.is_none() || vanished.is_none())
    {
        let now = singleton_holder(&etcd).await;
        if took_over.is_none() && now.as_deref() == Some("cp-b") {
            took_over = Some(crashed_at.elapsed());
        }
        if vanished.is_none() && fleet(b.local_addr()).await.is_empty() {
            vanished = Some(crashed_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took_over = took_over.expect("B never took the singleton lease over");
    let vanished = vanished.expect("the crashed replica's proxy records never vanished");
    eprintln!("singleton taken over after {took_over:?}; records gone after {vanished:?}");
    // Not much after the leases' time to live (10 s and 15 s).
    assert!(
        took_over <= Duration::from_secs(13),
        "took over after {took_over:?}"
    );
    assert!(
        vanished <= Duration::from_secs(18),
        "records vanished after {vanished:?}"
    );
    // The proxy kept its config all along.
    assert_eq!(lonely.chat("m").await.status, StatusCode::OK);
    b.shutdown().await;
}

/// The keys of the proxy records published in etcd.
async fn published_records(etcd: &EtcdServer) -> Vec<String> {
    etcd.client()
        .await
        .range(RangeRequest {
            keys_only: true,
            ..RangeRequest::prefix("/router/proxies/")
        })
        .await
        .unwrap()
        .kvs
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

/// Issue 14 (2c, 3) with etcd: the record of a proxy gone for longer than
/// the TTL leaves etcd too, so no replica lists it any more; and every
/// replica names the one store with the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_proxys_record_leaves_etcd_after_the_ttl() {
    let etcd = EtcdServer::start("record-ttl").await;
    let limits = Limits {
        proxy_record_ttl: Duration::from_millis(500),
        ..Limits::default()
    };
    let a = replica_with(&etcd, "cp-a", limits).await;
    let b = replica_with(&etcd, "cp-b", limits).await;
    let id_a = a.hub().subscribe().borrow().store_id.clone();
    let id_b = b.hub().subscribe().borrow().store_id.clone();
    assert!(!id_a.is_empty());
    assert_eq!(id_a, id_b, "one store, one id");

    let proxy = managed_proxy(&[a.local_addr()], "short-lived", None).await;
    let key = "/router/proxies/cp-a/short-lived".to_string();
    for _ in 0..50 {
        if published_records(&etcd).await.contains(&key) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(published_records(&etcd).await.contains(&key));
    assert!(fleet(b.local_addr())
        .await
        .iter()
        .any(|p| p.node_id == "short-lived"));

    drop(proxy);
    // Gone, then dropped by cp-a after the TTL, and deleted from etcd at
    // its next publication (while cp-a, and its presence lease, live on).
    for _ in 0..100 {
        if !published_records(&etcd).await.contains(&key) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !published_records(&etcd).await.contains(&key),
        "{:?}",
        published_records(&etcd).await
    );
    assert!(fleet(b.local_addr())
        .await
        .iter()
        .all(|p| p.node_id != "short-lived"));
    drop((a, b));
}
