//! `count-load`: a fixed number of benchmark requests, for instruction
//! counts.
//!
//! Starts the benchmark's in-process backend, points a running router at
//! it (`POST /_custom_router/set-backends`), then sends exactly
//! `--requests` benchmark requests over `--concurrency` keep-alive
//! connections (closed loop) and exits. Run the router under
//! `valgrind --tool=callgrind` and divide its instruction count by the
//! requests (see docs/benchmarks.md, "Instructions per request").

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The error type of the tool.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

const REQUEST_BODY: &str = r#"{"model":"bench","messages":[{"role":"user","content":"hi"}]}"#;

/// The same request from an Anthropic Messages client (`--anthropic`):
/// translated by the router to the chat request above (with `max_tokens`)
/// and its answer back.
const MESSAGES_BODY: &str =
    r#"{"model":"bench","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;

/// Send a fixed number of benchmark requests to a router.
#[derive(Debug, Parser)]
#[command(name = "count-load")]
struct Args {
    /// The router's address.
    #[arg(long, default_value = "127.0.0.1:3000")]
    target: SocketAddr,
    /// Requests to send (after the warmup).
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// Requests sent first and not counted.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Keep-alive connections.
    #[arg(long, default_value_t = 8)]
    concurrency: u64,
    /// Run this command (through `sh -c`) between the warmup and the
    /// counted requests, e.g. `callgrind_control -z PID`.
    #[arg(long)]
    between: Option<String>,
    /// Run this command after the counted requests, e.g.
    /// `callgrind_control -d PID`.
    #[arg(long)]
    after: Option<String>,
    /// Wait up to this many seconds for the router to accept connections
    /// (one that was just started, perhaps under valgrind).
    #[arg(long, default_value_t = 0)]
    wait_ready: u64,
    /// Send the request as an Anthropic Messages client does (`POST
    /// /v1/messages`), for the cost of its translation.
    #[arg(long)]
    anthropic: bool,
    /// Only serve: start the backend, run `--between` with its address in
    /// `BENCH_BACKEND` (`127.0.0.1:PORT`), and exit when it is done (for a
    /// load generator of another protocol, e.g. `h2load`; see
    /// bench/listener-callgrind.sh).
    #[arg(long)]
    serve_only: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("count-load: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("count-load: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), BoxError> {
    let backend = router_mock::fixed::Backend::start()?;
    if args.serve_only {
        let cmd = args.between.as_deref().unwrap_or("true");
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .env("BENCH_BACKEND", backend.addr.to_string())
            .status()?;
        println!("backend_hits={}", backend.hits());
        return match status.success() {
            true => Ok(()),
            false => Err(format!("{cmd:?} failed: {status}").into()),
        };
    }
    let ready_by = Instant::now() + Duration::from_secs(args.wait_ready);
    let mut admin = loop {
        match connect(args.target).await {
            Ok(c) => break c,
            Err(_) if Instant::now() < ready_by => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let body = format!(r#"{{"backends":["{}"]}}"#, backend.addr);
    let (status, answer) = send(
        &mut admin,
        args.target,
        "/_custom_router/set-backends",
        body.into(),
    )
    .await?;
    if status != StatusCode::OK {
        return Err(format!("set-backends answered {status}: {answer:?}").into());
    }
    let mut conns = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        conns.push(connect(args.target).await?);
    }
    let request = if args.anthropic {
        ("/v1/messages", MESSAGES_BODY)
    } else {
        ("/v1/chat/completions", REQUEST_BODY)
    };
    let (conns, failed) = phase(args.target, conns, args.warmup, request).await?;
    if let Some(cmd) = &args.between {
        shell(cmd)?;
    }
    let started = Instant::now();
    let (_, failed_counted) = phase(args.target, conns, args.requests, request).await?;
    let secs = started.elapsed().as_secs_f64();
    if let Some(cmd) = &args.after {
        shell(cmd)?;
    }
    println!(
        "requests={} errors={} warmup={} warmup_errors={} seconds={secs:.2} backend_hits={}",
        args.requests,
        failed_counted,
        args.warmup,
        failed,
        backend.hits()
    );
    if failed + failed_counted > 0 {
        return Err("some requests failed".into());
    }
    Ok(())
}

fn shell(cmd: &str) -> Result<(), BoxError> {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()?;
    if !status.success() {
        return Err(format!("{cmd:?} failed: {status}").into());
    }
    // Let callgrind act on the request before the next phase starts.
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}

/// Sends `n` requests spread over the connections; returns them and the
/// number of failures.
async fn phase(
    target: SocketAddr,
    conns: Vec<SendRequest<Full<Bytes>>>,
    n: u64,
    (path, body): (&'static str, &'static str),
) -> Result<(Vec<SendRequest<Full<Bytes>>>, u64), BoxError> {
    let k = conns.len() as u64;
    let mut tasks = Vec::new();
    for (i, mut conn) in conns.into_iter().enumerate() {
        let share = n / k + u64::from((i as u64) < n % k);
        tasks.push(tokio::spawn(async move {
            let mut failed = 0u64;
            for _ in 0..share {
                match send(&mut conn, target, path, Bytes::from_static(body.as_bytes())).await {
                    Ok((StatusCode::OK, _)) => {}
                    _ => failed += 1,
                }
            }
            (conn, failed)
        }));
    }
    let mut conns = Vec::new();
    let mut failed = 0;
    for t in tasks {
        let (c, f) = t.await?;
        conns.push(c);
        failed += f;
    }
    Ok((conns, failed))
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, BoxError> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn send(
    conn: &mut SendRequest<Full<Bytes>>,
    target: SocketAddr,
    path: &str,
    body: Bytes,
) -> Result<(StatusCode, Bytes), BoxError> {
    conn.ready().await?;
    let req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(HOST, target.to_string())
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))?;
    let resp = tokio::time::timeout(Duration::from_secs(60), conn.send_request(req)).await??;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}
