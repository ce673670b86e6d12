//! Where the control plane keeps its state.
//!
//! Everything the control plane knows is one [`State`] (the current
//! revision, the current policy version, backend sets, circuit overrides)
//! plus the policy history. [`Store`] persists them. Every write is a
//! compare-and-swap on the revision, so of two writers that read the same
//! revision exactly one wins and the other gets [`StoreError::Conflict`].
//!
//! Two implementations:
//!
//! - [`RedbStore`] (the default) keeps everything in one embedded file
//!   (`<data-dir>/router.redb`): nothing to install, crash-safe (redb
//!   commits are durable and atomic). One process writes it, so it has no
//!   changes to follow and always holds the singleton lease.
//! - [`EtcdStore`](etcd::EtcdStore) (feature `etcd`) shares the state
//!   between control-plane replicas through etcd. The revision is the etcd
//!   `mod_revision` of the state key, so every replica names the same state
//!   with the same number; each replica follows the others' writes by
//!   list-then-watch ([`Store::follow`]).
//!
//! Replicas also ask each other the console's questions through the store
//! ([`exchange`]: [`Store::ask_replicas`], [`Store::questions`],
//! [`Store::answer`]); with one writer those do nothing.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod exchange;

pub use exchange::{Asked, Query, Question};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const POLICIES: TableDefinition<u64, &[u8]> = TableDefinition::new("policies");
const STATE_KEY: &str = "state";
const STORE_ID_KEY: &str = "store_id";

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Someone else wrote first: the expected revision is not the current one.
    #[error("conflict: expected revision {expected}, the store is at {actual}")]
    Conflict {
        /// What the writer expected.
        expected: u64,
        /// What the store has.
        actual: u64,
    },
    /// The database failed or could not be reached.
    #[error("store: {0}")]
    Backend(String),
    /// The database did not answer in time.
    #[error("store: no answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The database answered, and refused these credentials or this key
    /// range: retrying cannot help.
    #[error("store: {0}")]
    Refused(String),
}

pub(crate) fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A pool's backend set, as set through the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BackendSet {
    /// Endpoints.
    pub endpoints: Vec<String>,
    /// Those drained.
    pub drained: Vec<String>,
}

/// A forced circuit state, with its expiry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CircuitRecord {
    /// Pool.
    pub pool: String,
    /// Endpoint (empty: every endpoint of the pool).
    pub endpoint: String,
    /// Open (true) or forced closed.
    pub open: bool,
    /// When it stops applying (Unix ms).
    pub until_unix_ms: i64,
    /// `operator`, or the reporting proxy's node id.
    pub source: String,
    /// Non-empty: a suspicion mark (`check` or `attempt`), not a forced
    /// circuit ([`router_policy::health`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub suspect: String,
}

/// One stored policy version.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// Version (1, 2, ...).
    pub version: u64,
    /// The document as applied.
    pub document: String,
    /// When (Unix ms).
    pub applied_at_unix_ms: i64,
    /// Who (as the client said).
    pub author: String,
    /// `apply` or `rollback to N`.
    pub note: String,
    /// The caller's token: its name, else its role (empty before it was
    /// recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operator: String,
    /// The operator's note (`policy apply --note`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A proxy as the replica it talks to sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
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
    /// The replica that wrote this record (empty with one control plane).
    #[serde(default)]
    pub control_plane: String,
    /// Circuit reports ignored by the rate limit.
    #[serde(default)]
    pub circuit_reports_dropped: u64,
}

/// The control plane's current state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct State {
    /// Bumped by every change; names the proxies' snapshots.
    pub revision: u64,
    /// Current policy version (0: none yet).
    pub policy_version: u64,
    /// Backend sets by pool.
    pub backends: BTreeMap<String, BackendSet>,
    /// Circuit overrides.
    pub circuits: Vec<CircuitRecord>,
    /// Tenants' keys (hashes), kept beside the policy, not in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyRecord>,
    /// The revision of the last change to the proxies' config (policy,
    /// backend sets, keys); 0: this state's own revision. A change of
    /// runtime marks only (circuits, suspicions) keeps it, so the config a
    /// proxy serves keeps its name through an outage's marks.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub config_revision: u64,
    /// The response cache's purges, oldest first (at most
    /// `hub::cache::MAX_PURGES`): marks each proxy applies to its own store.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_purges: Vec<CachePurgeRecord>,
    /// Routes whose ramps an operator paused (`routerctl rollout pause`),
    /// sorted: kept here so every replica, and the next leader, knows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ramps_paused: Vec<String>,
}

