//! `/pools`: each pool of the current policy and each of its endpoints:
//! what the control plane knows of them (where the endpoints come from, a
//! backend set or the policy; drain; the fleet's circuit overrides,
//! operators' and those proxies report, with who raised them and for how
//! long; the suspicions proxies raised, a failed health check or a failed
//! first request; the pool's health-check and outlier-ejection settings:
//! what `routerctl backends list` and `routerctl circuits list` show),
//! and their load, live, as the proxies see it.
//!
//! The load is each proxy's own, so the page asks for it: every proxy
//! connected to this replica is asked over its config stream when the
//! page is rendered, and the other control-plane replicas for their
//! proxies' through the store ([`Hub::fleet_load`]); the page waits
//! [`LOAD_WAIT`] at most. A replica that did not answer is named, and its
//! proxies counted as not answering. In flight and queue depth are summed over the proxies that
//! answered; latency EWMA and p95 are the highest any of them reports,
//! with its name; each proxy's own breaker, health checks, suspicion,
//! outlier ejection and drain are counted and the first few named
//! (`pool_load.rs`). A proxy that did not answer in time (busy, or from
//! before load reports, which NACKs the request) is named and not
//! counted; an endpoint no proxy reports shows "not reported". The page
//! refreshes itself (`/static/console.js`), so the load follows without a
//! reload.
//!
//! Operators drain, undrain, open and close from here, each after a
//! confirmation page (`/pools/confirm`, a form that POSTs to
//! `/pools/act`); the changes go through [`Hub::set_backends`] and
//! [`Hub::set_circuit`], what the gRPC `Admin` service's `SetBackends`
//! and `SetCircuit` call (`routerctl backends drain`, `circuits open`,
//! `circuits close`).

use std::time::Duration;

use askama::Template;
use http::StatusCode;
use router_policy::{Endpoint, Policy};

use super::super::session::Session;
use super::super::{redirect, Answer, Console, Form};
use super::pool_load::{seconds, EndpointLoad, FleetLoad, Highest, Nodes};
use super::{error_page, left, render, span, Layout};
use crate::hub::{now_ms, Hub, HubError};
use crate::store::{CircuitRecord, State};

/// How long the page waits for the proxies' load.
pub(in crate::console) const LOAD_WAIT: Duration = Duration::from_secs(1);

/// Proxies named at most in the page's note of those that did not answer.
const SILENT_NAMED: usize = 10;

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
    /// Its load as the proxies that answered report it; `None`: none does.
    live: Option<LiveRow>,
}

/// One endpoint's load and state across the proxies that report it.
pub(super) struct LiveRow {
    /// Proxies that report it.
    proxies: usize,
    /// Requests in flight, summed.
    in_flight: u64,
    /// The highest EWMA and the proxy that has it, or `—`.
    ewma: String,
    /// The highest p95 and the proxy that has it, or `—`.
    p95: String,
    /// Proxies whose own breaker is not closed (empty: none).
    circuit: String,
    /// What the proxies' health checks say (empty: the pool has none).
    health: String,
    /// Proxies that hold it suspect now (empty: none).
    suspect: String,
    /// Proxies that eject it now.
    ejected_by: usize,
    /// `no`, or by how many and which.
    ejected: String,
    /// On how many proxies it drains, when any does or the fleet drains it.
    drain: String,
    /// What is left of its key's quota, the fewest any proxy reports, and
    /// where it is rested (empty: no reading; docs/traffic.md).
    quota: String,
}

