//! `routerctl proxies list`: the managed proxies, what each applied, and
//! when each was last seen.

use std::process::ExitCode;

use router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::admin_cmd::{explain_status, fail, print_value, when, Admin};
use crate::policy_cmd::Output;

/// A proxy's state in `proxies list` ([`router_proto::proxy_state`]).
fn proxy_state(p: &pb::ProxyStatus) -> &'static str {
    router_proto::proxy_state(p.connected, p.applied_revision, p.nacked_revision)
}

/// `proxies list`.
pub async fn proxies_list(admin: &mut Admin, output: Output) -> ExitCode {
    let proxies = match admin.list_proxies(pb::ListProxiesRequest {}).await {
        Ok(r) => r.into_inner().proxies,
        Err(s) => return fail(explain_status(&s)),
    };
    match output {
        Output::Table => {
            println!(
                "{:<24} {:<16} {:<9} {:<10} {:<21} LAST NACK",
                "NODE", "CONTROL PLANE", "REVISION", "STATE", "LAST SEEN"
            );
            for p in &proxies {
                let state = proxy_state(p);
                println!(
                    "{:<24} {:<16} {:<9} {:<10} {:<21} {}",
                    p.node_id,
                    if p.control_plane.is_empty() { "-" } else { &p.control_plane },
                    p.applied_revision,
                    state,
                    when(p.last_seen_unix_ms),
                    p.last_nack
                );
            }
        }
        _ => print_value(
            &Value::Array(
                proxies
                    .iter()
                    .map(|p| {
                        json!({"node_id": p.node_id, "applied_revision": p.applied_revision, "nacked_revision": p.nacked_revision,
                               "last_nack": p.last_nack, "connected": p.connected, "control_plane": p.control_plane, "last_seen": when(p.last_seen_unix_ms),
                               "circuit_reports_dropped": p.circuit_reports_dropped})
                    })
                    .collect(),
            ),
            output,
        ),
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30, item 8: a proxy that has applied nothing yet is not
    /// `ACK` (there was nothing to acknowledge).
    #[test]
    fn a_proxy_with_no_revision_yet_is_waiting_not_acked() {
        let p = |connected, applied, nacked| pb::ProxyStatus {
            connected,
            applied_revision: applied,
            nacked_revision: nacked,
            ..Default::default()
        };
        assert_eq!(proxy_state(&p(true, 0, 0)), "waiting");
        assert_eq!(proxy_state(&p(true, 3, 0)), "ACK");
        assert_eq!(proxy_state(&p(true, 3, 4)), "NACK");
        assert_eq!(proxy_state(&p(true, 0, 1)), "NACK");
        assert_eq!(proxy_state(&p(false, 3, 0)), "gone");
    }
}
