//! The control plane's state machine: validated changes in, snapshots out.
//!
//! Every change (a policy apply or rollback, a backend set, a circuit
//! override or report, a tenant's key) is a read-modify-write: plan the next [`State`] from
//! the current one, write it to the [`Store`] as a compare-and-swap on the
//! revision, and only then make it current and publish it. Every connected
//! proxy's stream task watches the one [`Published`] value and sends the
//! new snapshot at once.
//!
//! With several replicas on one store, another replica may have written
//! first: the compare-and-swap fails, the hub reloads and plans again from
//! the newer state (so an apply that expected version 3 is refused as a
//! conflict once another replica made version 4). Writes of other replicas
//! also arrive through [`Store::follow`] and are published the same way,
//! so a proxy sees a change whichever replica it is connected to.
//!
//! Work that must happen once (pruning expired circuit overrides and old
//! policy versions) runs in [`maintenance_loop`] on the replica that holds
//! the store's singleton lease. Expired overrides are never sent anyway:
//! each carries its own expiry, so nothing stays stuck if no replica prunes.
//!
//! What proxies can make the hub hold is bounded ([`Limits`]): the record
//! of a proxy that went away is dropped once it has been gone for the
//! record TTL; each proxy's circuit reports pass a token bucket (the excess
//! is ignored, counted in its record and logged once per burst); a circuit
//! override must name a pool of the current policy and, when it names an
//! endpoint, one of that pool's endpoints; and no change is stored whose
//! snapshot would not fit in one gRPC message
//! ([`router_proto::MAX_MESSAGE_BYTES`]), so a proxy can always receive
//! what the control plane holds.
//!
//! Module map: this file holds the change loop ([`Hub::open`], the
//! compare-and-swap in `change_with`), the snapshot proxies receive and the
//! maintenance loop; each kind of change lives in its own file:
//! `policy.rs` (apply, rollback, history, explain), `backends.rs`,
//! `circuits.rs` (overrides and suspicion marks), `keys.rs` (tenants' keys),
//! `proxies.rs` (the proxies' records and report rate limits) and
//! `ramp.rs` (ramps driven from the proxies' reports); the
//! console's questions to the proxies over their streams are in
//! `decisions.rs` (route records) and `load.rs` (their pools' load), and
//! `fleet.rs` asks the same of the other replicas' proxies through the
//! store.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use prost::Message;
use router_policy::document::{load_with, PolicyDocument};
use router_policy::guard::backend_refusal;
use router_policy::health::SuspectCause;
use router_policy::{Endpoint, FieldError, Guards, Policy, QueueSettings};
use router_proto::v1 as pb;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::Limits;

use crate::store::{
    BackendSet, CircuitRecord, Contents, KeyRecord, PolicyRecord, State, Store, StoreChange,
    StoreError, StoreEvent,
};

mod backends;
mod cache;
mod circuits;
mod decisions;
mod fleet;
mod keys;
mod load;
mod policy;
mod proxies;
mod ramp;
pub use cache::{purge_on_pool_change, MAX_PURGES};
pub use circuits::check_circuit;
use circuits::retain_valid_circuits;
pub use decisions::{ProxyDecisions, StreamQuery};
pub use fleet::{answer_loop, Fleet};
pub use keys::{KEY_KEPT_AFTER_EXPIRY_MS, MAX_KEYS_PER_TENANT, MAX_KEY_NAME};
pub use load::{endpoint_quotas, ProxyLoad};
pub use policy::{validate, Applier, PolicyApplied, UnknownTenant, HISTORY_LIMIT, MAX_NOTE};
use proxies::Link;
#[cfg(test)]
use proxies::TokenBucket;
pub use ramp::{ramp_loop, with_weight, RampWindow, RolloutAction, SideSums, RAMP_AUTHOR};

/// How many times a change is planned again after losing a
/// compare-and-swap to another replica.
const WRITE_ATTEMPTS: usize = 16;

