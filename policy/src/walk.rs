//! The request's walk along its route's chain, as a pure state machine.
//!
//! A request that passed its gates walks the candidate pools of its route
//! in order, inside its deadline. Every decision on that walk is made
//! here; the proxy only carries them out (sends, waits, answers) and
//! reports back what happened. The exchange is:
//!
//! ```text
//!   proxy                                   Walk
//!   ─────                                   ────
//!   Walk::new(route, risk, candidates, ..)
//!   walk.start(&pools, time_left)      ──▶  first pool that can take it
//!                                      ◀──  Action::Try(plan)  (or End)
//!   runs the attempt (hedged if the plan says)
//!   walk.ended(&pools, end, time_left) ──▶  next_step, in-pool retry,
//!                                           retry budget, next pool
//!                                      ◀──  Action::Answer | Try | Signal | End
//!   Action::Signal(s): logs/metrics it,
//!   walk.resume(&pools, time_left)     ──▶  what the signal held back
//! ```
//!
//! The rules, each in one place:
//!
//! - **Which pool** (`Walk::advance`): a pool that is absent, already
//!   tried as the hedge, unavailable ([`Availability`]), entirely suspect
//!   with a clean pool later ([`crate::health::pass_over_marked_pool`]), or
//!   that cannot answer in the time left ([`crate::deadline::plan_attempt`])
//!   is passed over with a [`Note`]; the first other one is tried with the
//!   plan's timeout (the process default when neither deadline nor
//!   configuration bounds it: a silent backend never holds a request
//!   forever).
//! - **Hedge** ([`HedgePlan`]): only on the walk's first attempt, only for
//!   READ and DRAFT requests, only on a route with a retry budget; the
//!   second attempt's delay is fixed or the pool's p95, its target the same
//!   pool or the next ready one. Starting it draws on the budget as a
//!   retry does (the proxy draws when the delay has passed without a first
//!   token; a refusal leaves the first attempt alone).
//! - **After a failure** ([`Walk::ended`]): [`crate::fallback::next_step`]
//!   says stop or move on; moving on first retries inside the pool (another
//!   endpoint ready at once, time left, not after a hedge), and any extra
//!   attempt after one that may have reached a backend draws on the
//!   route's retry budget, whose refusal ends the walk.
//! - **How it ends** ([`WalkEnd`]): past the deadline, `deadline_exhausted`
//!   whatever else; else a backend's failure answer is passed on as it came;
//!   else the last failure; else `deadline_exhausted` when pools were
//!   skipped for time; else `no_backend`. A route that parks parks instead
//!   of a `no_backend` or connect failure when nothing reached a backend.
//!
//! The walk never reads a clock or a pool itself: the proxy passes the
//! time left and a [`Pools`] view of the live state, so the whole walk is
//! driven in tests by a table (see the property tests below: a request
//! with side effects that may have reached a backend is never sent again;
//! no walk outlives its deadline; every walk ends exactly once).

use std::fmt;
use std::time::Duration;

use crate::deadline::{plan_attempt, AttemptPlan, Budget, PoolOutlook, SkipReason};
use crate::document::{HedgeDelay, HedgeTarget, Risk, Route};
use crate::fallback::{next_step, Step, StopReason};
use crate::outcome::Outcome;

/// Whether a pool can take a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// At least one endpoint can take requests (now or after queueing).
    Ready,
    /// No endpoints configured.
    NoEndpoints,
    /// Every endpoint (or the pool) is drained.
    Drained,
    /// Every endpoint that is not drained has an open circuit, a failing
    /// (or stale) capacity probe, or failing (or no passing yet) health
    /// checks.
    Unhealthy,
}

impl Availability {
    /// A label: `ready`, `no_endpoints`, `drained`, `unhealthy`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::NoEndpoints => "no_endpoints",
            Self::Drained => "drained",
            Self::Unhealthy => "unhealthy",
        }
    }

    /// Text for the route log's reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::NoEndpoints => "no endpoints",
            Self::Drained => "drained",
            Self::Unhealthy => {
                "unhealthy (circuits open, capacity probes or health checks failing)"
            }
        }
    }
}

