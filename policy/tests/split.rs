//! Properties of a split's choice (`router_policy::split`) and of the
//! order a request tries its route's pools in (`Route::order`):
//!
//! - the same key always picks the same side (every proxy, every restart:
//!   nothing but the key, the route and the weights goes in);
//! - a side of weight 0 is never picked, nor tried as a fallback;
//! - over 10,000 keys a split's shares are within 1% of its weights;
//! - raising the first side's weight (a ramp's `new`, 10 to 25 of 100)
//!   only moves keys from the other sides to it, never away from it;
//! - the order is the chosen side, the split's other sides heaviest
//!   first, then the chain's next steps; and the proxy's `decide_on_route`
//!   agrees with `explain`'s `decide` on a split route.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use router_policy::decide::{decide, decide_on_route, Situation};
use router_policy::document::load;
use router_policy::split::{
    choose, pick, point, seed, KeyKind, Split, SplitKeys, SplitSide, Sticky,
};
use router_policy::{ChainStep, Policy, QueueSettings, Route};

fn split(weights: &[u32]) -> Split {
    Split {
        sides: weights
            .iter()
            .enumerate()
            .map(|(i, &w)| SplitSide {
                pool: format!("p{i}"),
                weight: w,
            })
            .collect(),
        sticky: Sticky::RequestId,
        ramp: None,
    }
}

fn by_id(id: &str) -> SplitKeys<'_> {
    SplitKeys {
        request_id: Some(id),
        ..SplitKeys::default()
    }
}

/// The side `id` takes on route `r` over `weights`.
fn side(weights: &[u32], id: &str) -> usize {
    choose("r", &split(weights), &by_id(id)).unwrap().0
}

/// `n` request ids as the proxy makes them (UUIDv7 text), from a fixed
/// seed: the same keys every run, so the share checks cannot flake.
fn uuid_like(n: usize) -> Vec<String> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..n)
        .map(|i| {
            let (a, b) = (next(), next());
            format!(
                "0190{:04x}-{:04x}-7{:03x}-{:04x}-{:012x}",
                i as u16,
                (a >> 48) as u16,
                (a >> 32) as u16 & 0xfff,
                (b >> 48) as u16 & 0x3fff | 0x8000,
                b & 0xffff_ffff_ffff
            )
        })
        .collect()
}

#[test]
fn ten_thousand_keys_land_within_one_percent_of_the_weights() {
    let ids = uuid_like(10_000);
    let sequential: Vec<String> = (0..10_000).map(|i| format!("req-{i}")).collect();
    for keys in [&ids, &sequential] {
        for weights in [[10u32, 90], [25, 75], [50, 50], [1, 99], [90, 10]] {
            let on_first = keys.iter().filter(|k| side(&weights, k) == 0).count();
            let want = 10_000 * weights[0] as usize / 100;
            assert!(
                on_first.abs_diff(want) <= 100,
                "{weights:?}: {on_first} of 10000 on the first side, want {want}"
            );
        }
        // Three sides too.
        let mut counts = [0usize; 3];
        for k in keys.iter() {
            counts[side(&[20, 30, 50], k)] += 1;
        }
        for (got, want) in counts.iter().zip([2000usize, 3000, 5000]) {
            assert!(got.abs_diff(want) <= 100, "{counts:?}");
        }
    }
}

#[test]
fn a_ramp_from_ten_to_twenty_five_moves_only_old_keys_to_new() {
    let ids = uuid_like(10_000);
    let before: Vec<usize> = ids.iter().map(|k| side(&[10, 90], k)).collect();
    let after: Vec<usize> = ids.iter().map(|k| side(&[25, 75], k)).collect();
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    assert!(before
        .iter()
        .zip(&after)
        .all(|(&b, &a)| b == a || (b == 1 && a == 0)));
    // About 15% moved, all of them from old to new.
    assert!(moved.abs_diff(1500) <= 100, "{moved}");
}

