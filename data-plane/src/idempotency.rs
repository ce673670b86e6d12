//! Client retries with an `Idempotency-Key` never generate twice.
//!
//! The first request with a key becomes the *leader*: it is routed as
//! usual. A request with the same key that arrives while the leader is in
//! flight *follows* it: it waits (bounded by its own deadline) for the
//! leader's answer and gets a copy. One that arrives after the leader
//! finished, within the TTL, gets the stored answer at once.
//!
//! Only complete, non-streaming backend answers (not 5xx or 429) are
//! stored, up to [`MAX_STORED_BODY`] bytes each: a stream cannot be
//! replayed, so a retry of a streamed request within the TTL is refused
//! (`409 duplicate_request`) rather than generated again. Router errors
//! (sheds, 504s) and backend failures are not stored: nothing was
//! generated, so the retry is routed afresh.
//!
//! A key reused with a different request body is refused (`422`), as
//! Stripe does: it is a client bug, not a retry.
//!
//! Memory is bounded: at most `max_entries` keys; when full, the oldest
//! finished entries are evicted first, and if every entry is in flight the
//! new request is simply not tracked.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::sync::watch;
use tokio::time::Instant;

/// Largest answer body kept for replay.
pub(crate) const MAX_STORED_BODY: usize = 1024 * 1024;

/// An answer kept for replay.
#[derive(Debug, Clone)]
pub(crate) struct StoredAnswer {
    /// Status.
    pub status: StatusCode,
    /// Headers (end-to-end ones).
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

#[derive(Debug, Clone)]
enum Outcome {
    /// Replayable.
    Stored(Arc<StoredAnswer>),
    /// Finished but cannot be replayed (a stream, or too big).
    NotReplayable,
}

enum Entry {
    InFlight {
        fingerprint: u64,
        streaming: bool,
        rx: watch::Receiver<Option<Outcome>>,
    },
    Done {
        fingerprint: u64,
        outcome: Outcome,
        expires: Instant,
    },
}

struct Inner {
    entries: HashMap<String, Entry>,
    /// Finished keys in completion order, for expiry and eviction.
    finished: VecDeque<(String, Instant)>,
}

/// The cache of keys in flight and answers recently given.
pub(crate) struct IdempotencyCache {
    inner: Mutex<Inner>,
    ttl: Duration,
    max_entries: usize,
}

/// What to do with a request that carries a key.
pub(crate) enum Claim {
    /// Route it; report the result through the guard.
    Leader(LeaderGuard),
    /// Wait for the leader, then replay.
    Follower(Follower),
    /// Answer with this stored copy now.
    Replay(Arc<StoredAnswer>),
    /// Already answered in a way that cannot be replayed (a stream), or in
    /// flight as a stream.
    Duplicate,
    /// The key was used with a different request.
    Mismatch,
    /// Not tracked (cache full of requests in flight): route it.
    Untracked,
}

/// The fingerprint of a request: method, path and body.
pub(crate) fn fingerprint(method: &str, path: &str, body: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    method.hash(&mut h);
    path.hash(&mut h);
    body.hash(&mut h);
    h.finish()
}

impl IdempotencyCache {
    /// A cache keeping answers for `ttl`, at most `max_entries` keys.
    pub(crate) fn new(ttl: Duration, max_entries: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                finished: VecDeque::new(),
            }),
            ttl,
            max_entries: max_entries.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks up `key` and decides.
    pub(crate) fn claim(self: &Arc<Self>, key: &str, fingerprint: u64, streaming: bool) -> Claim {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.expire(now);
        match inner.entries.get(key) {
            Some(Entry::InFlight { fingerprint: f, .. })
            | Some(Entry::Done { fingerprint: f, .. })
                if *f != fingerprint =>
            {
                return Claim::Mismatch
            }
            Some(Entry::InFlight {
                streaming: true, ..
            }) => return Claim::Duplicate,
            Some(Entry::InFlight { rx, .. }) => {
                return Claim::Follower(Follower { rx: rx.clone() });
            }
            Some(Entry::Done { outcome, .. }) => {
                return match outcome {
                    Outcome::Stored(a) => Claim::Replay(Arc::clone(a)),
                    Outcome::NotReplayable => Claim::Duplicate,
                };
            }
            None => {}
        }
        if inner.entries.len() >= self.max_entries {
            inner.evict_one();
            if inner.entries.len() >= self.max_entries {
                return Claim::Untracked;
            }
        }
        let (tx, rx) = watch::channel(None);
        inner.entries.insert(
            key.to_string(),
            Entry::InFlight {
                fingerprint,
                streaming,
                rx,
            },
        );
        Claim::Leader(LeaderGuard {
            cache: Arc::clone(self),
            key: key.to_string(),
            fingerprint,
            tx: Some(tx),
        })
    }

    /// Keys tracked now (in flight and finished).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }

    fn finish(&self, key: &str, fingerprint: u64, outcome: Option<Outcome>) {
        let mut inner = self.lock();
        match outcome {
            Some(outcome) => {
                let expires = crate::clock::later(Instant::now(), self.ttl, crate::clock::A_YEAR);
                inner.entries.insert(
                    key.to_string(),
                    Entry::Done {
                        fingerprint,
                        outcome,
                        expires,
                    },
                );
                inner.finished.push_back((key.to_string(), expires));
            }
            None => {
                inner.entries.remove(key);
            }
        }
    }
}

