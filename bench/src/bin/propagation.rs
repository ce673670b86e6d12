//! `propagation-bench`: how long a policy change takes from `ApplyPolicy`
//! to every connected proxy, for 10, 100 and 1,000 proxies.
//!
//! It starts the release `router-control-plane` binary as a child process,
//! connects N lightweight stream clients (each its own HTTP/2 connection,
//! speaking the real `ProxyConfig.Stream` protocol: hello, then an ACK for
//! every snapshot), applies a series of policies, and measures for every
//! client the time from the start of the apply call to the arrival of the
//! snapshot with the new revision (the ACK leaves right after). It also
//! reads the control plane's resident memory with all streams connected.
//!
//! With `--etcd --replicas 2` it starts a local etcd (Debian's
//! `etcd-server`, or `ETCD_BIN`) and that many control-plane replicas on
//! it; the clients are spread round-robin across the replicas and every
//! apply goes through the first one, so most deliveries cross replicas
//! (apply → etcd transaction → the other replicas' watch → their streams).

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use router_proto::v1 as pb;
use router_proto::v1::admin_client::AdminClient;
use router_proto::v1::proxy_config_client::ProxyConfigClient;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// Measure config propagation from the control plane to N proxies.
#[derive(Parser, Debug)]
struct Args {
    /// Fleet sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    proxies: Vec<usize>,
    /// Policy applies per fleet size.
    #[arg(long, default_value_t = 20)]
    applies: usize,
    /// The control-plane binary (default: next to this one).
    #[arg(long)]
    control_plane_bin: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Share state through a local etcd started for the run.
    #[arg(long)]
    etcd: bool,
    /// Control-plane replicas (more than one needs --etcd).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
}

use router_test_kit::server_process::free_port;

/// Starts a one-member etcd in `dir`; returns it and its client address.
fn start_etcd(dir: &std::path::Path) -> Result<(Killer, String), Box<dyn std::error::Error>> {
    let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into());
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new(&bin)
        .args(["--name", "bench", "--data-dir"])
        .arg(dir.join("etcd"))
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("bench={peer_url}"),
            "--log-level",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {bin} (apt-get install etcd-server): {e}"))?;
    Ok((Killer(child), format!("127.0.0.1:{client}")))
}

struct Killer(Child);

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn policy(n: usize) -> String {
    format!(
        "apiVersion: router/v1\nkind: RoutingPolicy\nmetadata: {{name: bench-{n}}}\nspec:\n  pools: [{{name: a, endpoints: [\"127.0.0.1:9\"]}}]\n  routes: [{{name: r, chain: [a]}}]\n"
    )
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[rank]
}

type Arrivals = Arc<Mutex<Vec<(u64, Instant)>>>;

