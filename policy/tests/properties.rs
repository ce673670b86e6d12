//! Properties of the decision: deterministic, total (never panics), and
//! consistent (the chosen pool passed every gate; every other pool of the
//! chain is either a later candidate or skipped with a reason); and the
//! proxy's entry point, `decide_on_route`, agrees with `decide`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use router_policy::decide::{decide, decide_on_route, explain, PoolMeasurements, Situation};
use router_policy::document::load;
use router_policy::{Policy, QueueSettings, Risk};

const POOLS: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Debug, Clone)]
struct PoolParams {
    max_queue_depth: Option<u32>,
    fraction: Option<f64>,
    min_vram: Option<u64>,
    structured: bool,
    price_in: f64,
    price_out: f64,
    healthy_gate: bool,
}

fn pool_params() -> impl Strategy<Value = PoolParams> {
    (
        proptest::option::of(0u32..10),
        proptest::option::of(0.05f64..2.0),
        proptest::option::of(0u64..60_000),
        any::<bool>(),
        0.0f64..0.05,
        0.0f64..0.1,
        any::<bool>(),
    )
        .prop_map(|(q, f, v, s, pi, po, h)| PoolParams {
            max_queue_depth: q,
            fraction: f,
            min_vram: v,
            structured: s,
            price_in: pi,
            price_out: po,
            healthy_gate: h,
        })
}

fn policy_text(
    pools: &[PoolParams],
    chain: &[usize],
    ceiling: Option<f64>,
    downgrade: bool,
    deadline: u64,
) -> String {
    let mut text = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  defaults: {{deadline_ms: {deadline}}}\n  pools:\n"
    );
    for (i, p) in pools.iter().enumerate() {
        text.push_str(&format!(
            "    - name: {}\n      endpoints: [\"h{i}:1\"]\n",
            POOLS[i]
        ));
        text.push_str(&format!("      structured_output: {}\n", p.structured));
        text.push_str(&format!(
            "      price: {{input_per_1k_usd: {}, output_per_1k_usd: {}}}\n",
            p.price_in, p.price_out
        ));
        let mut gates = vec![format!("healthy: {}", p.healthy_gate)];
        if let Some(q) = p.max_queue_depth {
            gates.push(format!("max_queue_depth: {q}"));
        }
        if let Some(f) = p.fraction {
            gates.push(format!("max_latency_budget_fraction: {f}"));
        }
        if let Some(v) = p.min_vram {
            gates.push(format!("min_vram_free_mb: {v}"));
            text.push_str("      capacity_probe: {kind: ollama, vram_total_mb: 65536}\n");
        }
        text.push_str(&format!("      gates: {{{}}}\n", gates.join(", ")));
    }
    let chain: Vec<&str> = chain.iter().map(|i| POOLS[*i]).collect();
    text.push_str("  routes:\n    - name: governed\n      match: {risk: [DESTRUCTIVE]}\n");
    text.push_str(&format!(
        "      chain: [{}]\n      requires_approval: true\n",
        chain[0]
    ));
    text.push_str(&format!(
        "    - name: default\n      chain: [{}]\n      allow_downgrade: {downgrade}\n",
        chain.join(", ")
    ));
    if let Some(c) = ceiling {
        text.push_str(&format!("      cost_ceiling_per_call_usd: {c}\n"));
    }
    text
}

fn measurements() -> impl Strategy<Value = PoolMeasurements> {
    (
        proptest::option::of(prop_oneof![Just(0u64), Just(u64::MAX), 0u64..70_000]),
        proptest::option::of(prop_oneof![Just(u32::MAX), 0u32..12]),
        proptest::option::of(prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            0.0f64..5000.0
        ]),
        proptest::option::of(any::<bool>()),
        any::<bool>(),
    )
        .prop_map(|(v, q, l, h, d)| PoolMeasurements {
            vram_free_mb: v,
            queue_depth: q,
            latency_ms: l,
            healthy: h,
            structured_degraded: d,
            ..PoolMeasurements::default()
        })
}

