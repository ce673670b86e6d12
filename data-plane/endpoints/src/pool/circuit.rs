//! One endpoint's circuit breaker, with the control plane's overrides.
//!
//! A pure state machine: no tasks, no locks, no I/O, and no clock of its
//! own. Every method that depends on time takes `now`, so the pool reads
//! the clock once per event and the tests drive time by hand.
//!
//! The local breaker:
//!
//! - `Closed` counts consecutive failures (a success resets the count); at
//!   [`CircuitSettings::consecutive_errors`] it opens for
//!   [`CircuitSettings::open_duration`].
//! - An `Open` circuit takes nothing until its time is up. Then the next
//!   request granted is the probe, and the circuit turns `HalfOpen`.
//! - `HalfOpen` takes nothing while the probe is in flight. The probe's
//!   success closes the circuit; its failure reopens it for twice as long as
//!   last time (capped at 16× the open duration). A probe that ends without
//!   a verdict (its client went away) lets the next request probe instead.
//! - A passing active health check ends an open circuit's wait: its probe
//!   is due at once, so the next request granted is the probe (the rule:
//!   [`router_policy::health::open_until_after_passing_check`]). It does
//!   not close the circuit: one real request decides. A provider's
//!   `Retry-After` still holds.
//! - A 429's `Retry-After` extends an open circuit: not back before the
//!   provider said, but never more than [`MAX_RETRY_AFTER`] (an hour) from
//!   now. Every instant here is computed with checked arithmetic
//!   ([`crate::clock::later`]): a far-off value from a backend or a policy
//!   must not overflow the clock.
//!
//! The control plane can force an endpoint open or closed until a given
//! instant (an operator's override, or the fleet sharing what other proxies
//! saw). While an override runs it decides admission; when it ends, the
//! local breaker (which kept counting meanwhile) decides again.
//!
//! [`Breaker::effective_state`] is the one place that combines the two: the
//! pool admits traffic by it and reports it in health and metrics, so the
//! state shown is always the state that routes.

use std::time::Duration;

use router_policy::CircuitSettings;
use tokio::time::Instant;

/// The reopening count at which the open period stops doubling (2⁴ = 16×).
const MAX_REOPENINGS: u32 = 4;

/// The longest a backend's `Retry-After` keeps its endpoint's circuit open.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The longest the breaker itself keeps a circuit open (the policy's open
/// duration, doubled on reopenings): beyond any sensible setting, within
/// what the clock can represent.
const MAX_OPEN: Duration = crate::clock::A_YEAR;

/// An endpoint's circuit breaker, as shown in health and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Traffic flows.
    Closed,
    /// No traffic until the open period ends.
    Open,
    /// One probe in flight decides.
    HalfOpen,
}

impl CircuitState {
    /// `closed`, `open`, `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// What a breaker, overrides included, says at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effective {
    /// Traffic flows: closed, or forced closed.
    Closed,
    /// No traffic: open with time left, or forced open.
    Open,
    /// Open and its time is up: the next request granted is the probe.
    ProbeDue,
    /// The probe is in flight: nothing else until its verdict.
    Probing,
}

impl Effective {
    /// Whether a request may be sent now.
    #[inline]
    pub(super) fn admits(self) -> bool {
        matches!(self, Self::Closed | Self::ProbeDue)
    }

    /// The state shown in health and metrics.
    pub(super) fn reported(self) -> CircuitState {
        match self {
            Self::Closed => CircuitState::Closed,
            Self::Open => CircuitState::Open,
            Self::ProbeDue | Self::Probing => CircuitState::HalfOpen,
        }
    }
}

/// The local breaker, without overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    Closed { failures: u32 },
    Open { until: Instant, reopenings: u32 },
    HalfOpen { reopenings: u32 },
}

impl Circuit {
    #[inline]
    fn effective(&self, now: Instant) -> Effective {
        match *self {
            Circuit::Closed { .. } => Effective::Closed,
            Circuit::Open { until, .. } if now >= until => Effective::ProbeDue,
            Circuit::Open { .. } => Effective::Open,
            Circuit::HalfOpen { .. } => Effective::Probing,
        }
    }
}