/// A pool that can take the request: its outlook, and whether every
/// endpoint that could take it carries a soft mark (suspect or ejected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ready {
    /// Free now, expected wait, p95.
    pub outlook: PoolOutlook,
    /// Every endpoint that could take it is suspect or ejected.
    pub only_marked: bool,
}

/// What the walk reads of the live pools when it decides. Positions are
/// indices into the route's chain. The proxy answers from its pool state;
/// tests from a table.
pub trait Pools {
    /// Whether the route's chain position `at` names a pool this proxy has.
    fn exists(&self, at: usize) -> bool;
    /// Whether that pool can take a request now.
    fn readiness(&self, at: usize) -> Result<Ready, Availability>;
    /// The pool's configured endpoints.
    fn endpoint_count(&self, at: usize) -> usize;
    /// The pool's own attempt timeout, if it sets one (else the route's).
    fn attempt_timeout(&self, at: usize) -> Option<Duration>;
    /// Whether an endpoint none of `tried` is ready at once (a retry
    /// inside the pool never queues).
    fn other_endpoint_ready(&self, at: usize, tried: &[u64]) -> bool;
    /// Draws one extra attempt from the route's retry budget: false when
    /// it has no room (always true on a route without one).
    fn draw_retry_budget(&self) -> bool;
}

/// A second attempt to start if the first has no first token by `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgePlan {
    /// Delay before the second attempt.
    pub after: Duration,
    /// Its pool (a chain position).
    pub to: usize,
    /// `to` is the first attempt's own pool: another endpoint of it.
    pub same_pool: bool,
}

/// An attempt to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TryPlan {
    /// The pool (a chain position).
    pub at: usize,
    /// The attempt's timeout, never past the request's deadline.
    pub timeout: Duration,
    /// The walk's first attempt.
    pub first: bool,
    /// A retry on another endpoint of the same pool (avoid
    /// [`Walk::tried`]; never queue).
    pub in_pool: bool,
    /// The last attempt there can be: the client's headers may be moved
    /// into it rather than copied.
    pub last_chance: bool,
    /// Hedge it so.
    pub hedge: Option<HedgePlan>,
}

/// How an attempt ended, as the walk needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The attempt's outcome (the winner's, for a hedged attempt).
    pub outcome: Outcome,
    /// The pool refused it without sending (a shed).
    pub shed: bool,
    /// A backend's failure answer is held, to be passed on if nothing
    /// else answers.
    pub held: bool,
    /// The endpoint that failed (for a retry inside the pool).
    pub endpoint: Option<u64>,
    /// This attempt, or its hedge, may have reached a backend.
    pub reached: bool,
    /// A hedge went to another pool (a chain position), which the walk
    /// then does not try again.
    pub hedged_into: Option<usize>,
}

impl Ended {
    /// A pool that refused the request without sending it (a shed): it
    /// reached no backend.
    pub fn shed(outcome: Outcome) -> Self {
        Self {
            shed: true,
            reached: false,
            ..Self::plain(outcome)
        }
    }

    /// An attempt that ended with `outcome` and nothing more to say: not
    /// a shed, nothing held, no hedge.
    pub fn plain(outcome: Outcome) -> Self {
        Self {
            outcome,
            shed: false,
            held: false,
            endpoint: None,
            reached: outcome.may_have_reached_backend(),
            hedged_into: None,
        }
    }
}

/// Something the proxy logs, counts or traces on the way, with no
/// decision left in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The walk leaves pool `from` after `outcome` for a later one.
    FellBack {
        /// The pool left.
        from: usize,
        /// Why.
        outcome: Outcome,
    },
    /// The retry budget refused an extra attempt on pool `at`.
    RetryBudgetExhausted {
        /// The pool.
        at: usize,
    },
}

/// What the proxy does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Make this attempt, then report with [`Walk::ended`].
    Try(TryPlan),
    /// Carry out the signal, then call [`Walk::resume`].
    Signal(Signal),
    /// Pass the attempt's answer on. The walk is over.
    Answer,
    /// Nothing answered: end so. The walk is over.
    End(WalkEnd),
}

