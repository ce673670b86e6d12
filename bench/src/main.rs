//! `proxy-bench`: measures the latency the router adds in front of a model
//! server, and its throughput, against calling the server directly and
//! against nginx as a reference reverse proxy.
//!
//! See `bench/README.md` for what it measures and its caveats.
//!
//! - `backend`: the in-process model server (a fixed JSON answer);
//! - `procs`: the router and nginx as child processes, started and stopped;
//! - `load`: the fixed-rate and closed-loop load generators;
//! - `report`: percentiles, ratios and the text or JSON report.

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod load;
mod procs;
mod report;
mod soak;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hyper::{Method, StatusCode};

use crate::load::{Conn, LoadConfig, REQUEST_BODY, REQUEST_PATH};
use crate::procs::{ChildGuard, CpuSource, RouterSpec};
use crate::report::{FixedStats, MaxStats, Report, Settings, TargetResult};
use router_mock::fixed::{Backend, RESPONSE_BODY};

/// The load generator's threads' name (their CPU time is read by it).
const CLIENT_THREAD_NAME: &str = "bench-client";

/// The error type of the harness.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What can be benchmarked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Target {
    /// The in-process backend, no proxy.
    Direct,
    /// The router (`router-proxy`) in sidecar mode.
    Router,
    /// nginx as a keep-alive reverse proxy.
    Nginx,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Router => "router",
            Self::Nginx => "nginx",
        }
    }
}

/// Benchmark the router's data plane against direct calls and nginx.
#[derive(Debug, Parser)]
#[command(name = "proxy-bench", version)]
struct Args {
    /// Fixed-rate phase: requests per second (open loop).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Measured seconds of each phase.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of each phase that are run but not measured.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Keep-alive connections (one worker each) in both phases.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Per-request timeout in seconds (a timeout counts as an error).
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Worker threads of the load generator's runtime. The backend has its
    /// own single thread.
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// Targets to run, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,router,nginx"
    )]
    targets: Vec<Target>,
    /// The router binary [default: router-proxy next to this binary].
    #[arg(long)]
    router_bin: Option<PathBuf>,
    /// Extra argument for the router (repeatable).
    #[arg(long = "router-arg", allow_hyphen_values = true)]
    router_args: Vec<String>,
    /// Extra environment for the router, KEY=VALUE (repeatable).
    #[arg(long = "router-env")]
    router_env: Vec<String>,
    /// The nginx binary [default: nginx on PATH, or /usr/sbin/nginx].
    #[arg(long)]
    nginx_bin: Option<PathBuf>,
    /// nginx worker_processes (the router's runtime uses all cores too).
    #[arg(long, default_value_t = 2)]
    nginx_workers: usize,
    /// Run all targets this many times (interleaved); the summary takes the
    /// median of each number across rounds.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Before each target, wait up to this many seconds for the machine to
    /// be quiet (under 15% CPU used by other processes); 0 = just check.
    #[arg(long, default_value_t = 0.0)]
    wait_idle: f64,
    /// Measure a target again (up to this many times) when other processes
    /// disturbed it (see --wait-idle); the last try is reported.
    #[arg(long, default_value_t = 0)]
    retry_disturbed: usize,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Keep the temp dir (router stderr, nginx config and logs).
    #[arg(long)]
    keep_tmp: bool,
}

fn main() -> ExitCode {
    // `proxy-bench soak ...`: the long run of `soak.rs`, its own flags.
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some("soak") {
        return soak::main(argv.collect());
    }
    let args = Args::parse();
    match run(&args) {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("proxy-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn seconds(name: &str, v: f64) -> Result<Duration, BoxError> {
    Duration::try_from_secs_f64(v).map_err(|e| format!("--{name} {v}: {e}").into())
}

pub(crate) fn default_router_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("router-proxy")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("target/release/router-proxy"))
}

