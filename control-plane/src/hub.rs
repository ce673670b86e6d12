//! The control plane's state machine: validated changes in, snapshots out.
//!
//! Every change (a policy apply or rollback, a backend set, a circuit
//! override or report) is a read-modify-write: plan the next [`State`] from
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

mod keys;
pub use keys::{KEY_KEPT_AFTER_EXPIRY_MS, MAX_KEYS_PER_TENANT, MAX_KEY_NAME};

/// How many times a change is planned again after losing a
/// compare-and-swap to another replica.
const WRITE_ATTEMPTS: usize = 16;

/// How many policy versions the history keeps (the current one is always kept).
pub const HISTORY_LIMIT: usize = 100;

/// What applying a policy did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyApplied {
    /// The version now current (the new one, or the unchanged current).
    pub version: u64,
    /// The store's revision.
    pub revision: u64,
    /// Whether a new version was made.
    pub changed: bool,
}

/// Who applies a policy (or rolls one back), and why, for its history.
#[derive(Debug, Clone, Copy, Default)]
pub struct Applier<'a> {
    /// Who, as the client said (`$USER`).
    pub author: &'a str,
    /// The caller's token: its name, else its role (`operator`, `open`).
    pub operator: &'a str,
    /// The operator's note (`policy apply --note`); may be empty.
    pub message: &'a str,
}

/// The longest note a policy version may carry.
pub const MAX_NOTE: usize = 512;

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

/// What the hub keeps per proxy beside its record (not stored).
struct Link {
    /// Streams open with this node id (a record is `connected` while any is).
    streams: u32,
    /// Circuit reports it may still send.
    reports: TokenBucket,
    /// Whether its reports are being dropped now (to log once per burst).
    dropping: bool,
}

/// A token bucket: `burst` at once, `rate` per second in the long run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn full(burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            last: now,
        }
    }

    /// Takes one token if there is one (refilled for the time since the
    /// last call).
    pub(crate) fn take(&mut self, burst: u32, rate: f64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.max(0.0)).min(f64::from(burst));
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
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

/// Now, in Unix milliseconds.
#[allow(clippy::disallowed_methods)] // a wall time is the point: it is stored and shown
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

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

/// Checks a circuit override against `policy` and the backend sets of
/// `state`: the pool must exist, and a named endpoint must parse (with its
/// port) and be one of the pool's endpoints (its backend set when it has
/// one, else the policy's). Every problem, with its field.
pub fn check_circuit(
    state: &State,
    policy: Option<&Policy>,
    pool: &str,
    endpoint: &str,
) -> Result<(), Vec<FieldError>> {
    let field = |field: &str, reason: String| {
        vec![FieldError {
            field: field.into(),
            reason,
        }]
    };
    if pool.is_empty() {
        return Err(field("pool", "required".into()));
    }
    let Some(policy) = policy else {
        return Err(field("pool", "no policy applied yet".into()));
    };
    let Some(p) = policy.pool(pool) else {
        return Err(field(
            "pool",
            format!("the current policy has no pool {pool:?}"),
        ));
    };
    if endpoint.is_empty() {
        return Ok(());
    }
    let wanted = Endpoint::parse(endpoint).map_err(|e| field("endpoint", e.to_string()))?;
    let endpoints: Vec<Endpoint> = match state.backends.get(pool) {
        Some(set) => set
            .endpoints
            .iter()
            .filter_map(|e| Endpoint::parse(e).ok())
            .collect(),
        None => p.endpoints.clone(),
    };
    if endpoints.contains(&wanted) {
        return Ok(());
    }
    let known: Vec<String> = endpoints.iter().take(5).map(ToString::to_string).collect();
    Err(field(
        "endpoint",
        format!(
            "{endpoint} is not an endpoint of pool {pool} ({}{})",
            if known.is_empty() {
                "it has none".to_string()
            } else {
                format!("its endpoints: {}", known.join(", "))
            },
            if endpoints.len() > known.len() {
                ", ..."
            } else {
                ""
            }
        ),
    ))
}

