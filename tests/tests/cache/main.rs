//! Issue 34: the response cache, through the proxy, with a mock that
//! counts the requests it gets. Real sockets; a real Redis where the fleet
//! shares entries.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;
use router_mock::Behavior;
use router_proxy::{Settings, SharedStore};
use router_tests::harness::{tenant_item, TestProxy};
use router_tests::mocks::{mock, mock_latency};
use router_tests::redis::RedisServer;

mod purge;

/// A greedy request (`temperature: 0`): cacheable by default.
const BODY: &str =
    r#"{"model":"m","temperature":0,"messages":[{"role":"user","content":"what is 2+2?"}]}"#;

/// One pool at `url` (priced at $1 per 1k tokens); route `r` caches for a
/// minute (`cache_extra` adds to its `cache:`); `tenants` if any.
fn policy(url: &str, cache_extra: &str, tenants: &[String]) -> String {
    let mut doc = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["{url}"]
      price: {{input_per_1k_usd: 1.0, output_per_1k_usd: 1.0}}
  routes:
    - name: r
      chain: [only]
      cache: {{ttl_s: 60{cache_extra}}}
"#
    );
    if !tenants.is_empty() {
        doc.push_str("  tenants:\n");
        doc.push_str(&tenants.concat());
    }
    doc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_is_a_hit_with_its_age_and_the_backend_is_not_asked_again() {
    let m = mock("m", Behavior::Json).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&m.url(), "", &[])).await;
    let first = proxy.chat_with(&[], BODY).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("x-router-cache"), Some("miss"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The same request, keys in another order, another `user`.
    let again = r#"{"messages":[{"content":"what is 2+2?","role":"user"}],"user":"u2","temperature":0,"model":"m"}"#;
    let hit = proxy.chat_with(&[], again).await;
    assert_eq!(hit.status, StatusCode::OK);
    assert_eq!(hit.header("x-router-cache"), Some("hit"));
    let age: u64 = hit.header("age").unwrap().parse().unwrap();
    assert!(age >= 1, "age {age}");
    assert_eq!(hit.text(), first.text(), "the same answer");
    assert_eq!(m.stats().received, 1, "the backend was asked once");
    // Another question is a miss.
    let other = BODY.replace("2+2", "3+3");
    assert_eq!(
        proxy.chat_with(&[], &other).await.header("x-router-cache"),
        Some("miss")
    );
    assert_eq!(m.stats().received, 2);
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"router_cache_events_total{event="hit"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_sends_and_sampled_requests_are_never_cached() {
    let failing = mock("m", Behavior::Status(500)).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&failing.url(), "", &[])).await;
    for _ in 0..2 {
        let r = proxy.chat_with(&[], BODY).await;
        assert_ne!(r.status, StatusCode::OK);
        assert_ne!(r.header("x-router-cache"), Some("hit"));
    }
    assert_eq!(failing.stats().received, 2, "a 500 is never served again");

    let m = mock("ok", Behavior::Json).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&m.url(), "", &[])).await;
    // SEND: a cached "send the email" would be a silent no-op.
    for _ in 0..2 {
        let r = proxy.chat_with(&[("x-router-risk", "SEND")], BODY).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("x-router-cache"), Some("bypass"));
    }
    assert_eq!(m.stats().received, 2);
    // Sampled (no temperature: the providers' default is 1).
    let sampled = r#"{"model":"m","messages":[{"role":"user","content":"a poem"}]}"#;
    for _ in 0..2 {
        let r = proxy.chat_with(&[], sampled).await;
        assert_eq!(r.header("x-router-cache"), Some("bypass"));
    }
    assert_eq!(m.stats().received, 4);
    // no-store: neither read nor written.
    for _ in 0..2 {
        let r = proxy
            .chat_with(&[("cache-control", "no-store")], BODY)
            .await;
        assert_eq!(r.header("x-router-cache"), Some("bypass"));
    }
    assert_eq!(m.stats().received, 6);
    assert_eq!(
        proxy.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("miss"),
        "no-store wrote nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_says_sampled_caches_sampled_requests() {
    let m = mock("m", Behavior::Json).await;
    let proxy = TestProxy::with_policy(
        Settings::default(),
        &policy(&m.url(), ", sampled: true", &[]),
    )
    .await;
    let sampled = r#"{"model":"m","temperature":0.8,"messages":[]}"#;
    assert_eq!(
        proxy.chat_with(&[], sampled).await.header("x-router-cache"),
        Some("miss")
    );
    assert_eq!(
        proxy.chat_with(&[], sampled).await.header("x-router-cache"),
        Some("hit")
    );
    assert_eq!(m.stats().received, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cache_refreshes_and_max_age_refuses_an_older_entry() {
    let m = mock("m", Behavior::Json).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&m.url(), "", &[])).await;
    assert_eq!(proxy.chat_with(&[], BODY).await.status, StatusCode::OK);
    let refreshed = proxy
        .chat_with(&[("cache-control", "no-cache")], BODY)
        .await;
    assert_eq!(refreshed.header("x-router-cache"), Some("refresh"));
    assert_eq!(m.stats().received, 2, "no-cache went to the backend");
    let hit = proxy.chat_with(&[], BODY).await;
    assert_eq!(hit.header("x-router-cache"), Some("hit"));
    assert_eq!(m.stats().received, 2);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // Two seconds old: max-age=60 takes it, max-age=1 does not.
    let fresh = proxy
        .chat_with(&[("cache-control", "max-age=60")], BODY)
        .await;
    assert_eq!(fresh.header("x-router-cache"), Some("hit"));
    let strict = proxy
        .chat_with(&[("cache-control", "max-age=1")], BODY)
        .await;
    assert_eq!(strict.status, StatusCode::OK);
    assert_eq!(strict.header("x-router-cache"), Some("refresh"));
    assert_eq!(m.stats().received, 3);
    // The refreshed entry is new.
    let after = proxy
        .chat_with(&[("cache-control", "max-age=1")], BODY)
        .await;
    assert_eq!(after.header("x-router-cache"), Some("hit"));
    assert_eq!(m.stats().received, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_misses_reach_the_backend_once() {
    let m = mock_latency("m", 300).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&m.url(), "", &[])).await;
    let answers = join_all((0..50).map(|_| proxy.chat_with(&[], BODY))).await;
    for a in &answers {
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    }
    assert_eq!(m.stats().received, 1, "one generation for the burst");
    let misses = answers
        .iter()
        .filter(|a| a.header("x-router-cache") == Some("miss"))
        .count();
    assert_eq!(misses, 1);
    assert!(answers.iter().all(|a| a.text() == answers[0].text()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_never_share_an_entry_and_a_hit_draws_nothing_from_the_budget() {
    let m = mock(
        "m",
        Behavior::JsonUsage(r#"{"prompt_tokens":20,"completion_tokens":100}"#.into()),
    )
    .await;
    // Each call's worst case: its estimated input and a 100-token cap;
    // a budget of two and a half of them.
    let body = BODY.replace(
        "\"temperature\":0,",
        "\"temperature\":0,\"max_tokens\":100,",
    );
    let worst = (body.len() as f64 / 4.0).ceil() + 100.0;
    let budget = 2.5 * worst / 1000.0;
    let tenants = [
        tenant_item("team-a", "rt_a", &format!("budget_usd_per_day: {budget}")),
        tenant_item("team-b", "rt_b", ""),
    ];
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&m.url(), "", &tenants)).await;
    let as_a = [("authorization", "Bearer rt_a")];
    let as_b = [("authorization", "Bearer rt_b")];
    let a1 = proxy.chat_with(&as_a, &body).await;
    assert_eq!(a1.status, StatusCode::OK, "{}", a1.text());
    assert_eq!(a1.header("x-router-cache"), Some("miss"));
    // The other tenant, the same request: its own miss.
    let b1 = proxy.chat_with(&as_b, &body).await;
    assert_eq!(b1.header("x-router-cache"), Some("miss"));
    assert_eq!(m.stats().received, 2);
    // A second distinct call spends the rest of team-a's budget.
    let other = body.replace("2+2", "5+5");
    assert_eq!(proxy.chat_with(&as_a, &other).await.status, StatusCode::OK);
    assert_eq!(m.stats().received, 3);
    // A third distinct one is refused: the budget holds two calls.
    let third = body.replace("2+2", "7+7");
    assert_eq!(
        proxy.chat_with(&as_a, &third).await.status,
        StatusCode::PAYMENT_REQUIRED
    );
    // Hits are unlimited and cost nothing.
    for _ in 0..10 {
        let hit = proxy.chat_with(&as_a, &body).await;
        assert_eq!(hit.status, StatusCode::OK, "{}", hit.text());
        assert_eq!(hit.header("x-router-cache"), Some("hit"));
    }
    assert_eq!(m.stats().received, 3);
    // Recorded spend: exactly the two calls (120 tokens each at $1/1k).
    let metrics = proxy.metrics().await;
    let spent = metrics
        .lines()
        .find(|l| l.starts_with("router_tenant_cost_usd_total{tenant=\"team-a\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no spend line: {metrics}"));
    assert!((spent - 0.24).abs() < 1e-9, "spent {spent}");
}

/// Two proxies on one Redis.
async fn fleet(redis: &RedisServer, url: &str) -> (TestProxy, TestProxy) {
    let s = Settings {
        shared_store: Some(SharedStore::new(&redis.url()).unwrap()),
        ..Settings::default()
    };
    let doc = policy(url, "", &[]);
    let a = TestProxy::with_policy(s.clone(), &doc).await;
    let b = TestProxy::with_policy(s, &doc).await;
    // Both connected (the first connection is made in the background).
    for p in [&a, &b] {
        p.wait_health("the shared store connected", |h| {
            h["shared_store"]["connected"] == true
        })
        .await;
    }
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_on_the_other_proxy_and_a_store_outage_is_a_miss_never_an_error() {
    let mut redis = RedisServer::start("cache").await;
    let m = mock("m", Behavior::Json).await;
    let (a, b) = fleet(&redis, &m.url()).await;
    assert_eq!(
        a.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("miss")
    );
    let hit = b.chat_with(&[], BODY).await;
    assert_eq!(hit.status, StatusCode::OK);
    assert_eq!(hit.header("x-router-cache"), Some("hit"), "shared entry");
    assert_eq!(m.stats().received, 1);
    assert!(redis.dbsize() >= 1);
    // Redis killed: every request is still answered.
    redis.stop();
    let before = m.stats().received;
    let other = BODY.replace("2+2", "4+4");
    for p in [&a, &b, &a] {
        let r = p.chat_with(&[], &other).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_ne!(r.header("x-router-cache"), Some("bypass"));
    }
    assert!(m.stats().received > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_token_rate_still_gets_hits() {
    let m = mock(
        "m",
        Behavior::JsonUsage(r#"{"prompt_tokens":20,"completion_tokens":100}"#.into()),
    )
    .await;
    let body = BODY.replace(
        "\"temperature\":0,",
        "\"temperature\":0,\"max_tokens\":100,",
    );
    // A call passes while the tokens drawn are under 100; the first
    // draws about 120.
    let tenants = [tenant_item(
        "team-a",
        "rt_a",
        "tokens_per_minute: 100, tokens_burst: 100",
    )];
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&m.url(), "", &tenants)).await;
    let as_a = [("authorization", "Bearer rt_a")];
    let first = proxy.chat_with(&as_a, &body).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let other = body.replace("2+2", "5+5");
    assert_eq!(
        proxy.chat_with(&as_a, &other).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the token rate holds for a miss"
    );
    for _ in 0..5 {
        let hit = proxy.chat_with(&as_a, &body).await;
        assert_eq!(hit.status, StatusCode::OK, "{}", hit.text());
        assert_eq!(hit.header("x-router-cache"), Some("hit"));
    }
    assert_eq!(m.stats().received, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_of_the_routes_pools_purges_and_a_backend_set_change_does_not() {
    let m = mock("m", Behavior::Json).await;
    let doc = policy(&m.url(), "", &[]);
    let proxy = TestProxy::with_policy(Settings::default(), &doc).await;
    assert_eq!(
        proxy.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("miss")
    );
    // The same backends set again through the admin path: no policy change.
    proxy.set_backends_pool("only", &[m.url()]).await;
    assert_eq!(
        proxy.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("hit")
    );
    assert_eq!(m.stats().received, 1);
    // A new policy version that changes the route's pool (its price).
    proxy.apply(&doc.replace("output_per_1k_usd: 1.0", "output_per_1k_usd: 2.0"));
    assert_eq!(
        proxy.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("miss"),
        "entries made under the old pools are not served"
    );
    assert_eq!(m.stats().received, 2);
    // A new version that leaves the route's pools alone keeps them.
    proxy.apply(&doc.replace(
        "output_per_1k_usd: 1.0",
        "output_per_1k_usd: 2.0}\n    - name: spare\n      endpoints: [\"127.0.0.1:9\"]\n      price: {input_per_1k_usd: 1.0, output_per_1k_usd: 1.0",
    ));
    assert_eq!(
        proxy.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("hit")
    );
    assert_eq!(m.stats().received, 2);
    // Back to the first version's pools: its entries were purged when the
    // pools changed, so they are not served again.
    proxy.apply(&doc);
    assert_eq!(
        proxy.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("miss"),
        "a change back does not serve the purged entries"
    );
    assert_eq!(m.stats().received, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_joined_a_failed_first_one_go_to_a_backend_at_once_not_one_by_one() {
    let failing = router_tests::mocks::start(router_mock::MockConfig {
        name: "m".into(),
        latency: Duration::from_millis(300),
        behavior: Behavior::Status(500),
        ..router_mock::MockConfig::default()
    })
    .await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&failing.url(), "", &[])).await;
    let started = tokio::time::Instant::now();
    let answers = join_all((0..10).map(|_| proxy.chat_with(&[], BODY))).await;
    let took = started.elapsed();
    assert!(answers.iter().all(|a| a.status != StatusCode::OK));
    assert!(answers
        .iter()
        .all(|a| a.header("x-router-cache") != Some("hit")));
    assert_eq!(failing.stats().received, 10, "each went to the backend");
    // One after another they would take 10 × 0.3 s.
    assert!(took < Duration::from_millis(2400), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_miss_keeps_its_answer_for_the_key_and_for_the_cache() {
    let m = mock("m", Behavior::Json).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&m.url(), "", &[])).await;
    let keyed = proxy.chat_with(&[("idempotency-key", "k-1")], BODY).await;
    assert_eq!(keyed.header("x-router-cache"), Some("miss"));
    // Another client, no key: the cache's entry.
    let hit = proxy.chat_with(&[], BODY).await;
    assert_eq!(hit.header("x-router-cache"), Some("hit"));
    // Another request under the same key: the key's stored answer (a
    // mismatch is refused, as without a cache).
    let other = BODY.replace("2+2", "9+9");
    let reused = proxy.chat_with(&[("idempotency-key", "k-1")], &other).await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reused.text()
    );
    assert_eq!(m.stats().received, 1);
}

/// The text of an SSE body's chunks, in each dialect a client streams.
fn streamed_text(sse: &str) -> String {
    let mut text = String::new();
    for line in sse.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(t) = v["delta"]["text"].as_str() {
            text.push_str(t);
        }
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_and_a_streamed_request_share_an_entry_each_replayed_in_its_own_form() {
    let m = mock("m", Behavior::Chat).await;
    let proxy = TestProxy::with_policy(Settings::default(), &policy(&m.url(), "", &[])).await;
    let streamed = |body: &str| body.replacen('{', r#"{"stream":true,"#, 1);

    // Plain first: a streamed request is answered from its entry as SSE.
    let plain = proxy.chat_with(&[], BODY).await;
    assert_eq!(plain.header("x-router-cache"), Some("miss"));
    let said: serde_json::Value = serde_json::from_slice(&plain.body).unwrap();
    let content = said["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("what is 2+2?"), "{said}");
    let hit = proxy.chat_with(&[], &streamed(BODY)).await;
    assert_eq!(hit.status, StatusCode::OK);
    assert_eq!(hit.header("x-router-cache"), Some("hit"), "{}", hit.text());
    assert_eq!(hit.header("content-type"), Some("text/event-stream"));
    assert_eq!(streamed_text(&hit.text()), content);
    assert!(
        hit.text().trim_end().ends_with("data: [DONE]"),
        "{}",
        hit.text()
    );
    assert_eq!(m.stats().received, 1);

    // Streamed first: a plain request gets the whole answer it carried,
    // and a streamed repeat the original's events as they came.
    let other = BODY.replace("2+2", "3+3");
    let first = proxy.chat_with(&[], &streamed(&other)).await;
    assert_eq!(first.header("x-router-cache"), Some("miss"));
    let text = streamed_text(&first.text());
    assert!(text.contains("3+3"), "{}", first.text());
    let hit = proxy.chat_with(&[], &other).await;
    assert_eq!(hit.header("x-router-cache"), Some("hit"), "{}", hit.text());
    assert!(hit
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/json")));
    let said: serde_json::Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(said["choices"][0]["message"]["content"], text.as_str());
    assert_eq!(said["object"], "chat.completion");
    let again = proxy.chat_with(&[], &streamed(&other)).await;
    assert_eq!(again.header("x-router-cache"), Some("hit"));
    assert_eq!(again.body, first.body, "the original's events");
    assert_eq!(m.stats().received, 2);

    // An Anthropic client: the same sharing in its own dialect.
    let messages = r#"{"model":"m","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":"what is 5+5?"}]}"#;
    let send = |body: String| {
        let url = proxy.url("/v1/messages");
        let client = &proxy.client;
        async move {
            client
                .send(
                    http::Method::POST,
                    &url,
                    &[("content-type", "application/json")],
                    body,
                )
                .await
        }
    };
    let plain = send(messages.to_string()).await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.text());
    assert_eq!(plain.header("x-router-cache"), Some("miss"));
    let said: serde_json::Value = serde_json::from_slice(&plain.body).unwrap();
    let content = said["content"][0]["text"].as_str().unwrap().to_string();
    let hit = send(streamed(messages)).await;
    assert_eq!(hit.header("x-router-cache"), Some("hit"), "{}", hit.text());
    assert!(hit.text().contains("event: message_stop"), "{}", hit.text());
    assert_eq!(streamed_text(&hit.text()), content);
    assert_eq!(m.stats().received, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_count_against_the_request_rate_unless_the_route_says_otherwise() {
    let m = mock("m", Behavior::Json).await;
    // Two requests a minute, two at once.
    let tenants = [tenant_item(
        "team-a",
        "rt_a",
        "requests_per_minute: 2, requests_burst: 2",
    )];
    let as_a = [("authorization", "Bearer rt_a")];
    for (extra, hits_limited) in [("", true), (", rate_limit_hits: false", false)] {
        let proxy =
            TestProxy::with_policy(Settings::default(), &policy(&m.url(), extra, &tenants)).await;
        assert_eq!(proxy.chat_with(&as_a, BODY).await.status, StatusCode::OK);
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let r = proxy.chat_with(&as_a, BODY).await;
            if r.status == StatusCode::OK {
                assert_eq!(r.header("x-router-cache"), Some("hit"));
            }
            statuses.push(r.status);
        }
        let refused = statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count();
        if hits_limited {
            assert_eq!(refused, 4, "one hit within the rate: {statuses:?}");
        } else {
            assert_eq!(refused, 0, "hits are free: {statuses:?}");
            // A miss still counts: the first request and this one are the
            // two the rate allows, the next miss is refused.
            let other = BODY.replace("2+2", "8+8");
            assert_eq!(proxy.chat_with(&as_a, &other).await.status, StatusCode::OK);
            let third = BODY.replace("2+2", "9+9");
            assert_eq!(
                proxy.chat_with(&as_a, &third).await.status,
                StatusCode::TOO_MANY_REQUESTS
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_splits_sides_share_the_routes_entries() {
    let a = mock("a", Behavior::Json).await;
    let b = mock("b", Behavior::Json).await;
    let doc = format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: new
      endpoints: ["{}"]
    - name: old
      endpoints: ["{}"]
  routes:
    - name: r
      chain: [{{split: [{{pool: new, weight: 50}}, {{pool: old, weight: 50}}]}}]
      cache: {{ttl_s: 60}}
"#,
        a.url(),
        b.url()
    );
    let proxy = TestProxy::with_policy(Settings::default(), &doc).await;
    assert_eq!(
        proxy.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("miss")
    );
    // Requests whose ids would land on either side: all answered from the
    // one entry.
    for i in 0..20 {
        let id = format!("req-{i}");
        let r = proxy
            .chat_with(&[("x-request-id", id.as_str())], BODY)
            .await;
        assert_eq!(r.header("x-router-cache"), Some("hit"), "{id}");
    }
    assert_eq!(a.stats().received + b.stats().received, 1);
    // A weight change leaves the route's pools as they are: no purge.
    let reweighted = doc.replace(
        "weight: 50}, {pool: old, weight: 50",
        "weight: 90}, {pool: old, weight: 10",
    );
    assert_ne!(reweighted, doc);
    let before = proxy.health().await["config_version"].clone();
    proxy.apply(&reweighted);
    assert_ne!(proxy.health().await["config_version"], before, "applied");
    assert_eq!(
        proxy.chat_with(&[], BODY).await.header("x-router-cache"),
        Some("hit")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_an_error_event_or_that_stalls_is_never_cached() {
    use router_mock::{StreamEnding, StreamScript};
    let streamed = BODY.replacen('{', r#"{"stream":true,"#, 1);
    for ending in [
        StreamEnding::Error,
        StreamEnding::Stall,
        StreamEnding::Malformed,
    ] {
        let m = mock(
            "m",
            Behavior::Stream(StreamScript {
                ending,
                ..StreamScript::default()
            }),
        )
        .await;
        // A stall is cut after 300 ms of silence.
        let doc = policy(&m.url(), "", &[]).replace(
            "      chain: [only]\n",
            "      chain: [only]\n      stall_timeout_ms: 300\n",
        );
        let proxy = TestProxy::with_policy(Settings::default(), &doc).await;
        for _ in 0..2 {
            let r = proxy.chat_with(&[], &streamed).await;
            assert_ne!(r.header("x-router-cache"), Some("hit"), "{ending:?}");
        }
        // And a plain request does not find it either.
        let r = proxy.chat_with(&[], BODY).await;
        assert_ne!(r.header("x-router-cache"), Some("hit"), "{ending:?}");
        assert_eq!(m.stats().received, 3, "{ending:?}: never served again");
    }
}
