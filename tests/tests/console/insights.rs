//! The Tenants and Decisions pages in the browser: requests made through
//! managed proxies on a real Redis show up in their tenant's charts (the
//! proxies' hourly rollups) and, with their reason and attempts, on the
//! decisions page (the proxies' rings, fetched over the config stream);
//! filtering by route hides the others; a tenant named
//! `<script>alert(1)</script>` renders as text on both pages.

use std::time::Duration;

use http::StatusCode;
use router_policy::tenant::key_hash_text;
use router_tests::harness::{eventually, WAIT_AT_MOST};

use super::{browser, shots, sign_in, Fleet, SCRIPT, SCRIPT_ESCAPED, VIEWER};

const ACME_KEY: &str = "acme-tenant-key";
const SCRIPT_KEY: &str = "script-tenant-key";
/// A small `max_tokens`: the worst case reserved fits the day's budget.
const BODY: &str =
    r#"{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hello there"}]}"#;

/// Two tenants (`acme` with budgets, and the `<script>` one), priced
/// pools, a `send` route and a `default` one.
fn policy(url: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["{url}"]
      price: {{input_per_1k_usd: 10.0, output_per_1k_usd: 20.0}}
  routes:
    - name: send
      match: {{risk: [SEND, DESTRUCTIVE]}}
      chain: [only]
    - name: default
      chain: [only]
  tenants:
    - name: acme
      keys: ["{acme}"]
      limits:
        requests_per_minute: 600
        budget_usd_per_day: 5.0
        budget_usd_per_month: 100.0
    - name: {script:?}
      keys: ["{scripted}"]
"#,
        acme = key_hash_text(ACME_KEY),
        scripted = key_hash_text(SCRIPT_KEY),
        script = SCRIPT,
    )
}

