//! The etcd store over TLS with client certificates and etcd users: a real
//! etcd started with `--cert-file --key-file --trusted-ca-file
//! --client-cert-auth` and `auth enable`, certificates made here.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use router_control_plane::store::etcd::{EtcdAccess, EtcdAddress, EtcdStore};
use router_control_plane::{start, ControlPlaneOptions, RunningControlPlane, StoreLocation};
use router_mock::Behavior;
use router_proxy::managed::ManagedOptions;
use router_proxy::{Mode, Settings};
use router_tests::control::{managed_options, managed_proxy, policy, wait_version, TOKEN};
use router_tests::etcd::{EtcdServer, EtcdTls};
use router_tests::harness::{eventually, TestProxy};
use router_tests::mocks::mock;

const USER: &str = "router";
const PASSWORD: &str = "router-etcd-password";

/// A CA, and certificates it signs: (CA PEM, issuer).
fn ca(name: &str) -> (String, CertifiedIssuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    (issuer.pem(), issuer)
}

/// A leaf certificate and key (PEM) for `names`, signed by `issuer`.
fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    common_name: &str,
    names: &[&str],
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = usages;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A member with TLS and client certificates on, and a `router` user who
/// may use `/router/` only; and the router's certificate and key, whose
/// common name is `router_cn`.
async fn secure_etcd(name: &str, router_cn: &str) -> (EtcdServer, String, (String, String)) {
    let (ca_pem, issuer) = ca("etcd test CA");
    // etcd also dials itself with its server certificate (gRPC gateway).
    let (server_cert, server_key) = leaf(
        &issuer,
        "etcd",
        &["localhost", "127.0.0.1"],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    // A common name that is not an etcd user: this certificate alone
    // (without a password) grants no etcd user.
    let (client_cert, client_key) = leaf(
        &issuer,
        "test-admin",
        &[],
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    );
    let router = leaf(
        &issuer,
        router_cn,
        &[],
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    );
    let mut etcd = EtcdServer::start_tls(
        name,
        EtcdTls {
            ca: ca_pem.clone(),
            server_cert,
            server_key,
            client_cert,
            client_key,
        },
    )
    .await;
    etcd.enable_auth(USER, PASSWORD, "/router/").await;
    (etcd, ca_pem, router)
}

fn access(ca: &str, identity: Option<&(String, String)>, password: &str) -> EtcdAccess {
    EtcdAccess {
        ca_pem: Some(ca.to_string()),
        identity: identity.cloned(),
        user: Some((USER.to_string(), password.to_string())),
    }
}

async fn secure_replica(
    etcd: &EtcdServer,
    prefix: &str,
    node: &str,
    access: EtcdAccess,
) -> Result<RunningControlPlane, router_control_plane::StartError> {
    start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: StoreLocation::Etcd {
            address: EtcdAddress::parse(&etcd.store_url(prefix)).unwrap(),
            node_id: node.into(),
            access,
        },
        token: Some(TOKEN.into()),
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_state_through_etcd_with_tls_client_certs_and_a_user() {
    let (etcd, ca_pem, router) = secure_etcd("tls-auth", "router-control-plane").await;
    let x = mock("x", Behavior::Json).await;
    let right = access(&ca_pem, Some(&router), PASSWORD);
    let a = secure_replica(&etcd, "router", "cp-a", right.clone())
        .await
        .unwrap();
    let b = secure_replica(&etcd, "router", "cp-b", right)
        .await
        .unwrap();
    let on_b = managed_proxy(&[b.local_addr()], "p-b", None).await;
    let (_, revision) = a
        .hub()
        .apply_policy(&policy(&x.url(), &x.url()), false, 0, "test")
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "B sees A's policy", || {
        b.hub().state().policy_version == 1
    })
    .await;
    wait_version(&on_b, &format!("cp-{}", revision)).await;
    // The console's questions between replicas (a lease, `queries/` and
    // `answers/`) pass under the user's prefix: A's load fetch has B's
    // proxy, through B (once B's presence record is published).
    let mut through_b = Vec::new();
    for _ in 0..50 {
        let load = a.hub().fleet_load(Duration::from_secs(1)).await;
        through_b = load
            .proxies
            .iter()
            .filter(|p| p.replica == "cp-b" && p.load.is_some())
            .map(|p| p.node.clone())
            .collect();
        if !through_b.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(through_b, ["p-b"]);
    // It is the router user's writing, under its prefix.
    let kvs = etcd
        .client()
        .await
        .range(router_etcd::pb::etcdserverpb::RangeRequest::key(
            "/router/state",
        ))
        .await
        .unwrap();
    assert_eq!(kvs.kvs.len(), 1);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_a_wrong_password_a_foreign_prefix_a_missing_cert_and_a_wrong_ca() {
    let (etcd, ca_pem, router) = secure_etcd("refusals", "router-control-plane").await;

    // A wrong password stops startup at once, naming the user, never the password.
    let started = tokio::time::Instant::now();
    let err = secure_replica(
        &etcd,
        "router",
        "cp-wrong",
        access(&ca_pem, Some(&router), "not-the-password"),
    )
    .await
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("authentication failed") && err.contains("\"router\""),
        "{err}"
    );
    assert!(
        !err.contains("not-the-password") && !err.contains(PASSWORD),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "not retried");

    // The role covers /router/ only.
    let err = secure_replica(
        &etcd,
        "other",
        "cp-other",
        access(&ca_pem, Some(&router), PASSWORD),
    )
    .await
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("permission denied") && err.contains("/other/"),
        "{err}"
    );

    // Without a client certificate, or trusting another CA, no connection
    // is made (the right password is no help).
    let address = EtcdAddress::parse(&etcd.store_url("router")).unwrap();
    let (other_ca, _) = ca("another CA");
    // etcd's refusal of a missing certificate reaches the client as an
    // alert or a closed connection, depending on timing: only the failure
    // is asserted there.
    for (what, access, says) in [
        ("no client certificate", access(&ca_pem, None, PASSWORD), ""),
        (
            "another CA",
            access(&other_ca, Some(&router), PASSWORD),
            "UnknownIssuer",
        ),
    ] {
        let err = EtcdStore::open(&address, &access, "cp-x", Duration::from_secs(1))
            .await
            .err()
            .unwrap_or_else(|| panic!("{what}: connected"))
            .to_string();
        assert!(err.contains(says), "{what}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_named_after_an_etcd_user_signs_in_as_that_user() {
    // etcd's --client-cert-auth takes the certificate's common name as the
    // user when no password is given: what deploy/ relies on.
    let (etcd, ca_pem, router) = secure_etcd("cert-user", USER).await;
    let by_cert = EtcdAccess {
        ca_pem: Some(ca_pem.clone()),
        identity: Some(router.clone()),
        user: None,
    };
    let a = secure_replica(&etcd, "router", "cp-a", by_cert.clone())
        .await
        .unwrap();
    a.hub()
        .apply_policy(
            &policy("http://10.0.0.1:8000", "http://10.0.0.2:8000"),
            false,
            0,
            "test",
        )
        .await
        .unwrap();
    a.shutdown().await;
    // The same user's role still bounds it to its prefix.
    let err = secure_replica(&etcd, "other", "cp-other", by_cert)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("permission denied"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificates_of_make_certs_secure_etcd_the_control_plane_and_proxies() {
    // deploy/tls/make-certs.sh as an operator runs it, then its files where
    // deploy/ puts them: etcd serves etcd.pem and wants client certificates
    // (auth on, user `router` limited to /router/); the control plane signs
    // in with etcd-client.pem (common name `router`, no password) and
    // serves control-plane.pem; a proxy trusts ca.pem.
    let dir = std::env::temp_dir().join(format!("router-make-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/tls/make-certs.sh");
    let made = std::process::Command::new("bash")
        .arg(script)
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    assert!(
        made.status.success(),
        "make-certs.sh (needs openssl): {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let mut etcd = EtcdServer::start_tls(
        "make-certs",
        EtcdTls {
            ca: read("etcd-ca.pem"),
            server_cert: read("etcd.pem"),
            server_key: read("etcd-key.pem"),
            client_cert: read("etcd.pem"),
            client_key: read("etcd-key.pem"),
        },
    )
    .await;
    etcd.enable_auth(USER, PASSWORD, "/router/").await;
    let x = mock("x", Behavior::Json).await;
    let cp = start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: StoreLocation::Etcd {
            address: EtcdAddress::parse(&etcd.store_url("router")).unwrap(),
            node_id: "cp".into(),
            access: EtcdAccess {
                ca_pem: Some(read("etcd-ca.pem")),
                identity: Some((read("etcd-client.pem"), read("etcd-client-key.pem"))),
                user: None,
            },
        },
        token: Some(TOKEN.into()),
        tls: Some((read("control-plane.pem"), read("control-plane-key.pem"))),
        ..Default::default()
    })
    .await
    .unwrap();
    let (_, revision) = cp
        .hub()
        .apply_policy(&policy(&x.url(), &x.url()), false, 0, "test")
        .await
        .unwrap();
    let proxy = TestProxy::start(
        Settings::default(),
        Mode::Managed(ManagedOptions {
            ca_pem: Some(read("ca.pem")),
            heartbeat: router_proxy::managed::HEARTBEAT,
            ..managed_options(
                format!("https://localhost:{}", cp.local_addr().port()),
                Some(TOKEN),
                "p",
            )
        }),
    )
    .await;
    wait_version(&proxy, &format!("cp-{revision}")).await;
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_etcd_token_is_renewed_for_a_new_watch_and_for_calls() {
    // etcd forgets a token unused for a second: the store's token is stale
    // after an idle spell, and both a watch created then (etcd 3.4 refuses
    // it in the stream, as "permission denied") and a call (refused as
    // Unauthenticated) must sign in again rather than fail for good.
    let mut etcd = EtcdServer::start_with_token_ttl("token-ttl", 1).await;
    etcd.enable_auth(USER, PASSWORD, "/router/").await;
    let address = EtcdAddress::parse(&etcd.store_url("router")).unwrap();
    let user = EtcdAccess {
        user: Some((USER.to_string(), PASSWORD.to_string())),
        ..EtcdAccess::default()
    };
    let store = EtcdStore::open(&address, &user, "cp-a", Duration::from_secs(5))
        .await
        .unwrap();
    let from = store.etcd_revision().await.unwrap() + 1;

    // Idle for longer than the token lives (etcd drops expired tokens
    // once a second), then a watch, with nothing else to renew the token.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut changes = store.follow_from(from);
    // Another client writes: the follower must see it.
    let state = router_control_plane::store::State {
        policy_version: 7,
        ..Default::default()
    };
    etcd.client()
        .await
        .put(router_etcd::pb::etcdserverpb::PutRequest {
            key: b"/router/state".to_vec(),
            value: serde_json::to_vec(&state).unwrap(),
            ..Default::default()
        })
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(change) = changes.recv().await {
            if let router_control_plane::store::StoreChange::Changed(events) = change {
                for event in events {
                    if let router_control_plane::store::StoreEvent::State(s) = event {
                        return Some(s.policy_version);
                    }
                }
            }
        }
        None
    })
    .await;
    assert_eq!(seen, Ok(Some(7)), "the watch never saw the write");

    // Idle again: a call signs in again too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(store.etcd_revision().await.unwrap() >= from);
}
