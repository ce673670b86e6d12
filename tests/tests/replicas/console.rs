//! The console's Decisions and Pools pages with two replicas on one etcd,
//! a managed proxy on each: the pages of one replica show the proxies of
//! both (the other's through `queries/` and `answers/` in etcd, nothing
//! left behind); a replica that stopped answering is named, its proxy
//! listed as not answering, and the page does not wait past its wait.

use std::time::Duration;

use http::{Method, StatusCode};
use router_control_plane::{start, ConsoleOptions, ControlPlaneOptions, RunningControlPlane};
use router_etcd::pb::etcdserverpb::RangeRequest;
use router_mock::Behavior;
use router_tests::control::{managed_proxy, policy, wait_version};
use router_tests::etcd::EtcdServer;
use router_tests::harness::{TestClient, TestProxy};
use router_tests::mocks::mock;

use super::{apply, fleet, replica, replica_options};

/// A replica with a console on loopback.
async fn replica_with_console(
    etcd: &EtcdServer,
    node: &str,
) -> router_control_plane::RunningControlPlane {
    start(ControlPlaneOptions {
        console: ConsoleOptions {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            ..ConsoleOptions::default()
        },
        ..replica_options(etcd, node)
    })
    .await
    .unwrap()
}

/// Replica `cp-a` (with a console) and `cp-b` on `etcd`, a policy applied,
/// proxy `p-a` on A and `p-b` on B serving it, `on_a` requests through
/// `p-a` and `on_b` through `p-b`, and `p-b` listed through `cp-b`.
async fn two_replicas_with_traffic(
    etcd: &EtcdServer,
    on_a: usize,
    on_b: usize,
) -> (
    RunningControlPlane,
    RunningControlPlane,
    TestProxy,
    TestProxy,
) {
    let x = mock("x", Behavior::Json).await;
    let a = replica_with_console(etcd, "cp-a").await;
    let b = replica(etcd, "cp-b").await;
    let (ra, rb) = (a.local_addr(), b.local_addr());
    let r = apply(ra, policy(&x.url(), &x.url()), 0).await.unwrap();
    let pa = managed_proxy(&[ra], "p-a", None).await;
    let pb = managed_proxy(&[rb], "p-b", None).await;
    for p in [&pa, &pb] {
        wait_version(p, &format!("cp-{}", r.revision)).await;
    }
    traffic(&pa, on_a).await;
    traffic(&pb, on_b).await;
    wait_listed(ra, "p-b", "cp-b").await;
    (a, b, pa, pb)
}

/// Waits (5 s at most) until the replica at `cp` lists `node` as connected
/// through `replica` (its presence record is published).
async fn wait_listed(cp: std::net::SocketAddr, node: &str, replica: &str) {
    for _ in 0..50 {
        if fleet(cp)
            .await
            .iter()
            .any(|p| p.node_id == node && p.connected && p.control_plane == replica)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{node} never listed through {replica}: {:?}",
        fleet(cp).await
    );
}

