//! `memory-bench`: the heap the proxy holds per idle connection, per
//! queued request, per request in flight, per stored `Idempotency-Key`
//! answer, per pool and per endpoint, measured with the dhat heap
//! profiler.
//!
//! Resident memory seen from outside (the soak) says whether memory stays
//! flat; it cannot say what each thing costs. Here the proxy runs
//! in-process under dhat's allocator, and each item is measured as the
//! change of live heap bytes (`dhat::HeapStats::curr_bytes`) when N of
//! them are added, divided by N. A tiny backend in the same process
//! answers a ~300-byte JSON answer at once, or holds every request until
//! told (for requests in flight and queued). The clients are bare tokio
//! sockets writing HTTP/1.1 by hand, so that the client side adds little
//! (its own share is measured and printed too, and subtracted).
//!
//! Behind the `dhat-heap` feature so that no other build pays for dhat:
//!
//! ```text
//! cargo run --release -p router-bench --features dhat-heap --bin memory-bench
//! ```

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use router_policy::Policy;
use router_proxy::{Mode, ProxyOptions, RunningProxy, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Measure the proxy's heap per connection, request, stored answer,
/// pool and endpoint.
#[derive(Parser, Debug)]
struct Args {
    /// Items of each kind added for one measurement.
    #[arg(long, default_value_t = 200)]
    n: usize,
    /// Stored answers added (more, to see past the store's map growth).
    #[arg(long, default_value_t = 2000)]
    stored: usize,
}

/// The ~300-byte answer (as `proxy-bench`'s backend and the soak's nginx).
const ANSWER: &str = concat!(
    r#"{"id":"chatcmpl-bench-0001","object":"chat.completion","created":1700000000,"#,
    r#""model":"bench","choices":[{"index":0,"message":{"role":"assistant","#,
    r#""content":"Hello! This is a fixed answer from the benchmark backend."},"#,
    r#""logprobs":null,"finish_reason":"stop"}],"#,
    r#""usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#
);

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// The backend: answers at once, or holds requests while `hold` is set.
struct Backend {
    addr: SocketAddr,
    hold: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

async fn backend() -> Result<Backend, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let hold = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Notify::new());
    let (h, n, r) = (Arc::clone(&hold), Arc::clone(&held), Arc::clone(&release));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (h, n, r) = (Arc::clone(&h), Arc::clone(&n), Arc::clone(&r));
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (h, n, r) = (Arc::clone(&h), Arc::clone(&n), Arc::clone(&r));
                    async move {
                        let _ = req.into_body().collect().await;
                        if h.load(Ordering::Relaxed) {
                            let released = r.notified();
                            n.fetch_add(1, Ordering::Relaxed);
                            released.await;
                            n.fetch_sub(1, Ordering::Relaxed);
                        }
                        let mut resp =
                            Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
                        resp.headers_mut().insert(
                            hyper::header::CONTENT_TYPE,
                            hyper::header::HeaderValue::from_static("application/json"),
                        );
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(Backend {
        addr,
        hold,
        held,
        release,
    })
}

fn policy(
    pools: usize,
    endpoints: &[String],
    max_concurrency: Option<usize>,
) -> Result<Policy, BoxError> {
    let eps = endpoints
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut doc = String::from("apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n");
    for p in 0..pools {
        doc.push_str(&format!("    - name: p{p}\n      endpoints: [{eps}]\n"));
        if let Some(c) = max_concurrency {
            doc.push_str(&format!("      max_concurrency: {c}\n"));
        }
    }
    doc.push_str("  routes:\n    - name: r\n      chain: [p0]\n");
    router_policy::document::load(&doc, &router_policy::QueueSettings::default())
        .map_err(|e| e.to_string().into())
}

fn heap() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

/// Lets background work (connection tasks, settles) finish, then reads
/// the live heap.
async fn settled_heap() -> u64 {
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    heap()
}

/// A client connection writing HTTP/1.1 by hand.
struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Result<Self, BoxError> {
        Ok(Self {
            stream: TcpStream::connect(addr).await?,
            buf: Vec::with_capacity(4096),
        })
    }

    async fn send(&mut self, key: Option<&str>) -> Result<(), BoxError> {
        let key = key
            .map(|k| format!("idempotency-key: {k}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{key}\r\n{BODY}",
            BODY.len()
        );
        self.stream.write_all(req.as_bytes()).await?;
        Ok(())
    }

    /// Reads one answer (head and a content-length body).
    async fn read(&mut self) -> Result<(), BoxError> {
        self.buf.clear();
        let mut chunk = [0u8; 2048];
        loop {
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err("closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&self.buf);
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if self.buf.len() >= end + 4 + len {
                    return Ok(());
                }
            }
        }
    }
}

/// Sends one request on each of `conns` with the backend holding, and
/// waits until the backend holds them all.
async fn hold_all(be: &Backend, conns: &mut [Raw]) -> Result<(), BoxError> {
    be.hold.store(true, Ordering::Relaxed);
    for c in conns.iter_mut() {
        c.send(None).await?;
    }
    while be.held.load(Ordering::Relaxed) < conns.len() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Lets the backend answer everything it holds, and reads the answers.
async fn release_all(be: &Backend, conns: &mut [Raw]) -> Result<(), BoxError> {
    be.hold.store(false, Ordering::Relaxed);
    while be.held.load(Ordering::Relaxed) > 0 {
        be.release.notify_waiters();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in conns.iter_mut() {
        c.read().await?;
    }
    Ok(())
}

async fn start(policy: Policy) -> Result<RunningProxy, BoxError> {
    let settings = Settings {
        bind: [127, 0, 0, 1].into(),
        port: 0,
        workers: 1,
        ..Settings::default()
    };
    Ok(router_proxy::start(ProxyOptions {
        settings,
        mode: Mode::Inline(Box::new(policy)),
        route_log: Box::new(std::io::sink()),
    })
    .await?)
}

fn row(what: &str, bytes: i64, n: usize, how: &str) {
    let per = bytes as f64 / n as f64;
    println!("| {what} | {per:.0} | {n} | {how} |");
}

async fn run(args: Args) -> Result<(), BoxError> {
    let n = args.n;
    let be = backend().await?;
    let one = vec![format!("http://{}", be.addr)];
    let proxy = start(policy(1, &one, Some(1))?).await?;
    let addr = proxy.local_addr();
    // Warm up: a few requests, so one-time allocations are done.
    let mut warm = Raw::connect(addr).await?;
    for _ in 0..50 {
        warm.send(None).await?;
        warm.read().await?;
    }

    println!("| item | heap bytes each | n | how |");
    println!("|---|---:|---:|---|");

    // The client's own share: N sockets connected to a bare listener.
    let bare = TcpListener::bind("127.0.0.1:0").await?;
    let bare_addr = bare.local_addr()?;
    let accepted = tokio::spawn(async move {
        let mut v = Vec::new();
        while let Ok((s, _)) = bare.accept().await {
            v.push(s);
            if v.len() == n {
                break;
            }
        }
        v
    });
    let h0 = settled_heap().await;
    let mut socks = Vec::new();
    for _ in 0..n {
        socks.push(TcpStream::connect(bare_addr).await?);
    }
    let accepted = accepted.await?;
    let h1 = settled_heap().await;
    // Both ends were counted: a client socket is half.
    let client_each = (h1 as i64 - h0 as i64) / 2 / n as i64;
    row(
        "(client socket, subtracted below)",
        client_each * n as i64,
        n,
        "tokio TcpStream, both ends connected, halved",
    );
    drop(socks);
    drop(accepted);

    // Idle connections: each served one request, then left open.
    let h0 = settled_heap().await;
    let mut idle = Vec::new();
    for _ in 0..n {
        let mut c = Raw::connect(addr).await?;
        c.send(None).await?;
        c.read().await?;
        idle.push(c);
    }
    let h1 = settled_heap().await;
    let raw_buf = 4096;
    row(
        "idle client connection",
        h1 as i64 - h0 as i64 - (client_each + raw_buf) * n as i64,
        n,
        "keep-alive connection after one request",
    );

    // The backend's own share of a connection (it runs in this process
    // too): N raw clients straight to it, one request each.
    let h0 = settled_heap().await;
    let mut direct = Vec::new();
    for _ in 0..n {
        let mut c = Raw::connect(be.addr).await?;
        c.send(None).await?;
        c.read().await?;
        direct.push(c);
    }
    let h1 = settled_heap().await;
    let backend_conn = (h1 as i64 - h0 as i64) / n as i64 - client_each - raw_buf;
    drop(direct);

    // Upstream connections: N requests at once (no concurrency limit),
    // held until all N are upstream, so the proxy opens N connections and
    // keeps them idle in its pool afterwards.
    proxy
        .config()
        .apply_policy(policy(1, &one, None)?, "memory-bench");
    let h0 = settled_heap().await;
    hold_all(&be, &mut idle).await?;
    release_all(&be, &mut idle).await?;
    let h1 = settled_heap().await;
    row(
        "upstream connection (idle in the pool)",
        h1 as i64 - h0 as i64 - backend_conn * n as i64,
        n,
        "opened for N requests at once, kept for reuse; the backend's side subtracted",
    );

    // In flight: the same again, on the pooled upstream connections.
    let h0 = settled_heap().await;
    hold_all(&be, &mut idle).await?;
    let h1 = settled_heap().await;
    row(
        "request in flight",
        h1 as i64 - h0 as i64,
        n,
        "on an idle client connection, sent upstream on a pooled connection, the backend holding it (its own request state included)",
    );
    release_all(&be, &mut idle).await?;

    // Queued: one endpoint slot; the first request holds it.
    proxy
        .config()
        .apply_policy(policy(1, &one, Some(1))?, "memory-bench");
    be.hold.store(true, Ordering::Relaxed);
    let mut first = Raw::connect(addr).await?;
    first.send(None).await?;
    while be.held.load(Ordering::Relaxed) < 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let h0 = settled_heap().await;
    for c in &mut idle {
        c.send(None).await?;
    }
    let h1 = settled_heap().await;
    row(
        "queued request",
        h1 as i64 - h0 as i64,
        n,
        "on an idle connection, waiting in the pool's queue (max_concurrency 1)",
    );
    be.hold.store(false, Ordering::Relaxed);
    while be.held.load(Ordering::Relaxed) > 0 {
        be.release.notify_waiters();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.read().await?;
    for c in &mut idle {
        c.read().await?;
    }
    drop(idle);
    drop(first);

    // Stored answers: fresh keys, one connection.
    proxy
        .config()
        .apply_policy(policy(1, &one, None)?, "memory-bench");
    let mut c = Raw::connect(addr).await?;
    for i in 0..100 {
        c.send(Some(&format!("warm-{i:06}"))).await?;
        c.read().await?;
    }
    let h0 = settled_heap().await;
    for i in 0..args.stored {
        c.send(Some(&format!("key-{i:06}"))).await?;
        c.read().await?;
    }
    let h1 = settled_heap().await;
    row(
        "stored answer (300-byte body)",
        h1 as i64 - h0 as i64,
        args.stored,
        "fresh Idempotency-Key (10 bytes) per request, answer kept for replay",
    );

    // Pools: N more pools of one endpoint each.
    let h0 = settled_heap().await;
    proxy
        .config()
        .apply_policy(policy(1 + n, &one, None)?, "memory-bench");
    let h1 = settled_heap().await;
    row(
        "pool",
        h1 as i64 - h0 as i64,
        n,
        "policy of 1 pool replaced by 1 + n pools of one endpoint",
    );
    proxy
        .config()
        .apply_policy(policy(1, &one, None)?, "memory-bench");

    // Endpoints: one pool of 1 + N endpoints.
    let many: Vec<String> = std::iter::once(one[0].clone())
        .chain((0..n).map(|i| format!("http://127.0.0.1:{}", 20000 + i)))
        .collect();
    let h0 = settled_heap().await;
    proxy
        .config()
        .apply_policy(policy(1, &many, None)?, "memory-bench");
    let h1 = settled_heap().await;
    row(
        "endpoint",
        h1 as i64 - h0 as i64,
        n,
        "one pool's 1 endpoint replaced by 1 + n",
    );
    proxy.shutdown();
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let _profiler = dhat::Profiler::builder().testing().build();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}
