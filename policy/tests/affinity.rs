//! Properties of prefix affinity (`router_policy::affinity`): every key is
//! placed within the load bound, the placement is consistent when the pool
//! changes, and keys spread over the ring.

use proptest::prelude::*;
use router_policy::affinity::Ring;
use router_policy::prefix_cache::block_chain;

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("http://10.0.0.{i}:8000")).collect()
}

proptest! {
    #[test]
    fn every_key_is_placed_within_the_load_bound(
        loads in prop::collection::vec(0u32..50, 1..8),
        key in any::<u64>(),
        c in 1.0f64..2.0,
    ) {
        let ring = Ring::new(&names(loads.len()));
        let chosen = ring.choose(key, &loads, c);
        prop_assert!(chosen.is_some());
        let e = chosen.unwrap_or_default();
        let total: u64 = loads.iter().map(|l| u64::from(*l)).sum::<u64>() + 1;
        let bound = (c * total as f64 / loads.len() as f64).ceil() as u64;
        prop_assert!(u64::from(loads[e]) < bound, "load {} bound {bound}", loads[e]);
        // The same inputs, the same answer (every proxy agrees).
        prop_assert_eq!(Ring::new(&names(loads.len())).choose(key, &loads, c), chosen);
    }

    #[test]
    fn removing_another_endpoint_keeps_a_keys_owner(n in 2usize..8, key in any::<u64>(), gone in 0usize..8) {
        let all = names(n);
        let owner = Ring::new(&all).owner(key).unwrap_or_default();
        let gone = gone % n;
        prop_assume!(gone != owner);
        let rest: Vec<String> = all.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, a)| a.clone()).collect();
        let now = Ring::new(&rest).owner(key).unwrap_or_default();
        prop_assert_eq!(&rest[now], &all[owner]);
    }
}

#[test]
fn keys_spread_over_the_endpoints() {
    let ring = Ring::new(&names(4));
    let mut count = [0usize; 4];
    for i in 0..4000u32 {
        let prompt = format!("{i:05} session's system prompt, long enough for a few blocks");
        // A prompt's home is its first block's hash.
        let key = block_chain(prompt.as_bytes(), 16, 4)[0];
        count[ring.owner(key).expect("an owner")] += 1;
    }
    for c in count {
        assert!((600..=1400).contains(&c), "{count:?}");
    }
}
