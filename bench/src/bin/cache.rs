//! `cache-bench`: what the response cache costs and saves, per request.
//!
//! One mock model endpoint that answers at once (so the numbers are the
//! router's own work, not a model's), one policy with two routes on it:
//! `cached` (`cache: {ttl_s: 3600, partition: route}`, requests for model
//! `c`) and `plain` (no cache, every other model). Two proxies in-process,
//! one worker each: one whose cache lives in its own memory, one whose
//! cache lives in a `redis-server` on loopback (persistence off). One
//! keep-alive client connection sends requests one after another in
//! alternating blocks of each kind:
//!
//! - `uncached`: the `plain` route, a new question each time;
//! - `miss`: the `cached` route, a new question each time (looked up,
//!   routed, the answer stored);
//! - `hit`: the `cached` route, the same question (answered from the
//!   cache, no backend request).
//!
//! It reports p50, p90 and p99 of each kind on each proxy. With a real
//! model a miss also waits for the model (hundreds of ms to seconds) and a
//! hit does not: the hit's latency here is what a repeated prompt costs.
//!
//! Run from a release build: `cargo run --release -p router-bench --bin
//! cache-bench`.

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_test_kit::redis::RedisServer;
use router_test_kit::stats::{loadavg, p50_p90_p99, Blocks};
use router_test_kit::BoxError;

/// Measure the response cache's hit and miss latency, local and on Redis.
#[derive(Parser, Debug)]
struct Args {
    /// Requests of each kind (on each proxy), per block, warm-up.
    #[command(flatten)]
    blocks: Blocks,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Uncached,
    Miss,
    Hit,
}

const KINDS: [Kind; 3] = [Kind::Uncached, Kind::Miss, Kind::Hit];

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

/// p50, p90, p99 in ms.
type Row = (f64, f64, f64);

async fn run(args: Args) -> Result<(), BoxError> {
    let redis = RedisServer::start("cache-bench").await;
    let mock = router_mock::MockModel::start(router_mock::MockConfig::default())
        .await
        .map_err(|e| format!("mock: {e}"))?;
    let policy = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: only\n      endpoints: [\"{}\"]\n  routes:\n    - name: cached\n      match: {{model: [c]}}\n      chain: [only]\n      cache: {{ttl_s: 3600, partition: route}}\n    - name: plain\n      chain: [only]\n",
        mock.url()
    );
    let mut results: Vec<(&str, [Row; 3])> = Vec::new();
    let started = Instant::now();
    for (name, port) in [("local", None), ("redis", Some(redis.port()))] {
        let proxy = router_test_kit::proxy::inline(&policy, port).await?;
        let rows = measure(
            &args,
            &format!("http://{}/v1/chat/completions", proxy.local_addr()),
        )
        .await?;
        results.push((name, rows));
        proxy.shutdown();
    }
    let wall = started.elapsed();
    if args.json {
        let ms = |r: &Row| serde_json::json!({"p50": r.0, "p90": r.1, "p99": r.2});
        let mut out = serde_json::Map::new();
        for (name, rows) in &results {
            out.insert(
                (*name).to_string(),
                serde_json::json!({
                    "uncached_ms": ms(&rows[0]),
                    "miss_ms": ms(&rows[1]),
                    "hit_ms": ms(&rows[2]),
                }),
            );
        }
        out.insert("requests_per_kind".into(), args.blocks.requests.into());
        out.insert("loadavg".into(), loadavg().into());
        out.insert("wall_s".into(), wall.as_secs_f64().into());
        println!("{}", serde_json::Value::Object(out));
        return Ok(());
    }
    println!(
        "{} requests of each kind per proxy, blocks of {}, one keep-alive connection, a backend that answers at once ({:.1} s)",
        args.blocks.requests,
        args.blocks.block,
        wall.as_secs_f64()
    );
    println!("store  kind                  p50 ms    p90 ms    p99 ms");
    for (name, rows) in &results {
        for (kind, r) in ["uncached route", "cached route, miss", "cached route, hit"]
            .iter()
            .zip(rows)
        {
            println!(
                "{name:<6} {kind:<20} {:>8.3}  {:>8.3}  {:>8.3}",
                r.0, r.1, r.2
            );
        }
        let (u, m, h) = (rows[0], rows[1], rows[2]);
        println!(
            "{name:<6} miss - uncached      {:>8.3}  {:>8.3}  {:>8.3}",
            m.0 - u.0,
            m.1 - u.1,
            m.2 - u.2
        );
        println!(
            "{name:<6} hit / uncached       {:>8.2}x {:>8.2}x {:>8.2}x",
            h.0 / u.0,
            h.1 / u.1,
            h.2 / u.2
        );
    }
    println!("load average at the end: {}", loadavg());
    Ok(())
}

/// Each kind's latencies against the proxy at `url`.
async fn measure(args: &Args, url: &str) -> Result<[Row; 3], BoxError> {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build(HttpConnector::new());
    let mut n = 0u64;
    let mut one = |kind: Kind| {
        n += 1;
        // The same size of body for every kind: a question numbered so
        // that each is new, or the one repeated question.
        let (model, question) = match kind {
            Kind::Uncached => ("u", format!("question {n:012}")),
            Kind::Miss => ("c", format!("question {n:012}")),
            Kind::Hit => ("c", "question 000000000000".to_string()),
        };
        let body = format!(
            r#"{{"model":"{model}","temperature":0,"messages":[{{"role":"user","content":"{question}"}}]}}"#
        );
        let req = http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)));
        let client = client.clone();
        async move {
            let req = req?;
            let t0 = Instant::now();
            let resp = client.request(req).await?;
            let status = resp.status();
            let cache = resp
                .headers()
                .get("x-router-cache")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            resp.into_body().collect().await?;
            let took = t0.elapsed();
            let want = match kind {
                Kind::Uncached => "",
                Kind::Miss => "miss",
                Kind::Hit => "hit",
            };
            if !status.is_success() || cache != want {
                return Err::<Duration, BoxError>(
                    format!("{kind:?}: status {status}, x-router-cache {cache:?}").into(),
                );
            }
            Ok(took)
        }
    };
    // The repeated question is stored by the first hit's warm-up (a
    // miss).
    for k in KINDS {
        for i in 0..args.blocks.warmup {
            match (k, i) {
                (Kind::Hit, 0) => {
                    let _ = one(k).await;
                }
                _ => {
                    one(k).await?;
                }
            }
        }
    }
    let samples = args.blocks.sample(&KINDS, one).await?;
    Ok([
        p50_p90_p99(&samples[0]),
        p50_p90_p99(&samples[1]),
        p50_p90_p99(&samples[2]),
    ])
}
