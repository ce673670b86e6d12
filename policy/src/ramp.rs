//! Ramps: a split's new side moved up step by step (10%, 25%, 50%, all)
//! while it behaves, and back to 0 when it does not. This module is the
//! pure step decision ([`decide`]) and the latency summary it reads
//! ([`LatencyBuckets`]); the control plane keeps the window and applies
//! the decision (a new policy version).
//!
//! ```yaml
//! chain: [{split: [{pool: new, weight: 10}, {pool: old, weight: 90}],
//!          ramp: {steps: [10, 25, 50, 100], step_s: 600,
//!                 guard: {max_error_rate: 0.01, max_p95_ratio: 1.5, min_requests: 100}}}]
//! ```
//!
//! A ramp is on a split of exactly two sides; the **first side is the new
//! one** (the split's mapping only ever moves keys towards its first side
//! as its weight grows: [`crate::split`]), the second the old one, and the
//! weights it writes are `new: w, old: 100 - w`.
//!
//! **The window**: what both sides did since the current step began
//! (requests, errors, a p95), as the proxies reported it. An **error** is
//! an outcome the client did not cause: a 5xx, a timeout, a connection
//! failure (not a 4xx, not a client that went away).
//!
//! **The guard**, against the old side's behaviour over the same window:
//!
//! - *error rate*: the new side's error rate may exceed the old side's by
//!   at most `max_error_rate` (absolute: `0.01` is one percentage point).
//!   The old side is the baseline, so an outage that hits both sides alike
//!   (the provider's, the network's) rolls nothing back, and a new side
//!   that fails on its own does. Judged as soon as it is certain: the
//!   rate the new side would have if every request still missing to reach
//!   `min_requests` succeeded already exceeds the limit (so a new side that
//!   fails every request is rolled back after `max_error_rate ×
//!   min_requests` errors, not at the end of the step);
//! - *latency*: the new side's p95 may be at most `max_p95_ratio` times the
//!   old side's, judged once both sides have `min_requests` requests.
//!
//! **The decision** ([`decide`]), each tick:
//!
//! 1. weight 0 (rolled back, or aborted): [`Verdict::Stopped`]: nothing
//!    moves until an operator sets a step again;
//! 2. weight at or past the last step: [`Verdict::Done`];
//! 3. the guard fails: [`Verdict::RollBack`] to 0, with the reason;
//! 4. the step has not lasted `step_s` yet: hold;
//! 5. the new side has fewer than `min_requests` requests in the window
//!    (or, with a latency guard, the old side has): hold, however long the
//!    step has lasted (no evidence, no advance);
//! 6. else [`Verdict::Advance`] to the next step: the first step above the
//!    current weight (never one further).

use std::time::Duration;

/// A ramp's guard, resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Guard {
    /// How far the new side's error rate may exceed the old side's
    /// (absolute, in [0, 1]).
    pub max_error_rate: f64,
    /// The new side's p95 over the old side's, at most; `None`: latency
    /// is not guarded.
    pub max_p95_ratio: Option<f64>,
    /// Requests a side needs in the window before it is judged.
    pub min_requests: u64,
}

impl Guard {
    /// The default error margin: one percentage point.
    pub const DEFAULT_MAX_ERROR_RATE: f64 = 0.01;
    /// The default p95 ratio.
    pub const DEFAULT_MAX_P95_RATIO: f64 = 1.5;
    /// The default evidence.
    pub const DEFAULT_MIN_REQUESTS: u64 = 100;
}

/// A validated ramp.
#[derive(Debug, Clone, PartialEq)]
pub struct Ramp {
    /// The new side's weights, strictly increasing, each in 1..=100.
    pub steps: Vec<u32>,
    /// How long a step lasts at least.
    pub step: Duration,
    /// What a step must show to advance.
    pub guard: Guard,
}

/// One side's window: what it did since the step began.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SideWindow {
    /// Requests that reached the side (attempts on its pool).
    pub requests: u64,
    /// Of those, errors (5xx, timeouts, connection failures).
    pub errors: u64,
    /// Its p95 latency, ms (`None` without samples).
    pub p95_ms: Option<f64>,
}

