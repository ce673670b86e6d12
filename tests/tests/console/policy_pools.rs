//! The console's Policy, Pools and Explain pages (issue 33, part 2) in a
//! real headless Chromium: an operator's policy edit with two mistakes
//! shows both with their fields and applies nothing; an edit applied and a
//! rollback from the history page reach the proxies; the pools page's drain
//! button drains an endpoint on every proxy, and a viewer has no button
//! and is refused; explain shows the decision and its reason, the fleet's
//! drains included. Screenshots go to `docs/console/`.

use std::time::Duration;

use http::StatusCode;
use router_mock::Behavior;
use router_tests::control::TOKEN;
use router_tests::harness::TestClient;
use router_tests::mocks::mock;
use router_tests::webdriver::Browser;
use serde_json::Value;

use super::{browser, http_only, policy, shots, sign_in, Fleet, APPROVER, VIEWER};

/// Types `text` into the policy editor, replacing what it holds.
async fn type_document(b: &Browser, text: &str) {
    let editor = b.find("#document-editor").await.unwrap();
    b.clear(&editor).await.unwrap();
    b.send_keys(&editor, text).await.unwrap();
}

/// Whether a proxy's health (with its backends) has an endpoint of `pool`.
fn serves_pool(health: &Value, pool: &str) -> bool {
    health["backends"]
        .as_array()
        .is_some_and(|b| b.iter().any(|e| e["pool"] == pool))
}

/// Whether a proxy's health has endpoint `addr` draining.
fn draining(health: &Value, addr: &str) -> bool {
    let want = addr.trim_start_matches("http://");
    health["backends"].as_array().is_some_and(|b| {
        b.iter().any(|e| {
            e["addr"]
                .as_str()
                .unwrap_or_default()
                .trim_start_matches("http://")
                == want
                && e["draining"] == true
        })
    })
}

