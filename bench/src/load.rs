//! The load generator: keep-alive http1 connections (one per worker task),
//! an open-loop fixed-rate phase and a closed-loop max-throughput phase.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::procs::CpuSource;
use crate::BoxError;

/// The request body every benchmark request carries.
pub(crate) const REQUEST_BODY: &str =
    r#"{"model":"bench","messages":[{"role":"user","content":"hi"}]}"#;
/// The path every benchmark request goes to.
pub(crate) const REQUEST_PATH: &str = "/v1/chat/completions";

/// Settings shared by both phases.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoadConfig {
    /// Connections (one worker task each).
    pub(crate) concurrency: usize,
    /// Time whose results are thrown away before measuring.
    pub(crate) warmup: Duration,
    /// Measured time.
    pub(crate) duration: Duration,
    /// Per-request timeout (a timed-out request counts as an error).
    pub(crate) timeout: Duration,
}

/// One keep-alive connection that reconnects after a failure.
pub(crate) struct Conn {
    addr: SocketAddr,
    host: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    /// A connection to `addr`; it is opened on first use.
    pub(crate) fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            host: addr.to_string(),
            sender: None,
        }
    }

    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, BoxError> {
        let reusable = match self.sender.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !reusable {
            self.sender = None;
            let stream = TcpStream::connect(self.addr).await?;
            stream.set_nodelay(true)?;
            let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                // Ends when the peer closes or the sender is dropped.
                let _ = conn.await;
            });
            sender.ready().await?;
            self.sender = Some(sender);
        }
        self.sender
            .as_mut()
            .ok_or_else(|| "connection vanished".into())
    }

    /// Sends one request and reads the whole answer. On any failure the
    /// connection is dropped, so the next call reconnects.
    pub(crate) async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), BoxError> {
        let result = tokio::time::timeout(timeout, self.request_inner(method, path, body)).await;
        match result {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => {
                self.sender = None;
                Err(e)
            }
            Err(_) => {
                self.sender = None;
                Err(format!("timed out after {timeout:?}").into())
            }
        }
    }

    async fn request_inner(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), BoxError> {
        let has_body = !body.is_empty();
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.as_str());
        if has_body {
            builder = builder.header(CONTENT_TYPE, "application/json");
        }
        let req = builder.body(Full::new(body))?;
        let sender = self.ready().await?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok((status, bytes))
    }

    /// One benchmark request; true when it got a 200.
    async fn bench_request(&mut self, timeout: Duration) -> bool {
        matches!(
            self.request(
                Method::POST,
                REQUEST_PATH,
                Bytes::from_static(REQUEST_BODY.as_bytes()),
                timeout,
            )
            .await,
            Ok((StatusCode::OK, _))
        )
    }
}

/// Raw results of the fixed-rate phase.
#[derive(Debug, Default)]
pub(crate) struct FixedRun {
    /// Requests scheduled in the measured window.
    pub(crate) scheduled: u64,
    /// Latency of each successful measured request, in nanoseconds, from
    /// its intended send time (see [`fixed_rate`]).
    pub(crate) latencies_ns: Vec<u64>,
    /// Service time of each successful measured request (actual send to
    /// end of answer), in nanoseconds.
    pub(crate) service_ns: Vec<u64>,
    /// Measured requests that failed (transport error, timeout, non-200).
    pub(crate) errors: u64,
    /// Wall time from the first to the last measured slot's completion.
    pub(crate) elapsed: Duration,
    /// CPU time used during the measured window by each of the sources
    /// passed in, in order.
    pub(crate) cpu: Vec<Option<Duration>>,
}