/// How a walk that no pool answered ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkEnd {
    /// The deadline has passed: `deadline_exhausted`, whatever else.
    DeadlineExhausted,
    /// Pass on the failure answer a backend gave (a 503, a 429...).
    PassOnFailureAnswer,
    /// The last failure the router saw (a shed, a timeout, a broken
    /// connection), as its own error.
    LastFailure,
    /// Pools were skipped for time and none was tried:
    /// `deadline_exhausted`.
    SkippedForTime,
    /// No pool could take it: `no_backend`.
    NoBackend,
    /// A route that parks, every pool down and nothing reached a backend:
    /// park it as a task.
    Park,
}

/// One thing that happened on the walk, for the route log's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// The pool was already tried as the hedge.
    TriedAsHedge(usize),
    /// Every endpoint suspect or ejected, and a later pool is clean.
    PassedOverMarked(usize),
    /// The pool cannot take anything now.
    Unavailable(usize, Availability),
    /// The pool cannot answer in the time left.
    SkippedForTime(usize, SkipReason),
    /// An attempt on the pool failed so.
    Failed(usize, Outcome),
    /// The pool refused it without sending.
    Shed(usize, Outcome),
    /// Retried on another endpoint of the pool.
    RetriedInPool(usize),
    /// The walk stopped here, for this reason.
    Stopped(StopReason),
}

/// A [`Note`] as labels, for the route log's structured `walk` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoteFields {
    /// What happened: `failed`, `shed`, `retried_in_pool`, `unavailable`,
    /// `skipped_for_time`, `passed_over_marked`, `tried_as_hedge`,
    /// `stopped`.
    pub note: &'static str,
    /// The pool (a chain position), when the note is about one.
    pub at: Option<usize>,
    /// The attempt's outcome, or the failure a route does not retry.
    pub outcome: Option<Outcome>,
    /// Why: the pool's unavailability, the skip, or the stop.
    pub why: Option<&'static str>,
}

impl Note {
    /// The note's labels (see [`NoteFields`]).
    pub fn fields(&self) -> NoteFields {
        let f = |note, at, outcome, why| NoteFields {
            note,
            at,
            outcome,
            why,
        };
        match *self {
            Self::TriedAsHedge(at) => f("tried_as_hedge", Some(at), None, None),
            Self::PassedOverMarked(at) => f("passed_over_marked", Some(at), None, None),
            Self::Unavailable(at, a) => f("unavailable", Some(at), None, Some(a.label())),
            Self::SkippedForTime(at, why) => {
                f("skipped_for_time", Some(at), None, Some(why.label()))
            }
            Self::Failed(at, o) => f("failed", Some(at), Some(o), None),
            Self::Shed(at, o) => f("shed", Some(at), Some(o), None),
            Self::RetriedInPool(at) => f("retried_in_pool", Some(at), None, None),
            Self::Stopped(why) => {
                let outcome = match why {
                    StopReason::NotRetried(o) => Some(o),
                    _ => None,
                };
                f("stopped", None, outcome, Some(why.label()))
            }
        }
    }

    /// The note as the route log's reason writes it, with the chain
    /// position's pool name from `name`.
    pub fn render<'a>(&self, name: impl Fn(usize) -> &'a str) -> NoteText<'a> {
        NoteText {
            note: *self,
            pool: match self {
                Self::Stopped(_) => "",
                Self::TriedAsHedge(at)
                | Self::PassedOverMarked(at)
                | Self::Unavailable(at, _)
                | Self::SkippedForTime(at, _)
                | Self::Failed(at, _)
                | Self::Shed(at, _)
                | Self::RetriedInPool(at) => name(*at),
            },
        }
    }
}

/// A [`Note`] with its pool's name, ready to display.
pub struct NoteText<'a> {
    note: Note,
    pool: &'a str,
}

