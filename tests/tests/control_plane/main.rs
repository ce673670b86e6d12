//! The control plane with managed proxies, all in-process on 127.0.0.1:
//! apply reaches every proxy; invalid policies, NACKs, conflicts and
//! missing tokens; the control plane going away and coming back; circuits
//! shared across the fleet; its handle on the proxies' shared store.

#![allow(clippy::unwrap_used)]

mod fleet_health;
mod keys;
mod marks;
mod security;
mod shared_store_admin;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::StatusCode;
use router_control_plane::store::{BackendSet, StoreChange, StoreEvent};
use router_control_plane::{start, ControlPlaneOptions, RunningControlPlane};
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_proto::v1 as pb;
use router_proxy::managed::ManagedOptions;
use router_proxy::{Mode, Settings};
use router_tests::control::{
    admin, managed, managed_options, managed_proxy, policy, version_of, wait_revision,
    wait_version, TOKEN,
};
use router_tests::harness::{eventually, TcpRelay, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::mock;

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("router-cp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

async fn control_plane(dir: &Path, listen: SocketAddr) -> RunningControlPlane {
    start(ControlPlaneOptions {
        listen,
        store: router_control_plane::StoreLocation::Embedded(dir.to_path_buf()),
        token: Some(TOKEN.into()),
        tls: None,
        guards: Default::default(),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// A control plane on loopback serving `policy(primary, fallback)`, and
/// an operator's admin client.
async fn serving(
    dir: &Path,
    primary: &str,
    fallback: &str,
) -> (RunningControlPlane, router_tests::control::Admin) {
    let cp = control_plane(dir, "127.0.0.1:0".parse().unwrap()).await;
    let mut admin = admin(cp.local_addr(), Some(TOKEN)).await;
    admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(primary, fallback),
            ..Default::default()
        })
        .await
        .unwrap();
    (cp, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_reaches_every_proxy_and_bad_changes_do_not() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let dir = temp("apply");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let addr = cp.local_addr();
    let mut admin = admin(addr, Some(TOKEN)).await;
    let proxies = [
        managed_proxy(&[addr], "p1", None).await,
        managed_proxy(&[addr], "p2", None).await,
        managed_proxy(&[addr], "p3", None).await,
    ];

    let r = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(&a.url(), &b.url()),
            dry_run: false,
            expected_version: 0,
            author: "test".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.applied && r.errors.is_empty(), "{r:?}");
    assert_eq!(r.version, 1);
    let v1 = format!("cp-{}", r.revision);
    for p in &proxies {
        wait_version(p, &v1).await;
        let resp = p.chat("m").await;
        assert_eq!(resp.status, StatusCode::OK);
        assert_eq!(resp.header("x-router-config-version"), Some(v1.as_str()));
    }
    // Every proxy ACKed.
    let mut listed = Vec::new();
    for _ in 0..100 {
        listed = admin
            .list_proxies(pb::ListProxiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .proxies;
        if listed.len() == 3 && listed.iter().all(|p| p.applied_revision == r.revision) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(listed.len(), 3);
    assert!(
        listed
            .iter()
            .all(|p| p.connected && p.applied_revision == r.revision),
        "{listed:?}"
    );

    // An invalid policy is refused at apply with its field errors; nothing moves.
    let bad = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(&a.url(), &b.url())
                .replace("chain: [primary, fallback]", "chain: [primary, nowhere]"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!bad.applied);
    assert_eq!(bad.errors[0].field, "spec.routes[0].chain[1]");
    // Nothing was stored, so there is nothing to send: the proxies stay on
    // v1 (and the next change below reaches them as the very next revision).
    assert_eq!(cp.hub().state().revision, r.revision);
    assert_eq!(cp.hub().history().len(), 1);
    for p in &proxies {
        assert_eq!(version_of(p).await, v1);
    }

    // A stale expected version is a conflict.
    let stale = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(&a.url(), &b.url()),
            expected_version: 7,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::Aborted, "{stale}");

    // A policy that drops a pool drops that pool's backend set too (a
    // snapshot with a set for an unknown pool is one proxies refuse).
    admin
        .set_backends(pb::SetBackendsRequest {
            pool: "fallback".into(),
            endpoints: vec![b.url()],
            drained: vec![],
        })
        .await
        .unwrap();
    for p in &proxies {
        wait_version(p, &format!("cp-{}", r.revision + 1)).await;
    }
    let only_primary = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{{name: primary, endpoints: [\"{}\"]}}]\n  routes: [{{name: default, chain: [primary]}}]\n",
        a.url()
    );
    let applied = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: only_primary,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(applied.applied);
    let good_version = format!("cp-{}", applied.revision);
    for p in &proxies {
        wait_version(p, &good_version).await;
    }
    let pools = admin
        .list_backends(pb::ListBackendsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pools;
    assert!(pools.iter().all(|p| p.pool != "fallback"), "{pools:?}");

    // A snapshot the proxies cannot apply (as from a replica of another
    // version: a backend set for a pool the policy lacks): they NACK it and
    // keep serving the last good config.
    let mut skewed = cp.hub().state();
    skewed.revision += 1;
    skewed.backends.insert(
        "ghost".into(),
        BackendSet {
            endpoints: vec![b.url()],
            drained: vec![],
        },
    );
    let bad_revision = skewed.revision;
    cp.hub()
        .take_change(StoreChange::Changed(vec![StoreEvent::State(skewed)]));
    let mut nacked = Vec::new();
    for _ in 0..200 {
        nacked = admin
            .list_proxies(pb::ListProxiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .proxies;
        if nacked.iter().all(|p| p.nacked_revision == bad_revision) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for p in &nacked {
        assert_eq!(p.nacked_revision, bad_revision, "{nacked:?}");
        assert!(p.last_nack.contains("unknown pool"), "{}", p.last_nack);
    }
    for p in &proxies {
        assert_eq!(version_of(p).await, good_version);
        assert_eq!(p.chat("m").await.status, StatusCode::OK);
    }
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_the_token_are_refused() {
    let dir = temp("auth");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let mut anonymous = admin(cp.local_addr(), None).await;
    let err = anonymous.history(pb::HistoryRequest {}).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let mut wrong = admin(cp.local_addr(), Some("nope")).await;
    let err = wrong
        .list_proxies(pb::ListProxiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_outlive_the_control_plane_which_keeps_its_history() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let dir = temp("restart");
    let cache = temp("restart-cache");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let addr = cp.local_addr();
    let mut admin1 = admin(addr, Some(TOKEN)).await;
    let doc1 = policy(&a.url(), &b.url());
    let doc2 = doc1.replace("chain: [primary, fallback]", "chain: [fallback, primary]");
    for doc in [&doc1, &doc2] {
        admin1
            .apply_policy(pb::ApplyPolicyRequest {
                document: doc.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let proxy = managed_proxy(&[addr], "survivor", Some(cache.clone())).await;
    wait_version(&proxy, "cp-2").await;
    assert_eq!(proxy.chat("m").await.header(MOCK_NAME_HEADER), Some("b"));

    // The control plane goes away: no request fails.
    drop(admin1);
    cp.shutdown().await;
    for _ in 0..50 {
        assert_eq!(proxy.chat("m").await.status, StatusCode::OK);
    }
    // A proxy started while it is down serves from its disk cache.
    let restarted = managed_proxy(&[addr], "restarted", Some(cache.clone())).await;
    assert_eq!(version_of(&restarted).await, "cp-2");
    assert_eq!(
        restarted.chat("m").await.header(MOCK_NAME_HEADER),
        Some("b")
    );

    // The control plane comes back on the same address with its history;
    // a rollback reaches the proxies that reconnect.
    let cp = control_plane(&dir, addr).await;
    let mut admin2 = admin(addr, Some(TOKEN)).await;
    let history = admin2
        .history(pb::HistoryRequest {})
        .await
        .unwrap()
        .into_inner()
        .versions;
    assert_eq!(
        history.iter().map(|v| v.version).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let rb = admin2
        .rollback(pb::RollbackRequest {
            to_version: 1,
            expected_version: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rb.version, 3);
    let current = admin2
        .get_policy(pb::GetPolicyRequest { version: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(current.document, doc1);
    assert_eq!(current.note, "rollback to 1");
    for p in [&proxy, &restarted] {
        wait_version(p, &format!("cp-{}", rb.revision)).await;
        assert_eq!(p.chat("m").await.header(MOCK_NAME_HEADER), Some("a"));
    }
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&cache);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_reported_by_one_proxy_stops_the_others() {
    let dead = mock("dead", Behavior::Status(500)).await;
    let ok = mock("ok", Behavior::Json).await;
    let dir = temp("circuits");
    let (cp, mut admin) = serving(&dir, &dead.url(), &ok.url()).await;
    let addr = cp.local_addr();
    let p1 = managed_proxy(&[addr], "p1", None).await;
    let p2 = managed_proxy(&[addr], "p2", None).await;
    wait_version(&p1, "cp-1").await;
    wait_version(&p2, "cp-1").await;
    // p1 sees two failures: its circuit opens and it tells the fleet. (At
    // once: after the first, the pool's only endpoint is suspect and a
    // walk with a clean pool later passes over it.)
    dead.set_latency(Duration::from_millis(200));
    let (a, b) = tokio::join!(p1.chat("m"), p1.chat("m"));
    for r in [a, b] {
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("ok"));
    }
    assert_eq!(dead.stats().received, 2);
    let mut circuits = Vec::new();
    for _ in 0..200 {
        circuits = admin
            .list_circuits(pb::ListCircuitsRequest {})
            .await
            .unwrap()
            .into_inner()
            .circuits;
        if circuits.iter().any(|c| c.suspect.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first failure made it suspect (its first request there), the
    // second opened p1's circuit: both shared, kept apart.
    let (suspects, circuits): (Vec<_>, Vec<_>) =
        circuits.into_iter().partition(|c| !c.suspect.is_empty());
    assert_eq!(circuits.len(), 1, "{circuits:?}");
    assert_eq!(circuits[0].source, "p1");
    assert_eq!(circuits[0].endpoint, dead.url());
    assert_eq!(suspects.len(), 1, "{suspects:?}");
    assert_eq!(suspects[0].suspect, "attempt");
    wait_revision(&p2, 3).await;
    // p2 never sends to the dead endpoint.
    for _ in 0..5 {
        let r = p2.chat("m").await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("ok"));
        assert_eq!(r.header("x-router-attempts"), Some("1"));
    }
    assert_eq!(dead.stats().received, 2);
    assert_eq!(p2.health().await["backends"][0]["circuit"], "open");
    // Backend sets change at the control plane (`routerctl backends set`;
    // a managed proxy refuses set-backends), and every proxy learns them.
    let spare = mock("spare", Behavior::Json).await;
    let changed = admin
        .set_backends(pb::SetBackendsRequest {
            pool: "fallback".into(),
            endpoints: vec![spare.url()],
            drained: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    wait_revision(&p2, changed.revision).await;
    let r = p2.chat("m").await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("spare"));
    // An operator closes it again.
    let changed = admin
        .set_circuit(pb::SetCircuitRequest {
            pool: "primary".into(),
            endpoint: dead.url(),
            open: false,
            for_seconds: 0,
        })
        .await
        .unwrap()
        .into_inner();
    wait_revision(&p2, changed.revision).await;
    let health = p2.health().await;
    assert_eq!(health["backends"][0]["circuit"], "closed");
    // Closing it clears the suspicion too.
    assert_eq!(health["backends"][0]["suspect"], serde_json::Value::Null);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_can_serve_tls() {
    let a = mock("a", Behavior::Json).await;
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = temp("tls");
    let cp = start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: router_control_plane::StoreLocation::Embedded(dir.clone()),
        token: Some(TOKEN.into()),
        tls: Some((ck.cert.pem(), ck.signing_key.serialize_pem())),
        guards: Default::default(),
        ..Default::default()
    })
    .await
    .unwrap();
    let url = format!("https://localhost:{}", cp.local_addr().port());
    cp.hub()
        .apply_policy(&policy(&a.url(), &a.url()), false, 0, "test")
        .await
        .unwrap();
    let trusted = TestProxy::start(
        Settings::default(),
        Mode::Managed(ManagedOptions {
            ca_pem: Some(ck.cert.pem()),
            ..managed_options(url, Some(TOKEN), "tls")
        }),
    )
    .await;
    wait_version(&trusted, "cp-1").await;
    // Without the CA the certificate is refused: the proxy stays on its boot
    // config. It dials through a relay, to see when its first attempt ended.
    let relay = TcpRelay::start(cp.local_addr()).await;
    let untrusting = TestProxy::start(
        Settings::default(),
        managed(
            format!("https://localhost:{}", relay.addr().port()),
            Some(TOKEN),
            "no-ca",
        ),
    )
    .await;
    eventually(
        WAIT_AT_MOST,
        "the first connection of the proxy without the CA to end (its TLS handshake refused)",
        || relay.closed() >= 1,
    )
    .await;
    assert_eq!(version_of(&untrusting).await, "boot-1");
    // Its health says why it has no config (issue 20, item 1).
    let h = untrusting
        .wait_health("the TLS refusal", |h| {
            h["reason"]
                .as_str()
                .is_some_and(|r| r.contains("UnknownIssuer"))
        })
        .await;
    assert_eq!(h["ok"], false);

    // routerctl's errors say what to fix (issue 20, item 11): the CA for
    // an untrusted certificate, https:// for a TLS server called in clear.
    let https = format!("https://localhost:{}", cp.local_addr().port());
    let e = routerctl::admin_cmd::connect(&https, Some(TOKEN.into()), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(e, routerctl::error::CliError::Unreachable(_)),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("not trusted") && e.contains("--ca-file"), "{e}");
    let plain = format!("http://localhost:{}", cp.local_addr().port());
    let status = match routerctl::admin_cmd::connect(&plain, Some(TOKEN.into()), None).await {
        Ok(mut admin) => admin
            .list_proxies(pb::ListProxiesRequest {})
            .await
            .err()
            .map(|s| routerctl::admin_cmd::explain_status(&s)),
        Err(e) => Some(e.to_string()),
    };
    let said = status.unwrap();
    assert!(said.contains("https://"), "{said}");
    let mut trusted_admin =
        routerctl::admin_cmd::connect(&https, Some(TOKEN.into()), Some(&ck.cert.pem()))
            .await
            .unwrap();
    let conflict = trusted_admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(&a.url(), &a.url()).replace(
                "kind: RoutingPolicy\n",
                "kind: RoutingPolicy\nmetadata: {name: x}\n",
            ),
            expected_version: 7,
            ..Default::default()
        })
        .await
        .unwrap_err();
    let said = routerctl::admin_cmd::explain_status(&conflict);
    assert!(
        said.starts_with("conflict: the current policy version is 1, not 7"),
        "{said}"
    );
    assert!(
        !said.contains("conflict: conflict") && !said.contains("Aborted"),
        "{said}"
    );
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The control plane's backend sets.
async fn backends(admin: &mut router_tests::control::Admin) -> Vec<pb::PoolBackends> {
    admin
        .list_backends(pb::ListBackendsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pools
}

/// Issue 14, doors: a managed proxy used to forward `set-backends` to the
/// control plane with its own `ROUTER_TOKEN`, so anyone who could reach
/// any proxy's port could send the whole fleet's prompts (and the pool's
/// API key) to an address of their choice. Now the call is refused: 401
/// without an admin token (naming the variable to set), 403 with one
/// (backend sets belong to the control plane), and the fleet's backend
/// sets stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_proxy_never_lends_its_token_to_set_backends() {
    let primary = mock("primary", Behavior::Json).await;
    let fallback = mock("fallback", Behavior::Json).await;
    let dir = temp("lend-token");
    let (cp, mut admin) = serving(&dir, &primary.url(), &fallback.url()).await;
    let addr = cp.local_addr();
    let before = backends(&mut admin).await;
    let attack = r#"{"pool": "fallback", "backends": ["http://evil.example:80"]}"#;

    // As deployed by default: no admin token.
    let settings = Settings {
        bind: [127, 0, 0, 1].into(),
        ..Settings::default()
    };
    let mode = |node: &str| managed(format!("http://{addr}"), Some(TOKEN), node);
    let open = TestProxy::start_as_given(settings.clone(), mode("open")).await;
    wait_version(&open, "cp-1").await;
    let r = open
        .client
        .send(
            http::Method::POST,
            &open.url("/_custom_router/set-backends"),
            &[],
            attack,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    assert_eq!(r.error_type(), "unauthorized");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("CUSTOM_ROUTER_ADMIN_TOKEN"),
        "{}",
        r.text()
    );
    assert_eq!(backends(&mut admin).await, before);
    let r = open
        .client
        .send(
            http::Method::POST,
            &open.url("/_custom_router/explain"),
            &[],
            r#"{"risk": "READ"}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    // Unauthenticated health: ok, version, counts; no addresses.
    let h = open
        .client
        .send(
            http::Method::GET,
            &open.url("/_custom_router/health"),
            &[],
            "",
        )
        .await
        .json();
    assert_eq!(h["ok"], true);
    assert_eq!(h["config_version"], "cp-1");
    assert_eq!(h["pool_count"], 2);
    assert_eq!(h["backend_count"], 2);
    assert!(h.get("backends").is_none(), "{h}");
    assert!(!h.to_string().contains(&primary.url()), "{h}");

    // With an admin token, presented: still refused, pointing at routerctl.
    let guarded = TestProxy::start_as_given(
        Settings {
            admin_token: Some("proxy-admin".into()),
            ..settings
        },
        mode("guarded"),
    )
    .await;
    wait_version(&guarded, "cp-1").await;
    let r = guarded
        .client
        .send(
            http::Method::POST,
            &guarded.url("/_custom_router/set-backends"),
            &[("authorization", "Bearer proxy-admin")],
            attack,
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    assert_eq!(r.error_type(), "forbidden");
    assert!(r.text().contains("routerctl backends set"), "{}", r.text());
    assert_eq!(backends(&mut admin).await, before);
    // The token shows the backend list.
    let h = guarded.health().await;
    assert_eq!(h["backends"][0]["addr"], primary.url());
    // Traffic still goes where the operator said.
    assert_eq!(
        open.chat("m").await.header(MOCK_NAME_HEADER),
        Some("primary")
    );
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14, token details: a `ROUTER_TOKEN` read from a file keeps its
/// newline; the proxy used to build a header from it, fail, and connect
/// without any token. It is trimmed as the control plane trims its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_token_with_its_file_newline_still_authenticates() {
    let ok = mock("ok", Behavior::Json).await;
    let dir = temp("token-newline");
    let (cp, _admin) = serving(&dir, &ok.url(), &ok.url()).await;
    let addr = cp.local_addr();
    let proxy = TestProxy::start(
        Settings::default(),
        managed(
            format!("http://{addr}"),
            Some(&format!("{TOKEN}\n")),
            "newline",
        ),
    )
    .await;
    wait_version(&proxy, "cp-1").await;
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14, items 4 and 8: the control plane checks policies and backend
/// sets against its own guards (the variables the proxies read); a proxy
/// whose guards are narrower NACKs what it does not allow, with the field
/// and the reason, and keeps serving its last good config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_checks_its_guards_and_a_stricter_proxy_nacks() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let dir = temp("guards");
    let cp = start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: router_control_plane::StoreLocation::Embedded(dir.clone()),
        token: Some(TOKEN.into()),
        tls: None,
        guards: router_policy::Guards::from_lookup(|k| {
            (k == "CUSTOM_ROUTER_API_KEY_ENV_ALLOW").then(|| "HF_TOKEN".into())
        })
        .unwrap(),
        ..Default::default()
    })
    .await
    .unwrap();
    let addr = cp.local_addr();
    let mut admin = admin(addr, Some(TOKEN)).await;
    let proxy = managed_proxy(&[addr], "strict", None).await;
    let with_key = |var: &str| {
        policy(&a.url(), &b.url()).replace(
            "    - name: primary\n",
            &format!("    - name: primary\n      api_key_env: {var}\n"),
        )
    };

    // Refused by the control plane itself.
    let r = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: with_key("AWS_SECRET_ACCESS_KEY"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.applied);
    assert_eq!(r.errors[0].field, "spec.pools[0].api_key_env", "{r:?}");
    assert!(r.errors[0].reason.contains("_API_KEY"), "{r:?}");
    let good = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(&a.url(), &b.url()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(good.applied, "{good:?}");
    let good_version = format!("cp-{}", good.revision);
    wait_version(&proxy, &good_version).await;
    let refused = admin
        .set_backends(pb::SetBackendsRequest {
            pool: "primary".into(),
            endpoints: vec!["169.254.169.254:80".into()],
            drained: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("endpoints[0]") && refused.message().contains("link-local"),
        "{}",
        refused.message()
    );

    // Allowed by the control plane, not by this proxy: NACKed with why.
    let wider = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: with_key("HF_TOKEN"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(wider.applied, "{wider:?}");
    let mut listed = Vec::new();
    for _ in 0..300 {
        listed = admin
            .list_proxies(pb::ListProxiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .proxies;
        if listed.iter().any(|p| p.nacked_revision == wider.revision) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let strict = listed.iter().find(|p| p.node_id == "strict").unwrap();
    assert_eq!(strict.nacked_revision, wider.revision, "{listed:?}");
    assert!(
        strict.last_nack.contains("spec.pools[0].api_key_env")
            && strict.last_nack.contains("HF_TOKEN"),
        "{}",
        strict.last_nack
    );
    assert_eq!(version_of(&proxy).await, good_version);
    assert_eq!(proxy.chat("m").await.status, StatusCode::OK);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 20, item 1: a managed proxy with nothing to serve says so. With a
/// token the control plane refuses, health answers 503 and names
/// ROUTER_TOKEN (it used to answer 200 `boot-1`, so readiness sent it
/// traffic that all got `no_backend`); with a good token but no policy
/// applied yet, 503 says to apply one; once a policy arrives, 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_proxy_without_config_is_not_ready_and_says_why() {
    let ok = mock("ok", Behavior::Json).await;
    let dir = temp("not-ready");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let addr = cp.local_addr();
    let with_token = |token: &str, node: &str| managed(format!("http://{addr}"), Some(token), node);
    let refused =
        TestProxy::start(Settings::default(), with_token("not-the-token", "refused")).await;
    let h = refused
        .wait_health("the refusal", |h| {
            h["reason"]
                .as_str()
                .is_some_and(|r| r.contains("ROUTER_TOKEN"))
        })
        .await;
    assert_eq!(h["ok"], false, "{h}");
    assert!(
        h["reason"].as_str().unwrap().contains("refused the token"),
        "{h}"
    );
    let r = refused
        .client
        .send(
            http::Method::GET,
            &refused.url("/_custom_router/health"),
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);

    let waiting = TestProxy::start(Settings::default(), with_token(TOKEN, "waiting")).await;
    let h = waiting
        .wait_health("no policy yet", |h| {
            h["reason"]
                .as_str()
                .is_some_and(|r| r.contains("no policy yet"))
        })
        .await;
    assert_eq!(h["ok"], false, "{h}");
    let mut admin = admin(addr, Some(TOKEN)).await;
    admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(&ok.url(), &ok.url()),
            ..Default::default()
        })
        .await
        .unwrap();
    let h = waiting.wait_health("ready", |h| h["ok"] == true).await;
    assert!(h.get("reason").is_none(), "{h}");
    assert_eq!(waiting.chat("m").await.status, StatusCode::OK);
    // The refused one stays not ready.
    assert_eq!(refused.health().await["ok"], false);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A control plane reading the proxies' shared store at `redis`, serving a
/// policy with one priced pool at `backend` and tenant `team-a` (key
/// `rt_a`, $10 a day); and an operator's admin client.
async fn budget_control_plane(
    dir: &Path,
    redis: &str,
    backend: &str,
) -> (RunningControlPlane, router_tests::control::Admin) {
    let cp = start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: router_control_plane::StoreLocation::Embedded(dir.to_path_buf()),
        token: Some(TOKEN.into()),
        shared_store: Some(redis.to_string()),
        ..Default::default()
    })
    .await
    .unwrap();
    let policy = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: local\n      endpoints: [\"{backend}\"]\n      price: {{input_per_1k_usd: 1.0, output_per_1k_usd: 1.0}}\n  routes:\n    - name: default\n      chain: [local]\n  tenants:\n    - name: team-a\n      keys: [\"{}\"]\n      limits: {{budget_usd_per_day: 10}}\n",
        router_policy::tenant::key_hash_text("rt_a")
    );
    let mut operator = admin(cp.local_addr(), Some(TOKEN)).await;
    operator
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy,
            ..Default::default()
        })
        .await
        .unwrap();
    (cp, operator)
}

/// `routerctl tenants usage`: the control plane reads a tenant's spend
/// from the store the proxies share (settled spend, reservations in
/// flight); without `--shared-store` it says where the spend lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_usage_is_read_from_the_proxies_shared_store() {
    let redis = router_tests::redis::RedisServer::start("usage").await;
    let backend = mock("local", Behavior::Json).await;
    let dir = temp("usage");
    let (cp, mut operator) = budget_control_plane(&dir, &redis.url(), &backend.url()).await;
    let body = r#"{"model":"m","max_tokens":5,"messages":[]}"#;
    let call = (body.len() as i64 + 3) / 4 * 1000 + 5 * 1000;
    let settings = Settings {
        shared_store: Some(router_proxy::SharedStore::new(&redis.url()).unwrap()),
        ..Settings::default()
    };
    let proxy = TestProxy::start(
        settings,
        managed(format!("http://{}", cp.local_addr()), Some(TOKEN), "u1"),
    )
    .await;
    wait_version(&proxy, "cp-1").await;
    eventually(WAIT_AT_MOST, "store connected", || {
        proxy.proxy.shared_store_connected()
    })
    .await;
    let r = proxy
        .chat_with(&[("authorization", "Bearer rt_a")], body)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let mut usage = pb::TenantUsageResponse::default();
    for _ in 0..100 {
        usage = operator
            .tenant_usage(pb::TenantUsageRequest {
                tenant: "team-a".into(),
            })
            .await
            .unwrap()
            .into_inner();
        if usage.reserved_micros == 0 && usage.spent_today_micros > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(usage.spent_today_micros, call, "{usage:?}");
    assert_eq!(usage.spent_month_micros, call, "{usage:?}");
    assert_eq!(usage.reserved_micros, 0);
    // Issue 30, item 8: a tenant the policy does not name is an error
    // naming the ones it does, not zeros.
    let e = operator
        .tenant_usage(pb::TenantUsageRequest {
            tenant: "team-z".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert_eq!(
        e.message(),
        "no tenant \"team-z\" in the current policy; its tenants: team-a"
    );

    // A control plane without the store says where the spend lives.
    let dir2 = temp("usage-none");
    let bare = control_plane(&dir2, "127.0.0.1:0".parse().unwrap()).await;
    let mut other = admin(bare.local_addr(), Some(TOKEN)).await;
    let e = other
        .tenant_usage(pb::TenantUsageRequest {
            tenant: "team-a".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("--shared-store"), "{}", e.message());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

/// Issue 30, item 3: a Redis restarted without persistence forgets the
/// day's spend. The proxy finds its epoch marker gone, logs and counts it
/// (`router_shared_store_resets_total`), and `routerctl tenants usage`
/// shows since when the store's data runs and that a reset was seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_store_that_lost_its_data_is_detected_counted_and_shown() {
    let mut redis = router_tests::redis::RedisServer::start("reset").await;
    let backend = mock("local", Behavior::Json).await;
    let dir = temp("store-reset");
    let (cp, mut operator) = budget_control_plane(&dir, &redis.url(), &backend.url()).await;
    let settings = Settings {
        shared_store: Some(router_proxy::SharedStore::new(&redis.url()).unwrap()),
        shared_store_check: Duration::from_millis(100),
        ..Settings::default()
    };
    let proxy = TestProxy::start(
        settings,
        managed(format!("http://{}", cp.local_addr()), Some(TOKEN), "r1"),
    )
    .await;
    wait_version(&proxy, "cp-1").await;
    eventually(WAIT_AT_MOST, "store connected", || {
        proxy.proxy.shared_store_connected()
    })
    .await;
    async fn usage(operator: &mut router_tests::control::Admin) -> pb::TenantUsageResponse {
        operator
            .tenant_usage(pb::TenantUsageRequest {
                tenant: "team-a".into(),
            })
            .await
            .unwrap()
            .into_inner()
    }
    // The proxy writes the marker at once; no reset yet.
    let mut first = pb::TenantUsageResponse::default();
    for _ in 0..250 {
        first = usage(&mut operator).await;
        if first.store_since_unix_ms > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(first.store_since_unix_ms > 0, "no epoch marker: {first:?}");
    assert!(!first.store_reset_seen, "{first:?}");
    let r = proxy
        .chat_with(
            &[("authorization", "Bearer rt_a")],
            r#"{"model":"m","max_tokens":5,"messages":[]}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    eventually(WAIT_AT_MOST, "the call's spend settled", || {
        redis
            .get(&format!("router:spend:team-a:{}", first.day))
            .is_some_and(|v| v != "0")
    })
    .await;
    assert!(
        proxy
            .metrics()
            .await
            .contains("router_shared_store_resets_total 0"),
        "no reset counted yet"
    );

    // Redis restarts without persistence: the spend is gone.
    redis.stop();
    redis.resume().await;
    let mut metrics = String::new();
    for _ in 0..250 {
        metrics = proxy.metrics().await;
        if metrics.contains("router_shared_store_resets_total 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        metrics.contains("router_shared_store_resets_total 1"),
        "the reset was not counted: {}",
        metrics
            .lines()
            .filter(|l| l.contains("shared_store"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let after = usage(&mut operator).await;
    assert!(after.store_reset_seen, "{after:?}");
    assert_eq!(after.store_lost_since_unix_ms, first.store_since_unix_ms);
    assert!(
        after.store_since_unix_ms >= first.store_since_unix_ms,
        "{after:?}"
    );
    assert_eq!(after.spent_today_micros, 0, "the spend is gone: {after:?}");
    // Counted once: later checks find the new marker.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(proxy
        .metrics()
        .await
        .contains("router_shared_store_resets_total 1"));

    // What an operator sees.
    let out = std::process::Command::new(router_tests::proxy_process::bin_dir().join("routerctl"))
        .args([
            "tenants",
            "usage",
            "team-a",
            "--server",
            &format!("http://{}", cp.local_addr()),
        ])
        .env("ROUTER_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("a reset was seen: the store lost its data, spend since"),
        "{text}"
    );
    assert!(text.contains("store data since: 20"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 30, item 8: `proxies list`'s LAST SEEN is a heartbeat: a live
/// proxy with nothing to say (no policy change, no circuit) is still seen
/// every heartbeat, not only when it last ACKed a push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_proxy_is_still_seen_every_heartbeat() {
    let dir = temp("heartbeat");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let mut admin = admin(cp.local_addr(), Some(TOKEN)).await;
    let _proxy = TestProxy::start(
        Settings::default(),
        Mode::Managed(ManagedOptions {
            heartbeat: Duration::from_millis(100),
            ..managed_options(format!("http://{}", cp.local_addr()), Some(TOKEN), "quiet")
        }),
    )
    .await;
    async fn seen(admin: &mut router_tests::control::Admin) -> Option<i64> {
        admin
            .list_proxies(pb::ListProxiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .proxies
            .into_iter()
            .find(|p| p.node_id == "quiet")
            .map(|p| p.last_seen_unix_ms)
    }
    let mut first = None;
    for _ in 0..100 {
        first = seen(&mut admin).await;
        if first.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = first.expect("the proxy connected");
    // Nothing is pushed meanwhile: only heartbeats move LAST SEEN.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = seen(&mut admin).await.expect("still listed");
    assert!(later >= first + 300, "last seen {first} then {later}");
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