fn weights() -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(0u32..100, 2..6)
        .prop_filter("a positive sum", |w| w.iter().any(|&x| x > 0))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_same_key_always_picks_the_same_side(w in weights(), key in ".{0,40}", route in "[a-z]{1,8}") {
        let s = split(&w);
        let first = choose(&route, &s, &by_id(&key));
        prop_assert_eq!(first, choose(&route, &s.clone(), &by_id(&key.clone())));
        // Nothing but the key, the route and the first pool goes in.
        let p = point(seed(&route, "p0"), &key);
        prop_assert_eq!(first.map(|c| c.0), pick(&w, p));
    }

    #[test]
    fn a_side_of_weight_zero_is_never_picked_nor_tried(w in weights(), key in ".{0,40}") {
        let (chosen, kind, _) = choose("r", &split(&w), &by_id(&key)).unwrap();
        prop_assert!(w[chosen] > 0);
        prop_assert_eq!(kind, KeyKind::RequestId);
        let route = split_route(&w);
        let order: Vec<usize> = route.order(&by_id(&key)).iter().collect();
        for (i, &weight) in w.iter().enumerate() {
            prop_assert_eq!(order.contains(&i), weight > 0, "{:?} {:?}", w, order);
        }
    }

    #[test]
    fn raising_the_first_sides_weight_only_moves_keys_to_it(
        a in 0u32..=100,
        b in 0u32..=100,
        key in ".{0,40}",
    ) {
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assume!(lo < 100);
        let before = side(&[lo, 100 - lo], &key);
        let after = if hi == 100 { 0 } else { side(&[hi, 100 - hi], &key) };
        // On new at the lower weight: still on new at the higher one.
        prop_assert!(before != 0 || after == 0);
        // Any move goes from old to new.
        prop_assert!(before == after || (before == 1 && after == 0));
    }

    #[test]
    fn the_order_is_the_chosen_side_its_split_heaviest_first_then_the_chain(
        w in weights(),
        key in "[a-z0-9-]{1,20}",
    ) {
        let route = split_route(&w);
        let order = route.order(&by_id(&key));
        let positions: Vec<usize> = order.iter().collect();
        let chosen = order.splits[0].at;
        prop_assert_eq!(positions[0], chosen);
        // The split's other sides, heaviest first, then `tail`.
        let n = w.len();
        prop_assert_eq!(*positions.last().unwrap(), n);
        let rest = &positions[1..positions.len() - 1];
        prop_assert!(rest.windows(2).all(|p| w[p[0]] >= w[p[1]]), "{:?} {:?}", w, positions);
        prop_assert_eq!(route.pool_at(n), Some("tail"));
    }

    #[test]
    fn the_proxys_decision_agrees_with_explains_on_a_split_route(
        w in weights(),
        key in "[a-z0-9-]{1,20}",
        healthy in proptest::collection::vec(any::<bool>(), 6),
    ) {
        let policy = split_policy(&w);
        let route = &policy.routes[0];
        let pools: Vec<&str> = route.pools().collect();
        let situation = Situation {
            request_id: Some(key.clone()),
            pools: pools
                .iter()
                .zip(&healthy)
                .map(|(p, &h)| (p.to_string(), router_policy::decide::PoolMeasurements {
                    healthy: Some(h),
                    ..Default::default()
                }))
                .collect(),
            ..Situation::default()
        };
        let d = decide(&policy, &situation);
        let mut asked = Vec::new();
        let v = decide_on_route(&policy, route, &situation.facts(policy.default_risk), |i, name| {
            asked.push(i);
            assert_eq!(Some(name), route.pool_at(i));
            situation.pools.get(name).copied()
        });
        let names: Vec<&str> = v.candidate_names(route).collect();
        prop_assert_eq!(names, d.candidates.iter().map(String::as_str).collect::<Vec<_>>());
        prop_assert_eq!(&v.reason, &d.reason);
        prop_assert_eq!(v.first, Some(v.splits[0].at));
        prop_assert_eq!(asked, route.order(&by_id(&key)).iter().collect::<Vec<_>>());
        let chosen = route.pool_at(v.splits[0].at).unwrap();
        let expected = format!("; split: {chosen} (weight ");
        prop_assert!(d.reason.contains(&expected), "{}", d.reason);
    }
}

/// A route whose chain is a split over `p0..` with `weights`, then `tail`.
fn split_route(weights: &[u32]) -> Route {
    let mut route = split_policy(weights).routes.remove(0);
    if let ChainStep::Split(s) = &mut route.chain[0] {
        s.sides
            .iter_mut()
            .zip(weights)
            .for_each(|(s, &w)| s.weight = w);
    }
    route
}

fn split_policy(weights: &[u32]) -> Policy {
    let mut pools = String::new();
    let mut sides = Vec::new();
    for (i, w) in weights.iter().enumerate() {
        pools.push_str(&format!("    - {{name: p{i}, gates: {{healthy: true}}}}\n"));
        sides.push(format!("{{pool: p{i}, weight: {w}}}"));
    }
    let text = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n{pools}    - {{name: tail}}\n  routes:\n    - name: r\n      chain: [{{split: [{}]}}, tail]\n",
        sides.join(", ")
    );
    load(&text, &QueueSettings::default()).unwrap()
}
