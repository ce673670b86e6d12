//! `/decisions`: the latest route decisions across the fleet, each with
//! its reason and attempts, filtered by tenant, route, pool, outcome and
//! status (query parameters, `?route=send&status=5xx`).
//!
//! Each managed proxy keeps its last route records in a ring
//! (`CUSTOM_ROUTER_DECISION_RING`); when the page is asked for, the
//! control plane asks every proxy connected to it over its config stream,
//! and the other control-plane replicas for theirs through the store
//! ([`crate::hub::Hub::fleet_decisions`]), and waits at most [`WAIT`]
//! for the answers. A proxy connected to another replica is shown with
//! that replica's name; a replica that did not answer in time is named,
//! and its proxies listed as not answering. The records are the route log's JSON lines
//! (docs/observability.md), read here field by field; every value shown
//! is escaped, as everywhere in the console. The page refreshes itself
//! (every 5 s, asking the proxies again), except while its filter form
//! is being filled in (`/static/console.js`).

use std::collections::HashMap;
use std::time::Duration;

use askama::Template;
use http::StatusCode;
use serde_json::Value;

use super::super::session::Session;
use super::super::{Answer, Console};
use super::{error_page, render, Layout};

/// How long the page waits for the proxies' answers.
pub(in crate::console) const WAIT: Duration = Duration::from_secs(2);
/// Records asked of each proxy at most.
const PER_PROXY: u32 = 256;
/// Bytes of lines asked of the whole fleet at most (shared by the
/// proxies asked, 1 MiB each at most: with many proxies each is asked
/// for less, so the total stays within this).
const FLEET_BYTES: usize = 16 * 1024 * 1024;
/// Decisions shown at most (the newest that pass the filters).
pub(in crate::console) const SHOWN: usize = 200;

/// The filters, as given.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Filters {
    tenant: String,
    route: String,
    pool: String,
    outcome: String,
    /// `503`, or a class: `5xx`.
    status: String,
}

impl Filters {
    fn of(query: Option<&str>) -> Self {
        let q: HashMap<String, String> = query
            .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default();
        let get = |k: &str| q.get(k).map(|v| v.trim().to_string()).unwrap_or_default();
        Self {
            tenant: get("tenant"),
            route: get("route"),
            pool: get("pool"),
            outcome: get("outcome"),
            status: get("status"),
        }
    }

    fn any(&self) -> bool {
        *self != Self::default()
    }

    fn keeps(&self, d: &DecisionRow) -> bool {
        let is = |want: &str, have: &str| want.is_empty() || want == have;
        let status_ok = match self.status.strip_suffix("xx") {
            _ if self.status.is_empty() => true,
            Some(class) => d.status.to_string().starts_with(class),
            None => self.status == d.status.to_string(),
        };
        is(&self.tenant, &d.tenant)
            && is(&self.route, &d.route)
            && is(&self.outcome, &d.outcome)
            && status_ok
            && (self.pool.is_empty()
                || d.pool == self.pool
                || d.attempts.iter().any(|a| a.pool == self.pool))
    }
}

/// One attempt of a decision.
pub(super) struct AttemptRow {
    pool: String,
    endpoint: String,
    outcome: String,
    status: String,
    latency: String,
}

/// One decision as the page shows it.
pub(super) struct DecisionRow {
    node: String,
    request_id: String,
    at: String,
    route: String,
    tenant: String,
    /// The pool that answered (else the first chosen).
    pool: String,
    outcome: String,
    status: u64,
    elapsed: String,
    risk: String,
    model: String,
    reason: String,
    attempts: Vec<AttemptRow>,
    config_version: String,
    parked_task: String,
}

fn text(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

fn millis(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_f64)
        .map(|ms| format!("{ms:.1} ms"))
        .unwrap_or_default()
}