/// An override from the control plane: open or closed, until then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Forced {
    open: bool,
    until: Instant,
}

/// One endpoint's breaker: the local state machine and the override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Breaker {
    circuit: Circuit,
    forced: Option<Forced>,
    /// Until when the provider's last `Retry-After` said not to come back
    /// (a passing health check does not end the wait before it).
    retry_after_until: Option<Instant>,
}

impl Breaker {
    /// Closed, no failures, no override.
    pub(super) fn new() -> Self {
        Self {
            circuit: Circuit::Closed { failures: 0 },
            forced: None,
            retry_after_until: None,
        }
    }

    /// The state as of `now`: an override while it runs, else the local
    /// breaker. Admission and status both read this.
    #[inline]
    pub(super) fn effective_state(&self, now: Instant) -> Effective {
        match self.forced {
            Some(Forced { open: true, until }) if now < until => Effective::Open,
            Some(Forced { open: false, until }) if now < until => Effective::Closed,
            _ => self.circuit.effective(now),
        }
    }

    /// Whether a request may be sent as of `now`.
    #[inline]
    pub(super) fn admits(&self, now: Instant) -> bool {
        self.effective_state(now).admits()
    }

    /// The local breaker's state as of `now`, overrides aside (what this
    /// proxy itself saw, which it shares with the fleet).
    fn local_state(&self, now: Instant) -> CircuitState {
        self.circuit.effective(now).reported()
    }

    /// The next instant after `now` at which [`Self::effective_state`] can
    /// change by time alone (an override or an open period ending), if any.
    pub(super) fn next_change(&self, now: Instant) -> Option<Instant> {
        if let Some(Forced { until, .. }) = self.forced {
            if now < until {
                return Some(until);
            }
        }
        match self.circuit {
            Circuit::Open { until, .. } if now < until => Some(until),
            _ => None,
        }
    }

    /// Sets (or, with `None`, lifts) the override: open or closed, until
    /// then.
    pub(super) fn set_forced(&mut self, forced: Option<(bool, Instant)>) {
        self.forced = forced.map(|(open, until)| Forced { open, until });
    }

    /// A request was granted. Returns whether it is the probe of an open
    /// circuit (which then turns half-open).
    #[inline]
    pub(super) fn on_grant(&mut self) -> bool {
        match self.circuit {
            Circuit::Open { reopenings, .. } => {
                self.circuit = Circuit::HalfOpen { reopenings };
                true
            }
            _ => false,
        }
    }

    /// Whether a probe is in flight.
    #[inline]
    pub(super) fn is_probing(&self) -> bool {
        matches!(self.circuit, Circuit::HalfOpen { .. })
    }

    /// The probe ended without a verdict (as of `now`): the next request
    /// probes instead.
    pub(super) fn on_probe_abandoned(&mut self, now: Instant) {
        if let Circuit::HalfOpen { reopenings } = self.circuit {
            self.circuit = Circuit::Open {
                until: now,
                reopenings,
            };
        }
    }

    /// An active health check passed at `now`. Returns whether this ended
    /// an open circuit's wait (its probe is now due).
    pub(super) fn on_passing_check(&mut self, now: Instant) -> bool {
        let Circuit::Open { until, reopenings } = self.circuit else {
            return false;
        };
        let not_before = self.retry_after_until.unwrap_or(now);
        let end = router_policy::health::open_until_after_passing_check(now, until, not_before);
        if end >= until {
            return false;
        }
        self.circuit = Circuit::Open {
            until: end,
            reopenings,
        };
        true
    }

    /// The endpoint answered. Returns whether this closed a circuit that
    /// was not closed.
    #[inline]
    pub(super) fn on_success(&mut self) -> bool {
        let was_closed = matches!(self.circuit, Circuit::Closed { .. });
        self.circuit = Circuit::Closed { failures: 0 };
        self.retry_after_until = None;
        !was_closed
    }

