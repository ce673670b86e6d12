//! The fleet's view of each pool's and endpoint's load, from the answers
//! of the proxies asked for it ([`crate::hub::Hub::fetch_load`]), for the
//! Pools page.
//!
//! How proxies' numbers combine (the page says so too):
//!
//! - **in flight** and **queue depth**: summed over the proxies that
//!   answered (what the endpoint and the pool carry across the fleet);
//! - **EWMA** and **p95**: the highest any proxy reports, with that
//!   proxy's name (each proxy measures its own requests; the worst view
//!   is the one that explains slow answers);
//! - **local circuit**, **health**, **suspicion**, **ejection** and
//!   **drain**: how many of the proxies reporting the endpoint say so,
//!   and the first few of them by name.
//!
//! Endpoints are matched by address however written
//! (`127.0.0.1:8001` and `http://127.0.0.1:8001/` are one endpoint),
//! through one key per address, parsed once per distinct text (proxies
//! name an endpoint alike), so the work is linear in what the proxies
//! sent.

use std::collections::HashMap;

use router_policy::{Endpoint, Scheme};

use crate::hub::ProxyLoad;

/// Proxies named at most in one cell (then "and N more").
const NAMED: usize = 3;

/// One address's key: scheme, host, port, base path and, for a pool with
/// several API keys, the key's variable (`#A_API_KEY`: each key is an
/// endpoint of its own), whatever way it was written; the text itself
/// when it does not parse.
pub(super) fn address_key(addr: &str) -> String {
    match Endpoint::parse(addr) {
        Ok(e) => format!(
            "{}://{}:{}{}{}",
            match e.scheme() {
                Scheme::Http => "http",
                Scheme::Https => "https",
            },
            e.host(),
            e.port(),
            e.base_path(),
            e.key().map(|k| format!("#{k}")).unwrap_or_default()
        ),
        Err(_) => addr.trim().to_string(),
    }
}

/// The highest value of a measurement any proxy reports, and which.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Highest {
    /// Seconds.
    pub(super) seconds: f64,
    /// The proxy that reports it.
    pub(super) node: String,
}

/// Proxies that say one thing of an endpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Nodes {
    /// How many.
    pub(super) count: usize,
    /// The first [`NAMED`] of them.
    pub(super) named: Vec<String>,
}

impl Nodes {
    fn add(&mut self, node: &str) {
        self.count += 1;
        if self.named.len() < NAMED {
            self.named.push(node.to_string());
        }
    }

    /// `edge-a, edge-b and 3 more`.
    pub(super) fn names(&self) -> String {
        let mut s = self.named.join(", ");
        if self.count > self.named.len() {
            s.push_str(&format!(" and {} more", self.count - self.named.len()));
        }
        s
    }
}

/// One endpoint across the proxies that report it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct EndpointLoad {
    /// Proxies that report it.
    pub(super) proxies: usize,
    /// Requests in flight, summed.
    pub(super) in_flight: u64,
    /// The highest EWMA.
    pub(super) ewma: Option<Highest>,
    /// The highest p95.
    pub(super) p95: Option<Highest>,
    /// Proxies whose own breaker is not closed (`open` or `half_open`).
    pub(super) circuit_not_closed: Nodes,
    /// Proxies draining it.
    pub(super) draining: Nodes,
    /// Proxies whose health checks find it healthy.
    pub(super) healthy: Nodes,
    /// ... unhealthy.
    pub(super) unhealthy: Nodes,
    /// ... not checked yet (no check passed since it was added).
    pub(super) health_unknown: Nodes,
    /// Proxies that hold it suspect now.
    pub(super) suspect: Nodes,
    /// Proxies that have it ejected as an outlier now.
    pub(super) ejected: Nodes,
    /// The fewest requests left of its key's quota, and the proxy that
    /// says so (`None`: no proxy has a reading).
    pub(super) quota_requests: Option<Least>,
    /// The fewest tokens left, and the proxy that says so.
    pub(super) quota_tokens: Option<Least>,
    /// Proxies that rest its key now (out of quota until its reset).
    pub(super) resting: Nodes,
}

/// The lowest count a proxy reports, and that proxy.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Least {
    /// The count.
    pub(super) count: u64,
    /// The proxy.
    pub(super) node: String,
}

fn least(current: &mut Option<Least>, count: Option<u64>, node: &str) {
    let Some(count) = count else {
        return;
    };
    if current.as_ref().is_none_or(|l| count < l.count) {
        *current = Some(Least {
            count,
            node: node.to_string(),
        });
    }
}

