//! Issue 14, "Secure by default": the admin doors of the proxy, per mode,
//! each test reproducing an attack that worked before.
//!
//! The non-loopback caller is real: a client in a network namespace of the
//! test's own ([`Netns`]) calls a proxy listening on 0.0.0.0. Those tests
//! print `SKIPPED` and return when not root or without `ip`/`curl`.

use std::path::PathBuf;

use http::{Method, StatusCode};
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_proxy::{Mode, Settings, StartError};
use router_tests::harness::{TestProxy, TestResponse};
use router_tests::mocks::mock;
use router_tests::netns::Netns;

use crate::settings;

/// The attack: repoint traffic at an address of the caller's choice.
const ATTACK: &str = r#"{"backends": ["http://evil.example:80"]}"#;

/// A one-pool policy whose pool `default` sends to `endpoint`.
fn policy_yaml(endpoint: &str) -> String {
    format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: default\n      endpoints: [\"{endpoint}\"]\n  routes:\n    - name: default\n      chain: [default]\n"
    )
}

/// Settings listening on every address (so a namespace can reach it).
fn on_every_address(token: Option<&str>) -> Settings {
    Settings {
        bind: [0, 0, 0, 0].into(),
        admin_token: token.map(str::to_string),
        ..settings()
    }
}

/// The backend addresses in a health answer.
fn addrs(health: &serde_json::Value) -> Vec<String> {
    health["backends"]
        .as_array()
        .map(|b| {
            b.iter()
                .filter_map(|e| e["addr"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

async fn post(proxy: &TestProxy, path: &str, headers: &[(&str, &str)], body: &str) -> TestResponse {
    proxy
        .client
        .send(Method::POST, &proxy.url(path), headers, body.to_string())
        .await
}

async fn get(proxy: &TestProxy, path: &str, headers: &[(&str, &str)]) -> TestResponse {
    proxy
        .client
        .send(Method::GET, &proxy.url(path), headers, "")
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_without_a_token_takes_set_backends_from_loopback_only() {
    let Some(ns) = Netns::create("a_sidecar_without_a_token_takes_set_backends_from_loopback_only")
    else {
        return;
    };
    let good = mock("good", Behavior::Json).await;
    let proxy = TestProxy::start_as_given(on_every_address(None), Mode::Sidecar).await;
    let port = proxy.addr().port();
    let base = format!("http://{}:{port}", ns.host_ip);

    // From another host: refused, whatever it sends.
    for auth in [None, Some("Bearer anything")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let r = ns
            .curl(
                "POST",
                &format!("{base}/_custom_router/set-backends"),
                &headers,
                ATTACK,
            )
            .await;
        assert_eq!(r.status, 403, "{auth:?}: {}", r.body);
        assert_eq!(r.json()["error"]["type"], "forbidden");
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(msg.contains("CUSTOM_ROUTER_ADMIN_TOKEN"), "{msg}");
    }
    let r = ns
        .curl(
            "POST",
            &format!("{base}/_custom_router/explain"),
            &[],
            r#"{"risk": "READ"}"#,
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    // Health keeps the Hugging Face shape for every caller.
    let r = ns
        .curl("GET", &format!("{base}/_custom_router/health"), &[], "")
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["backends"], serde_json::json!([]));
    assert!(addrs(&proxy.health().await).is_empty(), "nothing was set");

    // From loopback: the Hugging Face contract holds.
    proxy.set_backends(&[good.url()]).await;
    assert_eq!(addrs(&proxy.health().await), [good.url()]);
    assert_eq!(proxy.chat("m").await.header(MOCK_NAME_HEADER), Some("good"));
    let r = ns
        .curl("GET", &format!("{base}/_custom_router/health"), &[], "")
        .await;
    assert_eq!(addrs(&r.json()), [good.url()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_with_a_token_takes_set_backends_from_anyone_presenting_it() {
    let Some(ns) =
        Netns::create("a_sidecar_with_a_token_takes_set_backends_from_anyone_presenting_it")
    else {
        return;
    };
    let good = mock("good", Behavior::Json).await;
    let proxy =
        TestProxy::start_as_given(on_every_address(Some("sidecar-admin")), Mode::Sidecar).await;
    let url = format!(
        "http://{}:{}/_custom_router/set-backends",
        ns.host_ip,
        proxy.addr().port()
    );
    for auth in [None, Some("Bearer wrong"), Some("sidecar-admin")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let r = ns.curl("POST", &url, &headers, ATTACK).await;
        assert_eq!(r.status, 401, "{auth:?}: {}", r.body);
        assert_eq!(r.json()["error"]["type"], "unauthorized");
    }
    // Loopback needs it too, once there is one.
    let r = post(&proxy, "/_custom_router/set-backends", &[], ATTACK).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(addrs(&proxy.health().await).is_empty());
    // The scheme in any case, the token trimmed as on reading.
    let body = serde_json::json!({"backends": [good.url()]}).to_string();
    let r = ns
        .curl(
            "POST",
            &url,
            &[("authorization", "bearer   sidecar-admin ")],
            &body,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(addrs(&proxy.health().await), [good.url()]);
}

/// Standalone and inline modes with no admin token used to take
/// `set-backends` from anyone: now refused, naming the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_and_inline_proxies_refuse_admin_calls_without_a_token() {
    let good = mock("good", Behavior::Json).await;
    let file = std::env::temp_dir().join(format!("router-doors-{}.yaml", std::process::id()));
    std::fs::write(&file, policy_yaml(&good.url())).unwrap();
    let policy = router_policy::document::load(
        &policy_yaml(&good.url()),
        &router_policy::QueueSettings::default(),
    )
    .unwrap();
    let loopback = Settings {
        bind: [127, 0, 0, 1].into(),
        ..settings()
    };
    for mode in [
        Mode::Standalone {
            policy: PathBuf::from(&file),
        },
        Mode::Inline(Box::new(policy)),
    ] {
        let proxy = TestProxy::start_as_given(loopback.clone(), mode.clone()).await;
        for path in ["/_custom_router/set-backends", "/_custom_router/explain"] {
            let r = post(&proxy, path, &[("authorization", "Bearer x")], ATTACK).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}: {}", r.text());
            assert_eq!(r.error_type(), "unauthorized");
            assert_eq!(r.header("www-authenticate"), Some("Bearer"));
            let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
            assert!(msg.contains("CUSTOM_ROUTER_ADMIN_TOKEN"), "{msg}");
        }
        // Health: ok, version and counts; no addresses.
        let h = get(&proxy, "/_custom_router/health", &[]).await;
        assert_eq!(h.status, StatusCode::OK);
        let h = h.json();
        assert_eq!(h["ok"], true);
        assert!(h["config_version"].is_string());
        assert_eq!(h["pool_count"], 1);
        assert_eq!(h["backend_count"], 1);
        assert!(h.get("backends").is_none(), "{h}");
        assert!(!h.to_string().contains(&good.url()), "{h}");
        // Traffic still goes where the policy says.
        assert_eq!(proxy.chat("m").await.header(MOCK_NAME_HEADER), Some("good"));
    }
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_token_opens_standalone_admin_calls_and_health_details() {
    let good = mock("good", Behavior::Json).await;
    let other = mock("other", Behavior::Json).await;
    let s = Settings {
        bind: [127, 0, 0, 1].into(),
        // Read from a file with its newline: trimmed.
        admin_token: Some("standalone-admin\n".into()),
        ..settings()
    };
    let policy = router_policy::document::load(
        &policy_yaml(&good.url()),
        &router_policy::QueueSettings::default(),
    )
    .unwrap();
    let proxy = TestProxy::start_as_given(s, Mode::Inline(Box::new(policy))).await;
    let body = serde_json::json!({"backends": [other.url()]}).to_string();
    for auth in [
        "Bearer standalone-admin-x",
        "Bearer standalone-admi",
        "standalone-admin",
    ] {
        let r = post(
            &proxy,
            "/_custom_router/set-backends",
            &[("authorization", auth)],
            &body,
        )
        .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{auth}");
    }
    let h = get(
        &proxy,
        "/_custom_router/health",
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert!(h.json().get("backends").is_none());
    let auth = [("authorization", "Bearer standalone-admin")];
    let r = post(&proxy, "/_custom_router/set-backends", &auth, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let h = get(&proxy, "/_custom_router/health", &auth).await.json();
    assert_eq!(addrs(&h), [other.url()]);
    assert_eq!(
        proxy.chat("m").await.header(MOCK_NAME_HEADER),
        Some("other")
    );
}

/// A token that cannot travel in a header used to be accepted and then
/// never matched (admin token) or silently not sent (`ROUTER_TOKEN`):
/// now the proxy does not start, and says which variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_cannot_be_a_header_stops_the_start() {
    let bad_admin = Settings {
        bind: [127, 0, 0, 1].into(),
        admin_token: Some("tök".into()),
        ..settings()
    };
    let err = router_proxy::start(router_proxy::ProxyOptions {
        settings: bad_admin,
        mode: Mode::Sidecar,
        route_log: Box::new(std::io::sink()),
    })
    .await
    .err()
    .expect("refused");
    assert!(matches!(err, StartError::Token(_)), "{err}");
    assert!(
        err.to_string().contains("CUSTOM_ROUTER_ADMIN_TOKEN"),
        "{err}"
    );
    assert!(!err.to_string().contains("tök"), "{err}");

    let managed = Mode::Managed(router_proxy::managed::ManagedOptions {
        addrs: vec!["http://127.0.0.1:9".into()],
        token: Some("cp tök".into()),
        node_id: "bad-token".into(),
        cache_dir: None,
        ca_pem: None,
        heartbeat: router_proxy::managed::HEARTBEAT,
    });
    let err = router_proxy::start(router_proxy::ProxyOptions {
        settings: Settings {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            ..settings()
        },
        mode: managed,
        route_log: Box::new(std::io::sink()),
    })
    .await
    .err()
    .expect("refused");
    assert!(err.to_string().contains("ROUTER_TOKEN"), "{err}");
    assert!(!err.to_string().contains("tök"), "{err}");
}

/// A failed backend's address is internal: the client's error names the
/// pool; the route log keeps the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failure_does_not_show_the_endpoint_to_the_client() {
    let dead = mock("dead", Behavior::Json).await;
    let dead_url = dead.url();
    let dead_port = dead.host_port();
    dead.stop().await;
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(std::slice::from_ref(&dead_port)).await;
    let r = proxy.chat("m").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert_eq!(r.error_type(), "upstream_error");
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(!message.contains(&dead_port), "{message}");
    assert!(!message.contains("127.0.0.1"), "{message}");
    assert!(message.contains("pool default"), "{message}");
    let lines = proxy.log.wait_for(1).await;
    assert_eq!(lines[0]["attempts"][0]["endpoint"], dead_url.as_str());
}

/// Metrics name every backend's address. Off loopback, a standalone proxy
/// serves them only with `CUSTOM_ROUTER_METRICS_TOKEN` (or the admin
/// token); the metrics token opens nothing else. A sidecar serves them to
/// anyone (the Hugging Face contract). They used to be open in every mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_off_loopback_need_the_metrics_token_outside_sidecar_mode() {
    let Some(ns) =
        Netns::create("metrics_off_loopback_need_the_metrics_token_outside_sidecar_mode")
    else {
        return;
    };
    let good = mock("good", Behavior::Json).await;
    let file = std::env::temp_dir().join(format!("router-metrics-{}.yaml", std::process::id()));
    std::fs::write(&file, policy_yaml(&good.url())).unwrap();
    let settings = Settings {
        metrics_token: Some("scraper-token".into()),
        ..on_every_address(Some("admin-token"))
    };
    let proxy = TestProxy::start_as_given(
        settings,
        Mode::Standalone {
            policy: PathBuf::from(&file),
        },
    )
    .await;
    assert_eq!(proxy.chat("m").await.status, StatusCode::OK);
    let base = format!("http://{}:{}", ns.host_ip, proxy.addr().port());
    for path in ["/metrics", "/_custom_router/metrics"] {
        let url = format!("{base}{path}");
        for auth in [None, Some("Bearer wrong")] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("authorization", a)).into_iter().collect();
            let r = ns.curl("GET", &url, &headers, "").await;
            assert_eq!(r.status, 401, "{path} {auth:?}: {}", r.body);
            assert!(r.body.contains("CUSTOM_ROUTER_METRICS_TOKEN"), "{}", r.body);
            assert!(!r.body.contains(&good.url()), "{}", r.body);
        }
        for token in ["Bearer scraper-token", "Bearer admin-token"] {
            let r = ns.curl("GET", &url, &[("authorization", token)], "").await;
            assert_eq!(r.status, 200, "{path} {token}: {}", r.body);
            assert!(
                r.body.contains(&good.url()),
                "the scrape has the addr labels"
            );
        }
    }
    // The scraper's token is not an admin token.
    let r = ns
        .curl(
            "POST",
            &format!("{base}/_custom_router/set-backends"),
            &[("authorization", "Bearer scraper-token")],
            ATTACK,
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.body);
    // Loopback scrapes need nothing.
    assert!(proxy.metrics().await.contains(&good.url()));
    drop(proxy);

    // A sidecar: open to anyone.
    let sidecar = TestProxy::start_as_given(on_every_address(None), Mode::Sidecar).await;
    let r = ns
        .curl(
            "GET",
            &format!("http://{}:{}/metrics", ns.host_ip, sidecar.addr().port()),
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let _ = std::fs::remove_file(&file);
}
