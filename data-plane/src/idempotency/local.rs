//! The in-process store: one proxy's keys in memory (the store of a proxy
//! without `CUSTOM_ROUTER_SHARED_STORE`, and the fail-open store of READ
//! and DRAFT requests while the shared one is down).
//!
//! Bounded: at most `max_entries` keys; when full, the entries closest to
//! their expiry are dropped first (finished ones before any in flight),
//! and when every entry is in flight a new key is not tracked. A settle
//! wakes every joiner on this proxy at once (no polling).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::record::{Entry, Fingerprint, KeyState, Owner};
use super::{ClaimResult, IdempotencyStore, StoreError};

struct Inner {
    entries: HashMap<String, (Entry, Instant)>,
    /// Every entry by expiry (exactly the entries of the map), so that
    /// expiry is a look at the front, not a scan.
    by_expiry: BTreeSet<(Instant, String)>,
    /// The finished ones among them, for eviction.
    finished: BTreeSet<(Instant, String)>,
}

/// Keys in this process.
pub(crate) struct LocalStore {
    inner: Mutex<Inner>,
    max_entries: usize,
    settled: Notify,
}

impl LocalStore {
    /// A store of at most `max_entries` keys.
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                by_expiry: BTreeSet::new(),
                finished: BTreeSet::new(),
            }),
            max_entries: max_entries.max(1),
            settled: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keys tracked now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let inner = self.lock();
        assert_eq!(inner.by_expiry.len(), inner.entries.len());
        inner.entries.len()
    }

    fn claim_now(&self, key: &str, owner: Owner, fp: Fingerprint, ttl: Duration) -> ClaimResult {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.expire(now);
        if let Some((e, _)) = inner.entries.get(key) {
            return ClaimResult::Found(e.clone());
        }
        if inner.entries.len() >= self.max_entries && !inner.evict_one() {
            return ClaimResult::Untracked;
        }
        let expires = crate::clock::later(now, ttl, crate::clock::A_YEAR);
        let entry = Entry {
            owner,
            fingerprint: fp,
            state: KeyState::InFlight,
        };
        inner.insert(key, entry, expires, false);
        ClaimResult::Claimed
    }

    fn settle_now(&self, key: &str, owner: Owner, state: Option<KeyState>, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some((entry, _)) = inner.entries.get(key) else {
            return false;
        };
        if entry.owner != owner || entry.state != KeyState::InFlight {
            return false;
        }
        let fingerprint = entry.fingerprint;
        inner.remove(key);
        if let Some(state) = state {
            let expires = crate::clock::later(now, ttl, crate::clock::A_YEAR);
            let entry = Entry {
                owner,
                fingerprint,
                state,
            };
            inner.insert(key, entry, expires, true);
        }
        drop(inner);
        self.settled.notify_waiters();
        true
    }
}

impl Inner {
    fn insert(&mut self, key: &str, entry: Entry, expires: Instant, finished: bool) {
        self.by_expiry.insert((expires, key.to_owned()));
        if finished {
            self.finished.insert((expires, key.to_owned()));
        }
        self.entries.insert(key.to_owned(), (entry, expires));
    }

    fn remove(&mut self, key: &str) {
        if let Some((_, expires)) = self.entries.remove(key) {
            let k = (expires, key.to_owned());
            self.by_expiry.remove(&k);
            self.finished.remove(&k);
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some((expires, key)) = self.by_expiry.first().cloned() {
            if expires > now {
                break;
            }
            self.remove(&key);
        }
    }

    /// Drops the finished entry closest to its expiry; false if none.
    fn evict_one(&mut self) -> bool {
        match self.finished.first().cloned() {
            Some((_, key)) => {
                self.remove(&key);
                true
            }
            None => false,
        }
    }
}

impl IdempotencyStore for LocalStore {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
        fp: Fingerprint,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ClaimResult, StoreError>> {
        let r = self.claim_now(key, owner, fp, ttl);
        Box::pin(async move { Ok(r) })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>> {
        let now = Instant::now();
        let found = {
            let inner = self.lock();
            inner
                .entries
                .get(key)
                .filter(|(_, expires)| *expires > now)
                .map(|(e, _)| e.clone())
        };
        Box::pin(async move { Ok(found) })
    }

    fn settle<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
        _fp: Fingerprint,
        state: Option<KeyState>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let r = self.settle_now(key, owner, state, ttl);
        Box::pin(async move { Ok(r) })
    }

