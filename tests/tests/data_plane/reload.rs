//! Standalone mode: a policy file with several pools and one route,
//! watched and reloaded; a bad edit is rejected and the last good policy
//! keeps serving.

use std::path::PathBuf;
use std::time::Duration;

use http::StatusCode;
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_proxy::Mode;
use router_tests::harness::TestProxy;
use router_tests::mocks::mock;

use crate::settings;

fn policy(chain: &str, a: &str, b: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
metadata: {{name: test}}
spec:
  queue: {{max_size: 50, timeout_s: 5}}
  pools:
    - name: local
      provider: vllm
      model: small-model
      endpoints: ["{a}"]
      max_concurrency: 4
    - name: cloud
      provider: openai
      model: big-model
      endpoints: ["{b}"]
  routes:
    - name: default
      chain: [{chain}]
"#
    )
}

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("router-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("policy.yaml")
}

async fn wait_for_version_change(proxy: &TestProxy, from: &str) -> String {
    for _ in 0..300 {
        let v = proxy.health().await["config_version"]
            .as_str()
            .unwrap()
            .to_string();
        if v != from {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("config version stayed {from}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_file_is_watched_and_bad_edits_are_rejected() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let path = temp_file("watch");
    std::fs::write(&path, policy("local, cloud", &a.url(), &b.url())).unwrap();
    let mut s = settings();
    s.policy_poll_interval = Duration::from_millis(50);
    let proxy = TestProxy::start(
        s,
        Mode::Standalone {
            policy: path.clone(),
        },
    )
    .await;

    let r = proxy.chat("client-model").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("a"));
    assert_eq!(r.header("x-router-route"), Some("local"));
    // The pool's model replaces the client's.
    assert_eq!(r.json()["model"], "small-model");
    let v1 = r.header("x-router-config-version").unwrap().to_string();

    // A good edit: the route now goes to the cloud pool.
    std::fs::write(&path, policy("cloud", &a.url(), &b.url())).unwrap();
    let v2 = wait_for_version_change(&proxy, &v1).await;
    let r = proxy.chat("client-model").await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("b"));
    assert_eq!(r.json()["model"], "big-model");
    assert_eq!(r.header("x-router-config-version"), Some(v2.as_str()));

    // A bad edit: unknown pool in the chain, and a bad endpoint.
    std::fs::write(&path, policy("cloud, nowhere", "ftp://x:1", &b.url())).unwrap();
    let mut rejected = false;
    for _ in 0..300 {
        if proxy
            .metrics()
            .await
            .contains("router_config_reloads_total{result=\"rejected\"} 1")
        {
            rejected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(rejected, "the bad edit was not counted as rejected");
    let r = proxy.chat("client-model").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("b"));
    assert_eq!(r.header("x-router-config-version"), Some(v2.as_str()));

    // Chains are walked: a pool with no endpoints is passed over.
    std::fs::write(
        &path,
        policy("local, cloud", &a.url(), &b.url()).replace(&format!("[\"{}\"]", a.url()), "[]"),
    )
    .unwrap();
    wait_for_version_change(&proxy, &v2).await;
    let r = proxy.chat("m").await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("b"));
    let lines = proxy.log.wait_for(4).await;
    assert_eq!(lines[3]["walk"][0]["note"], "gated", "{}", lines[3]);
    assert_eq!(lines[3]["walk"][0]["pool"], "local", "{}", lines[3]);
    assert_eq!(lines[3]["walk"][0]["why"], "unhealthy", "{}", lines[3]);
    let reason = lines[3]["reason"].as_str().unwrap();
    assert!(reason.contains("local skipped: no endpoints"), "{reason}");
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_policy_file_stops_startup_with_every_reason() {
    let path = temp_file("invalid");
    std::fs::write(&path, policy("cloud, nowhere", "ftp://x:1", "127.0.0.1:1")).unwrap();
    let mut s = settings();
    s.port = 0;
    s.bind = [127, 0, 0, 1].into();
    let err = match router_proxy::start(router_proxy::ProxyOptions {
        settings: s,
        mode: Mode::Standalone {
            policy: path.clone(),
        },
        route_log: Box::new(std::io::sink()),
    })
    .await
    {
        Ok(_) => panic!("an invalid policy must not start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("spec.pools[0].endpoints[0]"), "{err}");
    assert!(
        err.contains("spec.routes[0].chain[1]: unknown pool \"nowhere\""),
        "{err}"
    );
    let _ = std::fs::remove_file(&path);
}
