//! `routerctl cache purge --route R [--tenant T]`: drops a route's cached
//! answers (all callers', or one tenant's) in every proxy's own store (a
//! purge mark the proxies apply with the snapshot) and in the shared store
//! (the control plane's `--shared-store`).

use std::process::ExitCode;

use router_proto::v1 as pb;
use serde_json::json;

use crate::admin_cmd::{explain_status, fail, print_value, Admin};
use crate::policy_cmd::Output;

/// `cache purge`.
pub async fn cache_purge(
    admin: &mut Admin,
    route: &str,
    tenant: Option<&str>,
    output: Output,
) -> ExitCode {
    let r = match admin
        .purge_cache(pb::PurgeCacheRequest {
            route: route.to_string(),
            tenant: tenant.unwrap_or_default().to_string(),
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return fail(explain_status(&s)),
    };
    let whose = tenant.map_or_else(
        || "every caller's entries".to_string(),
        |t| format!("tenant {t}'s entries"),
    );
    match output {
        Output::Table => {
            println!(
                "route {route}: {whose} purged on every proxy with revision {}",
                r.revision
            );
            match (r.shared_entries, r.shared_error.is_empty()) {
                (Some(n), _) => println!("shared store: {n} entries dropped"),
                (None, false) => eprintln!(
                    "shared store: not purged ({}); its entries stay until their TTL",
                    r.shared_error
                ),
                (None, true) => println!(
                    "shared store: not purged (the control plane has no --shared-store; proxies that share one keep its entries until their TTL)"
                ),
            }
        }
        _ => print_value(
            &json!({
                "route": route,
                "tenant": tenant,
                "revision": r.revision,
                "prefix": r.prefix,
                "shared_entries": r.shared_entries,
                "shared_error": (!r.shared_error.is_empty()).then_some(&r.shared_error),
            }),
            output,
        ),
    }
    if r.shared_error.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
