//! Parked tasks (`on_all_down: park`) as operators see and change them,
//! with the proxies' layout ([`router_policy::park::layout`]).
//!
//! - **list**: `ZRANGE` of the live set (oldest first, at most
//!   [`MAX_TASKS`]), then every record's `rev` and `doc` in one pipeline
//!   (never a body), filtered by state (as shown now: a waiting task past
//!   its time is `expired`) and route. A record
//!   that does not parse (being rewritten by hand) is left out rather than
//!   failing the list.
//! - **get / get many**: `HMGET rev doc`, one pipeline for many; a
//!   finished task's record is kept a while after it left the live set.
//! - **change**: read, apply the event with the task's rules
//!   ([`TaskRecord::apply`]), mark who, then [`layout::CAS_SCRIPT`] on the
//!   revision read. A proxy may change the task between the read and the
//!   write (a claim, a renewal): the change reads again and retries, up
//!   to [`CHANGE_TRIES`] times; each retry applies the event to the task
//!   as it is then, so two operators approving at once see one approval
//!   and one [`StoreError::Illegal`], never two.

use router_policy::park::{layout, Event, TaskRecord, TaskState};
use router_policy::wall_clock::unix_ms;

use super::{SharedStoreClient, MAX_TASKS};
use crate::tasks::redis::{cas_invocation, decode, record_cmd, records_pipe};
use crate::tasks::Versioned;
use crate::StoreError;

/// Reads and compare-and-sets a change tries at most before it gives up
/// with [`StoreError::Conflict`].
pub const CHANGE_TRIES: usize = 8;

/// Who changes a task, as recorded in it (`operator`, `operator_role`,
/// `operator_token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedBy {
    /// The name recorded as the task's `operator`.
    pub name: String,
    /// The caller's role (`operator`, `approver`, `open`).
    pub role: String,
    /// The name the caller's token carries, if any.
    pub token: Option<String>,
}

/// How long a changed task's record is kept once it ends: its park TTL,
/// a minute at least.
fn keep(task: &TaskRecord) -> std::time::Duration {
    std::time::Duration::from_millis(
        task.expires_at_ms
            .saturating_sub(task.parked_at_ms)
            .max(60_000),
    )
}

impl SharedStoreClient {
    /// The live tasks, oldest first (at most [`MAX_TASKS`] are read),
    /// those in `state` (as shown now) and on `route` when given.
    pub async fn list_tasks(
        &self,
        state: Option<TaskState>,
        route: Option<&str>,
    ) -> Result<Vec<Versioned>, StoreError> {
        let mut conn = self.conn().await?;
        let stop = i64::try_from(MAX_TASKS).unwrap_or(i64::MAX) - 1;
        let ids: Vec<String> = self
            .within(
                redis::cmd("ZRANGE")
                    .arg(layout::live_key(self.prefix()))
                    .arg(0)
                    .arg(stop)
                    .query_async(&mut conn),
            )
            .await?;
        let rows = self.records(&mut conn, &ids).await?;
        let now = unix_ms();
        Ok(ids
            .iter()
            .zip(rows)
            // A task being rewritten by hand is left out.
            .filter_map(|(id, (rev, doc))| decode(id, rev, doc).ok().flatten())
            .filter(|v| state.is_none_or(|s| v.task.state_at(now) == s))
            .filter(|v| route.is_none_or(|r| v.task.route == r))
            .collect())
    }

    /// The tasks among `ids` (the first [`MAX_TASKS`]) whose records are
    /// still kept, in `ids`' order, in one round trip; records that do
    /// not parse are left out.
    pub async fn tasks(&self, ids: &[String]) -> Result<Vec<Versioned>, StoreError> {
        let ids = &ids[..ids.len().min(MAX_TASKS)];
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let rows = self.records(&mut conn, ids).await?;
        Ok(ids
            .iter()
            .zip(rows)
            .filter_map(|(id, (rev, doc))| decode(id, rev, doc).ok().flatten())
            .collect())
    }

    /// One task: `None` when the store holds none with this id.
    pub async fn task(&self, id: &str) -> Result<Option<Versioned>, StoreError> {
        let mut conn = self.conn().await?;
        self.read(&mut conn, id).await
    }

    /// Replaces the task read at `rev` by `task` ([`layout::CAS_SCRIPT`]):
    /// its new revision, or [`StoreError::Conflict`] when it changed since
    /// (or is gone). A task that has ended leaves the live lists, and its
    /// record is kept for its park TTL (a minute at least).
    pub async fn cas_task(&self, rev: u64, task: &TaskRecord) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        self.cas(&mut conn, rev, task).await
    }

    /// Applies an operator's `event` (approve, drop) to task `id` and
    /// records `by` in it; the task as written. [`StoreError::NotFound`]
    /// when there is no such task, [`StoreError::Illegal`] when the event
    /// does not apply to it as it is now, [`StoreError::Conflict`] when it
    /// kept changing for [`CHANGE_TRIES`] tries.
    pub async fn change_task(
        &self,
        id: &str,
        event: Event,
        by: &ChangedBy,
    ) -> Result<TaskRecord, StoreError> {
        let mut conn = self.conn().await?;
        for _ in 0..CHANGE_TRIES {
            let Some(Versioned { rev, mut task }) = self.read(&mut conn, id).await? else {
                return Err(StoreError::NotFound(format!("task {id:?}")));
            };
            // A waiting task past its time is expired, whatever the store says.
            if task.state_at(unix_ms()) == TaskState::Expired && task.state != TaskState::Expired {
                task.state = TaskState::Expired;
            }
            task.apply(event)?;
            task.operator = Some(by.name.clone());
            task.operator_role = Some(by.role.clone());
            task.operator_token.clone_from(&by.token);
            match self.cas(&mut conn, rev, &task).await {
                Ok(_) => return Ok(task),
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict(format!("task {id}")))
    }

    async fn read(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        id: &str,
    ) -> Result<Option<Versioned>, StoreError> {
        let (rev, doc): (Option<u64>, Option<String>) = self
            .within(record_cmd(self.prefix(), id).query_async(conn))
            .await?;
        decode(id, rev, doc)
    }

    /// Every task's `rev` and `doc` among `ids`, in one pipeline.
    async fn records(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        ids: &[String],
    ) -> Result<Vec<(Option<u64>, Option<String>)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.within(records_pipe(self.prefix(), ids).query_async(conn))
            .await
    }

    async fn cas(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        rev: u64,
        task: &TaskRecord,
    ) -> Result<u64, StoreError> {
        let script = redis::Script::new(layout::CAS_SCRIPT);
        let invocation = cas_invocation(&script, self.prefix(), rev, task, keep(task))?;
        let r: u64 = self.within(invocation.invoke_async(conn)).await?;
        if r == 0 {
            return Err(StoreError::Conflict(format!("task {}", task.id)));
        }
        Ok(r)
    }
}
