//! Instructions per routing decision, for callgrind.
//!
//! ```text
//! cargo build --release -p router-policy --example decide_cost
//! valgrind --tool=callgrind --toggle-collect='*decide_cost*old_path*' \
//!     target/release/examples/decide_cost old 10000
//! ```
//!
//! (`new_path` for `new`.) Divide the collected instructions by the call
//! count, or take the difference of two runs with different counts. `old`
//! builds a `Situation` (a map entry per measured pool of the chain, as the
//! proxy did) and calls `decide`; `old1` is the same with one measured
//! pool; `new` calls `decide_on_route`. The route is found before either
//! (the proxy needs it earlier anyway). The case: a 3-pool chain, every
//! pool healthy, one gate set (queue depth on the first pool).
//!
//! When `decide_on_route` was added (system allocator, glibc malloc):
//! `old` 5,274 instructions per call (2,153 of them in the allocator, 14
//! allocations), `old1` 4,149 (1,777; 12), `new` 1,234 (282; 2).

#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use router_policy::decide::{decide, decide_on_route, PoolMeasurements, RequestFacts, Situation};
use router_policy::document::load;
use router_policy::{Policy, QueueSettings, Risk, Route};

const POLICY: &str = "\
apiVersion: router/v1
kind: RoutingPolicy
spec:
  defaults: {deadline_ms: 30000}
  pools:
    - name: local-medium
      endpoints: [\"h1:1\"]
      gates: {healthy: true, max_queue_depth: 4}
    - name: local-small
      endpoints: [\"h2:1\"]
    - name: cloud-cheap
      endpoints: [\"h3:1\"]
      price: {input_per_1k_usd: 0.0005, output_per_1k_usd: 0.0015}
  routes:
    - name: default
      chain: [local-medium, local-small, cloud-cheap]
";

fn measurements(i: usize) -> PoolMeasurements {
    PoolMeasurements {
        vram_free_mb: Some(30_000),
        queue_depth: Some(u32::try_from(i).unwrap_or(0)),
        latency_ms: Some(120.0),
        healthy: Some(true),
        structured_degraded: false,
        tpot_ms: None,
        unhealthy_because: None,
        quota_requests_remaining: None,
        quota_tokens_remaining: None,
        quota_reset_ms: None,
    }
}

/// The proxy's old path (the route already found): move the request's strings into a `Situation`,
/// insert each measured pool of the chain, decide, take the strings back.
#[inline(never)]
fn old_path(
    policy: &Policy,
    route: &Route,
    measured: usize,
    model: &mut Option<String>,
    path: &mut String,
) -> (usize, usize) {
    let mut situation = Situation {
        risk: Some(Risk::Read),
        model: model.take(),
        path: Some(std::mem::take(path)),
        structured_output: false,
        deadline_ms: Some(30_000),
        input_tokens: Some(200),
        max_tokens: Some(256),
        pools: Default::default(),
        endpoints: Default::default(),
        prompt: None,
        prefix_last_served: None,
        request: None,
        ..Situation::default()
    };
    for (i, name) in route.pools().enumerate().take(measured) {
        situation
            .pools
            .insert(name.to_owned(), black_box(measurements(i)));
    }
    let decision = decide(policy, &situation);
    *model = situation.model.take();
    *path = situation.path.take().unwrap_or_default();
    (decision.candidates.len(), decision.reason.len())
}

/// The proxy's new path: borrowed facts, measurements asked as the gates
/// reach each pool.
#[inline(never)]
fn new_path(policy: &Policy, route: &Route, model: &Option<String>, path: &str) -> (usize, usize) {
    let facts = RequestFacts {
        risk: Risk::Read,
        model: model.as_deref(),
        path,
        structured_output: false,
        deadline_ms: Some(30_000),
        input_tokens: Some(200),
        max_tokens: Some(256),
        keys: Default::default(),
    };
    let verdict = decide_on_route(policy, route, &facts, |i, _| {
        Some(black_box(measurements(i)))
    });
    (verdict.candidates.len(), verdict.reason.len())
}

fn main() {
    let policy = load(POLICY, &QueueSettings::default()).unwrap();
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "old".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let mut model = Some("llama3".to_string());
    let mut path = "/v1/chat/completions".to_string();
    // The proxy looks the route up before deciding, on either path.
    let route = policy
        .route_for_risk(Risk::Read, model.as_deref(), &path)
        .unwrap();
    let mut sum = 0;
    for _ in 0..n {
        let (c, r) = match which.as_str() {
            "old" => old_path(black_box(&policy), route, 3, &mut model, &mut path),
            "old1" => old_path(black_box(&policy), route, 1, &mut model, &mut path),
            "new" => new_path(black_box(&policy), route, &model, &path),
            other => panic!("unknown path {other}"),
        };
        sum += c + r;
    }
    println!("{which}: {n} calls, checksum {sum}");
}