async fn client(
    addr: String,
    node: String,
    arrivals: Arrivals,
    ready: mpsc::Sender<()>,
) -> Result<(), String> {
    let channel = tonic::transport::Endpoint::from_shared(addr)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut c = ProxyConfigClient::new(channel);
    let (tx, rx) = mpsc::channel(8);
    tx.send(pb::ProxyMessage {
        msg: Some(pb::proxy_message::Msg::Hello(pb::Hello {
            node_id: node,
            last_applied_revision: 0,
        })),
    })
    .await
    .map_err(|e| e.to_string())?;
    let mut inbound = c
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let mut first = true;
    while let Some(Ok(m)) = inbound.next().await {
        let at = Instant::now();
        arrivals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((m.revision, at));
        let _ = tx
            .send(pb::ProxyMessage {
                msg: Some(pb::proxy_message::Msg::Ack(pb::Ack {
                    revision: m.revision,
                    nonce: m.nonce,
                })),
            })
            .await;
        if first {
            first = false;
            let _ = ready.send(()).await;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let bin = match &args.control_plane_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("router-control-plane"),
    };
    if args.replicas > 1 && !args.etcd {
        return Err("--replicas above 1 needs --etcd".into());
    }
    let dir = std::env::temp_dir().join(format!("propagation-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut guards = Vec::new();
    let store = if args.etcd {
        let (etcd, endpoint) = start_etcd(&dir)?;
        guards.push(etcd);
        Some(format!("etcd://{endpoint}/bench"))
    } else {
        None
    };
    let mut pids = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..args.replicas.max(1) {
        let port = free_port();
        let mut cmd = Command::new(&bin);
        // Several replicas on one machine: no console (it would take one port for all).
        cmd.args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--console-listen",
            "off",
        ]);
        match &store {
            Some(url) => cmd.args(["--store", url, "--node-id", &format!("cp-{i}")]),
            None => cmd.arg("--data-dir").arg(&dir),
        };
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        pids.push(child.id());
        guards.push(Killer(child));
        addrs.push(format!("http://127.0.0.1:{port}"));
    }
    let addr = addrs[0].clone();
    let mut admin = None;
    for _ in 0..200 {
        if let Ok(c) = AdminClient::connect(addr.clone()).await {
            admin = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut admin = admin.ok_or("the control plane did not come up")?;
    admin
        .apply_policy(pb::ApplyPolicyRequest {
            document: policy(0),
            ..Default::default()
        })
        .await?;

    let mut results = Vec::new();
    let mut connected = 0usize;
    let arrivals: Arrivals = Arc::new(Mutex::new(Vec::new()));
    let mut serial = 1usize;
    for &n in &args.proxies {
        // Grow the fleet to n streams.
        let (ready_tx, mut ready_rx) = mpsc::channel(n.max(1));
        for i in connected..n {
            let (addr, arrivals, ready) = (
                addrs[i % addrs.len()].clone(),
                Arc::clone(&arrivals),
                ready_tx.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = client(addr, format!("bench-{i}"), arrivals, ready).await {
                    eprintln!("client {i}: {e}");
                }
            });
        }
        for _ in connected..n {
            tokio::time::timeout(Duration::from_secs(30), ready_rx.recv())
                .await
                .map_err(|_| "streams did not connect in 30 s")?;
        }
        connected = n;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss = pids.iter().filter_map(|p| rss_kib(*p)).max();
        let mut latencies = Vec::with_capacity(n * args.applies);
        for _ in 0..args.applies {
            let started = Instant::now();
            let r = admin
                .apply_policy(pb::ApplyPolicyRequest {
                    document: policy(serial),
                    ..Default::default()
                })
                .await?
                .into_inner();
            serial += 1;
            let deadline = started + Duration::from_secs(10);
            loop {
                let got: Vec<Instant> = arrivals
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .filter(|(rev, _)| *rev == r.revision)
                    .map(|(_, at)| *at)
                    .collect();
                if got.len() >= n || Instant::now() > deadline {
                    latencies.extend(got.iter().map(|at| at.saturating_duration_since(started)));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            arrivals.lock().unwrap_or_else(|e| e.into_inner()).clear();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        latencies.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        results.push(serde_json::json!({
            "proxies": n,
            "applies": args.applies,
            "deliveries": latencies.len(),
            "expected_deliveries": n * args.applies,
            "p50_ms": ms(percentile(&latencies, 0.5)),
            "p99_ms": ms(percentile(&latencies, 0.99)),
            "max_ms": ms(latencies.last().copied().unwrap_or_default()),
            "control_plane_rss_mib": rss.map(|k| k as f64 / 1024.0),
            "replicas": addrs.len(),
            "store": if args.etcd { "etcd" } else { "embedded" },
        }));
    }
    if args.json {
        println!("{}", serde_json::Value::Array(results));
    } else {
        println!(
            "propagation from ApplyPolicy to each proxy's stream ({} applies per size; {} replica(s), {} store)",
            args.applies,
            addrs.len(),
            if args.etcd { "etcd" } else { "embedded" }
        );
        println!(
            "{:>8} {:>11} {:>9} {:>9} {:>9} {:>14}",
            "proxies", "deliveries", "p50 ms", "p99 ms", "max ms", "cp RSS MiB"
        );
        for r in &results {
            println!(
                "{:>8} {:>5}/{:<5} {:>9.2} {:>9.2} {:>9.2} {:>14.1}",
                r["proxies"].as_u64().unwrap_or(0),
                r["deliveries"].as_u64().unwrap_or(0),
                r["expected_deliveries"].as_u64().unwrap_or(0),
                r["p50_ms"].as_f64().unwrap_or(0.0),
                r["p99_ms"].as_f64().unwrap_or(0.0),
                r["max_ms"].as_f64().unwrap_or(0.0),
                r["control_plane_rss_mib"].as_f64().unwrap_or(0.0)
            );
        }
        println!("targets: p99 < 50 ms at 100 proxies, < 500 ms at 1,000");
    }
    drop(guards);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
