//! The proxies under test, run as child processes: the router and nginx.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use tokio::time::Instant;

use crate::load::Conn;
use crate::BoxError;

pub(crate) use router_test_kit::child::ChildGuard;
use router_test_kit::server_process::free_port;

/// The last `max` bytes of a text file, for error messages.
pub(crate) fn tail(path: &Path, max: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let from = bytes.len().saturating_sub(max);
            String::from_utf8_lossy(&bytes[from..]).trim().to_string()
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// How to start the router.
pub(crate) struct RouterSpec<'a> {
    /// The binary.
    pub(crate) bin: &'a Path,
    /// Extra command-line arguments.
    pub(crate) args: &'a [String],
    /// Extra environment, `KEY=VALUE`.
    pub(crate) env: &'a [String],
    /// Where its stderr goes.
    pub(crate) stderr_path: PathBuf,
}

/// Starts the router in sidecar mode, waits for its health endpoint and
/// points it at `backend`.
pub(crate) async fn start_router(
    spec: &RouterSpec<'_>,
    backend: SocketAddr,
) -> Result<(ChildGuard, SocketAddr), BoxError> {
    start_router_with(spec, &[backend]).await
}

/// [`start_router`] with several backends.
pub(crate) async fn start_router_with(
    spec: &RouterSpec<'_>,
    backends: &[SocketAddr],
) -> Result<(ChildGuard, SocketAddr), BoxError> {
    if !spec.bin.is_file() {
        return Err(format!("binary not found at {}", spec.bin.display()).into());
    }
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut cmd = Command::new(spec.bin);
    cmd.args(spec.args)
        .env("CUSTOM_ROUTER_PORT", port.to_string())
        .env("CUSTOM_ROUTER_BIND", "127.0.0.1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&spec.stderr_path)?);
    for kv in spec.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--router-env wants KEY=VALUE, got {kv:?}"))?;
        cmd.env(k, v);
    }
    let mut guard = ChildGuard::spawn("router", &mut cmd)?;

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut conn = Conn::new(addr);
    let mut last_err = String::from("no answer yet");
    loop {
        if let Some(why) = guard.exited() {
            return Err(format!("{why}; stderr: {}", tail(&spec.stderr_path, 2000)).into());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "GET /_custom_router/health did not answer 200 within 20 s (last: {last_err}); stderr: {}",
                tail(&spec.stderr_path, 2000)
            )
            .into());
        }
        match conn
            .request(
                Method::GET,
                "/_custom_router/health",
                Bytes::new(),
                Duration::from_secs(2),
            )
            .await
        {
            Ok((StatusCode::OK, _)) => break,
            Ok((status, body)) => {
                last_err = format!("{status}: {}", String::from_utf8_lossy(&body));
            }
            Err(e) => last_err = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    set_backends_on(&mut conn, backends).await?;
    Ok((guard, addr))
}

/// Posts `backends` as the router's backend set (sidecar mode).
pub(crate) async fn set_backends(
    router: SocketAddr,
    backends: &[SocketAddr],
) -> Result<(), BoxError> {
    set_backends_on(&mut Conn::new(router), backends).await
}

async fn set_backends_on(conn: &mut Conn, backends: &[SocketAddr]) -> Result<(), BoxError> {
    let list: Vec<String> = backends.iter().map(SocketAddr::to_string).collect();
    let body = serde_json::json!({ "backends": list }).to_string();
    let (status, answer) = conn
        .request(
            Method::POST,
            "/_custom_router/set-backends",
            Bytes::from(body),
            Duration::from_secs(5),
        )
        .await
        .map_err(|e| format!("POST /_custom_router/set-backends failed: {e}"))?;
    let parsed: Option<serde_json::Value> = serde_json::from_slice(&answer).ok();
    let ok = parsed
        .as_ref()
        .and_then(|v| v.get("ok"))
        .and_then(serde_json::Value::as_bool)
        == Some(true);
    if status != StatusCode::OK || !ok {
        return Err(format!(
            "POST /_custom_router/set-backends answered {status}: {}",
            String::from_utf8_lossy(&answer)
        )
        .into());
    }
    Ok(())
}

/// Finds nginx: the explicit path, else `nginx` on PATH, else the usual
/// sbin locations (root's PATH has them, other users' often do not).
pub(crate) fn find_nginx(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    let from_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    from_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
}

/// The nginx configuration: a keep-alive reverse proxy, everything inside
/// `dir` so it runs as any user without touching /etc or /var.
fn nginx_config(dir: &Path, port: u16, backend: SocketAddr, workers: usize) -> String {
    let d = dir.display();
    format!(
        r#"daemon off;
master_process on;
worker_processes {workers};
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;

    upstream bench_backend {{
        server {backend};
        keepalive 64;
        keepalive_requests 1000000;
    }}

    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://bench_backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"#
    )
}