impl SideWindow {
    /// Errors over requests (0 without requests).
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.errors as f64 / self.requests as f64
        }
    }
}

/// Why a step holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Hold {
    /// The step has lasted less than `step_s`.
    InStep {
        /// How long it still has.
        left: Duration,
    },
    /// Too few requests to judge.
    TooFewRequests {
        /// Which side (`new` or `old`).
        side: &'static str,
        /// Its requests in the window.
        have: u64,
        /// `min_requests`.
        need: u64,
    },
}

/// What a ramp does now.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Nothing yet.
    Hold(Hold),
    /// To the next step, with the evidence in words.
    Advance {
        /// The weight now.
        from: u32,
        /// The next step's.
        to: u32,
        /// `errors 0.2% <= 1% + old 0.1%, p95 ratio 1.10 <= 1.5`.
        why: String,
    },
    /// Back to 0, and why.
    RollBack {
        /// The weight now.
        from: u32,
        /// `error rate 12.0% > 1% + old 0.0% (12 of 100)`.
        why: String,
    },
    /// At the last step.
    Done,
    /// At weight 0 (rolled back or aborted): waits for an operator.
    Stopped,
}

impl Verdict {
    /// A label: `hold`, `advance`, `roll_back`, `done`, `stopped`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Hold(_) => "hold",
            Self::Advance { .. } => "advance",
            Self::RollBack { .. } => "roll_back",
            Self::Done => "done",
            Self::Stopped => "stopped",
        }
    }
}

/// The step after `weight`: the first step above it.
pub fn next_step(ramp: &Ramp, weight: u32) -> Option<u32> {
    ramp.steps.iter().copied().find(|&s| s > weight)
}

fn percent(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

/// The error-rate part of the guard: `Err(why)` when it fails for
/// certain (see the module doc), `Ok(text)` with the evidence otherwise.
fn errors_hold(guard: &Guard, new: &SideWindow, old: &SideWindow) -> Result<String, String> {
    let limit = guard.max_error_rate + old.error_rate();
    // The lowest rate the new side can still end the window with.
    let at_least = new.errors as f64 / new.requests.max(guard.min_requests).max(1) as f64;
    if new.errors > 0 && at_least > limit {
        return Err(format!(
            "error rate {} > {} + old {} ({} of {} requests)",
            percent(new.error_rate()),
            percent(guard.max_error_rate),
            percent(old.error_rate()),
            new.errors,
            new.requests
        ));
    }
    Ok(format!(
        "errors {} <= {} + old {}",
        percent(new.error_rate()),
        percent(guard.max_error_rate),
        percent(old.error_rate())
    ))
}

/// What the ramp does now, for the new side at `weight`, a step that began
/// `elapsed` ago, and the two sides' windows over it. Pure; see the
/// module doc for the rules.
pub fn decide(
    ramp: &Ramp,
    weight: u32,
    elapsed: Duration,
    new: &SideWindow,
    old: &SideWindow,
) -> Verdict {
    if weight == 0 {
        return Verdict::Stopped;
    }
    let Some(to) = next_step(ramp, weight) else {
        return Verdict::Done;
    };
    let g = &ramp.guard;
    let errors = match errors_hold(g, new, old) {
        Ok(text) => text,
        Err(why) => return Verdict::RollBack { from: weight, why },
    };
    let both_judged = new.requests >= g.min_requests && old.requests >= g.min_requests;
    let mut latency = String::new();
    if let (Some(max), true) = (g.max_p95_ratio, both_judged) {
        if let (Some(n), Some(o)) = (new.p95_ms, old.p95_ms) {
            let ratio = if o > 0.0 { n / o } else { f64::INFINITY };
            if ratio > max && n > o {
                return Verdict::RollBack {
                    from: weight,
                    why: format!("p95 ratio {ratio:.2} > {max} ({n:.0} ms against {o:.0} ms)"),
                };
            }
            latency = format!(", p95 ratio {ratio:.2} <= {max}");
        }
    }
    if elapsed < ramp.step {
        return Verdict::Hold(Hold::InStep {
            left: ramp.step - elapsed,
        });
    }
    if new.requests < g.min_requests {
        return Verdict::Hold(Hold::TooFewRequests {
            side: "new",
            have: new.requests,
            need: g.min_requests,
        });
    }
    if g.max_p95_ratio.is_some() && old.requests < g.min_requests {
        return Verdict::Hold(Hold::TooFewRequests {
            side: "old",
            have: old.requests,
            need: g.min_requests,
        });
    }
    Verdict::Advance {
        from: weight,
        to,
        why: format!("{errors}{latency}"),
    }
}

/// How an attempt's outcome counts in a side's window: `None` not at all
/// (a cancelled hedge, a client that went away, an answer replayed or
/// refused before any backend was asked), `Some(true)` an error the client
/// did not cause (a 5xx, a timeout, a connection failure, a stream cut or
/// broken), `Some(false)` a request that went well or whose failure is
/// the client's or the quota's (a 4xx, a 429: rate limits are the
/// balancer's, not the side's health).
pub fn counts_as_error(outcome: crate::Outcome) -> Option<bool> {
    use crate::Outcome as O;
    match outcome {
        O::Ok | O::Status429 | O::InvalidRequest | O::PayloadTooLarge => Some(false),
        O::ConnectError
        | O::UpstreamError
        | O::Timeout
        | O::Status5xx
        | O::MalformedJson
        | O::UpstreamReset
        | O::FirstTokenTimeout
        | O::StreamError
        | O::StreamStalled => Some(true),
        _ => None,
    }
}

/// A latency summary that merges across proxies: counts in fixed
/// logarithmic buckets (bucket `i` holds latencies up to `2^(i/4)` ms,
/// about 19% wide; the last holds the rest), so the fleet's p95 is the
/// p95 of the summed counts, within one bucket of the true one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyBuckets {
    /// Counts per bucket.
    pub counts: [u64; Self::LEN],
}

