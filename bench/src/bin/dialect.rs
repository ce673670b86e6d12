//! `dialect-bench`: the latency a translated request adds, against the
//! same request untranslated, through the same proxy to the same backend.
//!
//! One OpenAI-compatible mock (`router_mock::Behavior::Chat`, answering
//! at once) behind a proxy in-process, and a closed loop of `--clients`
//! keep-alive connections sending the same conversation four ways:
//!
//! - `openai`: `POST /v1/chat/completions`, answered whole (no
//!   translation: the baseline);
//! - `anthropic`: the same conversation as `POST /v1/messages`, translated
//!   to a chat request and its answer back;
//! - `openai-stream` and `anthropic-stream`: the same, streamed (the
//!   Anthropic client's stream translated chunk by chunk as it flows);
//!
//! plus `direct`: the OpenAI request sent to the mock itself (no proxy).
//! The modes take turns in `--rounds` rounds so that whatever else the
//! machine does falls on all of them alike; each reports the latency
//! (request sent to the answer's last byte) at p50 and p99 over every
//! round, and the difference to its untranslated twin.
//!
//! Run from a release build: `cargo run --release -p router-bench --bin
//! dialect-bench`.

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
use router_mock::{Behavior, MockConfig, MockModel};
use router_proxy::{Mode, ProxyOptions, Settings};

/// Measure what translating a request between dialects adds to its latency.
#[derive(Parser, Debug)]
struct Args {
    /// Measured requests per mode and round.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Rounds (the modes take turns in each).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Unmeasured requests per mode first.
    #[arg(long, default_value_t = 500)]
    warmup: usize,
    /// Concurrent clients (keep-alive connections).
    #[arg(long, default_value_t = 4)]
    clients: usize,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A conversation like an agent's second turn: a system prompt, a user
/// message, an answer, another message.
const SYSTEM: &str =
    "You are a careful coding assistant. Answer briefly and cite the files you read.";

fn openai_body(stream: bool) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": "m", "max_tokens": 256, "stream": stream,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "What does the router do when a pool is overloaded?"},
                {"role": "assistant", "content": "It tries the next pool of the route's chain."},
                {"role": "user", "content": "And within the deadline?"}
            ]
        })
        .to_string(),
    )
}

fn anthropic_body(stream: bool) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": "m", "max_tokens": 256, "stream": stream,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What does the router do when a pool is overloaded?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "It tries the next pool of the route's chain."}]},
                {"role": "user", "content": [{"type": "text", "text": "And within the deadline?"}]}
            ]
        })
        .to_string(),
    )
}

struct ModeSpec {
    name: &'static str,
    url: String,
    body: Bytes,
    anthropic: bool,
}

/// The `p` quantile of `sorted`, in microseconds.
fn pct(sorted: &[Duration], p: f64) -> f64 {
    router_test_kit::stats::pct(sorted, p) * 1e3
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
    let backend = MockModel::start(MockConfig {
        name: "local".into(),
        behavior: Behavior::Chat,
        ..MockConfig::default()
    })
    .await?;
    let policy = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: local\n      endpoints: [\"{}\"]\n  routes:\n    - name: r\n      chain: [local]\n",
        backend.url()
    );
    let policy = router_policy::document::load(&policy, &router_policy::QueueSettings::default())
        .map_err(|e| e.to_string())?;
    let proxy = router_proxy::start(ProxyOptions {
        settings: Settings {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            ..Settings::default()
        },
        mode: Mode::Inline(Box::new(policy)),
        route_log: Box::new(std::io::sink()),
    })
    .await?;
    let at = |path: &str| format!("http://{}{path}", proxy.local_addr());
    let modes = [
        ModeSpec {
            name: "direct",
            url: format!("{}/v1/chat/completions", backend.url()),
            body: openai_body(false),
            anthropic: false,
        },
        ModeSpec {
            name: "openai",
            url: at("/v1/chat/completions"),
            body: openai_body(false),
            anthropic: false,
        },
        ModeSpec {
            name: "anthropic",
            url: at("/v1/messages"),
            body: anthropic_body(false),
            anthropic: true,
        },
        ModeSpec {
            name: "openai-stream",
            url: at("/v1/chat/completions"),
            body: openai_body(true),
            anthropic: false,
        },
        ModeSpec {
            name: "anthropic-stream",
            url: at("/v1/messages"),
            body: anthropic_body(true),
            anthropic: true,
        },
    ];
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    for m in &modes {
        load(&client, m, args.clients, args.warmup).await?;
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); modes.len()];
    for _ in 0..args.rounds {
        for (i, m) in modes.iter().enumerate() {
            samples[i].extend(load(&client, m, args.clients, args.requests).await?);
        }
    }
    println!(
        "{} requests per mode ({} rounds of {}), {} clients; latency to the answer's last byte",
        args.rounds * args.requests,
        args.rounds,
        args.requests,
        args.clients
    );
    println!("mode               p50 µs    p99 µs   p50 added by translation");
    let mut p50s = Vec::new();
    for (i, m) in modes.iter().enumerate() {
        samples[i].sort_unstable();
        let (p50, p99) = (pct(&samples[i], 0.5), pct(&samples[i], 0.99));
        p50s.push(p50);
        // Each translated mode's twin is the mode just before it
        // (`openai`, `openai-stream`).
        let added = match m.name {
            "anthropic" | "anthropic-stream" => format!("{:+.0} µs", p50 - p50s[i - 1]),
            _ => String::new(),
        };
        println!("{:<16} {:>8.0}  {:>8.0}   {added}", m.name, p50, p99);
    }
    proxy.shutdown();
    backend.stop().await;
    Ok(())
}

/// Sends `n` requests of `mode` over `clients` concurrent loops; each
/// one's latency to its last byte.
async fn load(
    client: &Client<HttpConnector, Full<Bytes>>,
    mode: &ModeSpec,
    clients: usize,
    n: usize,
) -> Result<Vec<Duration>, BoxError> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (client, url, body, next, anthropic) = (
            client.clone(),
            mode.url.clone(),
            mode.body.clone(),
            Arc::clone(&next),
            mode.anthropic,
        );
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                out.push(one(&client, &url, &body, anthropic).await?);
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

/// One request, read to its end: its latency.
async fn one(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    body: &Bytes,
    anthropic: bool,
) -> Result<Duration, BoxError> {
    let mut req = http::Request::post(url).header("content-type", "application/json");
    if anthropic {
        req = req.header("anthropic-version", "2023-06-01");
    }
    let req = req.body(Full::new(body.clone()))?;
    let t0 = Instant::now();
    let resp = client.request(req).await?;
    if !resp.status().is_success() {
        return Err(format!("{url}: status {}", resp.status()).into());
    }
    let bytes = resp.into_body().collect().await?.to_bytes();
    let took = t0.elapsed();
    if bytes.is_empty() {
        return Err(format!("{url}: an empty answer").into());
    }
    Ok(took)
}
