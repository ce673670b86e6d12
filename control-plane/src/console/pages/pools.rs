//! `/pools`: each pool of the current policy and each of its endpoints as
//! the control plane knows them: where the endpoints come from (a backend
//! set or the policy), drain, the fleet's circuit overrides (operators'
//! and those proxies report, with who raised them and for how long), the
//! suspicions proxies raised (a failed health check, a failed first
//! request), the pool's health-check and outlier-ejection settings. What
//! `routerctl backends list` and `routerctl circuits list` show.
//!
//! Operators drain, undrain, open and close from here, each after a
//! confirmation page (`/pools/confirm`, a form that POSTs to
//! `/pools/act`); the changes go through [`Hub::set_backends`] and
//! [`Hub::set_circuit`], what the gRPC `Admin` service's `SetBackends`
//! and `SetCircuit` call (`routerctl backends drain`, `circuits open`,
//! `circuits close`).
//!
//! Proxies report circuit transitions and suspicions to the control plane,
//! not their load: in-flight requests, queue depth, latency EWMA and p95,
//! and outlier ejections are each proxy's own (its `/metrics` and health
//! endpoint), so this page does not show them.

use askama::Template;
use http::StatusCode;
use router_policy::{Endpoint, Policy};

use super::super::session::Session;
use super::super::{redirect, Answer, Console, Form};
use super::{error_page, left, render, span, Layout};
use crate::hub::{now_ms, Hub, HubError};
use crate::store::{CircuitRecord, State};

/// How long an operator's forced-open circuit lasts, as offered.
const OPEN_FOR: [(u64, &str); 4] = [
    (60, "1 minute"),
    (300, "5 minutes"),
    (900, "15 minutes"),
    (3600, "1 hour"),
];

/// A mark of the fleet on a pool or endpoint: a circuit override or a
/// suspicion.
pub(super) struct MarkRow {
    /// `open`, `forced closed`, `suspect: check`, `suspect: attempt`.
    what: String,
    /// `operator`, or the node id of the proxy that raised it.
    by: String,
    /// Time left before it lapses.
    left: String,
}

impl MarkRow {
    fn of(c: &CircuitRecord, now: i64) -> Self {
        Self {
            what: match (c.suspect.as_str(), c.open) {
                ("", true) => "open".into(),
                ("", false) => "forced closed".into(),
                (cause, _) => format!("suspect: {cause}"),
            },
            by: c.source.clone(),
            left: left(c.until_unix_ms, now),
        }
    }
}

/// One endpoint's row.
pub(super) struct EndpointRow {
    address: String,
    draining: bool,
    /// `closed`, `open` or `forced closed` (the fleet's override; each
    /// proxy also keeps its own breaker).
    circuit: &'static str,
    circuits: Vec<MarkRow>,
    suspicions: Vec<MarkRow>,
    /// What the health checks say, as the fleet heard it.
    health: String,
}

/// One pool.
pub(super) struct PoolRow {
    name: String,
    provider: &'static str,
    model: String,
    /// `backend set` or `policy`.
    from: &'static str,
    /// The policy drains the whole pool.
    drained: bool,
    health_check: String,
    ejection: String,
    /// Marks on the whole pool (no endpoint).
    marks: Vec<MarkRow>,
    endpoints: Vec<EndpointRow>,
}

#[derive(Template)]
#[template(path = "pools.html")]
struct PoolsPage {
    layout: Layout,
    pools: Vec<PoolRow>,
    revision: u64,
    may_act: bool,
}

