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

/// p50, p90 and p99 of `sorted`, in milliseconds.
pub fn p50_p90_p99(sorted: &[Duration]) -> (f64, f64, f64) {
    (pct(sorted, 0.5), pct(sorted, 0.9), pct(sorted, 0.99))
}

/// The flags of a benchmark that samples kinds of request in alternating
/// blocks ([`in_alternating_blocks`]).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Blocks {
    /// Requests of each kind.
    #[arg(long, default_value_t = 5000)]
    pub requests: usize,
    /// Requests per block (kinds alternate block by block).
    #[arg(long, default_value_t = 250)]
    pub block: usize,
    /// Warm-up requests of each kind (not counted).
    #[arg(long, default_value_t = 500)]
    pub warmup: usize,
}

impl Blocks {
    /// [`in_alternating_blocks`] with these flags.
    pub async fn sample<K, E, F, Fut>(&self, kinds: &[K], one: F) -> Result<Vec<Vec<Duration>>, E>
    where
        K: Copy,
        F: FnMut(K) -> Fut,
        Fut: std::future::Future<Output = Result<Duration, E>>,
    {
        in_alternating_blocks(kinds, self.requests, self.block.max(1), one).await
    }
}

/// Each kind's latencies (`one(kind)`, one request), sampled in
/// alternating blocks of `block` requests until each kind has
/// `requests`, so that the machine's other load falls on every kind
/// alike; each kind's list sorted.
pub async fn in_alternating_blocks<K, E, F, Fut>(
    kinds: &[K],
    requests: usize,
    block: usize,
    mut one: F,
) -> Result<Vec<Vec<Duration>>, E>
where
    K: Copy,
    F: FnMut(K) -> Fut,
    Fut: std::future::Future<Output = Result<Duration, E>>,
{
    let mut samples = vec![Vec::with_capacity(requests); kinds.len()];
    while samples.iter().any(|s| s.len() < requests) {
        for (kind, s) in kinds.iter().zip(samples.iter_mut()) {
            for _ in 0..block.min(requests.saturating_sub(s.len())) {
                s.push(one(*kind).await?);
            }
        }
    }
    for s in &mut samples {
        s.sort_unstable();
    }
    Ok(samples)
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

    #[test]
    fn kinds_are_sampled_in_alternating_blocks_to_the_same_count_and_sorted() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let mut order = Vec::new();
        let mut n = 0u64;
        let samples = rt
            .block_on(in_alternating_blocks(&['a', 'b'], 5, 2, |k| {
                order.push(k);
                n += 1;
                // Falling latencies: the lists come back sorted.
                let took = Duration::from_millis(100 - n);
                async move { Ok::<_, ()>(took) }
            }))
            .unwrap_or_else(|()| panic!("no error was returned"));
        assert_eq!(order.iter().collect::<String>(), "aabbaabbab");
        assert!(samples.iter().all(|s| s.len() == 5));
        assert!(samples.iter().all(|s| s.windows(2).all(|w| w[0] <= w[1])));
        assert_eq!(p50_p90_p99(&samples[0]).0, pct(&samples[0], 0.5));
    }
}
