//! Tenants' keys kept in the control plane's store beside the policy
//! (issue 30, item 1): created with `routerctl`, used through two managed
//! proxies, revoked fleet-wide, expiring on their own, and untouched by the
//! policy file being applied again from git.

use std::time::Duration;

use tokio::time::Instant;

use http::StatusCode;
use router_mock::Behavior;
use router_proto::v1 as pb;
use router_proxy::managed::ManagedOptions;
use router_proxy::{Mode, Settings};
use router_tests::control::{admin, managed_options, wait_revision, TOKEN};
use router_tests::harness::TestProxy;
use router_tests::mocks::mock;

use super::{control_plane, temp};

/// The policy file as an operator keeps it in git: comments, and a tenant
/// with limits but no keys (its keys live in the control plane).
fn policy_file(backend: &str, per_day: &str) -> String {
    format!(
        "# Team A's traffic; keys are made with `routerctl tenants keys create`.\n\
         apiVersion: router/v1\n\
         kind: RoutingPolicy\n\
         spec:\n  \
           pools:\n    \
             - name: local   # the GPU box\n      \
               endpoints: [\"{backend}\"]\n  \
           routes:\n    \
             - name: default\n      \
               chain: [local]\n  \
           tenants:\n    \
             - name: team-a\n      \
               limits: {{budget_usd_per_day: {per_day}}}\n"
    )
}

/// A managed proxy on the control plane at `addr` that reports key use
/// every 50 ms (the heartbeat), so LAST USED shows up in the test.
async fn proxy(addr: std::net::SocketAddr, node: &str) -> TestProxy {
    TestProxy::start(
        Settings::default(),
        Mode::Managed(ManagedOptions {
            heartbeat: Duration::from_millis(50),
            ..managed_options(format!("http://{addr}"), Some(TOKEN), node)
        }),
    )
    .await
}

async fn status_with(p: &TestProxy, key: &str) -> (StatusCode, String) {
    let auth = format!("Bearer {key}");
    let r = p
        .chat_with(
            &[("authorization", auth.as_str())],
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
    (r.status, r.text())
}

/// How long until every proxy answers `want` to `key` (5 s at most).
async fn until_all(proxies: &[&TestProxy], key: &str, want: StatusCode) -> Duration {
    let start = Instant::now();
    loop {
        let mut all = true;
        for p in proxies {
            if status_with(p, key).await.0 != want {
                all = false;
            }
        }
        if all {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not every proxy answers {want} for the key after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_key_works_on_every_proxy_until_revoked_and_survives_the_policy_file() {
    let backend = mock("local", Behavior::Json).await;
    let dir = temp("keys");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let addr = cp.local_addr();
    let mut operator = admin(addr, Some(TOKEN)).await;
    let file = policy_file(&backend.url(), "25");
    // A tenant without a key in the policy is accepted (it was refused:
    // "a tenant that is not anonymous needs at least one key").
    let applied = operator
        .apply_policy(pb::ApplyPolicyRequest {
            document: file.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(applied.applied, "{:?}", applied.errors);
    let p1 = proxy(addr, "k1").await;
    let p2 = proxy(addr, "k2").await;
    wait_revision(&p1, applied.revision).await;
    wait_revision(&p2, applied.revision).await;

    let mut cli =
        routerctl::admin_cmd::connect(&format!("http://{addr}"), Some(TOKEN.into()), None)
            .await
            .unwrap();
    let (key, stored) = routerctl::keys_cmd::create_key(&mut cli, "team-a", "ci", None)
        .await
        .unwrap();
    assert!(key.starts_with("rt_") && key.len() > 40, "{key}");
    assert_eq!(stored.hash, router_policy::tenant::key_hash_text(&key));
    assert!(stored.id.starts_with("key-") && key.starts_with(&stored.prefix));
    assert_eq!(
        (stored.tenant.as_str(), stored.name.as_str()),
        ("team-a", "ci")
    );
    assert_eq!(stored.created_by, "operator");
    // The policy is stored as written: comments kept, no key or hash added.
    let current = operator
        .get_policy(pb::GetPolicyRequest { version: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(current.document, file);
    assert_eq!(current.version, 1);
    let created = until_all(&[&p1, &p2], &key, StatusCode::OK).await;

    // Applying the policy file from git again (and an edit of it, then the
    // original) keeps the key.
    for document in [policy_file(&backend.url(), "30"), file.clone()] {
        let r = operator
            .apply_policy(pb::ApplyPolicyRequest {
                document,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.applied, "{:?}", r.errors);
        wait_revision(&p1, r.revision).await;
        wait_revision(&p2, r.revision).await;
    }
    for p in [&p1, &p2] {
        let (status, body) = status_with(p, &key).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    // LAST USED comes from the proxies' heartbeats.
    let mut listed = Vec::new();
    for _ in 0..200 {
        listed = operator
            .list_keys(pb::ListKeysRequest {
                tenant: "team-a".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .keys;
        if listed.first().is_some_and(|k| k.last_used_unix_ms > 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, stored.id);
    assert!(
        listed[0].last_used_unix_ms >= stored.created_at_unix_ms,
        "{listed:?}"
    );

    // Revoked: the next call on either proxy is 401, within the
    // propagation time measured here.
    let revoked = operator
        .revoke_key(pb::RevokeKeyRequest {
            id: stored.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(revoked.id, stored.id);
    let gone = until_all(&[&p1, &p2], &key, StatusCode::UNAUTHORIZED).await;
    eprintln!("key propagation through 2 proxies: created {created:?}, revoked {gone:?}");
    let e = operator
        .revoke_key(pb::RevokeKeyRequest { id: stored.id })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    // A key for a tenant the policy does not name is refused with the names.
    let e = routerctl::keys_cmd::create_key(&mut cli, "nobody", "", None)
        .await
        .unwrap_err();
    assert!(matches!(e, routerctl::error::CliError::Refused(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("no tenant \"nobody\"") && e.contains("team-a"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_created_with_an_expiry_stops_working_at_it() {
    let backend = mock("local", Behavior::Json).await;
    let dir = temp("keys-expiry");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let addr = cp.local_addr();
    let mut operator = admin(addr, Some(TOKEN)).await;
    let applied = operator
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy_file(&backend.url(), "25"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let p = proxy(addr, "e1").await;
    wait_revision(&p, applied.revision).await;
    let mut cli =
        routerctl::admin_cmd::connect(&format!("http://{addr}"), Some(TOKEN.into()), None)
            .await
            .unwrap();
    let (key, stored) =
        routerctl::keys_cmd::create_key(&mut cli, "team-a", "", Some(Duration::from_millis(1500)))
            .await
            .unwrap();
    assert!(stored.expires_at_unix_ms > stored.created_at_unix_ms);
    until_all(&[&p], &key, StatusCode::OK).await;
    // The proxy checks the expiry itself: no snapshot is needed for it.
    let revision = router_tests::control::version_of(&p).await;
    let expired = until_all(&[&p], &key, StatusCode::UNAUTHORIZED).await;
    assert!(expired < Duration::from_secs(3), "{expired:?}");
    assert_eq!(router_tests::control::version_of(&p).await, revision);
    let (_, body) = status_with(&p, &key).await;
    assert!(body.contains("expired"), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}