/// The rollup field `field` of `tenant`'s current hour, as the store has it.
fn rollup(fleet: &Fleet, tenant: &str, field: &str) -> u64 {
    let now = router_policy::wall_clock::unix_ms() / 1000;
    let key = format!(
        "router:{}",
        router_policy::rollup::key(tenant, &router_policy::rollup::hour(now))
    );
    fleet
        .redis
        .query(&["HGET", &key, field])
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_charts_and_decisions_show_requests_made_through_the_proxies() {
    let fleet = Fleet::start_with("insights", policy).await;
    let console = fleet.console();
    let bearer = |key: &str| format!("Bearer {key}");

    // Three READ requests of acme through two proxies, one SEND request of
    // acme, one request of the `<script>` tenant.
    let acme = bearer(ACME_KEY);
    for p in [0, 1, 0] {
        let r = fleet.proxies[p]
            .chat_with(&[("authorization", acme.as_str())], BODY)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let r = fleet.proxies[2]
        .chat_with(
            &[("authorization", acme.as_str()), ("x-router-risk", "SEND")],
            BODY,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let scripted = bearer(SCRIPT_KEY);
    let r = fleet.proxies[1]
        .chat_with(&[("authorization", scripted.as_str())], BODY)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // The proxies' rollups reach the store, off the requests' path.
    eventually(
        WAIT_AT_MOST,
        "acme's rollup counts its four requests",
        || rollup(&fleet, "acme", "requests") == 4,
    )
    .await;
    eventually(WAIT_AT_MOST, "the <script> tenant's rollup", || {
        rollup(&fleet, SCRIPT, "requests") == 1
    })
    .await;
    assert!(
        rollup(&fleet, "acme", "tokens") > 0,
        "the mock reports usage"
    );
    assert!(rollup(&fleet, "acme", "micros") > 0, "priced");
    let ttl = fleet
        .redis
        .query(&[
            "PTTL",
            &format!(
                "router:{}",
                router_policy::rollup::key(
                    "acme",
                    &router_policy::rollup::hour(router_policy::wall_clock::unix_ms() / 1000)
                )
            ),
        ])
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(-1);
    assert!(
        ttl > 30 * 86_400_000 && ttl <= 31 * 86_400_000,
        "kept 31 days: {ttl}"
    );

    let b = browser().await;
    sign_in(&b, &console, VIEWER).await;

    // Tenants: acme's charts count its requests; the <script> tenant is text.
    b.goto(&format!("{console}/tenants")).await.unwrap();
    b.wait_for("table#tenants").await.unwrap();
    let acme_chart = "section.tenant-charts[data-tenant=\"acme\"] figure.requests-24h";
    b.wait_for(acme_chart).await.unwrap();
    let source = b.source().await.unwrap();
    assert!(
        source.contains("figure class=\"chart requests-24h\" data-total=\"4\""),
        "acme's 24-hour requests chart: {source}"
    );
    assert_eq!(
        b.find_all(&format!("{acme_chart} rect.bar[data-value=\"4\"]"))
            .await
            .unwrap()
            .len(),
        1,
        "one bar, this hour's, with the four requests"
    );
    assert!(source.contains("<svg"), "drawn as SVG by the server");
    assert!(source.contains(SCRIPT_ESCAPED), "{source}");
    assert!(!source.contains(SCRIPT), "{source}");
    let names: Vec<String> = {
        let mut out = Vec::new();
        for e in b.find_all("tr.tenant td.name a").await.unwrap() {
            out.push(b.text(&e).await.unwrap());
        }
        out
    };
    assert_eq!(names, ["acme", SCRIPT]);
    assert_eq!(b.alert_text().await.unwrap(), None, "a script ran");
    let spent = b
        .text(
            &b.find("tr.tenant[data-tenant=\"acme\"] td.budget")
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(
        spent.contains("of $5.00"),
        "today against its budget: {spent}"
    );
    b.screenshot_to(&shots().join("tenants.png")).await.unwrap();

    // Decisions: every request, newest first, with its reason and
    // attempts; the <script> tenant as text.
    b.goto(&format!("{console}/decisions")).await.unwrap();
    let send = "tr.decision[data-route=\"send\"]";
    b.wait_for(send).await.unwrap();
    let rows = b.find_all("tr.decision").await.unwrap();
    assert_eq!(rows.len(), 5, "{}", b.source().await.unwrap());
    let record = b.text(&b.find(send).await.unwrap()).await.unwrap();
    assert!(
        record.contains("edge-c"),
        "the proxy that routed it: {record}"
    );
    assert!(record.contains("acme"), "{record}");
    let reason = b
        .text(&b.find(&format!("{send} .reason")).await.unwrap())
        .await
        .unwrap();
    assert!(!reason.is_empty(), "each decision with its reason");
    assert_eq!(
        b.find_all(&format!("{send} li.attempt"))
            .await
            .unwrap()
            .len(),
        1,
        "and its attempts"
    );
    let source = b.source().await.unwrap();
    assert!(source.contains(SCRIPT_ESCAPED), "{source}");
    assert!(!source.contains(SCRIPT), "{source}");
    assert_eq!(b.alert_text().await.unwrap(), None, "a script ran");
    b.screenshot_to(&shots().join("decisions.png"))
        .await
        .unwrap();

    // Filtering by route, in the form: the default route's rows are gone.
    let field = b.find("#filter-route").await.unwrap();
    b.send_keys(&field, "send").await.unwrap();
    b.click(&b.find("#filter-button").await.unwrap())
        .await
        .unwrap();
    b.wait_for("a#filter-clear").await.unwrap();
    assert!(b.url().await.unwrap().contains("route=send"));
    assert_eq!(b.find_all("tr.decision").await.unwrap().len(), 1);
    assert!(b
        .find_all("tr.decision[data-route=\"default\"]")
        .await
        .unwrap()
        .is_empty());
    b.screenshot_to(&shots().join("decisions-filtered.png"))
        .await
        .unwrap();
    // And by the <script> tenant, through a link the page made.
    b.goto(&format!("{console}/decisions")).await.unwrap();
    b.wait_for(send).await.unwrap();
    let mut link = None;
    for a in b.find_all("tr.decision td.tenant a").await.unwrap() {
        if b.text(&a).await.unwrap() == SCRIPT {
            link = Some(a);
        }
    }
    b.click(&link.expect("a link to the <script> tenant's decisions"))
        .await
        .unwrap();
    b.wait_for("a#filter-clear").await.unwrap();
    assert!(b.url().await.unwrap().contains("tenant=%3Cscript%3E"));
    let rows = b.find_all("tr.decision").await.unwrap();
    assert_eq!(rows.len(), 1);
    let cell = b.find("tr.decision td.tenant a").await.unwrap();
    assert_eq!(b.text(&cell).await.unwrap(), SCRIPT);
    assert_eq!(b.alert_text().await.unwrap(), None, "a script ran");

    b.quit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    fleet.stop().await;
}
