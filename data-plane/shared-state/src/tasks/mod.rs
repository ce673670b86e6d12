//! Where parked tasks are kept. The rules (states, caps, leases) are
//! [`router_policy::park`]'s; the proxy's handle on them, and running
//! them, are the proxy's (`tasks` there).
//!
//! - [`RedisTasks`]: in the fleet's shared store, so that any proxy can
//!   run a task another parked and a client can fetch it through any
//!   proxy;
//! - [`LocalTasks`]: in this process, written through to a file when one
//!   is configured (one proxy).
//!
//! Every change is a compare-and-set on the task's revision: two proxies
//! never both claim a task. A task's body is kept apart from its record:
//! reading, listing and changing tasks never copies a body.

mod local;
pub(crate) mod redis;

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use router_policy::park::{ParkCaps, ParkRefusal, TaskRecord};

pub use local::{LocalTasks, OpenError, MAX_ENDED};
pub use redis::RedisTasks;

use crate::StoreError;

/// A task and the revision it was read at.
#[derive(Debug, Clone)]
pub struct Versioned {
    /// The revision (compare-and-set).
    pub rev: u64,
    /// The task.
    pub task: TaskRecord,
}

/// What parking did.
#[derive(Debug)]
pub enum ParkResult {
    /// Stored.
    Parked,
    /// It does not fit under a cap.
    OverCap(ParkRefusal),
    /// The request's own deadline has passed: nothing to park.
    Late,
    /// A task with this id exists (a keyed retry): here it is.
    Exists(Box<Versioned>),
}

/// Where tasks are kept. Object-safe (boxed futures), like the
/// idempotency store. Records are read and written without their bodies.
pub trait TaskStore: Send + Sync + 'static {
    /// Stores a new task and its body unless it does not fit under `caps`
    /// ([`router_policy::park::may_park`], with [`TaskRecord::bytes`]) or
    /// a task with its id exists.
    fn park<'a>(
        &'a self,
        task: &'a TaskRecord,
        body: &'a Bytes,
        caps: ParkCaps,
    ) -> BoxFuture<'a, Result<ParkResult, StoreError>>;
    /// A task by id (its record, without the body).
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Versioned>, StoreError>>;
    /// A live task's body; `None` when the store has none (it ended, or
    /// the record is older and carries it in `body_b64`).
    fn body<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, StoreError>>;
    /// Replaces the task read at `rev` by `task`: its new revision, or
    /// `None` when it changed since (or is gone). A task that has ended
    /// leaves the live lists and is kept `keep` longer.
    fn cas<'a>(
        &'a self,
        rev: u64,
        task: &'a TaskRecord,
        keep: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>>;
    /// The live tasks (records, without bodies), oldest first, at most
    /// `limit`. Ids listed whose task is gone are taken off the list.
    fn live<'a>(&'a self, limit: usize) -> BoxFuture<'a, Result<Vec<Versioned>, StoreError>>;
}

/// `b` as lowercase hex (task ids, proxy ids, marks).
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}
