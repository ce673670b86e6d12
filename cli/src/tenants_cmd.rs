//! `routerctl tenants list | usage | add-key`: the applied policy's tenants,
//! their spend as the proxies' shared store counts it, and the old spelling
//! of `tenants keys create` (`keys_cmd`).

use std::process::ExitCode;

use router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::admin_cmd::{explain_status, fail, print_value, when_given, Admin};
use crate::error::CliError;
use crate::policy_cmd::Output;

/// A new tenant key: `rt_` and 32 random bytes, base64url.
pub(crate) fn mint_tenant_key() -> Result<String, CliError> {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| CliError::Random)?;
    Ok(format!(
        "rt_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// `routerctl tenants add-key NAME`: the old spelling of `tenants keys
/// create NAME` (the key is stored beside the policy, which is left as
/// written).
pub async fn tenant_add_key(admin: &mut Admin, tenant: &str) -> ExitCode {
    crate::keys_cmd::create(admin, tenant, "", None, Output::Table).await
}

/// `routerctl tenants list`: the applied policy's tenants and their
/// limits (keys as counts: those the policy lists and those stored).
pub async fn tenants_list(admin: &mut Admin, output: Output) -> ExitCode {
    let current = match admin.get_policy(pb::GetPolicyRequest { version: 0 }).await {
        Ok(r) => r.into_inner(),
        Err(s) => return fail(explain_status(&s)),
    };
    let doc = match router_policy::document::PolicyDocument::parse(&current.document) {
        Ok(d) => d,
        Err(e) => return fail(format!("the applied policy does not parse: {e}")),
    };
    // Keys in the control plane's store count beside the policy's own (a
    // control plane from before stored keys has none to list).
    let stored = admin
        .list_keys(pb::ListKeysRequest::default())
        .await
        .map(|r| r.into_inner().keys)
        .unwrap_or_default();
    let rows: Vec<Value> = doc
        .spec
        .tenants
        .iter()
        .map(|t| {
            let l = t.limits.clone().unwrap_or_default();
            json!({
                "name": t.name,
                "keys": t.keys.len() + stored.iter().filter(|k| k.tenant == t.name).count(),
                "anonymous": t.anonymous,
                "routes": t.routes,
                "max_risk": t.max_risk.map(|r| r.as_str()),
                "requests_per_minute": l.requests_per_minute,
                "concurrent_requests": l.concurrent_requests,
                "budget_usd_per_day": l.budget_usd_per_day,
                "budget_usd_per_month": l.budget_usd_per_month,
            })
        })
        .collect();
    match output {
        Output::Table => {
            if rows.is_empty() {
                println!(
                    "no tenants: policy version {} lets anyone call",
                    current.version
                );
                return ExitCode::SUCCESS;
            }
            println!(
                "{:<20} {:>4} {:<12} {:<10} {:>8} {:>6} {:>12} {:>12}",
                "TENANT", "KEYS", "ROUTES", "MAX RISK", "RPM", "CONC", "USD/DAY", "USD/MONTH"
            );
            let show = |v: &Value| match v {
                Value::Null => "-".to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            for r in &rows {
                let routes = match r["routes"].as_array() {
                    Some(a) if !a.is_empty() => a
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(","),
                    _ => "all".into(),
                };
                let name = if r["anonymous"] == true {
                    format!("{} (anonymous)", show(&r["name"]))
                } else {
                    show(&r["name"])
                };
                println!(
                    "{:<20} {:>4} {:<12} {:<10} {:>8} {:>6} {:>12} {:>12}",
                    name,
                    show(&r["keys"]),
                    routes,
                    if r["max_risk"].is_null() {
                        "any".into()
                    } else {
                        show(&r["max_risk"])
                    },
                    show(&r["requests_per_minute"]),
                    show(&r["concurrent_requests"]),
                    show(&r["budget_usd_per_day"]),
                    show(&r["budget_usd_per_month"]),
                );
            }
        }
        _ => print_value(&Value::Array(rows), output),
    }
    ExitCode::SUCCESS
}

/// `routerctl tenants usage NAME`: the tenant's spend today and this
/// month and its reservations in flight, as the proxies' shared store
/// counts them (the control plane reads it), beside its budgets.
pub async fn tenant_usage(admin: &mut Admin, tenant: &str, output: Output) -> ExitCode {
    let usage = match admin
        .tenant_usage(pb::TenantUsageRequest {
            tenant: tenant.to_string(),
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return fail(explain_status(&s)),
    };
    let limits = match admin.get_policy(pb::GetPolicyRequest { version: 0 }).await {
        Ok(r) => router_policy::document::PolicyDocument::parse(&r.into_inner().document)
            .ok()
            .and_then(|d| d.spec.tenants.into_iter().find(|t| t.name == tenant))
            .and_then(|t| t.limits),
        Err(s) => return fail(explain_status(&s)),
    };
    let usd = |micros: i64| micros as f64 / 1e6;
    let since = when_given(usage.store_since_unix_ms);
    let lost_since = when_given(usage.store_lost_since_unix_ms);
    let v = json!({
        "tenant": tenant,
        "day": usage.day,
        "month": usage.month,
        "spent_today_usd": usd(usage.spent_today_micros),
        "spent_month_usd": usd(usage.spent_month_micros),
        "reserved_usd": usd(usage.reserved_micros),
        "budget_usd_per_day": limits.as_ref().and_then(|l| l.budget_usd_per_day),
        "budget_usd_per_month": limits.as_ref().and_then(|l| l.budget_usd_per_month),
        "store_data_since": since,
        "store_reset_seen": usage.store_reset_seen,
        "store_lost_data_since": lost_since,
    });
    match output {
        Output::Table => {
            let of = |b: &Value| match b.as_f64() {
                Some(b) => format!(" of ${b:.6}"),
                None => " (no budget)".into(),
            };
            println!("tenant {tenant:?}");
            println!(
                "  today ({}):      ${:.6}{}",
                usage.day,
                usd(usage.spent_today_micros),
                of(&v["budget_usd_per_day"])
            );
            println!(
                "  this month ({}):  ${:.6}{}",
                usage.month,
                usd(usage.spent_month_micros),
                of(&v["budget_usd_per_month"])
            );
            println!(
                "  reserved by calls in flight: ${:.6}",
                usd(usage.reserved_micros)
            );
            // The shared store's epoch (router_policy::store_epoch).
            match (&since, usage.store_reset_seen) {
                (None, _) => println!(
                    "  store data since: unknown (no epoch marker yet: no proxy has checked the shared store since it started or lost its data)"
                ),
                (Some(since), false) => println!("  store data since: {since}"),
                (Some(since), true) => println!(
                    "  store data since: {since}; a reset was seen: the store lost its data, spend since {} is gone",
                    lost_since.as_deref().unwrap_or("an unknown time")
                ),
            }
        }
        _ => print_value(&v, output),
    }
    ExitCode::SUCCESS
}