/// A purge of the response cache's entries under a key prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachePurgeRecord {
    /// Names it (a proxy applies each once).
    pub id: String,
    /// The route purged.
    pub route: String,
    /// The key prefix (`router_policy::cache::route_prefix`,
    /// `partition_prefix`).
    pub prefix: String,
    /// When it was asked for.
    pub at_unix_ms: i64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl State {
    /// The revision naming this state's config (see
    /// [`State::config_revision`]).
    pub fn effective_config_revision(&self) -> u64 {
        if self.config_revision == 0 {
            self.revision
        } else {
            self.config_revision
        }
    }

    /// Whether `next` differs from this state in runtime marks only.
    pub fn marks_only_change(&self, next: &State) -> bool {
        next.policy_version == self.policy_version
            && next.backends == self.backends
            && next.keys == self.keys
    }
}

/// A tenant's key as the store keeps it: its SHA-256, never the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// `key-` and 12 hex digits of the hash.
    pub id: String,
    /// The tenant it names.
    pub tenant: String,
    /// The operator's name for it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `sha256:<64 hex digits>`.
    pub hash: String,
    /// The key's first characters, to recognise it.
    pub prefix: String,
    /// When it was created (Unix ms).
    pub created_at_unix_ms: i64,
    /// When it stops working (Unix ms; 0: never).
    #[serde(default)]
    pub expires_at_unix_ms: i64,
    /// Who created it (the token's name, else its role).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created_by: String,
}

impl KeyRecord {
    /// Whether it still works at `now` (Unix ms).
    pub fn live(&self, now_unix_ms: i64) -> bool {
        self.expires_at_unix_ms == 0 || self.expires_at_unix_ms > now_unix_ms
    }
}

/// What a [`Store`] holds: the state and the policy history (oldest first).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Contents {
    /// The current state; its `revision` names it.
    pub state: State,
    /// Every stored policy version, oldest first.
    pub history: Vec<PolicyRecord>,
}

/// A change another writer made, as [`Store::follow`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChange {
    /// Everything, read afresh: when following starts, and whenever the
    /// change feed lost its place (the etcd watch revision was compacted).
    Relisted(Contents),
    /// What one write changed (one etcd revision), applied together.
    Changed(Vec<StoreEvent>),
}

/// One key's change inside a [`StoreChange::Changed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// The state, as of its revision.
    State(State),
    /// A policy version was stored.
    Policy(PolicyRecord),
    /// A policy version was removed (history pruning).
    PolicyRemoved(u64),
}

/// Every replica's value of one kind: (replica, value).
pub type ReplicaValues = Vec<(String, Vec<u8>)>;

/// The future every [`Store`] call returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Persistence of the control plane.
pub trait Store: Send + Sync {
    /// The store's identity: a random id created with the store (the first
    /// call creates it), the same for every replica of a shared store. Its
    /// revisions only grow; a store that was reset or replaced has another
    /// id, which tells proxies its revisions are not comparable with those
    /// they applied.
    fn identity(&self) -> StoreFuture<'_, String>;

    /// The current state and the policy history.
    fn load(&self) -> StoreFuture<'_, Contents>;

