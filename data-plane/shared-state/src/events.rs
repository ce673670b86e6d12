//! What the crate counts, and who counts it: the proxy implements
//! [`StoreEvents`] on its metrics, so this crate links no metrics
//! registry (as `router_endpoints::PlacementSink` does for pools).

/// Counts the shared state's events.
pub trait StoreEvents: Send + Sync + 'static {
    /// An idempotency event (`claim`, `replay`, `join`, `fail_open`, ...).
    fn idempotency(&self, event: &'static str);
    /// A failed shared-store call (`claim`, `get`, `settle`, `epoch`, ...).
    fn store_error(&self, op: &'static str);
    /// The shared store was found to have lost its data.
    fn store_reset(&self);
}

/// Counts nothing (tests, tools).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl StoreEvents for NoEvents {
    fn idempotency(&self, _: &'static str) {}
    fn store_error(&self, _: &'static str) {}
    fn store_reset(&self) {}
}

/// Records the idempotency events, for tests.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Counted(std::sync::Mutex<Vec<&'static str>>);

#[cfg(test)]
impl Counted {
    /// The idempotency events seen, in order.
    pub(crate) fn seen(&self) -> Vec<&'static str> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
impl StoreEvents for Counted {
    fn idempotency(&self, event: &'static str) {
        if let Ok(mut v) = self.0.lock() {
            v.push(event);
        }
    }
    fn store_error(&self, _: &'static str) {}
    fn store_reset(&self) {}
}