#[derive(Template)]
#[template(path = "pool_confirm.html")]
struct ConfirmPage {
    layout: Layout,
    action: &'static str,
    pool: String,
    endpoint: String,
    /// What the change does, in a sentence.
    what: String,
    /// The button's words.
    button: String,
    /// Offered durations for `open`.
    open_for: Vec<(u64, &'static str)>,
}

/// A pool's endpoints and those drained: its backend set's, else its
/// policy's.
fn endpoints_of(state: &State, pool: &router_policy::Pool) -> (Vec<String>, Vec<String>, bool) {
    match state.backends.get(&pool.name) {
        Some(set) => (set.endpoints.clone(), set.drained.clone(), true),
        None => (
            pool.endpoints.iter().map(ToString::to_string).collect(),
            pool.drained.iter().map(ToString::to_string).collect(),
            false,
        ),
    }
}

fn health_check_text(pool: &router_policy::Pool) -> String {
    match &pool.health_check {
        None => "off".into(),
        Some(h) => format!(
            "GET {} every {}, timeout {}; unhealthy after {} failures, healthy after {} passes",
            h.path,
            span(duration_ms(h.interval)),
            span(duration_ms(h.timeout)),
            h.unhealthy_after,
            h.healthy_after
        ),
    }
}

fn ejection_text(pool: &router_policy::Pool) -> String {
    match &pool.outlier_ejection {
        None => "off".into(),
        Some(o) => format!(
            "over {}: at least {} requests and {:.0}% errors, {}× the pool's rate; ejected {} at first, at most {}% of the pool (each proxy on its own)",
            span(duration_ms(o.window)),
            o.min_requests,
            o.min_error_rate * 100.0,
            o.ratio,
            span(duration_ms(o.ejection)),
            o.max_ejection_percent
        ),
    }
}

fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn rows(policy: &Policy, state: &State) -> Vec<PoolRow> {
    let now = now_ms();
    let live: Vec<&CircuitRecord> = state
        .circuits
        .iter()
        .filter(|c| c.until_unix_ms > now)
        .collect();
    policy
        .pools
        .iter()
        .map(|pool| {
            let (endpoints, drained, from_set) = endpoints_of(state, pool);
            let on_pool: Vec<&CircuitRecord> = live
                .iter()
                .copied()
                .filter(|c| c.pool == pool.name)
                .collect();
            let endpoints = endpoints
                .iter()
                .map(|e| {
                    let mine: Vec<&CircuitRecord> = on_pool
                        .iter()
                        .copied()
                        .filter(|c| c.endpoint.is_empty() || Endpoint::same_address(&c.endpoint, e))
                        .collect();
                    let circuits: Vec<&CircuitRecord> = mine
                        .iter()
                        .copied()
                        .filter(|c| c.suspect.is_empty())
                        .collect();
                    let circuit = if circuits.iter().any(|c| c.open) {
                        "open"
                    } else if circuits.is_empty() {
                        "closed"
                    } else {
                        "forced closed"
                    };
                    let failing: Vec<&str> = mine
                        .iter()
                        .filter(|c| c.suspect == "check")
                        .map(|c| c.source.as_str())
                        .collect();
                    let health = match (&pool.health_check, failing.is_empty()) {
                        (None, _) => "not checked".to_string(),
                        (Some(_), true) => "no failure reported".to_string(),
                        (Some(_), false) => format!("failing (reported by {})", failing.join(", ")),
                    };
                    EndpointRow {
                        draining: drained.iter().any(|d| Endpoint::same_address(d, e)),
                        circuit,
                        circuits: circuits.iter().map(|c| MarkRow::of(c, now)).collect(),
                        suspicions: mine
                            .iter()
                            .filter(|c| !c.suspect.is_empty())
                            .map(|c| MarkRow::of(c, now))
                            .collect(),
                        health,
                        address: e.clone(),
                    }
                })
                .collect();
            PoolRow {
                name: pool.name.clone(),
                provider: pool.provider.as_str(),
                model: pool.model.clone().unwrap_or_default(),
                from: if from_set { "backend set" } else { "policy" },
                drained: pool.drain,
                health_check: health_check_text(pool),
                ejection: ejection_text(pool),
                marks: on_pool
                    .iter()
                    .filter(|c| c.endpoint.is_empty())
                    .map(|c| MarkRow::of(c, now))
                    .collect(),
                endpoints,
            }
        })
        .collect()
}

fn shutting_down() -> Answer {
    error_page(
        StatusCode::SERVICE_UNAVAILABLE,
        "the control plane is shutting down",
    )
}

/// `GET /pools`.
pub(in crate::console) async fn get(console: &Console, s: &Session) -> Answer {
    let Some(hub) = console.hub.upgrade() else {
        return shutting_down();
    };
    let state = hub.state();
    let pools = hub
        .current_policy()
        .map(|p| rows(&p, &state))
        .unwrap_or_default();
    render(
        StatusCode::OK,
        &PoolsPage {
            layout: Layout::new("Pools", "pools", s, true),
            pools,
            revision: state.revision,
            may_act: s.role.may_operate(),
        },
    )
}

fn refuse(s: &Session, action: &str) -> Answer {
    tracing::warn!(who = %s.who(), action, "console: a pool change refused to a non-operator");
    error_page(
        StatusCode::FORBIDDEN,
        "only an operator may drain, undrain, open or close: sign in with an operator token",
    )
}

/// An action of the page, as a form names it.
fn action_of(name: &str) -> Option<&'static str> {
    ["drain", "undrain", "open", "close"]
        .into_iter()
        .find(|a| *a == name)
}