/// A temp dir removed on drop unless asked to keep it.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    fn new(keep: bool) -> Result<Self, BoxError> {
        let path = std::env::temp_dir().join(format!("proxy-bench-{}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
        std::fs::create_dir_all(&path)?;
        Ok(Self { path, keep })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("kept {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn run(args: &Args) -> Result<Report, BoxError> {
    if args.concurrency == 0 || args.rate == 0 || args.client_threads == 0 {
        return Err("--concurrency, --rate and --client-threads must be positive".into());
    }
    let cfg = LoadConfig {
        concurrency: args.concurrency,
        warmup: seconds("warmup", args.warmup)?,
        duration: seconds("duration", args.duration)?,
        timeout: seconds("timeout", args.timeout)?,
    };
    if cfg.duration.is_zero() {
        return Err("--duration must be positive".into());
    }
    let tmp = TempDir::new(args.keep_tmp)?;
    let backend = Backend::start()?;
    eprintln!("backend listening on {}", backend.addr);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads)
        .thread_name(CLIENT_THREAD_NAME)
        .enable_all()
        .build()?;

    rt.spawn(stop_on_signal(tmp.path.clone(), args.keep_tmp));
    let env = Env {
        args,
        cfg,
        rt: &rt,
        backend: &backend,
        tmp: &tmp.path,
        router_bin: args.router_bin.clone().unwrap_or_else(default_router_bin),
    };
    let mut rounds = Vec::new();
    for round in 1..=args.rounds.max(1) {
        if args.rounds > 1 {
            eprintln!("--- round {round} of {}", args.rounds);
        }
        let mut results = Vec::new();
        for &target in &args.targets {
            let mut result = measure_target(&env, target);
            let mut retries = 0;
            while result.disturbed && retries < args.retry_disturbed {
                retries += 1;
                eprintln!(
                    "{}: disturbed by other processes; measuring it again ({retries} of {})",
                    target.name(),
                    args.retry_disturbed
                );
                result = measure_target(&env, target);
            }
            if retries > 0 {
                result.warnings.push(format!(
                    "measured {} times: earlier tries were disturbed by other processes",
                    retries + 1
                ));
            }
            results.push(result);
            std::thread::sleep(Duration::from_millis(500));
        }
        rounds.push(results);
    }
    drop(backend);
    Ok(Report::new(
        Settings {
            rate: args.rate,
            warmup_s: args.warmup,
            duration_s: args.duration,
            concurrency: args.concurrency,
            client_threads: args.client_threads,
            nginx_workers: args.nginx_workers.max(1),
            rounds: args.rounds.max(1),
        },
        rounds,
    ))
}

/// Above this CPU use (percent of the machine) by others, a target's
/// numbers are flagged as disturbed.
const BUSY_LIMIT_PCT: f64 = 15.0;

/// On SIGINT or SIGTERM: stop the children (nginx, the router), remove the
/// temp dir and exit 130; the normal clean-up does not run on a signal.
async fn stop_on_signal(tmp: PathBuf, keep_tmp: bool) {
    // A handler that cannot be installed must not look like a signal.
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let interrupted = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    () = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => ctrl_c.await,
        }
    };
    #[cfg(not(unix))]
    let interrupted = ctrl_c;
    interrupted.await;
    eprintln!("proxy-bench: interrupted; stopping children");
    router_test_kit::child::terminate_children();
    if !keep_tmp {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    std::process::exit(130);
}

/// Above this CPU use by processes other than the target, the backend and
/// the load generator during a phase (percent of one core), the phase is
/// flagged as disturbed.
const OTHER_LIMIT_PCT: f64 = 20.0;

/// Samples how busy the machine is before loading a target; with
/// `wait_idle` > 0, keeps sampling up to that many seconds until it is
/// quiet.
fn quiet_check(wait_idle: f64) -> Option<f64> {
    // Quiet means this many 0.5 s samples in a row under the limit: a
    // build has short lulls between its steps.
    const QUIET_SAMPLES: usize = 4;
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(wait_idle.max(0.0));
    let mut announced = false;
    let mut quiet = 0;
    loop {
        let busy = procs::machine_busy(Duration::from_millis(500))?;
        quiet = if busy <= BUSY_LIMIT_PCT { quiet + 1 } else { 0 };
        let waiting = std::time::Instant::now() < deadline;
        if busy > BUSY_LIMIT_PCT && !waiting {
            return Some(busy);
        }
        if quiet >= QUIET_SAMPLES || (quiet > 0 && !waiting) {
            return Some(busy);
        }
        if busy > BUSY_LIMIT_PCT && !announced {
            eprintln!("machine {busy:.0}% busy with other work; waiting up to {wait_idle} s for it to quiet down ...");
            announced = true;
        }
    }
}

/// What measuring one target needs.
struct Env<'a> {
    args: &'a Args,
    cfg: LoadConfig,
    rt: &'a tokio::runtime::Runtime,
    backend: &'a Backend,
    tmp: &'a std::path::Path,
    router_bin: PathBuf,
}

