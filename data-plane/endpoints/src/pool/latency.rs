//! What attempts teach a pool about latency.
//!
//! Two views, fed by the same [`Sample`]s:
//!
//! - Per endpoint, an EWMA of the latency to the first byte (the balancer's
//!   score, [`router_policy::balance`]). A failure is folded in as at least
//!   the pool's latency threshold ([`failure_sample`]), so an endpoint that
//!   fails fast never looks fast.
//! - Per pool, a window of the last [`LATENCY_WINDOW`] latencies of
//!   attempts that got an answer or were given up (a failure's latency says
//!   nothing about service time), each counting for [`LATENCY_MAX_AGE`].
//!   Its p95 is what the deadline planner compares a request's time left
//!   against. Computing it sorts the window, so it is cached and computed
//!   again at most every [`P95_REFRESH`] under load; the first sample and
//!   the window emptying always show at once.
//! - Per endpoint, for people (the pool's status, the console's Pools
//!   page): the p95 of that endpoint's samples among the same window
//!   ([`LatencyWindow::endpoint_p95s`]), computed when asked, not cached.
//!   It covers the endpoint's share of the pool's last [`LATENCY_WINDOW`]
//!   samples of the last minute: in a busy pool, a rarely chosen
//!   endpoint's p95 rests on few samples.

use std::collections::VecDeque;
use std::time::Duration;

use router_policy::balance::failure_sample;
use router_policy::QueueSettings;
use tokio::time::Instant;

/// How many recent latencies a pool keeps for its p95.
const LATENCY_WINDOW: usize = 128;

/// The p95 is recomputed at most this often under load.
const P95_REFRESH: Duration = Duration::from_millis(50);

/// How long a latency sample counts toward the p95.
const LATENCY_MAX_AGE: Duration = Duration::from_secs(60);

/// What one attempt taught us about an endpoint's latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sample {
    /// The endpoint answered; latency to its first byte.
    Success(Duration),
    /// The attempt failed after this long (connect error, 429, 5xx).
    Failure(Duration),
    /// The attempt was given up after this long without an answer.
    Timeout(Duration),
    /// A 429 after this long; its `Retry-After`, if any, extends an open
    /// circuit.
    RateLimited(Duration, Option<Duration>),
    /// The router cancelled the attempt after this long (the losing
    /// attempt of a hedge): a lower bound of its latency. It counts in the
    /// EWMA and the p95 (so that a tail the hedges cut is still seen, and
    /// hedges do not start ever sooner), and not for the circuit: the
    /// endpoint did not fail.
    Cancelled(Duration),
}

impl Sample {
    /// The sample of an attempt that ended as `kind` after `waited` (a
    /// 429's `Retry-After` with it).
    pub fn of(
        kind: router_policy::SampleKind,
        waited: Duration,
        retry_after: Option<Duration>,
    ) -> Self {
        use router_policy::SampleKind as K;
        match kind {
            K::Success => Self::Success(waited),
            K::Failure => Self::Failure(waited),
            K::Timeout => Self::Timeout(waited),
            K::RateLimited => Self::RateLimited(waited, retry_after),
            K::Cancelled => Self::Cancelled(waited),
        }
    }

    /// The latency this sample adds to the pool's window, if any: answers
    /// and timeouts count, failures do not.
    #[inline]
    fn window_latency(self) -> Option<Duration> {
        match self {
            Sample::Success(d) | Sample::Timeout(d) | Sample::Cancelled(d) => Some(d),
            Sample::Failure(_) | Sample::RateLimited(..) => None,
        }
    }
}

/// An endpoint's EWMA (seconds) after folding in `sample`.
#[inline]
pub(super) fn fold_ewma(ewma: Option<f64>, sample: Sample, q: &QueueSettings) -> f64 {
    let value = match sample {
        Sample::Success(d) | Sample::Cancelled(d) => d.as_secs_f64(),
        Sample::Failure(d) | Sample::Timeout(d) | Sample::RateLimited(d, _) => {
            failure_sample(d.as_secs_f64(), q.latency_threshold_s)
        }
    };
    q.scoring.update(ewma, value, q.ewma_alpha)
}