    /// Writes `state` (and a new policy version) if the stored revision is
    /// still `expected_revision`; returns the revision that names the new
    /// state (`state.revision` is ignored).
    fn commit<'a>(
        &'a self,
        expected_revision: u64,
        state: &'a State,
        policy: Option<&'a PolicyRecord>,
    ) -> StoreFuture<'a, u64>;

    /// Removes old policy versions.
    fn remove_policies<'a>(&'a self, versions: &'a [u64]) -> StoreFuture<'a, ()>;

    /// Other writers' changes, from a fresh listing on: `None` when this
    /// process is the only writer. The feed ends when the receiver is dropped.
    fn follow(&self) -> Option<mpsc::Receiver<StoreChange>>;

    /// Whether this process holds the lease for work that must run once
    /// across replicas (expiring circuits, pruning history); renews it.
    fn hold_singleton(&self) -> StoreFuture<'_, bool>;

    /// This replica's name in a multi-replica store (empty otherwise).
    fn replica(&self) -> &str {
        ""
    }

    /// The replica holding the singleton lease as [`Store::hold_singleton`]
    /// last saw it (`None`: not known, or a single writer, which leads).
    fn singleton_holder(&self) -> Option<String> {
        None
    }

    /// Shares this replica's view of its proxies with the other replicas,
    /// renewing the lease that makes those records vanish if this replica
    /// dies. `all` is every record; `changed` the node ids that changed
    /// since the last call; `removed` those whose records were dropped (gone
    /// for longer than the TTL). Called every second; a no-op for a single
    /// writer.
    fn publish_proxies<'a>(
        &'a self,
        all: &'a BTreeMap<String, ProxyRecord>,
        changed: &'a [String],
        removed: &'a [String],
    ) -> StoreFuture<'a, ()> {
        let _ = (all, changed, removed);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Every replica's proxies, as each replica published them: node id →
    /// one record per replica. `None` when this process is the only one.
    fn fleet_proxies(&self) -> StoreFuture<'_, Option<Vec<(String, ProxyRecord)>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Shares a small value of this replica's with the other replicas under
    /// `kind` (one value per replica and kind, on the same presence lease
    /// as the proxy records, so a dead replica's values vanish with them);
    /// `None` removes it. A no-op for a single writer.
    fn publish_replica_value<'a>(
        &'a self,
        kind: &'a str,
        value: Option<Vec<u8>>,
    ) -> StoreFuture<'a, ()> {
        let _ = (kind, value);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Every replica's value of `kind` (this replica's too): (replica,
    /// value). `None` when this process is the only one.
    fn replica_values<'a>(&'a self, kind: &'a str) -> StoreFuture<'a, Option<ReplicaValues>> {
        let _ = kind;
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Asks the other replicas `question` and gathers their answers until
    /// each replica with presence records answered or `wait` is over
    /// ([`exchange`]). `None` when this process is the only one.
    fn ask_replicas<'a>(
        &'a self,
        question: &'a Question,
        wait: Duration,
    ) -> StoreFuture<'a, Option<Asked>> {
        let _ = (question, wait);
        Box::pin(std::future::ready(Ok(None)))
    }

    /// The other replicas' questions, as they are asked (bounded: more
    /// than [`exchange::QUESTIONS_QUEUED`] waiting are dropped). `None`
    /// when this process is the only one. The feed ends when the receiver
    /// is dropped.
    fn questions(&self) -> Option<mpsc::Receiver<Query>> {
        None
    }

    /// Answers `query` with `answer` (at most [`exchange::ANSWER_MAX_BYTES`];
    /// a larger one is refused). A no-op for a single writer.
    fn answer<'a>(&'a self, query: &'a Query, answer: Vec<u8>) -> StoreFuture<'a, ()> {
        let _ = (query, answer);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Gives this replica's leases up (on shutdown): another replica takes
    /// the singleton work over at once rather than when the lease expires,
    /// and this replica's proxy records go at once.
    fn release_leases(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The embedded single-file store.
pub struct RedbStore {
    db: Database,
}

impl RedbStore {
    /// Opens (or creates) `<dir>/router.redb`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(backend)?;
        let db = Database::create(dir.join("router.redb")).map_err(backend)?;
        let tx = db.begin_write().map_err(backend)?;
        {
            tx.open_table(META).map_err(backend)?;
            tx.open_table(POLICIES).map_err(backend)?;
        }
        tx.commit().map_err(backend)?;
        Ok(Self { db })
    }

    fn identity_now(&self) -> Result<String, StoreError> {
        let tx = self.db.begin_write().map_err(backend)?;
        let id = {
            let mut meta = tx.open_table(META).map_err(backend)?;
            let existing = meta
                .get(STORE_ID_KEY)
                .map_err(backend)?
                .map(|v| String::from_utf8_lossy(v.value()).into_owned());
            match existing {
                Some(id) => id,
                None => {
                    let id = uuid::Uuid::now_v7().to_string();
                    meta.insert(STORE_ID_KEY, id.as_bytes()).map_err(backend)?;
                    id
                }
            }
        };
        tx.commit().map_err(backend)?;
        Ok(id)
    }

    fn load_now(&self) -> Result<Contents, StoreError> {
        let tx = self.db.begin_read().map_err(backend)?;
        let meta = tx.open_table(META).map_err(backend)?;
        let state = match meta.get(STATE_KEY).map_err(backend)? {
            Some(v) => serde_json::from_slice(v.value()).map_err(backend)?,
            None => State::default(),
        };
        let policies = tx.open_table(POLICIES).map_err(backend)?;
        let mut history = Vec::new();
        for entry in policies.iter().map_err(backend)? {
            let (_, v) = entry.map_err(backend)?;
            history.push(serde_json::from_slice(v.value()).map_err(backend)?);
        }
        Ok(Contents { state, history })
    }

    fn commit_now(
        &self,
        expected_revision: u64,
        state: &State,
        policy: Option<&PolicyRecord>,
    ) -> Result<u64, StoreError> {
        let tx = self.db.begin_write().map_err(backend)?;
        let revision = expected_revision + 1;
        {
            let mut meta = tx.open_table(META).map_err(backend)?;
            let actual = match meta.get(STATE_KEY).map_err(backend)? {
                Some(v) => {
                    serde_json::from_slice::<State>(v.value())
                        .map_err(backend)?
                        .revision
                }
                None => 0,
            };
            if actual != expected_revision {
                return Err(StoreError::Conflict {
                    expected: expected_revision,
                    actual,
                });
            }
            let stored = State {
                revision,
                ..state.clone()
            };
            let bytes = serde_json::to_vec(&stored).map_err(backend)?;
            meta.insert(STATE_KEY, bytes.as_slice()).map_err(backend)?;
            if let Some(p) = policy {
                let mut policies = tx.open_table(POLICIES).map_err(backend)?;
                let bytes = serde_json::to_vec(p).map_err(backend)?;
                policies
                    .insert(p.version, bytes.as_slice())
                    .map_err(backend)?;
            }
        }
        tx.commit().map_err(backend)?;
        Ok(revision)
    }

    fn remove_now(&self, versions: &[u64]) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(backend)?;
        {
            let mut policies = tx.open_table(POLICIES).map_err(backend)?;
            for v in versions {
                policies.remove(*v).map_err(backend)?;
            }
        }
        tx.commit().map_err(backend)
    }
}

