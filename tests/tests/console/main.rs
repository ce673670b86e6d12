//! The operator's console (issue 33) in a real headless Chromium, driven
//! over WebDriver (`router_test_kit::webdriver`): a control plane with
//! its console on loopback, three managed proxies on one real Redis,
//! a mock backend. An approver signs in, sees the fleet, approves a SEND
//! request parked while its backend was down and the backend gets it
//! once; a viewer sees no buttons and forged POSTs change nothing; names
//! from the store are escaped. The live pages follow the fleet without a
//! reload (`live.rs`: the Pools page's load, the Decisions page's
//! refresh and its focus rule). The screenshots in `docs/console/` are
//! taken here.
//!
//! Chromium and chromedriver come from `scripts/install-test-deps`; when
//! they are missing these tests fail saying so.

#![allow(clippy::unwrap_used)]

mod http_only;
mod insights;
mod live;
mod policy_pools;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::StatusCode;
use router_control_plane::auth::OperatorToken;
use router_control_plane::{start, ConsoleOptions, ControlPlaneOptions, RunningControlPlane};
use router_mock::{Behavior, MockModel};
use router_proxy::{Settings, SharedStore};
use router_tests::control::{managed, wait_revision, TOKEN};
use router_tests::harness::{eventually, TestClient, TestProxy, WAIT_AT_MOST};
use router_tests::mocks::mock;
use router_tests::redis::RedisServer;
use router_tests::webdriver::Browser;

/// The approver's token (named `abe`).
const APPROVER: &str = "approver-secret";
/// The viewer's token (named `vera`).
const VIEWER: &str = "viewer-secret";
/// A name from the store that must render as text.
const SCRIPT: &str = "<script>alert(1)</script>";
const SCRIPT_ESCAPED: &str = "&lt;script&gt;alert(1)&lt;/script&gt;";

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"send the mail"}]}"#;

fn policy(url: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["{url}"]
  routes:
    - name: send
      match: {{risk: [SEND, DESTRUCTIVE]}}
      chain: [only]
      on_all_down: park
      park: {{ttl_s: 120}}
    - name: default
      chain: [only]
"#
    )
}

/// Where the tests write the console's screenshots.
fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/console")
}

/// A control plane with its console, three managed proxies on one Redis,
/// and the backend they share.
struct Fleet {
    cp: RunningControlPlane,
    proxies: Vec<TestProxy>,
    backend: MockModel,
    redis: RedisServer,
    dir: PathBuf,
}

impl Fleet {
    async fn start(name: &str) -> Self {
        Self::start_with(name, policy).await
    }

