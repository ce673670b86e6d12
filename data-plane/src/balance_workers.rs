//! Which worker thread a new client connection goes to.
//!
//! A connection, and every request on it, lives on one worker thread (see
//! `start_workers` in `lib.rs`). Two ways to place connections:
//!
//! - [`ConnectionBalance::Pack`] (the default): the lowest-numbered worker
//!   that was less than half busy over the last sampling window takes the
//!   connection; when every worker is at least half busy, the least busy
//!   one does. Under light load every connection shares one thread, whose
//!   event loop then handles many sockets per wake-up and whose caches
//!   stay warm; the proxy also takes as little CPU as it can from whatever
//!   shares its machine (a sidecar's application, the model server). More
//!   threads join as load grows. This is how nginx behaves by default
//!   (`EPOLLEXCLUSIVE` wakes the first idle worker), and why it measured
//!   faster than spreading on small machines (see docs/benchmarks.md).
//!   The cost: load is judged when a connection *opens*, so a few
//!   long-lived connections opened while the proxy was idle stay on one
//!   thread even if their traffic grows later.
//! - [`ConnectionBalance::Spread`]: round-robin over all workers, for
//!   clients that open few connections and push heavy traffic over each.
//!
//! Busy time comes from each worker runtime's own accounting
//! ([`tokio::runtime::RuntimeMetrics::worker_total_busy_duration`]),
//! sampled at most every [`SAMPLE_EVERY`] by the accept loop: no cost on
//! the request path.

use std::time::Duration;

use tokio::time::Instant;

/// How often the workers' busy time is re-read.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Below this fraction of busy time a worker still takes new connections
/// in [`ConnectionBalance::Pack`] mode.
pub(crate) const PACK_BELOW: f64 = 0.5;

/// How new connections are placed on worker threads
/// (`CUSTOM_ROUTER_CONNECTION_BALANCE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConnectionBalance {
    /// The first worker that is less than half busy (see the module docs).
    #[default]
    Pack,
    /// Round-robin over every worker.
    Spread,
}

impl ConnectionBalance {
    /// Parses `pack` or `spread`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "pack" => Some(Self::Pack),
            "spread" => Some(Self::Spread),
            _ => None,
        }
    }
}

/// The placement state of the accept loop: busy fractions of the workers
/// over the last window, and the round-robin cursor.
#[derive(Debug)]
pub(crate) struct WorkerChooser {
    mode: ConnectionBalance,
    /// Busy fraction of each worker over the last sampling window.
    busy: Vec<f64>,
    /// Each worker's total busy time at the last sample.
    last_total: Vec<Duration>,
    last_sample: Option<Instant>,
    next: usize,
}

impl WorkerChooser {
    /// A chooser over `workers` workers (at least one).
    pub(crate) fn new(mode: ConnectionBalance, workers: usize) -> Self {
        let n = workers.max(1);
        Self {
            mode,
            busy: vec![0.0; n],
            last_total: vec![Duration::ZERO; n],
            last_sample: None,
            next: 0,
        }
    }

    /// Whether [`Self::sample`] is due at `now`.
    pub(crate) fn sample_due(&self, now: Instant) -> bool {
        self.mode == ConnectionBalance::Pack
            && self
                .last_sample
                .is_none_or(|t| now.saturating_duration_since(t) >= SAMPLE_EVERY)
    }

    /// Folds in each worker's total busy time, read at `now`.
    pub(crate) fn sample(&mut self, now: Instant, totals: &[Duration]) {
        if let Some(last) = self.last_sample {
            let window = now.saturating_duration_since(last).as_secs_f64();
            if window > 0.0 {
                for (i, total) in totals.iter().enumerate().take(self.busy.len()) {
                    let spent = total.saturating_sub(self.last_total[i]).as_secs_f64();
                    self.busy[i] = (spent / window).clamp(0.0, 1.0);
                }
            }
        }
        for (i, total) in totals.iter().enumerate().take(self.last_total.len()) {
            self.last_total[i] = *total;
        }
        self.last_sample = Some(now);
    }

    /// The worker for the next connection.
    pub(crate) fn choose(&mut self) -> usize {
        match self.mode {
            ConnectionBalance::Spread => {
                let i = self.next % self.busy.len();
                self.next = self.next.wrapping_add(1);
                i
            }
            ConnectionBalance::Pack => pack(&self.busy),
        }
    }
}

/// The first worker less than [`PACK_BELOW`] busy, else the least busy.
fn pack(busy: &[f64]) -> usize {
    if let Some(i) = busy.iter().position(|b| *b < PACK_BELOW) {
        return i;
    }
    let mut best = 0;
    for (i, b) in busy.iter().enumerate() {
        if *b < busy[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn idle_workers_pack_onto_the_first() {
        let mut c = WorkerChooser::new(ConnectionBalance::Pack, 4);
        assert_eq!((0..10).map(|_| c.choose()).collect::<Vec<_>>(), vec![0; 10]);
    }

    #[test]
    fn a_busy_worker_passes_new_connections_on() {
        let t0 = Instant::now();
        let mut c = WorkerChooser::new(ConnectionBalance::Pack, 3);
        c.sample(t0, &[ms(0), ms(0), ms(0)]);
        // Worker 0 busy 80 of 100 ms, worker 1 30 of 100 ms.
        c.sample(t0 + ms(100), &[ms(80), ms(30), ms(0)]);
        assert_eq!(c.choose(), 1);
        // Worker 1 now busy too: worker 2.
        c.sample(t0 + ms(200), &[ms(160), ms(90), ms(0)]);
        assert_eq!(c.choose(), 2);
        // All at least half busy: the least busy (worker 1, 55%).
        c.sample(t0 + ms(300), &[ms(250), ms(145), ms(60)]);
        assert_eq!(c.choose(), 1);
        // Worker 0 quiet again: back to it.
        c.sample(t0 + ms(400), &[ms(260), ms(200), ms(120)]);
        assert_eq!(c.choose(), 0);
    }

    #[test]
    fn sampling_is_due_every_window_and_only_when_packing() {
        let t0 = Instant::now();
        let mut c = WorkerChooser::new(ConnectionBalance::Pack, 2);
        assert!(c.sample_due(t0));
        c.sample(t0, &[ms(0), ms(0)]);
        assert!(!c.sample_due(t0 + ms(50)));
        assert!(c.sample_due(t0 + SAMPLE_EVERY));
        let s = WorkerChooser::new(ConnectionBalance::Spread, 2);
        assert!(!s.sample_due(t0));
    }

    #[test]
    fn spread_is_round_robin() {
        let mut c = WorkerChooser::new(ConnectionBalance::Spread, 3);
        assert_eq!(
            (0..7).map(|_| c.choose()).collect::<Vec<_>>(),
            vec![0, 1, 2, 0, 1, 2, 0]
        );
    }

    #[test]
    fn parse_names() {
        assert_eq!(
            ConnectionBalance::parse(" pack"),
            Some(ConnectionBalance::Pack)
        );
        assert_eq!(
            ConnectionBalance::parse("spread"),
            Some(ConnectionBalance::Spread)
        );
        assert_eq!(ConnectionBalance::parse("even"), None);
    }
}
