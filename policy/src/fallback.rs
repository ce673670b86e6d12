//! What happens after an attempt: answer, try the next pool, or stop.
//!
//! A request walks its route's chain of pools. Each attempt ends with an
//! [`Outcome`]; [`next_step`] decides what the walk does next. The rules,
//! in the order they are applied:
//!
//! 1. **An answer ends the walk** ([`Step::Answer`]).
//! 2. **`fallback: false`** on the route: the first pool that took the
//!    request is the only one; any failure ends the walk.
//! 3. **The deadline is spent**: nothing after this attempt could answer in
//!    time, so the walk ends (and the request is answered
//!    `deadline_exhausted`).
//! 4. **Sheds move on.** A queue that was full or timed out, a pool with no
//!    endpoints, a slot given back because the answer could no longer come
//!    in time: the router never sent the request, so the next pool may take
//!    it whatever the route's `retry_on` and the request's risk.
//! 5. **`retry_on` decides for backend failures.** A failure whose class
//!    ([`Outcome::retry_class`]) the route does not list ends the walk.
//! 6. **No double side effects.** A SEND or DESTRUCTIVE request
//!    ([`Risk::has_side_effects`]) whose attempt may have reached its
//!    backend ([`Outcome::may_have_reached_backend`]: anything but a
//!    refused connection, a 429 or a request never sent) is never sent
//!    again: the walk ends and the client decides (with its
//!    `Idempotency-Key`).
//!
//! Otherwise the request moves to the next pool of the chain, with the
//! same request id. Which pool that is, and whether it can answer in the
//! time left, is [`crate::deadline::plan_attempt`]'s part.
//!
//! The function is pure: the proxy reads the clock and passes the time
//! left, so every rule is tested without a runtime, and the property test
//! below checks rule 6 for every outcome, risk and route.

use std::fmt;
use std::time::Duration;

use crate::document::{Risk, Route};
use crate::outcome::Outcome;

/// What the walk does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Pass the answer on; the walk is over.
    Answer,
    /// Try the next pool of the chain (same request id).
    NextPool,
    /// End the walk without an answer from this attempt's pool.
    Stop(StopReason),
}

/// Why the walk ended after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The route has `fallback: false`.
    FallbackOff,
    /// Nothing is left of the deadline.
    DeadlineSpent,
    /// The route's `retry_on` does not list this failure (or the ending is
    /// not a backend failure at all).
    NotRetried(Outcome),
    /// A request with side effects may have reached the backend.
    MayHaveReached(Risk),
    /// The route's retry budget has no room for another attempt (the
    /// proxy's call, after [`next_step`] said [`Step::NextPool`]; see
    /// [`crate::retry_budget`]).
    RetryBudgetExhausted,
}

impl StopReason {
    /// A label: `fallback_off`, `deadline_spent`, `not_retried`,
    /// `may_have_reached`, `retry_budget_exhausted`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::FallbackOff => "fallback_off",
            Self::DeadlineSpent => "deadline_spent",
            Self::NotRetried(_) => "not_retried",
            Self::MayHaveReached(_) => "may_have_reached",
            Self::RetryBudgetExhausted => "retry_budget_exhausted",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FallbackOff => f.write_str("fallback is off for this route"),
            Self::DeadlineSpent => f.write_str("the deadline is spent"),
            Self::NotRetried(o) => write!(f, "{o} is not in the route's retry_on"),
            Self::RetryBudgetExhausted => {
                f.write_str("retry_budget_exhausted: the route's retry budget is spent")
            }
            Self::MayHaveReached(r) => write!(
                f,
                "a {} request that may have reached its backend is not sent again",
                r.as_str()
            ),
        }
    }
}