/// Why a change was refused.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The policy (or the change) is invalid.
    #[error("invalid: {}", .0.iter().map(|e| format!("{}: {}", e.field, e.reason)).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<FieldError>),
    /// The expected version is not the current one.
    #[error("conflict: the current policy version is {current}, not {expected}")]
    Conflict {
        /// What the client expected.
        expected: u64,
        /// What it is.
        current: u64,
    },
    /// Nothing to act on.
    #[error("{0}")]
    NotFound(String),
    /// The snapshot proxies would receive does not fit in one gRPC message.
    #[error(
        "the snapshot proxies would receive is {bytes} bytes, over the {limit}-byte gRPC \
         message limit (make the policy document smaller, or fewer backends)"
    )]
    TooLarge {
        /// The snapshot's encoded size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// Every proxy record is held by a connected proxy and there is room
    /// for no more.
    #[error("this control plane already holds the records of {limit} connected proxies (--max-proxy-records)")]
    TooManyProxies {
        /// The limit.
        limit: usize,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A committed change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The revision naming the new state.
    pub revision: u64,
    /// The policy version current in it.
    pub policy_version: u64,
}

/// What proxies are sent: the revision and its snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Revision.
    pub revision: u64,
    /// The store the revision counts in.
    pub store_id: String,
    /// The snapshot.
    pub snapshot: pb::Snapshot,
}

pub use crate::store::ProxyRecord;

struct Inner {
    state: State,
    history: Vec<PolicyRecord>,
    proxies: BTreeMap<String, ProxyRecord>,
    /// Proxies whose record changed since it was last published.
    proxies_changed: BTreeSet<String>,
    /// Proxies whose record was dropped since the last publication.
    proxies_removed: BTreeSet<String>,
    /// Per proxy: open streams and the circuit-report bucket.
    links: HashMap<String, Link>,
    /// The last policy version parsed for checks, and its parse: a
    /// circuit or suspicion report is checked against the policy, and a
    /// parse per report would delay the fleet's marks.
    parsed: Mutex<Option<(u64, Arc<Policy>)>>,
    /// When proxies last admitted a request with each key (by id), as
    /// they reported it to this replica; bounded by the keys stored.
    keys_used: HashMap<String, i64>,
}

/// The control plane's state, shared by the admin and stream services.
pub struct Hub {
    store: Box<dyn Store>,
    /// The store's identity, sent with every snapshot.
    store_id: String,
    limits: Limits,
    inner: Mutex<Inner>,
    /// One read-modify-write at a time in this replica (other replicas are
    /// kept out by the store's compare-and-swap).
    writer: tokio::sync::Mutex<()>,
    published: watch::Sender<Arc<Published>>,
    /// What policies and backend sets may ask for (API key variables,
    /// link-local hosts): this process's `CUSTOM_ROUTER_API_KEY_ENV_ALLOW`
    /// and `CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS`. Each proxy checks again
    /// with its own and NACKs what it does not allow.
    guards: Guards,
    /// Whether this replica held the singleton lease at the last
    /// maintenance tick.
    leading: std::sync::atomic::AtomicBool,
    /// The open streams and the decisions fetches waiting on them.
    queries: Mutex<decisions::Queries>,
    /// Ramps' step windows and paused routes (`ramp.rs`).
    ramps: Mutex<ramp::Ramps>,
    /// Questions to the other replicas in flight (`fleet.rs`).
    asking: tokio::sync::Semaphore,
}

impl Inner {
    /// Takes what one write changed: policy versions stored or removed, and
    /// the state if it is newer than ours. True if the state moved.
    fn install(&mut self, events: Vec<StoreEvent>) -> bool {
        let mut moved = false;
        for event in events {
            match event {
                StoreEvent::Policy(p) => {
                    if let Err(i) = self.history.binary_search_by_key(&p.version, |h| h.version) {
                        self.history.insert(i, p);
                    }
                }
                StoreEvent::PolicyRemoved(v) => self.history.retain(|h| h.version != v),
                StoreEvent::State(s) if s.revision > self.state.revision => {
                    self.state = s;
                    moved = true;
                }
                StoreEvent::State(_) => {}
            }
        }
        moved
    }

