//! Parked tasks of a proxy without a shared store: in memory, written
//! through to a file when `CUSTOM_ROUTER_TASKS_FILE` is set (rewritten
//! whole on every change, through a temporary file and a rename, so a
//! crash leaves the old file or the new one), and read back at start.
//!
//! The live tasks are bounded by the routes' caps; ended ones are kept
//! until their keep time, then dropped at the next change, and at most
//! [`MAX_ENDED`] of them (the ones closest to the end of their keep time
//! go first).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use router_policy::park::TaskRecord;
use serde::{Deserialize, Serialize};

use super::{unix_ms, ParkResult, TaskStore, Versioned};
use crate::idempotency::StoreError;

/// Ended tasks kept at most (each holds its request and its answer).
pub(crate) const MAX_ENDED: usize = 1024;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kept {
    rev: u64,
    /// Ended tasks go after this (Unix ms).
    #[serde(default)]
    keep_until_ms: Option<u64>,
    task: TaskRecord,
}

/// Tasks in this process (and its file).
pub(crate) struct LocalTasks {
    tasks: Mutex<HashMap<String, Kept>>,
    file: Option<PathBuf>,
}

impl LocalTasks {
    /// Tasks kept in `file` (read now if it exists), or in memory only.
    pub(crate) fn open(file: Option<PathBuf>) -> Result<Self, String> {
        let mut tasks = HashMap::new();
        if let Some(path) = &file {
            match std::fs::read(path) {
                Ok(bytes) => {
                    let list: Vec<Kept> = serde_json::from_slice(&bytes)
                        .map_err(|e| format!("{}: not a tasks file: {e}", path.display()))?;
                    for k in list {
                        tasks.insert(k.task.id.clone(), k);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
        Ok(Self {
            tasks: Mutex::new(tasks),
            file,
        })
    }

    /// Drops ended tasks past their time and writes the file.
    fn commit(&self, tasks: &mut HashMap<String, Kept>) -> Result<(), StoreError> {
        let now = unix_ms();
        tasks.retain(|_, k| k.keep_until_ms.is_none_or(|t| t > now));
        let mut ended: Vec<(u64, String)> = tasks
            .values()
            .filter_map(|k| k.keep_until_ms.map(|t| (t, k.task.id.clone())))
            .collect();
        if ended.len() > MAX_ENDED {
            ended.sort_unstable();
            for (_, id) in &ended[..ended.len() - MAX_ENDED] {
                tasks.remove(id);
            }
        }
        let Some(path) = &self.file else {
            return Ok(());
        };
        let list: Vec<&Kept> = tasks.values().collect();
        let bytes =
            serde_json::to_vec(&list).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| StoreError::Unavailable(format!("{}: {e}", path.display())))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl TaskStore for LocalTasks {
    fn park<'a>(
        &'a self,
        task: &'a TaskRecord,
        cap: u32,
    ) -> BoxFuture<'a, Result<ParkResult, StoreError>> {
        Box::pin(async move {
            let mut tasks = self.lock();
            if let Some(k) = tasks.get(&task.id) {
                return Ok(ParkResult::Exists(Box::new(Versioned {
                    rev: k.rev,
                    task: k.task.clone(),
                })));
            }
            let live = tasks
                .values()
                .filter(|k| k.task.route == task.route && !k.task.state.is_terminal())
                .count();
            if !router_policy::park::may_park(live as u64, cap) {
                return Ok(ParkResult::OverCap);
            }
            tasks.insert(
                task.id.clone(),
                Kept {
                    rev: 1,
                    keep_until_ms: None,
                    task: task.clone(),
                },
            );
            self.commit(&mut tasks)?;
            Ok(ParkResult::Parked)
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Versioned>, StoreError>> {
        Box::pin(async move {
            Ok(self.lock().get(id).map(|k| Versioned {
                rev: k.rev,
                task: k.task.clone(),
            }))
        })
    }

    fn cas<'a>(
        &'a self,
        rev: u64,
        task: &'a TaskRecord,
        keep: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let mut tasks = self.lock();
            let Some(k) = tasks.get_mut(&task.id) else {
                return Ok(None);
            };
            if k.rev != rev {
                return Ok(None);
            }
            k.rev += 1;
            k.task = task.clone();
            k.keep_until_ms = task.state.is_terminal().then(|| {
                unix_ms().saturating_add(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
            });
            let next = k.rev;
            self.commit(&mut tasks)?;
            Ok(Some(next))
        })
    }

    fn forget<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        // The list is the map itself: nothing is listed without its task.
        Box::pin(async { Ok(()) })
    }

    fn live<'a>(&'a self, limit: usize) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let tasks = self.lock();
            let mut live: Vec<(u64, &str)> = tasks
                .values()
                .filter(|k| !k.task.state.is_terminal())
                .map(|k| (k.task.parked_at_ms, k.task.id.as_str()))
                .collect();
            live.sort_unstable();
            Ok(live
                .into_iter()
                .take(limit)
                .map(|(_, id)| id.to_string())
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_policy::park::{TaskState, Times};
    use router_policy::Risk;

    fn task(id: &str, route: &str, at: u64) -> TaskRecord {
        let t = Times::new(at, Duration::from_secs(60), None);
        TaskRecord {
            id: id.into(),
            state: TaskState::WaitingCapacity,
            route: route.into(),
            risk: Risk::Read,
            approved: false,
            operator: None,
            request_id: id.into(),
            tenant: None,
            parked_at_ms: t.parked_at_ms,
            expires_at_ms: t.expires_at_ms,
            deadline_at_ms: None,
            reason: String::new(),
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            headers: Vec::new(),
            body_b64: String::new(),
            claimed_by: None,
            lease_until_ms: None,
            runs: 0,
            run_request_id: None,
            answer: None,
            error: None,
        }
    }

    #[tokio::test]
    async fn the_file_keeps_tasks_across_a_restart_and_the_cap_holds() {
        let dir = std::env::temp_dir().join(format!("router-tasks-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("tasks.json");
        let _ = std::fs::remove_file(&path);
        let store = LocalTasks::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            store.park(&task("b", "r", 2), 2).await,
            Ok(ParkResult::Parked)
        ));
        assert!(matches!(
            store.park(&task("a", "r", 1), 2).await,
            Ok(ParkResult::Parked)
        ));
        assert!(matches!(
            store.park(&task("c", "r", 3), 2).await,
            Ok(ParkResult::OverCap)
        ));
        assert!(matches!(
            store.park(&task("a", "r", 1), 2).await,
            Ok(ParkResult::Exists(_))
        ));
        // A compare-and-set on a stale revision fails.
        let mut done = task("a", "r", 1);
        done.state = TaskState::Done;
        assert_eq!(store.cas(7, &done, Duration::from_secs(60)).await, Ok(None));
        assert_eq!(
            store.cas(1, &done, Duration::from_secs(60)).await,
            Ok(Some(2))
        );
        let reopened = LocalTasks::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reopened.live(10).await, Ok(vec!["b".to_string()]));
        let a = reopened.get("a").await.ok().flatten().map(|v| v.task.state);
        assert_eq!(a, Some(TaskState::Done));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
