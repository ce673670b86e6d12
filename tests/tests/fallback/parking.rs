//! Safe mode (`on_all_down: park`): when every pool of a route is down, a
//! request is parked as a task in the shared store; it runs once, on one
//! proxy, when a pool comes back (READ/DRAFT) or after an operator
//! approves it (SEND/DESTRUCTIVE); its client fetches it through any
//! proxy. Two proxies, one real `redis-server`, mock backends.

use std::time::Duration;

use http::{Method, StatusCode};
use router_mock::Behavior;
use router_proxy::SharedStore;
use router_tests::harness::{TestProxy, TestResponse};
use router_tests::mocks::{mock, mock_latency};
use router_tests::redis::RedisServer;
use serde_json::Value;
use std::process::ExitCode;

use routerctl::tasks_cmd::Action;

use crate::settings;

fn policy(url: &str, park: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 3, open_duration_s: 1}}
  pools:
    - name: only
      endpoints: ["{url}"]
  routes:
    - name: send
      match: {{risk: [SEND, DESTRUCTIVE]}}
      chain: [only]
      on_all_down: park
      park: {park}
    - name: r
      chain: [only]
      on_all_down: park
      park: {park}
"#
    )
}

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"later is fine"}]}"#;

/// Two proxies on one store, with `policy(url, park)`, their pool emptied
/// (every backend down) once both reach the store.
async fn fleet(
    redis: &RedisServer,
    url: &str,
    park: &str,
    lease_ms: u64,
) -> (TestProxy, TestProxy) {
    let mut s = settings();
    s.shared_store = Some(SharedStore::new(&redis.url()).unwrap());
    s.task_lease = Duration::from_millis(lease_ms);
    let a = TestProxy::with_policy(s.clone(), &policy(url, park)).await;
    let b = TestProxy::with_policy(s, &policy(url, park)).await;
    for p in [&a, &b] {
        let key = format!("warm-{}", p.addr().port());
        let mut ok = false;
        for _ in 0..200 {
            let r = p
                .chat_with(
                    &[("idempotency-key", &key), ("x-router-risk", "SEND")],
                    BODY,
                )
                .await;
            if r.status == StatusCode::OK {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ok, "proxy did not reach the shared store");
        p.set_backends_pool("only", &[]).await;
    }
    (a, b)
}

async fn task(p: &TestProxy, id: &str) -> TestResponse {
    p.client
        .send(
            Method::GET,
            &p.url(&format!("/v1/router/tasks/{id}")),
            &[],
            String::new(),
        )
        .await
}

/// Polls the task through `p` until its state is `state`.
async fn wait_state(p: &TestProxy, id: &str, state: &str) -> TestResponse {
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = task(p, id).await;
        if r.header("x-router-task-state") == Some(state) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "task {id} never reached {state}: {} {}",
            r.status,
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn parked_id(r: &TestResponse) -> String {
    let v: Value = r.json();
    let id = v["id"]
        .as_str()
        .or(v["error"]["task"]["id"].as_str())
        .unwrap_or_else(|| panic!("no task id in {v}"));
    id.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_request_parked_while_all_is_down_runs_once_when_a_backend_returns() {
    let redis = RedisServer::start("park-read").await;
    let m = mock("m", Behavior::Json).await;
    let (a, b) = fleet(&redis, &m.url(), "{ttl_s: 60, max_tasks: 10}", 10_000).await;
    let before = m.stats().received;

    // With Prefer: respond-async: 202, a Location and the task.
    let accepted = a.chat_with(&[("prefer", "respond-async")], BODY).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text());
    let id = parked_id(&accepted);
    assert_eq!(
        accepted.header("location"),
        Some(format!("/v1/router/tasks/{id}").as_str())
    );
    assert_eq!(accepted.json()["state"], "waiting_capacity");
    assert_eq!(accepted.header("preference-applied"), Some("respond-async"));

    // Without: 503 parked, with the task id and Retry-After; keyed, so
    // that its retry finds it.
    let key = [("idempotency-key", "park-k1")];
    let parked = a.chat_with(&key, BODY).await;
    assert_eq!(parked.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(parked.error_type(), "parked");
    assert!(parked.header("retry-after").is_some());
    let keyed = parked_id(&parked);
    assert_eq!(parked.json()["error"]["task"]["state"], "waiting_capacity");
    // A retry with the same key, on the other proxy: the same task.
    let again = b.chat_with(&key, BODY).await;
    assert_eq!(again.error_type(), "parked");
    assert_eq!(parked_id(&again), keyed);

    // The handle works through either proxy; nothing ran.
    let waiting = task(&b, &id).await;
    assert_eq!(waiting.status, StatusCode::OK);
    assert_eq!(waiting.json()["state"], "waiting_capacity");
    assert_eq!(m.stats().received, before);
    // Both proxies see the fleet's two waiting tasks.
    let live = "router_parked_tasks_live{route=\"r\",state=\"waiting_capacity\"} 2";
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    for p in [&a, &b] {
        while !p.metrics().await.contains(live) {
            assert!(tokio::time::Instant::now() < until, "{}", p.metrics().await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // The backend comes back (on both proxies): each task runs once, on
    // one of them.
    a.set_backends_pool("only", &[m.url()]).await;
    b.set_backends_pool("only", &[m.url()]).await;
    let done = wait_state(&b, &id, "done").await;
    assert_eq!(done.status, StatusCode::OK);
    assert!(done.json()["choices"].is_array(), "{}", done.text());
    wait_state(&a, &keyed, "done").await;
    // The keyed retry now gets the answer.
    let answered = b.chat_with(&key, BODY).await;
    assert_eq!(answered.status, StatusCode::OK, "{}", answered.text());
    assert_eq!(answered.header("x-router-replayed"), Some("true"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(m.stats().received - before, 2, "each task generated once");
    // The runs carried the parked request's id, and nothing of the
    // router's own (the run's mark least of all).
    let runs: Vec<_> = m.requests().into_iter().skip(before as usize).collect();
    for r in &runs {
        assert!(r.headers.get("x-router-task-run").is_none());
        assert!(r
            .headers
            .keys()
            .all(|k| !k.as_str().starts_with("x-router-")));
    }
    assert!(runs.iter().any(|r| r
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        == Some("park-k1")));

    // The run's route log line is linked to the park record.
    let mut lines = a.log.lines();
    lines.extend(b.log.lines());
    let park = lines
        .iter()
        .find(|l| l["parked_task"] == id.as_str() && l["outcome"] == "parked")
        .unwrap_or_else(|| panic!("no park line: {lines:?}"));
    let runs: Vec<&Value> = lines
        .iter()
        .filter(|l| l["parked_task"] == id.as_str() && l["outcome"] == "ok")
        .collect();
    assert_eq!(runs.len(), 1, "one run, on one proxy: {lines:?}");
    assert_eq!(park["request_id"], runs[0]["request_id"]);
    let metrics = format!("{}{}", a.metrics().await, b.metrics().await);
    assert!(
        metrics.contains("router_parked_tasks_total{route=\"r\",state=\"done\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_request_waits_for_approval_even_when_backends_return() {
    let redis = RedisServer::start("park-send").await;
    let m = mock("m", Behavior::Json).await;
    let (a, b) = fleet(&redis, &m.url(), "{ttl_s: 60}", 10_000).await;
    let before = m.stats().received;
    let r = a
        .chat_with(
            &[("x-router-risk", "SEND"), ("prefer", "respond-async")],
            BODY,
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert_eq!(r.json()["state"], "waiting_approval");
    let id = parked_id(&r);
    a.set_backends_pool("only", &[m.url()]).await;
    b.set_backends_pool("only", &[m.url()]).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(m.stats().received, before, "nothing is sent unapproved");
    assert_eq!(task(&b, &id).await.json()["state"], "waiting_approval");

    // An operator approves (routerctl tasks approve, through the control
    // plane reading the same store).
    ops::approve(&redis, &id).await;
    let done = wait_state(&b, &id, "done").await;
    assert_eq!(done.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(m.stats().received - before, 1, "sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_expire_the_cap_holds_and_a_dropped_task_never_runs() {
    let redis = RedisServer::start("park-ttl").await;
    let m = mock("m", Behavior::Json).await;
    let (a, b) = fleet(&redis, &m.url(), "{ttl_s: 1, max_tasks: 2}", 10_000).await;
    let before = m.stats().received;
    let first = a.chat_with(&[("prefer", "respond-async")], BODY).await;
    // Parked in a later millisecond: listed after the first.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = b.chat_with(&[("prefer", "respond-async")], BODY).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert_eq!(second.status, StatusCode::ACCEPTED);
    // The cap: a third is no_backend, as without parking.
    let third = a.chat_with(&[("prefer", "respond-async")], BODY).await;
    assert_eq!(third.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(third.error_type(), "no_backend");
    assert!(third.text().contains("cap of 2"), "{}", third.text());
    let (first, second) = (parked_id(&first), parked_id(&second));
    // routerctl tasks list: both, oldest first; an approval a READ task
    // does not wait for is refused.
    let listed = ops::list(&redis).await;
    assert_eq!(listed, vec![first.clone(), second.clone()]);
    assert_eq!(
        ops::try_act(&redis, Action::Approve, &first).await,
        ExitCode::FAILURE
    );
    // Dropped by an operator; the other expires after its second.
    ops::drop_task(&redis, &second).await;
    assert_eq!(task(&a, &second).await.json()["state"], "dropped");
    wait_state(&b, &first, "expired").await;
    a.set_backends_pool("only", &[m.url()]).await;
    b.set_backends_pool("only", &[m.url()]).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(m.stats().received, before, "neither ran");
    assert_eq!(task(&a, &first).await.json()["state"], "expired");
    // Nothing follows an end: a dropped task cannot be approved.
    assert_eq!(
        ops::try_act(&redis, Action::Approve, &second).await,
        ExitCode::FAILURE
    );
    assert!(ops::list(&redis).await.is_empty());
    // Room again: the route parks anew (its backends are up, so it is
    // simply answered).
    let fresh = a.chat_with(&[], BODY).await;
    assert_eq!(fresh.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_killed_while_running_a_task_leaves_it_to_another_which_finishes_it() {
    let redis = RedisServer::start("park-kill").await;
    let slow = mock_latency("m", 1500).await;
    let (a, b) = fleet(&redis, &slow.url(), "{ttl_s: 60}", 600).await;
    let r = a.chat_with(&[("prefer", "respond-async")], BODY).await;
    let id = parked_id(&r);
    let before = slow.stats().received;
    // Only A sees the backend back: A claims the task and starts it.
    a.set_backends_pool("only", &[slow.url()]).await;
    wait_state(&b, &id, "running").await;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while slow.stats().received == before {
        assert!(tokio::time::Instant::now() < until, "A never sent it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A dies holding the claim.
    drop(a);
    b.set_backends_pool("only", &[slow.url()]).await;
    let done = wait_state(&b, &id, "done").await;
    assert_eq!(done.status, StatusCode::OK);
    let view = ops::show(&redis, &id).await;
    assert_eq!(view["runs"], 2, "{view}");
    // One answer: the task is done once and stays done.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        task(&b, &id).await.header("x-router-task-state"),
        Some("done")
    );
}

/// What an operator does, as `routerctl tasks` does it: through a control
/// plane started with `--shared-store` on the same Redis.
mod ops {
    use std::net::SocketAddr;
    use std::process::ExitCode;

    use router_tests::control::TOKEN;
    use router_tests::redis::RedisServer;
    use routerctl::tasks_cmd::{self, Action};

    async fn admin(
        redis: &RedisServer,
    ) -> (
        router_control_plane::RunningControlPlane,
        routerctl::admin_cmd::Admin,
    ) {
        admin_as(redis, TOKEN).await
    }

    /// A control plane whose operator tokens are `TOKEN` (unnamed) and
    /// `alice-secret` (named `alice`), and routerctl with `token`.
    pub(super) async fn admin_as(
        redis: &RedisServer,
        token: &str,
    ) -> (
        router_control_plane::RunningControlPlane,
        routerctl::admin_cmd::Admin,
    ) {
        let dir = std::env::temp_dir().join(format!(
            "router-park-cp-{}-{}",
            std::process::id(),
            redis.port()
        ));
        let _ = std::fs::create_dir_all(&dir);
        let cp = router_control_plane::start(router_control_plane::ControlPlaneOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            store: router_control_plane::StoreLocation::Embedded(dir),
            token: Some(TOKEN.into()),
            operator_tokens: vec![router_control_plane::auth::OperatorToken {
                token: "alice-secret".into(),
                name: Some("alice".into()),
            }],
            shared_store: Some(redis.url()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("control plane: {e}"));
        let admin =
            routerctl::admin_cmd::connect(&cp.local_addr().to_string(), Some(token.into()), None)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        (cp, admin)
    }

    /// `routerctl tasks approve|drop ID [--operator said]` with `token`.
    pub(super) async fn act_as(
        redis: &RedisServer,
        token: &str,
        action: Action,
        id: &str,
        said: &str,
    ) -> ExitCode {
        let (cp, mut admin) = admin_as(redis, token).await;
        let code = tasks_cmd::act(
            &mut admin,
            action,
            id,
            said,
            routerctl::policy_cmd::Output::Json,
        )
        .await;
        cp.shutdown().await;
        code
    }

    /// The views `routerctl tasks list` shows, in order.
    pub(super) async fn list_views(redis: &RedisServer) -> Vec<router_proto::v1::TaskView> {
        let (cp, mut admin) = admin(redis).await;
        let tasks = admin
            .list_tasks(router_proto::v1::ListTasksRequest::default())
            .await
            .unwrap_or_else(|s| panic!("{s}"))
            .into_inner()
            .tasks;
        cp.shutdown().await;
        tasks
    }

    /// `routerctl tasks approve|drop ID`: its exit code.
    pub(super) async fn try_act(redis: &RedisServer, action: Action, id: &str) -> ExitCode {
        let (cp, mut admin) = admin(redis).await;
        let code = tasks_cmd::act(
            &mut admin,
            action,
            id,
            "test-operator",
            routerctl::policy_cmd::Output::Json,
        )
        .await;
        cp.shutdown().await;
        code
    }

    async fn act(redis: &RedisServer, action: Action, id: &str) {
        let code = try_act(redis, action, id).await;
        assert_eq!(code, ExitCode::SUCCESS, "routerctl tasks {action:?} {id}");
    }

    /// The ids `routerctl tasks list` shows, in order.
    pub(super) async fn list(redis: &RedisServer) -> Vec<String> {
        let (cp, mut admin) = admin(redis).await;
        let tasks = admin
            .list_tasks(router_proto::v1::ListTasksRequest::default())
            .await
            .unwrap_or_else(|s| panic!("{s}"))
            .into_inner()
            .tasks;
        cp.shutdown().await;
        tasks.into_iter().map(|t| t.id).collect()
    }

    /// `routerctl tasks approve ID`.
    pub(super) async fn approve(redis: &RedisServer, id: &str) {
        act(redis, Action::Approve, id).await;
    }

    /// `routerctl tasks drop ID`.
    pub(super) async fn drop_task(redis: &RedisServer, id: &str) {
        act(redis, Action::Drop, id).await;
    }

    /// `routerctl tasks show ID -o json`, as JSON.
    pub(super) async fn show(redis: &RedisServer, id: &str) -> serde_json::Value {
        let (cp, mut admin) = admin(redis).await;
        let v = admin
            .get_task(router_proto::v1::TaskRequest {
                id: id.to_string(),
                operator: String::new(),
            })
            .await
            .unwrap_or_else(|s| panic!("{s}"))
            .into_inner();
        cp.shutdown().await;
        serde_json::json!({
            "state": v.state,
            "runs": v.runs,
            "approved": v.approved,
            "operator": v.operator,
            "operator_role": v.operator_role,
            "operator_token": v.operator_token,
            "tenant": v.tenant,
        })
    }
}

/// One proxy, no shared store: parked tasks are kept in
/// `CUSTOM_ROUTER_TASKS_FILE` and survive a restart of the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_shared_store_a_parked_task_survives_a_restart_in_its_file() {
    let m = mock("m", Behavior::Json).await;
    let dir = std::env::temp_dir().join(format!("router-park-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut s = settings();
    s.tasks_file = Some(dir.join("tasks.json"));
    let yaml = policy(&m.url(), "{ttl_s: 60}");
    let first = TestProxy::with_policy(s.clone(), &yaml).await;
    first.set_backends_pool("only", &[]).await;
    let r = first.chat_with(&[("prefer", "respond-async")], BODY).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let id = parked_id(&r);
    drop(first);
    // A new proxy on the same file, its backend up: it runs the task.
    let second = TestProxy::with_policy(s, &yaml).await;
    let done = wait_state(&second, &id, "done").await;
    assert_eq!(done.status, StatusCode::OK);
    assert_eq!(m.stats().received, 1);
    let unknown = task(&second, "0123456789abcdef").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A SEND task whose runner dies may already have acted: it is marked
/// failed, never sent a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_task_whose_runner_dies_fails_instead_of_being_sent_twice() {
    let redis = RedisServer::start("park-kill-send").await;
    let slow = mock_latency("m", 1500).await;
    let (a, b) = fleet(&redis, &slow.url(), "{ttl_s: 60}", 600).await;
    let r = a
        .chat_with(
            &[("prefer", "respond-async"), ("x-router-risk", "SEND")],
            BODY,
        )
        .await;
    let id = parked_id(&r);
    let before = slow.stats().received;
    ops::approve(&redis, &id).await;
    a.set_backends_pool("only", &[slow.url()]).await;
    wait_state(&b, &id, "running").await;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while slow.stats().received == before {
        assert!(tokio::time::Instant::now() < until, "A never sent it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(a);
    b.set_backends_pool("only", &[slow.url()]).await;
    let failed = wait_state(&b, &id, "failed").await;
    let v = failed.json();
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not sent again"),
        "{v}"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(slow.stats().received - before, 1, "sent once, never again");
    let view = ops::show(&redis, &id).await;
    assert_eq!(view["operator"], "test-operator", "{view}");
}

/// A backend that refuses connections is down too: the request parks, its
/// runs while it still refuses are put back in line (never failed), and
/// it runs once the backend listens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_by_every_backend_parks_and_runs_when_one_listens_again() {
    let port = router_tests::server_process::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut s = settings();
    s.task_lease = Duration::from_millis(600);
    let p = TestProxy::with_policy(s, &policy(&url, "{ttl_s: 60}")).await;
    let r = p.chat_with(&[("prefer", "respond-async")], BODY).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let id = parked_id(&r);
    // Runs meanwhile meet the refusal again: still waiting, not failed.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let waiting = task(&p, &id).await.json();
    assert_eq!(waiting["state"], "waiting_capacity", "{waiting}");
    let m = router_mock::MockModel::start_on(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        router_mock::MockConfig {
            name: "back".into(),
            behavior: Behavior::Json,
            ..router_mock::MockConfig::default()
        },
    )
    .await
    .unwrap();
    // The circuit opened on the refusals (3 in a row): the task runs as
    // its first probe, once the open duration (1 s, doubling per failed
    // probe) is over.
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = task(&p, &id).await;
        if r.header("x-router-task-state") == Some("done") {
            break;
        }
        assert!(tokio::time::Instant::now() < until, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(m.stats().received, 1);
}

/// Without a control plane, the proxy's admin API approves a SEND task
/// (behind the admin token), which then runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_proxy_approves_a_task_through_its_admin_api() {
    let m = mock("m", Behavior::Json).await;
    let p = TestProxy::with_policy(settings(), &policy(&m.url(), "{ttl_s: 60}")).await;
    p.set_backends_pool("only", &[]).await;
    let r = p
        .chat_with(
            &[("prefer", "respond-async"), ("x-router-risk", "SEND")],
            BODY,
        )
        .await;
    let id = parked_id(&r);
    p.set_backends_pool("only", &[m.url()]).await;
    // Without the token: refused.
    let path = format!("/_custom_router/tasks/{id}/approve");
    let refused = p
        .client
        .send(Method::POST, &p.url(&path), &[], String::new())
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(m.stats().received, 0);
    let ok = p.admin_call(Method::POST, &path, String::new()).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    assert_eq!(ok.json()["approved"], true);
    wait_state(&p, &id, "done").await;
    // Done: nothing follows, a drop is refused.
    let drop = p
        .admin_call(
            Method::POST,
            &format!("/_custom_router/tasks/{id}/drop"),
            String::new(),
        )
        .await;
    assert_eq!(drop.status, StatusCode::BAD_REQUEST, "{}", drop.text());
    assert_eq!(m.stats().received, 1);
}

/// A parked task lives within its own deadline (`X-Router-Deadline-Ms`)
/// as well as its TTL; a streamed request's answer is kept as its frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_expires_at_its_own_deadline_and_a_stream_is_kept_whole() {
    let m = router_tests::mocks::mock_sse("m", 3, 5).await;
    let p = TestProxy::with_policy(settings(), &policy(&m.url(), "{ttl_s: 60}")).await;
    p.set_backends_pool("only", &[]).await;
    let short = p
        .chat_with(
            &[("prefer", "respond-async"), ("x-router-deadline-ms", "400")],
            BODY,
        )
        .await;
    assert_eq!(short.status, StatusCode::ACCEPTED);
    let short = parked_id(&short);
    let stream_body =
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"later"}]}"#;
    let streamed = p
        .chat_with(&[("prefer", "respond-async")], stream_body)
        .await;
    let streamed = parked_id(&streamed);
    wait_state(&p, &short, "expired").await;
    p.set_backends_pool("only", &[m.url()]).await;
    let done = wait_state(&p, &streamed, "done").await;
    assert_eq!(done.header("content-type"), Some("text/event-stream"));
    assert!(done.text().contains("[DONE]"), "{}", done.text());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(task(&p, &short).await.json()["state"], "expired");
    assert_eq!(m.stats().received, 1, "only the stream ran");
}

/// A chat body whose content is `n` bytes of `x`.
fn big_body(n: usize) -> String {
    format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(n)
    )
}

/// Issue 28, item 3: parked tasks are capped in bytes (the route's
/// `park.max_bytes`), and the dispatchers read the tasks' records, never
/// their bodies: two proxies idling over two parked 4 MiB bodies read
/// almost nothing from Redis (before: every body, four times a second,
/// on each proxy). A body is read once, to run its task, which sends it
/// whole; the store drops it when the task ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_bytes_are_capped_and_the_dispatchers_read_no_bodies() {
    let redis = RedisServer::start("park-bytes").await;
    let m = mock("m", Behavior::Json).await;
    let (a, b) = fleet(
        &redis,
        &m.url(),
        "{ttl_s: 60, max_tasks: 10, max_bytes: 10000000}",
        10_000,
    )
    .await;
    let before = m.stats().received;
    let body = big_body(4 << 20);
    let mut ids = Vec::new();
    for p in [&a, &b] {
        let r = p.chat_with(&[("prefer", "respond-async")], &body).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
        ids.push(parked_id(&r));
    }
    // A third would pass the route's 10 MB: no_backend, as at the count cap.
    let third = a.chat_with(&[("prefer", "respond-async")], &body).await;
    assert_eq!(
        third.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        third.text()
    );
    assert_eq!(third.error_type(), "no_backend");
    assert!(third.text().contains("park.max_bytes"), "{}", third.text());
    // Idle for 2 s (8 polls on each proxy): what Redis sent them.
    let sent = || redis.info("stats", "total_net_output_bytes").unwrap_or(0);
    let start = sent();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = sent() - start;
    assert!(
        idle < 1 << 20,
        "the dispatchers read {idle} bytes in 2 s of idling over 8 MiB of parked bodies"
    );
    // Bodies are kept apart from the records.
    let key = format!("router:task:{}", ids[0]);
    let stored = redis.query(&["HGET", &key, "body"]).unwrap_or_default();
    assert_eq!(stored.len(), body.len());
    let doc = redis.query(&["HGET", &key, "doc"]).unwrap_or_default();
    assert!(doc.len() < 4096, "a record of {} bytes", doc.len());
    // Runs send each body whole; ended tasks' bodies leave the store.
    a.set_backends_pool("only", &[m.url()]).await;
    b.set_backends_pool("only", &[m.url()]).await;
    for id in &ids {
        wait_state(&a, id, "done").await;
    }
    let runs: Vec<_> = m.requests().into_iter().skip(before as usize).collect();
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert_eq!(r.body.as_ref(), body.as_bytes());
    }
    assert_eq!(redis.query(&["HEXISTS", &key, "body"]), Some(b"0".to_vec()));
    assert_eq!(
        redis.query(&["HLEN", "router:tasks:bytes"]),
        Some(b"0".to_vec())
    );
}

/// Issue 28, item 10: a request parked after every pool refused its
/// connection runs with what its client sent (its `Idempotency-Key`,
/// `Content-Type`, its own headers), as any attempt does; before, the
/// last refused attempt had taken its headers, and the task was stored
/// with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_parked_after_refused_attempts_runs_with_its_clients_headers() {
    let port = router_tests::server_process::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut s = settings();
    s.task_lease = Duration::from_millis(600);
    let p = TestProxy::with_policy(s, &policy(&url, "{ttl_s: 60}")).await;
    let r = p
        .chat_with(
            &[
                ("prefer", "respond-async"),
                ("idempotency-key", "drill-k1"),
                ("x-client-tag", "t-1"),
                ("authorization", "Bearer client-secret"),
            ],
            BODY,
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let id = parked_id(&r);
    let lines = p.log.wait_for(1).await;
    assert!(
        lines.iter().any(|l| l["parked_task"] == id.as_str()
            && l["attempts"].as_array().is_some_and(|a| !a.is_empty())),
        "parked after an attempt: {lines:?}"
    );
    let m = router_mock::MockModel::start_on(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        router_mock::MockConfig {
            name: "back".into(),
            behavior: Behavior::Json,
            ..router_mock::MockConfig::default()
        },
    )
    .await
    .unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    while task(&p, &id).await.header("x-router-task-state") != Some("done") {
        assert!(tokio::time::Instant::now() < until, "never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = m.requests();
    assert_eq!(sent.len(), 1);
    let h = &sent[0].headers;
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    assert_eq!(get("idempotency-key"), Some("drill-k1"), "{h:?}");
    assert_eq!(get("x-request-id"), Some("drill-k1"), "{h:?}");
    assert_eq!(get("content-type"), Some("application/json"), "{h:?}");
    assert_eq!(get("x-client-tag"), Some("t-1"), "{h:?}");
    // Never a credential, nor the router's own headers.
    assert_eq!(get("authorization"), None, "{h:?}");
    assert!(
        h.keys().all(|k| !k.as_str().starts_with("x-router-")),
        "{h:?}"
    );
    assert_eq!(sent[0].body.as_ref(), BODY.as_bytes());
}

fn tenant_policy(url: &str, team_b: bool) -> String {
    use router_policy::tenant::key_hash_text;
    let b = if team_b {
        format!(
            "    - name: team-b\n      keys: [\"{}\"]\n",
            key_hash_text("rt_b")
        )
    } else {
        String::new()
    };
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 3, open_duration_s: 1}}
  pools:
    - name: only
      endpoints: ["{url}"]
  routes:
    - name: r
      chain: [only]
      on_all_down: park
      park: {{ttl_s: 60}}
  tenants:
    - name: team-a
      keys: ["{}"]
{b}    - name: team-c
      keys: ["{}"]
      limits: {{requests_per_minute: 20, requests_burst: 1}}
"#,
        key_hash_text("rt_a"),
        key_hash_text("rt_c"),
    )
}

/// Issue 28, item 16: on a policy with tenants, a tenant's request parks
/// like any other; its task keeps the tenant's name (never its key), shows
/// it in `tasks list`, and its run is admitted under that tenant as the
/// live policy has it: team-a's runs and is done (its key never stored,
/// never sent); team-b, removed from the policy meanwhile, fails; team-c,
/// whose rate limit (one request per 3 s) the parked request used, waits
/// out its `Retry-After` and then runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_request_parks_and_runs_admitted_as_that_tenant_again() {
    let redis = RedisServer::start("park-tenants").await;
    let m = mock("m", Behavior::Json).await;
    let mut s = settings();
    s.shared_store = Some(SharedStore::new(&redis.url()).unwrap());
    let p = TestProxy::with_policy(s, &tenant_policy(&m.url(), true)).await;
    let mut ok = false;
    for _ in 0..200 {
        let r = p
            .chat_with(
                &[
                    ("authorization", "Bearer rt_a"),
                    ("idempotency-key", "warm-tenants"),
                ],
                BODY,
            )
            .await;
        if r.status == StatusCode::OK {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "proxy did not reach the shared store");
    p.set_backends_pool("only", &[]).await;
    let before = m.stats().received;

    let mut ids = Vec::new();
    for key in ["rt_a", "rt_b", "rt_c"] {
        let r = p
            .chat_with(
                &[
                    ("prefer", "respond-async"),
                    ("authorization", &format!("Bearer {key}")),
                ],
                BODY,
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{key}: {}", r.text());
        ids.push(parked_id(&r));
    }
    // The tenant's name is kept, and shown; its key is nowhere.
    let waiting = task(&p, &ids[0]).await.json();
    assert_eq!(waiting["tenant"], "team-a", "{waiting}");
    let listed = ops::list_views(&redis).await;
    let tenants: Vec<&str> = listed.iter().map(|t| t.tenant.as_str()).collect();
    assert_eq!(tenants, ["team-a", "team-b", "team-c"]);
    for id in &ids {
        let doc = redis
            .query(&["HGET", &format!("router:task:{id}"), "doc"])
            .unwrap_or_default();
        let doc = String::from_utf8_lossy(&doc);
        assert!(!doc.contains("rt_"), "a key stored: {doc}");
    }

    // team-b leaves the policy; the backend is back (the new policy's).
    p.apply(&tenant_policy(&m.url(), false));
    p.set_backends_pool("only", &[m.url()]).await;
    let done = wait_state(&p, &ids[0], "done").await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.text());
    let gone = wait_state(&p, &ids[1], "failed").await;
    assert_eq!(gone.status, StatusCode::FORBIDDEN, "{}", gone.text());
    assert!(
        gone.text().contains("no longer in the policy"),
        "{}",
        gone.text()
    );
    // team-c's run met its rate limit: it waits (not failed), then runs.
    let limited = wait_state(&p, &ids[2], "done").await;
    assert_eq!(limited.status, StatusCode::OK, "{}", limited.text());
    let lines = p.log.lines();
    let runs = |id: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["parked_task"] == id && l["outcome"] != "parked")
            .collect()
    };
    let c_runs = runs(&ids[2]);
    assert!(
        c_runs.iter().any(|l| l["outcome"] == "rate_limited"),
        "{c_runs:?}"
    );
    assert!(c_runs.iter().all(|l| l["tenant"] == "team-c"), "{c_runs:?}");
    let a_runs = runs(&ids[0]);
    assert_eq!(a_runs.len(), 1, "{a_runs:?}");
    assert_eq!(a_runs[0]["tenant"], "team-a");
    // Two runs reached the backend, neither with a tenant's key.
    let sent: Vec<_> = m.requests().into_iter().skip(before as usize).collect();
    assert_eq!(sent.len(), 2);
    assert!(sent
        .iter()
        .all(|r| r.headers.get("authorization").is_none()));
}

/// Issue 28, item 14: every approval and drop records the role of the
/// caller's token and the name the token carries, whether or not the
/// operator gave a name (before: `operator: ""` when they gave none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_or_a_drop_records_the_tokens_role_and_name() {
    let redis = RedisServer::start("park-who").await;
    let m = mock("m", Behavior::Json).await;
    let (a, _b) = fleet(&redis, &m.url(), "{ttl_s: 60}", 10_000).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = a
            .chat_with(
                &[("x-router-risk", "SEND"), ("prefer", "respond-async")],
                BODY,
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
        ids.push(parked_id(&r));
    }
    // Alice's named token, no --operator.
    let code = ops::act_as(&redis, "alice-secret", Action::Approve, &ids[0], "").await;
    assert_eq!(code, ExitCode::SUCCESS);
    let view = ops::show(&redis, &ids[0]).await;
    assert_eq!(view["operator_role"], "operator", "{view}");
    assert_eq!(view["operator_token"], "alice", "{view}");
    assert_eq!(view["operator"], "alice", "{view}");
    // The unnamed token with --operator bob: both are kept.
    let code = ops::act_as(
        &redis,
        router_tests::control::TOKEN,
        Action::Drop,
        &ids[1],
        "bob",
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    let view = ops::show(&redis, &ids[1]).await;
    assert_eq!(view["operator_role"], "operator", "{view}");
    assert_eq!(view["operator_token"], "", "{view}");
    assert_eq!(view["operator"], "bob", "{view}");
}

/// Issue 29, item 8: an Anthropic Messages client's request parks like a
/// chat completion's, and the task runs the request as that client sent
/// it: its answer, fetched later, is in Anthropic's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_clients_request_parks_and_its_answer_is_in_its_dialect() {
    let port = router_tests::server_process::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut s = settings();
    s.task_lease = Duration::from_millis(600);
    let p = TestProxy::with_policy(s, &policy(&url, "{ttl_s: 60}")).await;
    let body =
        r#"{"model":"m","max_tokens":32,"messages":[{"role":"user","content":"later is fine"}]}"#;
    let r = p
        .client
        .send(
            Method::POST,
            &p.url("/v1/messages"),
            &[
                ("content-type", "application/json"),
                ("anthropic-version", "2023-06-01"),
                ("prefer", "respond-async"),
            ],
            body.to_string(),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let id = parked_id(&r);
    let m = router_mock::MockModel::start_on(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        router_mock::MockConfig {
            name: "back".into(),
            behavior: Behavior::Chat,
            ..router_mock::MockConfig::default()
        },
    )
    .await
    .unwrap();
    let done = wait_state(&p, &id, "done").await;
    let answer = done.json();
    assert_eq!(answer["type"], "message", "{answer}");
    assert_eq!(
        answer["content"][0]["text"], "echo: later is fine",
        "{answer}"
    );
    // The pool got a chat completion, once.
    assert_eq!(m.stats().received, 1);
    assert_eq!(m.requests()[0].path, "/v1/chat/completions");
}
