//! Runtime marks have a revision of their own (issue 30, item 7): a
//! change of circuits or suspicions alone moves the control plane's
//! revision (proxies apply and ACK it) but not the name of the config
//! proxies serve (`x-router-config-version: cp-N`), nor the policy's
//! history; a change of policy, backend sets or keys renames it.

use router_mock::Behavior;
use router_proto::v1 as pb;
use router_tests::control::{
    admin, managed_proxy, policy, revision_of, version_of, wait_revision, TOKEN,
};
use router_tests::mocks::mock;

use super::{control_plane, temp};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuits_move_the_revision_but_not_the_config_version() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let dir = temp("marks");
    let cp = control_plane(&dir, "127.0.0.1:0".parse().unwrap()).await;
    let addr = cp.local_addr();
    let mut operator = admin(addr, Some(TOKEN)).await;
    let applied = operator
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(&a.url(), &b.url()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let proxy = managed_proxy(&[addr], "m1", None).await;
    wait_revision(&proxy, applied.revision).await;
    let named = format!("cp-{}", applied.revision);
    assert_eq!(version_of(&proxy).await, named);

    // An outage's worth of marks: each a revision, none a new config name.
    let mut last = applied.revision;
    for open in [true, false, true, false] {
        last = operator
            .set_circuit(pb::SetCircuitRequest {
                pool: "primary".into(),
                endpoint: String::new(),
                open,
                for_seconds: 60,
            })
            .await
            .unwrap()
            .into_inner()
            .revision;
    }
    assert!(last >= applied.revision + 4, "{last}");
    wait_revision(&proxy, last).await;
    assert_eq!(revision_of(&proxy).await, Some(last));
    assert_eq!(
        version_of(&proxy).await,
        named,
        "marks do not rename the config"
    );
    let r = proxy.chat(r#"{"model":"m","messages":[]}"#).await;
    assert_eq!(
        r.headers["x-router-config-version"].to_str().unwrap(),
        named
    );
    let history = operator
        .history(pb::HistoryRequest {})
        .await
        .unwrap()
        .into_inner()
        .versions;
    assert_eq!(history.len(), 1, "{history:?}");
    // The proxy ACKed the marks' revision.
    let mut acked = 0;
    for _ in 0..200 {
        let listed = operator
            .list_proxies(pb::ListProxiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .proxies;
        acked = listed.first().map_or(0, |p| p.applied_revision);
        if acked == last {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(acked, last);

    // A backend set is config: a new name.
    let set = operator
        .set_backends(pb::SetBackendsRequest {
            pool: "fallback".into(),
            endpoints: vec![a.url()],
            drained: vec![],
        })
        .await
        .unwrap()
        .into_inner()
        .revision;
    wait_revision(&proxy, set).await;
    assert_eq!(version_of(&proxy).await, format!("cp-{set}"));
    let _ = std::fs::remove_dir_all(&dir);
}
