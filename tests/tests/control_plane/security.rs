//! Secure by default (issue 14), each attack reproduced over real gRPC on
//! 127.0.0.1: roles (a proxy token cannot administer, a pinned token
//! cannot speak for another node), bounds (records of gone proxies expire,
//! circuit reports are rate-limited, a snapshot too big for one message is
//! refused), only newer state on proxies, and bad circuit overrides
//! refused by the control plane and skipped by proxies.

use std::time::Duration;

use http::StatusCode;
use router_control_plane::store::{BackendSet, CircuitRecord, StoreChange, StoreEvent};
use router_control_plane::Limits;
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_proto::v1 as pb;
use router_proxy::Settings;
use router_tests::control::{
    admin, control_plane_with, managed, managed_proxy, policy, version_of, wait_version,
    FakeControlPlane, RawStream, TOKEN,
};
use router_tests::harness::{eventually, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::mock;

use crate::temp;

const FLEET_TOKEN: &str = "fleet-proxy-token";
const P1_TOKEN: &str = "p1-proxy-token";

fn apply_request(document: String) -> pb::ApplyPolicyRequest {
    pb::ApplyPolicyRequest {
        document,
        dry_run: false,
        expected_version: 0,
        author: "test".into(),
        ..Default::default()
    }
}

fn open_report(pool: &str, endpoint: &str, for_ms: i64) -> pb::proxy_message::Msg {
    pb::proxy_message::Msg::Circuit(pb::CircuitReport {
        pool: pool.into(),
        endpoint: endpoint.into(),
        open: true,
        until_unix_ms: router_control_plane::hub::now_ms() + for_ms,
        suspect: String::new(),
    })
}

async fn proxies(addr: std::net::SocketAddr) -> Vec<pb::ProxyStatus> {
    admin(addr, Some(TOKEN))
        .await
        .list_proxies(pb::ListProxiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .proxies
}

async fn circuits(addr: std::net::SocketAddr) -> Vec<pb::CircuitOverride> {
    admin(addr, Some(TOKEN))
        .await
        .list_circuits(pb::ListCircuitsRequest {})
        .await
        .unwrap()
        .into_inner()
        .circuits
}

/// Calls `list` every 10 ms until `done` holds of its answer (3 s at
/// most); the last answer, for the test's own assertions.
async fn until<T, F, Fut>(mut list: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut last = list().await;
    for _ in 0..300 {
        if done(&last) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        last = list().await;
    }
    last
}

/// 2b: a proxy token opens the config stream (and reports circuits) for
/// its own node, and nothing else; the operator token still works for
/// proxies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_token_opens_its_own_stream_and_nothing_else() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let dir = temp("roles");
    let cp = control_plane_with(
        &dir,
        &[(FLEET_TOKEN, None), (P1_TOKEN, Some("p1"))],
        Limits::default(),
    )
    .await;
    let addr = cp.local_addr();

    // Admin calls with a proxy token: PERMISSION_DENIED, nothing stored.
    for token in [FLEET_TOKEN, P1_TOKEN] {
        let mut as_proxy = admin(addr, Some(token)).await;
        let err = as_proxy
            .apply_policy(apply_request(policy(&a.url(), &b.url())))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
        let err = as_proxy
            .list_proxies(pb::ListProxiesRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
        let err = as_proxy
            .set_circuit(pb::SetCircuitRequest {
                pool: "primary".into(),
                endpoint: a.url(),
                open: true,
                for_seconds: 60,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    }
    assert_eq!(cp.hub().history().len(), 0);
    // An unknown token is still UNAUTHENTICATED.
    let err = admin(addr, Some("guess"))
        .await
        .history(pb::HistoryRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);

    let r = admin(addr, Some(TOKEN))
        .await
        .apply_policy(apply_request(policy(&a.url(), &b.url())))
        .await
        .unwrap()
        .into_inner();
    assert!(r.applied, "{r:?}");
    let v1 = format!("cp-{}", r.revision);

    // Proxies with the pinned token (its own node), the fleet token (any
    // node) and the operator token (backward compatibility) all get config.
    let with_token = |token: &str, node: &str| managed(format!("http://{addr}"), Some(token), node);
    let p1 = TestProxy::start(Settings::default(), with_token(P1_TOKEN, "p1")).await;
    let any = TestProxy::start(Settings::default(), with_token(FLEET_TOKEN, "any-node")).await;
    let op = managed_proxy(&[addr], "with-operator-token", None).await;
    for p in [&p1, &any, &op] {
        wait_version(p, &v1).await;
        assert_eq!(p.chat("m").await.status, StatusCode::OK);
    }

    // The pinned token cannot speak for another node id.
    let err = RawStream::open(addr, Some(P1_TOKEN), "p2")
        .await
        .err()
        .expect("a stream for p2 with p1's token is refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    // A proxy of p2 with p1's token never gets config, nor a record.
    let impostor = TestProxy::start(Settings::default(), with_token(P1_TOKEN, "p2")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(version_of(&impostor).await, "boot-1");
    assert!(
        proxies(addr).await.iter().all(|p| p.node_id != "p2"),
        "p2 has a record"
    );

    // With its own node id (or none: the pin is taken), its circuit reports
    // are stored as its own.
    let mut own = RawStream::open(addr, Some(P1_TOKEN), "").await.unwrap();
    assert_eq!(own.next().await.revision, r.revision);
    own.send(open_report("primary", &a.url(), 60_000)).await;
    let listed = until(|| circuits(addr), |l| !l.is_empty()).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].source, "p1");
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 2c: the record of a proxy gone for longer than the TTL is dropped; a
/// connected one stays however long it is quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_proxies_gone_past_the_ttl_are_dropped() {
    let dir = temp("ttl");
    let cp = control_plane_with(
        &dir,
        &[],
        Limits {
            proxy_record_ttl: Duration::from_millis(300),
            ..Limits::default()
        },
    )
    .await;
    let addr = cp.local_addr();
    let stays = RawStream::open(addr, Some(TOKEN), "stays").await.unwrap();
    let goes = RawStream::open(addr, Some(TOKEN), "goes").await.unwrap();
    let listed = until(|| proxies(addr), |l| l.len() == 2).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    drop(goes);
    // Gone, then dropped within the TTL plus a maintenance tick (1 s).
    let listed = until(|| proxies(addr), |l| l.len() == 1).await;
    assert_eq!(
        listed
            .iter()
            .map(|p| p.node_id.as_str())
            .collect::<Vec<_>>(),
        vec!["stays"],
        "{listed:?}"
    );
    // The connected one was quiet for longer than the TTL and stays.
    assert!(listed[0].connected);
    let quiet_ms = router_control_plane::hub::now_ms() - listed[0].last_seen_unix_ms;
    assert!(quiet_ms > 300, "quiet for {quiet_ms} ms only");
    drop(stays);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 2c: records are bounded in number too. An unpinned proxy token can
/// give any node id; past `max_proxy_records`, a new id replaces the
/// disconnected record seen longest ago, or is refused while every record
/// is connected. (Without the bound each invented id stayed for the TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_records_are_bounded_in_number() {
    let dir = temp("records-cap");
    let cp = control_plane_with(
        &dir,
        &[(FLEET_TOKEN, None)],
        Limits {
            max_proxy_records: 2,
            ..Limits::default()
        },
    )
    .await;
    let addr = cp.local_addr();
    let a = RawStream::open(addr, Some(FLEET_TOKEN), "a").await.unwrap();
    let _b = RawStream::open(addr, Some(FLEET_TOKEN), "b").await.unwrap();
    // Both records held by connected proxies: a third id is refused.
    let refused = RawStream::open(addr, Some(FLEET_TOKEN), "c")
        .await
        .err()
        .unwrap();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("--max-proxy-records"),
        "{refused:?}"
    );
    // A known id still reconnects.
    let _b_again = RawStream::open(addr, Some(FLEET_TOKEN), "b").await.unwrap();
    // Once `a` is gone, `c` takes its record.
    drop(a);
    let listed = until(
        || proxies(addr),
        |l| l.iter().any(|p| p.node_id == "a" && !p.connected),
    )
    .await;
    assert!(
        listed.iter().any(|p| p.node_id == "a" && !p.connected),
        "{listed:?}"
    );
    let _c = RawStream::open(addr, Some(FLEET_TOKEN), "c").await.unwrap();
    let mut nodes: Vec<String> = proxies(addr).await.into_iter().map(|p| p.node_id).collect();
    nodes.sort();
    assert_eq!(nodes, ["b", "c"]);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 2c: a proxy's circuit reports beyond its token bucket are ignored and
/// counted, so a flapping (or hostile) proxy cannot turn every report into
/// a store write and a fleet-wide push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuit_reports_beyond_the_rate_limit_are_ignored_and_counted() {
    let dir = temp("rate");
    let cp = control_plane_with(
        &dir,
        &[],
        Limits {
            circuit_report_burst: 3,
            circuit_reports_per_second: 0.001,
            ..Limits::default()
        },
    )
    .await;
    let addr = cp.local_addr();
    let endpoints: Vec<String> = (0..10).map(|i| format!("127.0.0.1:{}", 9100 + i)).collect();
    let document = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{{name: wide, endpoints: {endpoints:?}}}]\n  routes: [{{name: r, chain: [wide]}}]\n"
    );
    let r = admin(addr, Some(TOKEN))
        .await
        .apply_policy(apply_request(document))
        .await
        .unwrap()
        .into_inner();
    assert!(r.applied, "{r:?}");
    let mut flappy = RawStream::open(addr, Some(TOKEN), "flappy").await.unwrap();
    flappy.next().await;
    for e in &endpoints {
        flappy.send(open_report("wide", e, 60_000)).await;
    }
    let listed = until(
        || proxies(addr),
        |l| {
            l.iter()
                .any(|p| p.node_id == "flappy" && p.circuit_reports_dropped == 7)
        },
    )
    .await;
    assert!(
        listed
            .iter()
            .any(|p| p.node_id == "flappy" && p.circuit_reports_dropped == 7),
        "{listed:?}"
    );
    // Settle, then exactly the burst was stored.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stored = circuits(addr).await;
    assert_eq!(stored.len(), 3, "{stored:?}");
    assert_eq!(cp.hub().state().revision, r.revision + 3);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 2c: a policy whose snapshot would not fit in one gRPC message is
/// refused at apply with the reason; proxies stay on the last one (before,
/// it was stored and every proxy's stream failed on it, forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_whose_snapshot_exceeds_the_message_limit_is_refused() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let dir = temp("size");
    let cp = control_plane_with(&dir, &[], Limits::default()).await;
    let addr = cp.local_addr();
    let mut admin = admin(addr, Some(TOKEN)).await;
    let small = policy(&a.url(), &b.url());
    let r = admin
        .apply_policy(apply_request(small.clone()))
        .await
        .unwrap()
        .into_inner();
    let proxy = managed_proxy(&[addr], "p", None).await;
    wait_version(&proxy, &format!("cp-{}", r.revision)).await;
    // A big backend set (about 64 KiB), then a document that alone fits
    // in a request but not, with the backend set, in a snapshot.
    let spare: Vec<String> = (0..4000)
        .map(|i| format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256))
        .collect();
    let set = admin
        .set_backends(pb::SetBackendsRequest {
            pool: "fallback".into(),
            endpoints: spare,
            drained: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let last_good = format!("cp-{}", set.revision);
    wait_version(&proxy, &last_good).await;
    let padding = "#".repeat(1000);
    // Another document (a new name), not only longer: the same document
    // with comments added would be "unchanged", never stored.
    let mut big = small.replacen(
        "kind: RoutingPolicy\n",
        "kind: RoutingPolicy\nmetadata: {name: big}\n",
        1,
    );
    assert_ne!(big, small);
    while big.len() < router_proto::MAX_MESSAGE_BYTES - 32 * 1024 {
        big.push_str(&padding);
        big.push('\n');
    }
    let refused = admin
        .apply_policy(apply_request(big.clone()))
        .await
        .unwrap()
        .into_inner();
    assert!(!refused.applied, "{refused:?}");
    assert_eq!(refused.errors.len(), 1, "{:?}", refused.errors);
    assert_eq!(refused.errors[0].field, "document");
    assert!(
        refused.errors[0].reason.contains("gRPC message limit"),
        "{}",
        refused.errors[0].reason
    );
    // A dry run says the same.
    let dry = admin
        .apply_policy(pb::ApplyPolicyRequest {
            dry_run: true,
            ..apply_request(big)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.errors.len(), 1, "{dry:?}");
    assert_eq!(cp.hub().state().revision, set.revision);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(version_of(&proxy).await, last_good);
    assert_eq!(proxy.chat("m").await.status, StatusCode::OK);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 3: a proxy ignores a snapshot older than the one it applied from the
/// same store (a lagging replica must not roll the fleet back), NACKing it
/// with the reason; a snapshot from another store (reset or replaced) is
/// not compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_ignores_a_snapshot_older_than_the_one_it_applied() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let mut fake = FakeControlPlane::start().await;
    let proxy = TestProxy::start(
        Settings::default(),
        managed(format!("http://{}", fake.addr()), None, "p"),
    )
    .await;
    let mut stream = fake.accept().await;
    assert_eq!(stream.hello.node_id, "p");
    let snapshot = |revision: u64, store: &str, primary: &str| pb::ControlMessage {
        revision,
        nonce: format!("n{revision}"),
        store_id: store.into(),
        snapshot: Some(pb::Snapshot {
            policy_version: 1,
            policy_document: policy(primary, primary),
            ..Default::default()
        }),
        decisions: None,
        load: None,
    };
    let ack = |m: &pb::proxy_message::Msg| match m {
        pb::proxy_message::Msg::Ack(a) => Some(a.revision),
        _ => None,
    };

    let answer = stream.exchange(snapshot(5, "store-1", &a.url())).await;
    assert_eq!(ack(&answer), Some(5), "{answer:?}");
    assert_eq!(version_of(&proxy).await, "cp-5");
    assert_eq!(proxy.chat("m").await.header(MOCK_NAME_HEADER), Some("a"));

    // A lagging replica of the same store sends revision 3: not applied.
    let answer = stream.exchange(snapshot(3, "store-1", &b.url())).await;
    match &answer {
        pb::proxy_message::Msg::Nack(n) => {
            assert_eq!(n.revision, 3);
            assert!(
                n.error.contains("older than the applied revision 5"),
                "{}",
                n.error
            );
        }
        other => panic!("revision 3 after 5 was not NACKed: {other:?}"),
    }
    assert_eq!(version_of(&proxy).await, "cp-5");
    assert_eq!(proxy.chat("m").await.header(MOCK_NAME_HEADER), Some("a"));
    // The same revision again (a reconnect) is fine.
    assert_eq!(
        ack(&stream.exchange(snapshot(5, "store-1", &a.url())).await),
        Some(5)
    );

    // A store that was reset counts afresh: its revision 2 applies.
    let answer = stream.exchange(snapshot(2, "store-2", &b.url())).await;
    assert_eq!(ack(&answer), Some(2), "{answer:?}");
    assert_eq!(version_of(&proxy).await, "cp-2");
    assert_eq!(proxy.chat("m").await.header(MOCK_NAME_HEADER), Some("b"));
}

/// 13: the control plane refuses a bad circuit override with the field
/// and the reason, and ignores one a proxy reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_circuit_override_is_refused_with_its_field() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let dir = temp("bad-circuit");
    let cp = control_plane_with(&dir, &[], Limits::default()).await;
    let addr = cp.local_addr();
    let mut admin = admin(addr, Some(TOKEN)).await;
    let r = admin
        .apply_policy(apply_request(policy(&a.url(), &b.url())))
        .await
        .unwrap()
        .into_inner();
    let open = |pool: &str, endpoint: &str| pb::SetCircuitRequest {
        pool: pool.into(),
        endpoint: endpoint.into(),
        open: true,
        for_seconds: 60,
    };
    for (request, field, why) in [
        (open("primary", "127.0.0.1"), "endpoint", "missing port"),
        (open("nope", &a.url()), "pool", "no pool \"nope\""),
        (
            open("primary", &b.url()),
            "endpoint",
            "is not an endpoint of pool primary",
        ),
        (open("", ""), "pool", "required"),
    ] {
        let err = admin.set_circuit(request.clone()).await.unwrap_err();
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{request:?}: {err}"
        );
        assert!(
            err.message().contains(&format!("{field}: ")) && err.message().contains(why),
            "{request:?}: {}",
            err.message()
        );
    }
    // Clearing a typo that matches nothing is refused too.
    let err = admin
        .set_circuit(pb::SetCircuitRequest {
            open: false,
            for_seconds: 0,
            ..open("primary", "127.0.0.1")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert_eq!(cp.hub().state().revision, r.revision, "nothing stored");

    // A proxy's report of an endpoint that is not in the pool is ignored.
    let mut reporter = RawStream::open(addr, Some(TOKEN), "reporter")
        .await
        .unwrap();
    reporter.next().await;
    reporter
        .send(open_report("primary", &b.url(), 60_000))
        .await;
    reporter
        .send(open_report("primary", &a.url(), 60_000))
        .await;
    let listed = until(|| circuits(addr), |l| !l.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let listed_now = circuits(addr).await;
    assert_eq!(listed_now.len(), 1, "{listed:?} {listed_now:?}");
    assert_eq!(listed_now[0].endpoint, a.url());

    // Good overrides are stored; one whose endpoint leaves its pool goes
    // with it.
    admin.set_circuit(open("fallback", &b.url())).await.unwrap();
    let spare = mock("spare", Behavior::Json).await;
    admin
        .set_backends(pb::SetBackendsRequest {
            pool: "fallback".into(),
            endpoints: vec![spare.url()],
            drained: vec![],
        })
        .await
        .unwrap();
    let left: Vec<String> = circuits(addr)
        .await
        .into_iter()
        .map(|c| format!("{}/{}", c.pool, c.endpoint))
        .collect();
    assert_eq!(left, vec![format!("primary/{}", a.url())]);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 13: a proxy that still receives bad circuit overrides (from a control
/// plane of another version) skips and counts them and applies the rest of
/// the snapshot, instead of NACKing it whole and freezing its config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_skips_a_bad_circuit_override_and_applies_the_rest() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let spare = mock("spare", Behavior::Json).await;
    let dir = temp("skip-circuit");
    let cp = control_plane_with(&dir, &[], Limits::default()).await;
    let addr = cp.local_addr();
    cp.hub()
        .apply_policy(&policy(&a.url(), &b.url()), false, 0, "test")
        .await
        .unwrap();
    let proxy = managed_proxy(&[addr], "p", None).await;
    wait_version(&proxy, "cp-1").await;

    // As from a replica of another version: three bad overrides, one good
    // one (primary's endpoint forced open), and a new backend set.
    let until = router_control_plane::hub::now_ms() + 60_000;
    let record = |pool: &str, endpoint: &str| CircuitRecord {
        pool: pool.into(),
        endpoint: endpoint.into(),
        open: true,
        until_unix_ms: until,
        source: "operator".into(),
        suspect: String::new(),
    };
    let mut skewed = cp.hub().state();
    skewed.revision += 1;
    skewed.circuits = vec![
        record("primary", "127.0.0.1"),
        record("ghost", &a.url()),
        record("fallback", &a.url()),
        record("primary", &a.url()),
    ];
    skewed.backends.insert(
        "fallback".into(),
        BackendSet {
            endpoints: vec![spare.url()],
            drained: vec![],
        },
    );
    let revision = skewed.revision;
    cp.hub()
        .take_change(StoreChange::Changed(vec![StoreEvent::State(skewed)]));

    let v = format!("cp-{revision}");
    wait_version(&proxy, &v).await;
    eventually(WAIT_AT_MOST, "the proxy to ACK the snapshot", || {
        cp.hub()
            .proxies()
            .get("p")
            .is_some_and(|p| p.applied_revision == revision)
    })
    .await;
    assert_eq!(cp.hub().proxies()["p"].nacked_revision, 0);
    // The good override applies (primary open: the new fallback answers).
    let r = proxy.chat("m").await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("spare"));
    assert_eq!(r.header("x-router-attempts"), Some("1"));
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("router_config_circuit_overrides_skipped_total 3"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("skipped"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}