impl fmt::Display for NoteText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.pool;
        match self.note {
            Note::TriedAsHedge(_) => write!(f, "{p}: tried as the hedge"),
            Note::PassedOverMarked(_) => write!(
                f,
                "{p}: skipped, every endpoint suspect or ejected and a later pool is clean"
            ),
            Note::Unavailable(_, a) => write!(f, "{p}: {}", a.as_str()),
            Note::SkippedForTime(_, why) => write!(f, "{p}: skipped, {why}"),
            Note::Failed(_, o) | Note::Shed(_, o) => write!(f, "{p}: {o}"),
            Note::RetriedInPool(_) => write!(f, "{p}: retried on another endpoint"),
            Note::Stopped(why) => write!(f, "stopped: {why}"),
        }
    }
}

/// What the walk is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not started.
    New,
    /// An attempt on the chain's candidate `cursor` is out.
    Trying,
    /// A signal is out; then this.
    Signalled(Then),
    /// Answered or ended.
    Done,
}

/// What follows a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// On to the next pool.
    NextPool,
    /// The walk ends.
    End,
}

/// How the walk is configured for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkOptions {
    /// The request's risk.
    pub risk: Risk,
    /// The route has a retry budget (hedges need one).
    pub has_retry_budget: bool,
    /// The route parks when every pool is down.
    pub parks: bool,
    /// This request may be parked (its route parks and it is not a parked
    /// task's own run): its headers are kept for the task.
    pub may_park: bool,
    /// The bound on an attempt that neither the deadline nor the policy
    /// bounds.
    pub default_attempt_timeout: Duration,
}

/// One request's walk. See the module docs.
#[derive(Debug)]
pub struct Walk<'r> {
    route: &'r Route,
    options: WalkOptions,
    /// The decision's candidates: chain positions, in order.
    candidates: &'r [usize],
    /// Index into `candidates` of the pool being tried (or last looked at).
    cursor: usize,
    state: State,
    /// The current pool's timeout.
    timeout: Duration,
    /// Endpoints of the current pool that failed.
    tried: Vec<u64>,
    attempts: u32,
    hedged_into: Option<usize>,
    hedging: bool,
    time_skips: u32,
    /// The last failure that is the router's own error (not a held
    /// answer): its outcome and whether it was a shed.
    last_failure: Option<(Outcome, bool)>,
    held: bool,
    reached: bool,
    notes: Vec<Note>,
}

impl<'r> Walk<'r> {
    /// A walk over `candidates` (chain positions of `route`, in order).
    pub fn new(route: &'r Route, candidates: &'r [usize], options: WalkOptions) -> Self {
        Self {
            route,
            options,
            candidates,
            cursor: 0,
            state: State::New,
            timeout: options.default_attempt_timeout,
            tried: Vec::new(),
            attempts: 0,
            hedged_into: None,
            hedging: false,
            time_skips: 0,
            last_failure: None,
            held: false,
            reached: false,
            notes: Vec::new(),
        }
    }

    /// The first action: the first pool that can take the request, or the
    /// end when none can.
    pub fn start(&mut self, pools: &impl Pools, time_left: Option<Duration>) -> Action {
        debug_assert_eq!(self.state, State::New);
        self.cursor = 0;
        self.advance(pools, time_left)
    }

    /// What follows the attempt that just ended (`time_left`: read after it).
    pub fn ended(&mut self, pools: &impl Pools, end: Ended, time_left: Option<Duration>) -> Action {
        if self.state != State::Trying {
            return self.finish(time_left);
        }
        if end.hedged_into.is_some() {
            self.hedged_into = end.hedged_into;
        }
        self.reached |= end.reached;
        if end.outcome.is_success() {
            self.state = State::Done;
            return Action::Answer;
        }
        let at = self.current();
        self.held = end.held;
        if !end.held {
            self.last_failure = Some((end.outcome, end.shed));
        }
        self.notes.push(if end.shed {
            Note::Shed(at, end.outcome)
        } else {
            Note::Failed(at, end.outcome)
        });
        let later = self.later_exists(pools);
        match next_step(self.route, self.options.risk, end.outcome, time_left) {
            Step::NextPool => {
                let in_pool = !end.shed && !self.hedging && {
                    match end.endpoint {
                        Some(id) => {
                            self.tried.push(id);
                            time_left.is_none_or(|t| !t.is_zero())
                                && pools.other_endpoint_ready(at, &self.tried)
                        }
                        None => false,
                    }
                };
                // An extra attempt after one that may have cost a backend
                // work draws on the route's budget; after a shed it does not.
                if (in_pool || later)
                    && end.outcome.may_have_reached_backend()
                    && !pools.draw_retry_budget()
                {
                    self.notes
                        .push(Note::Stopped(StopReason::RetryBudgetExhausted));
                    self.state = State::Signalled(Then::End);
                    return Action::Signal(Signal::RetryBudgetExhausted { at });
                }
                if in_pool {
                    self.notes.push(Note::RetriedInPool(at));
                    return self.try_here(pools, true, None, time_left);
                }
                self.state = State::Signalled(Then::NextPool);
                Action::Signal(Signal::FellBack {
                    from: at,
                    outcome: end.outcome,
                })
            }
            Step::Stop(why) => {
                // Said unless it is plain (nothing after, or fallback off).
                if later && self.route.fallback {
                    self.notes.push(Note::Stopped(why));
                }
                self.finish(time_left)
            }
            // A failed attempt is never an answer.
            Step::Answer => self.finish(time_left),
        }
    }

