//! Issue 28: what an outside attack found, replayed against the built
//! `router-proxy` binary as its own process (the way the attackers met
//! it), each test failing on the code before its fix. One module per
//! class of attack:
//!
//! - [`paths`]: encoded paths that skipped the router's reading of the
//!   request (item 1);
//! - [`credentials`]: credentials that are not a key (item 9);
//! - [`budgets`]: usage and caps that made answers cheap or free (items 4,
//!   5, 6, 15);
//! - [`structured`]: one tenant switching structured output off for all,
//!   and structured retries nobody paid for (items 7, 8).

#![allow(clippy::unwrap_used)]

mod budgets;
mod credentials;
mod paths;
mod structured;

/// A chat body with `extra` fields (`"max_tokens":5,` ...) before the
/// messages.
fn chat_body(extra: &str) -> String {
    format!(r#"{{"model":"m",{extra}"messages":[{{"role":"user","content":"hi"}}]}}"#)
}

use router_tests::harness::tenant_item as tenant;

/// Sends `body` to the proxy's chat path for the tenant whose key is `key`.
async fn send_as(
    proxy: &router_tests::proxy_process::ProxyProcess,
    key: &str,
    body: &str,
) -> router_tests::harness::TestResponse {
    let auth = format!("Bearer {key}");
    router_tests::harness::TestClient::new()
        .send(
            http::Method::POST,
            &proxy.url("/v1/chat/completions"),
            &[
                ("content-type", "application/json"),
                ("authorization", auth.as_str()),
            ],
            body.to_string(),
        )
        .await
}

/// A policy with pools `(name, url, extra lines)` priced $1 per 1k tokens
/// in and out, one route `chat` over them in order (with `route_extra`),
/// and `tenants`.
fn policy(pools: &[(&str, &str, &str)], route_extra: &str, tenants: &[String]) -> String {
    let mut doc = String::from("apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n");
    for (name, url, extra) in pools {
        doc.push_str(&format!(
            "    - name: {name}\n      endpoints: [\"{url}\"]\n      price: {{input_per_1k_usd: 1.0, output_per_1k_usd: 1.0}}\n"
        ));
        for line in extra.lines().filter(|l| !l.trim().is_empty()) {
            doc.push_str(&format!("      {}\n", line.trim()));
        }
    }
    let chain: Vec<&str> = pools.iter().map(|p| p.0).collect();
    doc.push_str(&format!(
        "  routes:\n    - name: chat\n      chain: [{}]\n",
        chain.join(", ")
    ));
    for line in route_extra.lines().filter(|l| !l.trim().is_empty()) {
        doc.push_str(&format!("      {}\n", line.trim()));
    }
    if !tenants.is_empty() {
        doc.push_str("  tenants:\n");
        doc.push_str(&tenants.concat());
    }
    doc
}

/// Micro-USD of `tokens` at $1 per 1k.
fn micros(tokens: u64) -> u64 {
    tokens * 1000
}

/// Today's budget day, as the spend counters name it (UTC, wall clock).
fn today() -> String {
    let now = router_policy::wall_clock::since_epoch().as_secs();
    router_policy::tenant::periods(now).0
}
