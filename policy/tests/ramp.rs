//! Properties of a ramp's step decision (`router_policy::ramp::decide`),
//! for any ramp, weight, time in the step and windows of the two sides:
//!
//! - it never advances a new side with fewer than `min_requests` requests
//!   in the step (nor, with a latency guard, an old side with fewer);
//! - it rolls back, at once, a new side with `min_requests` requests whose
//!   error rate exceeds the old side's by more than `max_error_rate`, and
//!   never rolls back for errors a new side whose rate is within it;
//! - it never skips a step: an advance goes to the first step above the
//!   weight, and a healthy ramp walks every step in order to `Done`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use router_policy::ramp::{decide, Guard, Ramp, SideWindow, Verdict};

fn ramp() -> impl Strategy<Value = Ramp> {
    (
        proptest::collection::btree_set(1u32..=100, 1..6),
        1u64..1000,
        0.0f64..0.2,
        proptest::option::of(1.0f64..4.0),
        1u64..500,
    )
        .prop_map(|(steps, step_s, e, r, n)| Ramp {
            steps: steps.into_iter().collect(),
            step: Duration::from_secs(step_s),
            guard: Guard {
                max_error_rate: e,
                max_p95_ratio: r,
                min_requests: n,
            },
        })
}

fn window() -> impl Strategy<Value = SideWindow> {
    (
        0u64..2000,
        0.0f64..1.0,
        proptest::option::of(1.0f64..5000.0),
    )
        .prop_map(|(n, f, p)| SideWindow {
            requests: n,
            errors: (n as f64 * f * f) as u64,
            p95_ms: p,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn never_advances_below_min_requests(
        r in ramp(), w in 0u32..=100, secs in 0u64..3000, new in window(), old in window(),
    ) {
        let v = decide(&r, w, Duration::from_secs(secs), &new, &old);
        if let Verdict::Advance { .. } = v {
            prop_assert!(new.requests >= r.guard.min_requests, "{:?}", v);
            if r.guard.max_p95_ratio.is_some() {
                prop_assert!(old.requests >= r.guard.min_requests, "{:?}", v);
            }
            prop_assert!(Duration::from_secs(secs) >= r.step);
        }
    }

    #[test]
    fn rolls_back_exactly_when_the_new_sides_error_rate_exceeds_the_guard(
        r in ramp(), w in 1u32..=100, secs in 0u64..3000, new in window(), old in window(),
    ) {
        let mut r = r;
        r.guard.max_p95_ratio = None;
        let v = decide(&r, w, Duration::from_secs(secs), &new, &old);
        let last = *r.steps.last().unwrap();
        let limit = r.guard.max_error_rate + old.error_rate();
        if w >= last {
            prop_assert_eq!(v, Verdict::Done);
        } else if new.requests >= r.guard.min_requests && new.error_rate() > limit {
            prop_assert!(matches!(v, Verdict::RollBack { from, .. } if from == w), "{:?}", v);
        } else if new.error_rate() <= limit && new.requests >= r.guard.min_requests {
            prop_assert!(!matches!(v, Verdict::RollBack { .. }), "{:?}", v);
        }
    }

    #[test]
    fn never_skips_a_step(
        r in ramp(), w in 1u32..=100, secs in 0u64..3000, new in window(), old in window(),
    ) {
        if let Verdict::Advance { from, to, .. } = decide(&r, w, Duration::from_secs(secs), &new, &old) {
            prop_assert_eq!(from, w);
            let next = r.steps.iter().copied().find(|&s| s > w);
            prop_assert_eq!(Some(to), next);
        }
    }

    #[test]
    fn a_healthy_ramp_walks_every_step_in_order_to_done(r in ramp()) {
        let healthy = SideWindow { requests: r.guard.min_requests, errors: 0, p95_ms: Some(100.0) };
        let mut w = r.steps[0];
        let mut walked = vec![w];
        loop {
            match decide(&r, w, r.step, &healthy, &healthy) {
                Verdict::Advance { to, .. } => {
                    w = to;
                    walked.push(w);
                }
                Verdict::Done => break,
                other => prop_assert!(false, "{:?}", other),
            }
        }
        prop_assert_eq!(walked, r.steps.clone());
    }
}
