//! `/tasks`: parked tasks by state, with their route, risk, tenant, age,
//! time left and route record; Approve and Drop for approvers and
//! operators, through [`crate::tasks::change`] (what `routerctl tasks
//! approve|drop` calls). `/tasks/ID`: one task.
//!
//! Live tasks come from the proxies' shared store; a task that finished
//! leaves its live set, so the page also lists the finished tasks this
//! console saw live (the last 500), for as long as the store keeps their
//! records.

use askama::Template;
use http::StatusCode;
use router_policy::park::{Event, TaskState};
use router_proto::v1 as pb;
use tonic::Code;

use super::super::session::Session;
use super::super::{redirect, Answer, Console, Form};
use super::{ago, error_page, left, render, Layout};
use crate::hub::now_ms;
use crate::tasks::Actor;

/// One task as the page shows it.
pub(super) struct TaskRow {
    id: String,
    state: String,
    route: String,
    risk: String,
    tenant: String,
    age: String,
    /// Time left before it expires (waiting tasks only).
    left: String,
    runs: u32,
    request_id: String,
    reason: String,
    error: String,
    operator: String,
    answer_status: u32,
    may_approve: bool,
    may_drop: bool,
}

impl TaskRow {
    fn of(t: pb::TaskView, role_may_act: bool, now: i64) -> Self {
        let waiting = t.state == TaskState::WaitingApproval.as_str()
            || t.state == TaskState::WaitingCapacity.as_str();
        let operator = match (t.operator.is_empty(), t.operator_role.is_empty()) {
            (true, _) => String::new(),
            (false, true) => t.operator.clone(),
            (false, false) => format!("{} ({})", t.operator, t.operator_role),
        };
        let ms = |u: u64| i64::try_from(u).unwrap_or(i64::MAX);
        Self {
            may_approve: role_may_act
                && t.state == TaskState::WaitingApproval.as_str()
                && !t.approved,
            may_drop: role_may_act && waiting,
            age: ago(ms(t.parked_at_unix_ms), now),
            left: if waiting {
                left(ms(t.expires_at_unix_ms), now)
            } else {
                String::new()
            },
            id: t.id,
            state: t.state,
            route: t.route,
            risk: t.risk,
            tenant: t.tenant,
            runs: t.runs,
            request_id: t.request_id,
            reason: t.reason,
            error: t.error,
            operator,
            answer_status: t.answer_status,
        }
    }
}

/// The tasks of one state.
pub(super) struct Group {
    state: &'static str,
    tasks: Vec<TaskRow>,
}

#[derive(Template)]
#[template(path = "tasks.html")]
struct TasksPage {
    layout: Layout,
    /// Why no task can be shown (no shared store, the store failed).
    problem: String,
    groups: Vec<Group>,
    total: usize,
}

#[derive(Template)]
#[template(path = "task.html")]
struct TaskPage {
    layout: Layout,
    task: TaskRow,
}

const NO_STORE: &str = "parked tasks live in the proxies' shared store: start the control plane with --shared-store (ROUTER_SHARED_STORE) pointing at it";

/// The states in the order the page shows them: what waits for a person
/// first.
const ORDER: [TaskState; 7] = [
    TaskState::WaitingApproval,
    TaskState::WaitingCapacity,
    TaskState::Running,
    TaskState::Done,
    TaskState::Failed,
    TaskState::Expired,
    TaskState::Dropped,
];

async fn all_tasks(
    console: &Console,
    client: &router_shared_state::SharedStoreClient,
) -> Result<Vec<pb::TaskView>, tonic::Status> {
    let mut live = crate::tasks::list(client, "", "").await?;
    console.remember_tasks(live.iter().map(|t| t.id.as_str()));
    let gone: Vec<String> = console
        .recent_tasks()
        .into_iter()
        .filter(|id| !live.iter().any(|t| &t.id == id))
        .collect();
    let mut finished = crate::tasks::get_many(client, &gone).await?;
    finished.reverse();
    live.extend(finished);
    Ok(live)
}

/// `GET /tasks`.
pub(in crate::console) async fn list(
    console: &Console,
    s: &Session,
    _query: Option<&str>,
) -> Answer {
    let layout = Layout::new("Tasks", "tasks", s, true);
    let (tasks, problem) = match &console.shared_store {
        None => (Vec::new(), NO_STORE.to_string()),
        Some(client) => match all_tasks(console, client).await {
            Ok(t) => (t, String::new()),
            Err(e) => (Vec::new(), e.message().to_string()),
        },
    };
    render(
        StatusCode::OK,
        &page(layout, problem, tasks, s.role.may_approve(), now_ms()),
    )
}

