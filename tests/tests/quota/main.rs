//! Several keys per pool and quota-aware balancing (issue 35, items 3 and
//! 4), through a real proxy: mock providers that count each key's
//! requests down in their rate-limit headers (OpenAI's and Anthropic's)
//! and answer 429 past the limit, until the window resets
//! (`router_mock::QuotaMock`).
//!
//! - the router moves to the key with headroom before either answers 429,
//!   and no client sees a 429 while any key has quota; with every key
//!   out, the pool is gated out (`quota`) and the walk moves on;
//! - a key whose reset passes takes traffic again;
//! - the same with Anthropic's headers;
//! - a malformed header changes nothing;
//! - the keys' values are never shown: endpoints are named by their
//!   variable (`url#VAR`) in health, metrics and the route log.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use http::{Method, StatusCode};
use router_mock::{Behavior, MockModel, QuotaMock, QuotaStyle};
use router_proxy::Settings;
use router_tests::harness::{TestProxy, TestResponse};
use router_tests::mocks::mock;
use serde_json::{json, Value};

const CHAT: &str = r#"{"model":"any","messages":[{"role":"user","content":"hi"}],"max_tokens":16}"#;

/// The window the mocks reset their counts after.
const RESET: Duration = Duration::from_millis(1500);

/// A policy whose pool `cloud` (`provider`) has two keys, with a pool
/// `spare` after it.
fn policy(provider: &str, cloud: &str, spare: &str, a: &str, b: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: cloud
      provider: {provider}
      endpoints: ["{cloud}"]
      api_keys_env: [{a}, {b}]
    - name: spare
      provider: {provider}
      endpoints: ["{spare}"]
  routes:
    - name: r
      chain: [cloud, spare]
"#
    )
}

/// Starts the mock `cloud` (with `quota`), the mock `spare`, and a proxy
/// for them, the keys' variables set to `sk-<name>-secret`.
async fn setup(
    behavior: Behavior,
    provider: &str,
    quota: QuotaMock,
    a: &str,
    b: &str,
) -> (TestProxy, MockModel, MockModel) {
    std::env::set_var(a, format!("sk-{a}-secret"));
    std::env::set_var(b, format!("sk-{b}-secret"));
    let cloud = mock("cloud", behavior.clone()).await;
    cloud.set_quota(Some(quota));
    let spare = mock("spare", behavior).await;
    let text = policy(provider, &cloud.url(), &spare.url(), a, b);
    let proxy = TestProxy::with_policy(Settings::default(), &text).await;
    (proxy, cloud, spare)
}

async fn openai_call(proxy: &TestProxy) -> TestResponse {
    proxy.chat_with(&[], CHAT).await
}

async fn anthropic_call(proxy: &TestProxy) -> TestResponse {
    let body = json!({"model": "any", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}]});
    proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/v1/messages"),
            &[("anthropic-version", "2023-06-01")],
            body.to_string(),
        )
        .await
}

/// The counts a mock keeps per key, by the key's variable (the mock sees
/// `Bearer sk-VAR-secret` or `sk-VAR-secret`).
fn by_var(counts: &HashMap<String, u64>, var: &str) -> u64 {
    counts
        .iter()
        .filter(|(k, _)| k.contains(&format!("sk-{var}-secret")))
        .map(|(_, n)| *n)
        .sum()
}

/// The health details' backend of `addr`.
fn backend<'a>(health: &'a Value, addr: &str) -> &'a Value {
    health["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["addr"] == addr)
        .unwrap_or_else(|| panic!("no backend {addr} in {health}"))
}

/// One request in the dialect of `style`.
async fn call(proxy: &TestProxy, style: QuotaStyle) -> TestResponse {
    match style {
        QuotaStyle::Anthropic => anthropic_call(proxy).await,
        _ => openai_call(proxy).await,
    }
}

