//! The control plane's state machine: validated changes in, snapshots out.
//!
//! Every change (a policy apply or rollback, a backend set, a circuit
//! override or report) is checked, written to the [`Store`] as a
//! compare-and-swap on the revision, and only then made current and
//! published: every connected proxy's stream task is watching the one
//! [`Published`] value and sends the new snapshot at once. Expired circuit
//! overrides are pruned by a periodic task (and never sent: each carries
//! its own expiry, so nothing stays stuck if the control plane goes away).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use router_policy::document::{load, PolicyDocument};
use router_policy::{Endpoint, FieldError, QueueSettings};
use router_proto::v1 as pb;
use tokio::sync::watch;

use crate::store::{BackendSet, CircuitRecord, PolicyRecord, State, Store, StoreError};

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

/// What proxies are sent: the revision and its snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Revision.
    pub revision: u64,
    /// The snapshot.
    pub snapshot: pb::Snapshot,
}

/// A proxy as the control plane sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProxyRecord {
    /// Revision it last ACKed.
    pub applied_revision: u64,
    /// Revision it last NACKed, and why.
    pub nacked_revision: u64,
    /// The NACK's error.
    pub last_nack: String,
    /// Last message (Unix ms).
    pub last_seen_unix_ms: i64,
    /// Stream open now.
    pub connected: bool,
}

struct Inner {
    state: State,
    history: Vec<PolicyRecord>,
    proxies: BTreeMap<String, ProxyRecord>,
}

/// The control plane's state, shared by the admin and stream services.
pub struct Hub {
    store: Box<dyn Store>,
    inner: Mutex<Inner>,
    published: watch::Sender<Arc<Published>>,
}

/// Now, in Unix milliseconds.
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

/// Validates a policy document with the same rules as `routerctl policy validate`.
pub fn validate(document: &str) -> Result<(), Vec<FieldError>> {
    PolicyDocument::parse(document)
        .and_then(|d| d.validate(&QueueSettings::default()))
        .map(|_| ())
        .map_err(|e| e.errors)
}

