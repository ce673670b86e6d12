//! Client retries with an `Idempotency-Key` never generate twice, on one
//! proxy or across a fleet.
//!
//! The rules are [`router_policy::idempotency`]'s (claim table, settle,
//! store outage, client gone); this module carries them out against an
//! [`IdempotencyStore`]:
//!
//! - [`LocalStore`]: in-process, one proxy (no
//!   `CUSTOM_ROUTER_SHARED_STORE`), and the fail-open store of READ/DRAFT
//!   requests while the shared store is down;
//! - [`RedisStore`](crate::RedisStore): Redis or Valkey, shared by
//!   every proxy.
//!
//! [`Keys::begin`] claims a request's key and says what the request does:
//! lead (route it, holding a [`KeyLease`]), replay a stored answer (at once
//! or after joining the first request in flight, polling the store with
//! [`JoinBackoff`]), or be refused with a typed error. The leader settles
//! its lease when the request ends ([`KeyLease::settle`]); a lease dropped
//! unsettled (a panic, a cancelled request whose route turned finishing
//! off) releases the key.
//!
//! Unkeyed requests never come here.

mod local;
pub(crate) mod record;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use router_policy::idempotency::{
    on_claim, settle, when_store_down, Ending, JoinBackoff, OnClaim, Settle, WhenDown,
};
use router_policy::Risk;
use tokio::time::Instant;

pub use local::LocalStore;
pub use record::{
    fingerprint, Corrupt, Entry, Fingerprint, KeyState, Owner, StoredAnswer, CACHE_STORED_AT,
};

use crate::{StoreError, StoreEvents};

/// What a claim found.
#[derive(Debug)]
pub enum ClaimResult {
    /// The key was free and is now the caller's.
    Claimed,
    /// The key's entry.
    Found(Entry),
    /// Not tracked (an in-process store full of requests in flight).
    Untracked,
}

/// Where keys are claimed, settled and read. Object-safe (boxed futures)
/// so that the proxy holds one `Arc<dyn IdempotencyStore>` whatever the
/// backend, and so that budgets and rate limits can share the connection
/// later.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `key` for `owner` (one atomic set-if-absent with `ttl`), or
    /// returns what is there.
    fn claim<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
        fp: Fingerprint,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ClaimResult, StoreError>>;
    /// The key's entry, if any.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>>;
    /// Replaces `owner`'s in-flight entry by `state` kept for `ttl`, or
    /// deletes it (`None`). False when the key is no longer `owner`'s in
    /// flight (expired, or taken since).
    fn settle<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
        fp: Fingerprint,
        state: Option<KeyState>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// Waits at most `wait` for the key to change (a poll interval for a
    /// remote store; a wake-up for the local one).
    fn changed<'a>(&'a self, key: &'a str, wait: Duration) -> BoxFuture<'a, ()>;
    /// Drops `key`'s entry, whatever its state (a cache entry refreshed).
    fn forget<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = key;
        Box::pin(async { Ok(()) })
    }
    /// Drops every settled entry whose key starts with `prefix` (a cache
    /// purge); the number dropped.
    fn forget_prefix<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let _ = prefix;
        Box::pin(async { Ok(0) })
    }
    /// `local` or `redis`, for logs and metrics.
    fn name(&self) -> &'static str;
    /// Whether the store is this process's own memory.
    fn is_local(&self) -> bool {
        false
    }
    /// Whether a connection has been made (a remote store connects in the
    /// background).
    fn connected(&self) -> bool {
        true
    }
}

/// Whether the shared store is reachable: one log line per outage.
struct Health {
    up: AtomicBool,
    events: Arc<dyn StoreEvents>,
}

impl Health {
    fn ok(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!("shared store reachable again");
        }
    }

    fn failed(&self, op: &'static str, e: &StoreError) {
        self.events.store_error(op);
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(op, error = %e, "shared store unreachable: keyed SEND/DESTRUCTIVE requests get 503 shared_store_unavailable, READ/DRAFT use this proxy's own store until it is back");
        }
    }
}

