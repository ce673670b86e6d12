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

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use router_policy::document::{load_with, PolicyDocument};
use router_policy::guard::backend_refusal;
use router_policy::{Endpoint, FieldError, Guards, Policy, QueueSettings};
use router_proto::v1 as pb;
use tokio::sync::watch;
use tracing::Instrument;

use crate::store::{
    BackendSet, CircuitRecord, Contents, PolicyRecord, State, Store, StoreChange, StoreError,
    StoreEvent,
};

/// How many times a change is planned again after losing a
/// compare-and-swap to another replica.
const WRITE_ATTEMPTS: usize = 16;

/// How many policy versions the history keeps (the current one is always kept).
pub const HISTORY_LIMIT: usize = 100;

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
    /// The snapshot.
    pub snapshot: pb::Snapshot,
}

pub use crate::store::ProxyRecord;

struct Inner {
    state: State,
    history: Vec<PolicyRecord>,
    proxies: BTreeMap<String, ProxyRecord>,
    /// Proxies whose record changed since it was last published.
    proxies_changed: std::collections::BTreeSet<String>,
}

/// The control plane's state, shared by the admin and stream services.
pub struct Hub {
    store: Box<dyn Store>,
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

fn snapshot_of(inner: &Inner) -> Published {
    let now = now_ms();
    let document = inner
        .history
        .iter()
        .find(|p| p.version == inner.state.policy_version)
        .map(|p| p.document.clone())
        .unwrap_or_default();
    Published {
        revision: inner.state.revision,
        snapshot: pb::Snapshot {
            policy_version: inner.state.policy_version,
            policy_document: document,
            backends: inner
                .state
                .backends
                .iter()
                .map(|(pool, b)| pb::PoolBackends {
                    pool: pool.clone(),
                    endpoints: b.endpoints.clone(),
                    drained: b.drained.clone(),
                })
                .collect(),
            circuits: inner
                .state
                .circuits
                .iter()
                .filter(|c| c.until_unix_ms > now)
                .map(|c| pb::CircuitOverride {
                    pool: c.pool.clone(),
                    endpoint: c.endpoint.clone(),
                    open: c.open,
                    until_unix_ms: c.until_unix_ms,
                    source: c.source.clone(),
                })
                .collect(),
        },
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
    /// backend sets are checked against `guards`.
    pub async fn open(store: Box<dyn Store>, guards: Guards) -> Result<Arc<Self>, HubError> {
        let Contents { state, history } = store.load().await?;
        let inner = Inner {
            state,
            history,
            proxies: BTreeMap::new(),
            proxies_changed: Default::default(),
        };
        let (published, _) = watch::channel(Arc::new(snapshot_of(&inner)));
        let changes = store.follow();
        let hub = Arc::new(Self {
            store,
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
            self.published.send_replace(Arc::new(snapshot_of(&inner)));
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
    async fn change<F>(&self, mut plan: F) -> Result<Committed, HubError>
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
                    Some((next, policy)) => (inner.state.revision, next, policy),
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
                        self.published.send_replace(Arc::new(snapshot_of(&inner)));
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
                Err(e) => return Err(e.into()),
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
            if dry_run {
                let inner = self.lock();
                return Ok((check(&inner)?, inner.state.revision));
            }
            let done = self
                .change(|inner| {
                    let version = check(inner)?;
                    let record = PolicyRecord {
                        version,
                        document: document.to_string(),
                        applied_at_unix_ms: now_ms(),
                        author: author.to_string(),
                        note: "apply".into(),
                    };
                    let next = with_policy(inner, document, version, &self.guards);
                    Ok(Some((next, Some(record))))
                })
                .await?;
            let span = tracing::Span::current();
            span.record("router.policy_version", done.policy_version);
            span.record("router.revision", done.revision);
            tracing::info!(
                version = done.policy_version,
                revision = done.revision,
                author,
                "policy applied"
            );
            Ok((done.policy_version, done.revision))
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
                    author: "rollback".into(),
                    note: format!("rollback to {wanted}"),
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
        for (i, d) in drained.iter().enumerate() {
            if !endpoints.contains(d) {
                errors.push(FieldError {
                    field: format!("drained[{i}]"),
                    reason: format!("{d} is not one of the endpoints"),
                });
            }
        }
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
            if !current.endpoints.iter().any(|e| e == endpoint) {
                return Err(HubError::NotFound(format!(
                    "{endpoint} is not a backend of {pool}"
                )));
            }
            if current.drained.iter().any(|d| d == endpoint) {
                return Ok(None);
            }
            let mut next = inner.state.clone();
            if let Some(set) = next.backends.get_mut(pool) {
                set.drained.push(endpoint.to_string());
            }
            Ok(Some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }

    /// Forces a circuit open (or closed) for a while; `open: false` with no
    /// duration clears overrides of that target.
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
        self.change(|inner| {
            let mut next = inner.state.clone();
            next.circuits.retain(|c| {
                !(c.pool == pool
                    && c.endpoint == endpoint
                    && (c.source == source || source == "operator"))
            });
            if open || for_secs > 0 {
                next.circuits.push(CircuitRecord {
                    pool: pool.to_string(),
                    endpoint: endpoint.to_string(),
                    open,
                    until_unix_ms: until,
                    source: source.to_string(),
                });
            }
            Ok((next.circuits != inner.state.circuits).then_some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }

    /// A proxy's circuit transition: an open circuit is shared with every
    /// proxy until its expiry; a closed one withdraws that proxy's report.
    /// Reports through different replicas land in the one stored list, so
    /// the fleet has one view.
    pub async fn report_circuit(
        &self,
        node: &str,
        report: &pb::CircuitReport,
    ) -> Result<u64, HubError> {
        self.change(|inner| {
            let now = now_ms();
            let mut next = inner.state.clone();
            next.circuits.retain(|c| {
                !(c.pool == report.pool && c.endpoint == report.endpoint && c.source == node)
            });
            if report.open && report.until_unix_ms > now {
                next.circuits.push(CircuitRecord {
                    pool: report.pool.clone(),
                    endpoint: report.endpoint.clone(),
                    open: true,
                    // A proxy may not hold the fleet's circuit open for long.
                    until_unix_ms: report.until_unix_ms.min(now + 600_000),
                    source: node.to_string(),
                });
            }
            Ok((next.circuits != inner.state.circuits).then_some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }

    /// Drops expired circuit overrides (a change only when some expired).
    pub async fn prune_expired(&self) -> Result<(), HubError> {
        self.change(|inner| {
            let now = now_ms();
            if inner.state.circuits.iter().all(|c| c.until_unix_ms > now) {
                return Ok(None);
            }
            let mut next = inner.state.clone();
            next.circuits.retain(|c| c.until_unix_ms > now);
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
        let rec = inner.proxies.entry(node.to_string()).or_default();
        rec.last_seen_unix_ms = now_ms();
        self.store.replica().clone_into(&mut rec.control_plane);
        update(rec);
        inner.proxies_changed.insert(node.to_string());
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
        let (all, changed) = {
            let mut inner = self.lock();
            let changed: Vec<String> = std::mem::take(&mut inner.proxies_changed)
                .into_iter()
                .collect();
            (inner.proxies.clone(), changed)
        };
        if let Err(e) = self.store.publish_proxies(&all, &changed).await {
            tracing::warn!(error = %e, "cannot publish this replica's proxies");
            // Try those again next time.
            self.lock().proxies_changed.extend(changed);
        }
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
        let answer = router_policy::decide::explain(&policy, &situation);
        serde_json::to_string(&answer).map_err(|e| {
            HubError::Invalid(vec![FieldError {
                field: "situation".into(),
                reason: e.to_string(),
            }])
        })
    }
}

/// The next state with `document` current: backend sets and circuit
/// overrides of pools it no longer has are dropped (proxies would refuse a
/// snapshot with a backend set for an unknown pool).
fn with_policy(inner: &Inner, document: &str, version: u64, guards: &Guards) -> State {
    let mut next = inner.state.clone();
    next.policy_version = version;
    if let Ok(policy) = load(document, guards) {
        let before = next.backends.len();
        next.backends.retain(|pool, _| policy.pool(pool).is_some());
        next.circuits.retain(|c| policy.pool(&c.pool).is_some());
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
