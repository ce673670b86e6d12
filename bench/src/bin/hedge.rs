//! `hedge-bench`: what hedged requests do to the tail of time to first
//! token, and what they cost in extra generations.
//!
//! Two scripted streaming mocks (`router_mock::Behavior::Stream`): a
//! primary whose first token comes after `--median-ms`, except for one
//! request in `--tail-one-in` (5% by default) which waits ten times as long
//! (a heavy tail: a request queued behind long prompts, a preemption); and
//! a second pool with the same median and no tail. A proxy in-process
//! routes `[primary, second]`, and the same closed-loop load (`--clients`
//! connections, `--requests` streamed requests each mode, after
//! `--warmup` unmeasured ones) runs three times, one mode after another
//! on a fresh proxy and fresh mocks:
//!
//! - `off`: no hedge;
//! - `p95`: `hedge: {after: p95}` (the primary pool's recent p95);
//! - `fixed`: `hedge: {after_ms: 2 × median}`.
//!
//! For each it reports TTFT p50/p99 as the client sees it (from sending
//! the request to the first content event), the hedges started, and the
//! extra generations: requests the backends received beyond one per
//! client request, and generations completed beyond one per request (the
//! losers are cancelled, so this one should stay 0).
//!
//! Run from a release build: `cargo run --release -p router-bench --bin
//! hedge-bench`.

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_mock::{Behavior, MockConfig, MockModel, StreamScript};
use router_proxy::{Mode, ProxyOptions, Settings};

/// Measure hedged requests against a heavy-tailed primary.
#[derive(Parser, Debug)]
struct Args {
    /// Measured requests per mode.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Unmeasured requests first (the pool's p95 needs samples).
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Concurrent clients (keep-alive connections).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Median time to first token of both pools, ms.
    #[arg(long, default_value_t = 50)]
    median_ms: u64,
    /// One primary request in this many takes ten times the median.
    #[arg(long, default_value_t = 20)]
    tail_one_in: u32,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[rank].as_secs_f64() * 1e3
}

