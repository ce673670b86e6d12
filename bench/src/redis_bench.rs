//! What the Redis benchmarks share: a throwaway `redis-server` on
//! loopback, percentiles, the load average. Included by the benchmark
//! binaries with `#[path]`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A `redis-server` child, killed when dropped.
pub(crate) struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `redis-server` on a free loopback port, persistence off.
pub(crate) fn start_redis() -> Result<(Redis, u16), BoxError> {
    let bin = std::env::var("REDIS_SERVER_BIN")
        .map_or_else(|_| PathBuf::from("/usr/bin/redis-server"), PathBuf::from);
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new(&bin)
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    Ok((Redis(child), port))
}

/// The `p` quantile of `sorted`, ms.
pub(crate) fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[rank].as_secs_f64() * 1e3
}

/// `/proc/loadavg`'s first three fields (the machine's other load shows
/// in the tail).
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// A proxy in-process (loopback, one worker) with `policy`, its keys and
/// limits in the Redis on `port`; returns once it has connected.
pub(crate) async fn proxy_on_redis(
    policy: &str,
    port: u16,
) -> Result<router_proxy::RunningProxy, BoxError> {
    let policy = router_policy::document::load(policy, &router_policy::QueueSettings::default())
        .map_err(|e| e.to_string())?;
    let settings = router_proxy::Settings {
        bind: [127, 0, 0, 1].into(),
        port: 0,
        workers: 1,
        shared_store: Some(router_proxy::SharedStore::new(&format!(
            "redis://127.0.0.1:{port}/0"
        ))?),
        ..router_proxy::Settings::default()
    };
    let p = router_proxy::start(router_proxy::ProxyOptions {
        settings,
        mode: router_proxy::Mode::Inline(Box::new(policy)),
        route_log: Box::new(std::io::sink()),
    })
    .await?;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !p.shared_store_connected() {
        if std::time::Instant::now() > until {
            return Err("the proxy did not connect to redis".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(p)
}
