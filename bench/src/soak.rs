//! `proxy-bench soak`: does the proxy's memory stay proportional to what
//! it keeps, over a long run of the traffic it meets in production?
//!
//! A load test measures a few seconds; a leak, a cache that keeps more
//! than it should, or descriptors that pile up show only over tens of
//! minutes (issue #22: the idempotency store kept 18 KB per 300-byte
//! answer, 200 MB in all, visible only from outside). This mode runs the
//! real `router-proxy` binary in sidecar mode as a child process, sends
//! traffic for `--duration`, and every `--sample-every` reads the proxy's
//! resident memory (`VmRSS` in `/proc/PID/status`), its open descriptors
//! (`/proc/PID/fd`) and its threads; then it prints the samples as a table
//! and a verdict against four rules: RSS under `--max-rss-mb` at every
//! sample, RSS growth under `--max-growth-pct` over the last
//! `--growth-window` (20 min; two thirds of a shorter run), and
//! descriptors and threads flat over that window.
//!
//! Two mixes (`--mix`):
//!
//! - `issue`: issue #22's soak. An nginx-served canned answer (about 300
//!   bytes) as the only backend; each connection sends, in turn, a plain
//!   request, one with a fresh `Idempotency-Key`, and one with malformed
//!   JSON, with `--think` between requests.
//! - `mixed`: every kind of traffic at once. Two in-process model
//!   servers that answer JSON, or a slow SSE stream (`"stream": true`: 20
//!   frames 10 ms apart), one of them flapping (its listener closed and
//!   opened again every `--flap-every`). Requests in turn:
//!   plain, keyed (fresh key), streamed (read to the end), malformed
//!   JSON, a keyed retry (the same key again: a replay), and a streamed
//!   request whose client disconnects after the first frame. Every
//!   `--reload-every` the backend set is posted again, with and without
//!   the flapping backend (a config reload in sidecar mode).
//!
//! Nothing here is timed against a threshold but the memory: the status
//! counts are printed for the reader.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1 as client_http1;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::load::REQUEST_PATH;
use crate::procs::{self, RouterSpec};
use crate::BoxError;
use router_mock::fixed::RESPONSE_BODY;

/// Which traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mix {
    /// Issue #22's: plain, keyed and malformed thirds, nginx backend.
    Issue,
    /// Every kind, three backends (one flapping), reloads.
    Mixed,
}

/// Run the proxy for a long time and watch its memory, descriptors and
/// threads.
#[derive(Debug, Parser)]
#[command(name = "proxy-bench soak")]
struct SoakArgs {
    /// How long to send traffic (30m, 20m, 2m, 90s).
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// How often to sample the proxy.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    sample_every: Duration,
    /// The traffic.
    #[arg(long, value_enum, default_value = "mixed")]
    mix: Mix,
    /// Client connections (one worker each).
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Pause between a worker's requests.
    #[arg(long, default_value = "1ms", value_parser = humantime::parse_duration)]
    think: Duration,
    /// `mixed`: how often the backend set is posted again.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    reload_every: Duration,
    /// `mixed`: how long the flapping backend stays up, then down.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    flap_every: Duration,
    /// The verdict: RSS at every sample under this many MB (10^6 bytes).
    #[arg(long, default_value_t = 64.0)]
    max_rss_mb: f64,
    /// The verdict: RSS growth over the growth window under this percent.
    #[arg(long, default_value_t = 5.0)]
    max_growth_pct: f64,
    /// The window for the growth and flatness rules (capped at two thirds
    /// of the run).
    #[arg(long, default_value = "20m", value_parser = humantime::parse_duration)]
    growth_window: Duration,
    /// The router binary [default: router-proxy next to this binary].
    #[arg(long)]
    router_bin: Option<PathBuf>,
    /// Extra environment for the router, KEY=VALUE (repeatable).
    #[arg(long = "router-env")]
    router_env: Vec<String>,
    /// The nginx binary [default: nginx on PATH, or /usr/sbin/nginx].
    #[arg(long)]
    nginx_bin: Option<PathBuf>,
}