/// The proxy's keys: the shared store (if configured) and the local one.
pub struct Keys {
    shared: Option<Arc<dyn IdempotencyStore>>,
    local: Arc<LocalStore>,
    /// How long settled entries are kept.
    ttl: Duration,
    /// Largest answer kept for replay.
    cap: usize,
    health: Arc<Health>,
}

/// A keyed request, as [`Keys::begin`] needs it.
pub struct KeyedRequest<'a> {
    /// The `Idempotency-Key`.
    pub key: &'a str,
    /// The request's fingerprint (a key reused with another request is
    /// refused).
    pub fp: Fingerprint,
    /// The route's risk: whether a store outage fails open or closed.
    pub risk: Risk,
    /// How long the claim holds if this proxy never settles it (the
    /// request's own time bound plus a margin).
    pub inflight_ttl: Duration,
    /// When a join gives up.
    pub wait_until: Instant,
}

/// What a keyed request does.
pub enum Begin {
    /// Route it; settle the lease at the end.
    Lead(KeyLease),
    /// Route it untracked (local store full).
    Untracked,
    /// Answer with the stored answer (`joined`: after waiting for the
    /// first request in flight).
    Replay {
        /// The stored answer.
        answer: Arc<StoredAnswer>,
        /// Whether the request waited for the first one in flight.
        joined: bool,
    },
    /// Answer with this error.
    Refuse(Refusal),
}

/// Why a keyed request is refused; the proxy answers each with its own
/// typed error.
#[derive(Debug)]
pub enum Refusal {
    /// The shared store is down and the request's risk may not fall back
    /// to this proxy's own store (SEND, DESTRUCTIVE).
    StoreUnavailable,
    /// The key was used with a different request.
    Mismatch(String),
    /// The key's first request ended with an answer that is not kept.
    NotReplayable(String),
    /// The key's first request may have reached a backend and its outcome
    /// is unknown; `route` is its route record.
    OutcomeUnknown {
        /// The key.
        key: String,
        /// The first request's route record.
        route: Bytes,
    },
    /// The caller's time ran out while it waited for the first request.
    JoinTimedOut,
    /// The first requests with this key kept ending without an answer.
    KeptEndingUnanswered,
}

/// How a join's wait ended.
enum Waited {
    /// The entry changed (settled or gone): claim again.
    Changed,
    /// The caller's time is up.
    TimedOut,
    /// The store failed.
    Failed(StoreError),
}

impl Keys {
    /// Keys kept for `ttl`, answers up to `cap` bytes, `max_local` keys
    /// and `max_local_bytes` bytes in the local store; `shared`: the
    /// fleet's store.
    pub fn new(
        shared: Option<Arc<dyn IdempotencyStore>>,
        ttl: Duration,
        cap: usize,
        (max_local, max_local_bytes): (usize, usize),
        events: Arc<dyn StoreEvents>,
    ) -> Self {
        Self {
            shared,
            local: Arc::new(LocalStore::new(
                max_local,
                max_local_bytes,
                Arc::clone(&events),
            )),
            ttl,
            cap,
            health: Arc::new(Health {
                up: AtomicBool::new(true),
                events,
            }),
        }
    }

    /// Whether the shared store (if any) has been reached once.
    pub fn connected(&self) -> bool {
        self.shared.as_ref().is_none_or(|s| s.connected())
    }

    /// The shared store's state for the health details: `None` without
    /// one, else whether it was ever connected and whether its last call
    /// succeeded.
    pub fn shared_status(&self) -> Option<(bool, bool)> {
        self.shared.as_ref().map(|s| {
            (
                s.connected(),
                s.connected() && self.health.up.load(Ordering::Relaxed),
            )
        })
    }

