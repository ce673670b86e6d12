//! Parked tasks (`on_all_down: park`) as operators see and change them:
//! read from and written to the proxies' shared store (`--shared-store`),
//! with the layout and the rules of [`router_policy::park`]. A change is
//! a compare-and-set on the task's revision, as the proxies' are, so an
//! approval never races a claim into an illegal state.

use std::time::Duration;

use router_policy::park::{layout, Event, Illegal, TaskRecord, TaskState};
use router_proto::v1 as pb;
use tonic::Status;

/// The proxies' key prefix (`router_proxy`'s shared store).
const PREFIX: &str = "router:";
/// Each store call's limit.
const CALL: Duration = Duration::from_secs(2);
/// Most tasks listed.
const LIST_MAX: isize = 1000;

fn unavailable(e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("the shared store: {e}"))
}

async fn conn(client: &redis::Client) -> Result<redis::aio::MultiplexedConnection, Status> {
    tokio::time::timeout(CALL, client.get_multiplexed_async_connection())
        .await
        .map_err(|_| Status::unavailable("the shared store did not answer within 2 s"))?
        .map_err(unavailable)
}

async fn bounded<T>(
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, Status> {
    tokio::time::timeout(CALL, call)
        .await
        .map_err(|_| Status::unavailable("the shared store did not answer within 2 s"))?
        .map_err(unavailable)
}

// Tasks carry wall-clock times shared by every proxy.
use router_policy::wall_clock::unix_ms as now_ms;

/// Who approves or drops a task: the caller's role and token name, and
/// the name they gave (`routerctl tasks approve --operator NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// `operator` or `open`.
    pub role: &'static str,
    /// The name the caller's token carries.
    pub token: Option<String>,
    /// The name they gave, if any.
    pub said: Option<String>,
}

impl Actor {
    /// The caller with `role`, who said `said` (empty: nothing).
    pub fn new(role: &crate::auth::Role, said: &str) -> Self {
        let said = said.trim();
        Self {
            role: role.as_str(),
            token: role.token_name().map(str::to_string),
            said: (!said.is_empty()).then(|| said.to_string()),
        }
    }

    /// The name recorded as the task's `operator`: the one they gave, else
    /// their token's, else their role.
    pub fn name(&self) -> &str {
        self.said
            .as_deref()
            .or(self.token.as_deref())
            .unwrap_or(self.role)
    }
}

/// The operator's view of a task.
pub fn view(t: &TaskRecord) -> pb::TaskView {
    pb::TaskView {
        id: t.id.clone(),
        state: t.state_at(now_ms()).as_str().into(),
        route: t.route.clone(),
        risk: t.risk.as_str().into(),
        approved: t.approved,
        request_id: t.request_id.clone(),
        parked_at_unix_ms: t.parked_at_ms,
        expires_at_unix_ms: t.expires_at_ms,
        runs: t.runs,
        reason: t.reason.clone(),
        error: t.error.clone().unwrap_or_default(),
        operator: t.operator.clone().unwrap_or_default(),
        answer_status: t.answer.as_ref().map_or(0, |a| u32::from(a.status)),
        tenant: t.tenant.clone().unwrap_or_default(),
        operator_role: t.operator_role.clone().unwrap_or_default(),
        operator_token: t.operator_token.clone().unwrap_or_default(),
    }
}

async fn read(
    conn: &mut redis::aio::MultiplexedConnection,
    id: &str,
) -> Result<Option<(u64, TaskRecord)>, Status> {
    let (rev, doc): (Option<u64>, Option<String>) = bounded(
        redis::cmd("HMGET")
            .arg(layout::task_key(PREFIX, id))
            .arg("rev")
            .arg("doc")
            .query_async(conn),
    )
    .await?;
    match (rev, doc) {
        (Some(rev), Some(doc)) => serde_json::from_str(&doc)
            .map(|t| Some((rev, t)))
            .map_err(|e| Status::internal(format!("task {id} is not a task record: {e}"))),
        _ => Ok(None),
    }
}

