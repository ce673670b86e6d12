//! `idempotency-bench`: what an `Idempotency-Key` adds to a request's
//! latency when the keys live in Redis on loopback.
//!
//! It starts a `redis-server` (Debian's package, or `REDIS_SERVER_BIN`) on
//! a free loopback port with persistence off, a mock model endpoint that
//! answers at once, and a proxy in-process with
//! `CUSTOM_ROUTER_SHARED_STORE` pointing at that Redis. One client
//! connection (keep-alive) then sends requests one after another, in
//! alternating blocks: unkeyed, and keyed with a fresh key each (so every
//! keyed request leads: one `SET NX GET` claim before routing, one settle
//! script after the answer). It reports p50, p90 and p99 of each and of a
//! third kind, keyed retries answered from the store (replays).
//!
//! Run from a release build: `cargo run --release -p router-bench --bin
//! idempotency-bench`.

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Measure the added latency of keyed requests with Redis on loopback.
#[derive(Parser, Debug)]
struct Args {
    /// Requests of each kind (on each proxy), per block, warm-up.
    #[command(flatten)]
    blocks: Blocks,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

use router_test_kit::proxy::on_redis as proxy_on_redis;
use router_test_kit::redis::RedisServer;
use router_test_kit::stats::{loadavg, p50_p90_p99, Blocks};
use router_test_kit::BoxError;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Unkeyed,
    Keyed,
    Replay,
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
    let redis = RedisServer::start("idempotency-bench").await;
    let port = redis.port();
    let mock = router_mock::MockModel::start(router_mock::MockConfig::default())
        .await
        .map_err(|e| format!("mock: {e}"))?;
    let policy = format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: only\n      endpoints: [\"{}\"]\n  routes:\n    - name: r\n      chain: [only]\n",
        mock.url()
    );
    let proxy = proxy_on_redis(&policy, port).await?;
    let url = format!("http://{}/v1/chat/completions", proxy.local_addr());
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build(HttpConnector::new());
    let body = Bytes::from_static(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#);
    let mut n = 0u64;
    let mut one = |kind: Kind| {
        n += 1;
        let key = match kind {
            Kind::Unkeyed => None,
            Kind::Keyed => Some(format!("bench-{n}")),
            Kind::Replay => Some("bench-replay".to_string()),
        };
        let mut req = http::Request::post(&url).header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
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
                return Err::<Duration, BoxError>(format!("{kind:?}: status {status}").into());
            }
            Ok(took)
        }
    };
    let kinds = [Kind::Unkeyed, Kind::Keyed, Kind::Replay];
    for k in kinds {
        for _ in 0..args.blocks.warmup {
            one(k).await?;
        }
    }
    let started = Instant::now();
    let samples = args.blocks.sample(&kinds, one).await?;
    let wall = started.elapsed();
    let (u, k, r) = (
        p50_p90_p99(&samples[0]),
        p50_p90_p99(&samples[1]),
        p50_p90_p99(&samples[2]),
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "requests_per_kind": args.blocks.requests,
                "unkeyed_ms": {"p50": u.0, "p90": u.1, "p99": u.2},
                "keyed_lead_ms": {"p50": k.0, "p90": k.1, "p99": k.2},
                "keyed_replay_ms": {"p50": r.0, "p90": r.1, "p99": r.2},
                "added_ms": {"p50": k.0 - u.0, "p90": k.1 - u.1, "p99": k.2 - u.2},
                "loadavg": loadavg(),
                "wall_s": wall.as_secs_f64(),
            })
        );
    } else {
        println!(
            "{} requests of each kind, blocks of {}, one keep-alive connection, Redis on loopback ({:.1} s)",
            args.blocks.requests,
            args.blocks.block,
            wall.as_secs_f64()
        );
        println!("kind                    p50 ms    p90 ms    p99 ms");
        for (name, v) in [
            ("unkeyed", u),
            ("keyed (claim + store)", k),
            ("keyed retry (replay)", r),
        ] {
            println!("{name:<22} {:>8.3}  {:>8.3}  {:>8.3}", v.0, v.1, v.2);
        }
        println!(
            "added by a key         {:>8.3}  {:>8.3}  {:>8.3}   (goal: < 0.3 at p50, < 1 at p99)",
            k.0 - u.0,
            k.1 - u.1,
            k.2 - u.2
        );
        println!("load average at the end: {}", loadavg());
    }
    proxy.shutdown();
    Ok(())
}