/// `GET /pools/confirm?action=A&pool=P&endpoint=E`: what the change does,
/// and the form that makes it.
pub(in crate::console) async fn confirm(
    console: &Console,
    s: &Session,
    query: Option<&str>,
) -> Answer {
    let q: Form = query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let Some(action) = q.get("action").and_then(|a| action_of(a)) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "action: drain, undrain, open or close",
        );
    };
    if !s.role.may_operate() {
        return refuse(s, action);
    }
    let Some(hub) = console.hub.upgrade() else {
        return shutting_down();
    };
    let pool = q.get("pool").cloned().unwrap_or_default();
    let endpoint = q.get("endpoint").cloned().unwrap_or_default();
    let Some(policy) = hub.current_policy() else {
        return error_page(StatusCode::NOT_FOUND, "no policy applied yet");
    };
    if policy.pool(&pool).is_none() {
        return error_page(
            StatusCode::NOT_FOUND,
            &format!("the current policy has no pool {pool:?}"),
        );
    }
    let from_set = hub.state().backends.contains_key(&pool);
    let target = if endpoint.is_empty() {
        format!("every endpoint of pool {pool}")
    } else {
        format!("{endpoint} of pool {pool}")
    };
    let (what, button) = match action {
        "drain" if endpoint.is_empty() => {
            return error_page(StatusCode::BAD_REQUEST, "endpoint: the endpoint to drain")
        }
        "undrain" if endpoint.is_empty() => {
            return error_page(StatusCode::BAD_REQUEST, "endpoint: the endpoint to undrain")
        }
        "drain" => (
            format!(
                "Drain {target}: every proxy stops sending it new requests; those in flight finish.{}",
                if from_set {
                    ""
                } else {
                    " The pool has no backend set yet: this makes one from the policy's endpoints (as routerctl backends set would), which then stands for the pool's endpoints until it is set again."
                }
            ),
            format!("Drain {endpoint}"),
        ),
        "undrain" => (
            format!(
                "Undrain {target}: every proxy sends it new requests again.{}",
                if from_set {
                    ""
                } else {
                    " The pool has no backend set yet: this makes one from the policy's endpoints."
                }
            ),
            format!("Undrain {endpoint}"),
        ),
        "open" => (
            format!("Force the circuit of {target} open: no proxy sends it requests until the time below runs out or an operator closes it."),
            "Open the circuit".to_string(),
        ),
        _ => (
            format!("Close the circuit of {target}: clears the fleet's overrides and suspicions there (operators' and proxies'), so that proxies send it requests again."),
            "Close the circuit".to_string(),
        ),
    };
    render(
        StatusCode::OK,
        &ConfirmPage {
            layout: Layout::new("Confirm", "pools", s, false),
            action,
            pool,
            endpoint,
            what,
            button,
            open_for: OPEN_FOR.to_vec(),
        },
    )
}

/// A pool's backend set with `endpoint` drained (`drain`) or not: its
/// current set, else the policy's endpoints.
fn with_drain(
    hub: &Hub,
    pool: &str,
    endpoint: &str,
    drain: bool,
) -> Result<(Vec<String>, Vec<String>), String> {
    let policy = hub.current_policy().ok_or("no policy applied yet")?;
    let p = policy
        .pool(pool)
        .ok_or_else(|| format!("the current policy has no pool {pool:?}"))?;
    let (endpoints, mut drained, _) = endpoints_of(&hub.state(), p);
    let Some(endpoint) = endpoints
        .iter()
        .find(|e| Endpoint::same_address(e, endpoint))
        .cloned()
    else {
        return Err(format!(
            "{endpoint} is not an endpoint of pool {pool} (its endpoints: {})",
            endpoints.join(", ")
        ));
    };
    drained.retain(|d| !Endpoint::same_address(d, &endpoint));
    if drain {
        drained.push(endpoint);
    }
    Ok((endpoints, drained))
}

