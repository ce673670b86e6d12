//! The in-process store: one proxy's keys in memory (the store of a proxy
//! without `CUSTOM_ROUTER_SHARED_STORE`, and the fail-open store of READ
//! and DRAFT requests while the shared one is down).
//!
//! Bounded twice: at most `max_entries` keys
//! (`CUSTOM_ROUTER_IDEMPOTENCY_MAX_KEYS`) and at most `max_bytes` bytes
//! (`CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES`), each entry counted as what it
//! holds (`entry_cost`: its key, its stored answer's own bytes, and
//! [`ENTRY_OVERHEAD`] for the map slot and index entries). A key cap
//! alone did not bound memory: the same 10,000 keys are 3 MB of 300-byte
//! answers or 10 GB of 1 MiB ones. Past either bound, finished entries
//! are dropped least recently used first (a finished entry is used when
//! it is stored and each time it is read: a replay, a cache hit); an
//! entry in flight is never dropped, and when every entry is in flight a new key is not tracked.
//! An answer that does not fit even with every finished entry dropped is
//! not kept: the key is settled as not replayable (a retry gets `409
//! not_replayable`, never a second generation) and the event
//! `over_budget` is counted. A settle wakes every joiner on this proxy at
//! once (no polling).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::record::{Entry, Fingerprint, KeyState, Owner};
use super::{ClaimResult, IdempotencyStore};
use crate::StoreError;
use crate::StoreEvents;

/// What an entry costs beyond its key and its state's own bytes: the
/// map's slot (key `String`, `Entry`, expiry, cost: 136 bytes, at most
/// 8/7 of it with the table's load factor, plus a control byte), one or
/// two index entries (`(Instant, String)`, 40 bytes, in B-tree nodes of
/// at most 11) and the allocator's rounding of the key's three copies.
/// Checked with dhat (`memory-bench`, docs/benchmarks.md "Memory"): a
/// stored 300-byte answer with four headers and a 10-byte key is 1,175
/// live heap bytes; this count gives it about 1,100.
pub(crate) const ENTRY_OVERHEAD: usize = 320;

/// The bytes the store counts for `key` in `state`: the key's three
/// copies (map, expiry index, eviction index), [`ENTRY_OVERHEAD`], and
/// what the state holds.
pub(crate) fn entry_cost(key: &str, state: &KeyState) -> usize {
    let held = match state {
        KeyState::InFlight | KeyState::NotReplayable => 0,
        KeyState::OutcomeUnknown(route) => route.len(),
        KeyState::Completed(answer) => answer.heap_bytes(),
    };
    ENTRY_OVERHEAD + 3 * key.len() + held
}

/// One key's entry in the map.
struct Slot {
    entry: Entry,
    expires: Instant,
    /// What it counts for (`entry_cost`).
    cost: usize,
    /// Finished: when it was last used (a tick of `Inner::uses`), its
    /// place in `Inner::finished`.
    used: Option<u64>,
}

struct Inner {
    /// Each key's entry.
    entries: HashMap<String, Slot>,
    /// Every entry by expiry (exactly the entries of the map), so that
    /// expiry is a look at the front, not a scan.
    by_expiry: BTreeSet<(Instant, String)>,
    /// The finished ones among them by last use, for eviction (least
    /// recently used first).
    finished: BTreeSet<(u64, String)>,
    /// Uses so far (the clock of `finished`).
    uses: u64,
    /// The sum of the entries' costs.
    bytes: usize,
}

/// Keys in this process.
pub struct LocalStore {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: usize,
    settled: Notify,
    events: Arc<dyn StoreEvents>,
}