impl LiveRow {
    fn of(e: &EndpointLoad, fleet_drains: bool) -> Self {
        let n = e.proxies;
        let on = |what: &str, nodes: &Nodes| {
            if nodes.count == 0 {
                String::new()
            } else {
                format!("{what} on {} of {n}: {}", nodes.count, nodes.names())
            }
        };
        let highest = |h: &Option<Highest>| match h {
            Some(h) => format!("{} ({})", seconds(h.seconds), h.node),
            None => "—".into(),
        };
        let health: Vec<String> = [
            ("healthy", &e.healthy),
            ("unhealthy", &e.unhealthy),
            ("not checked yet", &e.health_unknown),
        ]
        .into_iter()
        .filter(|(_, nodes)| nodes.count > 0)
        .map(|(what, nodes)| {
            if nodes.count == n {
                format!("{what} on all {n}")
            } else {
                on(what, nodes)
            }
        })
        .collect();
        Self {
            proxies: n,
            in_flight: e.in_flight,
            ewma: highest(&e.ewma),
            p95: highest(&e.p95),
            circuit: on("not closed", &e.circuit_not_closed),
            health: health.join("; "),
            suspect: on("suspect", &e.suspect),
            ejected_by: e.ejected.count,
            ejected: if e.ejected.count == 0 {
                "no".into()
            } else {
                format!("by {} of {n}: {}", e.ejected.count, e.ejected.names())
            },
            quota: {
                let mut parts = Vec::new();
                if let Some(l) = &e.quota_requests {
                    parts.push(format!("{} requests left ({})", l.count, l.node));
                }
                if let Some(l) = &e.quota_tokens {
                    parts.push(format!("{} tokens left ({})", l.count, l.node));
                }
                if e.resting.count > 0 {
                    parts.push(on("rested", &e.resting));
                }
                parts.join("; ")
            },
            drain: if e.draining.count > 0 || fleet_drains {
                format!("draining on {} of {n}", e.draining.count)
            } else {
                String::new()
            },
        }
    }
}

/// One pool's load across the proxies that report it.
pub(super) struct PoolLive {
    /// Proxies that report it.
    proxies: usize,
    /// Requests waiting in its queues, summed.
    queue_depth: u64,
    /// Requests in flight on its endpoints, summed.
    in_flight: u64,
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
    /// Its load as the proxies that answered report it; `None`: none does.
    live: Option<PoolLive>,
}

/// Who was asked for the load and who answered.
pub(super) struct LoadNote {
    asked: usize,
    answered: usize,
    /// Those that did not answer in time, the first [`SILENT_NAMED`].
    silent: String,
    /// Those whose answer left endpoints out.
    truncated: String,
    /// The wait, as people read it.
    wait: String,
    /// Endpoints a proxy reports at most.
    cap: usize,
    /// Other replicas that did not answer in time, named.
    silent_replicas: String,
    /// Whether the other replicas were left unasked.
    unasked: bool,
    /// Proxies the other replicas left out (or sent without a load) to
    /// fit their answers.
    proxies_cut: u64,
}

impl LoadNote {
    fn of(fleet: &FleetLoad) -> Self {
        let name = |nodes: &[String]| {
            let mut s = nodes
                .iter()
                .take(SILENT_NAMED)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if nodes.len() > SILENT_NAMED {
                s.push_str(&format!(" and {} more", nodes.len() - SILENT_NAMED));
            }
            s
        };
        Self {
            asked: fleet.asked,
            answered: fleet.answered,
            silent: name(&fleet.silent),
            truncated: name(&fleet.truncated),
            wait: span(i64::try_from(LOAD_WAIT.as_millis()).unwrap_or(i64::MAX)),
            cap: router_proto::LOAD_ENDPOINTS_MAX,
            silent_replicas: String::new(),
            unasked: false,
            proxies_cut: 0,
        }
    }

    /// With what the other replicas did not answer, or cut.
    fn with_replicas(mut self, fleet: &crate::hub::Fleet<crate::hub::ProxyLoad>) -> Self {
        self.silent_replicas = fleet.silent.join(", ");
        self.unasked = fleet.unasked;
        self.proxies_cut = fleet.proxies_cut;
        self
    }
}