/// `POST /pools/act` (`action`, `pool`, `endpoint`, `for`): operators only.
pub(in crate::console) async fn act(console: &Console, s: &Session, form: &Form) -> Answer {
    let Some(action) = form.get("action").and_then(|a| action_of(a)) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "action: drain, undrain, open or close",
        );
    };
    if !s.role.may_operate() {
        return refuse(s, action);
    }
    let Some(hub) = console.hub.upgrade() else {
        return shutting_down();
    };
    let pool = form.get("pool").map_or("", String::as_str);
    let endpoint = form.get("endpoint").map_or("", String::as_str);
    let result = match action {
        "drain" | "undrain" => match with_drain(&hub, pool, endpoint, action == "drain") {
            Ok((endpoints, drained)) => hub.set_backends(pool, endpoints, drained).await,
            Err(e) => return error_page(StatusCode::NOT_FOUND, &e),
        },
        "open" => {
            let secs = form
                .get("for")
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|v| OPEN_FOR.iter().any(|(s, _)| s == v))
                .unwrap_or(300);
            hub.set_circuit(pool, endpoint, true, secs, "operator")
                .await
        }
        _ => hub.set_circuit(pool, endpoint, false, 0, "operator").await,
    };
    match result {
        Ok(revision) => {
            tracing::info!(who = %s.who(), action, pool, endpoint, revision, "console: pool changed");
            redirect("/pools")
        }
        Err(HubError::Invalid(errors)) => error_page(
            StatusCode::UNPROCESSABLE_ENTITY,
            &errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.reason))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        Err(e @ HubError::NotFound(_)) => error_page(StatusCode::NOT_FOUND, &e.to_string()),
        Err(e) => error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::BackendSet;

    const POLICY: &str = r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: a
      endpoints: ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
      health_check: {path: /health}
  routes:
    - name: r
      chain: [a]
"#;

    fn mark(endpoint: &str, open: bool, source: &str, suspect: &str) -> CircuitRecord {
        CircuitRecord {
            pool: "a".into(),
            endpoint: endpoint.into(),
            open,
            until_unix_ms: now_ms() + 60_000,
            source: source.into(),
            suspect: suspect.into(),
        }
    }

    #[test]
    fn an_endpoint_shows_its_drain_circuit_and_who_raised_its_suspicions() {
        let policy = router_policy::document::load_with(
            POLICY,
            &router_policy::QueueSettings::default(),
            &router_policy::Guards::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let mut state = State::default();
        let pools = rows(&policy, &state);
        assert_eq!(pools[0].from, "policy");
        assert_eq!(pools[0].endpoints.len(), 2);
        assert!(pools[0].health_check.starts_with("GET /health every 2 s"));
        assert_eq!(pools[0].ejection, "off");
        assert_eq!(pools[0].endpoints[0].circuit, "closed");
        assert_eq!(pools[0].endpoints[0].health, "no failure reported");

        state.backends.insert(
            "a".into(),
            BackendSet {
                endpoints: vec!["127.0.0.1:9001".into(), "127.0.0.1:9002".into()],
                drained: vec!["127.0.0.1:9002".into()],
            },
        );
        state.circuits = vec![
            mark("http://127.0.0.1:9001", true, "edge-a", ""),
            mark("127.0.0.1:9001", true, "edge-b", "check"),
            // Expired: not shown.
            CircuitRecord {
                until_unix_ms: 1,
                ..mark("127.0.0.1:9002", true, "operator", "")
            },
        ];
        let pools = rows(&policy, &state);
        let p = &pools[0];
        assert_eq!(p.from, "backend set");
        let (one, two) = (&p.endpoints[0], &p.endpoints[1]);
        assert!(!one.draining && two.draining);
        assert_eq!(one.circuit, "open");
        assert_eq!(one.circuits[0].by, "edge-a");
        assert_eq!(one.suspicions.len(), 1);
        assert_eq!(one.suspicions[0].what, "suspect: check");
        assert_eq!(one.health, "failing (reported by edge-b)");
        assert_eq!(two.circuit, "closed");
        assert!(two.suspicions.is_empty());
    }

    #[tokio::test]
    async fn draining_a_pool_without_a_backend_set_makes_one_from_the_policy() {
        let dir = std::env::temp_dir().join(format!("router-console-pools-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::store::RedbStore::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        let hub = Hub::open(
            Box::new(store),
            router_policy::Guards::default(),
            crate::Limits::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        hub.apply_policy(POLICY, false, 0, "test")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (endpoints, drained) =
            with_drain(&hub, "a", "127.0.0.1:9002", true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            endpoints,
            ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
        );
        assert_eq!(drained, ["http://127.0.0.1:9002"]);
        hub.set_backends("a", endpoints, drained)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let set = &hub.state().backends["a"];
        assert_eq!(set.drained, ["http://127.0.0.1:9002"]);
        let (_, drained) =
            with_drain(&hub, "a", "http://127.0.0.1:9002", false).unwrap_or_else(|e| panic!("{e}"));
        assert!(drained.is_empty());
        assert!(with_drain(&hub, "a", "127.0.0.1:9999", true).is_err());
        assert!(with_drain(&hub, "nope", "127.0.0.1:9001", true).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