impl LocalStore {
    /// A store of at most `max_entries` keys and `max_bytes` bytes
    /// (`entry_cost`); `events` counts the answers not kept.
    pub fn new(max_entries: usize, max_bytes: usize, events: Arc<dyn StoreEvents>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                by_expiry: BTreeSet::new(),
                finished: BTreeSet::new(),
                uses: 0,
                bytes: 0,
            }),
            max_entries: max_entries.max(1),
            max_bytes,
            settled: Notify::new(),
            events,
        }
    }

    /// The bytes its entries cost now (`entry_cost`).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Whether `cost` more bytes and one more key fit.
    fn fits(&self, inner: &Inner, cost: usize) -> bool {
        inner.entries.len() < self.max_entries && inner.bytes.saturating_add(cost) <= self.max_bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keys tracked now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let inner = self.lock();
        assert_eq!(inner.by_expiry.len(), inner.entries.len());
        let costs: usize = inner.entries.values().map(|s| s.cost).sum();
        assert_eq!(inner.bytes, costs);
        inner.entries.len()
    }

    fn claim_now(&self, key: &str, owner: Owner, fp: Fingerprint, ttl: Duration) -> ClaimResult {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.expire(now);
        if let Some(found) = inner.read(key) {
            return ClaimResult::Found(found);
        }
        let cost = entry_cost(key, &KeyState::InFlight);
        while !self.fits(&inner, cost) {
            if !inner.evict_one() {
                return ClaimResult::Untracked;
            }
        }
        let expires = router_endpoints::clock::later(now, ttl, router_endpoints::clock::A_YEAR);
        let entry = Entry {
            owner,
            fingerprint: fp,
            state: KeyState::InFlight,
        };
        inner.insert(key, entry, expires, false, cost);
        ClaimResult::Claimed
    }

    /// Drops every finished entry whose key starts with `prefix` (a
    /// cache purge); the number dropped.
    pub fn forget_prefix_now(&self, prefix: &str) -> u64 {
        let gone = self.lock().remove_prefix(prefix);
        u64::try_from(gone).unwrap_or(u64::MAX)
    }

    fn settle_now(&self, key: &str, owner: Owner, state: Option<KeyState>, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(Slot { entry, .. }) = inner.entries.get(key) else {
            return false;
        };
        if entry.owner != owner || entry.state != KeyState::InFlight {
            return false;
        }
        let fingerprint = entry.fingerprint;
        inner.remove(key);
        if let Some(mut state) = state {
            let mut cost = entry_cost(key, &state);
            while inner.bytes.saturating_add(cost) > self.max_bytes {
                if !inner.evict_one() {
                    // Larger than the budget with every finished entry
                    // gone: not kept, and not generated again either.
                    self.events.idempotency("over_budget");
                    state = KeyState::NotReplayable;
                    cost = entry_cost(key, &state);
                    break;
                }
            }
            let expires = router_endpoints::clock::later(now, ttl, router_endpoints::clock::A_YEAR);
            let entry = Entry {
                owner,
                fingerprint,
                state,
            };
            inner.insert(key, entry, expires, true, cost);
        }
        drop(inner);
        self.settled.notify_waiters();
        true
    }
}

impl Inner {
    fn insert(&mut self, key: &str, entry: Entry, expires: Instant, finished: bool, cost: usize) {
        self.by_expiry.insert((expires, key.to_owned()));
        let used = finished.then(|| {
            self.uses += 1;
            self.finished.insert((self.uses, key.to_owned()));
            self.uses
        });
        self.bytes = self.bytes.saturating_add(cost);
        self.entries.insert(
            key.to_owned(),
            Slot {
                entry,
                expires,
                cost,
                used,
            },
        );
    }

    /// `key`'s entry, counted as a use when it is finished.
    fn read(&mut self, key: &str) -> Option<Entry> {
        let slot = self.entries.get_mut(key)?;
        if let Some(used) = slot.used.as_mut() {
            self.finished.remove(&(*used, key.to_owned()));
            self.uses += 1;
            *used = self.uses;
            self.finished.insert((self.uses, key.to_owned()));
        }
        Some(slot.entry.clone())
    }

    fn remove(&mut self, key: &str) {
        if let Some(slot) = self.entries.remove(key) {
            self.bytes = self.bytes.saturating_sub(slot.cost);
            self.by_expiry.remove(&(slot.expires, key.to_owned()));
            if let Some(used) = slot.used {
                self.finished.remove(&(used, key.to_owned()));
            }
        }
    }

    /// Drops every finished entry whose key starts with `prefix`; the
    /// number dropped. Entries in flight stay (their answers are new).
    fn remove_prefix(&mut self, prefix: &str) -> usize {
        let gone: Vec<String> = self
            .entries
            .iter()
            .filter(|(k, s)| s.used.is_some() && k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &gone {
            self.remove(key);
        }
        gone.len()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((expires, key)) = self.by_expiry.first().cloned() {
            if expires > now {
                break;
            }
            self.remove(&key);
        }
    }

    /// Drops the least recently used finished entry; false if none.
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
            let mut inner = self.lock();
            inner.expire(now);
            inner.read(key)
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

    fn forget<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.lock().remove(key);
        self.settled.notify_waiters();
        Box::pin(async { Ok(()) })
    }