impl Inner {
    fn expire(&mut self, now: Instant) {
        while let Some((key, expires)) = self.finished.front() {
            if *expires > now {
                break;
            }
            if matches!(self.entries.get(key), Some(Entry::Done { expires: e, .. }) if *e <= now) {
                self.entries.remove(key);
            }
            self.finished.pop_front();
        }
    }

    fn evict_one(&mut self) {
        while let Some((key, expires)) = self.finished.pop_front() {
            if matches!(self.entries.get(&key), Some(Entry::Done { expires: e, .. }) if *e == expires)
            {
                self.entries.remove(&key);
                return;
            }
        }
    }
}

/// Held by the leader; tells followers how it ended. Dropped without
/// [`LeaderGuard::finish`], it releases the key (nothing was generated or
/// the request was abandoned) and followers route on their own.
pub(crate) struct LeaderGuard {
    cache: Arc<IdempotencyCache>,
    key: String,
    fingerprint: u64,
    tx: Option<watch::Sender<Option<Outcome>>>,
}

impl LeaderGuard {
    /// A complete backend answer: stored (if it fits) and handed to followers.
    pub(crate) fn store(mut self, answer: StoredAnswer) {
        let outcome = if answer.body.len() <= MAX_STORED_BODY {
            Outcome::Stored(Arc::new(answer))
        } else {
            Outcome::NotReplayable
        };
        self.finish(outcome);
    }

    /// The answer was streamed (or otherwise cannot be replayed).
    pub(crate) fn streamed(mut self) {
        self.finish(Outcome::NotReplayable);
    }

    fn finish(&mut self, outcome: Outcome) {
        if let Some(tx) = self.tx.take() {
            self.cache
                .finish(&self.key, self.fingerprint, Some(outcome.clone()));
            let _ = tx.send(Some(outcome));
        }
    }
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            self.cache.finish(&self.key, self.fingerprint, None);
            // Dropping the sender wakes followers with "no answer".
            drop(tx);
        }
    }
}

/// A request waiting for its leader.
pub(crate) struct Follower {
    rx: watch::Receiver<Option<Outcome>>,
}

/// How a follower's wait ended.
pub(crate) enum FollowResult {
    /// The leader's answer.
    Replay(Arc<StoredAnswer>),
    /// The leader's answer cannot be replayed.
    Duplicate,
    /// The leader gave up without an answer: route this one.
    LeaderGone,
}

impl Follower {
    /// Waits for the leader's outcome.
    pub(crate) async fn wait(mut self) -> FollowResult {
        loop {
            if let Some(outcome) = self.rx.borrow_and_update().clone() {
                return match outcome {
                    Outcome::Stored(a) => FollowResult::Replay(a),
                    Outcome::NotReplayable => FollowResult::Duplicate,
                };
            }
            if self.rx.changed().await.is_err() {
                return FollowResult::LeaderGone;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: &'static str) -> StoredAnswer {
        StoredAnswer {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(body.as_bytes()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_in_flight_joins_and_a_later_one_replays() {
        let cache = Arc::new(IdempotencyCache::new(Duration::from_secs(60), 10));
        let Claim::Leader(leader) = cache.claim("k", 1, false) else {
            panic!("leader")
        };
        let Claim::Follower(f) = cache.claim("k", 1, false) else {
            panic!("follower")
        };
        let waiting = tokio::spawn(f.wait());
        leader.store(answer("once"));
        match waiting.await.unwrap() {
            FollowResult::Replay(a) => assert_eq!(a.body, "once"),
            _ => panic!("replay expected"),
        }
        let Claim::Replay(a) = cache.claim("k", 1, false) else {
            panic!("replay")
        };
        assert_eq!(a.body, "once");
        // After the TTL the key is forgotten.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(matches!(cache.claim("k", 1, false), Claim::Leader(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_gives_up_frees_the_key() {
        let cache = Arc::new(IdempotencyCache::new(Duration::from_secs(60), 10));
        let Claim::Leader(leader) = cache.claim("k", 1, false) else {
            panic!("leader")
        };
        let Claim::Follower(f) = cache.claim("k", 1, false) else {
            panic!("follower")
        };
        drop(leader);
        assert!(matches!(f.wait().await, FollowResult::LeaderGone));
        assert!(matches!(cache.claim("k", 1, false), Claim::Leader(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn streams_and_mismatches_are_refused() {
        let cache = Arc::new(IdempotencyCache::new(Duration::from_secs(60), 10));
        let Claim::Leader(leader) = cache.claim("s", 1, true) else {
            panic!("leader")
        };
        assert!(matches!(cache.claim("s", 1, true), Claim::Duplicate));
        assert!(matches!(cache.claim("s", 2, true), Claim::Mismatch));
        leader.streamed();
        assert!(matches!(cache.claim("s", 1, true), Claim::Duplicate));
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded() {
        let cache = Arc::new(IdempotencyCache::new(Duration::from_secs(60), 2));
        for k in ["a", "b", "c"] {
            let Claim::Leader(l) = cache.claim(k, 1, false) else {
                panic!("leader {k}")
            };
            l.store(answer("x"));
        }
        assert_eq!(cache.len(), 2);
        // "a" was evicted first.
        assert!(matches!(cache.claim("a", 1, false), Claim::Leader(_)));
        // Two in flight fill it: a third key is not tracked.
        let cache = Arc::new(IdempotencyCache::new(Duration::from_secs(60), 2));
        let _a = cache.claim("a", 1, false);
        let _b = cache.claim("b", 1, false);
        assert!(matches!(cache.claim("c", 1, false), Claim::Untracked));
    }
}