#[derive(Template)]
#[template(path = "pools.html")]
struct PoolsPage {
    layout: Layout,
    pools: Vec<PoolRow>,
    revision: u64,
    may_act: bool,
    load: LoadNote,
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
/// policy's (with several keys, each address once per key, named as the
/// proxies name it: `url#KEY_VARIABLE`).
fn endpoints_of(state: &State, pool: &router_policy::Pool) -> (Vec<String>, Vec<String>, bool) {
    let keyed = |addrs: &[String]| -> Vec<String> {
        if pool.api_keys_env.is_empty() {
            return addrs.to_vec();
        }
        addrs
            .iter()
            .flat_map(|a| match router_policy::Endpoint::parse(a) {
                Ok(e) => pool.keyed(&[e]).iter().map(ToString::to_string).collect(),
                Err(_) => vec![a.clone()],
            })
            .collect()
    };
    match state.backends.get(&pool.name) {
        Some(set) => (keyed(&set.endpoints), keyed(&set.drained), true),
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

fn rows(policy: &Policy, state: &State, fleet: &FleetLoad) -> Vec<PoolRow> {
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
            let load = fleet.pool(&pool.name);
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
                    let draining = drained.iter().any(|d| Endpoint::same_address(d, e));
                    EndpointRow {
                        live: load
                            .and_then(|l| l.endpoint(e))
                            .map(|l| LiveRow::of(l, draining)),
                        draining,
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
                live: load.map(|l| PoolLive {
                    proxies: l.proxies,
                    queue_depth: l.queue_depth,
                    in_flight: l.in_flight,
                }),
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
    let answers = hub.fleet_load(LOAD_WAIT).await;
    let fleet = FleetLoad::of(&answers.proxies);
    let state = hub.state();
    let pools = hub
        .current_policy()
        .map(|p| rows(&p, &state, &fleet))
        .unwrap_or_default();
    render(
        StatusCode::OK,
        &PoolsPage {
            layout: Layout::new("Pools", "pools", s, true),
            pools,
            revision: state.revision,
            may_act: s.role.may_operate(),
            load: LoadNote::of(&fleet).with_replicas(&answers),
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
    use crate::hub::ProxyLoad;
    use crate::store::BackendSet;
    use router_proto::v1 as pb;

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
        let pools = rows(&policy, &state, &FleetLoad::default());
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
        let pools = rows(&policy, &state, &FleetLoad::default());
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

    fn policy() -> Policy {
        router_policy::document::load_with(
            POLICY,
            &router_policy::QueueSettings::default(),
            &router_policy::Guards::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"))
    }

    #[test]
    fn the_page_shows_the_fewest_requests_and_tokens_left_of_a_keys_quota_and_who_rests_it() {
        let with_quota = |node: &str, requests: u64, tokens: u64, resting: &str| {
            let mut a = answer(node, 0, 0, 0.1, false);
            if let Some(load) = a.load.as_mut() {
                let e = &mut load.pools[0].endpoints[0];
                e.quota_requests_remaining = Some(requests);
                e.quota_tokens_remaining = Some(tokens);
                e.quota_resting = resting.into();
            }
            a
        };
        let fleet = FleetLoad::of(&[
            with_quota("edge-a", 7, 1200, ""),
            with_quota("edge-b", 0, 5000, "requests"),
        ]);
        let pools = rows(&policy(), &State::default(), &fleet);
        let one = pools[0].endpoints[0]
            .live
            .as_ref()
            .unwrap_or_else(|| panic!("no endpoint load"));
        assert_eq!(
            one.quota,
            "0 requests left (edge-b); 1200 tokens left (edge-a); rested on 1 of 2: edge-b"
        );
        // Without readings: nothing said.
        let plain = FleetLoad::of(&[answer("edge-a", 0, 0, 0.1, false)]);
        let rows_plain = rows(&policy(), &State::default(), &plain);
        let live = rows_plain[0].endpoints[0]
            .live
            .as_ref()
            .unwrap_or_else(|| panic!("no load"));
        assert!(live.quota.is_empty());
        let html = page(pools, &fleet);
        assert!(
            html.contains(r#"<td class="quota">0 requests left (edge-b); 1200 tokens left (edge-a); rested on 1 of 2: edge-b</td>"#),
            "{html}"
        );
        assert!(page(rows_plain, &plain).contains(r#"<td class="quota">—</td>"#));
    }

    /// A proxy's answer: pool `a`'s queue and its first endpoint's load
    /// (its address written another way than the policy's).
    fn answer(node: &str, queue_depth: u32, in_flight: u32, ewma: f64, ejected: bool) -> ProxyLoad {
        ProxyLoad {
            node: node.into(),
            load: Some(pb::Load {
                id: "q".into(),
                pools: vec![pb::PoolLoad {
                    name: "a".into(),
                    queue_depth,
                    endpoints: vec![pb::EndpointLoad {
                        addr: "127.0.0.1:9001".into(),
                        in_flight,
                        ewma_s: Some(ewma),
                        p95_s: Some(ewma * 2.0),
                        circuit: "closed".into(),
                        health: "healthy".into(),
                        ejected,
                        ..Default::default()
                    }],
                }],
                truncated: false,
            }),
            ..ProxyLoad::default()
        }
    }

    fn page(pools: Vec<PoolRow>, fleet: &FleetLoad) -> String {
        PoolsPage {
            layout: Layout::new(
                "Pools",
                "pools",
                &crate::console::pages::cost::session(),
                true,
            ),
            pools,
            revision: 3,
            may_act: true,
            load: LoadNote::of(fleet),
        }
        .render()
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_page_names_the_replicas_that_did_not_answer_and_what_the_others_cut() {
        let answers = crate::hub::Fleet {
            proxies: vec![
                answer("edge-a", 1, 1, 0.2, false),
                ProxyLoad {
                    node: "edge-c".into(),
                    replica: "cp-c".into(),
                    ..ProxyLoad::default()
                },
            ],
            silent: vec!["cp-c".into()],
            unasked: false,
            proxies_cut: 3,
        };
        let fleet = FleetLoad::of(&answers.proxies);
        let html = PoolsPage {
            layout: Layout::new(
                "Pools",
                "pools",
                &crate::console::pages::cost::session(),
                true,
            ),
            pools: rows(&policy(), &State::default(), &fleet),
            revision: 3,
            may_act: true,
            load: LoadNote::of(&fleet).with_replicas(&answers),
        }
        .render()
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            html.contains(r#"data-asked="2" data-answered="1""#),
            "{html}"
        );
        assert!(html.contains("reports): edge-c (through cp-c)."), "{html}");
        assert!(
            html.contains("replicas that did not answer within 1 s: cp-c."),
            "{html}"
        );
        assert!(
            html.contains("3 proxies of other replicas left out"),
            "{html}"
        );
        assert!(!html.contains("load-unasked"), "{html}");
    }

    #[test]
    fn the_page_shows_the_fleets_load_summed_the_highest_latency_and_who_did_not_answer() {
        let fleet = FleetLoad::of(&[
            answer("edge-a", 2, 1, 0.2, false),
            answer("edge-b", 3, 4, 1.5, true),
            ProxyLoad {
                node: "edge-old".into(),
                ..ProxyLoad::default()
            },
        ]);
        let pools = rows(&policy(), &State::default(), &fleet);
        let live = pools[0]
            .live
            .as_ref()
            .unwrap_or_else(|| panic!("no pool load"));
        assert_eq!((live.queue_depth, live.in_flight, live.proxies), (5, 5, 2));
        let one = pools[0].endpoints[0]
            .live
            .as_ref()
            .unwrap_or_else(|| panic!("no endpoint load"));
        assert_eq!(one.in_flight, 5);
        assert_eq!(one.ewma, "1.50 s (edge-b)");
        assert_eq!(one.p95, "3.00 s (edge-b)");
        assert_eq!(one.ejected, "by 1 of 2: edge-b");
        assert_eq!(one.health, "healthy on all 2");
        assert!(one.drain.is_empty() && one.circuit.is_empty() && one.suspect.is_empty());
        assert!(pools[0].endpoints[1].live.is_none(), "no proxy reports it");
        let html = page(pools, &fleet);
        assert!(
            html.contains(r#"data-in-flight="5" data-ejected-by="1""#),
            "{html}"
        );
        assert!(html.contains(r#"data-queue-depth="5""#), "{html}");
        assert!(html.contains("not reported"), "{html}");
        assert!(
            html.contains(r#"data-asked="3" data-answered="2""#),
            "{html}"
        );
        assert!(
            html.contains("busy, or a proxy from before load reports): edge-old."),
            "{html}"
        );
        assert!(
            html.contains(r#"data-refresh-seconds="5""#),
            "the page is live"
        );

        // No proxy answers: every load is "not reported", nothing fails.
        let none = FleetLoad::of(&[]);
        let html = page(rows(&policy(), &State::default(), &none), &none);
        assert!(html.contains(r#"data-in-flight="""#), "{html}");
        assert!(html.contains(r#"data-queue-depth="""#), "{html}");
        assert!(!html.contains("load-silent"), "{html}");
    }

    /// The pools page's work once 1,000 proxies answered, each with 4
    /// pools of 8 endpoints (docs/benchmarks.md, "The console"): `cargo
    /// test -p router-control-plane --release --lib -- --ignored
    /// --nocapture render_cost`.
    #[test]
    #[ignore = "a measurement: run it in release"]
    fn render_cost_of_the_pools_page_with_1000_proxies_answering() {
        use crate::console::pages::cost::{session, time_renders};
        let pools = ["gpu-a", "gpu-b", "cloud", "batch"];
        let url = |p: usize, e: usize| format!("http://10.{p}.0.{e}:8000/v1");
        let mut document =
            String::from("apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n");
        for (p, name) in pools.iter().enumerate() {
            let endpoints: Vec<String> = (0..8).map(|e| format!("\"{}\"", url(p, e))).collect();
            document.push_str(&format!(
                "    - name: {name}\n      endpoints: [{}]\n      health_check: {{path: /health}}\n",
                endpoints.join(", ")
            ));
        }
        document.push_str("  routes:\n    - name: r\n      chain: [gpu-a]\n");
        let policy = router_policy::document::load_with(
            &document,
            &router_policy::QueueSettings::default(),
            &router_policy::Guards::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let answers: Vec<ProxyLoad> = (0..1000u32)
            .map(|i| ProxyLoad {
                node: format!("edge-{i:04}.eu-west-1.internal"),
                load: (i % 100 != 0).then(|| pb::Load {
                    id: "q".into(),
                    pools: pools
                        .iter()
                        .enumerate()
                        .map(|(p, name)| pb::PoolLoad {
                            name: (*name).into(),
                            queue_depth: i % 3,
                            endpoints: (0..8)
                                .map(|e| pb::EndpointLoad {
                                    addr: url(p, e),
                                    in_flight: (i + e as u32) % 5,
                                    ewma_s: Some(0.1 + f64::from(i % 17) / 10.0),
                                    p95_s: Some(0.3 + f64::from(i % 13) / 5.0),
                                    circuit: if i % 97 == 0 { "open" } else { "closed" }.into(),
                                    draining: false,
                                    health: "healthy".into(),
                                    suspect: String::new(),
                                    ejected: i % 211 == 0,
                                    ..Default::default()
                                })
                                .collect(),
                        })
                        .collect(),
                    truncated: false,
                }),
                ..ProxyLoad::default()
            })
            .collect();
        let received: usize = answers
            .iter()
            .filter_map(|a| a.load.as_ref())
            .map(prost::Message::encoded_len)
            .sum();
        println!(
            "pools page: the 990 answers are {} KiB on the wire",
            received / 1024
        );
        let s = session();
        let state = State::default();
        let bytes = time_renders("pools page, 1,000 proxies x 4 pools x 8 endpoints", || {
            let fleet = FleetLoad::of(&answers);
            PoolsPage {
                layout: Layout::new("Pools", "pools", &s, true),
                pools: rows(&policy, &state, &fleet),
                revision: 42,
                may_act: true,
                load: LoadNote::of(&fleet),
            }
            .render()
            .map(|b| b.len())
            .unwrap_or(0)
        });
        assert!(bytes > 32 * 500, "{bytes} bytes");
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