/// Decides what follows an attempt of a `risk` request on `route` that
/// ended with `outcome`, with `time_left` of its deadline (`None`: no
/// deadline). See the module docs for the rules.
pub fn next_step(route: &Route, risk: Risk, outcome: Outcome, time_left: Option<Duration>) -> Step {
    if outcome.is_success() {
        return Step::Answer;
    }
    if !route.fallback {
        return Step::Stop(StopReason::FallbackOff);
    }
    if time_left.is_some_and(|t| t.is_zero()) {
        return Step::Stop(StopReason::DeadlineSpent);
    }
    if outcome.is_shed() {
        return Step::NextPool;
    }
    match outcome.retry_class() {
        Some(class) if route.retry_on.contains(&class) => {}
        _ => return Step::Stop(StopReason::NotRetried(outcome)),
    }
    if risk.has_side_effects() && outcome.may_have_reached_backend() {
        return Step::Stop(StopReason::MayHaveReached(risk));
    }
    Step::NextPool
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::RetryOn;

    fn route(fallback: bool, retry_on: &[RetryOn]) -> Route {
        Route::for_tests(vec!["a".into(), "b".into()], fallback, retry_on)
    }

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    #[test]
    fn an_answer_ends_the_walk_whatever_the_route() {
        let r = route(false, &[]);
        assert_eq!(next_step(&r, Risk::Send, Outcome::Ok, ms(0)), Step::Answer);
    }

    #[test]
    fn read_requests_move_on_for_every_default_failure() {
        let r = route(true, &RetryOn::DEFAULT);
        for o in [
            Outcome::ConnectError,
            Outcome::UpstreamError,
            Outcome::Timeout,
            Outcome::Status429,
            Outcome::Status5xx,
        ] {
            assert_eq!(next_step(&r, Risk::Read, o, ms(500)), Step::NextPool, "{o}");
        }
        // malformed_json is not in the default set.
        assert_eq!(
            next_step(&r, Risk::Read, Outcome::MalformedJson, None),
            Step::Stop(StopReason::NotRetried(Outcome::MalformedJson))
        );
    }

    #[test]
    fn fallback_off_stops_even_a_shed() {
        let r = route(false, &RetryOn::DEFAULT);
        assert_eq!(
            next_step(&r, Risk::Read, Outcome::QueueFull, None),
            Step::Stop(StopReason::FallbackOff)
        );
    }

    #[test]
    fn sheds_move_on_whatever_retry_on_and_risk() {
        let r = route(true, &[]);
        for o in [
            Outcome::QueueFull,
            Outcome::QueueTimeout,
            Outcome::NoBackend,
            Outcome::DeadlineExhausted,
        ] {
            assert_eq!(
                next_step(&r, Risk::Destructive, o, None),
                Step::NextPool,
                "{o}"
            );
        }
    }

    #[test]
    fn send_moves_on_only_when_the_backend_never_started() {
        let r = route(true, &RetryOn::DEFAULT);
        assert_eq!(
            next_step(&r, Risk::Send, Outcome::ConnectError, None),
            Step::NextPool
        );
        assert_eq!(
            next_step(&r, Risk::Send, Outcome::Status429, None),
            Step::NextPool
        );
        for o in [Outcome::Timeout, Outcome::Status5xx, Outcome::UpstreamError] {
            assert_eq!(
                next_step(&r, Risk::Send, o, None),
                Step::Stop(StopReason::MayHaveReached(Risk::Send)),
                "{o}"
            );
        }
    }

    proptest::proptest! {
        /// SEND and DESTRUCTIVE requests are never sent again (to the next
        /// pool, or to another endpoint of the same pool: the chain asks
        /// this rule for both) after a failure that may have reached a
        /// backend, whatever the route's settings and the time left.
        #[test]
        fn side_effects_are_never_retried_after_they_may_have_reached(
            outcome in proptest::sample::select(Outcome::ALL.to_vec()),
            destructive in proptest::bool::ANY,
            fallback in proptest::bool::ANY,
            retry_on in proptest::sample::subsequence(
                vec![RetryOn::ConnectError, RetryOn::Timeout, RetryOn::Status429,
                     RetryOn::Status5xx, RetryOn::MalformedJson], 0..=5),
            left_ms in proptest::option::of(0u64..10_000),
        ) {
            let risk = if destructive { Risk::Destructive } else { Risk::Send };
            let r = route(fallback, &retry_on);
            let step = next_step(&r, risk, outcome, left_ms.map(Duration::from_millis));
            if outcome.may_have_reached_backend() && !outcome.is_success() {
                proptest::prop_assert_ne!(step, Step::NextPool, "{}", outcome);
            }
        }
    }

    #[test]
    fn a_spent_deadline_stops_the_walk() {
        let r = route(true, &RetryOn::DEFAULT);
        assert_eq!(
            next_step(&r, Risk::Read, Outcome::Timeout, ms(0)),
            Step::Stop(StopReason::DeadlineSpent)
        );
        assert_eq!(
            next_step(&r, Risk::Read, Outcome::Timeout, ms(1)),
            Step::NextPool
        );
    }

    #[test]
    fn stop_reasons_read_as_sentences() {
        assert_eq!(
            StopReason::MayHaveReached(Risk::Send).to_string(),
            "a SEND request that may have reached its backend is not sent again"
        );
        assert_eq!(
            StopReason::NotRetried(Outcome::MalformedJson).to_string(),
            "malformed_json is not in the route's retry_on"
        );
    }
}
