//! Parked tasks of a proxy without a shared store: in memory, written
//! through to a file when `CUSTOM_ROUTER_TASKS_FILE` is set, and read back
//! at start.
//!
//! The file holds the tasks' records without their bodies (rewritten
//! whole on every change, through a temporary file and a rename, so a
//! crash leaves the old file or the new one: small, since no body is in
//! it). Each live task's body is a file of its own in the directory
//! `<CUSTOM_ROUTER_TASKS_FILE>.bodies/`, written once when the task parks
//! and deleted when it ends; it is read only to run the task, so with a
//! file bodies are not kept in memory at all. Without a file they are kept
//! in memory (shared with the request that parked them, never copied).
//! A file written by an earlier version (bodies inside the records) is
//! read, and its bodies moved out.
//!
//! The live tasks are bounded by the routes' caps and the store's byte
//! cap ([`router_policy::park::may_park`]); ended ones are kept until
//! their keep time, then dropped at the next change, and at most
//! [`MAX_ENDED`] of them (the ones closest to the end of their keep time
//! go first).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use router_policy::park::{may_park, ParkCaps, ParkLoad, TaskRecord};
use serde::{Deserialize, Serialize};

use super::{ParkResult, TaskStore, Versioned};
use crate::StoreError;
use router_policy::wall_clock::unix_ms;

/// Ended tasks kept at most (each holds its answer).
pub const MAX_ENDED: usize = 1024;

/// A task as the file keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kept {
    rev: u64,
    /// Ended tasks go after this (Unix ms).
    #[serde(default)]
    keep_until_ms: Option<u64>,
    task: TaskRecord,
}

/// A task in memory: its record, and its body when there is no file.
struct Entry {
    kept: Kept,
    body: Option<Bytes>,
}

/// Tasks in this process (and its file).
pub struct LocalTasks {
    tasks: Mutex<HashMap<String, Entry>>,
    file: Option<PathBuf>,
    /// The bodies' directory, with a file.
    bodies: Option<PathBuf>,
}

