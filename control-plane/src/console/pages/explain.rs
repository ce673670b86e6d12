//! `/explain`: a form (path, risk, model, tenant) and the decision the
//! fleet would take now, with its reasons: the situation goes through
//! [`crate::hub::Hub::explain`], what the gRPC `Admin` service's `Explain` calls
//! (`routerctl route explain`), against the current policy. The page adds
//! what the control plane knows of the fleet now: a pool every endpoint
//! of which is drained or has its circuit forced open is given as
//! unhealthy in the situation (and the page says so); and, for a tenant,
//! whether the current policy lets it use the route at that risk
//! ([`router_policy::tenant::Tenant::admits`], the proxy's check).
//! A GET form: nothing changes, any role may ask.

use std::collections::BTreeMap;

use askama::Template;
use http::StatusCode;
use router_policy::document::Risk;
use router_policy::{Endpoint, Policy};
use serde_json::{json, Value};

use super::super::session::Session;
use super::super::{Answer, Console, Form};
use super::{error_page, render, Layout};
use crate::hub::{now_ms, HubError};
use crate::store::State;

/// The form's values.
#[derive(Default)]
pub(super) struct Asked {
    path: String,
    risk: String,
    model: String,
    tenant: String,
}

/// A pool passed over.
pub(super) struct SkippedRow {
    pool: String,
    why: String,
}

/// The decision, as the page shows it.
pub(super) struct Decision {
    route: String,
    pool: String,
    model: String,
    provider: String,
    requires_approval: bool,
    reason: String,
    candidates: Vec<String>,
    skipped: Vec<SkippedRow>,
    refusal: String,
    on_all_down: String,
    /// The answer as `routerctl route explain -o json` prints it.
    json: String,
}

/// One error of the situation, with its field.
pub(super) struct FieldRow {
    field: String,
    reason: String,
}

#[derive(Template)]
#[template(path = "explain.html")]
struct ExplainPage {
    layout: Layout,
    asked: Asked,
    risks: Vec<&'static str>,
    default_risk: &'static str,
    routes: Vec<String>,
    tenants: Vec<String>,
    /// What the fleet's marks made of the pools (`pool: why unhealthy`).
    fleet: Vec<String>,
    decision: Option<Decision>,
    /// The tenant's admission, when one was asked for.
    tenant_verdict: String,
    tenant_admitted: bool,
    errors: Vec<FieldRow>,
    problem: String,
}