impl Default for LatencyBuckets {
    fn default() -> Self {
        Self {
            counts: [0; Self::LEN],
        }
    }
}

impl LatencyBuckets {
    /// Buckets: up to 2^(79/4) ms, about 14 minutes, then one for the rest.
    pub const LEN: usize = 80;

    /// The bucket of a latency in ms.
    pub fn bucket(ms: f64) -> usize {
        // NaN and anything up to 1 ms: the first bucket.
        if ms.is_nan() || ms <= 1.0 {
            return 0;
        }
        let i = (ms.log2() * 4.0).ceil();
        if i >= (Self::LEN - 1) as f64 {
            Self::LEN - 1
        } else {
            i as usize
        }
    }

    /// The upper bound of bucket `i`, ms.
    pub fn upper_ms(i: usize) -> f64 {
        2f64.powf(i as f64 / 4.0)
    }

    /// Counts one latency.
    pub fn record(&mut self, ms: f64) {
        let i = Self::bucket(ms);
        self.counts[i] = self.counts[i].saturating_add(1);
    }

    /// Adds another summary (another proxy's, another interval's).
    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    /// Samples counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// The quantile `q` (0..=1): the upper bound of the bucket that holds
    /// it; `None` without samples.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(c);
            if seen >= rank {
                return Some(Self::upper_ms(i));
            }
        }
        Some(Self::upper_ms(Self::LEN - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> Ramp {
        Ramp {
            steps: vec![10, 25, 50, 100],
            step: Duration::from_secs(600),
            guard: Guard {
                max_error_rate: 0.01,
                max_p95_ratio: Some(1.5),
                min_requests: 100,
            },
        }
    }

    fn side(requests: u64, errors: u64, p95: f64) -> SideWindow {
        SideWindow {
            requests,
            errors,
            p95_ms: Some(p95),
        }
    }

    const STEP: Duration = Duration::from_secs(600);

    #[test]
    fn a_healthy_step_advances_to_the_next_with_the_evidence() {
        let v = decide(
            &ramp(),
            10,
            STEP,
            &side(200, 0, 110.0),
            &side(1800, 2, 100.0),
        );
        assert_eq!(
            v,
            Verdict::Advance {
                from: 10,
                to: 25,
                why: "errors 0.0% <= 1.0% + old 0.1%, p95 ratio 1.10 <= 1.5".into()
            }
        );
    }

    #[test]
    fn a_failing_new_side_is_rolled_back_as_soon_as_it_is_certain() {
        // 2 errors of 5: at best 2 of 100, above 1% + 0%.
        let v = decide(
            &ramp(),
            25,
            Duration::from_secs(1),
            &side(5, 2, 10.0),
            &side(20, 0, 10.0),
        );
        assert_eq!(
            v,
            Verdict::RollBack {
                from: 25,
                why: "error rate 40.0% > 1.0% + old 0.0% (2 of 5 requests)".into()
            }
        );
        // One error of 5 could still end at 1 of 100: not yet.
        let v = decide(
            &ramp(),
            25,
            Duration::from_secs(1),
            &side(5, 1, 10.0),
            &side(20, 0, 10.0),
        );
        assert!(matches!(v, Verdict::Hold(Hold::InStep { .. })), "{v:?}");
    }

    #[test]
    fn an_outage_of_both_sides_rolls_nothing_back() {
        let v = decide(
            &ramp(),
            25,
            STEP,
            &side(200, 20, 10.0),
            &side(600, 60, 10.0),
        );
        assert!(matches!(v, Verdict::Advance { to: 50, .. }), "{v:?}");
    }

    #[test]
    fn a_slow_new_side_is_rolled_back_once_both_sides_are_judged() {
        let v = decide(
            &ramp(),
            50,
            Duration::from_secs(5),
            &side(100, 0, 400.0),
            &side(100, 0, 100.0),
        );
        assert_eq!(
            v,
            Verdict::RollBack {
                from: 50,
                why: "p95 ratio 4.00 > 1.5 (400 ms against 100 ms)".into()
            }
        );
        let v = decide(&ramp(), 50, STEP, &side(99, 0, 400.0), &side(100, 0, 100.0));
        assert!(matches!(
            v,
            Verdict::Hold(Hold::TooFewRequests { side: "new", .. })
        ));
    }

    #[test]
    fn only_failures_the_client_did_not_cause_are_errors() {
        use crate::Outcome as O;
        for o in [O::Status5xx, O::Timeout, O::ConnectError, O::StreamError] {
            assert_eq!(counts_as_error(o), Some(true), "{o:?}");
        }
        for o in [O::Ok, O::InvalidRequest, O::Status429] {
            assert_eq!(counts_as_error(o), Some(false), "{o:?}");
        }
        for o in [O::ClientCancelled, O::HedgeCancelled, O::Replayed] {
            assert_eq!(counts_as_error(o), None, "{o:?}");
        }
    }

    #[test]
    fn the_ends_of_a_ramp() {
        let none = SideWindow::default();
        assert_eq!(decide(&ramp(), 100, STEP, &none, &none), Verdict::Done);
        assert_eq!(decide(&ramp(), 0, STEP, &none, &none), Verdict::Stopped);
        // A weight between steps goes to the next one above it.
        assert_eq!(next_step(&ramp(), 30), Some(50));
    }

    #[test]
    fn buckets_merge_into_the_fleets_p95() {
        let mut a = LatencyBuckets::default();
        let mut b = LatencyBuckets::default();
        for ms in 1..=95 {
            a.record(f64::from(ms));
        }
        for _ in 0..5 {
            b.record(1000.0);
        }
        assert_eq!(
            a.quantile_ms(0.95),
            Some(LatencyBuckets::upper_ms(LatencyBuckets::bucket(91.0)))
        );
        a.merge(&b);
        assert_eq!(a.total(), 100);
        let p95 = a.quantile_ms(0.95).unwrap_or(0.0);
        assert!((90.0..=110.0).contains(&p95), "{p95}");
        let p99 = a.quantile_ms(0.99).unwrap_or(0.0);
        assert!((1000.0..=1190.0).contains(&p99), "{p99}");
        assert_eq!(LatencyBuckets::default().quantile_ms(0.95), None);
        assert_eq!(LatencyBuckets::bucket(f64::NAN), 0);
        assert_eq!(LatencyBuckets::bucket(1e12), LatencyBuckets::LEN - 1);
    }
}
