//! The walk driven by a table of pools: scenarios first, then properties
//! over random routes, pools and attempt endings.

use std::cell::Cell;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::document::{Hedge, RetryOn};

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

fn route(chain: usize, fallback: bool) -> Route {
    let names = (0..chain).map(|i| format!("p{i}")).collect();
    Route::for_tests(names, fallback, &RetryOn::DEFAULT)
}

fn options(risk: Risk) -> WalkOptions {
    WalkOptions {
        risk,
        has_retry_budget: true,
        parks: false,
        may_park: false,
        default_attempt_timeout: DEFAULT_TIMEOUT,
    }
}

#[derive(Debug, Clone)]
struct Pool {
    exists: bool,
    readiness: Result<Ready, Availability>,
    endpoints: usize,
    timeout: Option<Duration>,
    other_ready: bool,
}

fn ready() -> Pool {
    Pool {
        exists: true,
        readiness: Ok(Ready {
            outlook: PoolOutlook {
                free_now: true,
                expected_wait: None,
                p95: None,
            },
            only_marked: false,
        }),
        endpoints: 1,
        timeout: None,
        other_ready: false,
    }
}

/// A table of pools and a retry budget (`None`: unlimited).
#[derive(Debug)]
struct Table {
    pools: Vec<Pool>,
    budget: Cell<Option<u32>>,
}

impl Table {
    fn new(pools: Vec<Pool>) -> Self {
        Self {
            pools,
            budget: Cell::new(None),
        }
    }
}

impl Pools for Table {
    fn exists(&self, at: usize) -> bool {
        self.pools.get(at).is_some_and(|p| p.exists)
    }
    fn readiness(&self, at: usize) -> Result<Ready, Availability> {
        self.pools[at].readiness
    }
    fn endpoint_count(&self, at: usize) -> usize {
        self.pools[at].endpoints
    }
    fn attempt_timeout(&self, at: usize) -> Option<Duration> {
        self.pools[at].timeout
    }
    fn other_endpoint_ready(&self, at: usize, tried: &[u64]) -> bool {
        self.pools[at].other_ready && tried.len() < self.pools[at].endpoints
    }
    fn draw_retry_budget(&self) -> bool {
        match self.budget.get() {
            None => true,
            Some(0) => false,
            Some(n) => {
                self.budget.set(Some(n - 1));
                true
            }
        }
    }
}

fn failed(outcome: Outcome, endpoint: u64) -> Ended {
    Ended {
        endpoint: Some(endpoint),
        ..Ended::plain(outcome)
    }
}

fn shed(outcome: Outcome) -> Ended {
    Ended::shed(outcome)
}

fn try_at(action: Action) -> usize {
    match action {
        Action::Try(p) => p.at,
        other => panic!("expected an attempt, got {other:?}"),
    }
}

#[test]
fn an_answer_ends_the_walk() {
    let r = route(2, true);
    let c = [0, 1];
    let t = Table::new(vec![ready(), ready()]);
    let mut w = Walk::new(&r, &c, options(Risk::Read));
    assert_eq!(try_at(w.start(&t, None)), 0);
    assert_eq!(w.ended(&t, Ended::plain(Outcome::Ok), None), Action::Answer);
    assert!(w.notes().is_empty());
}

#[test]
fn a_failure_falls_back_to_the_next_pool_after_a_signal() {
    let r = route(2, true);
    let c = [0, 1];
    let t = Table::new(vec![ready(), ready()]);
    let mut w = Walk::new(&r, &c, options(Risk::Read));
    w.start(&t, None);
    let a = w.ended(&t, failed(Outcome::Status5xx, 7), None);
    assert_eq!(
        a,
        Action::Signal(Signal::FellBack {
            from: 0,
            outcome: Outcome::Status5xx
        })
    );
    let plan = match w.resume(&t, None) {
        Action::Try(p) => p,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (plan.at, plan.first, plan.in_pool, plan.last_chance),
        (1, false, false, true)
    );
    assert_eq!(w.notes(), &[Note::Failed(0, Outcome::Status5xx)]);
}

