//! The wall clock: the one place the workspace reads `SystemTime::now`.
//!
//! Timers and durations are tokio's, so paused-time tests hold
//! (`clippy.toml` disallows `SystemTime::now` everywhere else). Wall time
//! is read only where a wall time is the point: a log's `offered_at`,
//! expiries and task times shared across machines, an answer's `created`,
//! a jitter seed. No decision of this crate reads it: they take the time
//! as an argument.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, on the wall clock.
#[allow(clippy::disallowed_methods, reason = "the one wall-clock reading")]
pub fn now() -> SystemTime {
    SystemTime::now()
}

/// Time since the Unix epoch; zero on a clock set before 1970.
pub fn since_epoch() -> Duration {
    now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO)
}

/// Now, in Unix milliseconds (saturating).
pub fn unix_ms() -> u64 {
    u64::try_from(since_epoch().as_millis()).unwrap_or(u64::MAX)
}

/// Now, in Unix milliseconds, as the signed times of the control plane's
/// messages carry it (saturating).
pub fn unix_ms_i64() -> i64 {
    i64::try_from(since_epoch().as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readings_agree_and_are_after_2020() {
        // 2020-01-01T00:00:00Z.
        const Y2020_MS: u64 = 1_577_836_800_000;
        let a = unix_ms();
        let b = u64::try_from(unix_ms_i64()).unwrap();
        let c = u64::try_from(since_epoch().as_millis()).unwrap();
        assert!(a > Y2020_MS, "{a}");
        assert!(a <= b && b <= c, "{a} {b} {c}");
    }
}