    fn forget_prefix<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let gone = self.forget_prefix_now(prefix);
        Box::pin(async move { Ok(gone) })
    }

    fn name(&self) -> &'static str {
        "local"
    }

    fn is_local(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, StatusCode};
    use router_policy::idempotency::Stored;

    use super::super::record::StoredAnswer;
    use super::*;
    use crate::Counted;

    const OWNER: Owner = Owner([1; 16]);
    const FP: Fingerprint = Fingerprint([2; 16]);
    const MIN: Duration = Duration::from_secs(60);

    fn store(max_entries: usize) -> LocalStore {
        LocalStore::new(max_entries, usize::MAX, Arc::new(crate::NoEvents))
    }

    async fn claim(s: &LocalStore, key: &str) -> ClaimResult {
        s.claim(key, OWNER, FP, MIN)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_is_exclusive_until_settled_and_expires() {
        let s = store(10);
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
        let s = store(2);
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
    async fn the_expiry_index_and_the_byte_count_mirror_the_keys_through_any_sequence() {
        // The byte budget binds before the key cap (answers of 0 to 2,000
        // bytes, about 30 entries of 340 bytes and more).
        let budget = 30 * 340 + 2_000;
        let s = LocalStore::new(50, budget, Arc::new(crate::NoEvents));
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..5000 {
            // xorshift: a fixed pseudo-random sequence of operations.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = format!("k{}", x % 80);
            let ttl = Duration::from_millis(1 + x % 300);
            // Half of the 4s settle with an answer, half advance time.
            match (x % 5, (x >> 32) & 1) {
                (0 | 1, _) => {
                    let _ = s.claim(&key, OWNER, FP, ttl).await;
                }
                (2, _) => {
                    let _ = s
                        .settle(&key, OWNER, FP, Some(KeyState::NotReplayable), ttl)
                        .await;
                }
                (4, 0) => {
                    let answer = answer_of((x % 2_000) as usize);
                    let _ = s.settle(&key, OWNER, FP, Some(answer), ttl).await;
                }
                (3, _) => {
                    let _ = s.settle(&key, OWNER, FP, None, ttl).await;
                }
                _ => tokio::time::advance(Duration::from_millis(x % 50)).await,
            }
            // `len` checks the index and the byte count against the map.
            assert!(s.len() <= 50);
            assert!(s.bytes() <= budget);
        }
    }

    /// Claims and settles `key` as `state`.
    async fn keep(s: &LocalStore, key: &str, state: KeyState) {
        assert!(matches!(claim(s, key).await, ClaimResult::Claimed), "{key}");
        assert_eq!(s.settle(key, OWNER, FP, Some(state), MIN).await, Ok(true));
    }

    fn answer_of(len: usize) -> KeyState {
        let body = vec![b'a'; len];
        KeyState::Completed(Arc::new(StoredAnswer::keep(
            StatusCode::OK,
            &HeaderMap::new(),
            &body,
            false,
        )))
    }

    /// Whether `inner` lies inside `outer`'s bytes.
    fn inside(inner: &[u8], outer: &[u8]) -> bool {
        let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
        i >= o && i < o + outer.len()
    }

    #[tokio::test(start_paused = true)]
    async fn a_thousand_300_byte_answers_cost_their_own_bytes_not_their_read_buffers() {
        let s = LocalStore::new(10_000, usize::MAX, Arc::new(crate::NoEvents));
        // What hyper hands over: the body and the header values are
        // slices of the upstream connection's read buffer (8 KiB to
        // start with, 16 KiB and more once it has grown).
        let read_buf = Bytes::from(vec![b'x'; 16 * 1024]);
        let value = |at: usize, len: usize| {
            HeaderValue::from_maybe_shared(read_buf.slice(at..at + len))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        for i in 0..1000 {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::CONTENT_TYPE, value(0, 16));
            headers.insert(http::header::CONTENT_LENGTH, value(16, 3));
            headers.insert(http::header::DATE, value(32, 29));
            headers.insert("x-router-route", value(64, 7));
            // Stamped anew on every answer: not kept.
            headers.insert("x-request-id", value(80, 36));
            let body = read_buf.slice(1024..1324);
            let answer = StoredAnswer::keep(StatusCode::OK, &headers, &body, false);
            // Its own bytes: nothing points into the read buffer (a kept
            // slice would hold all 16 KiB of it).
            assert!(!inside(&answer.body, &read_buf));
            assert_eq!(answer.headers.len(), 4);
            for (_, v) in answer.headers.iter() {
                assert!(!inside(v.as_bytes(), &read_buf));
            }
            keep(
                &s,
                &format!("key-{i:04}"),
                KeyState::Completed(Arc::new(answer)),
            )
            .await;
        }
        assert_eq!(s.len(), 1000);
        // Counted: 300 body + 99 header bytes + 4 x 72 (the header list)
        // + 56 + 16 (the Arc'd struct) + 3 x 8 (the key) + 320
        // (ENTRY_OVERHEAD) = 1103 bytes an entry. A store of slices of
        // the read buffer held the buffer (16 KiB here) an entry: 18,444
        // bytes of RSS an entry measured from outside before the fix
        // (docs/benchmarks.md, "Memory"), 12 times this bound.
        let per_entry = s.bytes() / 1000;
        assert!(per_entry <= 1536, "{per_entry} bytes an entry");
        assert!(
            per_entry >= 300 + ENTRY_OVERHEAD,
            "{per_entry} bytes an entry"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_byte_budget_the_least_recently_used_finished_entries_go_first_never_one_in_flight(
    ) {
        let one = entry_cost("k0", &answer_of(10_000));
        let s = LocalStore::new(100, 3 * one, Arc::new(crate::NoEvents));
        // In flight: never dropped for the budget.
        assert!(matches!(claim(&s, "busy").await, ClaimResult::Claimed));
        for (n, key) in ["k0", "k1", "k2", "k3"].into_iter().enumerate() {
            keep(&s, key, answer_of(10_000)).await;
            tokio::time::advance(Duration::from_secs(1)).await;
            assert!(s.bytes() <= 3 * one, "after {n}: {}", s.bytes());
        }
        // k0 and k1 (the oldest) made room for k2 and k3 next to "busy".
        assert_eq!(s.len(), 3);
        for gone in ["k0", "k1"] {
            assert!(matches!(s.get(gone).await, Ok(None)), "{gone}");
        }
        for kept in ["k2", "k3"] {
            assert!(
                matches!(s.get(kept).await, Ok(Some(e)) if e.state.stored() == Stored::Completed),
                "{kept}"
            );
        }
        assert!(matches!(s.get("busy").await, Ok(Some(e)) if e.state == KeyState::InFlight));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_larger_than_the_whole_budget_is_kept_as_not_replayable_and_counted() {
        let events = Arc::new(Counted::default());
        let s = LocalStore::new(100, 20_000, Arc::clone(&events) as Arc<dyn StoreEvents>);
        keep(&s, "small", answer_of(1_000)).await;
        keep(&s, "huge", answer_of(50_000)).await;
        // Every finished entry went, and it still did not fit: the key
        // is kept as not replayable (a retry gets 409, nothing is
        // generated twice), and the event is counted.
        assert!(matches!(s.get("small").await, Ok(None)));
        assert!(matches!(s.get("huge").await, Ok(Some(e)) if e.state == KeyState::NotReplayable));
        assert!(s.bytes() <= 20_000);
        assert_eq!(events.seen(), ["over_budget"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_settle_wakes_a_joiner_at_once() {
        let s = Arc::new(store(10));
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

    #[tokio::test(start_paused = true)]
    async fn a_read_entry_is_kept_over_one_stored_after_it_least_recently_used_goes() {
        let one = entry_cost("k0", &answer_of(10_000));
        let s = LocalStore::new(100, 3 * one, Arc::new(crate::NoEvents));
        for key in ["k0", "k1", "k2"] {
            keep(&s, key, answer_of(10_000)).await;
        }
        // k0, the oldest, is read (a cache hit): k1 is now the least
        // recently used, and goes when k3 needs room.
        assert!(matches!(s.get("k0").await, Ok(Some(_))));
        keep(&s, "k3", answer_of(10_000)).await;
        assert!(matches!(s.get("k1").await, Ok(None)));
        for kept in ["k0", "k2", "k3"] {
            assert!(matches!(s.get(kept).await, Ok(Some(_))), "{kept}");
        }
        // A claim that finds an entry is a use too.
        assert!(matches!(claim(&s, "k2").await, ClaimResult::Found(_)));
        keep(&s, "k4", answer_of(10_000)).await;
        assert!(matches!(s.get("k0").await, Ok(None)));
        assert!(matches!(s.get("k2").await, Ok(Some(_))));
        assert_eq!(s.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_prefix_purge_drops_the_finished_entries_under_it_only() {
        let s = store(100);
        for key in ["cache:a:1", "cache:a:2", "cache:ab:1", "cache:b:1"] {
            keep(&s, key, answer_of(10)).await;
        }
        assert!(matches!(
            claim(&s, "cache:a:busy").await,
            ClaimResult::Claimed
        ));
        assert_eq!(s.forget_prefix("cache:a:").await, Ok(2));
        for gone in ["cache:a:1", "cache:a:2"] {
            assert!(matches!(s.get(gone).await, Ok(None)), "{gone}");
        }
        for kept in ["cache:ab:1", "cache:b:1"] {
            assert!(matches!(s.get(kept).await, Ok(Some(_))), "{kept}");
        }
        // The one in flight stays (its answer is new).
        assert!(
            matches!(s.get("cache:a:busy").await, Ok(Some(e)) if e.state == KeyState::InFlight)
        );
        assert_eq!(s.len(), 3);
    }
}