#[test]
fn a_failure_is_retried_on_another_endpoint_of_the_pool_first() {
    let r = route(2, true);
    let c = [0, 1];
    let mut p = ready();
    p.endpoints = 2;
    p.other_ready = true;
    let t = Table::new(vec![p, ready()]);
    let mut w = Walk::new(&r, &c, options(Risk::Read));
    w.start(&t, None);
    match w.ended(&t, failed(Outcome::ConnectError, 3), None) {
        Action::Try(p) => assert!(p.at == 0 && p.in_pool && !p.first),
        other => panic!("{other:?}"),
    }
    assert_eq!(w.tried(), &[3]);
    assert_eq!(w.notes()[1], Note::RetriedInPool(0));
}

#[test]
fn a_spent_retry_budget_stops_the_walk_with_a_signal_and_a_note() {
    let r = route(2, true);
    let c = [0, 1];
    let t = Table::new(vec![ready(), ready()]);
    t.budget.set(Some(0));
    let mut w = Walk::new(&r, &c, options(Risk::Read));
    w.start(&t, None);
    assert_eq!(
        w.ended(&t, failed(Outcome::Status5xx, 1), None),
        Action::Signal(Signal::RetryBudgetExhausted { at: 0 })
    );
    assert_eq!(w.resume(&t, None), Action::End(WalkEnd::LastFailure));
    assert_eq!(
        w.notes().last(),
        Some(&Note::Stopped(StopReason::RetryBudgetExhausted))
    );
}

#[test]
fn a_shed_moves_on_without_drawing_on_the_budget() {
    let r = route(2, true);
    let c = [0, 1];
    let t = Table::new(vec![ready(), ready()]);
    t.budget.set(Some(0));
    let mut w = Walk::new(&r, &c, options(Risk::Send));
    w.start(&t, None);
    assert!(matches!(
        w.ended(&t, shed(Outcome::QueueFull), None),
        Action::Signal(Signal::FellBack { .. })
    ));
    assert_eq!(try_at(w.resume(&t, None)), 1);
}

#[test]
fn a_send_request_that_may_have_reached_is_not_sent_again_and_says_why() {
    let r = route(2, true);
    let c = [0, 1];
    let t = Table::new(vec![ready(), ready()]);
    let mut w = Walk::new(&r, &c, options(Risk::Send));
    w.start(&t, None);
    assert_eq!(
        w.ended(&t, failed(Outcome::Timeout, 1), None),
        Action::End(WalkEnd::LastFailure)
    );
    assert_eq!(
        w.notes().last(),
        Some(&Note::Stopped(StopReason::MayHaveReached(Risk::Send)))
    );
}

#[test]
fn pools_that_cannot_take_it_are_passed_over_with_their_reason() {
    let r = route(4, true);
    let c = [0, 1, 2, 3];
    let mut down = ready();
    down.readiness = Err(Availability::Drained);
    let mut absent = ready();
    absent.exists = false;
    let mut marked = ready();
    marked.readiness = Ok(Ready {
        only_marked: true,
        ..Ready::default()
    });
    let t = Table::new(vec![down, absent, marked, ready()]);
    let mut w = Walk::new(&r, &c, options(Risk::Read));
    assert_eq!(try_at(w.start(&t, None)), 3);
    assert_eq!(
        w.notes(),
        &[
            Note::Unavailable(0, Availability::Drained),
            Note::PassedOverMarked(2)
        ]
    );
}

#[test]
fn nothing_to_try_ends_no_backend_or_parks() {
    let r = route(1, true);
    let c = [0];
    let mut down = ready();
    down.readiness = Err(Availability::Unhealthy);
    let t = Table::new(vec![down]);
    let mut w = Walk::new(&r, &c, options(Risk::Send));
    assert_eq!(w.start(&t, None), Action::End(WalkEnd::NoBackend));
    let parks = WalkOptions {
        parks: true,
        may_park: true,
        ..options(Risk::Send)
    };
    let mut w = Walk::new(&r, &c, parks);
    assert_eq!(w.start(&t, None), Action::End(WalkEnd::Park));
}

