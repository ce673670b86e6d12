//! `routerctl backends list | set | drain`: pools' backend sets.

use std::process::ExitCode;

use router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::admin_cmd::{explain_status, fail, print_value, Admin};
use crate::policy_cmd::Output;

/// `backends list`.
pub async fn backends_list(admin: &mut Admin, output: Output) -> ExitCode {
    let listed = match admin
        .list_backends(pb::ListBackendsRequest { quota: true })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return fail(explain_status(&s)),
    };
    let mut pools = listed.pools;
    // What the proxies said is left of each key's quota.
    let quota_of = |pool: &str, endpoint: &str| -> Option<&pb::EndpointQuota> {
        listed.quota.iter().find(|q| {
            q.pool == pool && router_policy::Endpoint::same_address(&q.endpoint, endpoint)
        })
    };
    // Pools without a backend set serve the endpoints their policy lists:
    // listed too, after the sets (a policy that does not parse lists none).
    let policy = match admin.get_policy(pb::GetPolicyRequest { version: 0 }).await {
        Ok(r) => router_policy::document::PolicyDocument::parse(&r.into_inner().document).ok(),
        Err(s) => return fail(explain_status(&s)),
    };
    let sets = pools.len();
    let specs = policy.map(|d| d.spec.pools).unwrap_or_default();
    // A pool with several keys serves each address once per key, named by
    // the key's variable (`url#KEY_VARIABLE`), as its proxies do.
    let keyed = |pool: &str, addrs: &[String]| -> Vec<String> {
        let keys = specs
            .iter()
            .find(|p| p.name == pool)
            .and_then(|p| p.api_keys_env.clone())
            .unwrap_or_default();
        if keys.is_empty() {
            return addrs.to_vec();
        }
        addrs
            .iter()
            .flat_map(|a| match router_policy::Endpoint::parse(a) {
                Ok(e) if e.key().is_none() => keys
                    .iter()
                    .map(|k| e.with_key(Some(k)).to_string())
                    .collect(),
                _ => vec![a.clone()],
            })
            .collect()
    };
    for p in &specs {
        if pools.iter().any(|b| b.pool == p.name) {
            continue;
        }
        let endpoints: Vec<String> = p.endpoints.iter().map(|e| e.url().to_string()).collect();
        let drained = endpoints
            .iter()
            .zip(&p.endpoints)
            .filter(|(_, e)| p.drain || e.drain())
            .map(|(u, _)| u.clone())
            .collect();
        pools.push(pb::PoolBackends {
            pool: p.name.clone(),
            endpoints,
            drained,
        });
    }
    for p in &mut pools {
        p.endpoints = keyed(&p.pool, &p.endpoints);
        p.drained = keyed(&p.pool, &p.drained);
    }
    let source = |i: usize| if i < sets { "backends set" } else { "policy" };
    // The fleet's marks on each endpoint: open circuits and suspicions
    // (router_policy::health), with the proxy that raised them.
    let circuits = match admin.list_circuits(pb::ListCircuitsRequest {}).await {
        Ok(r) => r.into_inner().circuits,
        Err(s) => return fail(explain_status(&s)),
    };
    let marks = |pool: &str, endpoint: &str| -> Vec<String> {
        circuits
            .iter()
            .filter(|c| {
                c.pool == pool
                    && (c.endpoint.is_empty()
                        || router_policy::Endpoint::same_address(&c.endpoint, endpoint))
            })
            .map(|c| match (c.suspect.as_str(), c.open) {
                ("", true) => format!("circuit open ({})", c.source),
                ("", false) => format!("circuit forced closed ({})", c.source),
                (cause, _) => format!("suspect: {cause} ({})", c.source),
            })
            .collect()
    };
    match output {
        Output::Table => {
            println!(
                "{:<20} {:<40} {:<9} {:<13} {:<40} QUOTA",
                "POOL", "ENDPOINT", "STATE", "FROM", "FLEET"
            );
            for (i, p) in pools.iter().enumerate() {
                for e in &p.endpoints {
                    let state = if p.drained.contains(e) {
                        "draining"
                    } else {
                        "active"
                    };
                    let m = marks(&p.pool, e);
                    let fleet = if m.is_empty() {
                        "-".to_string()
                    } else {
                        m.join(", ")
                    };
                    let quota = quota_of(&p.pool, e).map_or_else(|| "-".to_string(), quota_text);
                    println!(
                        "{:<20} {:<40} {state:<9} {:<13} {fleet:<40} {quota}",
                        p.pool,
                        e,
                        source(i)
                    );
                }
            }
        }
        _ => print_value(
            &Value::Array(
                pools
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let marks: serde_json::Map<String, Value> = p
                            .endpoints
                            .iter()
                            .map(|e| (e.clone(), json!(marks(&p.pool, e))))
                            .collect();
                        let quota: serde_json::Map<String, Value> = p
                            .endpoints
                            .iter()
                            .filter_map(|e| Some((e.clone(), quota_json(quota_of(&p.pool, e)?))))
                            .collect();
                        json!({"pool": p.pool, "endpoints": p.endpoints, "drained": p.drained, "fleet": marks, "source": source(i), "quota": quota})
                    })
                    .collect(),
            ),
            output,
        ),
    }
    ExitCode::SUCCESS
}