    /// What the signal last returned held back.
    pub fn resume(&mut self, pools: &impl Pools, time_left: Option<Duration>) -> Action {
        match self.state {
            State::Signalled(Then::NextPool) => {
                self.cursor += 1;
                self.advance(pools, time_left)
            }
            _ => self.finish(time_left),
        }
    }

    /// The endpoints of the current pool that failed (a retry avoids them).
    pub fn tried(&self) -> &[u64] {
        &self.tried
    }

    /// What happened on the walk, in order.
    pub fn notes(&self) -> &[Note] {
        &self.notes
    }

    /// The chain position of the pool being tried.
    fn current(&self) -> usize {
        self.candidates
            .get(self.cursor)
            .copied()
            .unwrap_or(usize::MAX)
    }

    /// Candidates after the current one that name a pool.
    fn later<'p, P: Pools>(&self, pools: &'p P) -> impl Iterator<Item = usize> + 'p
    where
        'r: 'p,
    {
        let rest = self.candidates.get(self.cursor + 1..).unwrap_or(&[]);
        rest.iter().copied().filter(move |at| pools.exists(*at))
    }

    fn later_exists(&self, pools: &impl Pools) -> bool {
        self.later(pools).next().is_some()
    }

    /// From the candidate at `cursor` on: the first pool to try, or the end.
    fn advance(&mut self, pools: &impl Pools, time_left: Option<Duration>) -> Action {
        while let Some(&at) = self.candidates.get(self.cursor) {
            if let Some(action) = self.consider(pools, at, time_left) {
                return action;
            }
            self.cursor += 1;
        }
        self.finish(time_left)
    }

    /// The pool at `at`: an attempt, or `None` (passed over, noted).
    fn consider(
        &mut self,
        pools: &impl Pools,
        at: usize,
        time_left: Option<Duration>,
    ) -> Option<Action> {
        if !pools.exists(at) {
            return None;
        }
        if self.hedged_into == Some(at) {
            self.notes.push(Note::TriedAsHedge(at));
            return None;
        }
        let ready = match pools.readiness(at) {
            Ok(r) => r,
            Err(a) => {
                self.notes.push(Note::Unavailable(at, a));
                return None;
            }
        };
        let fallback = self.route.fallback;
        if ready.only_marked {
            let clean_later = || {
                self.later(pools)
                    .any(|p| matches!(pools.readiness(p), Ok(r) if !r.only_marked))
            };
            if crate::health::pass_over_marked_pool(true, fallback, clean_later()) {
                self.notes.push(Note::PassedOverMarked(at));
                return None;
            }
        }
        // The next pool that could take the request if this one fails.
        let next = if fallback {
            self.later(pools)
                .find_map(|p| pools.readiness(p).ok().map(|r| r.outlook))
        } else {
            None
        };
        let budget = Budget {
            remaining: time_left,
            attempt_timeout: pools.attempt_timeout(at).or(self.route.attempt_timeout),
            next_p95: next.and_then(|o| o.p95),
            last_candidate: next.is_none(),
        };
        match plan_attempt(budget, ready.outlook) {
            AttemptPlan::Skip(why) => {
                self.time_skips += 1;
                self.notes.push(Note::SkippedForTime(at, why));
                None
            }
            AttemptPlan::Try { timeout } => {
                self.timeout = timeout.unwrap_or(self.options.default_attempt_timeout);
                self.tried.clear();
                Some(self.try_here(pools, false, Some(ready.outlook), time_left))
            }
        }
    }

    /// An attempt on the current pool.
    fn try_here(
        &mut self,
        pools: &impl Pools,
        in_pool: bool,
        outlook: Option<PoolOutlook>,
        time_left: Option<Duration>,
    ) -> Action {
        let at = self.current();
        self.attempts += 1;
        self.held = false;
        self.state = State::Trying;
        let first = self.attempts == 1;
        let more_in_pool = pools.endpoint_count(at) > self.tried.len() + 1;
        let last_chance = (!self.route.fallback || !self.later_exists(pools))
            && !more_in_pool
            && !self.options.may_park;
        let hedge = if first {
            self.hedge_plan(pools, at, outlook)
        } else {
            None
        };
        self.hedging = hedge.is_some();
        // A retry inside the pool has what is left, not the first's share.
        let timeout = time_left.map_or(self.timeout, |t| t.min(self.timeout));
        Action::Try(TryPlan {
            at,
            timeout,
            first,
            in_pool,
            last_chance,
            hedge,
        })
    }

    /// The hedge of the walk's first attempt, on `at`: READ and DRAFT
    /// only, on a route that hedges and has a retry budget.
    fn hedge_plan(
        &self,
        pools: &impl Pools,
        at: usize,
        outlook: Option<PoolOutlook>,
    ) -> Option<HedgePlan> {
        let h = self.route.hedge?;
        if !self.options.has_retry_budget || self.options.risk.has_side_effects() {
            return None;
        }
        let after = match h.after {
            HedgeDelay::Fixed(d) => Some(d),
            HedgeDelay::PoolP95 => outlook.and_then(|o| o.p95),
        }?;
        let to = match h.to {
            HedgeTarget::SamePool => Some(at),
            HedgeTarget::NextPool => self.later(pools).find(|p| pools.readiness(*p).is_ok()),
        }?;
        Some(HedgePlan {
            after,
            to,
            same_pool: h.to == HedgeTarget::SamePool,
        })
    }

    /// No pool answered: how the walk ends.
    fn finish(&mut self, time_left: Option<Duration>) -> Action {
        self.state = State::Done;
        let past_deadline = time_left.is_some_and(|t| t.is_zero());
        Action::End(ending(Ending {
            past_deadline,
            held: self.held,
            last_failure: self.last_failure,
            skipped_for_time: self.time_skips > 0,
            parks: self.options.parks,
            reached: self.reached,
        }))
    }
}

