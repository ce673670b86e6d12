//! Active health checks: one task per pool that has them, `GET`ting each
//! endpoint's health path on its own jittered schedule.
//!
//! The rules (thresholds, the first passing check of a new endpoint, the
//! jitter, suspicion) are [`router_policy::health`]'s; this task only does
//! the I/O and hands each result to the pool ([`PoolRuntime::record_check`]).
//!
//! - **Bounded cost.** At most one check in flight per endpoint, each
//!   bounded by the check's timeout (which validation keeps within the
//!   interval); an answer's body is read up to 64 KiB and dropped.
//! - **A new endpoint is checked at once**: the pool wakes this task when
//!   its endpoints change, so an endpoint added by `set-backends` or a
//!   reload waits one round trip, not an interval, for its first check
//!   (it takes no traffic before).
//! - **Jitter.** Each endpoint's next check is `interval ± 10%` from the
//!   end of its last one, so checks started together (a fleet restarted
//!   at once) drift apart instead of arriving at the backends in step.
//! - **What passes**: a `2xx` answer within the timeout. A refused
//!   connection, a reset, a timeout, any other status is a failure.
//!
//! The path is requested from the server's root (`http://host:port/health`),
//! whatever base path the endpoint has: health pages live at the root.

use std::collections::{HashMap, HashSet};
use std::sync::Weak;

use http_body_util::{BodyExt, Limited};
use router_policy::health::HealthCheck;
use router_policy::{Endpoint, Scheme};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::forward::UpstreamClient;
use crate::pool::PoolRuntime;
use crate::probe::Probed;

/// Largest health answer read (then dropped).
const BODY_LIMIT: usize = 64 * 1024;

/// Checks every endpoint of `pool` on its schedule until the pool is gone
/// or the task is aborted (on a config change that alters the checks).
pub(crate) async fn run(pool: Weak<PoolRuntime>, client: UpstreamClient, check: HealthCheck) {
    let mut next: HashMap<Endpoint, Instant> = HashMap::new();
    let mut checking: HashSet<Endpoint> = HashSet::new();
    let mut in_flight: JoinSet<(Endpoint, bool, Instant)> = JoinSet::new();
    loop {
        let Some(p) = pool.upgrade() else { return };
        let now = Instant::now();
        let targets = p.probe_targets();
        next.retain(|e, _| targets.contains(e));
        for t in &targets {
            // A new endpoint is checked at once.
            next.entry(t.clone()).or_insert(now);
        }
        for (endpoint, at) in &next {
            if *at <= now && checking.insert(endpoint.clone()) {
                let (client, endpoint, check) = (client.clone(), endpoint.clone(), check.clone());
                in_flight.spawn(async move {
                    let passed = check_once(&client, &endpoint, &check).await;
                    (endpoint, passed, Instant::now())
                });
            }
        }
        let wake = next
            .iter()
            .filter(|(e, _)| !checking.contains(*e))
            .map(|(_, at)| *at)
            .min()
            .unwrap_or(now + check.interval);
        tokio::select! {
            Some(done) = in_flight.join_next() => {
                if let Ok((endpoint, passed, at)) = done {
                    checking.remove(&endpoint);
                    if next.contains_key(&endpoint) {
                        p.record_check(&endpoint, passed, at);
                        next.insert(endpoint, at + check.next_delay(jitter()));
                    }
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
            _ = p.endpoints_changed() => {}
        }
        // The pool is held only while waiting (bounded by the interval): a
        // pool dropped meanwhile ends the task at the next turn.
        drop(p);
    }
}

/// A random number for the jitter (zero if the system has none to give:
/// then the checks are not spread, which is harmless).
fn jitter() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    u64::from_le_bytes(bytes)
}

/// Checks one endpoint once: a `2xx` within the timeout passes.
pub(crate) async fn check_once(
    client: &UpstreamClient,
    endpoint: &Endpoint,
    check: &HealthCheck,
) -> bool {
    let scheme = match endpoint.scheme() {
        Scheme::Http => "http",
        Scheme::Https => "https",
    };
    let uri = http::Uri::builder()
        .scheme(scheme)
        .authority(endpoint.authority())
        .path_and_query(check.path.as_str())
        .build();
    let Ok(uri) = uri else {
        return false;
    };
    let Ok(req) = http::Request::get(uri)
        .header(http::header::USER_AGENT, "llm-router-health-check")
        .body(crate::upstream::OutBody::default())
    else {
        return false;
    };
    let work = async {
        let resp = client.request(req).await.ok()?;
        let ok = resp.status().is_success();
        // Read (a bounded part of) the body so the connection can be kept.
        let _ = Limited::new(resp.into_body(), BODY_LIMIT).collect().await;
        Some(ok)
    };
    match tokio::time::timeout(check.timeout, work).await {
        Ok(Some(ok)) => ok,
        Ok(None) | Err(_) => {
            tracing::debug!(endpoint = %endpoint, path = %check.path, "health check failed");
            false
        }
    }
}