/// A quota cell: `40 requests, 9000 tokens left (edge-2)`, and
/// `resting: requests (2 proxies)` when proxies rest the key.
fn quota_text(q: &pb::EndpointQuota) -> String {
    let mut left = Vec::new();
    if let Some(n) = q.requests_remaining {
        left.push(format!("{n} requests"));
    }
    if let Some(n) = q.tokens_remaining {
        left.push(format!("{n} tokens"));
    }
    let mut text = String::new();
    if !left.is_empty() {
        let node = if q.requests_node.is_empty() {
            &q.tokens_node
        } else {
            &q.requests_node
        };
        text = format!("{} left ({node})", left.join(", "));
        if let Some(s) = q.requests_reset_s {
            text.push_str(&format!(", resets in {s:.0} s"));
        }
    }
    if q.resting > 0 {
        if !text.is_empty() {
            text.push_str("; ");
        }
        let proxies = if q.resting == 1 { "proxy" } else { "proxies" };
        text.push_str(&format!(
            "resting: {} ({} {proxies})",
            q.resting_why, q.resting
        ));
    }
    text
}

fn quota_json(q: &pb::EndpointQuota) -> Value {
    json!({
        "requests_remaining": q.requests_remaining,
        "requests_node": q.requests_node,
        "tokens_remaining": q.tokens_remaining,
        "tokens_node": q.tokens_node,
        "requests_reset_s": q.requests_reset_s,
        "resting": q.resting,
        "resting_why": q.resting_why,
    })
}

/// `backends set POOL ADDR...`.
pub async fn backends_set(admin: &mut Admin, pool: &str, endpoints: Vec<String>) -> ExitCode {
    match admin
        .set_backends(pb::SetBackendsRequest {
            pool: pool.to_string(),
            endpoints,
            drained: Vec::new(),
        })
        .await
    {
        Ok(r) => {
            println!(
                "backends of {pool} set (revision {})",
                r.into_inner().revision
            );
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}

/// `backends drain POOL ADDR`.
pub async fn backends_drain(admin: &mut Admin, pool: &str, addr: &str) -> ExitCode {
    let pools = match admin
        .list_backends(pb::ListBackendsRequest::default())
        .await
    {
        Ok(r) => r.into_inner().pools,
        Err(s) => return fail(explain_status(&s)),
    };
    let Some(current) = pools.into_iter().find(|p| p.pool == pool) else {
        return fail(format!(
            "no backend set for pool {pool} (routerctl backends set {pool} ...)"
        ));
    };
    // Compared as endpoints: health and metrics show `http://host:port`
    // for a backend set as `host:port`.
    let Some(addr) = current
        .endpoints
        .iter()
        .find(|e| router_policy::Endpoint::same_address(e, addr))
        .cloned()
    else {
        return fail(format!(
            "{addr} is not a backend of {pool} (its backends: {})",
            current.endpoints.join(", ")
        ));
    };
    let mut drained = current.drained;
    if !drained.contains(&addr) {
        drained.push(addr.clone());
    }
    match admin
        .set_backends(pb::SetBackendsRequest {
            pool: pool.to_string(),
            endpoints: current.endpoints,
            drained,
        })
        .await
    {
        Ok(r) => {
            println!(
                "{addr} of {pool} draining (revision {})",
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

    /// The QUOTA cell: what is left and who says so, the reset, and the
    /// proxies resting the key; nothing said, nothing shown.
    #[test]
    fn a_quota_cell_says_what_is_left_who_says_so_and_who_rests_the_key() {
        let q = pb::EndpointQuota {
            pool: "cloud".into(),
            endpoint: "http://h:1#A_KEY".into(),
            requests_remaining: Some(0),
            requests_node: "edge-2".into(),
            tokens_remaining: Some(9000),
            tokens_node: "edge-1".into(),
            requests_reset_s: Some(41.6),
            resting: 2,
            resting_why: "requests".into(),
        };
        assert_eq!(
            quota_text(&q),
            "0 requests, 9000 tokens left (edge-2), resets in 42 s; resting: requests (2 proxies)"
        );
        let tokens_only = pb::EndpointQuota {
            tokens_remaining: Some(5),
            tokens_node: "edge-1".into(),
            ..Default::default()
        };
        assert_eq!(quota_text(&tokens_only), "5 tokens left (edge-1)");
        assert_eq!(quota_json(&q)["resting"], 2);
        assert_eq!(quota_json(&tokens_only)["requests_remaining"], Value::Null);
    }
}