    /// Whether a shared store is configured.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    fn events(&self) -> &dyn StoreEvents {
        &*self.health.events
    }

    /// After a failed call on the shared store: the local store to go on
    /// with (READ/DRAFT), or the refusal (SEND/DESTRUCTIVE).
    fn store_down(
        &self,
        risk: Risk,
        op: &'static str,
        e: &StoreError,
    ) -> Result<Arc<dyn IdempotencyStore>, Refusal> {
        self.health.failed(op, e);
        match when_store_down(risk) {
            WhenDown::FailOpenLocal => {
                self.events().idempotency("fail_open");
                Ok(Arc::clone(&self.local) as Arc<dyn IdempotencyStore>)
            }
            WhenDown::FailClosed => {
                self.events().idempotency("fail_closed");
                Err(Refusal::StoreUnavailable)
            }
        }
    }

    /// Claims the request's key and decides (see the module docs).
    pub async fn begin(&self, req: KeyedRequest<'_>) -> Begin {
        let mut store: Arc<dyn IdempotencyStore> = match &self.shared {
            Some(s) => Arc::clone(s),
            None => Arc::clone(&self.local) as Arc<dyn IdempotencyStore>,
        };
        let mut joined = false;
        // Each turn either ends or follows a change of the key's entry.
        for _ in 0..8 {
            let owner = Owner::random();
            let claimed = store.claim(req.key, owner, req.fp, req.inflight_ttl).await;
            let found = match claimed {
                Ok(r) => {
                    if !store.is_local() {
                        self.health.ok();
                    }
                    r
                }
                Err(e) => match self.store_down(req.risk, "claim", &e) {
                    Ok(local) => {
                        store = local;
                        continue;
                    }
                    Err(refusal) => return Begin::Refuse(refusal),
                },
            };
            let entry = match found {
                ClaimResult::Claimed => {
                    self.events().idempotency("claim");
                    return Begin::Lead(KeyLease {
                        store,
                        health: Arc::clone(&self.health),
                        key: req.key.to_owned(),
                        owner,
                        fp: req.fp,
                        risk: req.risk,
                        ttl: self.ttl,
                        cap: self.cap,
                        rule: Rule::Idempotency,
                        also: None,
                        settled: false,
                    });
                }
                ClaimResult::Untracked => return Begin::Untracked,
                ClaimResult::Found(e) => e,
            };
            let key = req.key.to_owned();
            match on_claim(Some((entry.state.stored(), entry.fingerprint == req.fp))) {
                OnClaim::Mismatch => {
                    self.events().idempotency("mismatch");
                    return Begin::Refuse(Refusal::Mismatch(key));
                }
                OnClaim::NotReplayable => {
                    self.events().idempotency("not_replayable");
                    return Begin::Refuse(Refusal::NotReplayable(key));
                }
                OnClaim::OutcomeUnknown => {
                    self.events().idempotency("outcome_unknown_refused");
                    let route = match entry.state {
                        KeyState::OutcomeUnknown(r) => r,
                        _ => Bytes::new(),
                    };
                    return Begin::Refuse(Refusal::OutcomeUnknown { key, route });
                }
                OnClaim::Replay => {
                    let KeyState::Completed(answer) = entry.state else {
                        return Begin::Untracked;
                    };
                    self.events().idempotency("replay");
                    return Begin::Replay { answer, joined };
                }
                // Claimed above, not found: cannot happen.
                OnClaim::Lead => return Begin::Untracked,
                OnClaim::Join => {
                    if !joined {
                        self.events().idempotency("join");
                        joined = true;
                    }
                    match self.wait(&*store, req.key, req.fp, req.wait_until).await {
                        Waited::Changed => continue,
                        Waited::TimedOut => return Begin::Refuse(Refusal::JoinTimedOut),
                        Waited::Failed(e) => match self.store_down(req.risk, "get", &e) {
                            Ok(local) => {
                                store = local;
                                continue;
                            }
                            Err(refusal) => return Begin::Refuse(refusal),
                        },
                    }
                }
            }
        }
        Begin::Refuse(Refusal::KeptEndingUnanswered)
    }

    /// Polls `key` (with backoff) until its in-flight entry changes or
    /// `until`.
    async fn wait(
        &self,
        store: &dyn IdempotencyStore,
        key: &str,
        fp: Fingerprint,
        until: Instant,
    ) -> Waited {
        let backoff = JoinBackoff::DEFAULT;
        let mut n = 0;
        loop {
            let now = Instant::now();
            if now >= until {
                return Waited::TimedOut;
            }
            store.changed(key, backoff.delay(n).min(until - now)).await;
            n = n.saturating_add(1);
            match store.get(key).await {
                Ok(Some(e)) if e.state == KeyState::InFlight && e.fingerprint == fp => {}
                Ok(_) => return Waited::Changed,
                Err(e) => return Waited::Failed(e),
            }
        }
    }
}