/// Open-loop fixed-rate phase.
///
/// Request `i` is due at `start + i / rate`. Each worker, whenever it is
/// free, takes the next due slot from a shared counter. If the slot is still
/// in the future it sleeps until then and the latency clock starts when the
/// request is actually sent (so tokio's ~1 ms timer granularity is not
/// charged to the target). If the slot is already overdue — every
/// connection was busy — the clock starts at the slot's scheduled time, so
/// queueing behind a slow target is counted (no coordinated omission).
pub(crate) async fn fixed_rate(
    addr: SocketAddr,
    rate: u64,
    cfg: LoadConfig,
    cpu: Vec<CpuSource>,
) -> FixedRun {
    let rate = rate.max(1);
    let total = cfg.warmup + cfg.duration;
    let total_slots = (total.as_secs_f64() * rate as f64) as u64;
    let warm_slots = (cfg.warmup.as_secs_f64() * rate as f64) as u64;
    let start = Instant::now() + Duration::from_millis(20);
    let next = Arc::new(AtomicU64::new(0));
    let probe = spawn_cpu_probe(cpu, start + cfg.warmup, start + total);

    let mut workers = Vec::with_capacity(cfg.concurrency);
    for _ in 0..cfg.concurrency {
        let next = Arc::clone(&next);
        workers.push(tokio::spawn(async move {
            let mut conn = Conn::new(addr);
            let mut out = FixedRun::default();
            let mut last_done = start;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total_slots {
                    break;
                }
                let offset_ns = (u128::from(i) * 1_000_000_000 / u128::from(rate)) as u64;
                let due = start + Duration::from_nanos(offset_ns);
                let behind = Instant::now() >= due;
                if !behind {
                    tokio::time::sleep_until(due).await;
                }
                let sent = Instant::now();
                let origin = if behind { due } else { sent };
                let ok = conn.bench_request(cfg.timeout).await;
                let done = Instant::now();
                if i < warm_slots {
                    continue;
                }
                out.scheduled += 1;
                last_done = last_done.max(done);
                if ok {
                    out.latencies_ns.push(nanos(done - origin));
                    out.service_ns.push(nanos(done - sent));
                } else {
                    out.errors += 1;
                }
            }
            (out, last_done)
        }));
    }

    let mut all = FixedRun::default();
    let measured_start = start + cfg.warmup;
    let mut last_done = measured_start;
    for w in workers {
        match w.await {
            Ok((out, done)) => {
                all.scheduled += out.scheduled;
                all.errors += out.errors;
                all.latencies_ns.extend(out.latencies_ns);
                all.service_ns.extend(out.service_ns);
                last_done = last_done.max(done);
            }
            Err(e) => eprintln!("load worker panicked: {e}"),
        }
    }
    all.elapsed = last_done.saturating_duration_since(measured_start);
    all.cpu = join_probe(probe).await;
    all
}

/// Raw results of the max-throughput phase.
#[derive(Debug, Default)]
pub(crate) struct MaxRun {
    /// Successful requests completed inside the measured window.
    pub(crate) ok: u64,
    /// Failed requests completed inside the measured window.
    pub(crate) errors: u64,
    /// CPU time used during the measured window by each of the sources
    /// passed in, in order.
    pub(crate) cpu: Vec<Option<Duration>>,
}

/// Closed-loop phase: every worker sends its next request as soon as the
/// previous answer is read. Only completions inside
/// `[start + warmup, start + warmup + duration)` count.
pub(crate) async fn max_throughput(
    addr: SocketAddr,
    cfg: LoadConfig,
    cpu: Vec<CpuSource>,
) -> MaxRun {
    let start = Instant::now();
    let measure_from = start + cfg.warmup;
    let end = measure_from + cfg.duration;
    let probe = spawn_cpu_probe(cpu, measure_from, end);
    let mut workers = Vec::with_capacity(cfg.concurrency);
    for _ in 0..cfg.concurrency {
        workers.push(tokio::spawn(async move {
            let mut conn = Conn::new(addr);
            let mut out = MaxRun::default();
            loop {
                if Instant::now() >= end {
                    break;
                }
                let ok = conn.bench_request(cfg.timeout).await;
                let done = Instant::now();
                if done >= measure_from && done < end {
                    if ok {
                        out.ok += 1;
                    } else {
                        out.errors += 1;
                    }
                }
                if !ok {
                    // Do not spin on a dead target.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            out
        }));
    }
    let mut all = MaxRun::default();
    for w in workers {
        match w.await {
            Ok(out) => {
                all.ok += out.ok;
                all.errors += out.errors;
            }
            Err(e) => eprintln!("load worker panicked: {e}"),
        }
    }
    all.cpu = join_probe(probe).await;
    all
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

type Probe = Option<tokio::task::JoinHandle<Vec<Option<Duration>>>>;

/// Samples the sources' CPU time at `from` and `to`, on a blocking thread
/// (reading /proc is file I/O).
fn spawn_cpu_probe(cpu: Vec<CpuSource>, from: Instant, to: Instant) -> Probe {
    if cpu.is_empty() {
        return None;
    }
    Some(tokio::spawn(async move {
        let sample = |sources: Vec<CpuSource>| {
            tokio::task::spawn_blocking(move || {
                let times: Vec<Option<Duration>> =
                    sources.iter().map(CpuSource::cpu_time).collect();
                (sources, times)
            })
        };
        tokio::time::sleep_until(from).await;
        let Ok((cpu, a)) = sample(cpu).await else {
            return Vec::new();
        };
        tokio::time::sleep_until(to).await;
        let Ok((_, b)) = sample(cpu).await else {
            return Vec::new();
        };
        a.into_iter()
            .zip(b)
            .map(|(a, b)| b?.checked_sub(a?))
            .collect()
    }))
}

async fn join_probe(probe: Probe) -> Vec<Option<Duration>> {
    match probe {
        Some(p) => p.await.unwrap_or_default(),
        None => Vec::new(),
    }
}