/// One mode's results.
struct ModeResult {
    name: &'static str,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    requests: usize,
    hedges: u64,
    backend_requests: u64,
    completed: u64,
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<(), BoxError> {
    let median = args.median_ms;
    let modes: [(&'static str, String); 3] = [
        ("off", String::new()),
        ("p95", "hedge: {after: p95}".into()),
        ("fixed", format!("hedge: {{after_ms: {}}}", 2 * median)),
    ];
    let mut results = Vec::new();
    for (name, hedge) in modes {
        results.push(run_mode(&args, name, &hedge).await?);
    }
    if args.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|r| {
                serde_json::json!({
                    "mode": r.name,
                    "ttft_p50_ms": r.p50_ms,
                    "ttft_p99_ms": r.p99_ms,
                    "ttft_max_ms": r.max_ms,
                    "hedges": r.hedges,
                    "extra_backend_requests_pct": extra(r.backend_requests, r.requests),
                    "extra_completed_generations_pct": extra(r.completed, r.requests),
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "modes": rows }));
        return Ok(());
    }
    println!(
        "{} streamed requests per mode, {} clients; primary TTFT {} ms, 1 in {} at {} ms; second pool {} ms",
        args.requests,
        args.clients,
        median,
        args.tail_one_in,
        median * 10,
        median
    );
    println!(
        "mode    TTFT p50 ms  TTFT p99 ms  max ms   hedges  extra requests  extra generations"
    );
    let off_p99 = results.first().map_or(0.0, |r| r.p99_ms);
    for r in &results {
        println!(
            "{:<7} {:>11.1}  {:>11.1}  {:>6.1}  {:>7}  {:>13.1}%  {:>16.1}%   p99 {:.2}x of off",
            r.name,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.hedges,
            extra(r.backend_requests, r.requests),
            extra(r.completed, r.requests),
            if off_p99 > 0.0 {
                r.p99_ms / off_p99
            } else {
                0.0
            },
        );
    }
    Ok(())
}

/// `n` beyond one per request, as a percentage of the requests.
fn extra(n: u64, requests: usize) -> f64 {
    (n as f64 - requests as f64).max(0.0) * 100.0 / requests.max(1) as f64
}

async fn run_mode(args: &Args, name: &'static str, hedge: &str) -> Result<ModeResult, BoxError> {
    let ms = Duration::from_millis;
    let script = |tail| StreamScript {
        first_token: ms(args.median_ms),
        tail,
        chunks: 4,
        interval: ms(2),
        ..StreamScript::default()
    };
    let start = |name: &str, s: StreamScript| {
        MockModel::start(MockConfig {
            name: name.into(),
            behavior: Behavior::Stream(s),
            ..MockConfig::default()
        })
    };
    let primary = start(
        "primary",
        script(Some((args.tail_one_in, ms(args.median_ms * 10)))),
    )
    .await?;
    let second = start("second", script(None)).await?;
    let policy = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: primary\n      endpoints: [\"{}\"]\n    - name: second\n      endpoints: [\"{}\"]\n  routes:\n    - name: r\n      chain: [primary, second]\n      retry_budget: {{ratio: 0.2, min_per_second: 10}}\n      {hedge}\n",
        primary.url(),
        second.url()
    );
    let policy = router_policy::document::load(&policy, &router_policy::QueueSettings::default())
        .map_err(|e| e.to_string())?;
    let settings = Settings {
        bind: [127, 0, 0, 1].into(),
        port: 0,
        ..Settings::default()
    };
    let proxy = router_proxy::start(ProxyOptions {
        settings,
        mode: Mode::Inline(Box::new(policy)),
        route_log: Box::new(std::io::sink()),
    })
    .await?;
    let url: Arc<str> = format!("http://{}/v1/chat/completions", proxy.local_addr()).into();
    let body = Bytes::from_static(
        br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());

    // Warm-up, then reset the counters by reading them.
    load(&client, &url, &body, args.clients, args.warmup).await?;
    let (p0, s0) = (primary.stats(), second.stats());
    let mut ttft = load(&client, &url, &body, args.clients, args.requests).await?;
    // Let cancellations land.
    tokio::time::sleep(ms(200)).await;
    let (p1, s1) = (primary.stats(), second.stats());
    ttft.sort_unstable();
    let backend_requests = (p1.received - p0.received) + (s1.received - s0.received);
    let completed = (p1.completed - p0.completed) + (s1.completed - s0.completed);
    proxy.shutdown();
    primary.stop().await;
    second.stop().await;
    Ok(ModeResult {
        name,
        p50_ms: pct(&ttft, 0.50),
        p99_ms: pct(&ttft, 0.99),
        max_ms: ttft.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        requests: args.requests,
        hedges: s1.received - s0.received,
        backend_requests,
        completed,
    })
}

/// Sends `n` streamed requests over `clients` concurrent loops; returns
/// each one's time to its first content event.
async fn load(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &Arc<str>,
    body: &Bytes,
    clients: usize,
    n: usize,
) -> Result<Vec<Duration>, BoxError> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (client, url, body, next) = (
            client.clone(),
            Arc::clone(url),
            body.clone(),
            Arc::clone(&next),
        );
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                out.push(one(&client, &url, &body).await?);
            }
            Ok::<_, BoxError>(out)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// One streamed request: the time to its first content event; the rest
/// of the stream is read to its end.
async fn one(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    body: &Bytes,
) -> Result<Duration, BoxError> {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))?;
    let t0 = Instant::now();
    let resp = client.request(req).await?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()).into());
    }
    let mut body = resp.into_body();
    let mut first = None;
    let mut seen = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if first.is_none() {
                seen.extend_from_slice(&data);
                if seen.windows(10).any(|w| w == b"\"content\":")
                    && seen.windows(3).any(|w| w == b"tok")
                {
                    first = Some(t0.elapsed());
                }
            }
        }
    }
    first.ok_or_else(|| "a stream without content".into())
}