/// One pool across the proxies that report it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct PoolLoad {
    /// Proxies that report it.
    pub(super) proxies: usize,
    /// Requests waiting, summed.
    pub(super) queue_depth: u64,
    /// Requests in flight on its endpoints, summed.
    pub(super) in_flight: u64,
    /// By [`address_key`].
    pub(super) endpoints: HashMap<String, EndpointLoad>,
}

/// What the proxies asked said, combined.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct FleetLoad {
    /// Proxies asked (through every replica that was asked).
    pub(super) asked: usize,
    /// Proxies that answered in time.
    pub(super) answered: usize,
    /// Those that did not.
    pub(super) silent: Vec<String>,
    /// Those whose answer was cut at their cap (some endpoints left out).
    pub(super) truncated: Vec<String>,
    /// By pool name.
    pub(super) pools: HashMap<String, PoolLoad>,
}

fn highest(current: &mut Option<Highest>, seconds: Option<f64>, node: &str) {
    let Some(seconds) = seconds.filter(|s| s.is_finite()) else {
        return;
    };
    if current.as_ref().is_none_or(|h| seconds > h.seconds) {
        *current = Some(Highest {
            seconds,
            node: node.to_string(),
        });
    }
}

impl FleetLoad {
    /// The answers combined.
    pub(super) fn of(answers: &[ProxyLoad]) -> Self {
        let mut fleet = FleetLoad {
            asked: answers.len(),
            ..Self::default()
        };
        let mut keys: HashMap<&str, String> = HashMap::new();
        for a in answers {
            let Some(load) = &a.load else {
                fleet.silent.push(if a.replica.is_empty() {
                    a.node.clone()
                } else {
                    format!("{} (through {})", a.node, a.replica)
                });
                continue;
            };
            fleet.answered += 1;
            if load.truncated {
                fleet.truncated.push(a.node.clone());
            }
            let node = a.node.as_str();
            for p in &load.pools {
                let pool = fleet.pools.entry(p.name.clone()).or_default();
                pool.proxies += 1;
                pool.queue_depth += u64::from(p.queue_depth);
                for e in &p.endpoints {
                    pool.in_flight += u64::from(e.in_flight);
                    let key = keys
                        .entry(e.addr.as_str())
                        .or_insert_with(|| address_key(&e.addr));
                    let agg = pool.endpoints.entry(key.clone()).or_default();
                    agg.proxies += 1;
                    agg.in_flight += u64::from(e.in_flight);
                    highest(&mut agg.ewma, e.ewma_s, node);
                    highest(&mut agg.p95, e.p95_s, node);
                    if e.circuit != "closed" {
                        agg.circuit_not_closed.add(node);
                    }
                    if e.draining {
                        agg.draining.add(node);
                    }
                    match e.health.as_str() {
                        "" => {}
                        "healthy" => agg.healthy.add(node),
                        "unhealthy" => agg.unhealthy.add(node),
                        _ => agg.health_unknown.add(node),
                    }
                    if !e.suspect.is_empty() {
                        agg.suspect.add(node);
                    }
                    if e.ejected {
                        agg.ejected.add(node);
                    }
                    least(&mut agg.quota_requests, e.quota_requests_remaining, node);
                    least(&mut agg.quota_tokens, e.quota_tokens_remaining, node);
                    if !e.quota_resting.is_empty() {
                        agg.resting.add(node);
                    }
                }
            }
        }
        fleet
    }

    /// Pool `name` as the proxies report it.
    pub(super) fn pool(&self, name: &str) -> Option<&PoolLoad> {
        self.pools.get(name)
    }
}

impl PoolLoad {
    /// Endpoint `addr` (however written) as the proxies report it.
    pub(super) fn endpoint(&self, addr: &str) -> Option<&EndpointLoad> {
        self.endpoints.get(&address_key(addr))
    }
}

