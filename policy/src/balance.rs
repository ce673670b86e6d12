//! Choosing an endpoint inside a pool.
//!
//! Each endpoint carries an exponentially weighted moving average (EWMA) of
//! its observed latency and a count of requests in flight. A request waiting
//! in a pool's queue may go to an endpoint when:
//!
//! 1. the endpoint is below its concurrency limit, and
//! 2. it has never answered yet and has no probe in flight (an *untried*
//!    endpoint gets exactly one request until it has a sample), or its EWMA
//!    is under the pool's latency threshold, or it is idle (an idle endpoint
//!    is always eligible, so a pool whose endpoints are all slow still
//!    drains one request at a time instead of stalling).
//!
//! Among eligible endpoints the lowest score wins; untried endpoints score 0
//! so they are tried first (optimistic initial routing, as the Hugging Face
//! router does). Two scorings exist:
//!
//! - [`Scoring::LowestEwma`]: the score is the EWMA alone, the Hugging Face
//!   `queued-least-latency` rule. Because the EWMA only moves when answers
//!   come back, a burst that arrives at once all lands on the one endpoint
//!   that was fastest before the burst.
//! - [`Scoring::PeakEwma`] (the default): the score is the EWMA multiplied
//!   by `in_flight + 1`, the cost function of Finagle's and Linkerd's
//!   peak-EWMA balancers. A fast endpoint stays preferred while it is
//!   lightly loaded, but each request already sent to it raises its cost,
//!   so bursts spread in proportion to speed instead of piling up. Its EWMA
//!   is also *peak-sensitive*: a sample above the current average replaces
//!   it at once (slowdowns are believed immediately), while improvements are
//!   folded in with the smoothing factor.
//!
//! Endpoints where the requested model is already resident (reported by
//! a capacity probe) are preferred over the others: a cold model load
//! costs seconds, more than any latency difference the EWMA can show.
//!
//! Two more, for comparison and for simple fleets:
//!
//! - [`Scoring::LeastRequests`]: the fewest requests in flight (Envoy's
//!   `LEAST_REQUEST` without the random choice of two).
//! - [`Scoring::RoundRobin`]: every eligible endpoint scores the same, so
//!   the rotating tie-break takes them in turn.
//!
//! [`Scoring::EngineAware`] ranks by what the engines report; its choice is
//! [`crate::engine_aware::choose`]. Given to [`choose`] (no engine data at
//! hand) it ranks as [`Scoring::LeastRequests`].
//!
//! Ties (equal scores) are broken by a rotating start position supplied by
//! the caller, so equal endpoints share traffic instead of the first one
//! always winning.
//!
//! Failed attempts (connect errors, timeouts, 429s, 5xx) must not look fast:
//! a dead endpoint refuses connections in microseconds and would otherwise
//! attract all traffic. [`failure_sample`] turns a failure into a sample at
//! least as large as the latency threshold.

use serde::{Deserialize, Serialize};

/// How eligible endpoints are ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// Load-aware: EWMA latency × (in-flight + 1), peak-sensitive EWMA.
    #[default]
    PeakEwma,
    /// The Hugging Face rule: lowest EWMA latency.
    LowestEwma,
    /// Fewest requests in flight.
    LeastRequests,
    /// In turn.
    RoundRobin,
    /// By the engines' own signals ([`crate::engine_aware`]).
    EngineAware,
}

impl Scoring {
    /// Every scoring, in the order the docs list them.
    pub const ALL: [Scoring; 5] = [
        Self::PeakEwma,
        Self::LowestEwma,
        Self::LeastRequests,
        Self::RoundRobin,
        Self::EngineAware,
    ];

    /// Parses a name given by [`Scoring::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The name used in configuration and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PeakEwma => "peak_ewma",
            Self::LowestEwma => "lowest_ewma",
            Self::LeastRequests => "least_requests",
            Self::RoundRobin => "round_robin",
            Self::EngineAware => "engine_aware",
        }
    }

    /// Folds a latency sample (seconds) into the EWMA.
    pub fn update(self, previous: Option<f64>, sample: f64, alpha: f64) -> f64 {
        match previous {
            None => sample,
            Some(prev) if self == Self::PeakEwma && sample > prev => sample,
            Some(prev) => alpha * sample + (1.0 - alpha) * prev,
        }
    }
}