    /// [`Fleet::start`] with the policy `policy` writes for the backend's
    /// URL.
    async fn start_with(name: &str, policy: fn(&str) -> String) -> Self {
        let redis = RedisServer::start(&format!("console-{name}")).await;
        let backend = mock("backend", Behavior::Json).await;
        let dir =
            std::env::temp_dir().join(format!("router-console-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let named = |token: &str, name: &str| OperatorToken {
            token: token.into(),
            name: Some(name.into()),
        };
        let cp = start(ControlPlaneOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            store: router_control_plane::StoreLocation::Embedded(dir.clone()),
            token: Some(TOKEN.into()),
            approver_tokens: vec![named(APPROVER, "abe")],
            viewer_tokens: vec![named(VIEWER, "vera")],
            shared_store: Some(redis.url()),
            console: ConsoleOptions {
                listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
                ..ConsoleOptions::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
        let (_, revision) = cp
            .hub()
            .apply_policy(&policy(&backend.url()), false, 0, "test")
            .await
            .unwrap();
        let mut proxies = Vec::new();
        for node in ["edge-a", "edge-b", "edge-c"] {
            let settings = Settings {
                shared_store: Some(SharedStore::new(&redis.url()).unwrap()),
                ..Settings::default()
            };
            let p = TestProxy::start(
                settings,
                managed(format!("http://{}", cp.local_addr()), Some(TOKEN), node),
            )
            .await;
            wait_revision(&p, revision).await;
            eventually(WAIT_AT_MOST, "the proxy reached the shared store", || {
                p.proxy.shared_store_connected()
            })
            .await;
            proxies.push(p);
        }
        Self {
            cp,
            proxies,
            backend,
            redis,
            dir,
        }
    }

    fn console(&self) -> String {
        self.cp.console_url().unwrap()
    }

    /// Empties the pool's backend set (every backend down), or gives it
    /// back its backend, and waits until every proxy has it.
    async fn backend_up(&self, up: bool) {
        let endpoints = if up { vec![self.backend.url()] } else { vec![] };
        let revision = self
            .cp
            .hub()
            .set_backends("only", endpoints, vec![])
            .await
            .unwrap();
        for p in &self.proxies {
            wait_revision(p, revision).await;
        }
    }

    /// A SEND request parked while every backend is down: its task id.
    async fn park_a_send_request(&self) -> String {
        self.backend_up(false).await;
        let r = self.proxies[0]
            .chat_with(
                &[("x-router-risk", "SEND"), ("prefer", "respond-async")],
                BODY,
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
        assert_eq!(r.json()["state"], "waiting_approval");
        r.json()["id"].as_str().unwrap().to_string()
    }

    /// The task's state as the store has it.
    fn task_state(&self, id: &str) -> String {
        let doc = self
            .redis
            .query(&["HGET", &format!("router:task:{id}"), "doc"])
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&doc).unwrap_or_default();
        v["state"].as_str().unwrap_or_default().to_string()
    }

    /// A copy of task `id` in the store, under a new id, whose tenant is
    /// `<script>alert(1)</script>` (the store is shared: the console must
    /// not trust a name it reads there).
    fn plant_script_tenant(&self, id: &str) -> String {
        let doc = self
            .redis
            .query(&["HGET", &format!("router:task:{id}"), "doc"])
            .unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&doc).unwrap();
        let planted = format!("{id}-planted");
        v["id"] = planted.clone().into();
        v["tenant"] = SCRIPT.into();
        let parked = v["parked_at_ms"].as_u64().unwrap().to_string();
        self.redis.query(&[
            "HSET",
            &format!("router:task:{planted}"),
            "rev",
            "1",
            "doc",
            &v.to_string(),
        ]);
        self.redis
            .query(&["ZADD", "router:tasks", &parked, &planted]);
        planted
    }

    async fn stop(self) {
        for p in self.proxies {
            p.proxy.drain(Duration::from_secs(1)).await;
        }
        self.cp.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Signs in through the form with `token`; returns once the fleet page
/// shows.
async fn sign_in(b: &Browser, console: &str, token: &str) {
    b.goto(&format!("{console}/signin")).await.unwrap();
    let field = b.wait_for("#token").await.unwrap();
    b.send_keys(&field, token).await.unwrap();
    b.click(&b.find("#signin-button").await.unwrap())
        .await
        .unwrap();
    if let Err(e) = b.wait_for("table#replicas").await {
        panic!(
            "not signed in: {e}\n{}: {}",
            b.url().await.unwrap_or_default(),
            b.source().await.unwrap_or_default()
        );
    }
}

/// A browser, or a failure that says how to get one.
async fn browser() -> Browser {
    Browser::start()
        .await
        .unwrap_or_else(|e| panic!("the console's browser tests need Chromium: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_sees_the_fleet_and_approves_a_parked_send_request_which_runs_once() {
    let fleet = Fleet::start("approve").await;
    let console = fleet.console();
    let b = browser().await;

    // The sign-in page, then the approver signs in with a token.
    b.goto(&format!("{console}/signin")).await.unwrap();
    b.wait_for("#token").await.unwrap();
    b.screenshot_to(&shots().join("signin.png")).await.unwrap();
    sign_in(&b, &console, APPROVER).await;
    assert_eq!(
        b.text(&b.find("#who").await.unwrap()).await.unwrap(),
        "abe (approver)"
    );

    // The fleet page lists the three proxies, each ACKed.
    let source = b.wait_until_source("edge-c").await.unwrap();
    for node in ["edge-a", "edge-b", "edge-c"] {
        assert!(source.contains(node), "{node}: {source}");
    }
    assert_eq!(b.find_all("#proxies tr.proxy").await.unwrap().len(), 3);
    assert_eq!(b.find_all("#proxies tr.state-ACK").await.unwrap().len(), 3);
    b.screenshot_to(&shots().join("fleet.png")).await.unwrap();

    // A SEND request parked while its backend is down waits for approval.
    let id = fleet.park_a_send_request().await;
    fleet.backend_up(true).await;
    let before = fleet.backend.stats().received;
    b.goto(&format!("{console}/tasks")).await.unwrap();
    let row = format!("tr.task[data-task=\"{id}\"][data-state=\"waiting_approval\"]");
    b.wait_for(&row).await.unwrap();
    assert!(b
        .find(&format!("#state-waiting_approval {row}"))
        .await
        .is_ok());
    b.screenshot_to(&shots().join("tasks.png")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fleet.backend.stats().received,
        before,
        "nothing runs unapproved"
    );

    // Approve, in the page: the backend sees the request exactly once,
    // and the page shows the task done.
    b.click(&b.find(&format!("{row} button.approve")).await.unwrap())
        .await
        .unwrap();
    let done = format!("#state-done tr.task[data-task=\"{id}\"]");
    b.wait_for(&done).await.unwrap();
    eventually(WAIT_AT_MOST, "the backend got the approved request", || {
        fleet.backend.stats().received > before
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(fleet.backend.stats().received - before, 1, "sent once");
    assert_eq!(fleet.task_state(&id), "done");
    let record = b.text(&b.find(&done).await.unwrap()).await.unwrap();
    assert!(record.contains("abe (approver)"), "who approved: {record}");
    b.goto(&format!("{console}/tasks/{id}")).await.unwrap();
    b.wait_for("#task[data-state=\"done\"]").await.unwrap();
    b.screenshot_to(&shots().join("task.png")).await.unwrap();

    b.quit().await.unwrap();
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_no_buttons_forged_posts_change_nothing_and_names_render_as_text() {
    let fleet = Fleet::start("viewer").await;
    let console = fleet.console();
    let id = fleet.park_a_send_request().await;
    let planted = fleet.plant_script_tenant(&id);
    let b = browser().await;

    // The viewer sees the waiting tasks and no button.
    sign_in(&b, &console, VIEWER).await;
    b.goto(&format!("{console}/tasks")).await.unwrap();
    b.wait_for(&format!("tr.task[data-task=\"{id}\"]"))
        .await
        .unwrap();
    assert!(b.find_all("button.approve").await.unwrap().is_empty());
    assert!(b.find_all("button.drop").await.unwrap().is_empty());
    assert!(b
        .find_all("form[action^=\"/tasks/\"]")
        .await
        .unwrap()
        .is_empty());

    // The `<script>` tenant renders as text: escaped in the source, shown
    // as its characters, and no alert.
    let source = b.source().await.unwrap();
    assert!(source.contains(SCRIPT_ESCAPED), "{source}");
    assert!(!source.contains(SCRIPT), "{source}");
    let cell = b
        .find(&format!("tr.task[data-task=\"{planted}\"] td.tenant"))
        .await
        .unwrap();
    assert_eq!(b.text(&cell).await.unwrap(), SCRIPT);
    assert_eq!(b.alert_text().await.unwrap(), None, "a script ran");
    b.screenshot_to(&shots().join("tasks-viewer.png"))
        .await
        .unwrap();

    // Forged POSTs: the viewer's own session with its valid CSRF token,
    // and an approver's session without one. Both 403; the task waits.
    let viewer_cookie = b.cookie("router_console").await.unwrap().unwrap();
    let viewer_cookie = viewer_cookie["value"].as_str().unwrap().to_string();
    let client = TestClient::new();
    let approve = format!("{console}/tasks/{id}/approve");
    let viewer_csrf = http_only::csrf_of(&client, &console, &viewer_cookie).await;
    let r = http_only::post(
        &client,
        &approve,
        &viewer_cookie,
        &format!("csrf={viewer_csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    let approver_cookie = http_only::sign_in(&client, &console, APPROVER).await;
    for body in ["", "csrf=", "csrf=0000", &format!("csrf={viewer_csrf}")] {
        let r = http_only::post(&client, &approve, &approver_cookie, body).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{body}: {}", r.text());
    }
    let drop = format!("{console}/tasks/{id}/drop");
    let r = http_only::post(&client, &drop, &approver_cookie, "").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    fleet.backend_up(true).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        fleet.task_state(&id),
        "waiting_approval",
        "changed by a forged POST"
    );
    assert_eq!(fleet.backend.stats().received, 0);
    // The page still offers the viewer nothing, and shows the task waiting.
    b.goto(&format!("{console}/tasks")).await.unwrap();
    b.wait_for(&format!(
        "#state-waiting_approval tr.task[data-task=\"{id}\"]"
    ))
    .await
    .unwrap();

    b.quit().await.unwrap();
    fleet.stop().await;
}