/// Seconds as people read a latency: `850 ms`, `1.25 s`, `42 s`.
pub(super) fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.0} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_proto::v1 as pb;

    #[test]
    fn each_key_of_an_endpoint_is_an_endpoint_of_its_own() {
        assert_eq!(
            address_key("https://api.example.com/v1/#A_API_KEY"),
            address_key("https://API.example.com:443/v1#A_API_KEY")
        );
        assert_ne!(
            address_key("https://api.example.com/v1#A_API_KEY"),
            address_key("https://api.example.com/v1#B_API_KEY")
        );
        assert_ne!(
            address_key("https://api.example.com/v1#A_API_KEY"),
            address_key("https://api.example.com/v1")
        );
    }

    fn endpoint(
        addr: &str,
        in_flight: u32,
        ewma: Option<f64>,
        p95: Option<f64>,
    ) -> pb::EndpointLoad {
        pb::EndpointLoad {
            addr: addr.into(),
            in_flight,
            ewma_s: ewma,
            p95_s: p95,
            circuit: "closed".into(),
            ..Default::default()
        }
    }

    fn answer(node: &str, queue_depth: u32, endpoints: Vec<pb::EndpointLoad>) -> ProxyLoad {
        ProxyLoad {
            node: node.into(),
            load: Some(pb::Load {
                id: "q".into(),
                pools: vec![pb::PoolLoad {
                    name: "gpu".into(),
                    queue_depth,
                    endpoints,
                }],
                truncated: false,
            }),
            ..ProxyLoad::default()
        }
    }

    #[test]
    fn sums_in_flight_and_queues_takes_the_highest_latency_and_counts_the_marks() {
        let mut b_ep = endpoint("http://10.0.0.1:8000/", 2, Some(0.9), Some(2.5));
        b_ep.circuit = "open".into();
        b_ep.health = "unhealthy".into();
        b_ep.ejected = true;
        b_ep.suspect = "check".into();
        b_ep.draining = true;
        let mut a_ep = endpoint("10.0.0.1:8000", 3, Some(1.5), Some(2.0));
        a_ep.health = "healthy".into();
        let mut c = answer("edge-c", 0, vec![]);
        if let Some(l) = c.load.as_mut() {
            l.truncated = true;
        }
        let fleet = FleetLoad::of(&[
            answer(
                "edge-a",
                4,
                vec![a_ep, endpoint("10.0.0.2:8000", 1, None, None)],
            ),
            answer("edge-b", 1, vec![b_ep]),
            c,
            ProxyLoad {
                node: "edge-old".into(),
                ..ProxyLoad::default()
            },
        ]);
        assert_eq!((fleet.asked, fleet.answered), (4, 3));
        assert_eq!(fleet.silent, ["edge-old"]);
        assert_eq!(fleet.truncated, ["edge-c"]);
        let gpu = fleet.pool("gpu").unwrap_or_else(|| panic!("no pool"));
        assert_eq!((gpu.proxies, gpu.queue_depth, gpu.in_flight), (3, 5, 6));
        // One endpoint however written.
        let one = gpu
            .endpoint("http://10.0.0.1:8000")
            .unwrap_or_else(|| panic!("not matched"));
        assert_eq!((one.proxies, one.in_flight), (2, 5));
        assert_eq!(
            one.ewma,
            Some(Highest {
                seconds: 1.5,
                node: "edge-a".into()
            })
        );
        assert_eq!(one.p95.as_ref().map(|h| h.node.as_str()), Some("edge-b"));
        for marks in [
            &one.circuit_not_closed,
            &one.unhealthy,
            &one.ejected,
            &one.suspect,
            &one.draining,
        ] {
            assert_eq!((marks.count, marks.names()), (1, "edge-b".to_string()));
        }
        assert_eq!(one.healthy.names(), "edge-a");
        let two = gpu
            .endpoint("10.0.0.2:8000")
            .unwrap_or_else(|| panic!("no"));
        assert_eq!(
            (two.in_flight, two.ewma.clone(), two.p95.clone()),
            (1, None, None)
        );
        assert!(gpu.endpoint("10.0.0.9:8000").is_none());
        assert!(fleet.pool("cloud").is_none());
    }

    #[test]
    fn many_proxies_are_counted_and_a_few_named() {
        let answers: Vec<ProxyLoad> = (0..6)
            .map(|i| {
                let mut e = endpoint("h:1", 0, None, None);
                e.ejected = true;
                answer(&format!("edge-{i}"), 0, vec![e])
            })
            .collect();
        let fleet = FleetLoad::of(&answers);
        let e = fleet
            .pool("gpu")
            .and_then(|p| p.endpoint("h:1"))
            .unwrap_or_else(|| panic!("no endpoint"));
        assert_eq!(e.ejected.count, 6);
        assert_eq!(e.ejected.names(), "edge-0, edge-1, edge-2 and 3 more");
    }

    #[test]
    fn latencies_read_as_people_say_them() {
        assert_eq!(seconds(0.0123), "12 ms");
        assert_eq!(seconds(1.256), "1.26 s");
        assert_eq!(seconds(42.4), "42 s");
    }
}
