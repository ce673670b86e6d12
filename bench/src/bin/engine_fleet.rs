//! `engine-fleet-bench`: balancing strategies side by side on a fleet of
//! simulated LLM engines, through a real `router-proxy` process.
//!
//! For each workload (prefix-heavy chat, and one without shared prefixes),
//! each load (fractions of the fleet's measured capacity) and each
//! strategy, it starts `--engines` fresh simulated engines in-process
//! (`router_mock`, `Behavior::Engine`: continuous batching, KV cache with
//! prefix caching, vLLM's `/metrics`), writes a policy with one pool of
//! them balanced by that strategy, starts `router-proxy --policy` as a
//! child process, and replays the same seeded workload (open loop, Poisson
//! arrivals) as streamed chat completions. It measures, per request, the
//! time to the first streamed chunk (TTFT) and to the end of the answer,
//! and at the end reads the engines' prefix-cache counters.
//!
//! Time scaling: the engines run `--time-scale` times faster than the
//! modelled GPU (prefill rate multiplied, decode step times divided), so a
//! run takes minutes instead of an hour; latencies are reported multiplied
//! back, in the model's time. Router and client overheads are multiplied
//! too (they are small against engine times; see docs/benchmarks.md).
//!
//! `cargo build --release -p router-proxy -p router-bench --bin engine-fleet-bench`
//! then `target/release/engine-fleet-bench --help`.

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_mock::engine::EngineConfig;
use router_mock::workload::{self, WorkloadConfig, WorkloadRequest};
use router_mock::{Behavior, MockConfig, MockModel};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
#[command(
    name = "engine-fleet-bench",
    about = "Balancing strategies on a simulated LLM fleet"
)]
struct Args {
    /// Simulated engines in the pool.
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// Requests per run.
    #[arg(long, default_value_t = 300)]
    requests: usize,
    /// Engines run this many times faster than the modelled GPU.
    #[arg(long, default_value_t = 4.0)]
    time_scale: f64,
    /// Loads, as fractions of the fleet's capacity.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.8,0.95")]
    loads: Vec<f64>,
    /// Strategies to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,least_requests,lowest_ewma,peak_ewma,engine_aware,engine_aware_prefix"
    )]
    strategies: Vec<String>,
    /// Workloads: `prefix` (shared system prompts, multi-turn sessions)
    /// and `no_prefix` (every prompt distinct).
    #[arg(long, value_delimiter = ',', default_value = "prefix,no_prefix")]
    workloads: Vec<String>,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Capacity-probe interval of engine-aware pools, wall milliseconds.
    #[arg(long, default_value_t = 100)]
    probe_interval_ms: u64,
    /// Bounded-load factor of `engine_aware_prefix` (default: the
    /// router's).
    #[arg(long)]
    load_factor: Option<f64>,
    /// The proxy binary.
    #[arg(long, default_value = "target/release/router-proxy")]
    router_bin: PathBuf,
    /// Keep the policies and the proxies' stderr (the temp dir is printed).
    #[arg(long)]
    keep: bool,
    /// Where the results (with every TTFT sample) go, as JSON.
    #[arg(long, default_value = "engine-fleet.json")]
    out: PathBuf,
}

/// One request as sent.
struct Prepared {
    at: Duration,
    body: Bytes,
}

/// What one request measured.
#[derive(Clone, Copy)]
struct Measured {
    ok: bool,
    /// HTTP status (0: no answer).
    status: u16,
    ttft: Duration,
    e2e: Duration,
    sent: Instant,
    ended: Instant,
}

fn engine_config(scale: f64) -> EngineConfig {
    let base = EngineConfig::default();
    EngineConfig {
        prefill_tokens_per_s: (f64::from(base.prefill_tokens_per_s) * scale) as u32,
        decode_step_base: base.decode_step_base.div_f64(scale),
        decode_step_per_seq: base.decode_step_per_seq.div_f64(scale),
        ..base
    }
}

