//! Deadline accounting: how long an attempt may take, and when a pool is
//! skipped because it cannot answer in time.
//!
//! A request has an end-to-end budget (its deadline). It walks its route's
//! chain of pools; before trying a pool, [`plan_attempt`] decides:
//!
//! 1. **Reserve for the next pool.** If there is a pool after this one, its
//!    p95 latency is kept back: this attempt may spend only
//!    `remaining − reserve`, so that if it fails the fallback still has the
//!    time it usually needs.
//! 2. **Attempt timeout.** The attempt's timeout is the smaller of the
//!    configured `attempt_timeout_ms` (pool, else route, else defaults) and
//!    that budget. The timeout covers the queue wait and the wait for the
//!    answer's first byte.
//! 3. **Skip what cannot fit.** The pool's expected cost is its expected
//!    queue wait plus its p95 latency. If that is at least the attempt's
//!    timeout, the attempt would almost surely time out and burn slack the
//!    fallback needs: the pool is skipped at once, with that reason. A pool
//!    that is busy and has no measurements to estimate its wait is skipped
//!    too, unless it is the last candidate (then waiting is the only hope).
//!
//! Without a deadline, only the attempt timeout bounds an attempt and
//! nothing is skipped for time.
//!
//! All of this is arithmetic on [`Duration`]s: the clock is read by the
//! caller, so the rules are tested without any runtime.

use std::fmt;
use std::time::Duration;

/// What is known about a pool's ability to answer now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolOutlook {
    /// An endpoint could take the request right now (no queueing).
    pub free_now: bool,
    /// Estimated queue wait when not free now; `None` when unknown.
    pub expected_wait: Option<Duration>,
    /// Recent p95 latency (time to first byte, timeouts counted at their
    /// timeout); `None` without measurements.
    pub p95: Option<Duration>,
}

/// Why a pool was passed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The deadline is already spent (or entirely reserved for the next pool).
    NoTimeLeft {
        /// What was reserved for the next pool.
        reserved: Duration,
    },
    /// Expected wait plus latency does not fit the attempt's timeout.
    TooSlow {
        /// Expected queue wait.
        wait: Duration,
        /// p95 latency.
        latency: Duration,
        /// The time this attempt could have.
        budget: Duration,
    },
    /// Busy, with nothing to estimate the wait from, and another pool after it.
    BusyUnmeasured,
}

impl SkipReason {
    /// A label: `no_time_left`, `too_slow`, `busy_unmeasured`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoTimeLeft { .. } => "no_time_left",
            Self::TooSlow { .. } => "too_slow",
            Self::BusyUnmeasured => "busy_unmeasured",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoTimeLeft { reserved } if reserved.is_zero() => {
                write!(f, "no time left before the deadline")
            }
            Self::NoTimeLeft { reserved } => write!(
                f,
                "no time left after reserving {} ms for the next pool",
                reserved.as_millis()
            ),
            Self::TooSlow {
                wait,
                latency,
                budget,
            } => write!(
                f,
                "expected wait {} ms + p95 {} ms does not fit the {} ms this attempt can have",
                wait.as_millis(),
                latency.as_millis(),
                budget.as_millis()
            ),
            Self::BusyUnmeasured => write!(f, "busy and not yet measured; trying the next pool"),
        }
    }
}

/// The decision for one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptPlan {
    /// Try it, bounded by this timeout (`None`: no bound).
    Try {
        /// Attempt timeout.
        timeout: Option<Duration>,
    },
    /// Pass it over.
    Skip(SkipReason),
}

/// Inputs of [`plan_attempt`] besides the pool's outlook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    /// What is left of the deadline; `None` for no deadline.
    pub remaining: Option<Duration>,
    /// The configured attempt timeout; `None` for none.
    pub attempt_timeout: Option<Duration>,
    /// p95 of the next pool that could take the request; `None` when this
    /// is the last candidate or the next one is unmeasured.
    pub next_p95: Option<Duration>,
    /// True when no pool after this one could take the request.
    pub last_candidate: bool,
}