/// A pool's recent latencies and their cached p95.
///
/// Each sample remembers its endpoint, so that the p95 can leave out the
/// endpoints that take no traffic now (an endpoint that hangs, now suspect
/// or ejected or with its circuit open): the planner asks how long an
/// attempt *here* would take, and that attempt goes to the others. Without
/// this, one hanging endpoint's timeouts would make the planner skip a
/// pool whose other endpoints answer in milliseconds.
#[derive(Debug, Default)]
pub(super) struct LatencyWindow {
    samples: VecDeque<(Instant, Duration, u64)>,
    /// The p95 of `samples` (less the endpoints left out), when it was
    /// computed, and which endpoints were left out.
    p95_cache: Option<(Instant, Option<Duration>)>,
    p95_left_out: Vec<u64>,
    /// `samples` changed since the p95 was computed.
    dirty: bool,
}

impl LatencyWindow {
    /// Adds `sample` of endpoint `endpoint`, taken at `now`, if it carries
    /// a service latency.
    #[inline]
    pub(super) fn record(&mut self, sample: Sample, endpoint: u64, now: Instant) {
        if let Some(d) = sample.window_latency() {
            self.samples.push_back((now, d, endpoint));
            if self.samples.len() > LATENCY_WINDOW {
                self.samples.pop_front();
            }
            self.dirty = true;
        }
    }

    /// Drops the samples older than [`LATENCY_MAX_AGE`] as of `now`.
    #[inline]
    pub(super) fn expire(&mut self, now: Instant) {
        while self
            .samples
            .front()
            .is_some_and(|(at, _, _)| now.saturating_duration_since(*at) > LATENCY_MAX_AGE)
        {
            self.samples.pop_front();
            self.dirty = true;
        }
    }

    /// The p95 of the window as of `now`, leaving out the samples of the
    /// endpoints in `left_out`; `None` when nothing is left (call
    /// [`Self::expire`] first).
    #[inline]
    pub(super) fn p95(&mut self, now: Instant, left_out: &[u64]) -> Option<Duration> {
        if let Some((at, cached)) = self.p95_cache {
            let fresh_enough = now.saturating_duration_since(at) < P95_REFRESH;
            // The first samples (or the last ones expiring) always count.
            let emptiness_changed = cached.is_some() == self.samples.is_empty();
            let same_left_out = self.p95_left_out == left_out;
            if same_left_out && (!self.dirty || (fresh_enough && !emptiness_changed)) {
                return cached;
            }
        }
        let p95 = self.compute_p95(left_out);
        self.p95_cache = Some((now, p95));
        if self.p95_left_out != left_out {
            self.p95_left_out = left_out.to_vec();
        }
        self.dirty = false;
        p95
    }

    /// Each of `endpoints`' p95 (in the same order) over its samples in the
    /// window younger than [`LATENCY_MAX_AGE`] as of `now`; `None` for an
    /// endpoint without one. Not cached: for status, not the request path.
    pub(super) fn endpoint_p95s(&self, endpoints: &[u64], now: Instant) -> Vec<Option<Duration>> {
        let mut mine: Vec<Duration> = Vec::with_capacity(self.samples.len());
        endpoints
            .iter()
            .map(|id| {
                mine.clear();
                mine.extend(
                    self.samples
                        .iter()
                        .filter(|(at, _, e)| {
                            e == id && now.saturating_duration_since(*at) <= LATENCY_MAX_AGE
                        })
                        .map(|(_, d, _)| *d),
                );
                percentile_95(&mut mine)
            })
            .collect()
    }

    fn compute_p95(&self, left_out: &[u64]) -> Option<Duration> {
        let mut v: Vec<Duration> = self
            .samples
            .iter()
            .filter(|(_, _, e)| !left_out.contains(e))
            .map(|(_, d, _)| *d)
            .collect();
        percentile_95(&mut v)
    }
}

