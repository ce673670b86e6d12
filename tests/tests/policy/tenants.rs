//! Tenants: a key the policy lists (as a hash) names the caller; no key or
//! an unknown one is 401; a route or risk class beyond the tenant's is 403;
//! the tenant's key never reaches a backend; the tenant is in the route
//! log and the metrics.

use http::StatusCode;
use router_mock::Behavior;
use router_policy::tenant::key_hash_text;
use router_proxy::Settings;
use router_tests::harness::TestProxy;
use router_tests::mocks::mock;

use super::CHAT;

fn tenant_policy(backend: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: local
      endpoints: ["{backend}"]
  routes:
    - name: chat
      match: {{path_prefix: /v1/chat}}
      chain: [local]
    - name: other
      chain: [local]
  tenants:
    - name: team-a
      keys: ["{}"]
      routes: [chat]
      max_risk: DRAFT
    - name: guests
      anonymous: true
      max_risk: READ
"#,
        key_hash_text("rt_team_a_key")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_key_names_the_tenant_and_its_key_never_reaches_a_backend() {
    let backend = mock("local", Behavior::Json).await;
    let proxy = TestProxy::with_policy(Settings::default(), &tenant_policy(&backend.url())).await;
    let key = [("authorization", "Bearer rt_team_a_key")];

    let r = proxy.chat_with(&key, CHAT).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let sent = &backend.requests()[0].headers;
    assert!(sent.get("authorization").is_none(), "{sent:?}");

    // No key: the anonymous tenant (READ only).
    assert_eq!(proxy.chat_with(&[], CHAT).await.status, StatusCode::OK);
    let r = proxy.chat_with(&[("x-router-risk", "DRAFT")], CHAT).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.error_type(), "forbidden");
    assert!(r.text().contains("guests"), "{}", r.text());

    // An unknown key: 401, whatever the anonymous tenant may do.
    let r = proxy
        .chat_with(&[("authorization", "Bearer rt_guess")], CHAT)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.error_type(), "unauthorized");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));

    // Above the tenant's risk class, or off its routes: 403.
    let mut send = key.to_vec();
    send.push(("x-router-risk", "SEND"));
    let r = proxy.chat_with(&send, CHAT).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.text().contains("up to DRAFT"), "{}", r.text());
    let r = router_tests::harness::TestClient::new()
        .send(
            http::Method::POST,
            &proxy.url("/v1/embeddings"),
            &[
                ("content-type", "application/json"),
                ("authorization", "Bearer rt_team_a_key"),
            ],
            r#"{"model":"m","input":"x"}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("route \"other\""), "{message}");
    // Nothing refused reached the backend.
    assert_eq!(backend.stats().received, 2);

    let lines = proxy.log.wait_for(6).await;
    assert_eq!(lines[0]["tenant"], "team-a");
    assert_eq!(lines[1]["tenant"], "guests");
    assert!(lines[3].get("tenant").is_none(), "unknown key: no tenant");
    let m = proxy.metrics().await;
    assert!(
        m.contains(r#"router_tenant_requests_total{tenant="team-a",outcome="ok"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"router_tenant_requests_total{tenant="team-a",outcome="forbidden"} 2"#),
        "{m}"
    );
}

#[test]
fn a_policy_holds_key_hashes_only_and_says_which_field_is_wrong() {
    let bad = tenant_policy("127.0.0.1:9")
        .replace(&key_hash_text("rt_team_a_key"), "rt_team_a_key")
        .replace("routes: [chat]", "routes: [chat, nope]");
    let err = router_policy::document::load(&bad, &Default::default())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("spec.tenants[0].keys[0]"), "{err}");
    assert!(err.contains("sha256:"), "{err}");
    assert!(err.contains("spec.tenants[0].routes[1]"), "{err}");
}

/// One pool `local` at `backend` (with `pool_extra` lines) behind one
/// route `chat`, then `tenants` (the items of `spec.tenants`, each from
/// [`tenant`]); `spec_extra` goes first in the spec.
fn one_pool_with(backend: &str, spec_extra: &str, pool_extra: &str, tenants: &[String]) -> String {
    format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  {spec_extra}\n  pools:\n    - name: local\n      endpoints: [\"{backend}\"]\n      {pool_extra}\n  routes:\n    - name: chat\n      chain: [local]\n  tenants:\n{}",
        tenants.concat()
    )
}

