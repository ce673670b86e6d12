//! `/fleet`: the proxies (node, applied revision, ACK/NACK and its error,
//! last seen, replica), the control-plane replicas and which one leads.
//! The same records `routerctl proxies list` shows ([`Hub::fleet_proxies`]).

use std::collections::BTreeMap;

use askama::Template;
use http::StatusCode;

use super::super::session::Session;
use super::super::{Answer, Console};
use super::{ago, error_page, render, Layout};
use crate::hub::{now_ms, Hub, ProxyRecord};

/// One proxy's row.
pub(super) struct ProxyRow {
    node: String,
    replica: String,
    /// `ACK`, `NACK`, `waiting` or `gone`.
    state: &'static str,
    applied: u64,
    /// Applied an older revision than the one published now.
    behind: bool,
    error: String,
    last_seen: String,
}

/// One replica's row.
pub(super) struct ReplicaRow {
    name: String,
    this: bool,
    leads: bool,
    proxies: usize,
}

#[derive(Template)]
#[template(path = "fleet.html")]
struct FleetPage {
    layout: Layout,
    revision: u64,
    policy_version: u64,
    proxies: Vec<ProxyRow>,
    connected: usize,
    replicas: Vec<ReplicaRow>,
    leader_known: bool,
}

/// A proxy's state, as `routerctl proxies list` says it
/// ([`router_proto::proxy_state`]).
fn state(p: &ProxyRecord) -> &'static str {
    router_proto::proxy_state(p.connected, p.applied_revision, p.nacked_revision)
}

fn rows(
    hub: &Hub,
    proxies: BTreeMap<String, ProxyRecord>,
    revision: u64,
) -> (Vec<ProxyRow>, Vec<ReplicaRow>, bool) {
    let now = now_ms();
    let this = hub.replica().to_string();
    let leader = if this.is_empty() {
        // One control plane: it does the singleton work itself.
        Some(String::new())
    } else {
        hub.leader()
    };
    let mut replicas: BTreeMap<String, usize> = BTreeMap::new();
    replicas.insert(this.clone(), 0);
    if let Some(l) = &leader {
        replicas.entry(l.clone()).or_default();
    }
    let rows = proxies
        .into_iter()
        .map(|(node, p)| {
            if p.connected {
                *replicas.entry(p.control_plane.clone()).or_default() += 1;
            }
            ProxyRow {
                state: state(&p),
                applied: p.applied_revision,
                behind: p.connected && p.applied_revision < revision,
                error: if p.nacked_revision > p.applied_revision {
                    p.last_nack.clone()
                } else {
                    String::new()
                },
                last_seen: ago(p.last_seen_unix_ms, now),
                replica: p.control_plane,
                node,
            }
        })
        .collect();
    let replicas = replicas
        .into_iter()
        .map(|(name, proxies)| ReplicaRow {
            this: name == this,
            leads: leader.as_deref() == Some(name.as_str()),
            name,
            proxies,
        })
        .collect();
    (rows, replicas, leader.is_some())
}

/// `GET /fleet`.
pub(in crate::console) async fn get(console: &Console, s: &Session) -> Answer {
    let Some(hub) = console.hub.upgrade() else {
        return error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "the control plane is shutting down",
        );
    };
    let proxies = hub.fleet_proxies().await;
    let revision = hub.published_revision();
    let policy_version = hub.state().policy_version;
    let (proxies, replicas, leader_known) = rows(&hub, proxies, revision);
    render(
        StatusCode::OK,
        &FleetPage {
            layout: Layout::new("Fleet", "fleet", s, true),
            revision,
            policy_version,
            connected: proxies.iter().filter(|p| p.state != "gone").count(),
            proxies,
            replicas,
            leader_known,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::pages::cost::{session, time_renders};

    /// The fleet page's render time with 1,000 proxies (docs/benchmarks.md,
    /// "The console"): `cargo test -p router-control-plane --release --lib
    /// -- --ignored --nocapture render_cost`.
    #[tokio::test]
    #[ignore = "a measurement: run it in release"]
    async fn render_cost_of_the_fleet_page_with_1000_proxies() {
        let dir = std::env::temp_dir().join(format!("router-fleet-cost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::store::RedbStore::open(&dir).unwrap();
        let hub = Hub::open(
            Box::new(store),
            router_policy::Guards::default(),
            crate::Limits::default(),
        )
        .await
        .unwrap();
        let now = now_ms();
        let proxies: BTreeMap<String, ProxyRecord> = (0..1000u32)
            .map(|i| {
                (
                    format!("edge-{i:04}.eu-west-1.internal"),
                    ProxyRecord {
                        applied_revision: 41 + u64::from(i % 2),
                        nacked_revision: if i % 100 == 0 { 42 } else { 0 },
                        last_nack: if i % 100 == 0 {
                            "pool \"gpu\": unknown api_key_env HF_TOKEN".into()
                        } else {
                            String::new()
                        },
                        last_seen_unix_ms: now - i64::from(i % 30) * 1000,
                        connected: i % 50 != 0,
                        control_plane: String::new(),
                        circuit_reports_dropped: 0,
                    },
                )
            })
            .collect();
        let s = session();
        let bytes = time_renders("fleet page, 1,000 proxies", || {
            let (proxies, replicas, leader_known) = rows(&hub, proxies.clone(), 42);
            FleetPage {
                layout: Layout::new("Fleet", "fleet", &s, true),
                revision: 42,
                policy_version: 7,
                connected: proxies.iter().filter(|p| p.state != "gone").count(),
                proxies,
                replicas,
                leader_known,
            }
            .render()
            .map(|b| b.len())
            .unwrap_or(0)
        });
        assert!(bytes > 1000 * 200, "{bytes} bytes");
        drop(hub);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_proxy_state_is_ack_nack_waiting_or_gone() {
        let p = |connected, applied, nacked| ProxyRecord {
            connected,
            applied_revision: applied,
            nacked_revision: nacked,
            ..Default::default()
        };
        assert_eq!(state(&p(true, 0, 0)), "waiting");
        assert_eq!(state(&p(true, 3, 0)), "ACK");
        assert_eq!(state(&p(true, 3, 4)), "NACK");
        assert_eq!(state(&p(false, 3, 0)), "gone");
    }
}
