//! A proxy in-process, on a Redis store or its own (the benchmarks' setup).

use std::time::Duration;

use crate::BoxError;

/// A proxy in-process (loopback, one worker) with `policy`, its keys and
/// limits in the Redis on `port`; returns once it has connected.
pub async fn on_redis(policy: &str, port: u16) -> Result<router_proxy::RunningProxy, BoxError> {
    inline(policy, Some(port)).await
}

/// A proxy serving `policy` on loopback with one worker thread, its
/// shared store the Redis on `redis_port` (connected before it returns)
/// or none.
pub async fn inline(
    policy: &str,
    redis_port: Option<u16>,
) -> Result<router_proxy::RunningProxy, BoxError> {
    let policy = router_policy::document::load(policy, &router_policy::QueueSettings::default())
        .map_err(|e| e.to_string())?;
    let shared_store = match redis_port {
        Some(port) => Some(router_proxy::SharedStore::new(&format!(
            "redis://127.0.0.1:{port}/0"
        ))?),
        None => None,
    };
    let settings = router_proxy::Settings {
        bind: [127, 0, 0, 1].into(),
        port: 0,
        workers: 1,
        shared_store,
        ..router_proxy::Settings::default()
    };
    let p = router_proxy::start(router_proxy::ProxyOptions {
        settings,
        mode: router_proxy::Mode::Inline(Box::new(policy)),
        route_log: Box::new(std::io::sink()),
    })
    .await?;
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while redis_port.is_some() && !p.shared_store_connected() {
        if tokio::time::Instant::now() > until {
            return Err("the proxy did not connect to redis".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(p)
}
