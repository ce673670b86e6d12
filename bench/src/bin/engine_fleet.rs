//! `engine-fleet-bench`: balancing strategies side by side on a fleet of
//! simulated LLM engines, through a real `router-proxy` process.
//!
//! For each workload (prefix-heavy chat, one without shared prefixes, and
//! issue 31's multi-turn shape with a share of private system prompts),
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
//! Renderings (`--render`): the same workload turned into chat messages in
//! three ways, so that what the router keys on can differ while the engine
//! sees the same conversation: `chat` (system prompt, the session's first
//! user message, the rest of the conversation as one more user message),
//! `turns` (system prompt, then user and assistant messages alternating,
//! cut where the workload's previous turns ended), `history` (system prompt
//! and one user message holding the whole conversation, role labels
//! inline). `turns` and `history` give the engine the same text, hence the
//! same token ids; `chat` lacks the role labels between turns (17 bytes,
//! about 4 tokens, fewer per earlier turn). See [`prepare`].
//!
//! A fleet of proxies (`--proxies N`): N `router-proxy` processes with the
//! same policy, sharing one `redis-server` (started fresh for each run, as
//! `CUSTOM_ROUTER_SHARED_STORE`; also with one proxy under `--redis`);
//! request k goes to proxy k mod N, as a round-robin load balancer in front
//! of them would send it.
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
use std::process::{Child, Command};
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

use router_test_kit::redis::RedisServer;
use router_test_kit::BoxError;

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
    /// Workloads: `prefix` (shared system prompts, multi-turn sessions),
    /// `no_prefix` (every prompt distinct) and `multi_turn` (issue 31's:
    /// 70% of sessions on 4 shared system prompts of 2,048 tokens, the
    /// others on one of their own, multi-turn).
    #[arg(long, value_delimiter = ',', default_value = "prefix,no_prefix")]
    workloads: Vec<String>,
    /// How a turn becomes chat messages: `chat` (system, first user
    /// message, the rest as one user message), `turns` (user and assistant
    /// messages alternating) or `history` (one user message holding the
    /// whole conversation).
    #[arg(long, value_enum, default_value_t = Render::Chat)]
    render: Render,
    /// Router processes, with the same policy and one shared store;
    /// request k goes to proxy k mod N.
    #[arg(long, default_value_t = 1)]
    proxies: usize,
    /// Give the proxies a shared store (a fresh `redis-server` per run)
    /// even when there is only one; with more than one they always get it.
    /// The binary: `REDIS_SERVER_BIN`, else /usr/bin/redis-server.
    #[arg(long)]
    redis: bool,
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
    /// More `engine_aware` settings of `engine_aware_prefix`, as YAML
    /// flow-map entries (e.g. `prefix_home_slack: 0`).
    #[arg(long)]
    affinity_options: Option<String>,
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

/// How a workload's turn becomes chat messages (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Render {
    /// System, the session's first user message, the rest in one more.
    Chat,
    /// System, then user and assistant messages alternating.
    Turns,
    /// System, then one user message holding the whole conversation.
    History,
}

impl Render {
    fn name(self) -> &'static str {
        match self {
            Render::Chat => "chat",
            Render::Turns => "turns",
            Render::History => "history",
        }
    }
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
        // Issue 31's shape: most sessions, not all, on one of a few long
        // shared system prompts; every turn resends the growing history.
        "multi_turn" => Ok(WorkloadConfig {
            system_prompts: 4,
            system_prompt_tokens: 2048,
            shared_system_share: 0.7,
            ..base
        }),
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
fn render_tokens(tokens: &[u32]) -> String {
    const ALPHABET: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
    let mut s = String::with_capacity(tokens.len() * 4);
    for t in tokens {
        for k in 0..4 {
            s.push(ALPHABET[((t >> (6 * k)) & 63) as usize] as char);
        }
    }
    s
}

/// Where a turn's prompt is cut into messages: the ranges of `prompt`
/// after the system prompt's `system_tokens`, alternately user and
/// assistant, ending with the new user message. `previous` are the
/// session's earlier turns as (prompt length, answer length): the workload
/// makes each prompt the previous one, its answer, then a new user message
/// (`router_mock::workload`), so the previous prompt's end is where an
/// answer starts and the answer's end where the next user message starts.
fn segments(
    prompt_len: usize,
    system_tokens: usize,
    previous: &[(usize, usize)],
) -> Vec<std::ops::Range<usize>> {
    let mut cuts = vec![system_tokens.min(prompt_len)];
    for &(len, answer) in previous {
        for cut in [len, len + answer] {
            // Monotone and within the prompt whatever the history says.
            let last = cuts.last().copied().unwrap_or(0);
            cuts.push(cut.clamp(last, prompt_len));
        }
    }
    cuts.push(prompt_len);
    cuts.windows(2).map(|w| w[0]..w[1]).collect()
}