/// The page of `tasks`, grouped by state.
fn page(
    layout: Layout,
    problem: String,
    tasks: Vec<pb::TaskView>,
    may: bool,
    now: i64,
) -> TasksPage {
    let total = tasks.len();
    let mut rows: Vec<TaskRow> = tasks
        .into_iter()
        .map(|t| TaskRow::of(t, may, now))
        .collect();
    let groups = ORDER
        .iter()
        .map(|state| {
            let name = state.as_str();
            let (mine, rest): (Vec<TaskRow>, Vec<TaskRow>) =
                rows.drain(..).partition(|r| r.state == name);
            rows = rest;
            Group {
                state: name,
                tasks: mine,
            }
        })
        .collect();
    TasksPage {
        layout,
        problem,
        groups,
        total,
    }
}

fn status_code(e: &tonic::Status) -> StatusCode {
    match e.code() {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition | Code::Aborted => StatusCode::CONFLICT,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `GET /tasks/ID`.
pub(in crate::console) async fn show(console: &Console, s: &Session, id: &str) -> Answer {
    let Some(client) = &console.shared_store else {
        return error_page(StatusCode::SERVICE_UNAVAILABLE, NO_STORE);
    };
    match crate::tasks::get(client, id).await {
        Ok(t) => {
            console.remember_tasks(std::iter::once(t.id.as_str()));
            render(
                StatusCode::OK,
                &TaskPage {
                    layout: Layout::new("Task", "tasks", s, true),
                    task: TaskRow::of(t, s.role.may_approve(), now_ms()),
                },
            )
        }
        Err(e) => error_page(status_code(&e), e.message()),
    }
}

/// `POST /tasks/ID/approve` and `POST /tasks/ID/drop`: approvers and
/// operators only; the CSRF token was checked.
pub(in crate::console) async fn act(
    console: &Console,
    s: &Session,
    id: &str,
    action: &str,
    _form: &Form,
) -> Answer {
    let event = match action {
        "approve" => Event::Approve,
        "drop" => Event::Drop,
        _ => return error_page(StatusCode::NOT_FOUND, "no such action"),
    };
    if !s.role.may_approve() {
        tracing::warn!(who = %s.who(), task = id, action, "console: a change refused to a viewer");
        return error_page(
            StatusCode::FORBIDDEN,
            "a viewer may not approve or drop tasks: sign in with an approver or operator token",
        );
    }
    let Some(client) = &console.shared_store else {
        return error_page(StatusCode::SERVICE_UNAVAILABLE, NO_STORE);
    };
    let who = Actor::new(&s.role, "");
    match crate::tasks::change(client, id, event, &who).await {
        Ok(t) => {
            console.remember_tasks(std::iter::once(t.id.as_str()));
            redirect("/tasks")
        }
        Err(e) => error_page(status_code(&e), e.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::pages::cost::{session, time_renders};

    /// The tasks page's render time with 10,000 tasks (docs/benchmarks.md,
    /// "The console"): `cargo test -p router-control-plane --release --lib
    /// -- --ignored --nocapture render_cost`.
    #[test]
    #[ignore = "a measurement: run it in release"]
    fn render_cost_of_the_tasks_page_with_10000_tasks() {
        let states = [
            "waiting_approval",
            "waiting_capacity",
            "running",
            "done",
            "failed",
            "expired",
        ];
        let tasks: Vec<pb::TaskView> = (0..10_000u64)
            .map(|i| pb::TaskView {
                id: format!("01j9task{i:08}"),
                state: states[(i % 6) as usize].into(),
                route: "send".into(),
                risk: "SEND".into(),
                tenant: format!("tenant-{}", i % 50),
                request_id: format!("req-{i:08}"),
                parked_at_unix_ms: 1_700_000_000_000 + i,
                expires_at_unix_ms: 1_700_000_600_000 + i,
                reason: "every pool of route \"send\" is down (only: circuit open)".into(),
                ..Default::default()
            })
            .collect();
        let s = session();
        let bytes = time_renders("tasks page, 10,000 tasks", || {
            page(
                Layout::new("Tasks", "tasks", &s, true),
                String::new(),
                tasks.clone(),
                true,
                1_700_000_100_000,
            )
            .render()
            .map(|b| b.len())
            .unwrap_or(0)
        });
        assert!(bytes > 10_000 * 500, "{bytes} bytes");
    }
}