use router_tests::harness::tenant_item as tenant;

fn limited_policy(backend: &str, rpm: u32, store_down: &str) -> String {
    let a = tenant(
        "team-a",
        "rt_a",
        &format!("requests_per_minute: {rpm}{store_down}"),
    );
    let b = tenant("team-b", "rt_b", &format!("requests_per_minute: {rpm}"));
    one_pool_with(backend, "", "", &[a, b])
}

/// Two proxies with `policy`, sharing `redis`, connected to it.
async fn two_proxies_on(
    redis: &router_tests::redis::RedisServer,
    policy: &str,
) -> (TestProxy, TestProxy) {
    let settings = || Settings {
        shared_store: Some(router_proxy::SharedStore::new(&redis.url()).unwrap()),
        ..Settings::default()
    };
    let p1 = TestProxy::with_policy(settings(), policy).await;
    let p2 = TestProxy::with_policy(settings(), policy).await;
    for p in [&p1, &p2] {
        router_tests::harness::eventually(
            std::time::Duration::from_secs(5),
            "store connected",
            || p.proxy.shared_store_connected(),
        )
        .await;
    }
    (p1, p2)
}

const A: [(&str, &str); 1] = [("authorization", "Bearer rt_a")];
const B: [(&str, &str); 1] = [("authorization", "Bearer rt_b")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_refuses_with_the_exact_wait_per_tenant() {
    let backend = mock("local", Behavior::Json).await;
    // 2 a minute: one per 30 s, both at once by default (issue 30: a
    // newcomer's script's second call is not a 429).
    let proxy =
        TestProxy::with_policy(Settings::default(), &limited_policy(&backend.url(), 2, "")).await;
    assert_eq!(proxy.chat_with(&A, CHAT).await.status, StatusCode::OK);
    assert_eq!(proxy.chat_with(&A, CHAT).await.status, StatusCode::OK);
    let r = proxy.chat_with(&A, CHAT).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.error_type(), "rate_limited");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((29..=30).contains(&retry), "{retry}");
    // Another tenant has its own allowance.
    assert_eq!(proxy.chat_with(&B, CHAT).await.status, StatusCode::OK);
    assert_eq!(backend.stats().received, 3);
}

/// Issue 30, item 9: a script at 10 a minute sends a few calls back to
/// back (the default burst, five); `requests_burst` sets it per tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_rate_limit_takes_a_few_calls_at_once_and_its_burst_is_set_per_tenant() {
    let backend = mock("local", Behavior::Json).await;
    let a = tenant("team-a", "rt_a", "requests_per_minute: 10");
    let b = tenant(
        "team-b",
        "rt_b",
        "requests_per_minute: 10, requests_burst: 1",
    );
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &one_pool_with(&backend.url(), "", "", &[a, b]),
    )
    .await;
    let mut a_passed = 0;
    let mut b_passed = 0;
    for _ in 0..7 {
        a_passed += usize::from(proxy.chat_with(&A, CHAT).await.status == StatusCode::OK);
        b_passed += usize::from(proxy.chat_with(&B, CHAT).await.status == StatusCode::OK);
    }
    assert_eq!((a_passed, b_passed), (5, 1));
    // A burst larger than its limit is refused, naming the field.
    let bad = one_pool_with(
        &backend.url(),
        "",
        "",
        &[tenant(
            "team-a",
            "rt_a",
            "requests_per_minute: 10, requests_burst: 11",
        )],
    );
    let err = router_policy::document::load(&bad, &router_policy::QueueSettings::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.tenants[0].limits.requests_burst: must be at most the per-minute limit"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_across_proxies_sharing_redis() {
    let redis = router_tests::redis::RedisServer::start("tenants").await;
    let backend = mock("local", Behavior::Json).await;
    // 60 a minute: one a second, bursts of 5 (the default).
    let policy = limited_policy(&backend.url(), 60, "");
    let (p1, p2) = two_proxies_on(&redis, &policy).await;
    let mut passed = 0;
    for i in 0..8 {
        let p = if i % 2 == 0 { &p1 } else { &p2 };
        if p.chat_with(&A, CHAT).await.status == StatusCode::OK {
            passed += 1;
        }
    }
    // One allowance for the fleet: the burst of 5, not 5 per proxy.
    assert_eq!(passed, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_down_a_rate_limit_fails_open_unless_told_otherwise() {
    let backend = mock("local", Behavior::Json).await;
    let closed_port = router_tests::server_process::free_port();
    let settings = || Settings {
        shared_store: Some(
            router_proxy::SharedStore::new(&format!("redis://127.0.0.1:{closed_port}")).unwrap(),
        ),
        ..Settings::default()
    };
    let open = TestProxy::with_policy(settings(), &limited_policy(&backend.url(), 2, "")).await;
    for _ in 0..3 {
        assert_eq!(open.chat_with(&A, CHAT).await.status, StatusCode::OK);
    }
    let closed = TestProxy::with_policy(
        settings(),
        &limited_policy(&backend.url(), 2, ", on_store_down: closed"),
    )
    .await;
    let r = closed.chat_with(&A, CHAT).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.error_type(), "shared_store_unavailable");
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("rate limit"), "{message}");
    // team-b has no on_store_down: open.
    assert_eq!(closed.chat_with(&B, CHAT).await.status, StatusCode::OK);
}