/// The chat messages of one turn, rendered as `render` says.
fn messages(
    prompt: &[u32],
    system_tokens: usize,
    first_len: usize,
    previous: &[(usize, usize)],
    render: Render,
) -> Vec<serde_json::Value> {
    let sys = system_tokens.min(prompt.len());
    let system = json!({"role": "system", "content": render_tokens(&prompt[..sys])});
    match render {
        Render::Chat => {
            let first = first_len.min(prompt.len()).max(sys);
            let mut messages = vec![
                system,
                json!({"role": "user", "content": render_tokens(&prompt[sys..first])}),
            ];
            if first < prompt.len() {
                messages.push(json!({"role": "user", "content": render_tokens(&prompt[first..])}));
            }
            messages
        }
        Render::Turns => {
            let mut messages = vec![system];
            for (k, range) in segments(prompt.len(), system_tokens, previous)
                .into_iter()
                .enumerate()
            {
                let role = if k % 2 == 0 { "user" } else { "assistant" };
                messages.push(json!({"role": role, "content": render_tokens(&prompt[range])}));
            }
            messages
        }
        Render::History => {
            // The engine reads each message as `role\ncontent\n`: labels
            // written the same way inside the one user message give it the
            // very text `turns` gives it.
            let mut content = String::new();
            for (k, range) in segments(prompt.len(), system_tokens, previous)
                .into_iter()
                .enumerate()
            {
                if k > 0 {
                    let role = if k % 2 == 0 { "user" } else { "assistant" };
                    content.push('\n');
                    content.push_str(role);
                    content.push('\n');
                }
                content.push_str(&render_tokens(&prompt[range]));
            }
            vec![system, json!({"role": "user", "content": content})]
        }
    }
}

