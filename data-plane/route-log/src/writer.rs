//! Where records go: [`RouteLog`], a bounded queue and the writer thread
//! that encodes and writes it out every [`FLUSH_INTERVAL`].

use std::io::Write;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::record::RouteRecord;
use crate::ring::DecisionRing;

/// Where route records go.
///
/// Each request hands its finished record over (one short lock, a move); a
/// writer thread takes the records every [`FLUSH_INTERVAL`], serialises
/// them and writes them in one go. Requests never format, wait for stdout
/// or wake the writer: the line costs the request path a push, and its
/// formatting (about 2k instructions) runs on the writer's thread, which
/// is otherwise idle. The queue is bounded: past [`MAX_QUEUED`] records,
/// records are dropped and counted (the proxy counts them in
/// `router_route_log_dropped_total`).
#[derive(Clone)]
pub struct RouteLog {
    queue: Arc<Queue>,
    on_dropped: Arc<dyn Fn() + Send + Sync>,
}

/// Something that holds a finished record: the record itself, or a
/// program's own record around it (the proxy's carries request state
/// beside the line), queued in the box it was built in, with no copy.
pub trait Line: Send + 'static {
    /// The record to write.
    fn record(&self) -> &RouteRecord;
}

impl Line for RouteRecord {
    fn record(&self) -> &RouteRecord {
        self
    }
}

/// Records waiting to be written. Boxed on purpose: a record is built in a
/// box by the request (it moves around the request path as a pointer) and
/// queued as one.
type Queue = Mutex<Vec<Box<dyn Line>>>;

/// How often queued records are written out.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(10);
/// Records held at most between two writes (about 10 MB of lines).
pub const MAX_QUEUED: usize = 16 * 1024;

impl RouteLog {
    /// Starts the writer thread on `out` (stdout in production). The thread
    /// writes what is left and ends when every `RouteLog` is dropped.
    /// `on_dropped` runs for each record dropped because the queue was
    /// full (the proxy counts them).
    pub fn spawn(
        out: Box<dyn Write + Send>,
        on_dropped: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        Self::spawn_with_ring(out, on_dropped, None)
    }

    /// [`RouteLog::spawn`], and the writer thread also keeps the lines it
    /// wrote in `ring` (the last N records, for the console), one lock per
    /// flush: nothing more on the request path.
    pub fn spawn_with_ring(
        out: Box<dyn Write + Send>,
        on_dropped: impl Fn() + Send + Sync + 'static,
        ring: Option<Arc<DecisionRing>>,
    ) -> std::io::Result<Self> {
        let queue = Arc::new(Mutex::new(Vec::with_capacity(1024)));
        let weak = Arc::downgrade(&queue);
        std::thread::Builder::new()
            .name("route-log".into())
            .spawn(move || write_lines(&weak, out, ring.as_deref()))?;
        Ok(Self {
            queue,
            on_dropped: Arc::new(on_dropped),
        })
    }

    /// Queues one record; drops it (and counts) if the queue is full.
    pub fn emit(&self, record: Box<dyn Line>) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.len() >= MAX_QUEUED {
            drop(queue);
            (self.on_dropped)();
            return;
        }
        queue.push(record);
    }
}

fn write_lines(queue: &Weak<Queue>, mut out: Box<dyn Write + Send>, ring: Option<&DecisionRing>) {
    let mut records: Vec<Box<dyn Line>> = Vec::with_capacity(1024);
    let mut lines: Vec<u8> = Vec::with_capacity(256 * 1024);
    // Where each line of `lines` starts and ends (for the ring).
    let mut ends: Vec<(usize, usize)> = Vec::new();
    loop {
        // Its own OS thread, not a runtime's: a blocking sleep is right.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(FLUSH_INTERVAL);
        let Some(shared) = queue.upgrade() else {
            let _ = out.flush();
            return;
        };
        {
            let mut queued = shared.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *queued, &mut records);
        }
        drop(shared);
        if records.is_empty() {
            continue;
        }
        for record in records.drain(..) {
            let start = lines.len();
            record.record().write_json(&mut lines);
            if ring.is_some() {
                ends.push((start, lines.len()));
            }
            lines.push(b'\n');
        }
        if let Some(ring) = ring {
            ring.push_lines(&lines, &ends);
            ends.clear();
        }
        // stdout gone: lines are lost, requests are not affected.
        let _ = out.write_all(&lines);
        let _ = out.flush();
        lines.clear();
        if lines.capacity() > 16 * 1024 * 1024 {
            // A burst of huge lines (long reasons): do not keep the room.
            lines = Vec::with_capacity(256 * 1024);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A stdout nobody reads: every write blocks until the test ends.
    struct StuckOut(std::sync::mpsc::Receiver<()>);

    impl Write for StuckOut {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // a plain thread waits for another
    fn the_ring_keeps_the_last_lines_the_writer_wrote() {
        let ring = Arc::new(DecisionRing::new(2));
        let log =
            RouteLog::spawn_with_ring(Box::new(std::io::sink()), || {}, Some(Arc::clone(&ring)))
                .unwrap();
        for id in ["a", "b", "c"] {
            let mut r = Box::<RouteRecord>::default();
            r.request_id = id.into();
            log.emit(r);
        }
        let mut waited = 0;
        while ring.held().0 < 2 && waited < 200 {
            std::thread::sleep(FLUSH_INTERVAL);
            waited += 1;
        }
        let ids: Vec<String> = ring
            .latest(10, 1 << 20)
            .iter()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_slice(l).unwrap();
                v["request_id"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(ids, ["c", "b"], "the newest first, two at most");
    }

    #[test]
    fn a_stuck_stdout_costs_records_not_requests() {
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&dropped);
        let on_dropped = move || {
            counter.fetch_add(1, Ordering::Relaxed);
        };
        let (unstick, rx) = std::sync::mpsc::channel();
        let log = RouteLog::spawn(Box::new(StuckOut(rx)), on_dropped).unwrap();
        // The writer takes at most one queue's worth before it blocks; the
        // queue then holds at most MAX_QUEUED: the rest is dropped and
        // counted, and `emit` never waits.
        let sent = 2 * MAX_QUEUED + 10;
        for _ in 0..sent {
            log.emit(Box::<RouteRecord>::default());
        }
        let lost = dropped.load(Ordering::Relaxed);
        assert!(lost >= 10, "dropped {lost}");
        assert!(lost <= sent as u64);
        drop(unstick);
    }
}
