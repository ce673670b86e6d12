//! Telling every open client connection to finish, without each one
//! polling a channel on every wake-up.
//!
//! A drain must reach each connection's task, including idle keep-alive
//! connections parked on a read. The obvious way, every connection task
//! selecting over its connection and a shared `watch` channel, costs a
//! channel poll (a mutex and a waker compare) each time the task wakes:
//! three times per proxied request. Here each connection instead registers
//! a [`StopSignal`] (an atomic flag and an [`AtomicWaker`]) once, when it
//! opens; [`StopSignals::stop_all`] sets every registered flag and wakes its
//! task. Per wake-up a connection pays one waker registration and one
//! atomic load.
//!
//! The registry holds weak references, so a closed connection's signal is
//! freed with it; dead entries are swept when the list would grow.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::Context;

use futures_util::task::AtomicWaker;

/// One connection's stop flag and the waker of the task serving it.
#[derive(Debug, Default)]
pub(crate) struct StopSignal {
    stop: AtomicBool,
    waker: AtomicWaker,
}

impl StopSignal {
    /// True once a stop was asked; until then, `cx`'s task is the one
    /// woken when it is.
    pub(crate) fn poll_stopped(&self, cx: &Context<'_>) -> bool {
        self.waker.register(cx.waker());
        self.stop.load(Ordering::SeqCst)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.waker.wake();
    }
}

/// Every open connection's [`StopSignal`].
#[derive(Debug, Default)]
pub(crate) struct StopSignals {
    stopping: AtomicBool,
    open: Mutex<Vec<Weak<StopSignal>>>,
}

impl StopSignals {
    /// A signal for a connection that just opened (already stopped if the
    /// proxy is stopping).
    pub(crate) fn register(&self) -> Arc<StopSignal> {
        let signal = Arc::new(StopSignal::default());
        {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            if open.len() == open.capacity() {
                open.retain(|w| w.strong_count() > 0);
            }
            open.push(Arc::downgrade(&signal));
        }
        // A stop that came while this one was being added: either it saw
        // the entry, or the flag is seen here (both SeqCst).
        if self.stopping.load(Ordering::SeqCst) {
            signal.stop();
        }
        signal
    }

    /// Asks every open connection, and every one opened from now on, to
    /// stop.
    pub(crate) fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let open = std::mem::take(&mut *self.open.lock().unwrap_or_else(PoisonError::into_inner));
        for signal in open.iter().filter_map(Weak::upgrade) {
            signal.stop();
        }
    }

    /// Registered signals still held (tests).
    #[cfg(test)]
    fn live(&self) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.iter().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Wake, Waker};

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn stop_all_sets_the_flag_and_wakes_the_task() {
        let signals = StopSignals::default();
        let signal = signals.register();
        let counter = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&counter));
        let cx = Context::from_waker(&waker);
        assert!(!signal.poll_stopped(&cx));
        signals.stop_all();
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert!(signal.poll_stopped(&cx));
    }

    #[test]
    fn a_connection_opened_after_the_stop_is_stopped_at_once() {
        let signals = StopSignals::default();
        signals.stop_all();
        let signal = signals.register();
        let waker = Waker::noop();
        assert!(signal.poll_stopped(&Context::from_waker(waker)));
    }

    #[test]
    fn closed_connections_are_swept() {
        let signals = StopSignals::default();
        let kept = signals.register();
        for _ in 0..100 {
            drop(signals.register());
        }
        assert_eq!(signals.live(), 1);
        let len = signals
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        assert!(len < 100, "dead entries were swept ({len} left)");
        drop(kept);
        assert_eq!(signals.live(), 0);
    }
}