impl Keys {
    /// Drops `key` wherever it is held (the shared store, and this
    /// proxy's own store it falls back to): a cache entry refreshed.
    pub async fn forget(&self, key: &str) {
        if let Some(s) = &self.shared {
            if let Err(e) = s.forget(key).await {
                self.health.failed("forget", &e);
            }
        }
        let _ = self.local.forget(key).await;
    }

    /// Drops the entries under `prefix` in this proxy's own store (a
    /// cache purge, or a route whose pools changed); the number dropped.
    pub fn forget_local_prefix(&self, prefix: &str) -> u64 {
        self.local.forget_prefix_now(prefix)
    }

    /// Drops the entries under `prefix` in the shared store, if there is
    /// one; the number dropped.
    pub async fn forget_shared_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        match &self.shared {
            Some(s) => s.forget_prefix(prefix).await,
            None => Ok(0),
        }
    }
}

/// Which rule settles a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// An `Idempotency-Key`: `router_policy::idempotency::settle`.
    Idempotency,
    /// A cache entry: `router_policy::cache::keep`; an answer not kept is
    /// marked not replayable for `failed_for`, so that the requests that
    /// joined it go to a backend each at once instead of one after
    /// another.
    Cache { failed_for: Duration },
}

/// How long a cache entry whose first request was not kept stays marked
/// so: its joiners route on their own at once.
pub const CACHE_FAILED_FOR: Duration = Duration::from_secs(1);

/// When a settle that failed is tried again.
const SETTLE_RETRIES: [Duration; 3] = [
    Duration::from_millis(250),
    Duration::from_secs(1),
    Duration::from_secs(4),
];

/// A claimed key, held by the request that leads it.
pub struct KeyLease {
    store: Arc<dyn IdempotencyStore>,
    health: Arc<Health>,
    key: String,
    owner: Owner,
    fp: Fingerprint,
    risk: Risk,
    ttl: Duration,
    cap: usize,
    rule: Rule,
    /// A second lease settled with this one (a keyed request on a cached
    /// route: its key and its cache entry).
    also: Option<Box<KeyLease>>,
    settled: bool,
}

impl KeyLease {
    /// This lease as a cache entry's: kept for `ttl` when the answer is
    /// whole, a success and at most `max_entry_bytes`.
    pub fn for_cache(mut self, ttl: Duration, max_entry_bytes: usize) -> Self {
        self.rule = Rule::Cache {
            failed_for: CACHE_FAILED_FOR.min(ttl),
        };
        self.ttl = ttl;
        self.cap = max_entry_bytes;
        self
    }

    /// `other` settled with this one, with the same answer.
    pub fn with(mut self, other: KeyLease) -> Self {
        self.also = Some(Box::new(other));
        self
    }

    /// Whether this lease holds a client's `Idempotency-Key` (its request
    /// is finished for the retry when its client leaves), not only a
    /// cache entry.
    pub fn is_idempotency_key(&self) -> bool {
        self.rule == Rule::Idempotency
    }

    /// Whether the key is held in this proxy's own store.
    pub fn is_local(&self) -> bool {
        self.store.is_local()
    }