#[test]
fn a_refused_connection_parks_but_a_timeout_does_not() {
    let r = route(1, true);
    let c = [0];
    let t = Table::new(vec![ready()]);
    let parks = WalkOptions {
        parks: true,
        may_park: true,
        ..options(Risk::Send)
    };
    let mut w = Walk::new(&r, &c, parks);
    w.start(&t, None);
    assert!(matches!(
        w.ended(&t, failed(Outcome::ConnectError, 1), None),
        Action::Signal(Signal::FellBack { .. })
    ));
    assert_eq!(w.resume(&t, None), Action::End(WalkEnd::Park));
    let mut w = Walk::new(&r, &c, parks);
    w.start(&t, None);
    assert_eq!(
        w.ended(&t, failed(Outcome::Timeout, 1), None),
        Action::End(WalkEnd::LastFailure)
    );
}

#[test]
fn endings_in_their_order_of_preference() {
    let base = Ending {
        past_deadline: false,
        held: false,
        last_failure: None,
        skipped_for_time: false,
        parks: false,
        reached: false,
    };
    let with = |f: fn(&mut Ending)| {
        let mut e = base;
        f(&mut e);
        ending(e)
    };
    assert_eq!(ending(base), WalkEnd::NoBackend);
    assert_eq!(
        with(|e| {
            e.past_deadline = true;
            e.held = true;
        }),
        WalkEnd::DeadlineExhausted
    );
    assert_eq!(
        with(|e| {
            e.held = true;
            e.last_failure = Some((Outcome::Timeout, false));
        }),
        WalkEnd::PassOnFailureAnswer
    );
    assert_eq!(
        with(|e| {
            e.last_failure = Some((Outcome::QueueFull, true));
            e.skipped_for_time = true;
        }),
        WalkEnd::LastFailure
    );
    assert_eq!(with(|e| e.skipped_for_time = true), WalkEnd::SkippedForTime);
    assert_eq!(
        with(|e| {
            e.parks = true;
            e.last_failure = Some((Outcome::NoBackend, true));
        }),
        WalkEnd::Park
    );
    assert_eq!(
        with(|e| {
            e.parks = true;
            e.reached = true;
        }),
        WalkEnd::NoBackend
    );
    assert_eq!(
        with(|e| {
            e.parks = true;
            e.last_failure = Some((Outcome::QueueTimeout, true));
        }),
        WalkEnd::LastFailure
    );
}

#[test]
fn the_hedge_is_planned_for_the_first_attempt_of_a_read_request_only() {
    let mut r = route(2, true);
    r.hedge = Some(Hedge {
        after: HedgeDelay::Fixed(Duration::from_millis(50)),
        to: HedgeTarget::NextPool,
    });
    let c = [0, 1];
    let t = Table::new(vec![ready(), ready()]);
    let mut w = Walk::new(&r, &c, options(Risk::Read));
    match w.start(&t, None) {
        Action::Try(p) => assert_eq!(
            p.hedge,
            Some(HedgePlan {
                after: Duration::from_millis(50),
                to: 1,
                same_pool: false
            })
        ),
        other => panic!("{other:?}"),
    }
    // The hedge went to pool 1: the walk does not try it again.
    let end = Ended {
        hedged_into: Some(1),
        ..failed(Outcome::Status5xx, 1)
    };
    assert!(matches!(w.ended(&t, end, None), Action::Signal(_)));
    assert_eq!(w.resume(&t, None), Action::End(WalkEnd::LastFailure));
    assert_eq!(w.notes().last(), Some(&Note::TriedAsHedge(1)));
    for risk in [Risk::Send, Risk::Destructive] {
        let mut w = Walk::new(&r, &c, options(risk));
        assert!(matches!(w.start(&t, None), Action::Try(p) if p.hedge.is_none()));
    }
    let no_budget = WalkOptions {
        has_retry_budget: false,
        ..options(Risk::Read)
    };
    let mut w = Walk::new(&r, &c, no_budget);
    assert!(matches!(w.start(&t, None), Action::Try(p) if p.hedge.is_none()));
}

