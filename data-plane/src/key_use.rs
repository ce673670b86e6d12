//! When this proxy last admitted a request with each stored tenant key,
//! for the control plane's `keys list` (LAST USED).
//!
//! A request admitted with a key from the control plane's store notes the
//! key's id and the wall time here; the config stream sends what was noted
//! with its next heartbeat and clears it. So the control plane hears of a
//! key's use at most once per heartbeat per proxy, never per request, and
//! the map holds at most [`MAX_KEYS`] ids (beyond that, a new id waits
//! for the next heartbeat's room).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The most key ids noted between two heartbeats.
pub(crate) const MAX_KEYS: usize = 10_000;

/// Key ids and when each was last used, since the last report.
#[derive(Debug, Default)]
pub(crate) struct KeyUse {
    used: Mutex<HashMap<Arc<str>, i64>>,
}

impl KeyUse {
    /// Notes that `id` admitted a request at `now_unix_ms`.
    pub(crate) fn note(&self, id: &Arc<str>, now_unix_ms: i64) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = used.get_mut(id) {
            *at = (*at).max(now_unix_ms);
        } else if used.len() < MAX_KEYS {
            used.insert(Arc::clone(id), now_unix_ms);
        }
    }

    /// What was noted since the last call, emptied.
    pub(crate) fn take(&self) -> Vec<(Arc<str>, i64)> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_use_per_key_is_reported_once_and_the_count_is_bounded() {
        let uses = KeyUse::default();
        let a: Arc<str> = Arc::from("key-a");
        uses.note(&a, 10);
        uses.note(&a, 30);
        uses.note(&a, 20);
        assert_eq!(uses.take(), vec![(Arc::clone(&a), 30)]);
        assert!(uses.take().is_empty(), "reported once");
        for i in 0..MAX_KEYS + 5 {
            uses.note(&Arc::from(format!("key-{i}").as_str()), 1);
        }
        assert_eq!(uses.take().len(), MAX_KEYS);
    }
}