/// `proxy-bench soak ARGS...`: `args` without the program name.
pub(crate) fn main(args: Vec<String>) -> ExitCode {
    let args = SoakArgs::parse_from(std::iter::once("proxy-bench soak".to_string()).chain(args));
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("soak-client")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("proxy-bench soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&args)) {
        Ok(report) => {
            print!("{}", report.text);
            if report.pass {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("proxy-bench soak: {e}");
            router_test_kit::child::terminate_children();
            ExitCode::FAILURE
        }
    }
}

/// One sample of the proxy.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    at: Duration,
    rss_kb: u64,
    fds: u64,
    threads: u64,
    requests: u64,
}

/// The counts of what the traffic got.
#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    client_error: AtomicU64,
    server_error: AtomicU64,
    other_status: AtomicU64,
    transport: AtomicU64,
    disconnects: AtomicU64,
    replays: AtomicU64,
    reloads: AtomicU64,
}

impl Counts {
    fn status(&self, s: StatusCode) {
        let c = match s.as_u16() {
            200..=299 => &self.ok,
            400..=499 => &self.client_error,
            500..=599 => &self.server_error,
            _ => &self.other_status,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn total(&self) -> u64 {
        [
            &self.ok,
            &self.client_error,
            &self.server_error,
            &self.other_status,
            &self.transport,
            &self.disconnects,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }
}

struct Report {
    text: String,
    pass: bool,
}

async fn run(args: &SoakArgs) -> Result<Report, BoxError> {
    if args.connections == 0 || args.sample_every.is_zero() || args.duration.is_zero() {
        return Err("--connections, --sample-every and --duration must be positive".into());
    }
    let tmp = std::env::temp_dir().join(format!("proxy-bench-soak-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = soak(args, &tmp).await;
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

async fn soak(args: &SoakArgs, tmp: &Path) -> Result<Report, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut backends = Vec::new();
    let mut flapper = None;
    let mut _nginx = None;
    match args.mix {
        Mix::Issue => {
            let nginx_bin = procs::find_nginx(args.nginx_bin.as_deref())
                .ok_or("nginx not found (apt-get install -y nginx, or --nginx-bin)")?;
            let (guard, addr) = procs::start_nginx_canned(&nginx_bin, tmp, RESPONSE_BODY).await?;
            eprintln!("nginx canned backend on {addr}");
            _nginx = Some(guard);
            backends.push(addr);
        }
        Mix::Mixed => {
            // No nginx here: the lowest-latency choice would send nearly
            // every stream to it, and it cannot stream.
            backends.push(spawn_model(Arc::clone(&stop), None).await?);
            let flap = spawn_model(Arc::clone(&stop), Some(args.flap_every)).await?;
            backends.push(flap);
            flapper = Some(flap);
            eprintln!("model backends on {} and {flap} (flapping)", backends[0]);
        }
    }
    let bin = args
        .router_bin
        .clone()
        .unwrap_or_else(crate::default_router_bin);
    let mut env = vec!["RUST_LOG=warn".to_string()];
    env.extend(args.router_env.iter().cloned());
    let spec = RouterSpec {
        bin: &bin,
        args: &[],
        env: &env,
        stderr_path: tmp.join("router-stderr.log"),
    };
    let (mut router, addr) = procs::start_router_with(&spec, &backends).await?;
    let pid = router.pid();
    eprintln!(
        "router pid {pid} on {addr}; {:?} of {:?} traffic, sampling every {:?}",
        args.duration, args.mix, args.sample_every
    );

    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let end = start + args.duration;
    let mut workers = Vec::new();
    for w in 0..args.connections {
        workers.push(tokio::spawn(worker(
            w,
            addr,
            args.mix,
            args.think,
            end,
            Arc::clone(&counts),
        )));
    }
    if args.mix == Mix::Mixed {
        let every = args.reload_every;
        let (counts, all) = (Arc::clone(&counts), backends.clone());
        let steady: Vec<SocketAddr> = backends
            .iter()
            .copied()
            .filter(|b| Some(*b) != flapper)
            .collect();
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() + every < end {
                tokio::time::sleep(every).await;
                n += 1;
                let set = if n % 2 == 1 { &steady } else { &all };
                if procs::set_backends(addr, set).await.is_ok() {
                    counts.reloads.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    let mut samples = vec![sample(pid, Duration::ZERO, 0)?];
    print_sample_header();
    print_sample(&samples[0]);
    let mut next = start + args.sample_every;
    while next <= end {
        tokio::time::sleep_until(next).await;
        if let Some(why) = router.exited() {
            stop.store(true, Ordering::Relaxed);
            return Err(format!(
                "{why}; stderr: {}",
                procs::tail(&tmp.join("router-stderr.log"), 2000)
            )
            .into());
        }
        let s = sample(pid, next - start, counts.total())?;
        print_sample(&s);
        samples.push(s);
        next += args.sample_every;
    }
    for w in workers {
        let _ = w.await;
    }
    stop.store(true, Ordering::Relaxed);
    let text = report(args, &samples, &counts);
    drop(router);
    Ok(text)
}

/// Reads the proxy's RSS, descriptors and threads.
fn sample(pid: u32, at: Duration, requests: u64) -> Result<Sample, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok(Sample {
        at,
        rss_kb: field("VmRSS:"),
        fds,
        threads: field("Threads:"),
        requests,
    })
}

fn mb(kb: u64) -> f64 {
    kb as f64 * 1024.0 / 1e6
}

fn print_sample_header() {
    eprintln!("| t (s) | RSS (MB) | fds | threads | requests |");
    eprintln!("|---:|---:|---:|---:|---:|");
}

fn print_sample(s: &Sample) {
    eprintln!("{}", sample_row(s));
}

fn sample_row(s: &Sample) -> String {
    format!(
        "| {} | {:.1} | {} | {} | {} |",
        s.at.as_secs(),
        mb(s.rss_kb),
        s.fds,
        s.threads,
        s.requests
    )
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The table and the verdict.
fn report(args: &SoakArgs, samples: &[Sample], counts: &Counts) -> Report {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "soak: {:?} mix, {} connections, think {:?}, {:?}, sampled every {:?}",
        args.mix, args.connections, args.think, args.duration, args.sample_every
    );
    let _ = writeln!(out, "| t (s) | RSS (MB) | fds | threads | requests |");
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|");
    for s in samples {
        let _ = writeln!(out, "{}", sample_row(s));
    }
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "requests: {} 2xx, {} 4xx, {} 5xx, {} other, {} transport errors, {} mid-stream disconnects; {} replays, {} reloads",
        c(&counts.ok),
        c(&counts.client_error),
        c(&counts.server_error),
        c(&counts.other_status),
        c(&counts.transport),
        c(&counts.disconnects),
        c(&counts.replays),
        c(&counts.reloads),
    );
    let last = samples.last().copied().unwrap_or_default();
    let window = args.growth_window.min(args.duration.mul_f64(2.0 / 3.0));
    let from = last.at.saturating_sub(window);
    // The window: the samples from `from` on (its first one at or after it).
    let in_window: Vec<Sample> = samples.iter().copied().filter(|s| s.at >= from).collect();
    let first = in_window.first().copied().unwrap_or_default();
    let mut pass = true;
    let mut rule = |ok: bool, text: String| {
        pass &= ok;
        let _ = writeln!(out, "{} {text}", if ok { "PASS" } else { "FAIL" });
    };
    let max_rss = samples.iter().map(|s| s.rss_kb).max().unwrap_or(0);
    rule(
        mb(max_rss) < args.max_rss_mb,
        format!(
            "RSS at most {:.1} MB (limit {} MB)",
            mb(max_rss),
            args.max_rss_mb
        ),
    );
    let growth = if first.rss_kb == 0 {
        0.0
    } else {
        (last.rss_kb as f64 - first.rss_kb as f64) * 100.0 / first.rss_kb as f64
    };
    rule(
        growth < args.max_growth_pct && in_window.len() >= 2,
        format!(
            "RSS growth over the last {} s: {:.1} MB -> {:.1} MB, {growth:+.1}% (limit {}%)",
            (last.at - first.at).as_secs(),
            mb(first.rss_kb),
            mb(last.rss_kb),
            args.max_growth_pct
        ),
    );
    // Flat: the second half of the window no higher than the first half
    // (medians, so that one sample taken during a burst of reconnects
    // does not decide), within a small tolerance.
    let half = in_window.len() / 2;
    let (early, late) = in_window.split_at(half.max(1).min(in_window.len()));
    let flat = |f: fn(&Sample) -> u64, slack: u64| {
        let a = median(early.iter().map(f).collect());
        let b = median(late.iter().map(f).collect());
        (a, b, b <= a + slack.max(a / 10))
    };
    let (a, b, ok) = flat(|s| s.fds, 8);
    rule(
        ok,
        format!("descriptors flat over the window: median {a} then {b}"),
    );
    let (a, b, ok) = flat(|s| s.threads, 2);
    rule(
        ok,
        format!("threads flat over the window: median {a} then {b}"),
    );
    let _ = writeln!(out, "verdict: {}", if pass { "PASS" } else { "FAIL" });
    Report { text: out, pass }
}

/// What a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    Keyed,
    Streamed,
    Malformed,
    Retry,
    Disconnect,
}

const ISSUE_KINDS: &[Kind] = &[Kind::Plain, Kind::Keyed, Kind::Malformed];
const MIXED_KINDS: &[Kind] = &[
    Kind::Plain,
    Kind::Keyed,
    Kind::Streamed,
    Kind::Malformed,
    Kind::Retry,
    Kind::Disconnect,
];

const STREAM_BODY: &str =
    r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const MALFORMED_BODY: &str = r#"{"model":"bench","messages":[{"role":"user","content":"hi"}"#;

/// One keep-alive connection; reconnects after a failure.
struct Client {
    addr: SocketAddr,
    sender: Option<client_http1::SendRequest<Full<Bytes>>>,
}

impl Client {
    async fn open(addr: SocketAddr) -> Result<client_http1::SendRequest<Full<Bytes>>, BoxError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = client_http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn ready(&mut self) -> Result<&mut client_http1::SendRequest<Full<Bytes>>, BoxError> {
        let ok = match self.sender.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !ok {
            self.sender = Some(Self::open(self.addr).await?);
        }
        self.sender.as_mut().ok_or_else(|| "no connection".into())
    }
}

fn request(
    addr: SocketAddr,
    body: &'static str,
    key: Option<&str>,
) -> Result<Request<Full<Bytes>>, BoxError> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(REQUEST_PATH)
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    Ok(b.body(Full::new(Bytes::from_static(body.as_bytes())))?)
}

/// One connection's traffic until `end`.
async fn worker(
    w: usize,
    addr: SocketAddr,
    mix: Mix,
    think: Duration,
    end: Instant,
    counts: Arc<Counts>,
) {
    let kinds = match mix {
        Mix::Issue => ISSUE_KINDS,
        Mix::Mixed => MIXED_KINDS,
    };
    let mut client = Client { addr, sender: None };
    let mut i = w; // workers start at different kinds
    let mut n = 0u64;
    let mut last_key = String::new();
    let timeout = Duration::from_secs(30);
    while Instant::now() < end {
        let kind = kinds[i % kinds.len()];
        i += 1;
        let key = match kind {
            Kind::Keyed => {
                n += 1;
                last_key = format!("soak-{}-{w}-{n}", std::process::id());
                Some(last_key.as_str())
            }
            Kind::Retry if !last_key.is_empty() => Some(last_key.as_str()),
            _ => None,
        };
        let body = match kind {
            Kind::Streamed | Kind::Disconnect => STREAM_BODY,
            Kind::Malformed => MALFORMED_BODY,
            _ => crate::load::REQUEST_BODY,
        };
        let result = match kind {
            Kind::Disconnect => tokio::time::timeout(timeout, disconnect(addr)).await,
            _ => tokio::time::timeout(timeout, send(&mut client, addr, body, key)).await,
        };
        match result {
            Ok(Ok((status, replayed))) => {
                if kind == Kind::Disconnect {
                    counts.disconnects.fetch_add(1, Ordering::Relaxed);
                } else {
                    counts.status(status);
                }
                if replayed {
                    counts.replays.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(Err(_)) | Err(_) => {
                client.sender = None;
                counts.transport.fetch_add(1, Ordering::Relaxed);
                // A refused connect must not spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if !think.is_zero() {
            tokio::time::sleep(think).await;
        }
    }
}

/// Sends one request and reads the whole answer: (status, replayed).
async fn send(
    client: &mut Client,
    addr: SocketAddr,
    body: &'static str,
    key: Option<&str>,
) -> Result<(StatusCode, bool), BoxError> {
    let req = request(addr, body, key)?;
    let sender = client.ready().await?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let replayed = resp.headers().contains_key("x-router-replayed");
    resp.into_body().collect().await?;
    Ok((status, replayed))
}

/// A streamed request on a connection of its own, dropped after the
/// first frame of the answer.
async fn disconnect(addr: SocketAddr) -> Result<(StatusCode, bool), BoxError> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, conn) = client_http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let resp = sender
        .send_request(request(addr, STREAM_BODY, None)?)
        .await?;
    let status = resp.status();
    let mut body = resp.into_body();
    let _ = body.frame().await;
    drop(body);
    drop(sender);
    driver.abort();
    Ok((status, false))
}

/// An in-process model server on its own thread: a JSON answer, or (for
/// `"stream": true`) 20 SSE frames 10 ms apart. With `flap`, it closes its
/// listener for `flap` after every `flap` up (connections refused), until
/// `stop`.
async fn spawn_model(
    stop: Arc<AtomicBool>,
    flap: Option<Duration>,
) -> Result<SocketAddr, BoxError> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = std_listener.local_addr()?;
    std_listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("soak-backend".into())
        .spawn(move || {
            rt.block_on(async move {
                let Ok(mut listener) = TcpListener::from_std(std_listener) else {
                    return;
                };
                loop {
                    let up_until = flap.map(|f| Instant::now() + f);
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let accept =
                            tokio::time::timeout(Duration::from_millis(200), listener.accept());
                        if let Ok(Ok((stream, _))) = accept.await {
                            let _ = stream.set_nodelay(true);
                            tokio::spawn(async move {
                                let _ = server_http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), service_fn(model))
                                    .await;
                            });
                        }
                        if up_until.is_some_and(|u| Instant::now() >= u) {
                            break;
                        }
                    }
                    // Down: the listener closed, connects refused.
                    drop(listener);
                    if let Some(f) = flap {
                        tokio::time::sleep(f).await;
                    }
                    listener = loop {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        match TcpListener::bind(addr).await {
                            Ok(l) => break l,
                            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    };
                }
            });
        })?;
    Ok(addr)
}

type ModelBody = http_body_util::Either<
    Full<Bytes>,
    StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
>;

async fn model(req: Request<Incoming>) -> Result<Response<ModelBody>, Infallible> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let streamed = body.windows(13).any(|w| w == b"\"stream\":true");
    if !streamed {
        let mut resp = Response::new(http_body_util::Either::Left(Full::new(Bytes::from_static(
            RESPONSE_BODY.as_bytes(),
        ))));
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(resp);
    }
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        for i in 0..20 {
            let frame = format!(
                "data: {{\"id\":\"chatcmpl-soak\",\"object\":\"chat.completion.chunk\",\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"token {i} \"}}}}]}}\n\n"
            );
            if tx.send(Ok(Frame::data(Bytes::from(frame)))).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = tx
            .send(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))))
            .await;
    });
    let mut resp = Response::new(http_body_util::Either::Right(StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    Ok(resp)
}