/// Pools the control plane knows cannot take a request now, and why: the
/// policy drains the pool, every endpoint is drained, or each endpoint
/// left has its circuit forced open (a pool-wide override or its own).
fn unhealthy_pools(policy: &Policy, state: &State, now: i64) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for pool in &policy.pools {
        let (endpoints, drained): (Vec<String>, Vec<String>) = match state.backends.get(&pool.name)
        {
            Some(set) => (set.endpoints.clone(), set.drained.clone()),
            None => (
                pool.endpoints.iter().map(ToString::to_string).collect(),
                pool.drained.iter().map(ToString::to_string).collect(),
            ),
        };
        if pool.drain {
            out.insert(pool.name.clone(), "the policy drains the pool".into());
            continue;
        }
        let usable: Vec<&String> = endpoints
            .iter()
            .filter(|e| !drained.iter().any(|d| Endpoint::same_address(d, e)))
            .collect();
        if usable.is_empty() {
            let why = if endpoints.is_empty() {
                "it has no endpoint"
            } else {
                "every endpoint is drained"
            };
            out.insert(pool.name.clone(), why.into());
            continue;
        }
        let open = |e: &str| {
            state.circuits.iter().any(|c| {
                c.pool == pool.name
                    && c.open
                    && c.suspect.is_empty()
                    && c.until_unix_ms > now
                    && (c.endpoint.is_empty() || Endpoint::same_address(&c.endpoint, e))
            })
        };
        if usable.iter().all(|e| open(e)) {
            let by: Vec<&str> = state
                .circuits
                .iter()
                .filter(|c| {
                    c.pool == pool.name && c.open && c.suspect.is_empty() && c.until_unix_ms > now
                })
                .map(|c| c.source.as_str())
                .collect();
            out.insert(
                pool.name.clone(),
                format!("its circuit is forced open (by {})", by.join(", ")),
            );
        }
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

fn decision_of(v: &Value) -> Decision {
    Decision {
        route: text(&v["route"]),
        pool: text(&v["pool"]),
        model: text(&v["model"]),
        provider: text(&v["provider"]),
        requires_approval: v["requires_approval"].as_bool().unwrap_or(false),
        reason: text(&v["reason"]),
        candidates: v["candidates"]
            .as_array()
            .map(|a| a.iter().map(text).collect())
            .unwrap_or_default(),
        skipped: v["skipped"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| SkippedRow {
                        pool: text(&s["pool"]),
                        why: text(&s["why"]),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        refusal: text(&v["refusal"]),
        on_all_down: text(&v["on_all_down"]["why"]),
        json: serde_json::to_string_pretty(v).unwrap_or_default(),
    }
}

/// `GET /explain[?path=&risk=&model=&tenant=]`.
pub(in crate::console) async fn get(console: &Console, s: &Session, query: Option<&str>) -> Answer {
    let Some(hub) = console.hub.upgrade() else {
        return error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "the control plane is shutting down",
        );
    };
    let q: Form = query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let field = |name: &str| {
        q.get(name)
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let asked = Asked {
        path: field("path"),
        risk: field("risk"),
        model: field("model"),
        tenant: field("tenant"),
    };
    let policy = hub.current_policy();
    let mut page = ExplainPage {
        layout: Layout::new("Explain", "explain", s, false),
        risks: vec!["READ", "DRAFT", "SEND", "DESTRUCTIVE"],
        default_risk: policy.as_ref().map_or("", |p| p.default_risk.as_str()),
        routes: policy
            .as_ref()
            .map(|p| p.routes.iter().map(|r| r.name.clone()).collect())
            .unwrap_or_default(),
        tenants: hub.tenant_names(),
        fleet: Vec::new(),
        decision: None,
        tenant_verdict: String::new(),
        tenant_admitted: false,
        errors: Vec::new(),
        problem: String::new(),
        asked,
    };
    if q.is_empty() {
        return render(StatusCode::OK, &page);
    }
    let Some(policy) = policy else {
        page.problem = "no policy applied yet".into();
        return render(StatusCode::NOT_FOUND, &page);
    };
    let risk = if page.asked.risk.is_empty() {
        None
    } else {
        match Risk::parse(&page.asked.risk) {
            Some(r) => Some(r),
            None => {
                page.errors.push(FieldRow {
                    field: "risk".into(),
                    reason: "READ, DRAFT, SEND or DESTRUCTIVE".into(),
                });
                return render(StatusCode::UNPROCESSABLE_ENTITY, &page);
            }
        }
    };
    let unhealthy = unhealthy_pools(&policy, &hub.state(), now_ms());
    page.fleet = unhealthy
        .iter()
        .map(|(pool, why)| format!("{pool}: {why}"))
        .collect();
    let mut situation = serde_json::Map::new();
    if let Some(r) = risk {
        situation.insert("risk".into(), json!(r.as_str()));
    }
    if !page.asked.model.is_empty() {
        situation.insert("model".into(), json!(page.asked.model));
    }
    if !page.asked.path.is_empty() {
        situation.insert("path".into(), json!(page.asked.path));
    }
    if !unhealthy.is_empty() {
        let pools: serde_json::Map<String, Value> = unhealthy
            .keys()
            .map(|p| (p.clone(), json!({"healthy": false})))
            .collect();
        situation.insert("pools".into(), Value::Object(pools));
    }
    let answer = match hub.explain(&Value::Object(situation).to_string()) {
        Ok(a) => a,
        Err(HubError::Invalid(errors)) => {
            page.errors = errors
                .into_iter()
                .map(|e| FieldRow {
                    field: e.field,
                    reason: e.reason,
                })
                .collect();
            return render(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
        Err(e) => {
            page.problem = e.to_string();
            return render(StatusCode::SERVICE_UNAVAILABLE, &page);
        }
    };
    let value: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
    let decision = decision_of(&value);
    if !page.asked.tenant.is_empty() {
        let risk = risk.unwrap_or(policy.default_risk);
        match policy
            .tenants
            .as_ref()
            .map(|t| t.by_name(&page.asked.tenant))
        {
            None => {
                page.tenant_verdict = "the current policy has no tenants".into();
            }
            Some(Err(_)) => {
                page.tenant_verdict = hub
                    .check_tenant(&page.asked.tenant)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
            }
            Some(Ok(t)) if decision.route.is_empty() => {
                page.tenant_verdict = format!("{} is a tenant, but no route matches", t.name);
            }
            Some(Ok(t)) => match t.admits(&decision.route, risk) {
                Ok(()) => {
                    page.tenant_admitted = true;
                    page.tenant_verdict = format!(
                        "{} may send a {} request on route {} (its rate limits and budgets are checked when the request comes)",
                        t.name,
                        risk.as_str(),
                        decision.route
                    );
                }
                Err(e) => page.tenant_verdict = format!("refused: {e}"),
            },
        }
    }
    page.decision = Some(decision);
    render(StatusCode::OK, &page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BackendSet, CircuitRecord};

    #[test]
    fn a_pool_drained_or_forced_open_everywhere_is_unhealthy_now() {
        let policy = router_policy::document::load_with(
            "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: a, endpoints: [\"127.0.0.1:9001\", \"127.0.0.1:9002\"]}\n    - {name: b, endpoints: [\"127.0.0.1:9003\"]}\n    - {name: c, endpoints: [\"127.0.0.1:9004\"]}\n  routes: [{name: r, chain: [a, b, c]}]\n",
            &router_policy::QueueSettings::default(),
            &router_policy::Guards::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let now = now_ms();
        let mut state = State::default();
        state.backends.insert(
            "a".into(),
            BackendSet {
                endpoints: vec!["127.0.0.1:9001".into(), "127.0.0.1:9002".into()],
                drained: vec!["127.0.0.1:9001".into()],
            },
        );
        let open = |pool: &str, endpoint: &str, suspect: &str| CircuitRecord {
            pool: pool.into(),
            endpoint: endpoint.into(),
            open: true,
            until_unix_ms: now + 60_000,
            source: "operator".into(),
            suspect: suspect.into(),
        };
        // a: one endpoint drained, the other forced open; b: a suspicion
        // only (still healthy); c: nothing.
        state.circuits = vec![
            open("a", "http://127.0.0.1:9002", ""),
            open("b", "127.0.0.1:9003", "check"),
        ];
        let u = unhealthy_pools(&policy, &state, now);
        assert_eq!(u.len(), 1, "{u:?}");
        assert_eq!(u["a"], "its circuit is forced open (by operator)");
        state
            .backends
            .get_mut("a")
            .unwrap_or_else(|| panic!("a"))
            .drained = vec!["127.0.0.1:9001".into(), "127.0.0.1:9002".into()];
        state.circuits = vec![open("c", "", "")];
        let u = unhealthy_pools(&policy, &state, now);
        assert_eq!(u["a"], "every endpoint is drained");
        assert_eq!(u["c"], "its circuit is forced open (by operator)");
        assert!(!u.contains_key("b"));
    }
}
