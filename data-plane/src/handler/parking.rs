//! Safe mode at the edge of a request: a route with `on_all_down: park`
//! whose every pool is down parks the request as a task instead of
//! answering `no_backend` ([`park`]), and a keyed retry finds its task
//! ([`existing`]). The rules are `router_policy::park`'s; the store is
//! [`crate::tasks`].

use http::Response;
use router_policy::park::TaskState;
use router_policy::Route;

use super::answer::Pending;
use super::ProxyBody;
use crate::error::ProxyError;
use crate::idempotency::StoredAnswer;
use crate::tasks::{task_response, unix_ms, ParkContext, ParkResult, Versioned};

/// Parks the request of `ctx` (every pool of `route` is down: `detail`
/// says why), or answers `no_backend` when it cannot be parked (a cap,
/// the store). A tenant's task keeps the tenant's name (never its key):
/// its run is admitted under that tenant again.
pub(super) async fn park(
    mut pending: Pending,
    route: &Route,
    ctx: &ParkContext,
    detail: String,
) -> Response<ProxyBody> {
    let no_backend = |why: &str| ProxyError::NoBackend {
        detail: format!("{detail}; not parked: {why}"),
    };
    if ctx.run {
        return pending.reject(no_backend(
            "this is a parked task's run, which waits again instead",
        ));
    }
    let shared = std::sync::Arc::clone(&pending.shared);
    let rec = pending.rec();
    let request_id = rec.request_id.clone();
    let tenant = rec.tenant.as_deref().map(str::to_string);
    let parked = shared
        .tasks
        .park(ctx, route, &request_id, tenant.as_deref(), detail.clone())
        .await;
    match parked {
        Ok((ParkResult::Parked, task)) => {
            let rec = pending.rec();
            rec.reason = format!(
                "{detail}; parked as task {} ({})",
                task.id,
                task.state.as_str()
            );
            rec.parked_task = Some(task.id.clone());
            pending.reject(ProxyError::Parked {
                route: route.name.clone(),
                task: task.id,
                state: task.state.as_str(),
                respond_async: ctx.respond_async,
            })
        }
        Ok((ParkResult::Exists(v), _)) => answer_with(pending, &v, ctx.respond_async),
        Ok((ParkResult::OverCap(why), _)) => {
            pending.reject(no_backend(&format!("route {:?}: {why}", route.name)))
        }
        Ok((ParkResult::Late, _)) => {
            pending.reject(no_backend("the request's deadline has passed"))
        }
        Err(e) => {
            tracing::warn!(error = %e, "a request could not be parked");
            pending.reject(no_backend(&format!("the task store failed: {e}")))
        }
    }
}

/// A keyed request on a parking route whose task exists: its state, or
/// its answer once it has one. `Err(pending)`: no live task (none, or it
/// expired or was dropped): route the request as usual.
pub(super) async fn existing(
    pending: Pending,
    id: &str,
    respond_async: bool,
) -> Result<Response<ProxyBody>, Pending> {
    let found = pending.shared.tasks.store.get(id).await;
    match found {
        Ok(Some(v))
            if !matches!(
                v.task.state_at(unix_ms()),
                TaskState::Expired | TaskState::Dropped
            ) =>
        {
            Ok(answer_with(pending, &v, respond_async))
        }
        _ => Err(pending),
    }
}

/// The answer for a request whose task is `v`: its stored answer
/// (replayed) once it has one, else its state (202 or 503 `parked`).
fn answer_with(mut pending: Pending, v: &Versioned, respond_async: bool) -> Response<ProxyBody> {
    let task = &v.task;
    let state = task.state_at(unix_ms());
    pending.rec().parked_task = Some(task.id.clone());
    if task.answer.is_some() && matches!(state, TaskState::Done | TaskState::Failed) {
        let resp = task_response(task, false);
        let answer = StoredAnswer::keep(resp.status(), resp.headers(), resp.body(), false);
        return pending.replay(&answer, false);
    }
    pending.rec().reason = format!(
        "the request's parked task {} is {}",
        task.id,
        state.as_str()
    );
    pending.reject(ProxyError::Parked {
        route: task.route.clone(),
        task: task.id.clone(),
        state: state.as_str(),
        respond_async,
    })
}
