//! Tenants' hourly rollups, written to the shared store as requests
//! settle (the key layout is [`router_policy::rollup`]'s, which the
//! control plane's console reads).
//!
//! Fire and forget, bounded: a settled request hands a [`Settled`] (a
//! name, four numbers) to [`Rollups::record`], which only tries to queue
//! it (no formatting, no await, no store call on the request's thread).
//! One background task takes what is queued and writes it, one `HINCRBY`
//! set per request ([`commands`]), up to [`BATCH`] requests in one
//! pipeline, each pipeline within [`crate::OP_TIMEOUT`]. When the queue
//! is full (the store is slow or down) a rollup is dropped and counted
//! (`router_shared_store_errors_total{op="rollup_dropped"}`); a write that
//! fails is counted (`{op="rollup"}`) and its rollups are lost. A request
//! never waits for, or fails because of, its rollup. Without a shared
//! store the proxy keeps no rollups.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use router_policy::rollup::{hour, key, HOURLY_TTL};
use tokio::sync::mpsc;

use crate::{bounded, RedisStore, StoreEvents};

/// Rollups queued at most; past it they are dropped and counted.
pub const QUEUE: usize = 4096;
/// Requests written in one pipeline at most.
pub const BATCH: usize = 64;

/// What one settled tenant request adds to its hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The tenant.
    pub tenant: Arc<str>,
    /// When the request arrived, Unix seconds (its hour).
    pub at_unix_secs: u64,
    /// Input plus output tokens the answers reported.
    pub tokens: u64,
    /// Spend the answers reported, micro-USD.
    pub micros: u64,
    /// Whether it ended other than `ok`.
    pub failed: bool,
}

/// The writer's counts.
#[derive(Debug, Default)]
pub struct RollupCounts {
    /// Rollups written.
    pub written: AtomicU64,
    /// Rollups dropped: the queue was full, or their write failed.
    pub dropped: AtomicU64,
}

/// The rollup queue and its writer.
pub struct Rollups {
    tx: mpsc::Sender<Settled>,
    events: Arc<dyn StoreEvents>,
    counts: Arc<RollupCounts>,
}

impl Rollups {
    /// Starts the writer (on the current runtime) for `store`.
    pub fn spawn(store: Arc<RedisStore>, events: Arc<dyn StoreEvents>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let counts = Arc::new(RollupCounts::default());
        tokio::spawn(write(rx, store, Arc::clone(&events), Arc::clone(&counts)));
        Self { tx, events, counts }
    }

    /// Queues one request's rollup; drops it (and counts) when the queue
    /// is full or the writer has stopped. Never waits.
    pub fn record(&self, s: Settled) {
        if self.tx.try_send(s).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            self.events.store_error("rollup_dropped");
        }
    }

    /// What the writer did so far.
    pub fn counts(&self) -> &RollupCounts {
        &self.counts
    }
}

/// Adds one request's `HINCRBY` set to `pipe`: `requests` always, the
/// other fields when not zero, then the hour's TTL (`prefix`: the store's,
/// `router:`).
pub fn commands(pipe: &mut redis::Pipeline, prefix: &str, s: &Settled) {
    let k = format!("{prefix}{}", key(&s.tenant, &hour(s.at_unix_secs)));
    pipe.cmd("HINCRBY").arg(&k).arg("requests").arg(1).ignore();
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if s.tokens > 0 {
        pipe.cmd("HINCRBY")
            .arg(&k)
            .arg("tokens")
            .arg(clamp(s.tokens))
            .ignore();
    }
    if s.micros > 0 {
        pipe.cmd("HINCRBY")
            .arg(&k)
            .arg("micros")
            .arg(clamp(s.micros))
            .ignore();
    }
    if s.failed {
        pipe.cmd("HINCRBY").arg(&k).arg("failed").arg(1).ignore();
    }
    let ttl_ms = u64::try_from(HOURLY_TTL.as_millis()).unwrap_or(u64::MAX);
    pipe.cmd("PEXPIRE").arg(&k).arg(ttl_ms).ignore();
}