/// The 95th percentile of `v` (nearest rank; sorts it); `None` when empty.
fn percentile_95(v: &mut [Duration]) -> Option<Duration> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let rank = (v.len() * 95).div_ceil(100).max(1) - 1;
    v.get(rank).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_policy::Scoring;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_p95_is_the_95th_percentile_of_answers_and_timeouts() {
        let now = Instant::now();
        let mut w = LatencyWindow::default();
        assert_eq!(w.p95(now, &[]), None);
        for ms in 1..=100 {
            w.record(Sample::Success(MS * ms), 0, now);
        }
        // Failures carry no service time.
        w.record(Sample::Failure(MS * 10_000), 0, now);
        w.record(Sample::RateLimited(MS * 10_000, None), 0, now);
        assert_eq!(w.p95(now, &[]), Some(MS * 95));
        w.record(Sample::Timeout(MS * 10_000), 0, now + P95_REFRESH);
        assert_eq!(w.p95(now + P95_REFRESH, &[]), Some(MS * 96));
    }

    #[test]
    fn the_p95_leaves_out_the_endpoints_that_take_no_traffic() {
        let now = Instant::now();
        let mut w = LatencyWindow::default();
        for _ in 0..19 {
            w.record(Sample::Success(MS * 5), 1, now);
        }
        w.record(Sample::Timeout(MS * 400), 2, now);
        w.record(Sample::Timeout(MS * 400), 2, now);
        assert_eq!(w.p95(now, &[]), Some(MS * 400), "the hanging one counts");
        assert_eq!(w.p95(now, &[2]), Some(MS * 5), "left out at once");
        assert_eq!(w.p95(now, &[]), Some(MS * 400), "and back");
        assert_eq!(w.p95(now, &[1, 2]), None);
    }

    #[test]
    fn each_endpoint_has_the_p95_of_its_own_recent_samples() {
        let now = Instant::now();
        let mut w = LatencyWindow::default();
        for ms in 1..=20 {
            w.record(Sample::Success(MS * ms), 1, now);
        }
        w.record(Sample::Timeout(MS * 400), 2, now);
        // A failure carries no service time, for the endpoint either.
        w.record(Sample::Failure(MS * 9_000), 3, now);
        assert_eq!(
            w.endpoint_p95s(&[1, 2, 3], now),
            [Some(MS * 19), Some(MS * 400), None]
        );
        // Past the minute, none counts (with or without `expire`).
        let late = now + LATENCY_MAX_AGE + MS;
        assert_eq!(w.endpoint_p95s(&[1, 2], late), [None, None]);
    }

    #[test]
    fn the_window_keeps_the_latest_samples_only() {
        let now = Instant::now();
        let mut w = LatencyWindow::default();
        for _ in 0..LATENCY_WINDOW {
            w.record(Sample::Success(MS * 500), 0, now);
        }
        for _ in 0..LATENCY_WINDOW {
            w.record(Sample::Success(MS), 0, now);
        }
        assert_eq!(w.p95(now, &[]), Some(MS));
    }

    #[test]
    fn the_p95_is_cached_under_load_but_the_first_and_last_samples_show_at_once() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::default();
        assert_eq!(w.p95(t0, &[]), None);
        w.record(Sample::Success(MS * 10), 0, t0);
        assert_eq!(
            w.p95(t0, &[]),
            Some(MS * 10),
            "the first sample shows at once"
        );
        w.record(Sample::Success(MS * 900), 0, t0);
        w.record(Sample::Success(MS * 900), 0, t0);
        let t1 = t0 + P95_REFRESH - MS;
        assert_eq!(w.p95(t1, &[]), Some(MS * 10), "cached until the refresh");
        assert_eq!(w.p95(t0 + P95_REFRESH, &[]), Some(MS * 900));
        // All samples age out: empty at once, even within the refresh.
        let late = t0 + LATENCY_MAX_AGE + MS;
        w.expire(late);
        assert_eq!(w.p95(late, &[]), None);
    }

    #[test]
    fn samples_count_for_a_minute() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::default();
        w.record(Sample::Success(MS * 300), 0, t0);
        w.record(Sample::Success(MS * 100), 0, t0 + MS * 1000);
        w.expire(t0 + LATENCY_MAX_AGE);
        assert_eq!(w.p95(t0 + LATENCY_MAX_AGE, &[]), Some(MS * 300));
        // Past the minute (and the cache's refresh): gone.
        let t1 = t0 + LATENCY_MAX_AGE + P95_REFRESH;
        w.expire(t1);
        assert_eq!(w.p95(t1, &[]), Some(MS * 100));
    }

    #[test]
    fn a_failure_folds_in_as_at_least_the_threshold() {
        let q = QueueSettings {
            max_size: 1,
            timeout: MS,
            latency_threshold_s: 3.0,
            ewma_alpha: 0.5,
            scoring: Scoring::LowestEwma,
            engine: Default::default(),
        };
        assert_eq!(fold_ewma(None, Sample::Success(MS * 100), &q), 0.1);
        assert_eq!(fold_ewma(None, Sample::Failure(MS), &q), 3.0);
        assert_eq!(fold_ewma(None, Sample::RateLimited(MS, None), &q), 3.0);
        assert_eq!(fold_ewma(None, Sample::Timeout(MS * 5000), &q), 5.0);
        assert_eq!(fold_ewma(Some(1.0), Sample::Success(MS * 2000), &q), 1.5);
    }
}
