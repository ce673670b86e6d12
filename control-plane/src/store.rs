//! Where the control plane keeps its state.
//!
//! Everything the control plane knows is one [`State`] (the current
//! revision, the current policy version, backend sets, circuit overrides)
//! plus the policy history. [`Store`] persists them; every write is a
//! compare-and-swap on the revision, so two writers can never both win
//! (the etcd implementation of a later issue relies on the same contract).
//!
//! [`RedbStore`] keeps them in one embedded file (`<data-dir>/router.redb`):
//! nothing to install, crash-safe (redb commits are durable and atomic).

use std::collections::BTreeMap;
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const POLICIES: TableDefinition<u64, &[u8]> = TableDefinition::new("policies");
const STATE_KEY: &str = "state";

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
    /// The database failed.
    #[error("store: {0}")]
    Backend(String),
}

fn backend(e: impl std::fmt::Display) -> StoreError {
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
}

/// One stored policy version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// Persistence of the control plane.
pub trait Store: Send + Sync {
    /// The current state and the policy history (oldest first).
    fn load(&self) -> Result<(State, Vec<PolicyRecord>), StoreError>;
    /// Writes `state` (and a new policy version) if the stored revision is
    /// still `expected_revision`.
    fn commit(
        &self,
        expected_revision: u64,
        state: &State,
        policy: Option<&PolicyRecord>,
    ) -> Result<(), StoreError>;
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
}

impl Store for RedbStore {
    fn load(&self) -> Result<(State, Vec<PolicyRecord>), StoreError> {
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
        Ok((state, history))
    }

    fn commit(
        &self,
        expected_revision: u64,
        state: &State,
        policy: Option<&PolicyRecord>,
    ) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(backend)?;
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
            let bytes = serde_json::to_vec(state).map_err(backend)?;
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_are_compare_and_swap_and_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("router-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let store = RedbStore::open(&dir).unwrap();
            let (s, h) = store.load().unwrap();
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
            };
            store.commit(0, &next, Some(&p)).unwrap();
            // A writer that read revision 0 loses.
            assert!(matches!(
                store.commit(0, &next, None),
                Err(StoreError::Conflict {
                    expected: 0,
                    actual: 1
                })
            ));
        }
        let store = RedbStore::open(&dir).unwrap();
        let (s, h) = store.load().unwrap();
        assert_eq!(s.revision, 1);
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].document, "doc");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
