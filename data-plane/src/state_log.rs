//! The periodic backend-state log line (`CUSTOM_ROUTER_STATE_LOG_INTERVAL`):
//! one `router_proxy::state` line per pool on stderr, with each endpoint's
//! requests in flight and EWMA, the queue and the policy version.

use std::sync::Arc;

use crate::Shared;

/// The periodic backend-state log line, one per pool, on stderr.
pub(crate) async fn state_log(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(shared.settings.state_log_interval);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let snapshot = shared.config.load();
        for pool in snapshot.pool_status() {
            let backends: Vec<String> = pool
                .endpoints
                .iter()
                .map(|e| match e.ewma_s {
                    Some(s) => format!(
                        "{} in_flight={} ewma_ms={:.1}",
                        e.addr,
                        e.in_flight,
                        s * 1e3
                    ),
                    None => format!("{} in_flight={} ewma_ms=untried", e.addr, e.in_flight),
                })
                .collect();
            tracing::info!(
                target: "router_proxy::state",
                pool = &*pool.name,
                queue_depth = pool.queue_depth,
                oldest_wait_ms = pool.oldest_wait.map_or(0, |d| d.as_millis() as u64),
                version = &*snapshot.version,
                backends = %backends.join(", "),
                "backend state"
            );
        }
    }
}