/// The latency sample recorded for a failed attempt: never below the
/// threshold, so a failing endpoint cannot look fast.
pub fn failure_sample(elapsed_s: f64, threshold_s: f64) -> f64 {
    elapsed_s.max(threshold_s)
}

/// What the chooser needs to know about one endpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EndpointLoad {
    /// EWMA latency in seconds; `None` until the first answer.
    pub ewma: Option<f64>,
    /// Requests currently sent to it and not finished.
    pub in_flight: u32,
    /// Per-endpoint concurrency limit; `None` for no limit.
    pub max_concurrency: Option<u32>,
    /// False when something outside latency rules it out (circuit open,
    /// draining, capacity probe failing).
    pub available: bool,
    /// Preferred among eligible endpoints (the requested model is already
    /// resident there: no cold load).
    pub preferred: bool,
}

impl EndpointLoad {
    fn eligible(&self, threshold_s: f64) -> bool {
        if !self.available {
            return false;
        }
        if let Some(max) = self.max_concurrency {
            if self.in_flight >= max {
                return false;
            }
        }
        match self.ewma {
            None => self.in_flight == 0,
            Some(ewma) => ewma < threshold_s || self.in_flight == 0,
        }
    }

    fn score(&self, scoring: Scoring) -> f64 {
        let ewma = self.ewma.unwrap_or(0.0);
        match scoring {
            Scoring::LowestEwma => ewma,
            Scoring::PeakEwma => ewma * f64::from(self.in_flight.saturating_add(1)),
            Scoring::LeastRequests | Scoring::EngineAware => f64::from(self.in_flight),
            Scoring::RoundRobin => 0.0,
        }
    }
}