#[test]
fn notes_read_as_the_route_log_writes_them() {
    let names = ["fast", "slow"];
    let name = |at: usize| names[at];
    let cases = [
        (Note::TriedAsHedge(1), "slow: tried as the hedge"),
        (Note::Unavailable(0, Availability::Drained), "fast: drained"),
        (Note::Failed(0, Outcome::Status5xx), "fast: status_5xx"),
        (Note::Shed(1, Outcome::QueueFull), "slow: queue_full"),
        (Note::RetriedInPool(0), "fast: retried on another endpoint"),
        (
            Note::Stopped(StopReason::FallbackOff),
            "stopped: fallback is off for this route",
        ),
        (
            Note::SkippedForTime(1, SkipReason::BusyUnmeasured),
            "slow: skipped, busy and not yet measured; trying the next pool",
        ),
    ];
    for (note, text) in cases {
        assert_eq!(note.render(name).to_string(), text);
    }
}

// --- Properties over random walks ---------------------------------------

/// A random route, its pools, the request's risk and the attempts' endings.
#[derive(Debug, Clone)]
struct Case {
    fallback: bool,
    retry_on: Vec<RetryOn>,
    hedge: bool,
    risk: Risk,
    pools: Vec<Pool>,
    budget: Option<u32>,
    parks: bool,
    /// Endings to report, in order (cycled).
    endings: Vec<(Outcome, bool, bool)>,
    /// Time left at each report, in ms (cycled; `None`: no deadline).
    times: Vec<Option<u64>>,
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop::sample::select(vec![
        Outcome::Ok,
        Outcome::ConnectError,
        Outcome::UpstreamError,
        Outcome::Timeout,
        Outcome::Status429,
        Outcome::Status5xx,
        Outcome::MalformedJson,
        Outcome::FirstTokenTimeout,
        Outcome::StreamError,
        Outcome::InvalidRequest,
        Outcome::QueueFull,
        Outcome::QueueTimeout,
        Outcome::NoBackend,
        Outcome::DeadlineExhausted,
    ])
}

