//! Percentiles and the machine's load, as the benchmarks report them.

use std::time::Duration;

/// The `p` quantile of `sorted` (nearest rank), in milliseconds; 0 for
/// no samples.
pub fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[rank].as_secs_f64() * 1e3
}

/// `/proc/loadavg`'s first three fields (the machine's other load shows
/// in the tail).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(pct(&ms, 0.5), 50.0);
        assert_eq!(pct(&ms, 0.99), 99.0);
        assert_eq!(pct(&ms, 1.0), 100.0);
        assert_eq!(pct(&ms, 0.0), 1.0);
        assert_eq!(pct(&[], 0.5), 0.0);
    }
}