/// Decides whether to try a pool and with what timeout.
pub fn plan_attempt(budget: Budget, outlook: PoolOutlook) -> AttemptPlan {
    let reserved = if budget.last_candidate {
        Duration::ZERO
    } else {
        budget.next_p95.unwrap_or(Duration::ZERO)
    };
    let share = budget.remaining.map(|r| r.saturating_sub(reserved));
    if share.is_some_and(|s| s.is_zero()) {
        return AttemptPlan::Skip(SkipReason::NoTimeLeft { reserved });
    }
    let timeout = match (share, budget.attempt_timeout) {
        (Some(s), Some(t)) => Some(s.min(t)),
        (s, t) => s.or(t),
    };
    let wait = if outlook.free_now {
        Some(Duration::ZERO)
    } else {
        outlook.expected_wait
    };
    if let (Some(t), Some(latency)) = (timeout, outlook.p95) {
        let wait = wait.unwrap_or(Duration::ZERO);
        if wait + latency >= t {
            return AttemptPlan::Skip(SkipReason::TooSlow {
                wait,
                latency,
                budget: t,
            });
        }
    }
    if let (Some(t), Some(w)) = (timeout, wait) {
        if w >= t {
            return AttemptPlan::Skip(SkipReason::TooSlow {
                wait: w,
                latency: outlook.p95.unwrap_or(Duration::ZERO),
                budget: t,
            });
        }
    }
    if wait.is_none() && !budget.last_candidate && timeout.is_some() {
        return AttemptPlan::Skip(SkipReason::BusyUnmeasured);
    }
    AttemptPlan::Try { timeout }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn free(p95: Option<u64>) -> PoolOutlook {
        PoolOutlook {
            free_now: true,
            expected_wait: None,
            p95: p95.map(ms),
        }
    }

    #[test]
    fn the_attempt_timeout_is_the_smaller_of_config_and_deadline_share() {
        // The drill: 8 s deadline, 3 s primary attempt, fallback p95 0.4 s.
        let b = Budget {
            remaining: Some(ms(8000)),
            attempt_timeout: Some(ms(3000)),
            next_p95: Some(ms(400)),
            last_candidate: false,
        };
        assert_eq!(
            plan_attempt(b, free(None)),
            AttemptPlan::Try {
                timeout: Some(ms(3000))
            }
        );
        // Later in the deadline the reserve decides.
        let b = Budget {
            remaining: Some(ms(2000)),
            ..b
        };
        assert_eq!(
            plan_attempt(b, free(None)),
            AttemptPlan::Try {
                timeout: Some(ms(1600))
            }
        );
    }

    #[test]
    fn the_last_candidate_keeps_the_whole_remainder() {
        let b = Budget {
            remaining: Some(ms(4600)),
            attempt_timeout: None,
            next_p95: Some(ms(400)),
            last_candidate: true,
        };
        assert_eq!(
            plan_attempt(b, free(Some(400))),
            AttemptPlan::Try {
                timeout: Some(ms(4600))
            }
        );
    }

    #[test]
    fn a_pool_that_cannot_answer_in_time_is_skipped() {
        // The primary timed out at 3 s last time: it cannot fit 3 s.
        let b = Budget {
            remaining: Some(ms(8000)),
            attempt_timeout: Some(ms(3000)),
            next_p95: Some(ms(400)),
            last_candidate: false,
        };
        assert_eq!(
            plan_attempt(b, free(Some(3000))),
            AttemptPlan::Skip(SkipReason::TooSlow {
                wait: ms(0),
                latency: ms(3000),
                budget: ms(3000)
            })
        );
        // A degraded fallback (7 s) with 4.6 s left.
        let b = Budget {
            remaining: Some(ms(4600)),
            attempt_timeout: None,
            next_p95: None,
            last_candidate: true,
        };
        let plan = plan_attempt(b, free(Some(7000)));
        assert!(matches!(
            plan,
            AttemptPlan::Skip(SkipReason::TooSlow { .. })
        ));
        if let AttemptPlan::Skip(r) = plan {
            assert_eq!(
                r.to_string(),
                "expected wait 0 ms + p95 7000 ms does not fit the 4600 ms this attempt can have"
            );
        }
    }

    #[test]
    fn queue_wait_counts() {
        let b = Budget {
            remaining: Some(ms(1000)),
            attempt_timeout: None,
            next_p95: None,
            last_candidate: true,
        };
        let busy = PoolOutlook {
            free_now: false,
            expected_wait: Some(ms(700)),
            p95: Some(ms(300)),
        };
        assert!(matches!(
            plan_attempt(b, busy),
            AttemptPlan::Skip(SkipReason::TooSlow { .. })
        ));
        let busy = PoolOutlook {
            expected_wait: Some(ms(600)),
            ..busy
        };
        assert_eq!(
            plan_attempt(b, busy),
            AttemptPlan::Try {
                timeout: Some(ms(1000))
            }
        );
    }

    #[test]
    fn busy_and_unmeasured_is_skipped_unless_last() {
        let busy = PoolOutlook {
            free_now: false,
            expected_wait: None,
            p95: None,
        };
        let b = Budget {
            remaining: Some(ms(8000)),
            attempt_timeout: Some(ms(3000)),
            next_p95: None,
            last_candidate: false,
        };
        assert_eq!(
            plan_attempt(b, busy),
            AttemptPlan::Skip(SkipReason::BusyUnmeasured)
        );
        let b = Budget {
            last_candidate: true,
            ..b
        };
        assert_eq!(
            plan_attempt(b, busy),
            AttemptPlan::Try {
                timeout: Some(ms(3000))
            }
        );
    }

    #[test]
    fn no_time_left() {
        let b = Budget {
            remaining: Some(ms(300)),
            attempt_timeout: Some(ms(3000)),
            next_p95: Some(ms(400)),
            last_candidate: false,
        };
        let plan = plan_attempt(b, free(None));
        assert_eq!(
            plan,
            AttemptPlan::Skip(SkipReason::NoTimeLeft { reserved: ms(400) })
        );
        let b = Budget {
            remaining: Some(Duration::ZERO),
            last_candidate: true,
            ..b
        };
        assert_eq!(
            plan_attempt(b, free(None)),
            AttemptPlan::Skip(SkipReason::NoTimeLeft {
                reserved: Duration::ZERO
            })
        );
    }

    #[test]
    fn without_a_deadline_only_the_attempt_timeout_bounds() {
        let b = Budget {
            remaining: None,
            attempt_timeout: None,
            next_p95: Some(ms(400)),
            last_candidate: false,
        };
        assert_eq!(
            plan_attempt(b, free(Some(60_000))),
            AttemptPlan::Try { timeout: None }
        );
    }
}