fn workload_config(name: &str, seed: u64, requests: usize) -> Result<WorkloadConfig, BoxError> {
    let base = WorkloadConfig {
        seed,
        requests,
        ..WorkloadConfig::default()
    };
    match name {
        "prefix" => Ok(base),
        // Every request its own session, its system prompt drawn from 20
        // times as many as there are requests: few prompts share anything
        // (a draw repeats for about one request in forty).
        "no_prefix" => Ok(WorkloadConfig {
            system_prompts: requests * 20,
            mean_turns: 1.0,
            ..base
        }),
        other => Err(format!("unknown workload {other:?}").into()),
    }
}

/// Token ids as text the simulated engine turns back into distinct
/// tokens: 4 characters per id (the engine cuts text into 4-byte tokens).
fn render(tokens: &[u32]) -> String {
    const ALPHABET: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
    let mut s = String::with_capacity(tokens.len() * 4);
    for t in tokens {
        for k in 0..4 {
            s.push(ALPHABET[((t >> (6 * k)) & 63) as usize] as char);
        }
    }
    s
}

/// The workload as chat requests: the system prompt, the session's first
/// user message, then the rest of the conversation, so every turn of a
/// session repeats its first two messages word for word.
fn prepare(requests: &[WorkloadRequest], system_tokens: usize) -> Vec<Prepared> {
    let mut first_len: HashMap<u64, usize> = HashMap::new();
    requests
        .iter()
        .map(|r| {
            let sys = system_tokens.min(r.prompt.len());
            let first = *first_len.entry(r.session).or_insert(r.prompt.len());
            let first = first.min(r.prompt.len()).max(sys);
            let mut messages = vec![
                json!({"role": "system", "content": render(&r.prompt[..sys])}),
                json!({"role": "user", "content": render(&r.prompt[sys..first])}),
            ];
            if first < r.prompt.len() {
                messages.push(json!({"role": "user", "content": render(&r.prompt[first..])}));
            }
            let body = json!({
                "model": "sim",
                "stream": true,
                "max_tokens": r.output_tokens,
                "messages": messages,
            });
            Prepared {
                at: r.at,
                body: Bytes::from(body.to_string()),
            }
        })
        .collect()
}

fn policy(
    strategy: &str,
    endpoints: &[String],
    probe_interval_ms: u64,
    load_factor: Option<f64>,
) -> String {
    let load_factor = load_factor.map_or(String::new(), |c| format!(", load_factor: {c}"));
    let (balance, extra) = match strategy {
        "engine_aware" => (
            "engine_aware",
            format!("      capacity_probe: {{kind: vllm, interval_ms: {probe_interval_ms}}}\n"),
        ),
        "engine_aware_prefix" => (
            "engine_aware",
            format!(
                "      capacity_probe: {{kind: vllm, interval_ms: {probe_interval_ms}}}\n      engine_aware: {{affinity: prefix{load_factor}}}\n"
            ),
        ),
        other => (other, String::new()),
    };
    format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nmetadata: {{name: engine-fleet}}\nspec:\n  defaults: {{deadline_ms: 600000, attempt_timeout_ms: 600000}}\n  pools:\n    - name: gpus\n      provider: vllm\n      endpoints: [{}]\n      balance: {balance}\n{extra}  routes:\n    - {{name: all, chain: [gpus]}}\n",
        endpoints.join(", ")
    )
}

fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Proxy {
    child: Child,
    url: String,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_proxy(
    bin: &PathBuf,
    policy_path: &PathBuf,
    client: &Client<HttpConnector, Full<Bytes>>,
) -> Result<Proxy, BoxError> {
    let port = free_port()?;
    let stderr = std::fs::File::create(policy_path.with_extension("stderr"))?;
    let child = Command::new(bin)
        .arg("--policy")
        .arg(policy_path)
        .env("CUSTOM_ROUTER_PORT", port.to_string())
        .env("CUSTOM_ROUTER_BIND", "127.0.0.1")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()?;
    let proxy = Proxy {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let health: http::Uri = format!("{}/_custom_router/health", proxy.url).parse()?;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let req = http::Request::get(health.clone()).body(Full::new(Bytes::new()))?;
        if let Ok(resp) = client.request(req).await {
            if resp.status() == 200 {
                return Ok(proxy);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("router-proxy did not come up in 20 s".into())
}

async fn send(client: Client<HttpConnector, Full<Bytes>>, uri: http::Uri, body: Bytes) -> Measured {
    let sent = Instant::now();
    let failed = |sent: Instant| Measured {
        ok: false,
        status: 0,
        ttft: sent.elapsed(),
        e2e: sent.elapsed(),
        sent,
        ended: Instant::now(),
    };
    let Ok(req) = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(Full::new(body))
    else {
        return failed(sent);
    };
    let Ok(resp) = client.request(req).await else {
        return failed(sent);
    };
    if resp.status() != 200 {
        if std::env::var_os("ENGINE_FLEET_DEBUG").is_some() {
            let status = resp.status();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            eprintln!("{status}: {body:?}");
            return Measured {
                status: status.as_u16(),
                ..failed(sent)
            };
        }
        return Measured {
            status: resp.status().as_u16(),
            ..failed(sent)
        };
    }
    let mut body = resp.into_body();
    let mut ttft = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return failed(sent);
        };
        if frame.data_ref().is_some_and(|d| !d.is_empty()) && ttft.is_none() {
            ttft = Some(sent.elapsed());
        }
    }
    let ended = Instant::now();
    Measured {
        ok: true,
        status: 200,
        ttft: ttft.unwrap_or(ended - sent),
        e2e: ended - sent,
        sent,
        ended,
    }
}

async fn prefix_counters(
    client: &Client<HttpConnector, Full<Bytes>>,
    engines: &[MockModel],
) -> (f64, f64) {
    let (mut hits, mut queries) = (0.0, 0.0);
    for e in engines {
        let Ok(uri) = format!("{}/metrics", e.url()).parse::<http::Uri>() else {
            continue;
        };
        let Ok(req) = http::Request::get(uri).body(Full::new(Bytes::new())) else {
            continue;
        };
        let Ok(resp) = client.request(req).await else {
            continue;
        };
        let Ok(body) = resp.into_body().collect().await else {
            continue;
        };
        for line in String::from_utf8_lossy(&body.to_bytes()).lines() {
            let value = || {
                line.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            if line.starts_with("vllm:prefix_cache_hits_total") {
                hits += value();
            } else if line.starts_with("vllm:prefix_cache_queries_total") {
                queries += value();
            }
        }
    }
    (hits, queries)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn write_results(args: &Args, rows: &[serde_json::Value]) -> Result<(), BoxError> {
    let out = json!({
        "engines": args.engines,
        "requests": args.requests,
        "time_scale": args.time_scale,
        "seed": args.seed,
        "probe_interval_ms": args.probe_interval_ms,
        "load_factor": args.load_factor,
        "rows": rows,
    });
    std::fs::write(&args.out, serde_json::to_string(&out)?)?;
    Ok(())
}

async fn run(args: Args) -> Result<(), BoxError> {
    let engine = engine_config(args.time_scale);
    let scale = args.time_scale;
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(http);
    let dir = std::env::temp_dir().join(format!("engine-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    eprintln!("policies and proxy logs in {}", dir.display());
    let mut rows = Vec::new();
    println!(
        "| workload | load | strategy | TTFT p50 (ms) | TTFT p99 (ms) | e2e p50 (ms) | e2e p99 (ms) | throughput (req/s) | prefix-cache hits | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for wname in &args.workloads {
        let wcfg = workload_config(wname, args.seed, args.requests)?;
        let capacity = workload::simulated_capacity_rps(&engine, &wcfg);
        eprintln!(
            "{wname}: one engine's capacity {capacity:.2} req/s of wall time (engines {scale}x fast), {:.2} req/s in model time",
            capacity / scale
        );
        for &load in &args.loads {
            let rate = workload::rate_for_load(capacity, args.engines, load);
            let requests = workload::generate(&WorkloadConfig {
                rate_per_s: rate,
                ..wcfg.clone()
            });
            let prepared = prepare(&requests, wcfg.system_prompt_tokens as usize);
            for strategy in &args.strategies {
                let mut engines = Vec::new();
                for i in 0..args.engines {
                    engines.push(
                        MockModel::start(MockConfig {
                            name: format!("gpu-{i}"),
                            behavior: Behavior::Engine(engine.clone()),
                            ..MockConfig::default()
                        })
                        .await?,
                    );
                }
                let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
                let policy_path = dir.join(format!("{wname}-{load}-{strategy}.yaml"));
                std::fs::write(
                    &policy_path,
                    policy(strategy, &urls, args.probe_interval_ms, args.load_factor),
                )?;
                let proxy = start_proxy(&args.router_bin, &policy_path, &client).await?;
                let uri: http::Uri = format!("{}/v1/chat/completions", proxy.url).parse()?;
                let start = Instant::now();
                let tasks: Vec<_> = prepared
                    .iter()
                    .map(|p| {
                        let (client, uri, body, at) =
                            (client.clone(), uri.clone(), p.body.clone(), p.at);
                        tokio::spawn(async move {
                            tokio::time::sleep_until((start + at).into()).await;
                            send(client, uri, body).await
                        })
                    })
                    .collect();
                let mut measured = Vec::with_capacity(tasks.len());
                for t in tasks {
                    measured.push(t.await?);
                }
                let (hits, queries) = prefix_counters(&client, &engines).await;
                drop(proxy);
                drop(engines);
                let ok: Vec<&Measured> = measured.iter().filter(|m| m.ok).collect();
                let errors = measured.len() - ok.len();
                if errors > 0 {
                    let mut by_status: HashMap<u16, usize> = HashMap::new();
                    for m in measured.iter().filter(|m| !m.ok) {
                        *by_status.entry(m.status).or_default() += 1;
                    }
                    eprintln!("{wname} {load} {strategy}: errors by status {by_status:?}");
                }
                let ms = |d: Duration| d.as_secs_f64() * 1000.0 * scale;
                let mut ttft: Vec<f64> = ok.iter().map(|m| ms(m.ttft)).collect();
                let mut e2e: Vec<f64> = ok.iter().map(|m| ms(m.e2e)).collect();
                ttft.sort_by(f64::total_cmp);
                e2e.sort_by(f64::total_cmp);
                let first = ok.iter().map(|m| m.sent).min();
                let last = ok.iter().map(|m| m.ended).max();
                let span = match (first, last) {
                    (Some(f), Some(l)) => (l - f).as_secs_f64() * scale,
                    _ => f64::NAN,
                };
                let throughput = ok.len() as f64 / span;
                let hit_rate = if queries > 0.0 { hits / queries } else { 0.0 };
                println!(
                    "| {wname} | {:.0}% | {strategy} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} | {:.1}% | {errors} |",
                    load * 100.0,
                    percentile(&ttft, 50.0),
                    percentile(&ttft, 99.0),
                    percentile(&e2e, 50.0),
                    percentile(&e2e, 99.0),
                    throughput,
                    hit_rate * 100.0,
                );
                rows.push(json!({
                    "workload": wname,
                    "load": load,
                    "strategy": strategy,
                    "ttft_p50_ms": percentile(&ttft, 50.0),
                    "ttft_p99_ms": percentile(&ttft, 99.0),
                    "e2e_p50_ms": percentile(&e2e, 50.0),
                    "e2e_p99_ms": percentile(&e2e, 99.0),
                    "throughput_rps": throughput,
                    "prefix_hit_rate": hit_rate,
                    "errors": errors,
                    "ttft_ms": ttft,
                }));
                // Written after every run: a run that stops half-way keeps
                // what it measured.
                write_results(&args, &rows)?;
                // Let sockets and the engines' tasks wind down.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    write_results(&args, &rows)?;
    if !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_of_a_session_repeat_their_first_two_messages() {
        let cfg = WorkloadConfig {
            requests: 40,
            system_prompt_tokens: 32,
            ..WorkloadConfig::default()
        };
        let requests = workload::generate(&cfg);
        let prepared = prepare(&requests, 32);
        let lead = |b: &Bytes| router_policy::affinity::leading_prompt(b).expect("chat");
        let mut seen: HashMap<u64, Vec<u8>> = HashMap::new();
        for (r, p) in requests.iter().zip(&prepared) {
            let l = lead(&p.body);
            assert_eq!(seen.entry(r.session).or_insert_with(|| l.clone()), &l);
        }
        assert_eq!(render(&[0, 63]), "aaaa_aaa");
    }
}
