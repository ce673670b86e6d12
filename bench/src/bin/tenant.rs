//! `tenant-bench`: what a tenant's checks add to a request's latency when
//! the limits live in Redis on loopback: the key lookup (a SHA-256), the
//! rate limit (one script call), the budget reservation (one script call)
//! and its settlement (one transaction, after the answer).
//!
//! It starts a `redis-server` (Debian's package, or `REDIS_SERVER_BIN`) on
//! a free loopback port with persistence off, a mock model endpoint that
//! answers at once, and two proxies in-process on that Redis: one whose
//! policy has no tenants, one whose tenant has a rate limit (high enough
//! never to refuse) and a daily budget (large enough). One keep-alive
//! client per proxy sends requests one after another, in alternating
//! blocks; it reports p50, p90 and p99 of each and the difference.
//!
//! Run from a release build: `cargo run --release -p router-bench --bin
//! tenant-bench`.

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use router_test_kit::proxy::on_redis as proxy_on_redis;
use router_test_kit::redis::RedisServer;
use router_test_kit::stats::{loadavg, p50_p90_p99, Blocks};
use router_test_kit::BoxError;

/// Measure the added latency of a tenant's checks with Redis on loopback.
#[derive(Parser, Debug)]
struct Args {
    /// Requests of each kind (on each proxy), per block, warm-up.
    #[command(flatten)]
    blocks: Blocks,
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<(), BoxError> {
    let redis = RedisServer::start("tenant-bench").await;
    let port = redis.port();
    let mock = router_mock::MockModel::start(router_mock::MockConfig::default())
        .await
        .map_err(|e| format!("mock: {e}"))?;
    let base = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: only\n      endpoints: [\"{}\"]\n      price: {{input_per_1k_usd: 0.001, output_per_1k_usd: 0.002}}\n  routes:\n    - name: r\n      chain: [only]\n",
        mock.url()
    );
    let tenanted = format!(
        "{base}  tenants:\n    - name: bench\n      keys: [\"{}\"]\n      limits: {{requests_per_minute: 100000000, budget_usd_per_day: 1000000}}\n",
        router_policy::tenant::key_hash_text("rt_bench")
    );
    let plain = proxy_on_redis(&base, port).await?;
    let tenant = proxy_on_redis(&tenanted, port).await?;
    let urls = [plain.local_addr(), tenant.local_addr()]
        .map(|a| format!("http://{a}/v1/chat/completions"));
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build(HttpConnector::new());
    let body = Bytes::from_static(
        br#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let one = |kind: usize| {
        let mut req = http::Request::post(&urls[kind]).header("content-type", "application/json");
        if kind == 1 {
            req = req.header("authorization", "Bearer rt_bench");
        }
        let req = req.body(Full::new(body.clone()));
        let client = client.clone();
        async move {
            let req = req?;
            let t0 = Instant::now();
            let resp = client.request(req).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            let took = t0.elapsed();
            if !status.is_success() {
                return Err::<Duration, BoxError>(format!("kind {kind}: status {status}").into());
            }
            Ok(took)
        }
    };
    for k in 0..2 {
        for _ in 0..args.blocks.warmup {
            one(k).await?;
        }
    }
    let started = Instant::now();
    let samples = args.blocks.sample(&[0, 1], one).await?;
    let wall = started.elapsed();
    let (p, t) = (p50_p90_p99(&samples[0]), p50_p90_p99(&samples[1]));
    println!(
        "{} requests of each kind, blocks of {}, one keep-alive connection each, Redis on loopback ({:.1} s)",
        args.blocks.requests,
        args.blocks.block,
        wall.as_secs_f64()
    );
    println!("kind                         p50 ms    p90 ms    p99 ms");
    println!(
        "no tenants                 {:>8.3}  {:>8.3}  {:>8.3}",
        p.0, p.1, p.2
    );
    println!(
        "tenant (rate + budget)     {:>8.3}  {:>8.3}  {:>8.3}",
        t.0, t.1, t.2
    );
    println!(
        "added by a tenant          {:>8.3}  {:>8.3}  {:>8.3}   (goal: < 0.3 at p50, < 1 at p99)",
        t.0 - p.0,
        t.1 - p.1,
        t.2 - p.2
    );
    println!("load average at the end: {}", loadavg());
    plain.shutdown();
    tenant.shutdown();
    Ok(())
}
