//! `routerctl circuits list | open | close`: circuit overrides and the
//! fleet's suspicion marks.

use std::process::ExitCode;

use router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::admin_cmd::{explain_status, fail, print_value, when, Admin};
use crate::policy_cmd::Output;

/// `circuits list`.
pub async fn circuits_list(admin: &mut Admin, output: Output) -> ExitCode {
    let circuits = match admin.list_circuits(pb::ListCircuitsRequest {}).await {
        Ok(r) => r.into_inner().circuits,
        Err(s) => return fail(explain_status(&s)),
    };
    match output {
        Output::Table => {
            println!(
                "{:<16} {:<36} {:<16} {:<7} {:<21} SOURCE",
                "POOL", "ENDPOINT", "KIND", "STATE", "UNTIL"
            );
            for row in circuit_rows(&circuits) {
                println!(
                    "{:<16} {:<36} {:<16} {:<7} {:<21} {}",
                    row.pool,
                    row.endpoint,
                    row.kind,
                    row.state,
                    when(row.until_unix_ms),
                    row.sources.join(", ")
                );
            }
        }
        _ => print_value(
            &Value::Array(
                circuits
                    .iter()
                    .map(|c| json!({"pool": c.pool, "endpoint": c.endpoint, "open": c.open, "until": when(c.until_unix_ms), "source": c.source, "kind": circuit_kind(c)}))
                    .collect(),
            ),
            output,
        ),
    }
    ExitCode::SUCCESS
}

/// What an override is: a forced circuit, or a suspicion and its cause.
fn circuit_kind(c: &pb::CircuitOverride) -> String {
    if c.suspect.is_empty() {
        "circuit".into()
    } else {
        format!("suspect ({})", c.suspect)
    }
}

/// One line of `circuits list`: the overrides of one target, kind and
/// state, whoever reported them.
#[derive(Debug, PartialEq, Eq)]
pub struct CircuitRow {
    /// Pool.
    pub pool: String,
    /// Endpoint, or `(all)`.
    pub endpoint: String,
    /// `circuit` or `suspect (cause)`.
    pub kind: String,
    /// `open` or `closed`.
    pub state: &'static str,
    /// The latest expiry among them.
    pub until_unix_ms: i64,
    /// Who set or reported them (`operator`, node ids), sorted.
    pub sources: Vec<String>,
}

/// The table's rows: overrides of the same target, kind and state (each
/// proxy reports its own, and a circuit and two kinds of suspicion of one
/// endpoint are three records) are one row naming every source, instead
/// of rows that read as the same override two and three times.
pub fn circuit_rows(circuits: &[pb::CircuitOverride]) -> Vec<CircuitRow> {
    let mut rows: Vec<CircuitRow> = Vec::new();
    for c in circuits {
        let endpoint = if c.endpoint.is_empty() {
            "(all)".to_string()
        } else {
            c.endpoint.clone()
        };
        let kind = circuit_kind(c);
        let state = if c.open { "open" } else { "closed" };
        match rows.iter_mut().find(|r| {
            r.pool == c.pool && r.endpoint == endpoint && r.kind == kind && r.state == state
        }) {
            Some(row) => {
                row.until_unix_ms = row.until_unix_ms.max(c.until_unix_ms);
                if !row.sources.contains(&c.source) {
                    row.sources.push(c.source.clone());
                    row.sources.sort();
                }
            }
            None => rows.push(CircuitRow {
                pool: c.pool.clone(),
                endpoint,
                kind,
                state,
                until_unix_ms: c.until_unix_ms,
                sources: vec![c.source.clone()],
            }),
        }
    }
    rows
}

/// `circuits open|close POOL [ADDR] [--for DURATION]`.
pub async fn circuits_set(
    admin: &mut Admin,
    pool: &str,
    addr: Option<&str>,
    open: bool,
    for_secs: u64,
) -> ExitCode {
    match admin
        .set_circuit(pb::SetCircuitRequest {
            pool: pool.to_string(),
            endpoint: addr.unwrap_or("").to_string(),
            open,
            for_seconds: for_secs,
        })
        .await
    {
        Ok(r) => {
            let target = match addr {
                Some(a) => format!("{pool} {a}"),
                None => format!("every endpoint of {pool}"),
            };
            let what = match (open, for_secs) {
                (true, _) => "opened for",
                (false, 0) => "overrides cleared for",
                (false, _) => "forced closed for",
            };
            println!(
                "circuit {what} {target} (revision {})",
                r.into_inner().revision
            );
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30, item 8: `circuits list` showed one endpoint's override
    /// two and three times (one record per reporting proxy, and a circuit
    /// and suspicions of it in the same columns).
    #[test]
    fn circuits_list_shows_each_override_once_with_its_kind_and_every_source() {
        let c = |endpoint: &str, suspect: &str, source: &str, until: i64| pb::CircuitOverride {
            pool: "gpu".into(),
            endpoint: endpoint.into(),
            open: true,
            until_unix_ms: until,
            source: source.into(),
            suspect: suspect.into(),
        };
        let rows = circuit_rows(&[
            c("10.0.0.1:8000", "", "proxy-b", 5),
            c("10.0.0.1:8000", "check", "proxy-a", 7),
            c("10.0.0.1:8000", "", "proxy-a", 9),
            c("10.0.0.1:8000", "attempt", "proxy-a", 3),
            c("", "", "operator", 1),
        ]);
        let view: Vec<(&str, &str, String, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r.endpoint.as_str(),
                    r.kind.as_str(),
                    r.sources.join(","),
                    r.until_unix_ms,
                )
            })
            .collect();
        assert_eq!(
            view,
            vec![
                ("10.0.0.1:8000", "circuit", "proxy-a,proxy-b".to_string(), 9),
                ("10.0.0.1:8000", "suspect (check)", "proxy-a".to_string(), 7),
                (
                    "10.0.0.1:8000",
                    "suspect (attempt)",
                    "proxy-a".to_string(),
                    3
                ),
                ("(all)", "circuit", "operator".to_string(), 1),
            ]
        );
    }
}