// redb calls are short local transactions (a commit is one fsync); they
// run inline rather than on the blocking pool.
impl Store for RedbStore {
    fn identity(&self) -> StoreFuture<'_, String> {
        Box::pin(std::future::ready(self.identity_now()))
    }

    fn load(&self) -> StoreFuture<'_, Contents> {
        Box::pin(std::future::ready(self.load_now()))
    }

    fn commit<'a>(
        &'a self,
        expected_revision: u64,
        state: &'a State,
        policy: Option<&'a PolicyRecord>,
    ) -> StoreFuture<'a, u64> {
        Box::pin(std::future::ready(self.commit_now(
            expected_revision,
            state,
            policy,
        )))
    }

    fn remove_policies<'a>(&'a self, versions: &'a [u64]) -> StoreFuture<'a, ()> {
        Box::pin(std::future::ready(self.remove_now(versions)))
    }

    fn follow(&self) -> Option<mpsc::Receiver<StoreChange>> {
        None
    }

    fn hold_singleton(&self) -> StoreFuture<'_, bool> {
        Box::pin(std::future::ready(Ok(true)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn commits_are_compare_and_swap_and_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("router-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let id = {
            let store = RedbStore::open(&dir).unwrap();
            let id = store.identity().await.unwrap();
            assert!(!id.is_empty());
            let Contents {
                state: s,
                history: h,
            } = store.load().await.unwrap();
            assert_eq!(s, State::default());
            assert!(h.is_empty());
            let next = State {
                revision: 1,
                policy_version: 1,
                ..State::default()
            };
            let p = PolicyRecord {
                version: 1,
                document: "doc".into(),
                applied_at_unix_ms: 5,
                author: "me".into(),
                note: "apply".into(),
                operator: "ops-alice".into(),
                message: "raise the budget".into(),
            };
            assert_eq!(store.commit(0, &next, Some(&p)).await.unwrap(), 1);
            // A writer that read revision 0 loses.
            assert!(matches!(
                store.commit(0, &next, None).await,
                Err(StoreError::Conflict {
                    expected: 0,
                    actual: 1
                })
            ));
            id
        };
        let store = RedbStore::open(&dir).unwrap();
        assert_eq!(store.identity().await.unwrap(), id, "the identity is kept");
        let Contents {
            state: s,
            history: h,
        } = store.load().await.unwrap();
        assert_eq!(s.revision, 1);
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].document, "doc");
        store.remove_policies(&[1]).await.unwrap();
        assert!(store.load().await.unwrap().history.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