/// A route-log line read for the page (`None`: not a record).
fn row(node: &str, line: &str) -> Option<DecisionRow> {
    let v: Value = serde_json::from_str(line).ok()?;
    if !v.is_object() {
        return None;
    }
    let pool = match text(&v, "final_route") {
        p if p.is_empty() => text(&v, "first_route"),
        p => p,
    };
    let attempts = v
        .get("attempts")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|a| AttemptRow {
                    pool: text(a, "pool"),
                    endpoint: text(a, "endpoint"),
                    outcome: text(a, "outcome"),
                    status: text(a, "status"),
                    latency: millis(a, "latency_ms"),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(DecisionRow {
        node: node.to_string(),
        request_id: text(&v, "request_id"),
        at: text(&v, "offered_at"),
        route: text(&v, "route"),
        tenant: text(&v, "tenant"),
        pool,
        outcome: text(&v, "outcome"),
        status: v.get("status").and_then(Value::as_u64).unwrap_or(0),
        elapsed: millis(&v, "elapsed_ms"),
        risk: text(&v, "risk"),
        model: text(&v, "model"),
        reason: text(&v, "reason"),
        attempts,
        config_version: text(&v, "config_version"),
        parked_task: text(&v, "parked_task"),
    })
}

/// The decisions that pass `filters`, the newest first, at most
/// [`SHOWN`]; and how many passed.
fn select(
    answers: Vec<crate::hub::ProxyDecisions>,
    filters: &Filters,
) -> (Vec<DecisionRow>, usize, usize) {
    let mut fetched = 0;
    let mut rows: Vec<DecisionRow> = answers
        .iter()
        .flat_map(|a| a.lines.iter().map(move |l| (a.node.as_str(), l)))
        .filter_map(|(node, line)| {
            fetched += 1;
            row(node, line)
        })
        .filter(|d| filters.keeps(d))
        .collect();
    // RFC 3339 with milliseconds, UTC: the text sorts as the time.
    rows.sort_by(|a, b| b.at.cmp(&a.at));
    let passed = rows.len();
    rows.truncate(SHOWN);
    (rows, passed, fetched)
}

/// What the page says of each proxy asked.
pub(super) struct ProxyNote {
    node: String,
    records: usize,
    capacity: u32,
    complete: bool,
    /// The replica it is connected to when that is another (empty: this).
    replica: String,
    /// Its older records the other replica left out to fit its answer.
    cut: u32,
}

#[derive(Template)]
#[template(path = "decisions.html")]
struct DecisionsPage {
    layout: Layout,
    filters: Filters,
    filtered: bool,
    decisions: Vec<DecisionRow>,
    passed: usize,
    fetched: usize,
    proxies: Vec<ProxyNote>,
    shown_max: usize,
    /// Other replicas that did not answer in time, named.
    silent_replicas: String,
    /// Whether the other replicas were left unasked.
    unasked: bool,
    /// Proxies the other replicas left out to fit their answers.
    proxies_cut: u64,
}

/// `GET /decisions?tenant=&route=&pool=&outcome=&status=`.
pub(in crate::console) async fn get(console: &Console, s: &Session, query: Option<&str>) -> Answer {
    let Some(hub) = console.hub.upgrade() else {
        return error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "the control plane is shutting down",
        );
    };
    let filters = Filters::of(query);
    let streams = hub.open_streams().max(1);
    let per_proxy = (FLEET_BYTES / streams).min(1024 * 1024);
    let fleet = hub
        .fleet_decisions(
            PER_PROXY,
            u32::try_from(per_proxy).unwrap_or(u32::MAX),
            WAIT,
        )
        .await;
    let answers = fleet.proxies;
    let proxies = answers
        .iter()
        .map(|a| ProxyNote {
            node: a.node.clone(),
            records: a.lines.len(),
            capacity: a.capacity,
            complete: a.complete,
            replica: a.replica.clone(),
            cut: a.cut,
        })
        .collect();
    let (decisions, passed, fetched) = select(answers, &filters);
    render(
        StatusCode::OK,
        &DecisionsPage {
            layout: Layout::new("Decisions", "decisions", s, true),
            filtered: filters.any(),
            filters,
            decisions,
            passed,
            fetched,
            proxies,
            shown_max: SHOWN,
            silent_replicas: fleet.silent.join(", "),
            unasked: fleet.unasked,
            proxies_cut: fleet.proxies_cut,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::ProxyDecisions;

    fn line(id: &str, at: &str, route: &str, tenant: &str, status: u16, pools: &[&str]) -> String {
        serde_json::json!({
            "request_id": id,
            "offered_at": at,
            "route": route,
            "tenant": tenant,
            "final_route": pools.last(),
            "outcome": if status < 400 { "ok" } else { "upstream_5xx" },
            "status": status,
            "elapsed_ms": 12.5,
            "reason": format!("route {route}: first pool"),
            "attempts": pools.iter().map(|p| serde_json::json!({
                "pool": p, "endpoint": "127.0.0.1:9", "outcome": "ok", "status": 200, "latency_ms": 3.0
            })).collect::<Vec<_>>(),
        })
        .to_string()
    }

    fn fleet() -> Vec<ProxyDecisions> {
        vec![
            ProxyDecisions {
                node: "edge-a".into(),
                lines: vec![
                    line(
                        "r3",
                        "2024-03-01T10:00:03.000Z",
                        "send",
                        "acme",
                        200,
                        &["only"],
                    ),
                    line(
                        "r1",
                        "2024-03-01T10:00:01.000Z",
                        "default",
                        "acme",
                        503,
                        &["a", "b"],
                    ),
                    "not json".into(),
                ],
                capacity: 256,
                complete: true,
                ..ProxyDecisions::default()
            },
            ProxyDecisions {
                node: "edge-b".into(),
                lines: vec![line(
                    "r2",
                    "2024-03-01T10:00:02.000Z",
                    "default",
                    "<b>",
                    200,
                    &["a"],
                )],
                capacity: 256,
                complete: true,
                ..ProxyDecisions::default()
            },
        ]
    }

    #[test]
    fn the_page_names_each_proxys_replica_what_it_cut_and_the_replicas_that_did_not_answer() {
        let note = |node: &str, records, complete, replica: &str, cut| ProxyNote {
            node: node.into(),
            records,
            capacity: 256,
            complete,
            replica: replica.into(),
            cut,
        };
        let html = DecisionsPage {
            layout: Layout::new(
                "Decisions",
                "decisions",
                &crate::console::pages::cost::session(),
                true,
            ),
            filters: Filters::default(),
            filtered: false,
            decisions: Vec::new(),
            passed: 0,
            fetched: 0,
            proxies: vec![
                note("p-a", 2, true, "", 0),
                note("p-b", 3, true, "cp-b", 40),
                note("p-c", 0, false, "cp-c", 0),
            ],
            shown_max: SHOWN,
            silent_replicas: "cp-c".into(),
            unasked: true,
            proxies_cut: 2,
        }
        .render()
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(html.contains(">p-a: 2 record(s), keeps 256<"), "{html}");
        assert!(
            html.contains(
                "p-b (through cp-b): 3 record(s), keeps 256, 40 older left out by its replica"
            ),
            "{html}"
        );
        assert!(
            html.contains("replicas that did not answer in time: cp-c."),
            "{html}"
        );
        assert!(
            html.contains("p-c (through cp-c) did not answer in time"),
            "{html}"
        );
        assert!(
            html.contains("2 proxies of other replicas left out"),
            "{html}"
        );
        assert!(html.contains(r#"id="decision-unasked""#), "{html}");
    }

    /// The decisions page's work once the answers are in, with 50 proxies
    /// of 256 records each (docs/benchmarks.md, "The console"): `cargo
    /// test -p router-control-plane --release --lib -- --ignored
    /// --nocapture render_cost`.
    #[test]
    #[ignore = "a measurement: run it in release"]
    fn render_cost_of_the_decisions_page_with_50_proxies_of_256_records() {
        use crate::console::pages::cost::{session, time_renders};
        let answers: Vec<ProxyDecisions> = (0..50)
            .map(|p| ProxyDecisions {
                node: format!("edge-{p:02}"),
                lines: (0..256)
                    .map(|i| {
                        let at = format!("2024-03-01T10:{:02}:{:02}.{p:03}Z", i / 60, i % 60);
                        line(
                            &format!("req-{p}-{i}"),
                            &at,
                            "default",
                            "acme",
                            200,
                            &["a", "b"],
                        )
                    })
                    .collect(),
                capacity: 256,
                complete: true,
                ..ProxyDecisions::default()
            })
            .collect();
        let s = session();
        let bytes = time_renders("decisions page, 50 proxies x 256 records", || {
            let filters = Filters::default();
            let (decisions, passed, fetched) = select(answers.clone(), &filters);
            DecisionsPage {
                layout: Layout::new("Decisions", "decisions", &s, false),
                filtered: false,
                filters,
                decisions,
                passed,
                fetched,
                proxies: Vec::new(),
                shown_max: SHOWN,
                silent_replicas: String::new(),
                unasked: false,
                proxies_cut: 0,
            }
            .render()
            .map(|b| b.len())
            .unwrap_or(0)
        });
        assert!(bytes > SHOWN * 500, "{bytes} bytes");
    }

    #[test]
    fn decisions_merge_newest_first_and_filters_keep_what_matches() {
        let (rows, passed, fetched) = select(fleet(), &Filters::default());
        assert_eq!(fetched, 4);
        assert_eq!(passed, 3, "the line that is not a record is left out");
        let ids: Vec<&str> = rows.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(ids, ["r3", "r2", "r1"]);
        assert_eq!(rows[2].attempts.len(), 2);
        assert_eq!(rows[2].pool, "b");
        let only = |q: &str| -> Vec<String> {
            select(fleet(), &Filters::of(Some(q)))
                .0
                .into_iter()
                .map(|r| r.request_id)
                .collect()
        };
        assert_eq!(only("route=send"), ["r3"]);
        assert_eq!(only("route=default&tenant=acme"), ["r1"]);
        assert_eq!(only("tenant=%3Cb%3E"), ["r2"]);
        assert_eq!(only("pool=a"), ["r2", "r1"], "an attempt's pool counts");
        assert_eq!(only("status=5xx"), ["r1"]);
        assert_eq!(only("status=200"), ["r3", "r2"]);
        assert_eq!(only("outcome=upstream_5xx"), ["r1"]);
        assert!(only("route=nope").is_empty());
    }
}
