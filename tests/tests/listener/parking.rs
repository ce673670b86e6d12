//! Parked tasks run through the proxy's own listener: over its TLS when it
//! speaks TLS.

use std::time::Duration;

use http::StatusCode;
use router_mock::Behavior;
use router_proxy::Settings;
use router_tests::harness::{eventually, TestProxy};
use router_tests::mocks::mock;

use crate::{h1_client, read, temp_dir, tls_connect, tls_settings, Pair, CHAT};

fn parking_policy(url: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["{url}"]
  routes:
    - name: r
      chain: [only]
      on_all_down: park
      park: {{ttl_s: 60}}
"#
    )
}

/// A task parked by a plaintext proxy in `CUSTOM_ROUTER_TASKS_FILE` is run
/// by a TLS proxy on the same file, through its TLS listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_task_runs_through_the_tls_listener() {
    let m = mock("m", Behavior::Json).await;
    let dir = temp_dir("park");
    let tasks_file = dir.join("tasks.json");
    let yaml = parking_policy(&m.url());
    let plain = Settings {
        tasks_file: Some(tasks_file.clone()),
        ..Settings::default()
    };
    let first = TestProxy::with_policy(plain, &yaml).await;
    first.set_backends_pool("only", &[]).await;
    let r = first.chat_with(&[("prefer", "respond-async")], CHAT).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    drop(first);

    let pair = Pair::generate();
    let tls = Settings {
        tasks_file: Some(tasks_file),
        ..tls_settings(pair.write(&dir))
    };
    let second = TestProxy::with_policy(tls, &yaml).await;
    eventually(Duration::from_secs(15), "the task ran", || {
        m.stats().received == 1
    })
    .await;
    let addr = second.addr();
    let mut state = String::new();
    for _ in 0..100 {
        let tls = tls_connect(addr, &[&pair], &[b"http/1.1"]).await.unwrap();
        let mut h1 = h1_client(tls).await;
        let req = http::Request::get(format!("/v1/router/tasks/{id}"))
            .header("host", "localhost")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let a = read(h1.send_request(req).await.unwrap()).await;
        state = a
            .headers
            .get("x-router-task-state")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        if state == "done" {
            assert_eq!(a.status, StatusCode::OK);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "done");
    assert_eq!(m.stats().received, 1, "run once");
    let _ = std::fs::remove_dir_all(&dir);
}