/// `n` requests through `proxy`, each answered.
async fn traffic(proxy: &TestProxy, n: usize) {
    for _ in 0..n {
        let r = proxy.chat("m").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
}

/// The keys left under `/router/<what>/`.
async fn keys_under(etcd: &EtcdServer, what: &str) -> Vec<String> {
    etcd.client()
        .await
        .range(RangeRequest {
            keys_only: true,
            ..RangeRequest::prefix(format!("/router/{what}/"))
        })
        .await
        .unwrap()
        .kvs
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

/// A console page, signed in with a one-time link of `cp`.
async fn page(cp: &router_control_plane::RunningControlPlane, path: &str) -> String {
    let console = cp.console_url().unwrap();
    let client = TestClient::new();
    let link = cp.console_signin_link().unwrap();
    let r = client.send(Method::GET, &link, &[], String::new()).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let cookie = r
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("router_console="))
        .map(|rest| rest.split(';').next().unwrap_or_default().to_string())
        .unwrap();
    let cookie = format!("router_console={cookie}");
    let r = client
        .send(
            Method::GET,
            &format!("{console}{path}"),
            &[("cookie", cookie.as_str())],
            String::new(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decisions_and_pools_of_one_replica_show_the_proxies_of_every_replica() {
    let etcd = EtcdServer::start("console-fleet").await;
    let (a, b, _on_a, _on_b) = two_replicas_with_traffic(&etcd, 3, 2).await;

    // Decisions through A: A's own proxy, and B's through B.
    let wait = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let d = a.hub().fleet_decisions(256, 1024 * 1024, wait).await;
    let took = started.elapsed();
    assert!(d.silent.is_empty() && !d.unasked, "{d:?}");
    let seen: Vec<(&str, &str, usize, bool)> = d
        .proxies
        .iter()
        .map(|p| {
            (
                p.node.as_str(),
                p.replica.as_str(),
                p.lines.len(),
                p.complete,
            )
        })
        .collect();
    assert_eq!(seen, [("p-a", "", 3, true), ("p-b", "cp-b", 2, true)]);
    for line in &d.proxies[1].lines {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(record["route"], "default", "{line}");
        assert_eq!(record["status"], 200, "{line}");
    }
    // Every replica answered: no waiting out the wait.
    eprintln!("decisions of both replicas' proxies through A in {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");

    // Load through A likewise.
    let l = a.hub().fleet_load(Duration::from_secs(1)).await;
    assert!(l.silent.is_empty() && !l.unasked, "{l:?}");
    let seen: Vec<(&str, &str)> = l
        .proxies
        .iter()
        .map(|p| (p.node.as_str(), p.replica.as_str()))
        .collect();
    assert_eq!(seen, [("p-a", ""), ("p-b", "cp-b")]);
    for p in &l.proxies {
        let load = p
            .load
            .as_ref()
            .unwrap_or_else(|| panic!("{} did not answer", p.node));
        assert!(
            load.pools.iter().any(|pool| pool.name == "primary"),
            "{load:?}"
        );
    }

    // The pages of A say the same.
    let html = page(&a, "/decisions").await;
    assert!(
        html.contains(r#"data-node="p-b" data-replica="cp-b""#),
        "{html}"
    );
    assert!(html.contains("p-b (through cp-b): 2 record(s)"), "{html}");
    assert!(
        html.contains(r#"data-node="p-a" data-replica="""#),
        "{html}"
    );
    assert!(!html.contains("did not answer"), "{html}");
    let html = page(&a, "/pools").await;
    assert!(
        html.contains(r#"data-asked="2" data-answered="2""#),
        "{html}"
    );

    // Nothing is left behind in etcd: each query's lease took its keys.
    assert_eq!(keys_under(&etcd, "queries").await, Vec::<String>::new());
    assert_eq!(keys_under(&etcd, "answers").await, Vec::<String>::new());
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stopped_answering_is_named_and_the_page_waits_no_longer_than_its_wait() {
    let etcd = EtcdServer::start("console-silent").await;
    let (a, b, _on_a, _on_b) = two_replicas_with_traffic(&etcd, 2, 1).await;
    // B answers while it runs.
    let d = a
        .hub()
        .fleet_decisions(256, 1024 * 1024, Duration::from_secs(2))
        .await;
    assert_eq!(d.proxies.len(), 2, "{d:?}");

    // B is killed: no goodbye, its presence records stay until their
    // lease expires (15 s), and nothing answers for it.
    drop(b);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let wait = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let d = a.hub().fleet_decisions(256, 1024 * 1024, wait).await;
    let took = started.elapsed();
    eprintln!("decisions with B silent: {took:?} (wait {wait:?})");
    assert!(
        took >= wait - Duration::from_millis(100),
        "gave up early: {took:?}"
    );
    assert!(
        took < wait + Duration::from_millis(700),
        "held past its wait: {took:?}"
    );
    assert_eq!(d.silent, ["cp-b"]);
    let seen: Vec<(&str, &str, usize, bool)> = d
        .proxies
        .iter()
        .map(|p| {
            (
                p.node.as_str(),
                p.replica.as_str(),
                p.lines.len(),
                p.complete,
            )
        })
        .collect();
    assert_eq!(seen, [("p-a", "", 2, true), ("p-b", "cp-b", 0, false)]);

    let wait = Duration::from_secs(1);
    let started = tokio::time::Instant::now();
    let l = a.hub().fleet_load(wait).await;
    let took = started.elapsed();
    assert!(
        took < wait + Duration::from_millis(700),
        "held past its wait: {took:?}"
    );
    assert_eq!(l.silent, ["cp-b"]);
    assert!(
        l.proxies[0].node == "p-a" && l.proxies[0].load.is_some(),
        "{l:?}"
    );
    assert!(
        l.proxies[1].node == "p-b" && l.proxies[1].load.is_none(),
        "{l:?}"
    );

    // The pages name the replica, and its proxy as not answering.
    let html = page(&a, "/decisions").await;
    assert!(
        html.contains("replicas that did not answer in time: cp-b"),
        "{html}"
    );
    assert!(
        html.contains("p-b (through cp-b) did not answer in time"),
        "{html}"
    );
    let html = page(&a, "/pools").await;
    assert!(
        html.contains(r#"data-asked="2" data-answered="1""#),
        "{html}"
    );
    assert!(html.contains("did not answer within 1 s: cp-b"), "{html}");
    assert!(html.contains("p-b (through cp-b)"), "{html}");
    a.shutdown().await;
}
