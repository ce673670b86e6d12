//! The drill's report: checks and the table printed at the end.

use super::*;

pub(super) fn check(
    checks: &mut Vec<Check>,
    expect: impl Into<String>,
    seen: impl Into<String>,
    pass: bool,
) {
    checks.push(Check {
        expect: expect.into(),
        seen: seen.into(),
        pass,
    });
}

pub(super) fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// The drill's table, as printed.
pub fn render_table(reports: &[ScenarioReport]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<22} {:>4} {:>8} {:>9} {:<26} {:>4} {:>9} {:>8} {:>8} {:>8}  {}\n",
        "scenario",
        "reqs",
        "primary",
        "fallback",
        "sheds",
        "dup",
        "abandoned",
        "p50",
        "p95",
        "max",
        "verdict"
    ));
    for r in reports {
        if let Some(why) = &r.skipped {
            out.push_str(&format!("{:<22} SKIPPED: {why}\n", r.scenario));
            continue;
        }
        let sheds = if r.sheds.is_empty() {
            "-".to_string()
        } else {
            r.sheds
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        out.push_str(&format!(
            "{:<22} {:>4} {:>8} {:>9} {:<26} {:>4} {:>9} {:>7.3}s {:>7.3}s {:>7.3}s  {}\n",
            r.scenario,
            r.requests,
            r.routes.get("primary").copied().unwrap_or(0),
            r.routes.get("fallback").copied().unwrap_or(0),
            sheds,
            r.duplicate_generations,
            r.abandoned,
            r.p50_s,
            r.p95_s,
            r.max_s,
            if r.pass { "PASS" } else { "FAIL" }
        ));
        for c in &r.checks {
            out.push_str(&format!(
                "    {} {} (seen: {})\n",
                if c.pass { "ok  " } else { "FAIL" },
                c.expect,
                c.seen
            ));
        }
    }
    out
}
