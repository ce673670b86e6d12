//! Shifting traffic (issue 35): weighted splits in a route's chain, through
//! a real proxy over loopback to mock endpoints that count what they get
//! (docs/traffic.md).

#![allow(clippy::unwrap_used)]

mod ramp;
mod splits;

use router_proxy::Settings;

/// A policy with pools `new` and `old` (and `last`) at these URLs, and one
/// route whose chain is `chain`; `extra` goes under the route.
pub fn policy(new: &str, old: &str, last: &str, chain: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
metadata: {{name: traffic}}
spec:
  circuit_breaker: {{consecutive_errors: 1000}}
  pools:
    - name: new
      endpoints: ["{new}"]
    - name: old
      endpoints: ["{old}"]
    - name: last
      endpoints: ["{last}"]
  routes:
    - name: default
      chain: {chain}
      {extra}
"#
    )
}

/// Default settings with an admin token (for explain).
pub fn settings() -> Settings {
    Settings {
        admin_token: Some("admin".into()),
        ..Settings::default()
    }
}
