//! Capacity probes: when what a probe has said of an endpoint lets it take
//! requests.
//!
//! A pool with a `capacity_probe` polls each endpoint every `interval`
//! (Ollama's `/api/ps`, an engine's `/metrics`), each poll bounded by its
//! own `timeout`, and an endpoint takes requests only on what a probe said
//! of it. The rule:
//!
//! - **Its own timeout, not the interval.** A probe waits up to `timeout`
//!   (default [`DEFAULT_TIMEOUT`], 1 s) whatever the interval. A probe
//!   bounded by its interval was fragile: with a 50 ms interval on a loaded
//!   machine, engines that were fine answered a little late, every probe
//!   timed out, and their pool answered `503 no_backend`.
//! - **One failure marks nothing.** An endpoint is unusable only after
//!   `unhealthy_after` probes in a row failed (timed out, refused, an
//!   answer that does not parse; default [`DEFAULT_UNHEALTHY_AFTER`], 3, as
//!   health checks' `unhealthy_after`). Until then the last answer counts,
//!   its numbers too (free VRAM, requests waiting): one late probe says
//!   nothing new about the engine. One answer clears the count.
//! - **Never answered is not healthy.** An endpoint no probe has answered
//!   yet takes no requests (unknown is not fine).
//! - **A last answer goes stale** ([`max_age`]): older than
//!   `unhealthy_after` rounds, each at most `interval + timeout` long (a
//!   round waits for its slowest probe, then the interval), it no longer
//!   counts. Failures are counted before that bound is reached; the bound
//!   is what holds when no probe finishes at all (a stuck task).

use std::time::Duration;

use crate::document::Probe;

/// Default poll interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default timeout of one probe.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default failed probes in a row before an endpoint is unusable.
pub const DEFAULT_UNHEALTHY_AFTER: u32 = 3;

/// What the probes have said of one endpoint, as the rule needs it: whether
/// one has answered yet, and how many failed in a row since the last
/// answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProbeRecord {
    /// A probe has answered (and its answer parsed) at least once.
    pub answered: bool,
    /// Probes failed in a row since the last answer (or since the start).
    pub failures: u32,
}

impl ProbeRecord {
    /// The record after a probe answered.
    #[must_use]
    pub fn after_answer(self) -> Self {
        Self {
            answered: true,
            failures: 0,
        }
    }

    /// The record after a probe failed.
    #[must_use]
    pub fn after_failure(self) -> Self {
        Self {
            answered: self.answered,
            failures: self.failures.saturating_add(1),
        }
    }
}

/// How old the last answer may be and still count: `unhealthy_after`
/// rounds of at most `interval + timeout` each.
pub fn max_age(probe: &Probe) -> Duration {
    probe
        .interval
        .saturating_add(probe.timeout)
        .saturating_mul(probe.unhealthy_after.max(1))
}

/// Whether `record`, whose last answer is `since_answer` old, lets the
/// endpoint take requests (see the module docs).
pub fn admits(probe: &Probe, record: ProbeRecord, since_answer: Duration) -> bool {
    record.answered
        && record.failures < probe.unhealthy_after.max(1)
        && since_answer <= max_age(probe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProbeKind;

    fn probe(interval_ms: u64, timeout_ms: u64, unhealthy_after: u32) -> Probe {
        Probe {
            kind: ProbeKind::Vllm,
            interval: Duration::from_millis(interval_ms),
            timeout: Duration::from_millis(timeout_ms),
            unhealthy_after,
            vram_total_mb: None,
        }
    }

    #[test]
    fn one_failure_marks_nothing_and_unhealthy_after_in_a_row_do() {
        let p = probe(50, 1000, 3);
        let fresh = Duration::ZERO;
        let ok = ProbeRecord::default().after_answer();
        assert!(admits(&p, ok, fresh));
        let one = ok.after_failure();
        assert!(admits(&p, one, fresh), "one late probe marks nothing");
        let two = one.after_failure();
        assert!(admits(&p, two, fresh));
        let three = two.after_failure();
        assert!(!admits(&p, three, fresh), "three in a row do");
        // One answer clears the count.
        assert!(admits(&p, three.after_answer(), fresh));
        // Failures not in a row never add up.
        let mut r = ok;
        for _ in 0..100 {
            r = r.after_failure().after_failure().after_answer();
            assert!(admits(&p, r, fresh));
        }
    }

    #[test]
    fn never_answered_is_not_healthy() {
        let p = probe(1000, 1000, 3);
        assert!(!admits(&p, ProbeRecord::default(), Duration::ZERO));
        assert!(!admits(
            &p,
            ProbeRecord::default().after_failure(),
            Duration::ZERO
        ));
    }

    #[test]
    fn unhealthy_after_one_is_the_strict_rule() {
        let p = probe(1000, 1000, 1);
        let ok = ProbeRecord::default().after_answer();
        assert!(admits(&p, ok, Duration::ZERO));
        assert!(!admits(&p, ok.after_failure(), Duration::ZERO));
        // Zero (refused by validation) behaves as one, never as "never".
        let p = probe(1000, 1000, 0);
        assert!(!admits(&p, ok.after_failure(), Duration::ZERO));
    }

    #[test]
    fn a_last_answer_counts_for_unhealthy_after_rounds_of_interval_plus_timeout() {
        // 50 ms interval, 1 s timeout: a late round is not a stale one.
        let p = probe(50, 1000, 3);
        assert_eq!(max_age(&p), Duration::from_millis(3 * 1050));
        let ok = ProbeRecord::default().after_answer();
        assert!(admits(&p, ok, Duration::from_millis(1000)));
        assert!(admits(&p, ok, Duration::from_millis(3150)));
        assert!(!admits(&p, ok, Duration::from_millis(3151)));
        // Saturates instead of overflowing.
        let huge = Probe {
            interval: Duration::MAX,
            ..probe(1, 1, u32::MAX)
        };
        assert_eq!(max_age(&huge), Duration::MAX);
        assert!(admits(&huge, ok, Duration::MAX));
    }
}
