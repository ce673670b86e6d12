//! `routerctl cache purge --route R [--tenant T]`: through a real control
//! plane, managed proxies and, where the fleet shares entries, a real
//! Redis.

use std::net::SocketAddr;
use std::process::ExitCode;

use router_proto::v1 as pb;
use router_proxy::{Mode, Settings, SharedStore};
use router_tests::control::{managed_options, wait_revision, TOKEN};
use router_tests::harness::{tenant_item, TestProxy};
use router_tests::redis::RedisServer;

use super::*;

/// A control plane (with `--shared-store` at `shared` if any), `policy`
/// applied, and routerctl's admin client.
async fn control_plane(
    name: &str,
    shared: Option<&RedisServer>,
    policy: &str,
) -> (
    router_control_plane::RunningControlPlane,
    routerctl::admin_cmd::Admin,
) {
    let dir =
        std::env::temp_dir().join(format!("router-cache-purge-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cp = router_control_plane::start(router_control_plane::ControlPlaneOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store: router_control_plane::StoreLocation::Embedded(dir),
        token: Some(TOKEN.into()),
        shared_store: shared.map(RedisServer::url),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane: {e}"));
    let mut admin =
        routerctl::admin_cmd::connect(&cp.local_addr().to_string(), Some(TOKEN.into()), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    let applied = admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy.to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(applied.applied, "{applied:?}");
    (cp, admin)
}

async fn proxy(
    cp: &router_control_plane::RunningControlPlane,
    node: &str,
    s: Settings,
) -> TestProxy {
    let p = TestProxy::start(
        s,
        Mode::Managed(managed_options(
            format!("http://{}", cp.local_addr()),
            Some(TOKEN),
            node,
        )),
    )
    .await;
    p.wait_health("the control plane's policy applied", |h| {
        h["revision"].as_u64().is_some_and(|r| r > 0)
    })
    .await;
    p
}

async fn cache_word(p: &TestProxy, headers: &[(&str, &str)], body: &str) -> String {
    let r = p.chat_with(headers, body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.header("x-router-cache").unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_reaches_every_proxys_own_store_for_one_tenant_or_the_whole_route() {
    let m = mock("m", Behavior::Json).await;
    let tenants = [
        tenant_item("team-a", "rt_a", ""),
        tenant_item("team-b", "rt_b", ""),
    ];
    let doc = policy(&m.url(), "", &tenants);
    let (cp, mut admin) = control_plane("local", None, &doc).await;
    let p1 = proxy(&cp, "p1", Settings::default()).await;
    let p2 = proxy(&cp, "p2", Settings::default()).await;
    let as_a = [("authorization", "Bearer rt_a")];
    let as_b = [("authorization", "Bearer rt_b")];
    // Each proxy has its own store: each tenant's entry on each.
    for p in [&p1, &p2] {
        for who in [&as_a, &as_b] {
            assert_eq!(cache_word(p, who, BODY).await, "miss");
            assert_eq!(cache_word(p, who, BODY).await, "hit");
        }
    }
    assert_eq!(m.stats().received, 4);

    // A tenant on a route that is not partitioned by tenant, an unknown
    // route: refused with the field.
    let refused = admin
        .purge_cache(pb::PurgeCacheRequest {
            route: "nope".into(),
            tenant: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("route"), "{}", refused.message());

    // team-a's entries only, as routerctl does it.
    let code = routerctl::cache_cmd::cache_purge(
        &mut admin,
        "r",
        Some("team-a"),
        routerctl::policy_cmd::Output::Table,
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    let revision = cp.hub().state().revision;
    for p in [&p1, &p2] {
        wait_revision(p, revision).await;
        assert_eq!(cache_word(p, &as_a, BODY).await, "miss", "team-a purged");
        assert_eq!(cache_word(p, &as_b, BODY).await, "hit", "team-b kept");
    }
    assert_eq!(m.stats().received, 6);

    // The whole route.
    let r = admin
        .purge_cache(pb::PurgeCacheRequest {
            route: "r".into(),
            tenant: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.prefix, "cache:r:");
    assert_eq!(r.shared_entries, None, "no --shared-store");
    for p in [&p1, &p2] {
        wait_revision(p, r.revision).await;
        assert_eq!(
            cache_word(p, &as_b, BODY).await,
            "miss",
            "every caller purged"
        );
    }
    assert_eq!(m.stats().received, 8);
    // A later snapshot (another change) does not purge again.
    let again = admin
        .set_circuit(pb::SetCircuitRequest {
            pool: "only".into(),
            endpoint: String::new(),
            open: false,
            for_seconds: 1,
        })
        .await
        .unwrap()
        .into_inner();
    for p in [&p1, &p2] {
        wait_revision(p, again.revision).await;
        assert_eq!(
            cache_word(p, &as_b, BODY).await,
            "hit",
            "a purge is applied once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_empties_the_shared_store_once_for_the_fleet_and_a_pool_change_purges_it_too() {
    let redis = RedisServer::start("cache-purge").await;
    let m = mock("m", Behavior::Json).await;
    let doc = policy(&m.url(), "", &[]);
    let (cp, mut admin) = control_plane("shared", Some(&redis), &doc).await;
    let s = Settings {
        shared_store: Some(SharedStore::new(&redis.url()).unwrap()),
        ..Settings::default()
    };
    let p1 = proxy(&cp, "p1", s.clone()).await;
    let p2 = proxy(&cp, "p2", s).await;
    for p in [&p1, &p2] {
        p.wait_health("the shared store connected", |h| {
            h["shared_store"]["connected"] == true
        })
        .await;
    }
    let other = BODY.replace("2+2", "3+3");
    assert_eq!(cache_word(&p1, &[], BODY).await, "miss");
    assert_eq!(cache_word(&p1, &[], &other).await, "miss");
    assert_eq!(cache_word(&p2, &[], BODY).await, "hit", "shared entry");
    let r = admin
        .purge_cache(pb::PurgeCacheRequest {
            route: "r".into(),
            tenant: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.shared_entries, Some(2), "{r:?}");
    assert!(r.shared_error.is_empty());
    wait_revision(&p2, r.revision).await;
    assert_eq!(cache_word(&p2, &[], BODY).await, "miss");
    assert_eq!(
        cache_word(&p1, &[], BODY).await,
        "hit",
        "stored again, shared"
    );
    assert_eq!(m.stats().received, 3);

    // A new policy version that changes the route's pool: the control
    // plane drops the route's shared entries (a change back serves none).
    let changed = doc.replace("output_per_1k_usd: 1.0", "output_per_1k_usd: 2.0");
    for (document, want) in [(&changed, 0), (&doc, 0)] {
        let applied = admin
            .apply_policy(pb::ApplyPolicyRequest {
                document: document.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(applied.applied, "{applied:?}");
        let mut left = u64::MAX;
        for _ in 0..250 {
            left = redis.count_keys("router:cache:cache:r:*");
            if left == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(left, want, "the route's shared entries purged");
        let revision = cp.hub().state().revision;
        wait_revision(&p1, revision).await;
        assert_eq!(cache_word(&p1, &[], BODY).await, "miss");
    }
    // Whatever else is in the store (other routes, idempotency keys) stays.
    assert!(redis.dbsize() >= 1);
}
