//! Fallback inside the deadline, no double spend, shedding and draining
//! (the drill at 1/20 scale is `--test drill`). Real sockets; mock model endpoints.

#![allow(clippy::unwrap_used)]

mod chain;
mod deadline;
mod hedging;
mod idempotency;
mod in_pool;
mod parking;
mod shared_store;
mod streams;

use router_proxy::Settings;

/// A two-pool policy: `primary` then `fallback`.
pub fn two_pools(primary: &str, fallback: &str, extra_route: &str, primary_extra: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
metadata: {{name: test}}
spec:
  pools:
    - name: primary
      endpoints: ["{primary}"]
      {primary_extra}
    - name: fallback
      endpoints: ["{fallback}"]
  routes:
    - name: default
      chain: [primary, fallback]
      {extra_route}
"#
    )
}

/// Milliseconds.
pub fn ms(n: u64) -> std::time::Duration {
    std::time::Duration::from_millis(n)
}

/// A metric line's value in `text`, if the series exists.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Default settings.
pub fn settings() -> Settings {
    Settings::default()
}
