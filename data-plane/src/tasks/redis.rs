//! Parked tasks in the fleet's shared store (Redis or Valkey), laid out as
//! [`router_policy::park::layout`] says (the control plane reads and
//! writes the same keys). Every call is bounded by the store's call
//! timeout.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use router_policy::park::{layout, TaskRecord};

use super::{ParkResult, TaskStore, Versioned};
use crate::idempotency::{bounded, RedisStore, StoreError};

/// Tasks in Redis, on the idempotency store's connections.
pub(crate) struct RedisTasks {
    store: Arc<RedisStore>,
    park: redis::Script,
    cas: redis::Script,
}

impl RedisTasks {
    pub(crate) fn new(store: Arc<RedisStore>) -> Self {
        Self {
            store,
            park: redis::Script::new(layout::PARK_SCRIPT),
            cas: redis::Script::new(layout::CAS_SCRIPT),
        }
    }

    fn keys(&self, task: &TaskRecord) -> [String; 3] {
        let p = self.store.prefix();
        [
            layout::task_key(p, &task.id),
            layout::live_key(p),
            layout::route_key(p, &task.route),
        ]
    }
}

fn encode(task: &TaskRecord) -> Result<String, StoreError> {
    serde_json::to_string(task).map_err(|e| StoreError::Unavailable(e.to_string()))
}

impl TaskStore for RedisTasks {
    fn park<'a>(
        &'a self,
        task: &'a TaskRecord,
        cap: u32,
    ) -> BoxFuture<'a, Result<ParkResult, StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            let [k, live, route] = self.keys(task);
            let r: i64 = bounded(
                self.park
                    .key(k)
                    .key(live)
                    .key(route)
                    .arg(encode(task)?)
                    .arg(task.parked_at_ms)
                    .arg(&task.id)
                    .arg(cap)
                    .arg(layout::task_key_prefix(self.store.prefix()))
                    .invoke_async(&mut conn),
            )
            .await?;
            Ok(match r {
                1 => ParkResult::Parked,
                2 => match self.get(&task.id).await? {
                    Some(v) => ParkResult::Exists(Box::new(v)),
                    None => ParkResult::OverCap,
                },
                _ => ParkResult::OverCap,
            })
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Versioned>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            let (rev, doc): (Option<u64>, Option<String>) = bounded(
                redis::cmd("HMGET")
                    .arg(layout::task_key(self.store.prefix(), id))
                    .arg("rev")
                    .arg("doc")
                    .query_async(&mut conn),
            )
            .await?;
            let (Some(rev), Some(doc)) = (rev, doc) else {
                return Ok(None);
            };
            match serde_json::from_str::<TaskRecord>(&doc) {
                Ok(task) => Ok(Some(Versioned { rev, task })),
                Err(e) => {
                    tracing::warn!(task = id, error = %e, "task store: a task that is not a task record; ignored");
                    Ok(None)
                }
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
            let mut conn = self.store.conn().await?;
            let [k, live, route] = self.keys(task);
            let r: u64 = bounded(
                self.cas
                    .key(k)
                    .key(live)
                    .key(route)
                    .arg(rev)
                    .arg(encode(task)?)
                    .arg(&task.id)
                    .arg(if task.state.is_terminal() { "0" } else { "1" })
                    .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX).max(1))
                    .invoke_async(&mut conn),
            )
            .await?;
            Ok((r > 0).then_some(r))
        })
    }

    fn forget<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            bounded(
                redis::cmd("ZREM")
                    .arg(layout::live_key(self.store.prefix()))
                    .arg(id)
                    .query_async::<()>(&mut conn),
            )
            .await
        })
    }

    fn live<'a>(&'a self, limit: usize) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.store.conn().await?;
            let stop = i64::try_from(limit).unwrap_or(i64::MAX).saturating_sub(1);
            bounded(
                redis::cmd("ZRANGE")
                    .arg(layout::live_key(self.store.prefix()))
                    .arg(0)
                    .arg(stop)
                    .query_async(&mut conn),
            )
            .await
        })
    }
}