    fn next_policy_version(&self) -> u64 {
        self.history
            .iter()
            .map(|p| p.version)
            .max()
            .unwrap_or(0)
            .max(self.state.policy_version)
            + 1
    }
}

/// Now, in Unix milliseconds (a wall time: it is stored and shown).
pub use router_policy::wall_clock::unix_ms_i64 as now_ms;

fn snapshot_of(inner: &Inner, store_id: &str) -> Published {
    let document = inner
        .history
        .iter()
        .find(|p| p.version == inner.state.policy_version)
        .map(|p| p.document.clone())
        .unwrap_or_default();
    Published {
        revision: inner.state.revision,
        store_id: store_id.to_string(),
        snapshot: snapshot_for(&inner.state, document),
    }
}

/// The snapshot of `state` with its policy `document`.
fn snapshot_for(state: &State, document: String) -> pb::Snapshot {
    let now = now_ms();
    pb::Snapshot {
        policy_version: state.policy_version,
        policy_document: document,
        backends: state
            .backends
            .iter()
            .map(|(pool, b)| pb::PoolBackends {
                pool: pool.clone(),
                endpoints: b.endpoints.clone(),
                drained: b.drained.clone(),
            })
            .collect(),
        circuits: state
            .circuits
            .iter()
            .filter(|c| c.until_unix_ms > now)
            .map(|c| pb::CircuitOverride {
                pool: c.pool.clone(),
                endpoint: c.endpoint.clone(),
                open: c.open,
                until_unix_ms: c.until_unix_ms,
                source: c.source.clone(),
                suspect: c.suspect.clone(),
            })
            .collect(),
        keys: state
            .keys
            .iter()
            .filter(|k| k.live(now))
            .map(|k| keys::key_view(k, 0))
            .collect(),
        config_revision: state.effective_config_revision(),
        cache_purges: cache::purges_of(state),
    }
}

/// The size of the stream message that would carry `state` with a policy
/// document of `document_len` bytes, at its largest (the biggest revision,
/// a nonce, the store id); the document is counted, not copied.
fn stream_message_len(state: &State, document_len: usize, store_id: &str) -> usize {
    let without_document = pb::ControlMessage {
        revision: u64::MAX,
        nonce: uuid::Uuid::nil().to_string(),
        snapshot: Some(snapshot_for(state, String::new())),
        store_id: store_id.to_string(),
        decisions: None,
        load: None,
    }
    .encoded_len();
    let document = if document_len == 0 {
        0
    } else {
        1 + prost::encoding::encoded_len_varint(document_len as u64) + document_len
    };
    // The snapshot's own length prefix grows by at most 4 bytes with the document.
    without_document + document + 4
}

/// Refuses a next state whose snapshot would not fit in one gRPC message.
fn check_fits(state: &State, document_len: usize, store_id: &str) -> Result<(), HubError> {
    let bytes = stream_message_len(state, document_len, store_id);
    let limit = router_proto::MAX_MESSAGE_BYTES;
    if bytes > limit {
        return Err(HubError::TooLarge { bytes, limit });
    }
    Ok(())
}

/// The policy of `version` in the history, parsed (`None` when there is none
/// or it does not load).
fn policy_of(inner: &Inner, version: u64, guards: &Guards) -> Option<Arc<Policy>> {
    let mut parsed = inner.parsed.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((v, policy)) = parsed.as_ref() {
        if *v == version {
            return Some(Arc::clone(policy));
        }
    }
    let record = inner.history.iter().find(|p| p.version == version)?;
    let policy = Arc::new(load(&record.document, guards).ok()?);
    *parsed = Some((version, Arc::clone(&policy)));
    Some(policy)
}

