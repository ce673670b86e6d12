//! The route decision log: one JSON line per request on stdout.
//!
//! Lines are serialised on the request's task and handed to one writer
//! thread through a bounded channel, so a slow stdout (a pipe nobody reads
//! fast enough) never blocks request handling: when the channel is full the
//! line is dropped and counted (`router_route_log_dropped_total`). The
//! writer flushes whenever it has caught up, so lines appear promptly.

use std::io::Write;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use crate::metrics::Metrics;

/// Lines held at most between the request tasks and the writer thread.
const CAPACITY: usize = 8192;

/// One attempt to send the request to an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AttemptRecord {
    /// Pool.
    pub pool: String,
    /// Endpoint address.
    pub endpoint: String,
    /// `ok`, `status_5xx`, `status_429`, `connect_error`, `client_cancelled`, ...
    pub outcome: &'static str,
    /// Upstream HTTP status, if one came back.
    pub status: Option<u16>,
    /// Time to the answer's first byte (or to the failure), after the queue.
    pub latency_ms: f64,
    /// Time spent in the pool's queue before this attempt was sent.
    pub queue_wait_ms: f64,
    /// The attempt's timeout, when it had one.
    pub timeout_ms: Option<u64>,
    /// Input tokens the answer's `usage` reported (logged per request).
    #[serde(skip)]
    pub tokens_in: Option<u64>,
    /// Output tokens the answer's `usage` reported (logged per request).
    #[serde(skip)]
    pub tokens_out: Option<u64>,
    /// Cost from `usage` and the pool's prices (logged per request).
    #[serde(skip)]
    pub cost_usd: Option<f64>,
}

/// One request's routing story.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RouteRecord {
    /// Request id (client's `Idempotency-Key`/`X-Request-Id`, or generated).
    pub request_id: String,
    /// When the request arrived (RFC 3339, UTC).
    pub offered_at: String,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Route that matched.
    pub route: Option<String>,
    /// First pool chosen.
    pub first_route: Option<String>,
    /// Outcome of the first attempt (or the shed reason).
    pub first_outcome: String,
    /// Outcome of a fallback attempt, when there was one.
    pub fallback_outcome: Option<String>,
    /// Pool that gave the final answer.
    pub final_route: Option<String>,
    /// Final outcome: `ok`, an upstream failure, or the error type.
    pub outcome: String,
    /// HTTP status sent to the client.
    pub status: u16,
    /// Time from arrival to the end of the answer.
    pub elapsed_ms: f64,
    /// The request's deadline, when it had one.
    pub deadline_ms: Option<u64>,
    /// Time spent waiting in a queue.
    pub queue_wait_ms: f64,
    /// Every attempt, in order.
    pub attempts: Vec<AttemptRecord>,
    /// Risk class.
    pub risk: Option<String>,
    /// Why this route and pool were chosen.
    pub reason: String,
    /// The request's `model`, when it had one.
    pub model: Option<String>,
    /// Input tokens reported by the backend.
    pub tokens_in: Option<u64>,
    /// Output tokens reported by the backend.
    pub tokens_out: Option<u64>,
    /// Estimated cost.
    pub cost_usd: Option<f64>,
    /// Trace id, when tracing is on.
    pub trace_id: Option<String>,
    /// Config version that routed the request.
    pub config_version: String,
}

/// Formats a wall-clock time as RFC 3339 with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Where route records go.
#[derive(Clone)]
pub struct RouteLog {
    tx: SyncSender<String>,
    metrics: Arc<Metrics>,
}

impl RouteLog {
    /// Starts the writer thread on `out` (stdout in production).
    pub fn spawn(out: Box<dyn Write + Send>, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<String>(CAPACITY);
        std::thread::Builder::new()
            .name("route-log".into())
            .spawn(move || write_lines(rx, out))?;
        Ok(Self { tx, metrics })
    }

    /// Queues one record; drops it (and counts) if the writer is behind.
    pub fn emit(&self, record: &RouteRecord) {
        let Ok(mut line) = serde_json::to_string(record) else {
            return;
        };
        line.push('\n');
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.route_log_dropped()
            }
        }
    }
}

fn write_lines(rx: Receiver<String>, mut out: Box<dyn Write + Send>) {
    let mut buffered = false;
    loop {
        let line = if buffered {
            match rx.try_recv() {
                Ok(l) => l,
                Err(TryRecvError::Empty) => {
                    let _ = out.flush();
                    buffered = false;
                    continue;
                }
                Err(TryRecvError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(l) => l,
                Err(_) => break,
            }
        };
        if out.write_all(line.as_bytes()).is_err() {
            // stdout is gone; keep draining so senders never block.
            continue;
        }
        buffered = true;
    }
    let _ = out.flush();
}