impl Hub {
    /// Loads the state from `store`.
    pub fn open(store: Box<dyn Store>) -> Result<Arc<Self>, HubError> {
        let (state, history) = store.load()?;
        let inner = Inner {
            state,
            history,
            proxies: BTreeMap::new(),
        };
        let (published, _) = watch::channel(Arc::new(snapshot_of(&inner)));
        Ok(Arc::new(Self {
            store,
            inner: Mutex::new(inner),
            published,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest snapshot, and every next one.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Published>> {
        self.published.subscribe()
    }

    /// Writes `next` if the revision did not move, then publishes it.
    fn commit(
        &self,
        inner: &mut Inner,
        mut next: State,
        policy: Option<PolicyRecord>,
    ) -> Result<u64, HubError> {
        next.revision = inner.state.revision + 1;
        self.store
            .commit(inner.state.revision, &next, policy.as_ref())?;
        inner.state = next;
        if let Some(p) = policy {
            inner.history.push(p);
        }
        let revision = inner.state.revision;
        self.published.send_replace(Arc::new(snapshot_of(inner)));
        Ok(revision)
    }

    /// Applies (or with `dry_run` only validates) a policy. Returns the
    /// version it got (or would get) and the revision.
    pub fn apply_policy(
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
        let _entered = span.enter();
        {
            let _validate = tracing::info_span!("policy.validate").entered();
            validate(document).map_err(HubError::Invalid)?;
        }
        let mut inner = self.lock();
        let current = inner.state.policy_version;
        if expected_version != 0 && expected_version != current {
            return Err(HubError::Conflict {
                expected: expected_version,
                current,
            });
        }
        let version = inner.history.iter().map(|p| p.version).max().unwrap_or(0) + 1;
        if dry_run {
            return Ok((version, inner.state.revision));
        }
        let record = PolicyRecord {
            version,
            document: document.to_string(),
            applied_at_unix_ms: now_ms(),
            author: author.to_string(),
            note: "apply".into(),
        };
        let mut next = inner.state.clone();
        next.policy_version = version;
        let revision = self.commit(&mut inner, next, Some(record))?;
        span.record("router.policy_version", version);
        span.record("router.revision", revision);
        tracing::info!(version, revision, author, "policy applied");
        Ok((version, revision))
    }

    /// Makes an earlier version current again (as a new version).
    pub fn rollback(&self, to_version: u64, expected_version: u64) -> Result<(u64, u64), HubError> {
        let document = {
            let inner = self.lock();
            let current = inner.state.policy_version;
            if expected_version != 0 && expected_version != current {
                return Err(HubError::Conflict {
                    expected: expected_version,
                    current,
                });
            }
            let target = if to_version == 0 {
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
            let target = target
                .ok_or_else(|| HubError::NotFound("no earlier version to roll back to".into()))?;
            inner
                .history
                .iter()
                .find(|p| p.version == target)
                .map(|p| (target, p.document.clone()))
                .ok_or_else(|| HubError::NotFound(format!("no policy version {target}")))?
        };
        let (target, document) = document;
        let mut inner = self.lock();
        let version = inner.history.iter().map(|p| p.version).max().unwrap_or(0) + 1;
        let record = PolicyRecord {
            version,
            document,
            applied_at_unix_ms: now_ms(),
            author: "rollback".into(),
            note: format!("rollback to {target}"),
        };
        let mut next = inner.state.clone();
        next.policy_version = version;
        let revision = self.commit(&mut inner, next, Some(record))?;
        tracing::info!(version, target, revision, "policy rolled back");
        Ok((version, revision))
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
    pub fn set_backends(
        &self,
        pool: &str,
        endpoints: Vec<String>,
        drained: Vec<String>,
    ) -> Result<u64, HubError> {
        let mut errors = Vec::new();
        for (i, e) in endpoints.iter().enumerate() {
            if let Err(err) = Endpoint::parse(e) {
                errors.push(FieldError {
                    field: format!("endpoints[{i}]"),
                    reason: err.to_string(),
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
        let mut inner = self.lock();
        if let Some(p) = inner
            .history
            .iter()
            .find(|p| p.version == inner.state.policy_version)
        {
            if let Ok(policy) = load(&p.document, &QueueSettings::default()) {
                if policy.pool(pool).is_none() {
                    return Err(HubError::Invalid(vec![FieldError {
                        field: "pool".into(),
                        reason: format!("the current policy has no pool {pool:?}"),
                    }]));
                }
            }
        }
        let mut next = inner.state.clone();
        next.backends
            .insert(pool.to_string(), BackendSet { endpoints, drained });
        self.commit(&mut inner, next, None)
    }

    /// Drains (or undrains) one endpoint of a pool's backend set.
    pub fn drain(&self, pool: &str, endpoint: &str) -> Result<u64, HubError> {
        let current = self.state().backends.get(pool).cloned().ok_or_else(|| {
            HubError::NotFound(format!("no backend set for pool {pool:?} (set it first)"))
        })?;
        if !current.endpoints.iter().any(|e| e == endpoint) {
            return Err(HubError::NotFound(format!(
                "{endpoint} is not a backend of {pool}"
            )));
        }
        let mut drained = current.drained.clone();
        if !drained.iter().any(|d| d == endpoint) {
            drained.push(endpoint.to_string());
        }
        self.set_backends(pool, current.endpoints, drained)
    }

    /// Forces a circuit open (or closed) for a while; `open: false` with no
    /// duration clears overrides of that target.
    pub fn set_circuit(
        &self,
        pool: &str,
        endpoint: &str,
        open: bool,
        for_secs: u64,
        source: &str,
    ) -> Result<u64, HubError> {
        let mut inner = self.lock();
        let mut next = inner.state.clone();
        next.circuits.retain(|c| {
            !(c.pool == pool
                && c.endpoint == endpoint
                && (c.source == source || source == "operator"))
        });
        if open || for_secs > 0 {
            let secs = if for_secs == 0 {
                300
            } else {
                for_secs.min(86_400)
            };
            next.circuits.push(CircuitRecord {
                pool: pool.to_string(),
                endpoint: endpoint.to_string(),
                open,
                until_unix_ms: now_ms() + i64::try_from(secs * 1000).unwrap_or(i64::MAX),
                source: source.to_string(),
            });
        }
        if next.circuits == inner.state.circuits {
            return Ok(inner.state.revision);
        }
        self.commit(&mut inner, next, None)
    }

    /// A proxy's circuit transition: an open circuit is shared with every
    /// proxy until its expiry; a closed one withdraws that proxy's report.
    pub fn report_circuit(&self, node: &str, report: &pb::CircuitReport) -> Result<u64, HubError> {
        let mut inner = self.lock();
        let mut next = inner.state.clone();
        next.circuits.retain(|c| {
            !(c.pool == report.pool && c.endpoint == report.endpoint && c.source == node)
        });
        if report.open && report.until_unix_ms > now_ms() {
            next.circuits.push(CircuitRecord {
                pool: report.pool.clone(),
                endpoint: report.endpoint.clone(),
                open: true,
                // A proxy may not hold the fleet's circuit open for long.
                until_unix_ms: report.until_unix_ms.min(now_ms() + 600_000),
                source: node.to_string(),
            });
        }
        if next.circuits == inner.state.circuits {
            return Ok(inner.state.revision);
        }
        self.commit(&mut inner, next, None)
    }

    /// Drops expired circuit overrides (a change only when some expired).
    pub fn prune_expired(&self) -> Result<(), HubError> {
        let mut inner = self.lock();
        let now = now_ms();
        if inner.state.circuits.iter().all(|c| c.until_unix_ms > now) {
            return Ok(());
        }
        let mut next = inner.state.clone();
        next.circuits.retain(|c| c.until_unix_ms > now);
        self.commit(&mut inner, next, None).map(|_| ())
    }

    /// Records what a proxy said.
    pub fn proxy_seen(&self, node: &str, update: impl FnOnce(&mut ProxyRecord)) {
        let mut inner = self.lock();
        let rec = inner.proxies.entry(node.to_string()).or_default();
        rec.last_seen_unix_ms = now_ms();
        update(rec);
    }

    /// Every proxy seen.
    pub fn proxies(&self) -> BTreeMap<String, ProxyRecord> {
        self.lock().proxies.clone()
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
        let policy = load(&record.document, &QueueSettings::default())
            .map_err(|e| HubError::Invalid(e.errors))?;
        let answer = router_policy::decide::explain(&policy, &situation);
        serde_json::to_string(&answer).map_err(|e| {
            HubError::Invalid(vec![FieldError {
                field: "situation".into(),
                reason: e.to_string(),
            }])
        })
    }
}

/// Runs [`Hub::prune_expired`] every second until the hub is gone.
pub async fn prune_loop(hub: std::sync::Weak<Hub>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(h) = hub.upgrade() else { return };
        if let Err(e) = h.prune_expired() {
            tracing::warn!(error = %e, "pruning expired circuits failed");
        }
    }
}