/// The live tasks, oldest first, filtered by `state` and `route` when
/// given.
pub async fn list(
    client: &redis::Client,
    state: &str,
    route: &str,
) -> Result<Vec<pb::TaskView>, Status> {
    if !state.is_empty() && TaskState::parse(state).is_none() {
        return Err(Status::invalid_argument(format!(
            "state: one of {}",
            TaskState::ALL.map(TaskState::as_str).join(", ")
        )));
    }
    let mut conn = conn(client).await?;
    let ids: Vec<String> = bounded(
        redis::cmd("ZRANGE")
            .arg(layout::live_key(PREFIX))
            .arg(0)
            .arg(LIST_MAX - 1)
            .query_async(&mut conn),
    )
    .await?;
    // Every task in one round trip.
    let mut pipe = redis::pipe();
    for id in &ids {
        pipe.cmd("HGET")
            .arg(layout::task_key(PREFIX, id))
            .arg("doc");
    }
    let docs: Vec<Option<String>> = if ids.is_empty() {
        Vec::new()
    } else {
        bounded(pipe.query_async(&mut conn)).await?
    };
    let mut out = Vec::new();
    for doc in docs.into_iter().flatten() {
        // A task being rewritten by hand is left out rather than failing the list.
        let Ok(t) = serde_json::from_str::<TaskRecord>(&doc) else {
            continue;
        };
        let v = view(&t);
        if (state.is_empty() || v.state == state) && (route.is_empty() || t.route == route) {
            out.push(v);
        }
    }
    Ok(out)
}

/// The tasks among `ids` whose records are still kept (a finished task's
/// is kept for a while after it left the live set), in `ids`' order; one
/// round trip. The console lists finished tasks it saw waiting with it.
pub async fn get_many(client: &redis::Client, ids: &[String]) -> Result<Vec<pb::TaskView>, Status> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = conn(client).await?;
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.cmd("HGET")
            .arg(layout::task_key(PREFIX, id))
            .arg("doc");
    }
    let docs: Vec<Option<String>> = bounded(pipe.query_async(&mut conn)).await?;
    Ok(docs
        .into_iter()
        .flatten()
        .filter_map(|doc| serde_json::from_str::<TaskRecord>(&doc).ok())
        .map(|t| view(&t))
        .collect())
}

/// One task.
pub async fn get(client: &redis::Client, id: &str) -> Result<pb::TaskView, Status> {
    let mut conn = conn(client).await?;
    read(&mut conn, id)
        .await?
        .map(|(_, t)| view(&t))
        .ok_or_else(|| Status::not_found(format!("no task {id:?}")))
}

/// Applies an operator's `event` (approve, drop) to task `id`, recording
/// who: the caller's role, token name and given name.
pub async fn change(
    client: &redis::Client,
    id: &str,
    event: Event,
    who: &Actor,
) -> Result<pb::TaskView, Status> {
    let mut conn = conn(client).await?;
    let script = redis::Script::new(layout::CAS_SCRIPT);
    // A proxy may change the task between the read and the write (a
    // claim, a renewal): read again and retry.
    for _ in 0..8 {
        let Some((rev, mut task)) = read(&mut conn, id).await? else {
            return Err(Status::not_found(format!("no task {id:?}")));
        };
        // A waiting task past its time is expired, whatever the store says.
        if task.state_at(now_ms()) == TaskState::Expired && task.state != TaskState::Expired {
            task.state = TaskState::Expired;
        }
        task.apply(event)
            .map_err(|e: Illegal| Status::failed_precondition(format!("task {id}: {e}")))?;
        task.operator = Some(who.name().to_string());
        task.operator_role = Some(who.role.to_string());
        task.operator_token.clone_from(&who.token);
        let doc = serde_json::to_string(&task).map_err(|e| Status::internal(e.to_string()))?;
        let keep = task
            .expires_at_ms
            .saturating_sub(task.parked_at_ms)
            .max(60_000);
        let mut invocation = script.prepare_invoke();
        for k in layout::script_keys(PREFIX, id, &task.route) {
            invocation.key(k);
        }
        let r: u64 = bounded(
            invocation
                .arg(rev)
                .arg(doc)
                .arg(id)
                .arg(if task.state.is_terminal() { "0" } else { "1" })
                .arg(keep)
                .invoke_async(&mut conn),
        )
        .await?;
        if r > 0 {
            tracing::info!(
                task = id,
                event = event.as_str(),
                operator = who.name(),
                role = who.role,
                token = who.token.as_deref().unwrap_or(""),
                said = who.said.as_deref().unwrap_or(""),
                state = task.state.as_str(),
                "parked task changed by an operator"
            );
            return Ok(view(&task));
        }
    }
    Err(Status::aborted(format!(
        "task {id} kept changing; try again"
    )))
}