/// Drops the circuit overrides `policy` and the backend sets of `state` no
/// longer allow (a pool removed, an endpoint no longer in its pool).
fn retain_valid_circuits(state: &mut State, policy: Option<&Policy>) {
    let before = state.circuits.len();
    let circuits = std::mem::take(&mut state.circuits);
    state.circuits = circuits
        .into_iter()
        .filter(|c| check_circuit(state, policy, &c.pool, &c.endpoint).is_ok())
        .collect();
    if state.circuits.len() != before {
        tracing::info!(
            dropped = before - state.circuits.len(),
            "circuit overrides of pools or endpoints that are gone are dropped"
        );
    }
}

/// Validates a policy document with the same rules as `routerctl policy
/// validate`, against `guards`.
pub fn validate(document: &str, guards: &Guards) -> Result<(), Vec<FieldError>> {
    PolicyDocument::parse(document)
        .and_then(|d| d.validate_with(&QueueSettings::default(), guards))
        .map(|_| ())
        .map_err(|e| e.errors)
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
        });
        if let Some(changes) = changes {
            tokio::spawn(follow_store(Arc::downgrade(&hub), changes));
        }
        Ok(hub)
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

    /// Applies (or with `dry_run` only validates) a policy. Returns the
    /// version it got (or would get) and the revision.
    pub async fn apply_policy(
        &self,
        document: &str,
        dry_run: bool,
        expected_version: u64,
        author: &str,
    ) -> Result<(u64, u64), HubError> {
        self.apply_policy_checked(document, dry_run, expected_version, author)
            .await
            .map(|a| (a.version, a.revision))
    }

    /// [`Hub::apply_policy_by`] with only the client's author name.
    pub async fn apply_policy_checked(
        &self,
        document: &str,
        dry_run: bool,
        expected_version: u64,
        author: &str,
    ) -> Result<PolicyApplied, HubError> {
        let who = Applier {
            author,
            ..Applier::default()
        };
        self.apply_policy_by(document, dry_run, expected_version, &who)
            .await
    }

    /// [`Hub::apply_policy`], saying whether a new version was made: a
    /// document that reads the same as the current one (comments and
    /// layout aside) is not applied again; the answer names the current
    /// version, `changed: false`. `who` goes into the version's record.
    pub async fn apply_policy_by(
        &self,
        document: &str,
        dry_run: bool,
        expected_version: u64,
        who: &Applier<'_>,
    ) -> Result<PolicyApplied, HubError> {
        check_note(who.message)?;
        let author = who.author;
        let span = tracing::info_span!(
            "policy.apply",
            dry_run,
            router.policy_version = tracing::field::Empty,
            router.revision = tracing::field::Empty
        );
        async {
            {
                let _validate = tracing::info_span!("policy.validate").entered();
                self.validate(document).map_err(HubError::Invalid)?;
            }
            let check = |inner: &Inner| {
                let current = inner.state.policy_version;
                if expected_version != 0 && expected_version != current {
                    return Err(HubError::Conflict {
                        expected: expected_version,
                        current,
                    });
                }
                Ok(inner.next_policy_version())
            };
            // The same document as the current one (parsed: comments and
            // layout do not count) makes no new version.
            let same_as_current = |inner: &Inner| {
                let current = inner
                    .history
                    .iter()
                    .find(|p| p.version == inner.state.policy_version)?;
                let same = PolicyDocument::parse(&current.document).ok()?
                    == PolicyDocument::parse(document).ok()?;
                same.then_some(current.version)
            };
            let too_large = |e: HubError| match e {
                HubError::TooLarge { .. } => HubError::Invalid(vec![FieldError {
                    field: "document".into(),
                    reason: e.to_string(),
                }]),
                e => e,
            };
            if dry_run {
                let inner = self.lock();
                let version = check(&inner)?;
                if let Some(current) = same_as_current(&inner) {
                    return Ok(PolicyApplied {
                        version: current,
                        revision: inner.state.revision,
                        changed: false,
                    });
                }
                let next = with_policy(&inner, document, version, &self.guards);
                check_fits(&next, document.len(), &self.store_id).map_err(too_large)?;
                return Ok(PolicyApplied {
                    version,
                    revision: inner.state.revision,
                    changed: true,
                });
            }
            let mut changed = true;
            let done = self
                .change(|inner| {
                    let version = check(inner)?;
                    if same_as_current(inner).is_some() {
                        changed = false;
                        return Ok(None);
                    }
                    changed = true;
                    let record = PolicyRecord {
                        version,
                        document: document.to_string(),
                        applied_at_unix_ms: now_ms(),
                        author: author.to_string(),
                        note: "apply".into(),
                        operator: who.operator.to_string(),
                        message: who.message.to_string(),
                    };
                    let next = with_policy(inner, document, version, &self.guards);
                    Ok(Some((next, Some(record))))
                })
                .await
                .map_err(too_large)?;
            let span = tracing::Span::current();
            span.record("router.policy_version", done.policy_version);
            span.record("router.revision", done.revision);
            if changed {
                tracing::info!(
                    version = done.policy_version,
                    revision = done.revision,
                    author,
                    "policy applied"
                );
            } else {
                tracing::info!(
                    version = done.policy_version,
                    author,
                    "policy unchanged: the same document as the current version"
                );
            }
            Ok(PolicyApplied {
                version: done.policy_version,
                revision: done.revision,
                changed,
            })
        }
        .instrument(span)
        .await
    }

    /// Makes an earlier version current again (as a new version).
    pub async fn rollback(
        &self,
        to_version: u64,
        expected_version: u64,
    ) -> Result<(u64, u64), HubError> {
        self.rollback_by(to_version, expected_version, &Applier::default())
            .await
    }

    /// [`Hub::rollback`], recording `who` with the new version.
    pub async fn rollback_by(
        &self,
        to_version: u64,
        expected_version: u64,
        who: &Applier<'_>,
    ) -> Result<(u64, u64), HubError> {
        check_note(who.message)?;
        let mut target = 0;
        let done = self
            .change(|inner| {
                let current = inner.state.policy_version;
                if expected_version != 0 && expected_version != current {
                    return Err(HubError::Conflict {
                        expected: expected_version,
                        current,
                    });
                }
                let wanted = if to_version == 0 {
                    inner
                        .history
                        .iter()
                        .filter(|p| p.version < current && p.note == "apply")
                        .map(|p| p.version)
                        .max()
                        .or_else(|| {
                            inner
                                .history
                                .iter()
                                .filter(|p| p.version < current)
                                .map(|p| p.version)
                                .max()
                        })
                } else {
                    Some(to_version)
                };
                let wanted = wanted.ok_or_else(|| {
                    HubError::NotFound("no earlier version to roll back to".into())
                })?;
                let document = inner
                    .history
                    .iter()
                    .find(|p| p.version == wanted)
                    .map(|p| p.document.clone())
                    .ok_or_else(|| HubError::NotFound(format!("no policy version {wanted}")))?;
                // Checked again: the guards may have narrowed since.
                self.validate(&document).map_err(HubError::Invalid)?;
                target = wanted;
                let version = inner.next_policy_version();
                let next = with_policy(inner, &document, version, &self.guards);
                let record = PolicyRecord {
                    version,
                    document,
                    applied_at_unix_ms: now_ms(),
                    author: if who.author.is_empty() {
                        "rollback".into()
                    } else {
                        who.author.to_string()
                    },
                    note: format!("rollback to {wanted}"),
                    operator: who.operator.to_string(),
                    message: who.message.to_string(),
                };
                Ok(Some((next, Some(record))))
            })
            .await?;
        tracing::info!(
            version = done.policy_version,
            target,
            revision = done.revision,
            "policy rolled back"
        );
        Ok((done.policy_version, done.revision))
    }

    /// A policy version (0: current).
    pub fn policy(&self, version: u64) -> Option<PolicyRecord> {
        let inner = self.lock();
        let v = if version == 0 {
            inner.state.policy_version
        } else {
            version
        };
        inner.history.iter().find(|p| p.version == v).cloned()
    }

    /// Every version, oldest first.
    pub fn history(&self) -> Vec<PolicyRecord> {
        self.lock().history.clone()
    }

    /// Current state (for listings).
    pub fn state(&self) -> State {
        self.lock().state.clone()
    }

    /// Replaces a pool's backend set.
    pub async fn set_backends(
        &self,
        pool: &str,
        endpoints: Vec<String>,
        drained: Vec<String>,
    ) -> Result<u64, HubError> {
        let mut errors = Vec::new();
        for (i, e) in endpoints.iter().enumerate() {
            let refused = match Endpoint::parse(e) {
                Ok(ep) => backend_refusal(&ep, &self.guards.backend_hosts),
                Err(err) => Some(err.to_string()),
            };
            if let Some(reason) = refused {
                errors.push(FieldError {
                    field: format!("endpoints[{i}]"),
                    reason,
                });
            }
        }
        // Drained entries are kept as their endpoint is written, so the
        // proxies match them exactly.
        let mut drained_as_written = Vec::with_capacity(drained.len());
        for (i, d) in drained.iter().enumerate() {
            match endpoints.iter().find(|e| Endpoint::same_address(e, d)) {
                Some(e) => drained_as_written.push(e.clone()),
                None => errors.push(FieldError {
                    field: format!("drained[{i}]"),
                    reason: format!("{d} is not one of the endpoints"),
                }),
            }
        }
        let drained = drained_as_written;
        if pool.is_empty() {
            errors.push(FieldError {
                field: "pool".into(),
                reason: "required".into(),
            });
        }
        if !errors.is_empty() {
            return Err(HubError::Invalid(errors));
        }
        let set = BackendSet { endpoints, drained };
        self.change(|inner| {
            check_pool_exists(inner, pool, &self.guards)?;
            let mut next = inner.state.clone();
            next.backends.insert(pool.to_string(), set.clone());
            retain_valid_circuits(
                &mut next,
                policy_of(inner, inner.state.policy_version, &self.guards).as_deref(),
            );
            Ok(Some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }

    /// Drains one endpoint of a pool's backend set.
    pub async fn drain(&self, pool: &str, endpoint: &str) -> Result<u64, HubError> {
        self.change(|inner| {
            let current = inner.state.backends.get(pool).ok_or_else(|| {
                HubError::NotFound(format!("no backend set for pool {pool:?} (set it first)"))
            })?;
            // Compared as endpoints: health and metrics show
            // `http://host:port` for a backend set as `host:port`.
            let Some(endpoint) = current
                .endpoints
                .iter()
                .find(|e| Endpoint::same_address(e, endpoint))
                .cloned()
            else {
                return Err(HubError::NotFound(format!(
                    "{endpoint} is not a backend of {pool} (its backends: {})",
                    current.endpoints.join(", ")
                )));
            };
            if current.drained.contains(&endpoint) {
                return Ok(None);
            }
            let mut next = inner.state.clone();
            if let Some(set) = next.backends.get_mut(pool) {
                set.drained.push(endpoint);
            }
            Ok(Some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }

    /// Forces a circuit open (or closed) for a while; `open: false` with no
    /// duration clears overrides of that target. A new override must name a
    /// pool of the current policy and, if any, one of its endpoints
    /// ([`check_circuit`]), or it is refused with the field; clearing is
    /// refused only when it matches no override and would be invalid (a
    /// typo), so an override left on a removed endpoint can still be cleared.
    pub async fn set_circuit(
        &self,
        pool: &str,
        endpoint: &str,
        open: bool,
        for_secs: u64,
        source: &str,
    ) -> Result<u64, HubError> {
        let secs = if for_secs == 0 {
            300
        } else {
            for_secs.min(86_400)
        };
        let until = now_ms() + i64::try_from(secs * 1000).unwrap_or(i64::MAX);
        let creates = open || for_secs > 0;
        self.change(|inner| {
            // A pool-wide change (no endpoint) replaces every override of
            // the pool, the per-endpoint ones too: `circuits close POOL`
            // clears them all, `circuits open POOL` opens the whole pool.
            // Opening replaces circuits only; closing clears the
            // suspicions too (an operator who closes says "send to it").
            let matches = |c: &CircuitRecord| {
                c.pool == pool
                    && (endpoint.is_empty() || Endpoint::same_address(&c.endpoint, endpoint))
                    && (c.source == source || source == "operator")
                    && (c.suspect.is_empty() || !open)
            };
            if creates || !inner.state.circuits.iter().any(matches) {
                let policy = policy_of(inner, inner.state.policy_version, &self.guards);
                check_circuit(&inner.state, policy.as_deref(), pool, endpoint)
                    .map_err(HubError::Invalid)?;
            }
            let mut next = inner.state.clone();
            next.circuits.retain(|c| !matches(c));
            if creates {
                next.circuits.push(CircuitRecord {
                    pool: pool.to_string(),
                    endpoint: endpoint.to_string(),
                    open,
                    until_unix_ms: until,
                    source: source.to_string(),
                    suspect: String::new(),
                });
            }
            Ok((next.circuits != inner.state.circuits).then_some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }

    /// A proxy's circuit transition: an open circuit is shared with every
    /// proxy until its expiry; a closed one withdraws that proxy's report.
    /// A suspicion (`report.suspect`) is kept apart from circuits the same
    /// way, except that a cleared one (a check passed, an answer came)
    /// clears every proxy's of that cause.
    /// Reports through different replicas land in the one stored list, so
    /// the fleet has one view. An open report is checked as an operator's
    /// override is ([`check_circuit`]): a proxy of another version cannot
    /// plant an override the others would have to skip.
    pub async fn report_circuit(
        &self,
        node: &str,
        report: &pb::CircuitReport,
    ) -> Result<u64, HubError> {
        self.change_with(
            |inner| {
                let now = now_ms();
                if report.open {
                    let policy = policy_of(inner, inner.state.policy_version, &self.guards);
                    check_circuit(
                        &inner.state,
                        policy.as_deref(),
                        &report.pool,
                        &report.endpoint,
                    )
                    .map_err(HubError::Invalid)?;
                }
                if !report.suspect.is_empty() && SuspectCause::parse(&report.suspect).is_none() {
                    return Err(HubError::Invalid(vec![FieldError {
                        field: "suspect".into(),
                        reason: format!("unknown cause {:?} (check, attempt)", report.suspect),
                    }]));
                }
                let mut next = inner.state.clone();
                // A passing check or an answer clears that cause's suspicion
                // for every proxy (router_policy::health); anything else
                // replaces this proxy's own record of the same kind.
                let clears_all = !report.open && !report.suspect.is_empty();
                next.circuits.retain(|c| {
                    !(c.pool == report.pool
                        && c.endpoint == report.endpoint
                        && c.suspect == report.suspect
                        && (c.source == node || clears_all))
                });
                if report.open && report.until_unix_ms > now {
                    next.circuits.push(CircuitRecord {
                        pool: report.pool.clone(),
                        endpoint: report.endpoint.clone(),
                        open: true,
                        // A proxy may not hold the fleet's circuit open for long.
                        until_unix_ms: report.until_unix_ms.min(now + 600_000),
                        source: node.to_string(),
                        suspect: report.suspect.clone(),
                    });
                }
                Ok((next.circuits != inner.state.circuits).then_some((next, None)))
            },
            true,
        )
        .await
        .map(|c| c.revision)
    }

    /// Drops expired circuit overrides, and keys a day past their expiry
    /// (a change only when some expired).
    pub async fn prune_expired(&self) -> Result<(), HubError> {
        self.change(|inner| {
            let now = now_ms();
            let kept = |k: &KeyRecord| k.live(now - KEY_KEPT_AFTER_EXPIRY_MS);
            if inner.state.circuits.iter().all(|c| c.until_unix_ms > now)
                && inner.state.keys.iter().all(kept)
            {
                return Ok(None);
            }
            let mut next = inner.state.clone();
            next.circuits.retain(|c| c.until_unix_ms > now);
            next.keys.retain(kept);
            Ok(Some((next, None)))
        })
        .await
        .map(|_| ())
    }

    /// Removes all but the newest [`HISTORY_LIMIT`] policy versions (never
    /// the current one). Returns how many went.
    pub async fn prune_history(&self) -> Result<usize, HubError> {
        let old: Vec<u64> = {
            let inner = self.lock();
            let excess = inner.history.len().saturating_sub(HISTORY_LIMIT);
            inner
                .history
                .iter()
                .take(excess)
                .map(|p| p.version)
                .filter(|v| *v != inner.state.policy_version)
                .collect()
        };
        if old.is_empty() {
            return Ok(0);
        }
        self.store.remove_policies(&old).await?;
        self.lock().history.retain(|p| !old.contains(&p.version));
        tracing::info!(removed = old.len(), "old policy versions pruned");
        Ok(old.len())
    }

    /// Gives the store's leases up (on shutdown).
    pub async fn release_leases(&self) {
        if let Err(e) = self.store.release_leases().await {
            tracing::warn!(error = %e, "cannot release the leases; they expire on their own");
        }
    }

    /// Records what a proxy said.
    pub fn proxy_seen(&self, node: &str, update: impl FnOnce(&mut ProxyRecord)) {
        let mut inner = self.lock();
        Self::touch(&mut inner, self.store.replica(), node, update);
    }

    fn touch(inner: &mut Inner, replica: &str, node: &str, update: impl FnOnce(&mut ProxyRecord)) {
        let rec = inner.proxies.entry(node.to_string()).or_default();
        rec.last_seen_unix_ms = now_ms();
        replica.clone_into(&mut rec.control_plane);
        update(rec);
        inner.proxies_changed.insert(node.to_string());
        inner.proxies_removed.remove(node);
    }

    fn link<'a>(inner: &'a mut Inner, limits: &Limits, node: &str) -> &'a mut Link {
        inner.links.entry(node.to_string()).or_insert_with(|| Link {
            streams: 0,
            reports: TokenBucket::full(limits.circuit_report_burst, Instant::now()),
            dropping: false,
        })
    }

    /// A proxy opened a stream (it is `connected` until its last one closes).
    ///
    /// A node id not seen before, with [`Limits::max_proxy_records`]
    /// records held, takes the place of the disconnected record seen
    /// longest ago; when every record is connected, it is refused.
    pub fn proxy_connected(&self, node: &str, last_applied_revision: u64) -> Result<(), HubError> {
        let mut inner = self.lock();
        let limit = self.limits.max_proxy_records;
        if !inner.proxies.contains_key(node) && inner.proxies.len() >= limit {
            let oldest = inner
                .proxies
                .iter()
                .filter(|(n, _)| inner.links.get(*n).is_none_or(|l| l.streams == 0))
                .min_by_key(|(_, p)| p.last_seen_unix_ms)
                .map(|(n, _)| n.clone());
            let Some(oldest) = oldest else {
                return Err(HubError::TooManyProxies { limit });
            };
            inner.proxies.remove(&oldest);
            inner.proxies_changed.remove(&oldest);
            inner.links.remove(&oldest);
            tracing::info!(node = %oldest, "proxy record dropped for a new proxy (--max-proxy-records)");
            inner.proxies_removed.insert(oldest);
        }
        Self::link(&mut inner, &self.limits, node).streams += 1;
        Self::touch(&mut inner, self.store.replica(), node, |p| {
            p.connected = true;
            p.applied_revision = last_applied_revision;
        });
        Ok(())
    }

    /// A proxy's stream closed.
    pub fn proxy_disconnected(&self, node: &str) {
        let mut inner = self.lock();
        let link = Self::link(&mut inner, &self.limits, node);
        link.streams = link.streams.saturating_sub(1);
        let connected = link.streams > 0;
        Self::touch(&mut inner, self.store.replica(), node, |p| {
            p.connected = connected;
        });
    }

    /// Whether a circuit report from `node` may go through its token bucket
    /// now; one that may not is counted in its record, and the first of a
    /// burst is logged.
    pub fn allow_circuit_report(&self, node: &str) -> bool {
        let limits = self.limits;
        let mut inner = self.lock();
        let link = Self::link(&mut inner, &limits, node);
        let allowed = link.reports.take(
            limits.circuit_report_burst,
            limits.circuit_reports_per_second,
            Instant::now(),
        );
        let first_dropped = !allowed && !link.dropping;
        link.dropping = !allowed;
        if !allowed {
            let mut dropped = 0;
            Self::touch(&mut inner, self.store.replica(), node, |p| {
                p.circuit_reports_dropped += 1;
                dropped = p.circuit_reports_dropped;
            });
            if first_dropped {
                tracing::warn!(
                    node,
                    dropped,
                    burst = limits.circuit_report_burst,
                    per_second = limits.circuit_reports_per_second,
                    "circuit reports over the rate limit: ignoring the excess"
                );
            }
        }
        allowed
    }

    /// Drops the records of proxies gone for longer than the record TTL
    /// (every replica its own; the store forgets them at the next
    /// publication). Returns how many went.
    pub fn prune_proxies(&self) -> usize {
        let ttl = i64::try_from(self.limits.proxy_record_ttl.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(ttl);
        let mut inner = self.lock();
        let gone: Vec<String> = inner
            .proxies
            .iter()
            .filter(|(_, p)| !p.connected && p.last_seen_unix_ms < cutoff)
            .map(|(node, _)| node.clone())
            .collect();
        for node in &gone {
            inner.proxies.remove(node);
            inner.proxies_changed.remove(node);
            if inner.links.get(node).is_some_and(|l| l.streams == 0) {
                inner.links.remove(node);
            }
            inner.proxies_removed.insert(node.clone());
        }
        if !gone.is_empty() {
            tracing::info!(
                removed = gone.len(),
                "records of proxies gone for longer than the TTL dropped"
            );
        }
        gone.len()
    }

    /// Every proxy seen by this replica.
    pub fn proxies(&self) -> BTreeMap<String, ProxyRecord> {
        self.lock().proxies.clone()
    }

    /// Every proxy of the fleet: this replica's, and those the other
    /// replicas published (within a second of their change). A proxy that
    /// moved between replicas is shown where it is connected now, else
    /// where it was seen last.
    pub async fn fleet_proxies(&self) -> BTreeMap<String, ProxyRecord> {
        let mut fleet = self.proxies();
        let published = match self.store.fleet_proxies().await {
            Ok(Some(p)) => p,
            Ok(None) => return fleet,
            Err(e) => {
                tracing::warn!(error = %e, "other replicas' proxies unavailable; listing this replica's");
                return fleet;
            }
        };
        for (node, record) in published {
            let better = match fleet.get(&node) {
                None => true,
                Some(have) => {
                    (record.connected, record.last_seen_unix_ms)
                        > (have.connected, have.last_seen_unix_ms)
                }
            };
            if better {
                fleet.insert(node, record);
            }
        }
        fleet
    }

    /// Publishes the proxy records that changed (every second).
    async fn publish_proxies(&self) {
        let (all, changed, removed) = {
            let mut inner = self.lock();
            let changed: Vec<String> = std::mem::take(&mut inner.proxies_changed)
                .into_iter()
                .collect();
            let removed: Vec<String> = std::mem::take(&mut inner.proxies_removed)
                .into_iter()
                .collect();
            (inner.proxies.clone(), changed, removed)
        };
        if let Err(e) = self.store.publish_proxies(&all, &changed, &removed).await {
            tracing::warn!(error = %e, "cannot publish this replica's proxies");
            // Try those again next time (unless they came back meanwhile).
            let mut inner = self.lock();
            inner.proxies_changed.extend(changed);
            let back: Vec<String> = removed
                .into_iter()
                .filter(|n| !inner.proxies.contains_key(n))
                .collect();
            inner.proxies_removed.extend(back);
        }
    }

    /// The tenants the current policy names (none before a policy).
    pub fn tenant_names(&self) -> Vec<String> {
        let inner = self.lock();
        let version = inner.state.policy_version;
        policy_of(&inner, version, &self.guards)
            .and_then(|p| {
                p.tenants
                    .as_ref()
                    .map(|t| t.list().iter().map(|t| t.name.clone()).collect())
            })
            .unwrap_or_default()
    }

    /// Explains a situation against the current policy.
    pub fn explain(&self, situation_json: &str) -> Result<String, HubError> {
        let situation: router_policy::decide::Situation = serde_json::from_str(situation_json)
            .map_err(|e| {
                HubError::Invalid(vec![FieldError {
                    field: "situation".into(),
                    reason: e.to_string(),
                }])
            })?;
        let record = self
            .policy(0)
            .ok_or_else(|| HubError::NotFound("no policy applied yet".into()))?;
        let policy =
            load(&record.document, &self.guards).map_err(|e| HubError::Invalid(e.errors))?;
        router_policy::decide::check_situation(&policy, &situation)
            .map_err(|e| HubError::Invalid(vec![e]))?;
        let answer = router_policy::decide::explain(&policy, &situation);
        serde_json::to_string(&answer).map_err(|e| {
            HubError::Invalid(vec![FieldError {
                field: "situation".into(),
                reason: e.to_string(),
            }])
        })
    }
}

/// Refuses a note too long to show, or with control characters.
fn check_note(note: &str) -> Result<(), HubError> {
    if note.len() > MAX_NOTE || note.chars().any(char::is_control) {
        return Err(HubError::Invalid(vec![FieldError {
            field: "note".into(),
            reason: format!("at most {MAX_NOTE} bytes on one line, without control characters"),
        }]));
    }
    Ok(())
}

/// The next state with `document` current: backend sets of pools it no
/// longer has are dropped (proxies would refuse a snapshot with a backend
/// set for an unknown pool), and so are circuit overrides of pools or
/// endpoints it no longer has.
fn with_policy(inner: &Inner, document: &str, version: u64, guards: &Guards) -> State {
    let mut next = inner.state.clone();
    next.policy_version = version;
    if let Ok(policy) = load(document, guards) {
        let before = next.backends.len();
        next.backends.retain(|pool, _| policy.pool(pool).is_some());
        retain_valid_circuits(&mut next, Some(&policy));
        if next.backends.len() != before {
            tracing::info!(
                dropped = before - next.backends.len(),
                "backend sets of pools the new policy removes are dropped"
            );
        }
    }
    next
}

/// Refuses a backend set for a pool the current policy does not have.
fn check_pool_exists(inner: &Inner, pool: &str, guards: &Guards) -> Result<(), HubError> {
    let Some(p) = inner
        .history
        .iter()
        .find(|p| p.version == inner.state.policy_version)
    else {
        return Ok(());
    };
    match load(&p.document, guards) {
        Ok(policy) if policy.pool(pool).is_none() => Err(HubError::Invalid(vec![FieldError {
            field: "pool".into(),
            reason: format!("the current policy has no pool {pool:?}"),
        }])),
        _ => Ok(()),
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
