//! `routerctl rollout status|pause|resume|abort ROUTE`: a route's ramps
//! (docs/traffic.md "Ramps"). `status` shows each ramped split's step,
//! weight, window counts and verdict as the answering replica sees them;
//! `pause` and `resume` keep its ramps from advancing (a rollback still
//! happens) or let them advance again;
//! `abort` sets each new side's weight to 0 (a new policy version noted
//! `ramp: aborted by operator`).

use std::process::ExitCode;

use router_proto::v1 as pb;
use serde_json::json;

use crate::admin_cmd::{explain_status, fail, print_value, Admin};
use crate::policy_cmd::Output;

/// One rollout command: `action` is `status`, `pause`, `resume` or `abort`.
pub async fn rollout(admin: &mut Admin, action: &str, route: &str, output: Output) -> ExitCode {
    let r = match admin
        .rollout(pb::RolloutRequest {
            route: route.to_string(),
            action: action.to_string(),
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return fail(explain_status(&s)),
    };
    match output {
        Output::Table => print!("{}", table(&r)),
        _ => print_value(&value(&r), output),
    }
    ExitCode::SUCCESS
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0} ms"))
}

/// The human-readable answer.
pub fn table(r: &pb::RolloutResponse) -> String {
    let mut out = format!("policy version {}\n", r.version);
    for s in &r.ramps {
        let steps: Vec<String> = s.steps.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "route {} step {}: {} {}% / {} {}% (steps {}, {} s each){}\n",
            s.route,
            s.step,
            s.new_pool,
            s.weight,
            s.old_pool,
            100 - s.weight.min(100),
            steps.join(", "),
            s.step_seconds,
            if s.paused { ", PAUSED" } else { "" }
        ));
        if s.window {
            out.push_str(&format!(
                "  window {:.1} s: new {} requests, {} errors, p95 {}; old {} requests, {} errors, p95 {}\n",
                s.elapsed_ms as f64 / 1000.0,
                s.new_requests,
                s.new_errors,
                ms(s.new_p95_ms),
                s.old_requests,
                s.old_errors,
                ms(s.old_p95_ms)
            ));
        } else {
            out.push_str(
                "  no window on this replica (it does not lead, or the step just began)\n",
            );
        }
        out.push_str(&format!("  verdict: {} ({})\n", s.verdict, s.detail));
    }
    out
}

fn value(r: &pb::RolloutResponse) -> serde_json::Value {
    json!({
        "version": r.version,
        "ramps": r.ramps.iter().map(|s| json!({
            "route": s.route,
            "step": s.step,
            "new": s.new_pool,
            "old": s.old_pool,
            "weight": s.weight,
            "steps": s.steps,
            "step_s": s.step_seconds,
            "paused": s.paused,
            "window": s.window.then(|| json!({
                "elapsed_ms": s.elapsed_ms,
                "new": {"requests": s.new_requests, "errors": s.new_errors, "p95_ms": s.new_p95_ms},
                "old": {"requests": s.old_requests, "errors": s.old_errors, "p95_ms": s.old_p95_ms},
            })),
            "verdict": s.verdict,
            "detail": s.detail,
        })).collect::<Vec<_>>(),
    })
}