/// `text` escaped as a form value.
fn form_value(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The page's source, for a failure's message.
async fn page(b: &Browser) -> String {
    format!(
        "{}: {}",
        b.url().await.unwrap_or_default(),
        b.source().await.unwrap_or_default()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_edit_with_two_mistakes_shows_both_and_a_rollback_from_the_history_reaches_the_proxies(
) {
    let fleet = Fleet::start("policy").await;
    let console = fleet.console();
    let hub = fleet.cp.hub();
    let v1 = hub.state().policy_version;
    let v1_document = hub.policy(0).unwrap().document;
    let b = browser().await;
    sign_in(&b, &console, TOKEN).await;

    // Two mistakes: a misspelt field (a shape error) and a chain naming a
    // pool that does not exist (a validation error). Both come back with
    // their fields, from a dry run and from an apply; nothing is applied.
    let url = fleet.backend.url();
    let bad = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: only\n      endpoints: [\"{url}\"]\n      max_concurency: 4\n  routes:\n    - name: default\n      chain: [nowhere]\n"
    );
    b.goto(&format!("{console}/policy/edit")).await.unwrap();
    b.wait_for("#document-editor").await.unwrap();
    type_document(&b, &bad).await;
    b.click(&b.find("#dry-run").await.unwrap()).await.unwrap();
    if let Err(e) = b.wait_for("#errors").await {
        panic!("no errors shown: {e}\n{}", page(&b).await);
    }
    let check_errors = |source: String| {
        assert!(
            source.contains("data-field=\"spec.pools[0].max_concurency\""),
            "{source}"
        );
        assert!(
            source.contains("data-field=\"spec.routes[0].chain"),
            "{source}"
        );
        assert!(
            source.contains("did you mean `max_concurrency`"),
            "{source}"
        );
    };
    assert_eq!(
        b.find_all("li.field-error").await.unwrap().len(),
        2,
        "{}",
        page(&b).await
    );
    check_errors(b.source().await.unwrap());
    // The document stays in the editor, with the diff against the current one.
    assert!(!b.find_all("table#diff tr.change").await.unwrap().is_empty());
    b.screenshot_to(&shots().join("policy-edit.png"))
        .await
        .unwrap();
    b.click(&b.find("#apply").await.unwrap()).await.unwrap();
    b.wait_for("#errors").await.unwrap();
    assert_eq!(b.find_all("li.field-error").await.unwrap().len(), 2);
    check_errors(b.source().await.unwrap());
    assert_eq!(
        hub.state().policy_version,
        v1,
        "an invalid document applied"
    );
    assert_eq!(hub.history().len(), 1);

    // A valid edit (a second pool), dry run then apply: version 2 reaches
    // every proxy.
    let second = mock("second", Behavior::Json).await;
    let good = policy(&url).replace(
        "  routes:\n",
        &format!(
            "    - name: extra\n      endpoints: [\"{}\"]\n  routes:\n",
            second.url()
        ),
    );
    type_document(&b, &good).await;
    b.click(&b.find("#dry-run").await.unwrap()).await.unwrap();
    let outcome = b.wait_for("#outcome").await.unwrap();
    let text = b.text(&outcome).await.unwrap();
    assert!(
        text.contains(&format!("makes version {}", v1 + 1)),
        "{text}"
    );
    assert!(b.find_all("li.field-error").await.unwrap().is_empty());
    assert_eq!(hub.state().policy_version, v1, "a dry run applied");
    b.click(&b.find("#apply").await.unwrap()).await.unwrap();
    b.wait_for("#notice").await.unwrap();
    let v2 = hub.state().policy_version;
    assert_eq!(v2, v1 + 1);
    let record = hub.policy(v2).unwrap();
    assert_eq!(
        (record.author.as_str(), record.operator.as_str()),
        ("console", "operator")
    );
    for p in &fleet.proxies {
        p.wait_health("the proxy serves the new pool", |h| serves_pool(h, "extra"))
            .await;
    }

    // The history and a side-by-side diff of the two versions.
    b.goto(&format!("{console}/policy?a={v1}&b={v2}"))
        .await
        .unwrap();
    b.wait_for("table#diff tr.add").await.unwrap();
    assert_eq!(b.find_all("#history tr.version").await.unwrap().len(), 2);
    b.screenshot_to(&shots().join("policy.png")).await.unwrap();

    // Roll back to version 1 from the history, through its confirmation
    // page: a new version with version 1's document, and the proxies drop
    // the pool again.
    b.click(
        &b.find(&format!(
            "#history tr.version[data-version=\"{v1}\"] a.rollback"
        ))
        .await
        .unwrap(),
    )
    .await
    .unwrap();
    b.wait_for("#confirm-rollback").await.unwrap();
    assert!(!b.find_all("table#diff tr.del").await.unwrap().is_empty());
    b.screenshot_to(&shots().join("policy-rollback.png"))
        .await
        .unwrap();
    assert_eq!(
        hub.state().policy_version,
        v2,
        "rolled back before the confirmation"
    );
    b.click(&b.find("#confirm-rollback").await.unwrap())
        .await
        .unwrap();
    let notice = b.wait_for("#notice").await.unwrap();
    assert!(b.text(&notice).await.unwrap().starts_with("Rolled back"));
    let v3 = hub.state().policy_version;
    assert_eq!(v3, v2 + 1);
    let current = hub.policy(0).unwrap();
    assert_eq!(current.document, v1_document);
    assert_eq!(current.note, format!("rollback to {v1}"));
    for p in &fleet.proxies {
        p.wait_health("the proxy dropped the rolled-back pool", |h| {
            !serves_pool(h, "extra")
        })
        .await;
    }
    let revision = hub.published_revision();
    for p in &fleet.proxies {
        router_tests::control::wait_revision(p, revision).await;
    }

    // A viewer and an approver read the policy but get no editor, no
    // rollback link, and their POSTs are refused: nothing changes.
    let client = TestClient::new();
    for token in [VIEWER, APPROVER] {
        let cookie = http_only::sign_in(&client, &console, token).await;
        let csrf = http_only::csrf_of(&client, &console, &cookie).await;
        let header = format!("router_console={cookie}");
        let r = client
            .send(
                http::Method::GET,
                &format!("{console}/policy"),
                &[("cookie", header.as_str())],
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::OK);
        let text = r.text();
        assert!(text.contains("id=\"history\""), "{text}");
        assert!(!text.contains("/policy/edit"), "{token}: {text}");
        assert!(!text.contains("/policy/rollback"), "{token}: {text}");
        for path in ["/policy/edit", &format!("/policy/rollback?to={v1}")] {
            let r = client
                .send(
                    http::Method::GET,
                    &format!("{console}{path}"),
                    &[("cookie", header.as_str())],
                    "",
                )
                .await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{token} {path}");
        }
        let r = http_only::post(
            &client,
            &format!("{console}/policy/rollback"),
            &cookie,
            &format!("csrf={csrf}&to={v1}"),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{token}: {}", r.text());
        let r = http_only::post(
            &client,
            &format!("{console}/policy/edit"),
            &cookie,
            &format!("csrf={csrf}&action=apply&document=kind"),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{token}: {}", r.text());
    }
    // An operator's POST without its CSRF token is refused too.
    let operator = http_only::sign_in(&client, &console, TOKEN).await;
    let r = http_only::post(
        &client,
        &format!("{console}/policy/rollback"),
        &operator,
        &format!("to={v2}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(hub.state().policy_version, v3, "changed by a refused POST");
    // The new pages, as an operator sees them: the console's headers, no
    // inline script or style.
    let header = format!("router_console={operator}");
    for path in [
        "/policy".to_string(),
        format!("/policy?a={v1}&b={v3}"),
        "/policy/edit".to_string(),
        format!("/policy/rollback?to={v2}"),
        "/pools".to_string(),
        "/pools/confirm?action=open&pool=only".to_string(),
        "/explain?risk=SEND".to_string(),
    ] {
        let r = client
            .send(
                http::Method::GET,
                &format!("{console}{path}"),
                &[("cookie", header.as_str())],
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
        assert_eq!(
            r.header("content-security-policy"),
            Some("default-src 'self'; frame-ancestors 'none'"),
            "{path}"
        );
        assert_eq!(r.header("cache-control"), Some("no-store"), "{path}");
        assert!(!r.text().contains("<script>"), "{path}: inline script");
        assert!(!r.text().contains("style="), "{path}: inline style");
    }
    // An apply from an editor opened on an older version is a conflict:
    // refused (409), nothing applied, the page says so.
    let csrf = http_only::csrf_of(&client, &console, &operator).await;
    let body = format!(
        "csrf={csrf}&action=apply&expected={v2}&document={}",
        form_value(&good)
    );
    let r = http_only::post(&client, &format!("{console}/policy/edit"), &operator, &body).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert!(r.text().contains("id=\"problem\""), "{}", r.text());
    assert_eq!(hub.state().policy_version, v3, "a stale editor applied");

    b.quit().await.unwrap();
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_drain_button_drains_an_endpoint_on_every_proxy_a_viewer_has_none_and_explain_gives_reasons(
) {
    let fleet = Fleet::start("pools").await;
    let console = fleet.console();
    let hub = fleet.cp.hub();
    let second = mock("second", Behavior::Json).await;
    let (first, other) = (fleet.backend.url(), second.url());
    let revision = hub
        .set_backends("only", vec![first.clone(), other.clone()], vec![])
        .await
        .unwrap();
    for p in &fleet.proxies {
        router_tests::control::wait_revision(p, revision).await;
    }
    // A suspicion a proxy raised, to show who raised it.
    hub.report_circuit(
        "edge-b",
        &router_proto::v1::CircuitReport {
            pool: "only".into(),
            endpoint: other.clone(),
            open: true,
            until_unix_ms: router_control_plane::hub::now_ms() + 120_000,
            suspect: "attempt".into(),
        },
    )
    .await
    .unwrap();
    let b = browser().await;
    sign_in(&b, &console, TOKEN).await;

    // The operator's pools page: both endpoints, the suspicion and who
    // raised it; Drain, through its confirmation page.
    b.goto(&format!("{console}/pools")).await.unwrap();
    let row =
        |addr: &str| format!("section[data-pool=\"only\"] tr.endpoint[data-endpoint=\"{addr}\"]");
    b.wait_for(&row(&first)).await.unwrap();
    let suspicion = b
        .text(
            &b.find(&format!("{} .suspicion", row(&other)))
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(
        suspicion.contains("suspect: attempt, raised by edge-b"),
        "{suspicion}"
    );
    b.screenshot_to(&shots().join("pools.png")).await.unwrap();
    b.click(&b.find(&format!("{} a.drain", row(&first))).await.unwrap())
        .await
        .unwrap();
    b.wait_for("#confirm-button").await.unwrap();
    let what = b.text(&b.find("#what").await.unwrap()).await.unwrap();
    assert!(
        what.starts_with(&format!("Drain {first} of pool only")),
        "{what}"
    );
    b.screenshot_to(&shots().join("pool-confirm.png"))
        .await
        .unwrap();
    for p in &fleet.proxies {
        assert!(
            !draining(&p.health().await, &first),
            "drained before the confirmation"
        );
    }
    b.click(&b.find("#confirm-button").await.unwrap())
        .await
        .unwrap();
    b.wait_for(&format!("{}.draining", row(&first)))
        .await
        .unwrap();
    assert_eq!(hub.state().backends["only"].drained, vec![first.clone()]);
    for p in &fleet.proxies {
        let h = p
            .wait_health("the proxy drains the endpoint", |h| draining(h, &first))
            .await;
        assert!(!draining(&h, &other));
    }

    // A viewer: the same rows, no button, the confirmation page and a
    // forged POST refused; nothing changes.
    sign_in(&b, &console, VIEWER).await;
    b.goto(&format!("{console}/pools")).await.unwrap();
    b.wait_for(&format!("{}.draining", row(&first)))
        .await
        .unwrap();
    assert!(b
        .find_all("a.drain, a.undrain, a.open, a.close")
        .await
        .unwrap()
        .is_empty());
    assert!(b.find_all("td.actions").await.unwrap().is_empty());
    let client = TestClient::new();
    let viewer = b.cookie("router_console").await.unwrap().unwrap();
    let viewer = viewer["value"].as_str().unwrap().to_string();
    let csrf = http_only::csrf_of(&client, &console, &viewer).await;
    let confirm = client
        .send(
            http::Method::GET,
            &format!("{console}/pools/confirm?action=drain&pool=only&endpoint={other}"),
            &[("cookie", format!("router_console={viewer}").as_str())],
            "",
        )
        .await;
    assert_eq!(confirm.status, StatusCode::FORBIDDEN);
    for action in ["drain", "undrain", "open", "close"] {
        let r = http_only::post(
            &client,
            &format!("{console}/pools/act"),
            &viewer,
            &format!(
                "csrf={csrf}&action={action}&pool=only&endpoint={}",
                first.replace(':', "%3A")
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{action}: {}", r.text());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hub.state().backends["only"].drained, vec![first.clone()]);
    assert!(hub.state().circuits.iter().all(|c| !c.suspect.is_empty()));

    // Explain, as the viewer: a SEND request goes to the pool on route
    // `send`, with its reason.
    b.goto(&format!("{console}/explain")).await.unwrap();
    b.wait_for("#explain-form").await.unwrap();
    b.click(&b.find("#risk option[value=\"SEND\"]").await.unwrap())
        .await
        .unwrap();
    b.click(&b.find("#explain-button").await.unwrap())
        .await
        .unwrap();
    b.wait_for("#decision[data-route=\"send\"][data-pool=\"only\"]")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let reason = b.text(&b.find("#reason").await.unwrap()).await.unwrap();
    assert!(!reason.is_empty());
    b.screenshot_to(&shots().join("explain.png")).await.unwrap();

    // Every endpoint drained now: explain says so, and that the request
    // would be parked.
    hub.set_backends(
        "only",
        vec![first.clone(), other.clone()],
        vec![first.clone(), other.clone()],
    )
    .await
    .unwrap();
    b.goto(&format!("{console}/explain?risk=SEND"))
        .await
        .unwrap();
    b.wait_for("#decision[data-route=\"send\"]").await.unwrap();
    let fleet_now = b.text(&b.find("#fleet").await.unwrap()).await.unwrap();
    assert!(
        fleet_now.contains("only: every endpoint is drained"),
        "{fleet_now}"
    );
    let source = b.source().await.unwrap();
    assert!(source.contains("data-pool=\"\""), "a pool chosen: {source}");
    let reason = b.text(&b.find("#reason").await.unwrap()).await.unwrap();
    assert!(reason.contains("park"), "{reason}");

    // With a tenant: whether the policy lets it use the route at that risk.
    let with_tenant = format!(
        "{}  tenants:\n    - {{name: reader, anonymous: true, max_risk: READ}}\n",
        policy(&first)
    );
    hub.apply_policy(&with_tenant, false, 0, "test")
        .await
        .unwrap();
    b.goto(&format!("{console}/explain?risk=SEND&tenant=reader"))
        .await
        .unwrap();
    let verdict = b.wait_for("#tenant-verdict.error").await.unwrap();
    let verdict = b.text(&verdict).await.unwrap();
    assert!(verdict.starts_with("refused: "), "{verdict}");
    b.goto(&format!("{console}/explain?risk=READ&tenant=reader"))
        .await
        .unwrap();
    let verdict = b.wait_for("#tenant-verdict.ok").await.unwrap();
    let verdict = b.text(&verdict).await.unwrap();
    assert!(
        verdict.starts_with("reader may send a READ request on route default"),
        "{verdict}"
    );

    b.quit().await.unwrap();
    fleet.stop().await;
}
