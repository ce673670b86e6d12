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
    pub pool: Arc<str>,
    /// Endpoint address.
    pub endpoint: Arc<str>,
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

/// A wall-clock time, written as RFC 3339 with milliseconds (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timestamp(pub SystemTime);

impl Default for Timestamp {
    fn default() -> Self {
        Self(SystemTime::UNIX_EPOCH)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(self.0))
    }
}

fn serialize_method<S: serde::Serializer>(m: &http::Method, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(m.as_str())
}

/// One request's routing story.
///
/// Written as one JSON line by [`RouteRecord::write_json`] (by hand, field
/// by field, in the order below: the same bytes as `serde_json` would
/// write from the `Serialize` derive, which the tests check, at a fraction
/// of its cost). Fields are cheap to fill on the request path: shared
/// names (`Arc<str>`), static outcome names, and a timestamp formatted
/// only when the line is written.
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
    pub offered_at: Timestamp,
    /// HTTP method.
    #[serde(serialize_with = "serialize_method")]
    pub method: http::Method,
    /// Request path.
    pub path: String,
    /// Route that matched.
    pub route: Option<String>,
    /// First pool chosen.
    pub first_route: Option<Arc<str>>,
    /// Outcome of the first attempt (or the shed reason).
    pub first_outcome: &'static str,
    /// Outcome of a fallback attempt, when there was one.
    pub fallback_outcome: Option<&'static str>,
    /// Pool that gave the final answer.
    pub final_route: Option<Arc<str>>,
    /// Final outcome: `ok`, an upstream failure, or the error type.
    pub outcome: &'static str,
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
    pub risk: Option<&'static str>,
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
    pub config_version: Arc<str>,
}

/// True when some byte of `s` must be escaped in a JSON string (a control
/// character, `"` or `\\`). Eight bytes at a time.
fn needs_escape(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Exact "some byte is < n" and "some byte is zero" tests on a word.
    let less = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGH;
    let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
    let mut chunks = s.chunks_exact(8);
    let mut hits = 0u64;
    for c in &mut chunks {
        let w = <[u8; 8]>::try_from(c).map_or(0, u64::from_le_bytes);
        hits |= less(w, 0x20)
            | zero(w ^ (ONES * u64::from(b'"')))
            | zero(w ^ (ONES * u64::from(b'\\')));
    }
    hits != 0
        || chunks
            .remainder()
            .iter()
            .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Appends `s` as a JSON string.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        // Writing to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        // Most strings need no escape and are copied as they are.
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Appends a string that never needs escaping (the router's own outcome
/// names, risk classes, an HTTP method token) as a JSON string.
fn json_plain(out: &mut Vec<u8>, s: &str) {
    debug_assert!(!needs_escape(s.as_bytes()), "{s:?}");
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

fn json_opt_plain(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json_plain(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn json_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn json_u64(out: &mut Vec<u8>, n: u64) {
    let mut buf = itoa_buf();
    out.extend_from_slice(fmt_u64(&mut buf, n));
}

fn json_opt_u64(out: &mut Vec<u8>, n: Option<u64>) {
    match n {
        Some(n) => json_u64(out, n),
        None => out.extend_from_slice(b"null"),
    }
}

fn json_f64(out: &mut Vec<u8>, x: f64) {
    // serde_json's own float formatting (and `null` for non-finite).
    let _ = serde_json::to_writer(&mut *out, &x);
}

fn json_opt_f64(out: &mut Vec<u8>, x: Option<f64>) {
    match x {
        Some(x) => json_f64(out, x),
        None => out.extend_from_slice(b"null"),
    }
}

fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

fn fmt_u64(buf: &mut [u8; 20], mut n: u64) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

impl AttemptRecord {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"pool\":");
        json_str(out, &self.pool);
        out.extend_from_slice(b",\"endpoint\":");
        json_str(out, &self.endpoint);
        out.extend_from_slice(b",\"outcome\":");
        json_plain(out, self.outcome);
        out.extend_from_slice(b",\"status\":");
        json_opt_u64(out, self.status.map(u64::from));
        out.extend_from_slice(b",\"latency_ms\":");
        json_f64(out, self.latency_ms);
        out.extend_from_slice(b",\"queue_wait_ms\":");
        json_f64(out, self.queue_wait_ms);
        out.extend_from_slice(b",\"timeout_ms\":");
        json_opt_u64(out, self.timeout_ms);
        out.push(b'}');
    }
}

impl RouteRecord {
    /// Appends the record as one JSON object (no newline).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        out.extend_from_slice(b"{\"request_id\":");
        json_str(out, &self.request_id);
        out.extend_from_slice(b",\"offered_at\":\"");
        // RFC 3339 never needs escaping; writing to a Vec cannot fail.
        let _ = write!(
            out,
            "{}",
            humantime::format_rfc3339_millis(self.offered_at.0)
        );
        out.extend_from_slice(b"\",\"method\":");
        // A method is a token: no quote, backslash or control character.
        json_plain(out, self.method.as_str());
        out.extend_from_slice(b",\"path\":");
        json_str(out, &self.path);
        out.extend_from_slice(b",\"route\":");
        json_opt_str(out, self.route.as_deref());
        out.extend_from_slice(b",\"first_route\":");
        json_opt_str(out, self.first_route.as_deref());
        out.extend_from_slice(b",\"first_outcome\":");
        json_plain(out, self.first_outcome);
        out.extend_from_slice(b",\"fallback_outcome\":");
        json_opt_plain(out, self.fallback_outcome);
        out.extend_from_slice(b",\"final_route\":");
        json_opt_str(out, self.final_route.as_deref());
        out.extend_from_slice(b",\"outcome\":");
        json_plain(out, self.outcome);
        out.extend_from_slice(b",\"status\":");
        json_u64(out, u64::from(self.status));
        out.extend_from_slice(b",\"elapsed_ms\":");
        json_f64(out, self.elapsed_ms);
        out.extend_from_slice(b",\"deadline_ms\":");
        json_opt_u64(out, self.deadline_ms);
        out.extend_from_slice(b",\"queue_wait_ms\":");
        json_f64(out, self.queue_wait_ms);
        out.extend_from_slice(b",\"attempts\":[");
        for (i, a) in self.attempts.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            a.write_json(out);
        }
        out.extend_from_slice(b"],\"risk\":");
        json_opt_plain(out, self.risk);
        out.extend_from_slice(b",\"reason\":");
        json_str(out, &self.reason);
        out.extend_from_slice(b",\"model\":");
        json_opt_str(out, self.model.as_deref());
        out.extend_from_slice(b",\"tokens_in\":");
        json_opt_u64(out, self.tokens_in);
        out.extend_from_slice(b",\"tokens_out\":");
        json_opt_u64(out, self.tokens_out);
        out.extend_from_slice(b",\"cost_usd\":");
        json_opt_f64(out, self.cost_usd);
        out.extend_from_slice(b",\"trace_id\":");
        json_opt_str(out, self.trace_id.as_deref());
        out.extend_from_slice(b",\"config_version\":");
        json_str(out, &self.config_version);
        out.push(b'}');
    }
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
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            record.write_json(&mut line);
            line.push(b'\n');
            let mut buf = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
            if buf.len() + line.len() > MAX_BUFFERED {
                drop(buf);
                self.metrics.route_log_dropped();
                return;
            }
            buf.extend_from_slice(&line);
            drop(buf);
            if line.capacity() > 64 * 1024 {
                // One huge line (a long reason): do not keep its buffer.
                *line = Vec::with_capacity(1024);
            }
        });
    }
}