/// Starts `target` (if it is a process), runs both phases against it and
/// stops it again.
fn measure_target(env: &Env<'_>, target: Target) -> TargetResult {
    let (args, cfg, rt, backend) = (env.args, env.cfg, env.rt, env.backend);
    let name = target.name();
    let mut result = TargetResult {
        name,
        ..TargetResult::default()
    };
    let started: Result<(Option<ChildGuard>, std::net::SocketAddr), BoxError> = match target {
        Target::Direct => Ok((None, backend.addr)),
        Target::Router => {
            let spec = RouterSpec {
                bin: &env.router_bin,
                args: &args.router_args,
                env: &args.router_env,
                stderr_path: env.tmp.join("router-stderr.log"),
            };
            rt.block_on(procs::start_router(&spec, backend.addr))
                .map(|(g, a)| (Some(g), a))
        }
        Target::Nginx => match procs::find_nginx(args.nginx_bin.as_deref()) {
            None => Err("nginx not found on PATH (install it or pass --nginx-bin)".into()),
            Some(bin) => rt
                .block_on(procs::start_nginx(
                    &bin,
                    env.tmp,
                    backend.addr,
                    args.nginx_workers.max(1),
                ))
                .map(|(g, a)| (Some(g), a)),
        },
    };
    let (mut guard, addr) = match started {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name} not available: {e}");
            result.unavailable = Some(e.to_string());
            return result;
        }
    };
    if let Err(e) = rt.block_on(check_target(addr, &mut result)) {
        eprintln!("{name} not available: {e}");
        result.unavailable = Some(e.to_string());
        return result;
    }
    result.busy_before_pct = quiet_check(args.wait_idle);
    if let Some(busy) = result.busy_before_pct {
        if busy > BUSY_LIMIT_PCT {
            let w = format!(
                "the machine was {busy:.0}% busy with other work just before this target: numbers are disturbed"
            );
            eprintln!("{name}: warning: {w}");
            result.warnings.push(w);
            result.disturbed = true;
        }
    }
    let hits_before = backend.hits();
    eprintln!(
        "{name} ({addr}): fixed rate {} req/s for {} s + {} s warmup ...",
        args.rate, args.duration, args.warmup
    );
    // CPU of: the target, the backend thread, the load generator's threads,
    // the whole machine.
    let cpu = vec![
        match &guard {
            Some(g) => CpuSource::Tree(g.pid()),
            None => CpuSource::Thread(router_mock::fixed::THREAD_NAME),
        },
        CpuSource::Thread(router_mock::fixed::THREAD_NAME),
        CpuSource::Thread(CLIENT_THREAD_NAME),
        CpuSource::Machine,
    ];
    let fixed = FixedStats::from_run(
        rt.block_on(load::fixed_rate(addr, args.rate, cfg, cpu.clone())),
        cfg.duration.as_secs_f64(),
    );
    eprintln!(
        "{name}: closed loop, {} connections, {} s + {} s warmup ...",
        args.concurrency, args.duration, args.warmup
    );
    let max = rt.block_on(load::max_throughput(addr, cfg, cpu));
    result.max = Some(MaxStats::from_run(&max, cfg.duration.as_secs_f64()));
    result.fixed = Some(fixed);
    result.backend_hits = backend.hits() - hits_before;
    if target == Target::Router {
        match rt.block_on(route_log_dropped(addr)) {
            Ok(Some(0)) => {}
            Ok(Some(n)) => result.warnings.push(format!(
                "router_route_log_dropped_total = {n}: the router dropped route-log lines"
            )),
            Ok(None) => result
                .warnings
                .push("router_route_log_dropped_total not found in /metrics".into()),
            Err(e) => result.warnings.push(format!("GET /metrics failed: {e}")),
        }
    }
    for (phase, other) in [
        (
            "fixed-rate",
            result.fixed.as_ref().and_then(|f| f.other_cpu_pct),
        ),
        ("max-throughput", result.max.and_then(|m| m.other_cpu_pct)),
    ] {
        if let Some(other) = other.filter(|&o| o > OTHER_LIMIT_PCT) {
            let w = format!(
                "other processes used {other:.0}% of a core during the {phase} phase: numbers are disturbed"
            );
            eprintln!("{name}: warning: {w}");
            result.warnings.push(w);
            result.disturbed = true;
        }
    }
    if let Some(g) = guard.as_mut() {
        if let Some(why) = g.exited() {
            result.warnings.push(format!("{why} during the run"));
        }
    }
    result
}

/// The router's `router_route_log_dropped_total` (lines of the per-request
/// JSON log it dropped because stdout could not keep up).
async fn route_log_dropped(addr: std::net::SocketAddr) -> Result<Option<u64>, BoxError> {
    let (status, body) = Conn::new(addr)
        .request(
            Method::GET,
            "/metrics",
            Bytes::new(),
            Duration::from_secs(5),
        )
        .await?;
    if status != StatusCode::OK {
        return Err(format!("answered {status}").into());
    }
    let text = String::from_utf8_lossy(&body);
    Ok(text
        .lines()
        .filter(|l| l.starts_with("router_route_log_dropped_total"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .reduce(|a, b| a + b))
}

/// One request through the target before loading it: it must answer 200;
/// a body different from the backend's is noted as a warning.
async fn check_target(
    addr: std::net::SocketAddr,
    result: &mut TargetResult,
) -> Result<(), BoxError> {
    let mut conn = Conn::new(addr);
    let (status, body) = conn
        .request(
            Method::POST,
            REQUEST_PATH,
            Bytes::from_static(REQUEST_BODY.as_bytes()),
            Duration::from_secs(5),
        )
        .await
        .map_err(|e| format!("check request failed: {e}"))?;
    if status != StatusCode::OK {
        return Err(format!(
            "check request answered {status}: {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
    if body != RESPONSE_BODY.as_bytes() {
        result.warnings.push(format!(
            "answer body differs from the backend's ({} bytes vs {})",
            body.len(),
            RESPONSE_BODY.len()
        ));
    }
    Ok(())
}
