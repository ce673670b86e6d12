//! `routerctl tasks list|show|approve|drop`: parked tasks (routes with
//! `on_all_down: park`), through the control plane, which reads and
//! changes them in the proxies' shared store (`--shared-store`).

use std::process::ExitCode;

use router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::admin_cmd::{explain_status, fail, print_value, when, Admin};
use crate::policy_cmd::Output;

fn view_json(t: &pb::TaskView) -> Value {
    json!({
        "id": t.id,
        "state": t.state,
        "route": t.route,
        "risk": t.risk,
        "tenant": t.tenant,
        "approved": t.approved,
        "request_id": t.request_id,
        "parked_at": when(i64::try_from(t.parked_at_unix_ms).unwrap_or(0)),
        "expires_at": when(i64::try_from(t.expires_at_unix_ms).unwrap_or(0)),
        "runs": t.runs,
        "reason": t.reason,
        "error": t.error,
        "operator": t.operator,
        "operator_role": t.operator_role,
        "operator_token": t.operator_token,
        "answer_status": t.answer_status,
    })
}

fn print_one(t: &pb::TaskView, output: Output) {
    match output {
        Output::Table => {
            println!("task {}", t.id);
            for (k, v) in [
                ("state", t.state.clone()),
                ("route", t.route.clone()),
                ("risk", t.risk.clone()),
                ("tenant", t.tenant.clone()),
                ("approved", t.approved.to_string()),
                ("request id", t.request_id.clone()),
                (
                    "parked at",
                    when(i64::try_from(t.parked_at_unix_ms).unwrap_or(0)),
                ),
                (
                    "expires at",
                    when(i64::try_from(t.expires_at_unix_ms).unwrap_or(0)),
                ),
                ("runs", t.runs.to_string()),
                ("reason", t.reason.clone()),
                ("error", t.error.clone()),
                ("operator", t.operator.clone()),
                ("operator role", t.operator_role.clone()),
                ("operator token", t.operator_token.clone()),
                ("answer status", t.answer_status.to_string()),
            ] {
                if !v.is_empty() {
                    println!("  {k:<14} {v}");
                }
            }
        }
        _ => print_value(&view_json(t), output),
    }
}

/// `tasks list [--state S] [--route R]`: the live tasks, oldest first.
pub async fn list(admin: &mut Admin, state: &str, route: &str, output: Output) -> ExitCode {
    let tasks = match admin
        .list_tasks(pb::ListTasksRequest {
            state: state.to_string(),
            route: route.to_string(),
        })
        .await
    {
        Ok(r) => r.into_inner().tasks,
        Err(s) => return fail(explain_status(&s)),
    };
    match output {
        Output::Table => {
            println!(
                "{:<33} {:<17} {:<12} {:<12} {:<14} {:<21} RUNS",
                "ID", "STATE", "ROUTE", "RISK", "TENANT", "PARKED AT"
            );
            for t in &tasks {
                println!(
                    "{:<33} {:<17} {:<12} {:<12} {:<14} {:<21} {}",
                    t.id,
                    t.state,
                    t.route,
                    t.risk,
                    if t.tenant.is_empty() { "-" } else { &t.tenant },
                    when(i64::try_from(t.parked_at_unix_ms).unwrap_or(0)),
                    t.runs
                );
            }
        }
        _ => print_value(&Value::Array(tasks.iter().map(view_json).collect()), output),
    }
    ExitCode::SUCCESS
}

/// `tasks show ID`.
pub async fn show(admin: &mut Admin, id: &str, output: Output) -> ExitCode {
    match admin
        .get_task(pb::TaskRequest {
            id: id.to_string(),
            operator: String::new(),
        })
        .await
    {
        Ok(r) => {
            print_one(&r.into_inner(), output);
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}

/// What an operator does to a task.
#[derive(Debug, Clone, Copy)]
pub enum Action {
    /// Let a SEND/DESTRUCTIVE task run.
    Approve,
    /// End a live task; it never runs.
    Drop,
}

/// `tasks approve|drop ID`.
pub async fn act(
    admin: &mut Admin,
    action: Action,
    id: &str,
    operator: &str,
    output: Output,
) -> ExitCode {
    let req = pb::TaskRequest {
        id: id.to_string(),
        operator: operator.to_string(),
    };
    let r = match action {
        Action::Approve => admin.approve_task(req).await,
        Action::Drop => admin.drop_task(req).await,
    };
    match r {
        Ok(r) => {
            print_one(&r.into_inner(), output);
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}
