//! Parked tasks in the fleet's shared store (Redis or Valkey), laid out as
//! [`router_policy::park::layout`] says (the control plane reads and
//! writes the same keys): records and bodies apart, so that listing the
//! live tasks (every dispatcher, every 250 ms) reads records only, in one
//! round trip. Every call is bounded by the store's call timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use router_policy::park::{layout, ParkCaps, ParkRefusal, TaskRecord};

use super::{ParkResult, TaskStore, Versioned};
use crate::{bounded, RedisStore, StoreError};

/// Tasks in Redis, on the idempotency store's connections.
pub struct RedisTasks {
    store: Arc<RedisStore>,
    park: redis::Script,
    cas: redis::Script,
}

impl RedisTasks {
    /// Tasks on `store`'s connections.
    pub fn new(store: Arc<RedisStore>) -> Self {
        Self {
            store,
            park: redis::Script::new(layout::PARK_SCRIPT),
            cas: redis::Script::new(layout::CAS_SCRIPT),
        }
    }

    fn keys(&self, task: &TaskRecord) -> [String; 5] {
        layout::script_keys(self.store.prefix(), &task.id, &task.route)
    }
}

/// A task's record from its `rev` and `doc` fields: `None` when either
/// is missing, [`StoreError::Malformed`] when `doc` is not a task record.
/// (The proxies' and the control plane's reads: `crate::admin::tasks`.)
pub(crate) fn decode(
    id: &str,
    rev: Option<u64>,
    doc: Option<String>,
) -> Result<Option<Versioned>, StoreError> {
    let (Some(rev), Some(doc)) = (rev, doc) else {
        return Ok(None);
    };
    serde_json::from_str::<TaskRecord>(&doc)
        .map(|task| Some(Versioned { rev, task }))
        .map_err(|e| StoreError::Malformed(format!("task {id} is not a task record: {e}")))
}

/// A dispatcher's view of [`decode`]: a record that is not a task record
/// is logged and skipped.
fn decode_or_skip(id: &str, rev: Option<u64>, doc: Option<String>) -> Option<Versioned> {
    decode(id, rev, doc).unwrap_or_else(|e| {
        tracing::warn!(task = id, error = %e, "task store: ignored");
        None
    })
}

/// `HMGET <task> rev doc`: one task's record.
pub(crate) fn record_cmd(prefix: &str, id: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(layout::task_key(prefix, id)).arg("rev").arg("doc");
    cmd
}

/// [`record_cmd`] for each of `ids`, in one pipeline (records only, never
/// a body).
pub(crate) fn records_pipe(prefix: &str, ids: &[String]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.add_command(record_cmd(prefix, id));
    }
    pipe
}

/// [`layout::CAS_SCRIPT`] replacing the task read at `rev` by `task`; an
/// ended task's record is kept `keep` more.
pub(crate) fn cas_invocation<'a>(
    script: &'a redis::Script,
    prefix: &str,
    rev: u64,
    task: &TaskRecord,
    keep: Duration,
) -> Result<redis::ScriptInvocation<'a>, StoreError> {
    let doc = serde_json::to_string(task)
        .map_err(|e| StoreError::Malformed(format!("task {}: {e}", task.id)))?;
    let mut invocation = script.prepare_invoke();
    for k in layout::script_keys(prefix, &task.id, &task.route) {
        invocation.key(k);
    }
    invocation
        .arg(rev)
        .arg(doc)
        .arg(&task.id)
        .arg(if task.state.is_terminal() { "0" } else { "1" })
        .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX).max(1));
    Ok(invocation)
}

impl TaskStore for RedisTasks {
    fn park<'a>(
        &'a self,
        task: &'a TaskRecord,
        body: &'a Bytes,
        caps: ParkCaps,
    ) -> BoxFuture<'a, Result<ParkResult, StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            let mut script = self.park.prepare_invoke();
            for k in self.keys(task) {
                script.key(k);
            }
            let r: i64 = bounded(
                script
                    .arg(
                        serde_json::to_string(task)
                            .map_err(|e| StoreError::Malformed(format!("task {}: {e}", task.id)))?,
                    )
                    .arg(task.parked_at_ms)
                    .arg(&task.id)
                    .arg(caps.max_tasks)
                    .arg(layout::task_key_prefix(self.store.prefix()))
                    .arg(body.as_ref())
                    .arg(task.counted_bytes())
                    .arg(caps.max_bytes)
                    .arg(caps.store_max_bytes)
                    .invoke_async(&mut conn),
            )
            .await?;
            Ok(match r {
                1 => ParkResult::Parked,
                2 => match self.get(&task.id).await? {
                    Some(v) => ParkResult::Exists(Box::new(v)),
                    // Ended and gone between the two calls.
                    None => ParkResult::Late,
                },
                3 => ParkResult::OverCap(ParkRefusal::RouteBytes(caps.max_bytes)),
                4 => ParkResult::OverCap(ParkRefusal::StoreBytes(caps.store_max_bytes)),
                _ => ParkResult::OverCap(ParkRefusal::Tasks(caps.max_tasks)),
            })
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Versioned>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            let (rev, doc): (Option<u64>, Option<String>) =
                bounded(record_cmd(self.store.prefix(), id).query_async(&mut conn)).await?;
            Ok(decode_or_skip(id, rev, doc))
        })
    }

    fn body<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            let body: Option<Vec<u8>> = bounded(
                redis::cmd("HGET")
                    .arg(layout::task_key(self.store.prefix(), id))
                    .arg("body")
                    .query_async(&mut conn),
            )
            .await?;
            Ok(body.map(Bytes::from))
        })
    }

    fn cas<'a>(
        &'a self,
        rev: u64,
        task: &'a TaskRecord,
        keep: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            let invocation = cas_invocation(&self.cas, self.store.prefix(), rev, task, keep)?;
            let r: u64 = bounded(invocation.invoke_async(&mut conn)).await?;
            Ok((r > 0).then_some(r))
        })
    }

    fn live<'a>(&'a self, limit: usize) -> BoxFuture<'a, Result<Vec<Versioned>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            let p = self.store.prefix();
            let stop = i64::try_from(limit).unwrap_or(i64::MAX).saturating_sub(1);
            let ids: Vec<String> = bounded(
                redis::cmd("ZRANGE")
                    .arg(layout::live_key(p))
                    .arg(0)
                    .arg(stop)
                    .query_async(&mut conn),
            )
            .await?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            // Every record (never a body) in one round trip.
            let rows: Vec<(Option<u64>, Option<String>)> =
                bounded(records_pipe(p, &ids).query_async(&mut conn)).await?;
            let mut out = Vec::with_capacity(ids.len());
            let mut gone = Vec::new();
            for (id, (rev, doc)) in ids.iter().zip(rows) {
                match (rev.is_some() && doc.is_some(), decode_or_skip(id, rev, doc)) {
                    (_, Some(v)) => out.push(v),
                    // Listed, but its task is gone (deleted by hand):
                    // unlisted.
                    (false, None) => gone.push(id.as_str()),
                    // Not a task record: left as it is.
                    (true, None) => {}
                }
            }
            if !gone.is_empty() {
                bounded(
                    redis::cmd("ZREM")
                        .arg(layout::live_key(p))
                        .arg(&gone)
                        .query_async::<()>(&mut conn),
                )
                .await?;
            }
            Ok(out)
        })
    }
}