/// An nginx that answers every request with `answer` (JSON) itself: the
/// backend of `wrk-yardstick.sh` and of the soak, a server that is not
/// ours and keeps no state.
fn nginx_canned_config(dir: &Path, port: u16, answer: &str) -> String {
    let d = dir.display();
    format!(
        r#"daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx-canned.pid;
error_log {d}/nginx-canned-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;

    server {{
        listen 127.0.0.1:{port};
        location / {{
            default_type application/json;
            return 200 '{answer}';
        }}
    }}
}}
"#
    )
}

/// Starts nginx answering `answer` itself (see [`nginx_canned_config`]).
pub(crate) async fn start_nginx_canned(
    bin: &Path,
    dir: &Path,
    answer: &str,
) -> Result<(ChildGuard, SocketAddr), BoxError> {
    let port = free_port();
    let conf = dir.join("nginx-canned.conf");
    std::fs::write(&conf, nginx_canned_config(dir, port, answer))?;
    run_nginx(bin, dir, &conf, port).await
}

/// Starts nginx as a reverse proxy to `backend` and waits until it accepts
/// connections.
pub(crate) async fn start_nginx(
    bin: &Path,
    dir: &Path,
    backend: SocketAddr,
    workers: usize,
) -> Result<(ChildGuard, SocketAddr), BoxError> {
    let port = free_port();
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_config(dir, port, backend, workers))?;
    run_nginx(bin, dir, &conf, port).await
}

/// Starts nginx with `conf` and waits until it listens on `port`.
async fn run_nginx(
    bin: &Path,
    dir: &Path,
    conf: &Path,
    port: u16,
) -> Result<(ChildGuard, SocketAddr), BoxError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let err_path = dir.join("nginx-stderr.log");
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(conf)
        .arg("-e")
        .arg(dir.join("nginx-error.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err_path)?);
    let mut guard = ChildGuard::spawn("nginx", &mut cmd)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(why) = guard.exited() {
            return Err(format!(
                "{why}; stderr: {}; error.log: {}",
                tail(&err_path, 2000),
                tail(&dir.join("nginx-error.log"), 2000)
            )
            .into());
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok((guard, addr));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "nginx did not listen on {addr} within 10 s; stderr: {}",
                tail(&err_path, 2000)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Aggregate CPU counters from /proc/stat: (busy, total) jiffies.
fn cpu_counters() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let vals: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let total: u64 = vals.iter().take(8).sum();
    let idle = vals.get(3)? + vals.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// How busy the whole machine is (percent of all cores) over `window`,
/// while this harness puts no load on it. `None` where /proc/stat is
/// missing.
pub(crate) fn machine_busy(window: Duration) -> Option<f64> {
    let (b0, t0) = cpu_counters()?;
    std::thread::sleep(window);
    let (b1, t1) = cpu_counters()?;
    let dt = t1.checked_sub(t0)?;
    (dt > 0).then(|| 100.0 * (b1.saturating_sub(b0)) as f64 / dt as f64)
}

/// Whose CPU time to measure.
#[derive(Clone, Debug)]
pub(crate) enum CpuSource {
    /// A process and its direct children.
    Tree(u32),
    /// Threads of this process, by name (the backend, the load generator).
    Thread(&'static str),
    /// The whole machine (all processes, all cores).
    Machine,
}

impl CpuSource {
    /// Total user + system CPU time so far; `None` where /proc is missing.
    pub(crate) fn cpu_time(&self) -> Option<Duration> {
        let ticks = match self {
            Self::Tree(pid) => {
                let mut total = 0;
                for entry in std::fs::read_dir("/proc").ok()?.flatten() {
                    let Some(other) = entry
                        .file_name()
                        .to_str()
                        .and_then(|n| n.parse::<u32>().ok())
                    else {
                        continue;
                    };
                    if let Some((ppid, t)) = stat_ticks(&entry.path().join("stat")) {
                        if other == *pid || ppid == *pid {
                            total += t;
                        }
                    }
                }
                total
            }
            Self::Thread(name) => {
                let mut total = 0;
                for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
                    let comm =
                        std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
                    if comm.trim() == *name {
                        total += stat_ticks(&entry.path().join("stat")).map_or(0, |(_, t)| t);
                    }
                }
                total
            }
            Self::Machine => cpu_counters()?.0,
        };
        Some(Duration::from_secs_f64(
            ticks as f64 / clock_ticks_per_sec(),
        ))
    }
}

/// (parent pid, utime + stime in clock ticks) from a /proc stat file.
fn stat_ticks(path: &Path) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// USER_HZ, from `getconf CLK_TCK` (100 on every usual Linux).
fn clock_ticks_per_sec() -> f64 {
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|hz: &f64| *hz > 0.0)
            .unwrap_or(100.0)
    })
}