thread_local! {
    /// The line being written (reused: no allocation per line).
    static LINE: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(pool: &str, outcome: &'static str) -> AttemptRecord {
        AttemptRecord {
            pool: pool.into(),
            endpoint: "http://127.0.0.1:8000/v1".into(),
            outcome,
            status: Some(503),
            latency_ms: 12.345,
            queue_wait_ms: 0.0,
            timeout_ms: Some(1500),
            ..AttemptRecord::default()
        }
    }

    fn line(r: &RouteRecord) -> String {
        let mut out = Vec::new();
        r.write_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn escape_detection_is_exact() {
        for b in 0u8..=255 {
            for len in [1, 7, 8, 9, 16, 17] {
                for pos in [0, len - 1, len / 2] {
                    let mut v = vec![b'a'; len];
                    v[pos] = b;
                    let want = b < 0x20 || b == b'"' || b == b'\\';
                    assert_eq!(needs_escape(&v), want, "byte {b} at {pos} of {len}");
                }
            }
        }
        assert!(!needs_escape(b""));
        assert!(!needs_escape("ünïcode and spaces ~ \u{7f}".as_bytes()));
    }

    #[test]
    fn hand_written_json_is_serde_json_byte_for_byte() {
        let empty = RouteRecord::default();
        let full = RouteRecord {
            request_id: "req \"quoted\" \\ and \u{1} control, ünïcode".into(),
            offered_at: Timestamp(
                SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_000_123_456),
            ),
            method: http::Method::POST,
            path: "/v1/chat/completions".into(),
            route: Some("default".into()),
            first_route: Some("primary".into()),
            first_outcome: "status_5xx",
            fallback_outcome: Some("ok"),
            final_route: Some("fallback".into()),
            outcome: "ok",
            status: 200,
            elapsed_ms: 0.1,
            deadline_ms: Some(u64::MAX),
            queue_wait_ms: 1e-7,
            attempts: vec![attempt("primary", "status_5xx"), attempt("fallback", "ok")],
            risk: Some("READ"),
            reason: "route \"default\" (risk READ);\n\tthen primary: status_5xx".into(),
            model: Some("llama3.1:8b".into()),
            tokens_in: Some(0),
            tokens_out: Some(1_000_000),
            cost_usd: Some(f64::NAN),
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            config_version: "v42-\u{7f}".into(),
            ..RouteRecord::default()
        };
        let mut other = full.clone();
        other.cost_usd = Some(123_456.789e10);
        other.elapsed_ms = 1.0;
        other.method = http::Method::from_bytes(b"PROPFIND").unwrap();
        for r in [&empty, &full, &other] {
            let want = serde_json::to_string(r).unwrap();
            assert_eq!(line(r), want);
            // And it is one valid JSON object.
            let _: serde_json::Value = serde_json::from_str(&line(r)).unwrap();
        }
        assert!(line(&full).contains(r#""offered_at":"2025-11-24T16:02:03.456Z""#));
    }
}