    /// The attempt failed at `now`; a 429 may say when to come back
    /// (`retry_after`). Returns until when the circuit is open when this
    /// failure is what opened it.
    pub(super) fn on_failure(
        &mut self,
        now: Instant,
        settings: &CircuitSettings,
        retry_after: Option<Duration>,
    ) -> Option<Instant> {
        let before = self.local_state(now);
        self.circuit = match self.circuit {
            Circuit::Closed { failures } if failures + 1 >= settings.consecutive_errors => {
                Circuit::Open {
                    until: crate::clock::later(now, settings.open_duration, MAX_OPEN),
                    reopenings: 0,
                }
            }
            Circuit::Closed { failures } => Circuit::Closed {
                failures: failures + 1,
            },
            Circuit::HalfOpen { reopenings } => {
                let r = (reopenings + 1).min(MAX_REOPENINGS);
                Circuit::Open {
                    until: crate::clock::later(
                        now,
                        settings.open_duration.saturating_mul(1 << r),
                        MAX_OPEN,
                    ),
                    reopenings: r,
                }
            }
            open @ Circuit::Open { .. } => open,
        };
        if let (Some(retry_after), Circuit::Open { until, reopenings }) =
            (retry_after, self.circuit)
        {
            // The provider said when to come back: not before (within
            // reason: at most an hour).
            let not_before = crate::clock::later(now, retry_after, MAX_RETRY_AFTER);
            self.retry_after_until = self.retry_after_until.max(Some(not_before));
            self.circuit = Circuit::Open {
                until: until.max(not_before),
                reopenings,
            };
        }
        match self.circuit {
            Circuit::Open { until, .. }
                if before != CircuitState::Open && self.local_state(now) == CircuitState::Open =>
            {
                Some(until)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const SEC: Duration = Duration::from_secs(1);

    fn settings(errors: u32, open_ms: u64) -> CircuitSettings {
        CircuitSettings {
            consecutive_errors: errors,
            open_duration: MS * open_ms as u32,
        }
    }

    fn state(b: &Breaker, now: Instant) -> CircuitState {
        b.effective_state(now).reported()
    }

    #[test]
    fn closed_opens_after_n_consecutive_failures() {
        let t0 = Instant::now();
        let s = settings(3, 1000);
        let mut b = Breaker::new();
        assert_eq!(b.on_failure(t0, &s, None), None);
        assert_eq!(b.on_failure(t0, &s, None), None);
        assert_eq!(state(&b, t0), CircuitState::Closed);
        assert!(b.admits(t0));
        assert_eq!(b.on_failure(t0, &s, None), Some(t0 + MS * 1000));
        assert_eq!(state(&b, t0), CircuitState::Open);
        assert!(!b.admits(t0));
        // Already open: a further failure opens nothing.
        assert_eq!(b.on_failure(t0, &s, None), None);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let t0 = Instant::now();
        let s = settings(2, 1000);
        let mut b = Breaker::new();
        assert_eq!(b.on_failure(t0, &s, None), None);
        assert!(!b.on_success(), "it was closed already");
        assert_eq!(b.on_failure(t0, &s, None), None);
        assert_eq!(state(&b, t0), CircuitState::Closed);
    }

    #[test]
    fn an_open_circuit_admits_one_probe_when_its_time_is_up() {
        let t0 = Instant::now();
        let s = settings(1, 1000);
        let mut b = Breaker::new();
        assert!(b.on_failure(t0, &s, None).is_some());
        assert!(!b.admits(t0 + MS * 999));
        let t1 = t0 + MS * 1000;
        assert_eq!(b.effective_state(t1), Effective::ProbeDue);
        assert_eq!(state(&b, t1), CircuitState::HalfOpen);
        assert!(b.admits(t1));
        assert!(b.on_grant(), "the first grant is the probe");
        assert!(b.is_probing());
        assert_eq!(b.effective_state(t1), Effective::Probing);
        assert!(!b.admits(t1), "nothing else while the probe is out");
        assert!(!b.on_grant(), "a half-open circuit grants no second probe");
        // Its success closes the circuit.
        assert!(b.on_success());
        assert_eq!(state(&b, t1), CircuitState::Closed);
        assert!(!b.on_grant());
    }

    #[test]
    fn a_failed_probe_reopens_for_twice_as_long_capped_at_16x() {
        let s = settings(1, 100);
        let mut now = Instant::now();
        let mut b = Breaker::new();
        assert_eq!(b.on_failure(now, &s, None), Some(now + MS * 100));
        for expected_ms in [200, 400, 800, 1600, 1600] {
            now = b.next_change(now).expect("open until a time");
            assert!(b.on_grant());
            assert_eq!(b.on_failure(now, &s, None), Some(now + MS * expected_ms));
            assert!(!b.admits(now + MS * (expected_ms - 1)));
            assert!(b.admits(now + MS * expected_ms));
        }
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_request_probe() {
        let t0 = Instant::now();
        let s = settings(1, 100);
        let mut b = Breaker::new();
        b.on_failure(t0, &s, None);
        let t1 = t0 + MS * 100;
        assert!(b.on_grant());
        b.on_probe_abandoned(t1);
        assert!(!b.is_probing());
        assert_eq!(b.effective_state(t1), Effective::ProbeDue);
        assert!(b.on_grant());
        // Abandoning when no probe is out changes nothing.
        assert!(b.on_success());
        b.on_probe_abandoned(t1);
        assert_eq!(state(&b, t1), CircuitState::Closed);
    }

    #[test]
    fn a_passing_check_makes_the_probe_due_at_once_but_honours_retry_after() {
        let s = settings(1, 60_000);
        let t0 = Instant::now();
        let mut b = Breaker::new();
        b.on_failure(t0, &s, None);
        assert_eq!(state(&b, t0 + 5 * SEC), CircuitState::Open);
        // A check passes 5 s in: the next request is the probe.
        assert!(b.on_passing_check(t0 + 5 * SEC));
        assert_eq!(b.effective_state(t0 + 5 * SEC), Effective::ProbeDue);
        assert!(b.on_grant());
        assert_eq!(b.effective_state(t0 + 5 * SEC), Effective::Probing);
        // While the probe is out, a check changes nothing; its failure
        // reopens (for twice as long), and the next passing check ends
        // that wait too.
        assert!(!b.on_passing_check(t0 + 6 * SEC));
        b.on_failure(t0 + 6 * SEC, &s, None);
        assert_eq!(state(&b, t0 + 7 * SEC), CircuitState::Open);
        assert!(b.on_passing_check(t0 + 7 * SEC));
        assert!(b.admits(t0 + 7 * SEC));
        // A closed circuit: nothing to end.
        assert!(b.on_success());
        assert!(!b.on_passing_check(t0 + 8 * SEC));
        // A provider's Retry-After of 30 s holds against passing checks.
        let mut b = Breaker::new();
        b.on_failure(t0, &s, Some(30 * SEC));
        assert!(b.on_passing_check(t0 + SEC));
        assert!(!b.admits(t0 + 29 * SEC));
        assert!(b.admits(t0 + 30 * SEC));
        // A forced-open override still decides.
        let mut b = Breaker::new();
        b.on_failure(t0, &s, None);
        b.set_forced(Some((true, t0 + 100 * SEC)));
        b.on_passing_check(t0 + SEC);
        assert!(!b.admits(t0 + 2 * SEC));
    }

    #[test]
    fn retry_after_extends_the_open_period_never_shortens_it() {
        let t0 = Instant::now();
        let s = settings(1, 1000);
        let mut b = Breaker::new();
        assert_eq!(b.on_failure(t0, &s, Some(MS * 5000)), Some(t0 + MS * 5000));
        let mut b = Breaker::new();
        assert_eq!(b.on_failure(t0, &s, Some(MS * 10)), Some(t0 + MS * 1000));
        // Retry-After on a closed circuit that stays closed does nothing.
        let mut b = Breaker::new();
        assert_eq!(b.on_failure(t0, &settings(2, 1000), Some(MS * 10)), None);
        assert_eq!(state(&b, t0), CircuitState::Closed);
    }

    #[test]
    fn a_huge_retry_after_is_capped_at_an_hour() {
        let t0 = Instant::now();
        let s = settings(1, 1000);
        let mut b = Breaker::new();
        let until = b.on_failure(t0, &s, Some(Duration::from_secs(u64::MAX)));
        assert_eq!(until, Some(t0 + MAX_RETRY_AFTER));
        assert!(b.admits(t0 + MAX_RETRY_AFTER));
        // A huge open duration (and its doublings) does not overflow either.
        let huge = CircuitSettings {
            consecutive_errors: 1,
            open_duration: Duration::MAX,
        };
        let mut b = Breaker::new();
        assert_eq!(b.on_failure(t0, &huge, None), Some(t0 + MAX_OPEN));
    }

    #[test]
    fn retry_after_on_a_circuit_whose_time_is_up_reopens_it() {
        let t0 = Instant::now();
        let s = settings(1, 100);
        let mut b = Breaker::new();
        b.on_failure(t0, &s, None);
        let t1 = t0 + MS * 100;
        assert_eq!(state(&b, t1), CircuitState::HalfOpen);
        assert_eq!(b.on_failure(t1, &s, Some(MS * 50)), Some(t1 + MS * 50));
        assert_eq!(state(&b, t1), CircuitState::Open);
    }

    #[test]
    fn forced_overrides_decide_until_they_expire() {
        let t0 = Instant::now();
        let s = settings(1, 10_000);
        let until = t0 + MS * 500;

        // Forced open over a closed breaker.
        let mut b = Breaker::new();
        b.set_forced(Some((true, until)));
        assert_eq!(state(&b, t0), CircuitState::Open);
        assert!(!b.admits(until - MS));
        assert_eq!(b.next_change(t0), Some(until));
        assert!(b.admits(until), "the override ends at its time");
        assert_eq!(state(&b, until), CircuitState::Closed);
        assert_eq!(b.next_change(until), None);

        // Forced closed over an open breaker: the local breaker returns at
        // the override's end, still open.
        let mut b = Breaker::new();
        b.on_failure(t0, &s, None);
        b.set_forced(Some((false, until)));
        assert!(b.admits(until - MS));
        assert_eq!(state(&b, until - MS), CircuitState::Closed);
        assert_eq!(b.next_change(t0), Some(until));
        assert!(!b.admits(until));
        assert_eq!(state(&b, until), CircuitState::Open);
        assert_eq!(b.next_change(until), Some(t0 + MS * 10_000));

        // Lifted early.
        b.set_forced(None);
        assert_eq!(state(&b, t0), CircuitState::Open);
    }

    #[test]
    fn status_never_contradicts_admission_under_any_override() {
        let t0 = Instant::now();
        let s = settings(1, 1000);
        let closed = Breaker::new();
        let mut open = Breaker::new();
        open.on_failure(t0, &s, None);
        let mut probing = open;
        probing.on_grant();
        for local in [closed, open, probing] {
            for forced in [
                None,
                Some((true, t0 + MS * 10)),
                Some((false, t0 + MS * 10)),
            ] {
                let mut b = local;
                b.set_forced(forced);
                for t in [t0, t0 + MS * 10, t0 + MS * 1000] {
                    let shown = state(&b, t);
                    // Traffic flows: not shown open. None flows: not shown
                    // closed.
                    let wrong = if b.admits(t) {
                        CircuitState::Open
                    } else {
                        CircuitState::Closed
                    };
                    assert_ne!(shown, wrong, "{b:?} at +{:?}", t - t0);
                }
            }
        }
    }

    #[test]
    fn next_change_is_only_ever_in_the_future() {
        let t0 = Instant::now();
        let s = settings(1, 100);
        let mut b = Breaker::new();
        assert_eq!(b.next_change(t0), None);
        b.on_failure(t0, &s, None);
        assert_eq!(b.next_change(t0), Some(t0 + MS * 100));
        // Its time is up: nothing left to wait for (a wake armed for the
        // past would fire again and again).
        assert_eq!(b.next_change(t0 + MS * 100), None);
        b.set_forced(Some((true, t0 + MS * 50)));
        assert_eq!(b.next_change(t0), Some(t0 + MS * 50));
        assert_eq!(b.next_change(t0 + MS * 50), Some(t0 + MS * 100));
    }
}