fn situation() -> impl Strategy<Value = Situation> {
    (
        proptest::option::of(prop_oneof![
            Just(Risk::Read),
            Just(Risk::Draft),
            Just(Risk::Send),
            Just(Risk::Destructive)
        ]),
        any::<bool>(),
        proptest::option::of(prop_oneof![Just(0u64), Just(u64::MAX), 1u64..10_000]),
        proptest::option::of(prop_oneof![Just(u64::MAX), 0u64..200_000]),
        proptest::option::of(0u64..100_000),
        proptest::collection::vec(measurements(), 4),
    )
        .prop_map(|(risk, structured, deadline_ms, input, max_tokens, ms)| {
            let mut pools = BTreeMap::new();
            for (i, m) in ms.into_iter().enumerate() {
                pools.insert(POOLS[i].to_string(), m);
            }
            Situation {
                risk,
                structured_output: structured,
                deadline_ms,
                input_tokens: input,
                max_tokens,
                pools,
                ..Situation::default()
            }
        })
}

/// A situation that may leave pools unmeasured and may say why an
/// unhealthy pool is (the proxy does; a situation's JSON cannot).
fn sparse_situation() -> impl Strategy<Value = Situation> {
    (
        situation(),
        proptest::collection::vec(any::<bool>(), 4),
        proptest::option::of(prop_oneof![Just("drained"), Just("no endpoints")]),
    )
        .prop_map(|(mut s, keep, because)| {
            for (name, keep) in POOLS.iter().zip(keep) {
                if !keep {
                    s.pools.remove(*name);
                }
            }
            for m in s.pools.values_mut() {
                m.unhealthy_because = because;
            }
            s
        })
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        proptest::collection::vec(pool_params(), 4),
        Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
        1usize..=4,
        proptest::option::of(0.0f64..0.5),
        any::<bool>(),
        1u64..10_000,
    )
        .prop_filter_map(
            "valid policies only",
            |(pools, order, n, ceiling, downgrade, deadline)| {
                let text = policy_text(&pools, &order[..n], ceiling, downgrade, deadline);
                load(&text, &QueueSettings::default()).ok()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_same_situation_always_gets_the_same_route_and_reason(p in policy(), s in situation()) {
        let first = decide(&p, &s);
        let again = decide(&p.clone(), &s.clone());
        prop_assert_eq!(&first, &again);
        prop_assert_eq!(explain(&p, &s), explain(&p, &s));
    }

    #[test]
    fn decisions_are_total_and_consistent(p in policy(), s in situation()) {
        let d = decide(&p, &s);
        let route = p.routes.iter().find(|r| Some(&r.name) == d.route.as_ref());
        let route = route.expect("a catch-all route exists, so one always matches");
        // Every chain pool is a candidate or skipped, exactly once, in order.
        let mut seen: Vec<&String> = d.candidates.iter().chain(d.skipped.iter().map(|s| &s.pool)).collect();
        seen.sort();
        let mut chain: Vec<&str> = route.pools().collect();
        let mut seen: Vec<&str> = seen.into_iter().map(String::as_str).collect();
        seen.sort();
        chain.sort();
        prop_assert_eq!(seen, chain);
        for c in &d.candidates {
            prop_assert!(!d.skipped.iter().any(|s| &s.pool == c));
            prop_assert!(d.reason.contains(&route.name));
        }
        prop_assert_eq!(d.refusal.is_none(), !d.candidates.is_empty());
        if let Some(first) = d.candidates.first() {
            let expected_end = format!("{first} chosen");
            prop_assert!(d.reason.ends_with(&expected_end));
            if !route.allow_downgrade {
                prop_assert_eq!(Some(first.as_str()), route.first_pool());
            }
        }
        prop_assert_eq!(d.requires_approval, route.requires_approval);
    }

    #[test]
    fn decide_on_route_agrees_with_decide(p in policy(), s in sparse_situation()) {
        let d = decide(&p, &s);
        let name = d.route.as_ref().expect("a catch-all route exists");
        let route = p.routes.iter().find(|r| &r.name == name).unwrap();
        let mut asked = Vec::new();
        let v = decide_on_route(&p, route, &s.facts(p.default_risk), |i, pool| {
            asked.push(i);
            assert_eq!(Some(pool), route.pool_at(i));
            s.pools.get(pool).copied()
        });
        let names: Vec<&str> = v.candidate_names(route).collect();
        prop_assert_eq!(names, d.candidates.iter().map(String::as_str).collect::<Vec<_>>());
        prop_assert_eq!(v.refusal, d.refusal);
        prop_assert_eq!(&v.reason, &d.reason);
        // Each pool measured at most once, in chain order.
        prop_assert!(asked.windows(2).all(|w| w[0] < w[1]), "{:?}", asked);
        prop_assert!(v.candidates.capacity() <= route.pool_count());
    }
}