/// A stored (so once validated) document, loaded again.
fn load(document: &str, guards: &Guards) -> Result<Policy, router_policy::PolicyError> {
    load_with(document, &QueueSettings::default(), guards)
}

impl Hub {
    /// Loads the state from `store`, and follows other writers' changes
    /// (when the store has any) for as long as the hub lives. Policies and
    /// backend sets are checked against `guards`; what proxies can make it
    /// hold is bounded by `limits`.
    pub async fn open(
        store: Box<dyn Store>,
        guards: Guards,
        limits: Limits,
    ) -> Result<Arc<Self>, HubError> {
        let store_id = store.identity().await?;
        let Contents { state, history } = store.load().await?;
        let inner = Inner {
            state,
            history,
            proxies: BTreeMap::new(),
            proxies_changed: BTreeSet::new(),
            proxies_removed: BTreeSet::new(),
            links: HashMap::new(),
            parsed: Mutex::new(None),
            keys_used: HashMap::new(),
        };
        let (published, _) = watch::channel(Arc::new(snapshot_of(&inner, &store_id)));
        let changes = store.follow();
        let hub = Arc::new(Self {
            store,
            store_id,
            limits,
            inner: Mutex::new(inner),
            writer: tokio::sync::Mutex::new(()),
            published,
            guards,
            leading: std::sync::atomic::AtomicBool::new(false),
            queries: Mutex::default(),
            ramps: Mutex::default(),
            asking: tokio::sync::Semaphore::new(crate::store::exchange::ASKS_AT_ONCE),
        });
        if let Some(changes) = changes {
            tokio::spawn(follow_store(Arc::downgrade(&hub), changes));
        }
        Ok(hub)
    }

    /// This replica's name (empty with a single control plane).
    pub fn replica(&self) -> &str {
        self.store.replica()
    }