/// Whether `id` can name a body file (the ids this proxy makes are hex).
fn safe_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Why the tasks file cannot be used at start ([`LocalTasks::open`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Reading or writing the file or a body failed.
    #[error("{path}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not a list of tasks.
    #[error("{path}: not a tasks file: {error}")]
    NotATasksFile {
        /// The file.
        path: PathBuf,
        /// What the JSON reader said.
        error: serde_json::Error,
    },
    /// A task of an earlier version whose body is not base64.
    #[error("{path}: task {task}: {error}")]
    BadBody {
        /// The file.
        path: PathBuf,
        /// The task's id.
        task: String,
        /// What the decoder said.
        error: base64::DecodeError,
    },
    /// The file could not be rewritten.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn open_io(path: &Path) -> impl FnOnce(std::io::Error) -> OpenError + '_ {
    move |error| OpenError::Io {
        path: path.to_path_buf(),
        error,
    }
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{}: {e}", path.display()))
}

impl LocalTasks {
    /// Tasks kept in `file` (read now if it exists), or in memory only.
    pub fn open(file: Option<PathBuf>) -> Result<Self, OpenError> {
        let mut tasks = HashMap::new();
        let bodies = file
            .as_ref()
            .map(|f| PathBuf::from(format!("{}.bodies", f.display())));
        if let (Some(path), Some(dir)) = (&file, &bodies) {
            let list: Vec<Kept> = match std::fs::read(path) {
                Ok(bytes) => {
                    serde_json::from_slice(&bytes).map_err(|error| OpenError::NotATasksFile {
                        path: path.clone(),
                        error,
                    })?
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(open_io(path)(e)),
            };
            std::fs::create_dir_all(dir).map_err(open_io(dir))?;
            for mut k in list {
                if !safe_id(&k.task.id) {
                    tracing::warn!(task = %k.task.id, "tasks file: a task id that cannot name a file; left out");
                    continue;
                }
                // An earlier version's record: its body moves to its file.
                if !k.task.body_b64.is_empty() {
                    if !k.task.state.is_terminal() {
                        let body = base64::engine::general_purpose::STANDARD
                            .decode(&k.task.body_b64)
                            .map_err(|error| OpenError::BadBody {
                                path: path.clone(),
                                task: k.task.id.clone(),
                                error,
                            })?;
                        let at = dir.join(&k.task.id);
                        std::fs::write(&at, body).map_err(open_io(&at))?;
                    }
                    k.task.body_b64 = String::new();
                }
                tasks.insert(
                    k.task.id.clone(),
                    Entry {
                        kept: k,
                        body: None,
                    },
                );
            }
            // Bodies of tasks that are gone (ended while the file was not
            // rewritten, or left by a crash mid-park).
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    let name = e.file_name();
                    let live = name
                        .to_str()
                        .and_then(|n| tasks.get(n))
                        .is_some_and(|t: &Entry| !t.kept.task.state.is_terminal());
                    if !live {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        let store = Self {
            tasks: Mutex::new(tasks),
            file,
            bodies,
        };
        if store.file.is_some() {
            let mut tasks = store.lock();
            store.commit(&mut tasks)?;
        }
        Ok(store)
    }

    /// Drops ended tasks past their time and writes the file.
    fn commit(&self, tasks: &mut HashMap<String, Entry>) -> Result<(), StoreError> {
        let now = unix_ms();
        tasks.retain(|_, e| e.kept.keep_until_ms.is_none_or(|t| t > now));
        let mut ended: Vec<(u64, String)> = tasks
            .values()
            .filter_map(|e| e.kept.keep_until_ms.map(|t| (t, e.kept.task.id.clone())))
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
        let list: Vec<&Kept> = tasks.values().map(|e| &e.kept).collect();
        let bytes =
            serde_json::to_vec(&list).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| io_error(path, e))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `task` fits under `caps` beside the live tasks.
    fn fits(
        tasks: &HashMap<String, Entry>,
        task: &TaskRecord,
        caps: ParkCaps,
    ) -> Result<(), router_policy::park::ParkRefusal> {
        let mut load = ParkLoad::default();
        for e in tasks.values().filter(|e| !e.kept.task.state.is_terminal()) {
            let bytes = e.kept.task.counted_bytes();
            load.store_bytes = load.store_bytes.saturating_add(bytes);
            if e.kept.task.route == task.route {
                load.route_tasks += 1;
                load.route_bytes = load.route_bytes.saturating_add(bytes);
            }
        }
        may_park(load, task.counted_bytes(), caps)
    }

    fn existing(tasks: &HashMap<String, Entry>, id: &str) -> Option<ParkResult> {
        tasks.get(id).map(|e| {
            ParkResult::Exists(Box::new(Versioned {
                rev: e.kept.rev,
                task: e.kept.task.clone(),
            }))
        })
    }
}

/// Writes `body` to `dir/<id>.<random>.tmp` (off the async threads): the
/// temporary file, renamed into place once the task is stored.
async fn write_body(dir: &Path, id: &str, body: &Bytes) -> Result<PathBuf, StoreError> {
    let tmp = dir.join(format!(
        "{id}.{}.tmp",
        super::hex(&router_endpoints::random::bytes::<6>())
    ));
    let (at, body) = (tmp.clone(), body.clone());
    tokio::task::spawn_blocking(move || std::fs::write(&at, &body))
        .await
        .map_err(|e| io_error(&tmp, e))?
        .map_err(|e| io_error(&tmp, e))?;
    Ok(tmp)
}

impl TaskStore for LocalTasks {
    fn park<'a>(
        &'a self,
        task: &'a TaskRecord,
        body: &'a Bytes,
        caps: ParkCaps,
    ) -> BoxFuture<'a, Result<ParkResult, StoreError>> {
        Box::pin(async move {
            if !safe_id(&task.id) {
                return Err(StoreError::Unavailable(format!(
                    "task id {:?} cannot name a file",
                    task.id
                )));
            }
            // Checked first, so that a request that does not fit is not
            // written to disk; checked again once its body is written.
            {
                let tasks = self.lock();
                if let Some(r) = Self::existing(&tasks, &task.id) {
                    return Ok(r);
                }
                if let Err(why) = Self::fits(&tasks, task, caps) {
                    return Ok(ParkResult::OverCap(why));
                }
            }
            let tmp = match &self.bodies {
                Some(dir) => Some((write_body(dir, &task.id, body).await?, dir.join(&task.id))),
                None => None,
            };
            let discard = |tmp: &Option<(PathBuf, PathBuf)>| {
                if let Some((t, _)) = tmp {
                    let _ = std::fs::remove_file(t);
                }
            };
            let mut tasks = self.lock();
            let verdict = Self::existing(&tasks, &task.id).or_else(|| {
                Self::fits(&tasks, task, caps)
                    .err()
                    .map(ParkResult::OverCap)
            });
            if let Some(r) = verdict {
                discard(&tmp);
                return Ok(r);
            }
            if let Some((t, at)) = &tmp {
                if let Err(e) = std::fs::rename(t, at) {
                    discard(&tmp);
                    return Err(io_error(at, e));
                }
            }
            tasks.insert(
                task.id.clone(),
                Entry {
                    kept: Kept {
                        rev: 1,
                        keep_until_ms: None,
                        task: task.clone(),
                    },
                    body: self.bodies.is_none().then(|| body.clone()),
                },
            );
            self.commit(&mut tasks)?;
            Ok(ParkResult::Parked)
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Versioned>, StoreError>> {
        Box::pin(async move {
            Ok(self.lock().get(id).map(|e| Versioned {
                rev: e.kept.rev,
                task: e.kept.task.clone(),
            }))
        })
    }

    fn body<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, StoreError>> {
        Box::pin(async move {
            {
                let tasks = self.lock();
                match tasks.get(id) {
                    Some(e) if !e.kept.task.state.is_terminal() => {
                        if let Some(b) = &e.body {
                            return Ok(Some(b.clone()));
                        }
                    }
                    _ => return Ok(None),
                }
            }
            let Some(dir) = &self.bodies else {
                return Ok(None);
            };
            let at = dir.join(id);
            let read = at.clone();
            match tokio::task::spawn_blocking(move || std::fs::read(&read))
                .await
                .map_err(|e| io_error(&at, e))?
            {
                Ok(b) => Ok(Some(Bytes::from(b))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io_error(&at, e)),
            }
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
            let Some(e) = tasks.get_mut(&task.id) else {
                return Ok(None);
            };
            if e.kept.rev != rev {
                return Ok(None);
            }
            e.kept.rev += 1;
            e.kept.task = task.clone();
            e.kept.keep_until_ms = task.state.is_terminal().then(|| {
                unix_ms().saturating_add(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
            });
            let next = e.kept.rev;
            if task.state.is_terminal() {
                // An ended task never runs: its body goes.
                e.body = None;
                if let Some(dir) = &self.bodies {
                    let _ = std::fs::remove_file(dir.join(&task.id));
                }
            }
            self.commit(&mut tasks)?;
            Ok(Some(next))
        })
    }

    fn live<'a>(&'a self, limit: usize) -> BoxFuture<'a, Result<Vec<Versioned>, StoreError>> {
        Box::pin(async move {
            let tasks = self.lock();
            let mut live: Vec<&Kept> = tasks
                .values()
                .map(|e| &e.kept)
                .filter(|k| !k.task.state.is_terminal())
                .collect();
            live.sort_unstable_by(|a, b| {
                (a.task.parked_at_ms, &a.task.id).cmp(&(b.task.parked_at_ms, &b.task.id))
            });
            Ok(live
                .into_iter()
                .take(limit)
                .map(|k| Versioned {
                    rev: k.rev,
                    task: k.task.clone(),
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::task;
    use router_policy::park::{ParkRefusal, TaskState};

    fn caps(max_tasks: u32) -> ParkCaps {
        ParkCaps {
            max_tasks,
            max_bytes: u64::MAX,
            store_max_bytes: u64::MAX,
        }
    }

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("router-tasks-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::create_dir_all(&dir);
        dir
    }

    fn ids(v: Result<Vec<Versioned>, StoreError>) -> Vec<String> {
        v.unwrap_or_default()
            .into_iter()
            .map(|v| v.task.id)
            .collect()
    }

    #[tokio::test]
    async fn the_file_keeps_tasks_across_a_restart_and_the_cap_holds() {
        let dir = dir("restart");
        let path = dir.join("tasks.json");
        let store = LocalTasks::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
        let body = Bytes::from_static(b"{}");
        assert!(matches!(
            store.park(&task("b", "r", 2), &body, caps(2)).await,
            Ok(ParkResult::Parked)
        ));
        assert!(matches!(
            store.park(&task("a", "r", 1), &body, caps(2)).await,
            Ok(ParkResult::Parked)
        ));
        assert!(matches!(
            store.park(&task("c", "r", 3), &body, caps(2)).await,
            Ok(ParkResult::OverCap(ParkRefusal::Tasks(2)))
        ));
        assert!(matches!(
            store.park(&task("a", "r", 1), &body, caps(2)).await,
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
        assert_eq!(ids(reopened.live(10).await), vec!["b".to_string()]);
        let a = reopened.get("a").await.ok().flatten().map(|v| v.task.state);
        assert_eq!(a, Some(TaskState::Done));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 28, item 3: a body is written once, apart from the records
    /// (which every change rewrites), read only to run its task, and
    /// deleted when the task ends.
    #[tokio::test]
    async fn bodies_are_kept_apart_from_the_file_and_go_when_their_task_ends() {
        let dir = dir("bodies");
        let path = dir.join("tasks.json");
        let store = LocalTasks::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
        let body = Bytes::from(vec![b'x'; 1 << 20]);
        let mut t = task("big", "r", 1);
        t.bytes = body.len() as u64;
        assert!(matches!(
            store.park(&t, &body, caps(10)).await,
            Ok(ParkResult::Parked)
        ));
        let file_len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(
            file_len < 4096,
            "the records file holds no body: {file_len} bytes"
        );
        let body_file = dir.join("tasks.json.bodies").join("big");
        assert_eq!(
            std::fs::metadata(&body_file).map(|m| m.len()).ok(),
            Some(1 << 20)
        );
        // Records are read without it; the body on its own.
        let listed = store.live(10).await.unwrap_or_default();
        assert!(listed[0].task.body_b64.is_empty());
        assert_eq!(store.body("big").await, Ok(Some(body.clone())));
        // Across a restart too.
        let reopened = LocalTasks::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reopened.body("big").await, Ok(Some(body)));
        // Ended: its body is gone.
        let mut ended = t.clone();
        ended.apply(router_policy::park::Event::Drop).unwrap();
        assert_eq!(
            reopened.cas(1, &ended, Duration::from_secs(60)).await,
            Ok(Some(2))
        );
        assert!(!body_file.exists());
        assert_eq!(reopened.body("big").await, Ok(None));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_file_written_with_bodies_inside_is_read_and_its_bodies_moved_out() {
        let dir = dir("old");
        let path = dir.join("tasks.json");
        let mut old = task("old1", "r", 1);
        old.bytes = 0;
        old.body_b64 = base64::engine::general_purpose::STANDARD.encode(b"hello");
        let file = serde_json::json!([{"rev": 3, "task": old}]);
        std::fs::write(&path, file.to_string()).unwrap();
        let store = LocalTasks::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            store.body("old1").await,
            Ok(Some(Bytes::from_static(b"hello")))
        );
        let v = store.get("old1").await.ok().flatten().unwrap();
        assert_eq!(v.rev, 3);
        assert!(v.task.body_b64.is_empty());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("body_b64"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_tasks_file_that_cannot_be_used_stops_the_start_with_why() {
        let dir = dir("unusable");
        let path = dir.join("tasks.json");
        std::fs::write(&path, "not json").unwrap();
        let err = LocalTasks::open(Some(path.clone())).err().unwrap();
        assert!(
            matches!(&err, OpenError::NotATasksFile { path: p, .. } if *p == path),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with(&format!("{}: not a tasks file: ", path.display())),
            "{err}"
        );
        let mut old = task("old1", "r", 1);
        old.body_b64 = "not base64!".into();
        let file = serde_json::json!([{"rev": 3, "task": old}]);
        std::fs::write(&path, file.to_string()).unwrap();
        let err = LocalTasks::open(Some(path.clone())).err().unwrap();
        assert!(
            matches!(&err, OpenError::BadBody { task, .. } if task == "old1"),
            "{err:?}"
        );
        // A file where the bodies' directory should be.
        let blocked = dir.join("blocked.json");
        std::fs::write(dir.join("blocked.json.bodies"), "").unwrap();
        let err = LocalTasks::open(Some(blocked)).err().unwrap();
        assert!(
            matches!(&err, OpenError::Io { path, .. } if *path == dir.join("blocked.json.bodies")),
            "{err:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn parked_bytes_are_capped_per_route_and_for_the_store() {
        let store = LocalTasks::open(None).unwrap_or_else(|e| panic!("{e}"));
        let body = Bytes::from_static(b"{}");
        let caps = ParkCaps {
            max_tasks: 100,
            max_bytes: 250,
            store_max_bytes: 350,
        };
        // 100 bytes each: two fit on route r, the third passes its 250.
        for (id, want) in [("a", true), ("b", true), ("c", false)] {
            let r = store.park(&task(id, "r", 1), &body, caps).await;
            assert_eq!(matches!(r, Ok(ParkResult::Parked)), want, "{id}: {r:?}");
        }
        assert!(matches!(
            store.park(&task("c", "r", 1), &body, caps).await,
            Ok(ParkResult::OverCap(ParkRefusal::RouteBytes(250)))
        ));
        // Route s has room, the store (350) has room for one more only.
        assert!(matches!(
            store.park(&task("d", "s", 1), &body, caps).await,
            Ok(ParkResult::Parked)
        ));
        assert!(matches!(
            store.park(&task("e", "s", 1), &body, caps).await,
            Ok(ParkResult::OverCap(ParkRefusal::StoreBytes(350)))
        ));
        // Without a file, the body is the request's own bytes.
        assert_eq!(store.body("a").await, Ok(Some(body)));
    }
}