/// What [`ending`] decides from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ending {
    past_deadline: bool,
    held: bool,
    last_failure: Option<(Outcome, bool)>,
    skipped_for_time: bool,
    parks: bool,
    reached: bool,
}

/// Which answer a walk that no pool answered gets (see the module docs).
fn ending(e: Ending) -> WalkEnd {
    if e.past_deadline {
        return WalkEnd::DeadlineExhausted;
    }
    if e.held {
        return WalkEnd::PassOnFailureAnswer;
    }
    let end = match e.last_failure {
        Some(_) => WalkEnd::LastFailure,
        None if e.skipped_for_time => return WalkEnd::SkippedForTime,
        None => WalkEnd::NoBackend,
    };
    // Safe mode: every pool down (none could take it, or each refused the
    // connection), so nothing reached a backend.
    let down = match e.last_failure {
        None => true,
        Some((o, shed)) => parkable(o, shed),
    };
    if e.parks && down && !e.reached {
        return WalkEnd::Park;
    }
    end
}

/// Whether a failure says "down" (`no_backend`, or a backend failure that
/// is not a timeout), the failures a parking route parks on.
fn parkable(outcome: Outcome, shed: bool) -> bool {
    if shed {
        outcome == Outcome::NoBackend
    } else {
        outcome != Outcome::Timeout
    }
}

#[cfg(test)]
mod tests;