fn pool() -> impl Strategy<Value = Pool> {
    (
        any::<bool>(),
        0u8..5,
        1usize..4,
        prop::option::of(1u64..500),
        any::<bool>(),
        prop::option::of(1u64..300),
        any::<bool>(),
    )
        .prop_map(
            |(exists, state, endpoints, timeout, other_ready, p95, free)| Pool {
                exists: exists || state == 0,
                readiness: match state {
                    1 => Err(Availability::Unhealthy),
                    2 => Err(Availability::Drained),
                    s => Ok(Ready {
                        outlook: PoolOutlook {
                            free_now: free,
                            expected_wait: p95.map(Duration::from_millis),
                            p95: p95.map(Duration::from_millis),
                        },
                        only_marked: s == 4,
                    }),
                },
                endpoints,
                timeout: timeout.map(Duration::from_millis),
                other_ready,
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        prop::sample::subsequence(RetryOn::DEFAULT.to_vec(), 0..=4),
        any::<bool>(),
        prop::sample::select(vec![Risk::Read, Risk::Draft, Risk::Send, Risk::Destructive]),
        prop::collection::vec(pool(), 1..5),
        prop::option::of(0u32..3),
        any::<bool>(),
        prop::collection::vec((outcome(), any::<bool>(), any::<bool>()), 1..12),
        prop::collection::vec(prop::option::of(0u64..400), 1..8),
    )
        .prop_map(
            |(fallback, retry_on, hedge, risk, pools, budget, parks, endings, times)| Case {
                fallback,
                retry_on,
                hedge,
                risk,
                pools,
                budget,
                parks,
                endings,
                times,
            },
        )
}

/// One step of a walk as the proxy saw it.
#[derive(Debug)]
enum Seen {
    Tried(TryPlan, Option<Duration>),
    Reported(Ended, Option<Duration>),
    Final(Action),
}

/// Drives a walk over `case` to its end; panics if it does not end in
/// a bounded number of steps.
fn drive(case: &Case) -> Vec<Seen> {
    let mut r = route(case.pools.len(), case.fallback);
    r.retry_on = case.retry_on.clone();
    if case.hedge {
        r.hedge = Some(Hedge {
            after: HedgeDelay::Fixed(Duration::from_millis(10)),
            to: HedgeTarget::SamePool,
        });
    }
    let candidates: Vec<usize> = (0..case.pools.len()).collect();
    let table = Table::new(case.pools.clone());
    table.budget.set(case.budget);
    let opts = WalkOptions {
        parks: case.parks,
        may_park: case.parks,
        ..options(case.risk)
    };
    let mut walk = Walk::new(&r, &candidates, opts);
    let time = |i: usize| case.times[i % case.times.len()].map(Duration::from_millis);
    let mut seen = Vec::new();
    let mut step = 0usize;
    let mut action = walk.start(&table, time(0));
    // Every pool, each endpoint once, each with a signal: far above any walk.
    let bound = 4 + case.pools.len() * 10;
    loop {
        step += 1;
        assert!(step < bound, "the walk did not end: {seen:?}");
        let left = time(step);
        action = match action {
            Action::Try(plan) => {
                seen.push(Seen::Tried(plan, time(step - 1)));
                let (outcome, shed_it, held) = case.endings[step % case.endings.len()];
                let end = if shed_it && outcome.is_shed() {
                    shed(outcome)
                } else {
                    Ended {
                        held: held && !outcome.is_success(),
                        ..failed(outcome, step as u64)
                    }
                };
                seen.push(Seen::Reported(end, left));
                walk.ended(&table, end, left)
            }
            Action::Signal(_) => walk.resume(&table, left),
            end @ (Action::Answer | Action::End(_)) => {
                seen.push(Seen::Final(end));
                return seen;
            }
        };
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// A SEND or DESTRUCTIVE request that may have reached a backend is
    /// never sent again: not by a hedge, a retry in the pool or the next
    /// pool.
    #[test]
    fn side_effects_are_sent_at_most_once_after_they_may_have_reached(case in case()) {
        let seen = drive(&case);
        let mut reached = false;
        for s in &seen {
            match s {
                Seen::Tried(plan, _) => {
                    if case.risk.has_side_effects() {
                        prop_assert!(!reached, "sent again after it may have reached: {seen:?}");
                        prop_assert!(plan.hedge.is_none());
                    }
                }
                Seen::Reported(end, _) => reached |= end.outcome.may_have_reached_backend(),
                Seen::Final(_) => {}
            }
        }
    }

    /// No attempt starts once the deadline is spent, and none is planned
    /// to run past it.
    #[test]
    fn no_walk_outlives_its_deadline(case in case()) {
        let seen = drive(&case);
        for s in &seen {
            if let Seen::Tried(plan, Some(left)) = s {
                prop_assert!(!left.is_zero(), "tried with no time left: {seen:?}");
                prop_assert!(plan.timeout <= *left, "planned past the deadline: {seen:?}");
            }
        }
        // A walk that ends after its deadline ends as deadline_exhausted.
        if let (Some(Seen::Reported(_, Some(left))), Some(Seen::Final(Action::End(end)))) =
            (seen.iter().rev().nth(1), seen.last())
        {
            if left.is_zero() {
                prop_assert_eq!(*end, WalkEnd::DeadlineExhausted);
            }
        }
    }

    /// Every walk ends, once, in an answer exactly when an attempt
    /// succeeded; an ended walk stays ended.
    #[test]
    fn every_walk_ends_in_exactly_one_answer(case in case()) {
        let seen = drive(&case);
        let finals = seen.iter().filter(|s| matches!(s, Seen::Final(_))).count();
        prop_assert_eq!(finals, 1);
        let answered = seen
            .iter()
            .any(|s| matches!(s, Seen::Reported(e, _) if e.outcome.is_success()));
        prop_assert_eq!(matches!(seen.last(), Some(Seen::Final(Action::Answer))), answered);
        // A success is always the last report.
        if answered {
            prop_assert!(matches!(seen.iter().rev().nth(1), Some(Seen::Reported(e, _)) if e.outcome.is_success()));
        }
    }
}

#[test]
fn an_ended_walk_stays_ended() {
    let r = route(1, true);
    let c = [0];
    let t = Table::new(vec![ready()]);
    let mut w = Walk::new(&r, &c, options(Risk::Read));
    w.start(&t, None);
    let mut action = w.ended(&t, failed(Outcome::Status5xx, 1), None);
    if let Action::Signal(_) = action {
        action = w.resume(&t, None);
    }
    assert_eq!(action, Action::End(WalkEnd::LastFailure));
    assert!(matches!(
        w.ended(&t, Ended::plain(Outcome::Ok), None),
        Action::End(_)
    ));
    assert!(matches!(w.resume(&t, None), Action::End(_)));
}
