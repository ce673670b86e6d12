//! `spec.tenants`: names, keys the policy lists (hashes), routes, limits
//! and budgets.

use super::*;

/// A budget in USD, as micro-USD: finite and not negative.
fn budget(usd: Option<f64>, field: &str, errs: &mut Errors) -> Option<u64> {
    let usd = usd?;
    if !(usd.is_finite() && usd >= 0.0) {
        errs.push(field, "must be a non-negative number of USD");
        return None;
    }
    Some((usd * 1e6).floor() as u64)
}

/// `spec.tenants`: unique names, key hashes well formed and each given to
/// one tenant, routes that exist, at most one anonymous tenant. `None`
/// when the policy has none (tenancy off).
pub(super) fn tenants(
    specs: &[TenantSpec],
    routes: &[Route],
    errs: &mut Errors,
) -> Option<Tenants> {
    if specs.is_empty() {
        return None;
    }
    let mut names = HashSet::new();
    let mut seen_keys = std::collections::HashMap::new();
    let mut list = Vec::new();
    let mut keys = Vec::new();
    let mut anonymous = None;
    for (i, t) in specs.iter().enumerate() {
        let at = format!("spec.tenants[{i}]");
        if t.name.trim().is_empty() {
            errs.push(format!("{at}.name"), "must not be empty");
        } else if !names.insert(t.name.as_str()) {
            errs.push(
                format!("{at}.name"),
                format!("tenant {:?} appears twice", t.name),
            );
        }
        let mut hashes = Vec::new();
        for (j, k) in t.keys.iter().enumerate() {
            match crate::tenant::parse_key_hash(k) {
                Some(h) => {
                    if let Some(other) = seen_keys.insert(h, i) {
                        errs.push(
                            format!("{at}.keys[{j}]"),
                            format!("the same key is already tenant #{other}'s"),
                        );
                    }
                    hashes.push(h);
                }
                None => errs.push(
                    format!("{at}.keys[{j}]"),
                    "must be sha256:<64 hex digits>, the hash of a key (`routerctl tenants keys create` mints one and keeps its hash in the control plane, outside the policy); a policy never holds keys",
                ),
            }
        }
        for (j, r) in t.routes.iter().enumerate() {
            if !routes.iter().any(|route| route.name == *r) {
                errs.push(format!("{at}.routes[{j}]"), format!("unknown route {r:?}"));
            }
        }
        if t.anonymous {
            if anonymous.is_some() {
                errs.push(
                    format!("{at}.anonymous"),
                    "only one tenant may be anonymous",
                );
            }
            anonymous = Some(i);
        }
        // A tenant without keys in the policy is valid: its keys may live
        // in the control plane's store (`routerctl tenants keys create`).
        let limits = t.limits.clone().unwrap_or_default();
        if limits.tokens_per_minute == Some(0) {
            errs.push(
                format!("{at}.limits.tokens_per_minute"),
                "must be at least 1 (leave it out for no limit)",
            );
        }
        if limits.concurrent_requests == Some(0) {
            errs.push(
                format!("{at}.limits.concurrent_requests"),
                "must be at least 1 (leave it out for no limit)",
            );
        }
        for (field, burst, limit) in [
            (
                "requests_burst",
                limits.requests_burst,
                limits.requests_per_minute,
            ),
            (
                "tokens_burst",
                limits.tokens_burst,
                limits.tokens_per_minute,
            ),
        ] {
            let Some(burst) = burst else { continue };
            let reason = match limit {
                None => Some("only used with its per-minute limit"),
                Some(_) if burst == 0 => Some("must be at least 1"),
                Some(l) if burst > l => Some("must be at most the per-minute limit"),
                Some(_) => None,
            };
            if let Some(reason) = reason {
                errs.push(format!("{at}.limits.{field}"), reason);
            }
        }
        if limits.requests_per_minute == Some(0) {
            errs.push(
                format!("{at}.limits.requests_per_minute"),
                "must be at least 1 (leave it out for no limit)",
            );
        }
        list.push(Tenant {
            name: t.name.clone(),
            routes: t.routes.clone(),
            max_risk: t.max_risk.unwrap_or(Risk::Destructive),
            rate: limits.requests_per_minute.filter(|n| *n > 0).map(|n| {
                let burst = limits
                    .requests_burst
                    .unwrap_or(crate::tenant::default_request_burst(n));
                crate::tenant::Gcra::per_minute_with_burst(n, burst)
            }),
            rate_fail_open: limits.on_store_down != Some(super::super::StoreDown::Closed),
            max_concurrent: limits.concurrent_requests,
            token_rate: limits.tokens_per_minute.filter(|n| *n > 0).map(|n| {
                let burst = limits.tokens_burst.unwrap_or(crate::tenant::burst_of(n));
                crate::tenant::Gcra::per_minute_with_burst(n, burst)
            }),
            budgets: crate::tenant::Budgets {
                per_day: budget(
                    limits.budget_usd_per_day,
                    &format!("{at}.limits.budget_usd_per_day"),
                    errs,
                ),
                per_month: budget(
                    limits.budget_usd_per_month,
                    &format!("{at}.limits.budget_usd_per_month"),
                    errs,
                ),
            },
            budget_fail_open: limits.budget_on_store_down == Some(super::super::StoreDown::Open),
        });
        keys.push(hashes);
    }
    Some(Tenants::new(list, keys, anonymous))
}