    /// Largest answer kept for replay.
    pub fn cap(&self) -> usize {
        self.also
            .as_ref()
            .map_or(self.cap, |also| self.cap.max(also.cap()))
    }

    /// Settles the key for a request that ended as `ending`: stores
    /// `answer` (when the rule says so and it is given), marks it not
    /// replayable or outcome unknown (with `route`, the route record), or
    /// releases it. Store failures are counted and logged; the request's
    /// own answer is not changed by them.
    pub async fn settle(
        mut self,
        ending: Ending,
        answer: Option<StoredAnswer>,
        route: impl FnOnce() -> Bytes,
    ) {
        self.settled = true;
        if let Some(also) = self.also.take() {
            Box::pin(also.settle(ending, answer.clone(), Bytes::new)).await;
        }
        let (decision, ttl) = match self.rule {
            Rule::Idempotency => (settle(self.risk, ending, self.cap), self.ttl),
            Rule::Cache { failed_for } => {
                if router_policy::cache::keep(ending, self.cap) {
                    (Settle::Store, self.ttl)
                } else {
                    (Settle::NotReplayable, failed_for)
                }
            }
        };
        self.ttl = ttl;
        let answer = answer
            .filter(|a| a.body.len() <= self.cap)
            .map(|a| match self.rule {
                Rule::Idempotency => a,
                Rule::Cache { .. } => a.stored_at(router_policy::wall_clock::unix_ms_i64()),
            });
        let (state, event) = match (decision, answer) {
            (Settle::Store, Some(a)) => (Some(KeyState::Completed(Arc::new(a))), "store"),
            (Settle::Store | Settle::NotReplayable, _) => {
                (Some(KeyState::NotReplayable), "store_not_replayable")
            }
            (Settle::Release, _) => (None, "release"),
            (Settle::OutcomeUnknown, _) => {
                (Some(KeyState::OutcomeUnknown(route())), "outcome_unknown")
            }
        };
        self.health.events.idempotency(event);
        let done = self
            .store
            .settle(&self.key, self.owner, self.fp, state.clone(), self.ttl)
            .await;
        match done {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(
                    store = self.store.name(),
                    "idempotency claim had expired or moved on; not settled"
                )
            }
            Err(e) => {
                self.health.failed("settle", &e);
                // Left as it is, the key would stay claimed until its
                // claim expires and retries would wait for it: try again
                // a few times in the background (a short outage).
                let (store, health) = (Arc::clone(&self.store), Arc::clone(&self.health));
                let (key, owner, fp, ttl) =
                    (std::mem::take(&mut self.key), self.owner, self.fp, self.ttl);
                tokio::spawn(async move {
                    for wait in SETTLE_RETRIES {
                        tokio::time::sleep(wait).await;
                        match store.settle(&key, owner, fp, state.clone(), ttl).await {
                            Ok(_) => {
                                health.ok();
                                return;
                            }
                            Err(e) => health.failed("settle", &e),
                        }
                    }
                });
            }
        }
    }
}

impl Drop for KeyLease {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        // Unsettled: release, so that a retry is a fresh try.
        self.health.events.idempotency("release");
        let store = Arc::clone(&self.store);
        let (key, owner, fp, ttl) = (std::mem::take(&mut self.key), self.owner, self.fp, self.ttl);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = store.settle(&key, owner, fp, None, ttl).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared store that is down.
    struct Down;

