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