    fn changed<'a>(&'a self, _key: &'a str, wait: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // Woken by any settle on this proxy; `wait` bounds a missed one.
            let _ = tokio::time::timeout(wait, self.settled.notified()).await;
        })
    }

    fn name(&self) -> &'static str {
        "local"
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const OWNER: Owner = Owner([1; 16]);
    const FP: Fingerprint = Fingerprint([2; 16]);
    const MIN: Duration = Duration::from_secs(60);

    async fn claim(s: &LocalStore, key: &str) -> ClaimResult {
        s.claim(key, OWNER, FP, MIN)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_is_exclusive_until_settled_and_expires() {
        let s = LocalStore::new(10);
        assert!(matches!(claim(&s, "k").await, ClaimResult::Claimed));
        assert!(
            matches!(claim(&s, "k").await, ClaimResult::Found(e) if e.state == KeyState::InFlight)
        );
        // Only the owner settles.
        assert_eq!(
            s.settle("k", Owner([9; 16]), FP, None, MIN).await,
            Ok(false)
        );
        assert_eq!(
            s.settle("k", OWNER, FP, Some(KeyState::NotReplayable), MIN)
                .await,
            Ok(true)
        );
        assert!(
            matches!(claim(&s, "k").await, ClaimResult::Found(e) if e.state == KeyState::NotReplayable)
        );
        tokio::time::advance(MIN + Duration::from_secs(1)).await;
        assert!(matches!(claim(&s, "k").await, ClaimResult::Claimed));
        // Released: free again at once.
        assert_eq!(s.settle("k", OWNER, FP, None, MIN).await, Ok(true));
        assert!(matches!(claim(&s, "k").await, ClaimResult::Claimed));
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded() {
        let s = LocalStore::new(2);
        for k in ["a", "b"] {
            assert!(matches!(claim(&s, k).await, ClaimResult::Claimed));
        }
        // Both in flight: a third is not tracked.
        assert!(matches!(claim(&s, "c").await, ClaimResult::Untracked));
        let _ = s
            .settle("a", OWNER, FP, Some(KeyState::NotReplayable), MIN)
            .await;
        // A finished one makes room.
        assert!(matches!(claim(&s, "c").await, ClaimResult::Claimed));
        assert_eq!(s.len(), 2);
        // "a" was the one evicted: b and c are in flight, so a is not
        // tracked now (not answered from a stale entry).
        assert!(matches!(claim(&s, "a").await, ClaimResult::Untracked));
    }

    #[tokio::test(start_paused = true)]
    async fn the_expiry_index_mirrors_the_keys_through_any_sequence() {
        let s = LocalStore::new(50);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..5000 {
            // xorshift: a fixed pseudo-random sequence of operations.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = format!("k{}", x % 80);
            let ttl = Duration::from_millis(1 + x % 300);
            match x % 5 {
                0 | 1 => {
                    let _ = s.claim(&key, OWNER, FP, ttl).await;
                }
                2 => {
                    let _ = s
                        .settle(&key, OWNER, FP, Some(KeyState::NotReplayable), ttl)
                        .await;
                }
                3 => {
                    let _ = s.settle(&key, OWNER, FP, None, ttl).await;
                }
                _ => tokio::time::advance(Duration::from_millis(x % 50)).await,
            }
            // `len` checks the index against the map.
            assert!(s.len() <= 50);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_settle_wakes_a_joiner_at_once() {
        let s = Arc::new(LocalStore::new(10));
        assert!(matches!(claim(&s, "k").await, ClaimResult::Claimed));
        let waiter = {
            let s = Arc::clone(&s);
            tokio::spawn(async move {
                let t0 = Instant::now();
                s.changed("k", Duration::from_secs(30)).await;
                t0.elapsed()
            })
        };
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(5)).await;
        let _ = s.settle("k", OWNER, FP, None, MIN).await;
        let waited = waiter.await.unwrap_or_default();
        assert!(waited < Duration::from_secs(1), "{waited:?}");
    }
}