    impl IdempotencyStore for Down {
        fn claim<'a>(
            &'a self,
            _: &'a str,
            _: Owner,
            _: Fingerprint,
            _: Duration,
        ) -> BoxFuture<'a, Result<ClaimResult, StoreError>> {
            Box::pin(async { Err(StoreError::Timeout) })
        }
        fn get<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>> {
            Box::pin(async { Err(StoreError::Timeout) })
        }
        fn settle<'a>(
            &'a self,
            _: &'a str,
            _: Owner,
            _: Fingerprint,
            _: Option<KeyState>,
            _: Duration,
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            Box::pin(async { Err(StoreError::Timeout) })
        }
        fn changed<'a>(&'a self, _: &'a str, wait: Duration) -> BoxFuture<'a, ()> {
            Box::pin(tokio::time::sleep(wait))
        }
        fn name(&self) -> &'static str {
            "down"
        }
    }

    fn keys(shared: Option<Arc<dyn IdempotencyStore>>) -> Keys {
        Keys::new(
            shared,
            Duration::from_secs(60),
            1024,
            (100, usize::MAX),
            Arc::new(crate::NoEvents),
        )
    }

    fn req(key: &str, fp: u8, risk: Risk) -> KeyedRequest<'_> {
        KeyedRequest {
            key,
            fp: Fingerprint([fp; 16]),
            risk,
            inflight_ttl: Duration::from_secs(30),
            wait_until: Instant::now() + Duration::from_secs(5),
        }
    }

    fn answer() -> StoredAnswer {
        StoredAnswer::keep(
            http::StatusCode::OK,
            &http::HeaderMap::new(),
            b"once",
            false,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_outage_fails_side_effects_closed_and_reads_open() {
        let k = keys(Some(Arc::new(Down)));
        for risk in [Risk::Send, Risk::Destructive] {
            assert!(matches!(
                k.begin(req("k", 1, risk)).await,
                Begin::Refuse(Refusal::StoreUnavailable)
            ));
        }
        for risk in [Risk::Read, Risk::Draft] {
            let key = format!("{risk:?}");
            match k.begin(req(&key, 1, risk)).await {
                Begin::Lead(lease) => assert!(lease.is_local()),
                _ => panic!("{risk:?}: fails open to the local store"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_joiner_gets_the_leaders_answer_and_a_mismatch_is_refused() {
        let k = Arc::new(keys(None));
        let Begin::Lead(lease) = k.begin(req("k", 1, Risk::Read)).await else {
            panic!("lead")
        };
        assert!(matches!(
            k.begin(req("k", 2, Risk::Read)).await,
            Begin::Refuse(Refusal::Mismatch(_))
        ));
        let joiner = {
            let k = Arc::clone(&k);
            tokio::spawn(async move {
                match k.begin(req("k", 1, Risk::Read)).await {
                    Begin::Replay { answer, joined } => (answer.body.clone(), joined),
                    _ => panic!("replay expected"),
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        let ending = Ending::Answered {
            outcome: router_policy::Outcome::Ok,
            bytes: 4,
            complete: true,
        };
        lease.settle(ending, Some(answer()), Bytes::new).await;
        let (body, joined) = joiner.await.unwrap_or_default();
        assert_eq!(body, "once");
        assert!(joined);
        assert!(matches!(
            k.begin(req("k", 1, Risk::Read)).await,
            Begin::Replay { joined: false, .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_without_an_answer_is_kept_as_outcome_unknown_and_a_dropped_lease_releases() {
        let k = keys(None);
        let Begin::Lead(lease) = k.begin(req("s", 1, Risk::Send)).await else {
            panic!("lead")
        };
        lease
            .settle(Ending::NoAnswer { reached: true }, None, || {
                Bytes::from_static(b"{\"request_id\":\"s\"}")
            })
            .await;
        match k.begin(req("s", 1, Risk::Send)).await {
            Begin::Refuse(Refusal::OutcomeUnknown { route, .. }) => {
                assert_eq!(route, "{\"request_id\":\"s\"}")
            }
            _ => panic!("outcome_unknown expected"),
        }
        let Begin::Lead(lease) = k.begin(req("d", 1, Risk::Send)).await else {
            panic!("lead")
        };
        drop(lease);
        tokio::task::yield_now().await;
        assert!(matches!(
            k.begin(req("d", 1, Risk::Send)).await,
            Begin::Lead(_)
        ));
    }
}
