//! The route decision log: one JSON line per request on stdout.
//!
//! Lines are serialised on the request's task into a shared, bounded
//! buffer that a writer thread writes out every 10 ms (see [`RouteLog`]),
//! so a slow stdout (a pipe nobody reads fast enough) never blocks request
//! handling, and logging costs no thread wake-up per request.

use std::io::Write;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::metrics::Metrics;

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
    /// The model the answer says it came from.
    #[serde(skip)]
    pub response_model: Option<String>,
}

/// One request's routing story.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RouteRecord {
    /// The request's server span (when tracing is on); ended with the record.
    #[serde(skip)]
    pub otel: Option<opentelemetry::Context>,
    /// The model the answer says it came from (a span attribute).
    #[serde(skip)]
    pub response_model: Option<String>,
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
///
/// Each request serialises its line and appends it to a shared buffer
/// (one short lock); a writer thread swaps the buffer out every
/// [`FLUSH_INTERVAL`] and writes it in one go. Requests never wait for
/// stdout and never wake the writer, so the log costs no thread wake-up per
/// request. The buffer is bounded: past [`MAX_BUFFERED`] bytes, lines are
/// dropped and counted (`router_route_log_dropped_total`).
#[derive(Clone)]
pub struct RouteLog {
    buffer: Arc<Mutex<Vec<u8>>>,
    metrics: Arc<Metrics>,
}

/// How often buffered lines are written out.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(10);
/// Bytes held at most between two writes.
pub const MAX_BUFFERED: usize = 8 * 1024 * 1024;

impl RouteLog {
    /// Starts the writer thread on `out` (stdout in production). The thread
    /// writes what is left and ends when every `RouteLog` is dropped.
    pub fn spawn(out: Box<dyn Write + Send>, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let buffer = Arc::new(Mutex::new(Vec::with_capacity(64 * 1024)));
        let weak = Arc::downgrade(&buffer);
        std::thread::Builder::new()
            .name("route-log".into())
            .spawn(move || write_lines(&weak, out))?;
        Ok(Self { buffer, metrics })
    }

    /// Appends one record; drops it (and counts) if the buffer is full.
    pub fn emit(&self, record: &RouteRecord) {
        let mut line = Vec::with_capacity(768);
        if serde_json::to_writer(&mut line, record).is_err() {
            return;
        }
        line.push(b'\n');
        let mut buf = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        if buf.len() + line.len() > MAX_BUFFERED {
            drop(buf);
            self.metrics.route_log_dropped();
            return;
        }
        buf.extend_from_slice(&line);
    }
}

fn write_lines(buffer: &Weak<Mutex<Vec<u8>>>, mut out: Box<dyn Write + Send>) {
    let mut spare: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        std::thread::sleep(FLUSH_INTERVAL);
        let Some(shared) = buffer.upgrade() else {
            let _ = out.flush();
            return;
        };
        {
            let mut buf = shared.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *buf, &mut spare);
        }
        drop(shared);
        if !spare.is_empty() {
            // stdout gone: lines are lost, requests are not affected.
            let _ = out.write_all(&spare);
            let _ = out.flush();
            spare.clear();
        }
    }
}