/// Issue #17's budget test: a flood from one tenant through two proxies
/// sharing Redis, with a budget of three and a half calls: exactly three
/// are answered, every other is refused 402, and the recorded spend is
/// the sum of the answers' costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spend_budget_holds_exactly_across_proxies_under_a_flood() {
    let redis = router_tests::redis::RedisServer::start("budget").await;
    let backend = mock("local", Behavior::Json).await;
    let body = r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    // The mock reports ceil(len / 4) prompt tokens and 5 completion tokens:
    // at $1 per 1k tokens each way, one call costs this many micro-USD,
    // exactly the worst case reserved (max_tokens 5).
    let call = (body.len() as u64).div_ceil(4) * 1000 + 5 * 1000;
    let budget_usd = 3.5 * call as f64 / 1e6;
    let policy = one_pool_with(
        &backend.url(),
        "",
        "price: {input_per_1k_usd: 1.0, output_per_1k_usd: 1.0}",
        &[tenant(
            "team-a",
            "rt_a",
            &format!("budget_usd_per_day: {budget_usd}"),
        )],
    );
    let (p1, p2) = two_proxies_on(&redis, &policy).await;
    let mut flood = Vec::new();
    for i in 0..12 {
        let p = if i % 2 == 0 { &p1 } else { &p2 };
        flood.push(p.chat_with(&A, body));
    }
    let answers = futures_util::future::join_all(flood).await;
    let ok = answers
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    assert_eq!(
        ok,
        3,
        "{:?}",
        answers.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    for r in answers.iter().filter(|r| r.status != StatusCode::OK) {
        assert_eq!(r.status, StatusCode::PAYMENT_REQUIRED);
        assert_eq!(r.error_type(), "budget_exceeded");
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains("left of its day budget"), "{message}");
        assert!(message.contains("resets at"), "{message}");
    }
    assert_eq!(backend.stats().received, 3);
    // Settled: the recorded spend is the sum of the answers' costs. (The
    // budget's day is the wall clock's: the point here.)
    let day = router_policy::tenant::periods(router_policy::wall_clock::since_epoch().as_secs()).0;
    let key = format!("router:spend:team-a:{day}");
    router_tests::harness::eventually(std::time::Duration::from_secs(2), "settled", || {
        redis.get(&key) == Some((3 * call).to_string())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_gets_no_answer_gives_its_reservation_back() {
    let backend = mock("local", Behavior::Status(500)).await;
    let body = r#"{"model":"m","max_tokens":5,"messages":[]}"#;
    let call = (body.len() as u64).div_ceil(4) * 1000 + 5 * 1000;
    let budget = 1.5 * call as f64 / 1e6;
    let policy = one_pool_with(
        &backend.url(),
        "circuit_breaker: {consecutive_errors: 100}",
        "price: {input_per_1k_usd: 1.0, output_per_1k_usd: 1.0}",
        &[tenant(
            "team-a",
            "rt_a",
            &format!("budget_usd_per_day: {budget}"),
        )],
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    // Each failed call gives its reservation back: the budget of one and a
    // half calls lets every one through to the (failing) backend.
    for _ in 0..4 {
        let r = proxy.chat_with(&A, body).await;
        assert_eq!(r.status.as_u16(), 500);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(backend.stats().received, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_cap_holds_across_proxies_and_frees_as_requests_end() {
    let redis = router_tests::redis::RedisServer::start("slots").await;
    let backend = router_tests::mocks::mock_latency("local", 300).await;
    let policy = one_pool_with(
        &backend.url(),
        "",
        "",
        &[tenant("team-a", "rt_a", "concurrent_requests: 2")],
    );
    let (p1, p2) = two_proxies_on(&redis, &policy).await;
    let mut burst = Vec::new();
    for i in 0..6 {
        let p = if i % 2 == 0 { &p1 } else { &p2 };
        burst.push(p.chat_with(&A, CHAT));
    }
    let answers = futures_util::future::join_all(burst).await;
    let ok = answers
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    assert_eq!(
        ok,
        2,
        "{:?}",
        answers.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    for r in answers.iter().filter(|r| r.status != StatusCode::OK) {
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.error_type(), "rate_limited");
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    // The slots came back with the answers: the keys left are the store's
    // epoch marker (router_policy::store_epoch), if any, and the tenant's
    // hourly rollups (router_policy::rollup).
    let rollups = || -> u64 {
        redis
            .query(&["EVAL", "return #redis.call('KEYS', 'router:rollup:*')", "0"])
            .and_then(|v| String::from_utf8(v).ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    router_tests::harness::eventually(std::time::Duration::from_secs(2), "slots freed", || {
        redis.dbsize() == u64::from(redis.get("router:store:epoch").is_some()) + rollups()
    })
    .await;
    assert_eq!(p2.chat_with(&A, CHAT).await.status, StatusCode::OK);
}

/// Issue #17, item 7: a tenant flooding a saturated pool does not starve
/// another: the light tenant's requests reach the backend in turn with the
/// heavy tenant's, not after its whole backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_tenant_cannot_starve_a_light_one_in_a_saturated_pool() {
    let backend = router_tests::mocks::mock_latency("local", 30).await;
    let policy = one_pool_with(
        &backend.url(),
        "",
        "max_concurrency: 1",
        &[
            tenant("heavy", "rt_heavy", ""),
            tenant("light", "rt_light", ""),
        ],
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    let mut calls = Vec::new();
    for i in 0..20 {
        let id = format!("heavy-{i}");
        calls.push((id, "Bearer rt_heavy"));
    }
    for i in 0..2 {
        calls.push((format!("light-{i}"), "Bearer rt_light"));
    }
    let headers: Vec<[(&str, &str); 2]> = calls
        .iter()
        .map(|(id, key)| [("authorization", *key), ("x-request-id", id.as_str())])
        .collect();
    // Ten times the light tenant's requests, all queued at once.
    let sent = headers.iter().map(|h| proxy.chat_with(h, CHAT));
    let answers = futures_util::future::join_all(sent).await;
    assert!(answers.iter().all(|r| r.status == StatusCode::OK));
    let order: Vec<String> = backend
        .requests()
        .iter()
        .map(|r| r.headers["x-request-id"].to_str().unwrap().to_string())
        .collect();
    let positions: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, id)| id.starts_with("light"))
        .map(|(i, _)| i)
        .collect();
    // FIFO would put them at 20 and 21; in turn, among the first five.
    assert!(
        positions.iter().all(|p| *p < 5),
        "light tenant at {positions:?} of {order:?}"
    );
}

/// Tokens per minute: a call's worst case (prompt + max_tokens) is drawn
/// before it is sent and settled to its usage after, so a call that asked
/// for far more than it used does not lock the tenant out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_limit_draws_the_worst_case_and_settles_to_usage() {
    let backend = mock("local", Behavior::Json).await;
    let policy = one_pool_with(
        &backend.url(),
        "",
        "",
        &[tenant("team-a", "rt_a", "tokens_per_minute: 600")],
    );
    let proxy = TestProxy::with_policy(Settings::default(), &policy).await;
    // 600 a minute: 0.1 s a token, a burst of 30 tokens. Each call may use
    // ~5,020 tokens (8 minutes' worth) and uses ~25 (the mock's usage).
    let big = r#"{"model":"m","max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}"#;
    let settle = || tokio::time::sleep(std::time::Duration::from_millis(100));
    assert_eq!(proxy.chat_with(&A, big).await.status, StatusCode::OK);
    settle().await;
    // Settled to ~25 tokens: the next call fits (unsettled, it would wait
    // eight minutes).
    assert_eq!(proxy.chat_with(&A, big).await.status, StatusCode::OK);
    settle().await;
    // Two calls' real tokens (~5 s) are past the burst: the third waits.
    let r = proxy.chat_with(&A, big).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.error_type(), "rate_limited");
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("token limit"), "{message}");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry), "{retry}");
    assert_eq!(backend.stats().received, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_down_a_budget_fails_closed_unless_told_otherwise() {
    let backend = mock("local", Behavior::Json).await;
    let closed_port = router_tests::server_process::free_port();
    let settings = || Settings {
        shared_store: Some(
            router_proxy::SharedStore::new(&format!("redis://127.0.0.1:{closed_port}")).unwrap(),
        ),
        ..Settings::default()
    };
    let policy = |extra: &str| {
        let limits = format!("budget_usd_per_day: 10{extra}");
        one_pool_with(&backend.url(), "", "", &[tenant("team-a", "rt_a", &limits)])
    };
    let closed = TestProxy::with_policy(settings(), &policy("")).await;
    let r = closed.chat_with(&A, CHAT).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.error_type(), "shared_store_unavailable");
    // The answer names the cause: the budget, not idempotency (issue 30).
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("budget") && message.contains("budget_on_store_down: closed"),
        "{message}"
    );
    assert!(!message.contains("idempotency"), "{message}");
    let open = TestProxy::with_policy(settings(), &policy(", budget_on_store_down: open")).await;
    assert_eq!(open.chat_with(&A, CHAT).await.status, StatusCode::OK);
    assert_eq!(backend.stats().received, 1);
    let m = open.metrics().await;
    assert!(
        m.contains(r#"router_shared_store_errors_total{op="spend"} 1"#),
        "{m}"
    );
}

/// Issue 30, item 5: a tenant out of money earns its 402; it is not a
/// shed (the router had capacity), so it does not feed `RouterShedding`;
/// the tenant's own counter shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_budget_refusal_is_not_counted_as_a_shed() {
    let redis = router_tests::redis::RedisServer::start("budget-shed").await;
    let backend = mock("local", Behavior::Json).await;
    let body = r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let call = (body.len() as u64).div_ceil(4) * 1000 + 5 * 1000;
    let budget_usd = 1.5 * call as f64 / 1e6;
    let policy = one_pool_with(
        &backend.url(),
        "",
        "price: {input_per_1k_usd: 1.0, output_per_1k_usd: 1.0}",
        &[tenant(
            "team-a",
            "rt_a",
            &format!("budget_usd_per_day: {budget_usd}"),
        )],
    );
    let (p1, _p2) = two_proxies_on(&redis, &policy).await;
    assert_eq!(p1.chat_with(&A, body).await.status, StatusCode::OK);
    let refused = p1.chat_with(&A, body).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(refused.error_type(), "budget_exceeded");
    let metrics = p1.metrics().await;
    assert!(
        !metrics.contains(r#"reason="budget_exceeded""#),
        "a tenant's refusal counted as a shed: {metrics}"
    );
    assert!(
        metrics.contains(
            r#"router_tenant_requests_total{tenant="team-a",outcome="budget_exceeded"} 1"#
        ),
        "{metrics}"
    );
    // What the tenant's answered call cost, for the dashboard's tenant
    // panels.
    let cost: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"router_tenant_cost_usd_total{tenant="team-a"} "#))
        .unwrap_or_else(|| panic!("no tenant cost in {metrics}"))
        .parse()
        .unwrap();
    assert!(
        (cost - call as f64 / 1e6).abs() < 1e-9,
        "{cost} vs {call} micro-USD"
    );
}