    /// Whether this replica led (held the singleton lease) at the last
    /// maintenance tick.
    pub fn leading(&self) -> bool {
        self.leading.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The replica that leads, as this one last saw it (`None`: unknown,
    /// or a single control plane).
    pub fn leader(&self) -> Option<String> {
        self.store.singleton_holder()
    }

    /// The revision proxies are sent now.
    pub fn published_revision(&self) -> u64 {
        self.published.borrow().revision
    }

    /// Validates a policy document against this control plane's guards.
    pub fn validate(&self, document: &str) -> Result<(), Vec<FieldError>> {
        validate(document, &self.guards)
    }

    /// Takes in a change another writer made (or a fresh listing).
    pub fn take_change(&self, change: StoreChange) {
        let mut inner = self.lock();
        let moved = match change {
            StoreChange::Relisted(contents) => {
                if contents.state.revision >= inner.state.revision {
                    let moved = contents.state.revision > inner.state.revision;
                    inner.state = contents.state;
                    inner.history = contents.history;
                    moved
                } else {
                    false
                }
            }
            StoreChange::Changed(events) => inner.install(events),
        };
        if moved {
            tracing::info!(
                revision = inner.state.revision,
                policy_version = inner.state.policy_version,
                "state changed by another replica"
            );
            self.published
                .send_replace(Arc::new(snapshot_of(&inner, &self.store_id)));
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest snapshot, and every next one.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Published>> {
        self.published.subscribe()
    }

    /// The read-modify-write every change goes through: `plan` gives the
    /// next state (and a new policy version), or `None` when nothing
    /// changes; it is planned again from a reloaded state when another
    /// writer won the compare-and-swap.
    async fn change<F>(&self, plan: F) -> Result<Committed, HubError>
    where
        F: FnMut(&Inner) -> Result<Option<(State, Option<PolicyRecord>)>, HubError>,
    {
        self.change_with(plan, false).await
    }

    /// [`Self::change`]; with `early`, a change of circuits and suspicions
    /// only is pushed to this replica's proxies before it is stored (at the
    /// revision they have), so a failing endpoint's marks do not wait for
    /// the store's commit (an fsync): the marks are soft and expire, and
    /// the stored revision follows at once. A commit that fails pushes the
    /// stored state again.
    async fn change_with<F>(&self, mut plan: F, early: bool) -> Result<Committed, HubError>
    where
        F: FnMut(&Inner) -> Result<Option<(State, Option<PolicyRecord>)>, HubError>,
    {
        let _writer = self.writer.lock().await;
        let mut attempt = 0;
        loop {
            let (expected, next, policy) = {
                let inner = self.lock();
                match plan(&inner)? {
                    None => {
                        return Ok(Committed {
                            revision: inner.state.revision,
                            policy_version: inner.state.policy_version,
                        })
                    }
                    Some((mut next, policy)) => {
                        let marks_only = policy.is_none() && inner.state.marks_only_change(&next);
                        next.config_revision = if marks_only {
                            inner.state.effective_config_revision()
                        } else {
                            0
                        };
                        let document_len = match &policy {
                            Some(p) => p.document.len(),
                            None => inner
                                .history
                                .iter()
                                .find(|p| p.version == next.policy_version)
                                .map_or(0, |p| p.document.len()),
                        };
                        check_fits(&next, document_len, &self.store_id)?;
                        if early && marks_only {
                            let document = inner
                                .history
                                .iter()
                                .find(|p| p.version == next.policy_version)
                                .map(|p| p.document.clone())
                                .unwrap_or_default();
                            self.published.send_replace(Arc::new(Published {
                                revision: inner.state.revision,
                                store_id: self.store_id.clone(),
                                snapshot: snapshot_for(&next, document),
                            }));
                        }
                        (inner.state.revision, next, policy)
                    }
                }
            };
            match self.store.commit(expected, &next, policy.as_ref()).await {
                Ok(revision) => {
                    let policy_version = next.policy_version;
                    let mut inner = self.lock();
                    let mut events = vec![StoreEvent::State(State { revision, ..next })];
                    events.extend(policy.map(StoreEvent::Policy));
                    let moved = inner.install(events);
                    if moved {
                        self.published
                            .send_replace(Arc::new(snapshot_of(&inner, &self.store_id)));
                    }
                    return Ok(Committed {
                        revision,
                        policy_version,
                    });
                }
                Err(StoreError::Conflict { .. }) if attempt + 1 < WRITE_ATTEMPTS => {
                    attempt += 1;
                    let contents = self.store.load().await?;
                    self.take_change(StoreChange::Relisted(contents));
                }
                Err(e) => {
                    if early {
                        // What was pushed early was not stored: push what is.
                        let inner = self.lock();
                        self.published
                            .send_replace(Arc::new(snapshot_of(&inner, &self.store_id)));
                    }
                    return Err(e.into());
                }
            }
        }
    }

    /// Current state (for listings).
    pub fn state(&self) -> State {
        self.lock().state.clone()
    }

    /// Gives the store's leases up (on shutdown).
    pub async fn release_leases(&self) {
        if let Err(e) = self.store.release_leases().await {
            tracing::warn!(error = %e, "cannot release the leases; they expire on their own");
        }
    }
}

/// Applies other writers' changes to the hub until either goes away.
async fn follow_store(hub: Weak<Hub>, mut changes: tokio::sync::mpsc::Receiver<StoreChange>) {
    while let Some(change) = changes.recv().await {
        let Some(hub) = hub.upgrade() else { return };
        hub.take_change(change);
    }
}

/// Every second: publishes this replica's proxy records, and on the
/// replica holding the singleton lease, prunes expired circuit overrides
/// and old policy versions. Ends with the hub.
pub async fn maintenance_loop(hub: Weak<Hub>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut leading = false;
    loop {
        tick.tick().await;
        let Some(h) = hub.upgrade() else { return };
        h.prune_proxies();
        h.publish_proxies().await;
        let now_leading = match h.store.hold_singleton().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew the singleton lease");
                false
            }
        };
        if now_leading != leading {
            tracing::info!(leading = now_leading, "singleton lease changed hands");
            leading = now_leading;
        }
        h.leading
            .store(now_leading, std::sync::atomic::Ordering::Relaxed);
        if !leading {
            continue;
        }
        if let Err(e) = h.prune_expired().await {
            tracing::warn!(error = %e, "pruning expired circuits failed");
        }
        if let Err(e) = h.prune_history().await {
            tracing::warn!(error = %e, "pruning policy history failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_token_bucket_passes_a_burst_then_the_rate() {
        let now = Instant::now();
        let mut bucket = TokenBucket::full(3, now);
        let passed = (0..10).filter(|_| bucket.take(3, 2.0, now)).count();
        assert_eq!(passed, 3, "the burst");
        // Half a second at 2 per second: one more.
        let later = now + Duration::from_millis(500);
        assert!(bucket.take(3, 2.0, later));
        assert!(!bucket.take(3, 2.0, later));
        // A long pause refills up to the burst, not beyond.
        let much_later = later + Duration::from_secs(3600);
        let passed = (0..10).filter(|_| bucket.take(3, 2.0, much_later)).count();
        assert_eq!(passed, 3);
    }

    fn pool_policy() -> Policy {
        load(
            "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{name: a, endpoints: [\"127.0.0.1:9\"]}]\n  routes: [{name: r, chain: [a]}]\n",
            &Guards::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_circuit_override_must_name_a_pool_and_one_of_its_endpoints() {
        let policy = pool_policy();
        let mut state = State::default();
        let check = |state: &State, pool: &str, endpoint: &str| {
            check_circuit(state, Some(&policy), pool, endpoint)
                .map_err(|e| format!("{}: {}", e[0].field, e[0].reason))
        };
        assert_eq!(check(&state, "a", ""), Ok(()));
        assert_eq!(check(&state, "a", "127.0.0.1:9"), Ok(()));
        // Another spelling of the same endpoint.
        assert_eq!(check(&state, "a", "http://127.0.0.1:9"), Ok(()));
        let err = check(&state, "a", "127.0.0.1").unwrap_err();
        assert!(
            err.starts_with("endpoint: ") && err.contains("missing port"),
            "{err}"
        );
        let err = check(&state, "b", "").unwrap_err();
        assert!(err.starts_with("pool: "), "{err}");
        let err = check(&state, "a", "127.0.0.1:10").unwrap_err();
        assert!(err.contains("its endpoints: http://127.0.0.1:9"), "{err}");
        assert!(
            check_circuit(&state, None, "a", "").is_err(),
            "no policy yet"
        );
        // A backend set replaces the policy's endpoints.
        state.backends.insert(
            "a".into(),
            BackendSet {
                endpoints: vec!["127.0.0.1:10".into()],
                drained: vec![],
            },
        );
        assert_eq!(check(&state, "a", "127.0.0.1:10"), Ok(()));
        assert!(check(&state, "a", "127.0.0.1:9").is_err());
    }

    #[test]
    fn the_snapshot_size_is_counted_as_proxies_receive_it() {
        let state = State {
            revision: 7,
            policy_version: 1,
            ..State::default()
        };
        let document = "x".repeat(100_000);
        let estimate = stream_message_len(&state, document.len(), "store");
        let sent = pb::ControlMessage {
            revision: 7,
            nonce: uuid::Uuid::now_v7().to_string(),
            snapshot: Some(snapshot_for(&state, document)),
            store_id: "store".into(),
            decisions: None,
            load: None,
        }
        .encoded_len();
        assert!(
            estimate >= sent && estimate <= sent + 32,
            "{estimate} vs {sent}"
        );
        assert!(check_fits(&state, router_proto::MAX_MESSAGE_BYTES, "store").is_err());
        assert!(check_fits(&state, 1000, "store").is_ok());
    }
}