/// The scenario of issue 35, for either dialect.
async fn keys_with_headroom_take_the_traffic_and_rested_keys_come_back(
    style: QuotaStyle,
    behavior: Behavior,
    provider: &str,
    (a, b): (&str, &str),
) {
    let quota = QuotaMock {
        style,
        requests: 3,
        reset: RESET,
    };
    let (proxy, cloud, spare) = setup(behavior, provider, quota, a, b).await;
    let cloud_url = cloud.url();
    // Six requests: three per key, each key's answers counting down to 0.
    for i in 0..6 {
        let r = call(&proxy, style).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
        assert_eq!(r.header("x-router-route"), Some("cloud"), "request {i}");
    }
    let counts = cloud.quota_counts();
    assert_eq!(by_var(&counts.served, a), 3, "{counts:?}");
    assert_eq!(by_var(&counts.served, b), 3, "{counts:?}");
    // Each key was left before its 429: the provider refused nothing.
    assert!(counts.refused.is_empty(), "{counts:?}");

    // Health names each (endpoint, key) by the key's variable, with what
    // is left; the values of the keys are nowhere.
    let health = proxy.health().await;
    for var in [a, b] {
        let e = backend(&health, &format!("{cloud_url}#{var}"));
        assert_eq!(e["quota"]["requests_remaining"], 0, "{health}");
        assert_eq!(e["quota"]["resting"], "requests", "{health}");
        assert!(
            e["quota"]["requests_reset_s"].as_f64().unwrap() > 0.0,
            "{health}"
        );
    }
    let metrics = proxy.metrics().await;
    let gauge = format!(
        "router_endpoint_quota_remaining{{pool=\"cloud\",endpoint=\"{cloud_url}#{a}\",kind=\"requests\"}} 0"
    );
    assert!(metrics.contains(&gauge), "{gauge} not in:\n{metrics}");
    for text in [health.to_string(), metrics] {
        assert!(!text.contains("-secret"), "a key's value shown: {text}");
    }

    // Every key out: the pool is gated out for quota, the walk moves on.
    let r = call(&proxy, style).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-router-route"), Some("spare"));
    assert!(cloud.quota_counts().refused.is_empty());
    let lines = proxy.log.wait_for(7).await;
    let last = &lines[6];
    let reason = last["reason"].as_str().unwrap();
    assert!(
        reason.contains("cloud skipped: quota: no key has a request left"),
        "{last}"
    );
    assert_eq!(last["walk"][0]["note"], "gated", "{last}");
    assert_eq!(last["walk"][0]["why"], "quota", "{last}");
    // The route log names endpoints by variable too.
    let attempt = &lines[0]["attempts"][0]["endpoint"];
    assert!(
        attempt
            .as_str()
            .unwrap()
            .starts_with(&format!("{cloud_url}#")),
        "{attempt}"
    );
    assert!(!format!("{lines:?}").contains("-secret"));
    assert_eq!(spare.stats().received, 1);

    // Once the reset passes, the keys take traffic again, and still no 429.
    tokio::time::sleep(RESET + Duration::from_millis(200)).await;
    for i in 0..2 {
        let r = call(&proxy, style).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "after the reset {i}: {}",
            r.text()
        );
        assert_eq!(
            r.header("x-router-route"),
            Some("cloud"),
            "after the reset {i}"
        );
    }
    let counts = cloud.quota_counts();
    assert_eq!(by_var(&counts.served, a) + by_var(&counts.served, b), 8);
    assert!(counts.refused.is_empty(), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_headers_move_traffic_to_the_key_with_headroom_before_a_429() {
    keys_with_headroom_take_the_traffic_and_rested_keys_come_back(
        QuotaStyle::OpenAi,
        Behavior::Json,
        "openai",
        ("QUOTA_OPENAI_A_API_KEY", "QUOTA_OPENAI_B_API_KEY"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_headers_move_traffic_to_the_key_with_headroom_before_a_429() {
    keys_with_headroom_take_the_traffic_and_rested_keys_come_back(
        QuotaStyle::Anthropic,
        Behavior::Anthropic,
        "anthropic",
        ("QUOTA_ANTHROPIC_A_API_KEY", "QUOTA_ANTHROPIC_B_API_KEY"),
    )
    .await;
}

/// Each key goes only with its own endpoint, in its provider's header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_sends_its_own_key() {
    let (a, b) = ("QUOTA_SENT_A_API_KEY", "QUOTA_SENT_B_API_KEY");
    let quota = QuotaMock {
        style: QuotaStyle::OpenAi,
        requests: 100,
        reset: RESET,
    };
    let (proxy, cloud, _spare) = setup(Behavior::Json, "openai", quota, a, b).await;
    for _ in 0..6 {
        let r = proxy
            .chat_with(&[("authorization", "Bearer client-own")], CHAT)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let lines = proxy.log.wait_for(6).await;
    for (line, sent) in lines.iter().zip(cloud.requests()) {
        let endpoint = line["attempts"][0]["endpoint"].as_str().unwrap();
        let var = endpoint.rsplit('#').next().unwrap();
        assert_eq!(
            sent.headers["authorization"],
            format!("Bearer sk-{var}-secret").as_str(),
            "{endpoint}"
        );
    }
}

/// Headers that do not parse are ignored: no quota is shown, nothing is
/// rested, traffic is balanced over both keys as without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_header_changes_nothing() {
    let (a, b) = ("QUOTA_BAD_A_API_KEY", "QUOTA_BAD_B_API_KEY");
    let quota = QuotaMock {
        style: QuotaStyle::Malformed,
        requests: 100,
        reset: RESET,
    };
    let (proxy, cloud, spare) = setup(Behavior::Json, "openai", quota, a, b).await;
    for i in 0..10 {
        let r = openai_call(&proxy).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
        assert_eq!(r.header("x-router-route"), Some("cloud"));
    }
    let counts = cloud.quota_counts();
    assert!(
        by_var(&counts.served, a) > 0 && by_var(&counts.served, b) > 0,
        "{counts:?}"
    );
    assert_eq!(spare.stats().received, 0);
    let health = proxy.health().await;
    for var in [a, b] {
        let e = backend(&health, &format!("{}#{var}", cloud.url()));
        assert!(e.get("quota").is_none(), "{health}");
    }
    assert!(!proxy
        .metrics()
        .await
        .contains("router_endpoint_quota_remaining{"));
}

/// Health checks send each (endpoint, key) its own key: a provider that
/// knows only one of them finds that endpoint healthy and not the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_send_each_endpoint_its_own_key() {
    let (a, b) = ("QUOTA_CHECK_A_API_KEY", "QUOTA_CHECK_B_API_KEY");
    std::env::set_var(a, format!("sk-{a}-secret"));
    std::env::set_var(b, format!("sk-{b}-secret"));
    let cloud = mock("cloud", Behavior::Json).await;
    cloud.set_health(router_mock::HealthMode::RequiresKey(format!(
        "sk-{a}-secret"
    )));
    let text = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: cloud
      endpoints: ["{}"]
      api_keys_env: [{a}, {b}]
      health_check: {{interval_ms: 100, timeout_ms: 50}}
  routes:
    - name: r
      chain: [cloud]
"#,
        cloud.url()
    );
    let proxy = TestProxy::with_policy(Settings::default(), &text).await;
    let (ka, kb) = (
        format!("{}#{a}", cloud.url()),
        format!("{}#{b}", cloud.url()),
    );
    let health = proxy
        .wait_health("one key's endpoint healthy, the other's unhealthy", |h| {
            let state = |addr: &str| {
                h["backends"]
                    .as_array()
                    .and_then(|bs| bs.iter().find(|x| x["addr"] == addr))
                    .map(|x| x["health"].clone())
            };
            state(&ka) == Some(json!("healthy")) && state(&kb) == Some(json!("unhealthy"))
        })
        .await;
    assert!(!health.to_string().contains("-secret"), "{health}");
    // Requests go to the endpoint whose key the provider accepts.
    for _ in 0..3 {
        let r = openai_call(&proxy).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    for sent in cloud.requests() {
        assert_eq!(
            sent.headers["authorization"],
            format!("Bearer sk-{a}-secret").as_str()
        );
    }
}

/// `routerctl backends list` (the Admin API's `ListBackends` with
/// `quota`): what each key has left, as the fleet's proxies read it from
/// their providers' headers, with the proxy that says so and whether it
/// rests the key; no key's value anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_list_shows_what_each_key_has_left_from_the_proxies() {
    use router_proto::v1 as pb;
    use router_tests::control::{control_plane_applying, managed_proxy_reporting};
    let (a, b) = ("QUOTA_LIST_A_API_KEY", "QUOTA_LIST_B_API_KEY");
    std::env::set_var(a, format!("sk-{a}-secret"));
    std::env::set_var(b, format!("sk-{b}-secret"));
    let cloud = mock("cloud", Behavior::Json).await;
    cloud.set_quota(Some(QuotaMock {
        style: QuotaStyle::OpenAi,
        requests: 3,
        reset: Duration::from_secs(60),
    }));
    let spare = mock("spare", Behavior::Json).await;
    let (cp, mut admin) = control_plane_applying(
        "quota-list",
        &policy("openai", &cloud.url(), &spare.url(), a, b),
    )
    .await;
    let proxy =
        managed_proxy_reporting(cp.local_addr(), "edge-quota", Duration::from_secs(10)).await;
    // Before any answer: nothing read, nothing listed.
    let listed = admin
        .list_backends(pb::ListBackendsRequest { quota: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((listed.proxies_asked, listed.proxies_answered), (1, 1));
    assert!(listed.quota.is_empty(), "{listed:?}");
    // Four requests: balanced over the two keys, one key has 1 left, the
    // other 0 and is rested.
    for i in 0..4 {
        let r = openai_call(&proxy).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
    }
    let listed = admin
        .list_backends(pb::ListBackendsRequest { quota: true })
        .await
        .unwrap()
        .into_inner();
    let left: Vec<(String, Option<u64>, String, u32)> = listed
        .quota
        .iter()
        .map(|q| {
            assert_eq!(q.pool, "cloud", "{q:?}");
            (
                q.endpoint.clone(),
                q.requests_remaining,
                q.requests_node.clone(),
                q.resting,
            )
        })
        .collect();
    let url = cloud.url();
    let keys: Vec<&str> = left.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(
        keys,
        [format!("{url}#{a}"), format!("{url}#{b}")],
        "{left:?}"
    );
    // Which key took which request is the balancer's call: 6 allowed, 4
    // sent, so 2 left in all; a key at 0 is rested, one with some is not.
    assert_eq!(left.iter().filter_map(|l| l.1).sum::<u64>(), 2, "{left:?}");
    for (_, remaining, node, resting) in &left {
        assert_eq!(node, "edge-quota");
        assert_eq!(*resting, u32::from(*remaining == Some(0)), "{left:?}");
    }
    assert!(listed
        .quota
        .iter()
        .all(|q| q.requests_reset_s.is_some_and(|s| s > 0.0)));
    assert!(!format!("{listed:?}").contains("-secret"));
    // Without `quota`, the proxies are not asked.
    let plain = admin
        .list_backends(pb::ListBackendsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        plain.quota.is_empty() && plain.proxies_asked == 0,
        "{plain:?}"
    );
}

/// A key whose variable is not set: its endpoint takes no traffic while
/// another key of the pool is set (it is held as drained), so no request
/// goes to the provider without a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_variable_is_unset_takes_no_traffic_while_another_is_set() {
    let (a, b) = ("QUOTA_UNSET_A_API_KEY", "QUOTA_UNSET_B_API_KEY");
    std::env::set_var(a, format!("sk-{a}-secret"));
    std::env::remove_var(b);
    let cloud = mock("cloud", Behavior::Json).await;
    cloud.set_quota(Some(QuotaMock {
        style: QuotaStyle::OpenAi,
        requests: 1000,
        reset: Duration::from_secs(60),
    }));
    let spare = mock("spare", Behavior::Json).await;
    let text = policy("openai", &cloud.url(), &spare.url(), a, b);
    let proxy = TestProxy::with_policy(Settings::default(), &text).await;
    for i in 0..6 {
        let r = openai_call(&proxy).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
        assert_eq!(r.header("x-router-route"), Some("cloud"), "request {i}");
    }
    let counts = cloud.quota_counts();
    assert_eq!(by_var(&counts.served, a), 6, "{counts:?}");
    let keyed: u64 = counts.served.values().sum();
    assert_eq!(keyed, 6, "a request went without a key: {counts:?}");
    let health = proxy.health().await;
    let url = cloud.url();
    assert_eq!(
        backend(&health, &format!("{url}#{b}"))["draining"],
        true,
        "{health}"
    );
    assert_eq!(
        backend(&health, &format!("{url}#{a}"))["draining"],
        false,
        "{health}"
    );
}

/// A key one proxy rests (its provider said none is left) is rested by
/// the fleet: the control plane marks it (`suspect: quota`) for every
/// proxy until its reset, so a proxy that never had an answer from that
/// key sends it nothing, and no client request meets a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_one_proxy_rests_is_rested_by_the_fleet_until_its_reset() {
    use router_tests::control::{control_plane_applying, managed_proxy_reporting};
    let (a, b) = ("QUOTA_FLEET_A_API_KEY", "QUOTA_FLEET_B_API_KEY");
    std::env::set_var(a, format!("sk-{a}-secret"));
    std::env::set_var(b, format!("sk-{b}-secret"));
    let cloud = mock("cloud", Behavior::Json).await;
    cloud.set_quota(Some(QuotaMock {
        style: QuotaStyle::OpenAi,
        requests: 2,
        reset: Duration::from_secs(4),
    }));
    let spare = mock("spare", Behavior::Json).await;
    let (cp, _admin) = control_plane_applying(
        "quota-fleet",
        &policy("openai", &cloud.url(), &spare.url(), a, b),
    )
    .await;
    let heartbeat = Duration::from_secs(10);
    let first = managed_proxy_reporting(cp.local_addr(), "edge-first", heartbeat).await;
    let second = managed_proxy_reporting(cp.local_addr(), "edge-second", heartbeat).await;
    let url = cloud.url();
    let resting = |health: &Value| -> Option<String> {
        [a, b].into_iter().find_map(|var| {
            let e = backend(health, &format!("{url}#{var}"));
            (e["quota"]["resting"] == "requests").then(|| format!("{url}#{var}"))
        })
    };
    // Through the first proxy until it rests a key (two requests a key:
    // three requests at most).
    let mut rested = None;
    for i in 0..3 {
        let r = openai_call(&first).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
        rested = resting(&first.health().await);
        if rested.is_some() {
            break;
        }
    }
    let rested = rested.expect("the first proxy never rested a key");
    // The second proxy, which never had an answer from it, has it marked.
    let health = second
        .wait_health("the fleet's quota mark", |h| {
            backend(h, &rested)["suspect"] == "quota"
        })
        .await;
    assert!(
        resting(&health).is_none(),
        "no reading of its own: {health}"
    );
    let other = if rested.ends_with(a) { b } else { a };
    let other = format!("{url}#{other}");
    assert_eq!(backend(&health, &other)["suspect"], Value::Null, "{health}");
    // Its next request goes to the other key, and the provider refuses
    // nothing.
    let r = openai_call(&second).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let line = &second.log.wait_for(1).await[0];
    assert_eq!(line["attempts"][0]["endpoint"], other.as_str(), "{line}");
    assert!(
        cloud.quota_counts().refused.is_empty(),
        "{:?}",
        cloud.quota_counts()
    );
    // At the reset the mark is gone.
    let health = second
        .wait_health("the mark's end at the reset", |h| {
            backend(h, &rested)["suspect"].is_null()
        })
        .await;
    assert_eq!(backend(&health, &rested)["suspect"], Value::Null);
}