/// Picks the endpoint for the next request, or `None` when no endpoint is
/// eligible right now. `rotation` is any counter the caller advances per
/// decision; it decides who wins among equal scores.
pub fn choose(
    endpoints: &[EndpointLoad],
    scoring: Scoring,
    threshold_s: f64,
    rotation: usize,
) -> Option<usize> {
    let n = endpoints.len();
    if n == 0 {
        return None;
    }
    let mut best: Option<(usize, f64)> = None;
    for k in 0..n {
        let i = (rotation.wrapping_add(k)) % n;
        let e = &endpoints[i];
        if !e.eligible(threshold_s) {
            continue;
        }
        let score = e.score(scoring);
        let better = match best {
            None => true,
            Some((j, s)) => {
                let incumbent_preferred = endpoints[j].preferred;
                (e.preferred && !incumbent_preferred)
                    || (e.preferred == incumbent_preferred && score < s)
            }
        };
        if better {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(ewma: Option<f64>, in_flight: u32) -> EndpointLoad {
        EndpointLoad {
            ewma,
            in_flight,
            max_concurrency: None,
            available: true,
            preferred: false,
        }
    }

    #[test]
    fn untried_first_with_one_probe() {
        let eps = [ep(Some(0.01), 0), ep(None, 0)];
        assert_eq!(choose(&eps, Scoring::LowestEwma, 3.0, 0), Some(1));
        // The probe is in flight: the untried endpoint waits for its sample.
        let eps = [ep(Some(0.01), 0), ep(None, 1)];
        assert_eq!(choose(&eps, Scoring::LowestEwma, 3.0, 0), Some(0));
        let eps = [ep(None, 1)];
        assert_eq!(choose(&eps, Scoring::PeakEwma, 3.0, 0), None);
    }

    #[test]
    fn lowest_ewma_below_threshold_wins() {
        let eps = [ep(Some(0.5), 3), ep(Some(0.2), 5), ep(Some(4.0), 1)];
        assert_eq!(choose(&eps, Scoring::LowestEwma, 3.0, 0), Some(1));
    }

    #[test]
    fn idle_backend_is_always_eligible() {
        let eps = [ep(Some(10.0), 1), ep(Some(9.0), 0)];
        assert_eq!(choose(&eps, Scoring::LowestEwma, 3.0, 0), Some(1));
        let eps = [ep(Some(10.0), 1), ep(Some(9.0), 1)];
        assert_eq!(choose(&eps, Scoring::LowestEwma, 3.0, 0), None);
    }

    #[test]
    fn concurrency_limit_and_availability_exclude() {
        let mut full = ep(Some(0.01), 2);
        full.max_concurrency = Some(2);
        let mut open = ep(Some(0.01), 0);
        open.available = false;
        assert_eq!(choose(&[full, open], Scoring::PeakEwma, 3.0, 0), None);
        assert_eq!(
            choose(&[full, open, ep(Some(1.0), 0)], Scoring::PeakEwma, 3.0, 0),
            Some(2)
        );
    }

    #[test]
    fn ties_rotate() {
        let eps = [ep(Some(0.1), 0), ep(Some(0.1), 0), ep(Some(0.1), 0)];
        let picks: Vec<_> = (0..3)
            .map(|r| choose(&eps, Scoring::LowestEwma, 3.0, r).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 1, 2]);
    }

    #[test]
    fn peak_ewma_spreads_by_load() {
        // Fast endpoint with 9 in flight costs 0.02*10 = 0.2; a slow idle
        // one costs 0.2*1 = 0.2 as well; with 10 in flight the slow one wins.
        let eps = [ep(Some(0.02), 10), ep(Some(0.2), 0)];
        assert_eq!(choose(&eps, Scoring::PeakEwma, 3.0, 0), Some(1));
        assert_eq!(choose(&eps, Scoring::LowestEwma, 3.0, 0), Some(0));
        let eps = [ep(Some(0.02), 3), ep(Some(0.2), 0)];
        assert_eq!(choose(&eps, Scoring::PeakEwma, 3.0, 0), Some(0));
    }

    #[test]
    fn resident_models_are_preferred() {
        let mut warm = ep(Some(0.5), 2);
        warm.preferred = true;
        let cold = ep(Some(0.05), 0);
        assert_eq!(choose(&[cold, warm], Scoring::PeakEwma, 3.0, 0), Some(1));
        // ...but only among eligible endpoints.
        warm.available = false;
        assert_eq!(choose(&[cold, warm], Scoring::PeakEwma, 3.0, 0), Some(0));
    }

    #[test]
    fn least_requests_and_round_robin() {
        let eps = [ep(Some(0.01), 3), ep(Some(2.0), 1), ep(Some(0.5), 2)];
        assert_eq!(choose(&eps, Scoring::LeastRequests, 3.0, 0), Some(1));
        let picks: Vec<_> = (0..4)
            .map(|r| choose(&eps, Scoring::RoundRobin, 3.0, r).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0]);
        for k in Scoring::ALL {
            assert_eq!(Scoring::parse(k.as_str()), Some(k));
        }
        assert_eq!(Scoring::parse("fastest"), None);
    }

    #[test]
    fn ewma_updates() {
        let a = 0.3;
        assert_eq!(Scoring::LowestEwma.update(None, 1.0, a), 1.0);
        let v = Scoring::LowestEwma.update(Some(1.0), 2.0, a);
        assert!((v - 1.3).abs() < 1e-9);
        // Peak: a slower sample is believed at once, a faster one is smoothed.
        assert_eq!(Scoring::PeakEwma.update(Some(1.0), 2.0, a), 2.0);
        let v = Scoring::PeakEwma.update(Some(1.0), 0.0, a);
        assert!((v - 0.7).abs() < 1e-9);
    }

    #[test]
    fn failures_never_look_fast() {
        assert_eq!(failure_sample(0.0001, 3.0), 3.0);
        assert_eq!(failure_sample(5.0, 3.0), 5.0);
        // A dead endpoint that fails fast ends up ranked behind a live one.
        let dead = Scoring::LowestEwma.update(Some(0.001), failure_sample(0.0001, 3.0), 0.3);
        let eps = [ep(Some(dead), 0), ep(Some(0.05), 0)];
        assert_eq!(choose(&eps, Scoring::LowestEwma, 3.0, 0), Some(1));
    }
}