/// The workload as streamed chat requests, each turn rendered as `render`
/// says (see [`messages`]). `chat`: every turn of a session repeats its
/// first two messages word for word; `turns`: every turn repeats the
/// previous turn's messages and adds the answer and the new user message;
/// `history`: the one user message grows by the answer and the new
/// message, so the text up to the end of the first user message changes
/// every turn.
fn prepare(requests: &[WorkloadRequest], system_tokens: usize, render: Render) -> Vec<Prepared> {
    let mut first_len: HashMap<u64, usize> = HashMap::new();
    let mut history: HashMap<u64, Vec<(usize, usize)>> = HashMap::new();
    requests
        .iter()
        .map(|r| {
            let first = *first_len.entry(r.session).or_insert(r.prompt.len());
            let previous = history.entry(r.session).or_default();
            let messages = messages(&r.prompt, system_tokens, first, previous, render);
            previous.push((r.prompt.len(), r.output_tokens as usize));
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
    affinity_options: Option<&str>,
) -> String {
    let mut load_factor = load_factor.map_or(String::new(), |c| format!(", load_factor: {c}"));
    if let Some(more) = affinity_options {
        load_factor.push_str(", ");
        load_factor.push_str(more);
    }
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

/// The proxies' `CUSTOM_ROUTER_ADMIN_TOKEN`: they serve only loopback.
const ADMIN_TOKEN: &str = "engine-fleet-bench";

/// Starts one `router-proxy --policy`, its stderr in `stderr_path`, with
/// the shared store `store` (a `redis://` URL) if given; returns once it
/// answers its health check and, with a store, says it is connected to it.
async fn start_proxy(
    bin: &PathBuf,
    policy_path: &PathBuf,
    stderr_path: &PathBuf,
    store: Option<&str>,
    client: &Client<HttpConnector, Full<Bytes>>,
) -> Result<Proxy, BoxError> {
    let port = free_port()?;
    let stderr = std::fs::File::create(stderr_path)?;
    let mut command = Command::new(bin);
    command
        .arg("--policy")
        .arg(policy_path)
        .env("CUSTOM_ROUTER_PORT", port.to_string())
        .env("CUSTOM_ROUTER_BIND", "127.0.0.1")
        .env("RUST_LOG", "warn")
        // Health shows the shared store's state only to a caller with the
        // admin token: a token of the bench's own, for its own proxies.
        .env("CUSTOM_ROUTER_ADMIN_TOKEN", ADMIN_TOKEN)
        // The route log (stdout) beside the stderr: what `--keep` keeps.
        .stdout(std::fs::File::create(stderr_path.with_extension("routes"))?)
        .stderr(stderr);
    if let Some(store) = store {
        command.env("CUSTOM_ROUTER_SHARED_STORE", store);
    }
    let proxy = Proxy {
        child: command.spawn()?,
        url: format!("http://127.0.0.1:{port}"),
    };
    let health: http::Uri = format!("{}/_custom_router/health", proxy.url).parse()?;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let req = http::Request::get(health.clone())
            .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
            .body(Full::new(Bytes::new()))?;
        if let Ok(resp) = client.request(req).await {
            if resp.status() == 200 {
                let body = resp.into_body().collect().await?.to_bytes();
                let health: serde_json::Value = serde_json::from_slice(&body)?;
                let connected = health["shared_store"]["connected"].as_bool() == Some(true);
                if store.is_none() || connected {
                    return Ok(proxy);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "router-proxy did not come up{} in 20 s (its stderr: {})",
        if store.is_some() {
            " connected to its shared store"
        } else {
            ""
        },
        stderr_path.display()
    )
    .into())
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
        "affinity_options": args.affinity_options,
        "render": args.render.name(),
        "proxies": args.proxies.max(1),
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
    let render = args.render.name();
    let n_proxies = args.proxies.max(1);
    let with_store = n_proxies > 1 || args.redis;
    println!(
        "| workload | render | proxies | load | strategy | TTFT p50 (ms) | TTFT p99 (ms) | e2e p50 (ms) | e2e p99 (ms) | throughput (req/s) | prefix-cache hits | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
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
            let prepared = prepare(&requests, wcfg.system_prompt_tokens as usize, args.render);
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
                let run = format!("{wname}-{render}-{n_proxies}p-{load}-{strategy}");
                let policy_path = dir.join(format!("{run}.yaml"));
                std::fs::write(
                    &policy_path,
                    policy(
                        strategy,
                        &urls,
                        args.probe_interval_ms,
                        args.load_factor,
                        args.affinity_options.as_deref(),
                    ),
                )?;
                // A fresh store per run, as the engines are fresh: nothing
                // learned in one run helps the next.
                let redis = if with_store {
                    Some(RedisServer::start(&format!("engine-fleet-{run}")).await)
                } else {
                    None
                };
                let store = redis
                    .as_ref()
                    .map(|r| format!("redis://127.0.0.1:{}/0", r.port()));
                let mut proxies = Vec::with_capacity(n_proxies);
                for i in 0..n_proxies {
                    let stderr_path = dir.join(format!("{run}-proxy{i}.stderr"));
                    proxies.push(
                        start_proxy(
                            &args.router_bin,
                            &policy_path,
                            &stderr_path,
                            store.as_deref(),
                            &client,
                        )
                        .await?,
                    );
                }
                let uris = proxies
                    .iter()
                    .map(|p| format!("{}/v1/chat/completions", p.url).parse())
                    .collect::<Result<Vec<http::Uri>, _>>()?;
                let start = Instant::now();
                let tasks: Vec<_> = prepared
                    .iter()
                    .enumerate()
                    .map(|(k, p)| {
                        // Round robin over the proxies, as a load balancer
                        // in front of them would.
                        let uri = uris[k % uris.len()].clone();
                        let (client, body, at) = (client.clone(), p.body.clone(), p.at);
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
                drop(proxies);
                drop(redis);
                drop(engines);
                let ok: Vec<&Measured> = measured.iter().filter(|m| m.ok).collect();
                let errors = measured.len() - ok.len();
                if errors > 0 {
                    let mut by_status: HashMap<u16, usize> = HashMap::new();
                    for m in measured.iter().filter(|m| !m.ok) {
                        *by_status.entry(m.status).or_default() += 1;
                    }
                    eprintln!("{run}: errors by status {by_status:?}");
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
                    "| {wname} | {render} | {n_proxies} | {:.0}% | {strategy} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} | {:.1}% | {errors} |",
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
                    "render": render,
                    "proxies": n_proxies,
                    "shared_store": with_store,
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

    /// The text the router's former one-hash key covered: every message up
    /// to and including the first user message.
    fn lead_text(body: &[u8]) -> Vec<u8> {
        let v: serde_json::Value = serde_json::from_slice(body).expect("json");
        let mut out = Vec::new();
        for m in v["messages"].as_array().expect("messages") {
            out.extend_from_slice(m["role"].as_str().unwrap_or("").as_bytes());
            out.extend_from_slice(m["content"].as_str().unwrap_or("").as_bytes());
            if m["role"] == "user" {
                break;
            }
        }
        out
    }

    /// The router's block chain of a request (as a pool with default
    /// prefix affinity hashes it).
    fn chain(body: &[u8]) -> Vec<u64> {
        let text = router_policy::prefix_cache::prompt_text(body).expect("a prompt");
        router_policy::prefix_cache::block_chain(&text, 64, 4096)
    }

    #[test]
    fn turns_of_a_session_repeat_their_first_two_messages() {
        let cfg = WorkloadConfig {
            requests: 40,
            system_prompt_tokens: 32,
            ..WorkloadConfig::default()
        };
        let requests = workload::generate(&cfg);
        let prepared = prepare(&requests, 32, Render::Chat);
        let lead = |b: &Bytes| lead_text(b);
        let mut seen: HashMap<u64, Vec<u8>> = HashMap::new();
        for (r, p) in requests.iter().zip(&prepared) {
            let l = lead(&p.body);
            assert_eq!(seen.entry(r.session).or_insert_with(|| l.clone()), &l);
        }
        assert_eq!(render_tokens(&[0, 63]), "aaaa_aaa");
    }

    /// A multi-turn workload with short system prompts, 70% shared.
    fn multi_turn(requests: usize) -> Vec<WorkloadRequest> {
        workload::generate(&WorkloadConfig {
            requests,
            system_prompt_tokens: 32,
            shared_system_share: 0.7,
            ..WorkloadConfig::default()
        })
    }

    fn json_of(p: &Prepared) -> serde_json::Value {
        serde_json::from_slice(&p.body).expect("JSON")
    }

    /// Each session's turns in order, as (request, rendered body).
    fn by_session<'a>(
        requests: &'a [WorkloadRequest],
        prepared: &'a [Prepared],
    ) -> HashMap<u64, Vec<(&'a WorkloadRequest, &'a Prepared)>> {
        let mut sessions: HashMap<u64, Vec<_>> = HashMap::new();
        for (r, p) in requests.iter().zip(prepared) {
            sessions.entry(r.session).or_default().push((r, p));
        }
        sessions
    }

    #[test]
    fn segments_alternate_user_and_answer_where_the_turns_ended() {
        assert_eq!(segments(100, 10, &[]), vec![10..100]);
        assert_eq!(
            segments(100, 10, &[(30, 20), (70, 5)]),
            vec![10..30, 30..50, 50..70, 70..75, 75..100]
        );
        // A history that does not fit is clamped, never out of range.
        assert_eq!(segments(40, 10, &[(30, 20)]), vec![10..30, 30..40, 40..40]);
    }

    /// In every rendering, each turn's messages extend the previous turn's
    /// up to the new message, and so does the token stream the engine
    /// makes of them (all but the last token, which holds the closing
    /// newline of the previous text).
    #[test]
    fn each_turn_extends_the_previous_one_in_every_rendering() {
        let requests = multi_turn(120);
        assert!(requests.iter().any(|r| r.turn >= 2));
        for render in [Render::Chat, Render::Turns, Render::History] {
            let prepared = prepare(&requests, 32, render);
            for turns in by_session(&requests, &prepared).values() {
                for pair in turns.windows(2) {
                    let (before, after) = (json_of(pair[0].1), json_of(pair[1].1));
                    let (b, a) = (
                        before["messages"].as_array().expect("messages"),
                        after["messages"].as_array().expect("messages"),
                    );
                    let content =
                        |m: &serde_json::Value| m["content"].as_str().expect("text").to_owned();
                    match render {
                        Render::Chat => {
                            assert_eq!(a[..2], b[..2]);
                            assert_eq!(a.len(), 3);
                            if b.len() == 3 {
                                assert!(content(&a[2]).starts_with(&content(&b[2])));
                            }
                        }
                        Render::Turns => {
                            assert_eq!(a[..b.len()], b[..]);
                            assert_eq!(a.len(), b.len() + 2);
                            assert_eq!(a[b.len()]["role"], "assistant");
                            assert_eq!(a[b.len() + 1]["role"], "user");
                        }
                        Render::History => {
                            assert_eq!((a.len(), b.len()), (2, 2));
                            assert_eq!(a[0], b[0]);
                            let grown = content(&a[1]);
                            let rest = grown
                                .strip_prefix(&content(&b[1]))
                                .expect("the history grows at its end");
                            assert!(rest.starts_with("\nassistant\n"), "{render:?}");
                        }
                    }
                    let tb = router_mock::prompt_token_ids(&pair[0].1.body);
                    let ta = router_mock::prompt_token_ids(&pair[1].1.body);
                    let kept = tb.len() - 1;
                    assert_eq!(ta[..kept], tb[..kept], "{render:?}");
                }
            }
        }
    }

    /// `turns` and `history` give the engine the very same token ids; the
    /// engine sees the workload's tokens plus the role labels: `system\n`,
    /// `\n` and per message `user\n`/`assistant\n` and `\n` (4 bytes a
    /// token), i.e. (14 + 17 × earlier turns) bytes in `turns` and
    /// `history`, 14 bytes on a first turn and 20 after it in `chat`.
    #[test]
    fn turns_and_history_give_the_engine_the_same_tokens() {
        let requests = multi_turn(120);
        let chat = prepare(&requests, 32, Render::Chat);
        let turns = prepare(&requests, 32, Render::Turns);
        let history = prepare(&requests, 32, Render::History);
        for (k, r) in requests.iter().enumerate() {
            let t = router_mock::prompt_token_ids(&turns[k].body);
            let h = router_mock::prompt_token_ids(&history[k].body);
            let c = router_mock::prompt_token_ids(&chat[k].body);
            assert_eq!(t, h);
            let bytes = 4 * r.prompt.len();
            let turn = r.turn as usize;
            assert_eq!(t.len(), (bytes + 14 + 17 * turn).div_ceil(4));
            let chat_labels = if turn == 0 { 14 } else { 20 };
            assert_eq!(c.len(), (bytes + chat_labels).div_ceil(4));
            // All three agree on the system prompt and the first user
            // message, of 4 tokens at least: 8 + 4 × 32 + 5 + 4 × 4 = 157
            // bytes, 39 whole tokens.
            assert_eq!(c[..39], t[..39]);
        }
    }

    /// What the router's one-hash key covers (up to the end of the first
    /// user message) stays put over a session's turns with `chat` and
    /// `turns`, and changes every turn with `history`.
    #[test]
    fn the_router_key_text_changes_every_turn_only_with_history() {
        let requests = multi_turn(120);
        let lead = |p: &Prepared| lead_text(&p.body);
        for render in [Render::Chat, Render::Turns, Render::History] {
            let prepared = prepare(&requests, 32, render);
            for turns in by_session(&requests, &prepared).values() {
                for pair in turns.windows(2) {
                    let same = lead(pair[0].1) == lead(pair[1].1);
                    assert_eq!(same, render != Render::History, "{render:?}");
                }
            }
        }
    }

    /// What the router hashes now, the whole prompt as a chain of blocks,
    /// grows turn by turn in every rendering: a turn's chain holds the
    /// previous turn's (but for its last block, which may end in the
    /// previous turn's closing newline).
    #[test]
    fn the_router_chain_of_a_turn_extends_the_previous_turns_in_every_rendering() {
        let requests = multi_turn(120);
        let mut pairs = 0;
        for render in [Render::Chat, Render::Turns, Render::History] {
            let prepared = prepare(&requests, 32, render);
            for turns in by_session(&requests, &prepared).values() {
                for pair in turns.windows(2) {
                    let (a, b) = (chain(&pair[0].1.body), chain(&pair[1].1.body));
                    let kept = a.len().saturating_sub(1);
                    assert!(kept > 0 && b.starts_with(&a[..kept]), "{render:?}");
                    pairs += 1;
                }
            }
        }
        assert!(pairs > 30, "{pairs}");
    }

    #[test]
    fn the_multi_turn_workload_is_issue_31s_shape() {
        let config = workload_config("multi_turn", 1, 100).expect("known");
        assert_eq!(config.system_prompts, 4);
        assert_eq!(config.system_prompt_tokens, 2048);
        assert_eq!(config.shared_system_share, 0.7);
        assert!(workload_config("nonsense", 1, 100).is_err());
    }
}
