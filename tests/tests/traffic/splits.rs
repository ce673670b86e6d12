//! Weighted splits: shares over 10,000 requests, retries and sessions that
//! stay on their side (across proxies and restarts), the unchosen side as
//! the split's own fallback, and what explain and the route log say.

use std::time::Duration;

use futures_util::StreamExt;
use http::{Method, StatusCode};
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_policy::split::SplitKeys;
use router_policy::QueueSettings;
use router_tests::harness::{TestClient, TestProxy};
use router_tests::mocks::mock;

use crate::{policy, settings};

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// The side the policy's own rule picks for a request keyed `key`: what
/// every proxy must agree with.
fn side_of(policy_text: &str, key: &str) -> String {
    let p = router_policy::document::load(policy_text, &QueueSettings::default()).unwrap();
    let route = &p.routes[0];
    let order = route.order(&SplitKeys {
        request_id: Some(key),
        ..SplitKeys::default()
    });
    route.pool_at(order.splits[0].at).unwrap().to_string()
}

/// Sends `ids.len()` chat requests, `x-request-id` each, 32 at a time;
/// answers by the mock that gave them.
async fn send_all(proxy: &TestProxy, ids: &[String]) -> Vec<(String, String)> {
    let url = proxy.url("/v1/chat/completions");
    let client = TestClient::new();
    futures_util::stream::iter(ids.iter().cloned())
        .map(|id| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let r = client
                    .send(
                        Method::POST,
                        &url,
                        &[("content-type", "application/json"), ("x-request-id", &id)],
                        BODY,
                    )
                    .await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.text());
                (id, r.header(MOCK_NAME_HEADER).unwrap_or("").to_string())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

const TEN_NINETY: &str = "[{split: [{pool: new, weight: 10}, {pool: old, weight: 90}]}, last]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_requests_over_a_10_90_split_land_within_one_percent() {
    let (new, old, last) = (
        mock("new", Behavior::Json).await,
        mock("old", Behavior::Json).await,
        mock("last", Behavior::Json).await,
    );
    let text = policy(&new.url(), &old.url(), &last.url(), TEN_NINETY, "");
    let proxy = TestProxy::with_policy(settings(), &text).await;
    let ids: Vec<String> = (0..10_000).map(|i| format!("traffic-{i}")).collect();
    let answers = send_all(&proxy, &ids).await;
    let on_new = answers.iter().filter(|(_, m)| m == "new").count();
    let on_old = answers.iter().filter(|(_, m)| m == "old").count();
    assert_eq!(on_new + on_old, 10_000);
    assert!(on_new.abs_diff(1_000) <= 100, "{on_new} of 10000 on new");
    // The mocks counted the same, and nothing reached the chain's next step.
    assert_eq!(new.stats().completed as usize, on_new);
    assert_eq!(old.stats().completed as usize, on_old);
    assert_eq!(last.stats().received, 0);
    // Each request went where the policy's rule says, to the request.
    for (id, m) in answers.iter().take(500) {
        assert_eq!(m, &side_of(&text, id), "{id}");
    }
    // The route log says which side and why; the reason too.
    let lines = proxy.log.wait_for(10_000).await;
    let l = lines
        .iter()
        .find(|l| l["final_route"] == "new")
        .expect("a line for new");
    assert_eq!(
        l["walk"][0],
        serde_json::json!({"note": "split", "pool": "new", "weight": 10, "key": "request_id"})
    );
    assert_eq!(
        l["reason"],
        "route \"default\" (risk READ); split: new (weight 10 of 100, by request_id); new chosen"
    );
    // No walk began past its first pool: no fallback counted.
    assert!(!proxy.metrics().await.contains("router_fallbacks_total{"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_one_request_id_or_idempotency_key_stay_on_their_side_across_proxies() {
    let (new, old, last) = (
        mock("new", Behavior::Json).await,
        mock("old", Behavior::Json).await,
        mock("last", Behavior::Json).await,
    );
    let split = "[{split: [{pool: new, weight: 50}, {pool: old, weight: 50}]}, last]";
    let text = policy(&new.url(), &old.url(), &last.url(), split, "");
    let ids: Vec<String> = (0..40).map(|i| format!("retry-{i}")).collect();
    let first = TestProxy::with_policy(settings(), &text).await;
    let mut sides = Vec::new();
    for id in &ids {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let r = first.chat_with(&[("x-request-id", id)], BODY).await;
            seen.push(r.header(MOCK_NAME_HEADER).unwrap().to_string());
        }
        assert!(seen.iter().all(|s| s == &seen[0]), "{id}: {seen:?}");
        assert_eq!(seen[0], side_of(&text, id));
        sides.push(seen[0].clone());
    }
    assert!(sides.iter().any(|s| s == "new") && sides.iter().any(|s| s == "old"));
    // A retry that reaches another proxy, or this one restarted, lands
    // on the same side: nothing but the id goes into the choice.
    drop(first);
    let second = TestProxy::with_policy(settings(), &text).await;
    for (id, side) in ids.iter().zip(&sides) {
        let r = second.chat_with(&[("x-request-id", id)], BODY).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some(side.as_str()), "{id}");
    }
    // A keyed request goes by its Idempotency-Key, whatever its
    // X-Request-Id: its retry (to another proxy: no replay from a store
    // here) lands where the first attempt did.
    let third = TestProxy::with_policy(settings(), &text).await;
    for i in 0..20 {
        let key = format!("key-{i}");
        let want = side_of(&text, &key);
        for (n, proxy) in [&second, &third].into_iter().enumerate() {
            let other = format!("other-{i}-{n}");
            let r = proxy
                .chat_with(&[("idempotency-key", &key), ("x-request-id", &other)], BODY)
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            assert_eq!(r.header(MOCK_NAME_HEADER), Some(want.as_str()), "{key}");
        }
    }
    let l = third.log.wait_for(20).await;
    assert_eq!(l[0]["walk"][0]["key"], "idempotency_key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sticky_header_keeps_each_session_on_one_side() {
    let (new, old, last) = (
        mock("new", Behavior::Json).await,
        mock("old", Behavior::Json).await,
        mock("last", Behavior::Json).await,
    );
    let split = "[{split: [{pool: new, weight: 50}, {pool: old, weight: 50}], sticky: \"header:X-Session-Id\"}, last]";
    let text = policy(&new.url(), &old.url(), &last.url(), split, "");
    let proxy = TestProxy::with_policy(settings(), &text).await;
    let mut per_session = Vec::new();
    for s in 0..20 {
        let session = format!("session-{s}");
        let mut seen = Vec::new();
        for n in 0..5 {
            let id = format!("{session}-request-{n}");
            let r = proxy
                .chat_with(&[("x-session-id", &session), ("x-request-id", &id)], BODY)
                .await;
            seen.push(r.header(MOCK_NAME_HEADER).unwrap().to_string());
        }
        assert!(seen.iter().all(|x| x == &seen[0]), "{session}: {seen:?}");
        per_session.push(seen[0].clone());
    }
    // Sessions spread over both sides.
    assert!(per_session.iter().any(|s| s == "new"), "{per_session:?}");
    assert!(per_session.iter().any(|s| s == "old"), "{per_session:?}");
    let lines = proxy.log.wait_for(100).await;
    assert!(lines.iter().all(|l| l["walk"][0]["key"] == "header"));
    // Without the header: by the request id, and the reason says so.
    let r = proxy
        .chat_with(&[("x-request-id", "no-session")], BODY)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let l = &proxy.log.wait_for(101).await[100];
    assert_eq!(l["walk"][0]["key"], "request_id");
    assert!(
        l["reason"]
            .as_str()
            .unwrap()
            .contains("by request_id (the sticky key is missing)"),
        "{l}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unchosen_side_is_the_fallback_when_the_chosen_side_fails() {
    let (new, old, last) = (
        mock("new", Behavior::Json).await,
        mock("old", Behavior::Json).await,
        mock("last", Behavior::Json).await,
    );
    let split = "[{split: [{pool: new, weight: 50}, {pool: old, weight: 50}]}, last]";
    let text = policy(
        &new.url(),
        &old.url(),
        &last.url(),
        split,
        "attempt_timeout_ms: 300",
    );
    let proxy = TestProxy::with_policy(settings(), &text).await;
    let on = |side: &str| -> Vec<String> {
        (0..200)
            .map(|i| format!("fb-{i}"))
            .filter(|id| side_of(&text, id) == side)
            .take(6)
            .collect()
    };
    let (to_new, to_old) = (on("new"), on("old"));
    // Each pool answers once first (a failure on an endpoint that never
    // answered marks it suspect, and the walk would pass it over).
    for id in [&to_new[5], &to_old[5]] {
        assert_eq!(
            proxy.chat_with(&[("x-request-id", id)], BODY).await.status,
            StatusCode::OK
        );
    }
    new.set_behavior(Behavior::Status(500));
    for id in &to_new[..3] {
        let r = proxy.chat_with(&[("x-request-id", id)], BODY).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("old"), "{id}");
        assert_eq!(r.header("x-router-attempts"), Some("2"));
    }
    let lines = proxy.log.wait_for(5).await;
    let l = &lines[4];
    assert_eq!(l["walk"][0]["note"], "split");
    assert_eq!(l["walk"][0]["pool"], "new");
    assert_eq!(l["attempts"][0]["pool"], "new");
    assert_eq!(l["attempts"][0]["status"], 500);
    assert_eq!(l["first_route"], "new");
    assert_eq!(l["final_route"], "old");
    // Requests whose side is old never touch new.
    let before = new.stats().received;
    for id in &to_old[..3] {
        let r = proxy.chat_with(&[("x-request-id", id)], BODY).await;
        assert_eq!(r.header(MOCK_NAME_HEADER), Some("old"));
        assert_eq!(r.header("x-router-attempts"), Some("1"));
    }
    assert_eq!(new.stats().received, before);
    // Both sides failing: the chain's next step after the split.
    old.set_behavior(Behavior::Status(500));
    let r = proxy.chat_with(&[("x-request-id", &to_new[3])], BODY).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("last"), "{}", r.text());
    assert_eq!(r.header("x-router-attempts"), Some("3"));
    let l = &proxy.log.wait_for(9).await[8];
    let pools: Vec<&str> = l["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["pool"].as_str().unwrap())
        .collect();
    assert_eq!(pools, ["new", "old", "last"]);
    // A hanging side: given up at the attempt timeout, then the other.
    old.set_behavior(Behavior::Json);
    new.set_behavior(Behavior::Hang);
    let r = proxy.chat_with(&[("x-request-id", &to_new[4])], BODY).await;
    assert_eq!(r.header(MOCK_NAME_HEADER), Some("old"));
    assert_eq!(r.header("x-router-attempts"), Some("2"));
    let m = proxy.metrics().await;
    assert!(
        m.contains("router_fallbacks_total{from=\"new\",to=\"old\"} 4")
            && m.contains("router_fallbacks_total{from=\"new\",to=\"last\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_which_side_a_request_takes_and_why() {
    let (new, old, last) = (
        mock("new", Behavior::Json).await,
        mock("old", Behavior::Json).await,
        mock("last", Behavior::Json).await,
    );
    let split =
        "[{split: [{pool: new, weight: 10}, {pool: old, weight: 90}], sticky: tenant}, last]";
    let text = policy(&new.url(), &old.url(), &last.url(), split, "");
    let proxy = TestProxy::with_policy(settings(), &text).await;
    let url = proxy.url("/_custom_router/explain");
    let explain = |body: &'static str| {
        let (client, url) = (proxy.client.clone(), url.clone());
        async move {
            let r = client
                .send(
                    Method::POST,
                    &url,
                    &[("authorization", "Bearer admin")],
                    body,
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            r.json()
        }
    };
    // No key given: the heaviest side, and it says so.
    let e = explain("{}").await;
    assert_eq!(e["pool"], "old");
    assert_eq!(
        e["splits"],
        serde_json::json!([{"pool": "old", "weight": 90, "total": 100, "key": "none"}])
    );
    // The tenant missing: by the request id, and it says so.
    let missing = explain(r#"{"request_id": "r-1"}"#).await;
    assert_eq!(missing["splits"][0]["key"], "request_id");
    assert_eq!(missing["splits"][0]["sticky_missing"], true);
    assert_eq!(e["candidates"], serde_json::json!(["old", "new", "last"]));
    assert!(
        e["reason"]
            .as_str()
            .unwrap()
            .contains("split: old (weight 90 of 100, no key given: the heaviest side)"),
        "{e}"
    );
    // A tenant: the side its requests take.
    let e = explain(r#"{"tenant": "acme", "request_id": "r-1"}"#).await;
    let p = router_policy::document::load(&text, &QueueSettings::default()).unwrap();
    let order = p.routes[0].order(&SplitKeys {
        tenant: Some("acme"),
        request_id: Some("r-1"),
        ..SplitKeys::default()
    });
    let want = p.routes[0].pool_at(order.splits[0].at).unwrap();
    assert_eq!(e["pool"], want);
    assert_eq!(e["splits"][0]["key"], "tenant");
    // Nothing was sent.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(new.stats().received + old.stats().received, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_tenant_keeps_each_tenants_requests_on_one_side() {
    let (new, old, last) = (
        mock("new", Behavior::Json).await,
        mock("old", Behavior::Json).await,
        mock("last", Behavior::Json).await,
    );
    let split =
        "[{split: [{pool: new, weight: 50}, {pool: old, weight: 50}], sticky: tenant}, last]";
    let mut text = policy(&new.url(), &old.url(), &last.url(), split, "");
    text.push_str("  tenants:\n");
    for t in 0..10 {
        text.push_str(&router_tests::harness::tenant_item(
            &format!("team-{t}"),
            &format!("key-of-team-{t}"),
            "",
        ));
    }
    let proxy = TestProxy::with_policy(settings(), &text).await;
    let mut per_tenant = Vec::new();
    for t in 0..10 {
        let auth = format!("Bearer key-of-team-{t}");
        let mut seen = Vec::new();
        for n in 0..5 {
            let id = format!("team-{t}-request-{n}");
            let r = proxy
                .chat_with(&[("authorization", &auth), ("x-request-id", &id)], BODY)
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            seen.push(r.header(MOCK_NAME_HEADER).unwrap().to_string());
        }
        assert!(seen.iter().all(|x| x == &seen[0]), "team-{t}: {seen:?}");
        per_tenant.push(seen[0].clone());
    }
    assert!(per_tenant.iter().any(|s| s == "new"), "{per_tenant:?}");
    assert!(per_tenant.iter().any(|s| s == "old"), "{per_tenant:?}");
    let lines = proxy.log.wait_for(50).await;
    assert!(lines.iter().all(|l| l["walk"][0]["key"] == "tenant"));
}
