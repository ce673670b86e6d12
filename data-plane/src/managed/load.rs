//! The proxy's load, sent when the control plane asks over the config
//! stream (the console's Pools page): each pool's queue depth and each
//! endpoint's requests in flight, latency EWMA and p95, circuit, drain,
//! health, suspicion, ejection and quota (what its provider's rate-limit
//! headers said is left), from the pools' status
//! (`Snapshot::pool_status`, what the health details show).
//!
//! One message, bounded so it stays under the control plane's
//! per-message limit (`router_proto::MAX_PROXY_MESSAGE_BYTES`, 64 KiB):
//! every pool first (name and queue depth), then endpoints in the
//! policy's order while there are at most [`LOAD_ENDPOINTS_MAX`] (512) and
//! their encoding fits in [`LOAD_BYTES_MAX`]. The endpoints past either
//! cap are left out and `truncated` says so (the page shows it).

use prost::Message;
use router_proto::v1 as pb;
use router_proto::LOAD_ENDPOINTS_MAX;

use crate::pool::{EndpointStatus, PoolStatus};

/// Bytes the pools and endpoints may take encoded: 8 KiB under
/// `router_proto::MAX_PROXY_MESSAGE_BYTES` for the id and the framing.
pub(crate) const LOAD_BYTES_MAX: usize = router_proto::MAX_PROXY_MESSAGE_BYTES - 8 * 1024;

/// What a repeated field adds around an entry of `len` bytes at most: its
/// tag and length, and the growth of the enclosing pool's length prefix.
const FRAMING: usize = 8;

fn endpoint_load(e: &EndpointStatus) -> pb::EndpointLoad {
    pb::EndpointLoad {
        addr: e.addr.to_string(),
        in_flight: e.in_flight,
        ewma_s: e.ewma_s,
        p95_s: e.p95_s,
        circuit: e.circuit.as_str().to_string(),
        draining: e.draining,
        health: e.health.map(|h| h.as_str()).unwrap_or_default().to_string(),
        suspect: e
            .suspect
            .map(|c| c.as_str())
            .unwrap_or_default()
            .to_string(),
        ejected: e.ejected,
        quota_requests_remaining: e.quota.and_then(|q| q.requests_remaining),
        quota_tokens_remaining: e.quota.and_then(|q| q.tokens_remaining),
        quota_requests_reset_s: e.quota.and_then(|q| q.requests_reset_s),
        quota_resting: e
            .quota
            .and_then(|q| q.resting)
            .unwrap_or_default()
            .to_string(),
    }
}