async fn write(
    mut rx: mpsc::Receiver<Settled>,
    store: Arc<RedisStore>,
    events: Arc<dyn StoreEvents>,
    counts: Arc<RollupCounts>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let n = batch.len() as u64;
        let mut pipe = redis::pipe();
        for s in batch.drain(..) {
            commands(&mut pipe, store.prefix(), &s);
        }
        let written = match store.conn().await {
            Ok(mut conn) => bounded(pipe.query_async::<()>(&mut conn)).await,
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => {
                counts.written.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                counts.dropped.fetch_add(n, Ordering::Relaxed);
                events.store_error("rollup");
                tracing::debug!(error = %e, rollups = n, "tenant rollups not written");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settled(tokens: u64, micros: u64, failed: bool) -> Settled {
        Settled {
            tenant: Arc::from("acme"),
            // 2024-02-29T23:59:59Z.
            at_unix_secs: 1_709_251_199,
            tokens,
            micros,
            failed,
        }
    }

    #[test]
    fn a_request_is_one_hincrby_set_on_its_hour_with_a_ttl() {
        let mut pipe = redis::pipe();
        commands(&mut pipe, "router:", &settled(30, 1_500, true));
        let packed = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        let key = "router:rollup:acme:2024-02-29T23";
        assert_eq!(packed.matches("HINCRBY").count(), 4, "{packed}");
        assert_eq!(packed.matches(key).count(), 5, "{packed}");
        assert!(packed.contains("PEXPIRE"), "{packed}");
        assert!(packed.contains(&(31u64 * 86_400_000).to_string()));
        // Nothing to add: requests and the TTL only.
        let mut pipe = redis::pipe();
        commands(&mut pipe, "router:", &settled(0, 0, false));
        let packed = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        assert_eq!(packed.matches("HINCRBY").count(), 1, "{packed}");
        assert_eq!(packed.matches("PEXPIRE").count(), 1, "{packed}");
    }

    /// What a usual tenant request writes: four commands (three
    /// `HINCRBY`, a `PEXPIRE`) and their bytes on the wire, as the
    /// benchmarks page says.
    #[test]
    fn a_usual_request_writes_four_commands_of_about_300_bytes() {
        let mut pipe = redis::pipe();
        let s = Settled {
            tenant: Arc::from("team-search"),
            at_unix_secs: 1_709_251_199,
            tokens: 1_234,
            micros: 5_678,
            failed: false,
        };
        commands(&mut pipe, "router:", &s);
        assert_eq!(pipe.cmd_iter().count(), 4);
        let bytes = pipe.get_packed_pipeline().len();
        println!("rollup of a usual request: 4 commands, {bytes} bytes");
        assert!((250..=350).contains(&bytes), "{bytes} bytes");
    }

    /// What `record` costs the request's thread when the writer keeps up
    /// (docs/benchmarks.md, "The console"): rounds of 2,000 calls, each
    /// timed, then drained by a task as the writer would: `cargo test -p
    /// router-shared-state --release --lib -- --ignored --nocapture
    /// record_cost`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement: run it in release"]
    async fn record_cost() {
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let drained = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&drained);
        let drain = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut batch, BATCH).await > 0 {
                counter.fetch_add(batch.len() as u64, Ordering::Relaxed);
                batch.clear();
            }
        });
        let r = Rollups {
            tx,
            events: Arc::new(crate::NoEvents),
            counts: Arc::default(),
        };
        let tenant: Arc<str> = Arc::from("team-search");
        let (rounds, per_round) = (500u32, 2_000u32);
        let mut took = std::time::Duration::ZERO;
        for round in 0..rounds {
            let t = tokio::time::Instant::now();
            for i in 0..per_round {
                r.record(Settled {
                    tenant: Arc::clone(&tenant),
                    at_unix_secs: 1_709_251_199,
                    tokens: u64::from(i),
                    micros: 5,
                    failed: false,
                });
            }
            took += t.elapsed();
            let sent = u64::from((round + 1) * per_round);
            while drained.load(Ordering::Relaxed) < sent {
                tokio::task::yield_now().await;
            }
        }
        let calls = rounds * per_round;
        assert_eq!(r.counts().dropped.load(Ordering::Relaxed), 0, "kept up");
        println!(
            "Rollups::record: {:.0} ns a call over {calls} calls, none dropped",
            took.as_nanos() as f64 / f64::from(calls)
        );
        drop(r);
        drain.await.unwrap();
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_never_waits() {
        // A store that never connects: the writer's first batch waits on
        // nothing (conn fails fast), so fill faster than it drains by not
        // running it at all: a receiver held, never read.
        let (tx, _rx) = mpsc::channel(2);
        #[derive(Default)]
        struct Errors(std::sync::Mutex<Vec<&'static str>>);
        impl StoreEvents for Errors {
            fn idempotency(&self, _: &'static str) {}
            fn store_error(&self, op: &'static str) {
                self.0.lock().unwrap().push(op);
            }
            fn store_reset(&self) {}
        }
        let events = Arc::new(Errors::default());
        let r = Rollups {
            tx,
            events: Arc::clone(&events) as Arc<dyn StoreEvents>,
            counts: Arc::default(),
        };
        for _ in 0..5 {
            r.record(settled(1, 1, false));
        }
        assert_eq!(r.counts().dropped.load(Ordering::Relaxed), 3);
        assert_eq!(*events.0.lock().unwrap(), vec!["rollup_dropped"; 3]);
    }
}
