//! Polling until a condition holds.

use std::time::Duration;

/// How long the `wait_*` helpers wait for a state change before they
/// panic: far more than any change takes, so that a loaded machine never
/// makes them fail, while they return as soon as the change is seen.
pub const WAIT_AT_MOST: Duration = Duration::from_secs(10);

/// Polls `cond` every 10 ms until it holds, or panics after `within`.
pub async fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