/// The answer to the load request `id`: `pools` as one `Load` message,
/// within [`LOAD_ENDPOINTS_MAX`] and [`LOAD_BYTES_MAX`].
pub(crate) fn load_answer(id: &str, pools: &[PoolStatus]) -> pb::ProxyMessage {
    let budget = LOAD_BYTES_MAX.saturating_sub(id.len());
    let mut used = 0usize;
    let mut truncated = false;
    let mut out: Vec<pb::PoolLoad> = Vec::with_capacity(pools.len());
    for p in pools {
        let pool = pb::PoolLoad {
            name: p.name.to_string(),
            queue_depth: u32::try_from(p.queue_depth).unwrap_or(u32::MAX),
            endpoints: Vec::new(),
        };
        let len = pool.encoded_len() + FRAMING;
        if used + len > budget {
            truncated = true;
            break;
        }
        used += len;
        out.push(pool);
    }
    let mut endpoints = 0usize;
    'pools: for (status, pool) in pools.iter().zip(out.iter_mut()) {
        for e in &status.endpoints {
            let e = endpoint_load(e);
            let len = e.encoded_len() + FRAMING;
            if endpoints >= LOAD_ENDPOINTS_MAX || used + len > budget {
                truncated = true;
                break 'pools;
            }
            used += len;
            endpoints += 1;
            pool.endpoints.push(e);
        }
    }
    pb::ProxyMessage {
        msg: Some(pb::proxy_message::Msg::LoadAnswer(pb::Load {
            id: id.to_string(),
            pools: out,
            truncated,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::CircuitState;
    use router_policy::health::{Health, SuspectCause};
    use std::sync::Arc;

    fn endpoint(addr: &str) -> EndpointStatus {
        EndpointStatus {
            addr: Arc::from(addr),
            in_flight: 0,
            ewma_s: None,
            tpot_s: None,
            p95_s: None,
            circuit: CircuitState::Closed,
            draining: false,
            health: None,
            suspect: None,
            ejected: false,
            quota: None,
        }
    }

    fn pool(name: &str, queue_depth: usize, endpoints: Vec<EndpointStatus>) -> PoolStatus {
        PoolStatus {
            name: Arc::from(name),
            queue_depth,
            oldest_wait: None,
            endpoints,
        }
    }

    fn load(m: pb::ProxyMessage) -> pb::Load {
        match m.msg {
            Some(pb::proxy_message::Msg::LoadAnswer(l)) => l,
            other => panic!("not a load answer: {other:?}"),
        }
    }

    #[test]
    fn every_field_of_the_pools_status_is_carried_over() {
        let busy = EndpointStatus {
            in_flight: 3,
            ewma_s: Some(0.25),
            p95_s: Some(1.5),
            circuit: CircuitState::HalfOpen,
            draining: true,
            health: Some(Health::Unhealthy),
            suspect: Some(SuspectCause::Check),
            ejected: true,
            quota: Some(crate::pool::QuotaStatus {
                requests_remaining: Some(0),
                requests_reset_s: Some(1.5),
                tokens_remaining: Some(900),
                tokens_reset_s: Some(6.0),
                resting: Some("requests"),
            }),
            ..endpoint("http://10.0.0.1:8000/v1")
        };
        let got = load(load_answer(
            "q1",
            &[
                pool("gpu", 7, vec![busy, endpoint("http://10.0.0.2:8000")]),
                pool("cloud", 0, vec![]),
            ],
        ));
        assert_eq!(got.id, "q1");
        assert!(!got.truncated);
        assert_eq!(got.pools.len(), 2);
        let gpu = &got.pools[0];
        assert_eq!((gpu.name.as_str(), gpu.queue_depth), ("gpu", 7));
        assert_eq!(
            gpu.endpoints[0],
            pb::EndpointLoad {
                addr: "http://10.0.0.1:8000/v1".into(),
                in_flight: 3,
                ewma_s: Some(0.25),
                p95_s: Some(1.5),
                circuit: "half_open".into(),
                draining: true,
                health: "unhealthy".into(),
                suspect: "check".into(),
                ejected: true,
                quota_requests_remaining: Some(0),
                quota_tokens_remaining: Some(900),
                quota_requests_reset_s: Some(1.5),
                quota_resting: "requests".into(),
            }
        );
        let idle = &gpu.endpoints[1];
        assert_eq!((idle.ewma_s, idle.p95_s), (None, None), "not measured");
        assert_eq!(
            (
                idle.circuit.as_str(),
                idle.health.as_str(),
                idle.suspect.as_str()
            ),
            ("closed", "", "")
        );
        assert_eq!(got.pools[1].name, "cloud");
        assert!(got.pools[1].endpoints.is_empty());
    }

    #[test]
    fn a_fleet_of_endpoints_is_cut_at_the_cap_and_says_so_under_the_message_limit() {
        // Many endpoints with long addresses: the bytes cap bites first.
        let long: Vec<PoolStatus> = (0..40)
            .map(|p| {
                let endpoints = (0..40)
                    .map(|e| {
                        endpoint(&format!(
                            "https://{}.example.com:8443/{}",
                            "h".repeat(200),
                            p * 100 + e
                        ))
                    })
                    .collect();
                pool(&format!("pool-{p}"), 5, endpoints)
            })
            .collect();
        let m = load_answer(&"i".repeat(36), &long);
        assert!(
            m.encoded_len() < router_proto::MAX_PROXY_MESSAGE_BYTES,
            "{}",
            m.encoded_len()
        );
        let got = load(m);
        assert!(got.truncated);
        assert_eq!(got.pools.len(), 40, "every pool's queue depth still comes");
        assert!(got.pools.iter().all(|p| p.queue_depth == 5));
        let sent: usize = got.pools.iter().map(|p| p.endpoints.len()).sum();
        assert!(sent > 100 && sent < 1600, "{sent}");
        // Short addresses: the count cap bites.
        let short: Vec<PoolStatus> = (0..2)
            .map(|p| {
                pool(
                    &format!("p{p}"),
                    0,
                    (0..400).map(|e| endpoint(&format!("h:{e}"))).collect(),
                )
            })
            .collect();
        let got = load(load_answer("q", &short));
        assert!(got.truncated);
        assert_eq!(got.pools[0].endpoints.len(), 400);
        assert_eq!(got.pools[1].endpoints.len(), LOAD_ENDPOINTS_MAX - 400);
    }
}
