//! The proxy's own caps: request bytes buffered at once by all requests
//! together, and client connections open at once.
//!
//! Each request's body is read whole (it may be sent to several pools), so
//! without a global cap a burst of large bodies takes as much memory as
//! clients send: 64 clients with 30 MiB each are 1.9 GiB, past the shipped
//! pod's 1 GiB limit. With it, a request that would go past the cap is
//! answered `503 overloaded` with `Retry-After` at once, and the proxy's
//! memory stays bounded by the cap plus a per-connection constant.
//!
//! - [`ByteBudget`]: a counter of bytes reserved; a [`Reservation`] holds
//!   its bytes until dropped (when the request is done with its body). A
//!   body with a `Content-Length` reserves it before the first byte is read;
//!   a chunked body grows its reservation as frames arrive.
//! - [`ConnectionSlots`]: a counter of open connections; a
//!   [`ConnectionSlot`] is held for as long as its connection is served.
//!   Past the cap, a connection gets a canned `503 overloaded` and is
//!   closed ([`OVERLOADED_ANSWER`]).
//!
//! Both are lock-free counters: one atomic add (and one subtract) per
//! request or connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes reserved out of a fixed cap, shared by every request.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used: AtomicUsize,
    cap: usize,
}

impl ByteBudget {
    /// A budget of `cap` bytes.
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicUsize::new(0),
            cap,
        })
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation, to be grown.
    pub(crate) fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: Arc::clone(self),
            held: 0,
        }
    }

    /// Takes `n` more bytes if that stays within the cap.
    fn take(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(n).filter(|t| *t <= self.cap) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }
}

/// Bytes held out of a [`ByteBudget`] until dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<ByteBudget>,
    held: usize,
}

impl Reservation {
    /// Grows the reservation to at least `total` bytes; false (and
    /// unchanged) when the budget cannot give them.
    pub(crate) fn grow_to(&mut self, total: usize) -> bool {
        if total <= self.held {
            return true;
        }
        let more = total - self.held;
        if self.budget.take(more) {
            self.held = total;
            true
        } else {
            false
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.held > 0 {
            self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
        }
    }
}

/// Open client connections, up to a cap.
#[derive(Debug)]
pub(crate) struct ConnectionSlots {
    open: AtomicUsize,
    cap: usize,
}

impl ConnectionSlots {
    /// At most `cap` connections.
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            cap,
        })
    }

    /// A slot for a new connection; `None` past the cap.
    pub(crate) fn try_open(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let previous = self.open.fetch_add(1, Ordering::AcqRel);
        if previous >= self.cap {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ConnectionSlot(Arc::clone(self)))
    }
}

/// One open connection's place under the cap, given back when dropped.
#[derive(Debug)]
pub(crate) struct ConnectionSlot(Arc<ConnectionSlots>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a connection past the cap gets before it is closed.
pub(crate) const OVERLOADED_ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 143\r\n\
\r\n\
{\"error\":{\"message\":\"the router is at its limit of open connections; retry shortly\",\"type\":\"overloaded\",\"code\":\"overloaded\",\"request_id\":null}}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_cap_and_give_back_on_drop() {
        let b = ByteBudget::new(100);
        let mut a = b.reservation();
        assert!(a.grow_to(60));
        let mut c = b.reservation();
        assert!(!c.grow_to(41), "60 + 41 > 100");
        assert!(c.grow_to(40));
        assert_eq!(b.used(), 100);
        // Growing to what is held already takes nothing.
        assert!(a.grow_to(60));
        drop(a);
        assert_eq!(b.used(), 40);
        assert!(c.grow_to(100));
        drop(c);
        assert_eq!(b.used(), 0);
        // Overflow is a refusal, not a wrap.
        assert!(!b.reservation().grow_to(usize::MAX));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn connection_slots_stop_at_the_cap() {
        let s = ConnectionSlots::new(2);
        let one = s.try_open();
        let two = s.try_open();
        assert!(one.is_some() && two.is_some());
        assert!(s.try_open().is_none());
        drop(one);
        assert!(s.try_open().is_some());
    }

    #[test]
    fn the_canned_answer_is_a_complete_http_response() {
        let text = std::str::from_utf8(OVERLOADED_ANSWER).unwrap_or_default();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(v["error"]["type"], "overloaded");
    }
}
