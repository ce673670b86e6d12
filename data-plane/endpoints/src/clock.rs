//! Instants computed from outside input: a backend's `Retry-After`, the
//! control plane's override expiries, policy and environment durations.
//!
//! `Instant + Duration` panics when the sum cannot be represented, and a
//! panic in a request's task leaves its client without an answer (and a
//! pool's lock poisoned, if it was held). A backend answering
//! `Retry-After: 18446744073709551615` did exactly that. So every instant
//! derived from a value the proxy does not choose goes through [`later`]:
//! the duration is capped at a ceiling that makes sense for what it
//! measures, and the addition is checked.

use std::time::Duration;

use tokio::time::Instant;

/// The ceiling for durations written by an operator (policy times in
/// milliseconds or seconds, `CUSTOM_ROUTER_*` times): a year is beyond any
/// sensible setting and well within what every clock represents.
pub const A_YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// `now + after`, with `after` capped at `ceiling`; `now` itself if even
/// that cannot be represented (no clock reaches that far: a ceiling of
/// years is always representable in practice).
pub fn later(now: Instant, after: Duration, ceiling: Duration) -> Instant {
    now.checked_add(after.min(ceiling)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_and_never_overflowing() {
        let now = Instant::now();
        let hour = Duration::from_secs(3600);
        assert_eq!(
            later(now, Duration::from_secs(5), hour),
            now + Duration::from_secs(5)
        );
        assert_eq!(later(now, Duration::MAX, hour), now + hour);
        assert_eq!(later(now, Duration::MAX, Duration::MAX), now);
    }
}
