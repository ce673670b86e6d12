//! Properties of the fallback rule (`router_policy::fallback::next_step`),
//! for every outcome, risk, route and time left:
//!
//! - a SEND or DESTRUCTIVE request that may have reached its backend is
//!   never sent again;
//! - `fallback: false` and a spent deadline never move a request on;
//! - a request moves on only after a shed or a failure its route retries;
//! - an answer, and only an answer, ends the walk with `Answer`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use router_policy::document::RouteMatch;
use router_policy::{next_step, Outcome, RetryOn, Risk, Route, Step};

const CLASSES: [RetryOn; 5] = [
    RetryOn::ConnectError,
    RetryOn::Timeout,
    RetryOn::Status429,
    RetryOn::Status5xx,
    RetryOn::MalformedJson,
];

fn route() -> impl Strategy<Value = Route> {
    (any::<bool>(), proptest::bits::u8::masked(0b1_1111)).prop_map(|(fallback, mask)| Route {
        name: "r".into(),
        matches: RouteMatch::default(),
        chain: vec!["a".into(), "b".into()],
        deadline: None,
        attempt_timeout: None,
        retry_on: CLASSES
            .into_iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, c)| c)
            .collect(),
        fallback,
        requires_approval: false,
        allow_downgrade: true,
        cost_ceiling_per_call_usd: None,
        finish_on_client_gone: true,
        first_token_timeout: None,
        stall_timeout: None,
        hedge: None,
        retry_budget: router_policy::retry_budget::BudgetSettings::default(),
        park: None,
        cache: None,
    })
}

fn outcome() -> impl Strategy<Value = Outcome> {
    proptest::sample::select(Outcome::ALL.to_vec())
}

fn risk() -> impl Strategy<Value = Risk> {
    proptest::sample::select(Risk::ALL.to_vec())
}

fn time_left() -> impl Strategy<Value = Option<Duration>> {
    proptest::option::of((0u64..3).prop_map(Duration::from_millis))
}

proptest! {
    #[test]
    fn side_effects_are_never_sent_twice(
        r in route(), risk in risk(), o in outcome(), t in time_left()
    ) {
        let step = next_step(&r, risk, o, t);
        if risk.has_side_effects() && o.may_have_reached_backend() {
            prop_assert_ne!(step, Step::NextPool, "{} {}", risk.as_str(), o);
        }
    }

    #[test]
    fn nothing_moves_on_without_fallback_or_time(
        r in route(), risk in risk(), o in outcome(), t in time_left()
    ) {
        let step = next_step(&r, risk, o, t);
        if !r.fallback || t == Some(Duration::ZERO) {
            prop_assert_ne!(step, Step::NextPool);
        }
    }

    #[test]
    fn only_sheds_and_retried_failures_move_on(
        r in route(), risk in risk(), o in outcome(), t in time_left()
    ) {
        if next_step(&r, risk, o, t) == Step::NextPool {
            let retried = o.retry_class().is_some_and(|c| r.retry_on.contains(&c));
            prop_assert!(o.is_shed() || retried, "{}", o);
        }
    }

    #[test]
    fn answers_end_the_walk(r in route(), risk in risk(), o in outcome(), t in time_left()) {
        prop_assert_eq!(next_step(&r, risk, o, t) == Step::Answer, o.is_success());
    }
}

#[test]
fn every_outcome_is_decided_for_a_read_on_a_default_route() {
    // Exhaustive over the (small) outcome space: which endings move a READ
    // request on under the default retry_on, with time left.
    let r = Route {
        name: "r".into(),
        matches: RouteMatch::default(),
        chain: vec!["a".into(), "b".into()],
        deadline: None,
        attempt_timeout: None,
        retry_on: RetryOn::DEFAULT.to_vec(),
        fallback: true,
        requires_approval: false,
        allow_downgrade: true,
        cost_ceiling_per_call_usd: None,
        finish_on_client_gone: true,
        first_token_timeout: None,
        stall_timeout: None,
        hedge: None,
        retry_budget: router_policy::retry_budget::BudgetSettings::default(),
        park: None,
        cache: None,
    };
    let moving: Vec<&str> = Outcome::ALL
        .into_iter()
        .filter(|o| next_step(&r, Risk::Read, *o, None) == Step::NextPool)
        .map(Outcome::as_str)
        .collect();
    assert_eq!(
        moving,
        [
            "connect_error",
            "upstream_error",
            "timeout",
            "status_429",
            "status_5xx",
            "first_token_timeout",
            "stream_error",
            "deadline_exhausted",
            "queue_full",
            "queue_timeout",
            "no_backend",
            "overloaded",
            "budget_exceeded",
            "invalid_request",
        ]
    );
}
