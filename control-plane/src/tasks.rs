//! Parked tasks (`on_all_down: park`) as operators see and change them:
//! read from and written to the proxies' shared store (`--shared-store`),
//! with the layout and the rules of [`router_policy::park`]. A change is
//! a compare-and-set on the task's revision, as the proxies' are, so an
//! approval never races a claim into an illegal state.

use router_policy::park::{Event, TaskRecord, TaskState};
use router_proto::v1 as pb;
use router_shared_state::admin::tasks::ChangedBy;
use router_shared_state::{SharedStoreClient, StoreError};
use tonic::Status;

/// A store error as the Admin API answers it, for task `id`.
pub(crate) fn status(id: &str, e: StoreError) -> Status {
    match e {
        StoreError::NotFound(_) => Status::not_found(format!("no task {id:?}")),
        StoreError::Illegal(e) => Status::failed_precondition(format!("task {id}: {e}")),
        StoreError::Conflict(_) => Status::aborted(format!("task {id} kept changing; try again")),
        e => crate::shared_store::status(e),
    }
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

/// The live tasks, oldest first, filtered by `state` and `route` when
/// given.
pub async fn list(
    client: &SharedStoreClient,
    state: &str,
    route: &str,
) -> Result<Vec<pb::TaskView>, Status> {
    let wanted = if state.is_empty() {
        None
    } else {
        Some(TaskState::parse(state).ok_or_else(|| {
            Status::invalid_argument(format!(
                "state: one of {}",
                TaskState::ALL.map(TaskState::as_str).join(", ")
            ))
        })?)
    };
    let route = (!route.is_empty()).then_some(route);
    let tasks = client
        .list_tasks(wanted, route)
        .await
        .map_err(crate::shared_store::status)?;
    Ok(tasks.iter().map(|v| view(&v.task)).collect())
}

/// The tasks among `ids` whose records are still kept (a finished task's
/// is kept for a while after it left the live set), in `ids`' order; one
/// round trip. The console lists finished tasks it saw waiting with it.
pub async fn get_many(
    client: &SharedStoreClient,
    ids: &[String],
) -> Result<Vec<pb::TaskView>, Status> {
    let tasks = client
        .tasks(ids)
        .await
        .map_err(crate::shared_store::status)?;
    Ok(tasks.iter().map(|v| view(&v.task)).collect())
}

/// One task.
pub async fn get(client: &SharedStoreClient, id: &str) -> Result<pb::TaskView, Status> {
    match client.task(id).await {
        Ok(Some(v)) => Ok(view(&v.task)),
        Ok(None) => Err(Status::not_found(format!("no task {id:?}"))),
        Err(e) => Err(status(id, e)),
    }
}

/// Applies an operator's `event` (approve, drop) to task `id`, recording
/// who: the caller's role, token name and given name. The store's
/// compare-and-set retries when a proxy changed the task meanwhile
/// (`router_shared_state::admin::tasks`).
pub async fn change(
    client: &SharedStoreClient,
    id: &str,
    event: Event,
    who: &Actor,
) -> Result<pb::TaskView, Status> {
    let by = ChangedBy {
        name: who.name().to_string(),
        role: who.role.to_string(),
        token: who.token.clone(),
    };
    let task: TaskRecord = client
        .change_task(id, event, &by)
        .await
        .map_err(|e| status(id, e))?;
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
    Ok(view(&task))
}
