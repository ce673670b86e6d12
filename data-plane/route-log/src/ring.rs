//! The last route records, kept in memory for the control plane's
//! console (issue 33's Decisions page): [`DecisionRing`].
//!
//! Filled by the writer thread with the JSON lines it has just encoded
//! for stdout, one lock per flush: the request path pays nothing for it
//! (no copy, no formatting, no lock of its own). Bounded in count (its
//! capacity, `CUSTOM_ROUTER_DECISION_RING` in the proxy) and in bytes per
//! record ([`LINE_MAX`]; a longer line is not kept, and counted): at most
//! `capacity × (LINE_MAX + RECORD_OVERHEAD)` bytes, and in practice the
//! size of the last `capacity` lines (about 0.6 to 1.5 KB each).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The longest line kept; longer ones (very long reasons, many attempts)
/// are skipped and counted.
pub const LINE_MAX: usize = 16 * 1024;
/// What each kept line costs beside its bytes: the `Arc<[u8]>`'s counts
/// (16) and its slot in the ring (16).
pub const RECORD_OVERHEAD: usize = 32;

/// The last route records as their JSON lines, newest last.
pub struct DecisionRing {
    capacity: usize,
    lines: Mutex<VecDeque<Arc<[u8]>>>,
    skipped: AtomicU64,
}

impl DecisionRing {
    /// A ring of `capacity` lines (0: keeps nothing).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            lines: Mutex::new(VecDeque::with_capacity(capacity)),
            skipped: AtomicU64::new(0),
        }
    }

    /// How many lines it keeps at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Lines longer than [`LINE_MAX`] not kept so far.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Keeps the lines of `buf` that end at `ends` (exclusive, without
    /// their newline; in order), the last `capacity` of them.
    pub fn push_lines(&self, buf: &[u8], ends: &[(usize, usize)]) {
        if self.capacity == 0 || ends.is_empty() {
            return;
        }
        let from = ends.len().saturating_sub(self.capacity);
        let mut kept: Vec<Arc<[u8]>> = Vec::with_capacity(ends.len() - from);
        for &(start, end) in &ends[from..] {
            match buf.get(start..end) {
                Some(line) if line.len() <= LINE_MAX => kept.push(Arc::from(line)),
                _ => {
                    self.skipped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        for line in kept {
            if lines.len() == self.capacity {
                lines.pop_front();
            }
            lines.push_back(line);
        }
    }

    /// The newest lines first, at most `max_records` of them and at most
    /// `max_bytes` together.
    pub fn latest(&self, max_records: usize, max_bytes: usize) -> Vec<Arc<[u8]>> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for line in lines.iter().rev().take(max_records) {
            bytes = bytes.saturating_add(line.len());
            if bytes > max_bytes {
                break;
            }
            out.push(Arc::clone(line));
        }
        out
    }

    /// Lines held now and their bytes (with [`RECORD_OVERHEAD`] each).
    pub fn held(&self) -> (usize, usize) {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = lines.iter().map(|l| l.len() + RECORD_OVERHEAD).sum();
        (lines.len(), bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(ring: &DecisionRing, lines: &[&str]) {
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        for l in lines {
            let start = buf.len();
            buf.extend_from_slice(l.as_bytes());
            ends.push((start, buf.len()));
            buf.push(b'\n');
        }
        ring.push_lines(&buf, &ends);
    }

    #[test]
    fn it_keeps_the_last_lines_newest_first_within_count_and_bytes() {
        let ring = DecisionRing::new(3);
        push(&ring, &["a", "bb"]);
        push(&ring, &["ccc", "dddd", "eeeee"]);
        let got: Vec<Vec<u8>> = ring.latest(10, 1000).iter().map(|l| l.to_vec()).collect();
        assert_eq!(got, [b"eeeee".to_vec(), b"dddd".to_vec(), b"ccc".to_vec()]);
        assert_eq!(ring.latest(2, 1000).len(), 2);
        assert_eq!(ring.latest(10, 9).len(), 2, "5 + 4 bytes fit, not 3 more");
        assert_eq!(ring.held(), (3, 12 + 3 * RECORD_OVERHEAD));
        // A batch larger than the ring: its last lines only.
        push(&ring, &["1", "2", "3", "4", "5"]);
        let got: Vec<Vec<u8>> = ring.latest(10, 1000).iter().map(|l| l.to_vec()).collect();
        assert_eq!(got, [b"5".to_vec(), b"4".to_vec(), b"3".to_vec()]);
    }

    #[test]
    fn a_line_past_the_cap_is_skipped_and_counted_and_zero_keeps_nothing() {
        let ring = DecisionRing::new(4);
        let long = "x".repeat(LINE_MAX + 1);
        push(&ring, &["ok", &long]);
        assert_eq!(ring.held().0, 1);
        assert_eq!(ring.skipped(), 1);
        let none = DecisionRing::new(0);
        push(&none, &["a"]);
        assert_eq!(none.held(), (0, 0));
    }
}
