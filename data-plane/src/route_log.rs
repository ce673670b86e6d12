//! The route decision log: one JSON line per request on stdout.
//!
//! A request's finished record is queued (bounded); a writer thread
//! serialises and writes the queue out every 10 ms (see [`RouteLog`]), so a
//! slow stdout (a pipe nobody reads fast enough) never blocks request
//! handling, logging costs no thread wake-up per request, and the
//! formatting runs off the request path.
//!
//! The line is serde_json's output of [`RouteRecord`]'s `Serialize`
//! derive: the fields in declaration order, `null` for an absent optional
//! field, serde_json's string escapes, floats as the shortest decimal that
//! reads back as the same double (`null` when not finite). The line was
//! once written by hand, byte for byte the same, to save instructions on
//! the request path; since the writer thread formats it, the derive is
//! enough (the tests pin the bytes).

use std::io::Write;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use router_policy::Outcome;
use serde::Serialize;

use crate::metrics::Metrics;

/// One attempt to send the request to an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct AttemptRecord {
    /// Pool.
    pub pool: Arc<str>,
    /// Endpoint address.
    pub endpoint: Arc<str>,
    /// How the attempt ended.
    pub outcome: Outcome,
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
pub(crate) struct Timestamp(pub SystemTime);

impl Default for Timestamp {
    fn default() -> Self {
        Self(SystemTime::UNIX_EPOCH)
    }
}

/// First second of the year 10000, from which RFC 3339 text (and
/// humantime) shows no time.
const YEAR_10000: u64 = 253_402_300_800;

impl Serialize for Timestamp {
    /// `2026-12-01T04:15:47.123Z` (the milliseconds truncated). A clock set
    /// outside the years 1970-9999, which RFC 3339 cannot show, is clamped
    /// to the nearest end: a log line must never fail, let alone panic,
    /// because of the host's clock.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = match self.0.duration_since(UNIX_EPOCH) {
            Ok(d) if d.as_secs() < YEAR_10000 => self.0,
            Ok(_) => UNIX_EPOCH + Duration::from_millis(YEAR_10000 * 1000 - 1),
            Err(_) => UNIX_EPOCH,
        };
        s.collect_str(&humantime::format_rfc3339_millis(t))
    }
}

fn serialize_method<S: serde::Serializer>(m: &http::Method, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(m.as_str())
}

/// One request's routing story.
///
/// Written as one JSON line by [`RouteRecord::write_json`], from the
/// `Serialize` derive: the fields in the order below. Fields are cheap to
/// fill on the request path: shared names (`Arc<str>`), static outcome
/// names, and a timestamp formatted only when the line is written.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct RouteRecord {
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
    pub first_outcome: Option<Outcome>,
    /// Outcome of a fallback attempt, when there was one.
    pub fallback_outcome: Option<Outcome>,
    /// Pool that gave the final answer.
    pub final_route: Option<Arc<str>>,
    /// Final outcome: `ok`, an upstream failure, or the error type.
    pub outcome: Outcome,
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
    pub model: Option<Arc<str>>,
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

/// Room for a usual line (about 700 bytes), reserved once; a longer one
/// (long ids or reason) grows the buffer as it is written.
const LINE_RESERVE: usize = 1024;

impl RouteRecord {
    /// Appends the record as one JSON object (no newline).
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) {
        out.reserve(LINE_RESERVE);
        // Cannot fail: a Vec takes every write, and every field has a JSON
        // form (clamped timestamps; `null` for floats that are not finite).
        let written = serde_json::to_writer(&mut *out, self);
        debug_assert!(written.is_ok(), "{written:?}");
    }
}

/// Where route records go.
///
/// Each request hands its finished record over (one short lock, a move); a
/// writer thread takes the records every [`FLUSH_INTERVAL`], serialises
/// them and writes them in one go. Requests never format, wait for stdout
/// or wake the writer: the line costs the request path a push, and its
/// formatting runs on the writer's thread, which is otherwise idle (about
/// 10.6k instructions for the benchmark's line, half of them serde_json's
/// byte-by-byte string escaping; 2.2k when the line was written by hand).
/// The queue is bounded: past [`MAX_QUEUED`] records,
/// records are dropped and counted (`router_route_log_dropped_total`).
#[derive(Clone)]
pub(crate) struct RouteLog {
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
}

/// Records waiting to be written. Boxed on purpose: a record is built in a
/// box by the request (it moves around the request path as a pointer) and
/// queued as one.
#[allow(clippy::vec_box)]
type Queue = Mutex<Vec<Box<RouteRecord>>>;

/// How often queued records are written out.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_millis(10);
/// Records held at most between two writes (about 10 MB of lines).
pub(crate) const MAX_QUEUED: usize = 16 * 1024;

impl RouteLog {
    /// Starts the writer thread on `out` (stdout in production). The thread
    /// writes what is left and ends when every `RouteLog` is dropped.
    pub(crate) fn spawn(
        out: Box<dyn Write + Send>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let queue = Arc::new(Mutex::new(Vec::with_capacity(1024)));
        let weak = Arc::downgrade(&queue);
        std::thread::Builder::new()
            .name("route-log".into())
            .spawn(move || write_lines(&weak, out))?;
        Ok(Self { queue, metrics })
    }

    /// Queues one record; drops it (and counts) if the queue is full.
    pub(crate) fn emit(&self, record: Box<RouteRecord>) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.len() >= MAX_QUEUED {
            drop(queue);
            self.metrics.route_log_dropped();
            return;
        }
        queue.push(record);
    }
}

fn write_lines(queue: &Weak<Queue>, mut out: Box<dyn Write + Send>) {
    #[allow(clippy::vec_box)]
    let mut records: Vec<Box<RouteRecord>> = Vec::with_capacity(1024);
    let mut lines: Vec<u8> = Vec::with_capacity(256 * 1024);
    loop {
        // Its own OS thread, not a runtime's: a blocking sleep is right.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(FLUSH_INTERVAL);
        let Some(shared) = queue.upgrade() else {
            let _ = out.flush();
            return;
        };
        {
            let mut queued = shared.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *queued, &mut records);
        }
        drop(shared);
        if records.is_empty() {
            continue;
        }
        for record in records.drain(..) {
            record.write_json(&mut lines);
            lines.push(b'\n');
        }
        // stdout gone: lines are lost, requests are not affected.
        let _ = out.write_all(&lines);
        let _ = out.flush();
        lines.clear();
        if lines.capacity() > 16 * 1024 * 1024 {
            // A burst of huge lines (long reasons): do not keep the room.
            lines = Vec::with_capacity(256 * 1024);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stdout nobody reads: every write blocks until the test ends.
    struct StuckOut(std::sync::mpsc::Receiver<()>);

    impl Write for StuckOut {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn dropped(metrics: &Metrics) -> u64 {
        let text = metrics.render(&[]);
        text.lines()
            .find_map(|l| l.strip_prefix("router_route_log_dropped_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn a_stuck_stdout_costs_records_not_requests() {
        let metrics = Arc::new(Metrics::new());
        let (unstick, rx) = std::sync::mpsc::channel();
        let log = RouteLog::spawn(Box::new(StuckOut(rx)), Arc::clone(&metrics)).unwrap();
        // The writer takes at most one queue's worth before it blocks; the
        // queue then holds at most MAX_QUEUED: the rest is dropped and
        // counted, and `emit` never waits.
        let sent = 2 * MAX_QUEUED + 10;
        for _ in 0..sent {
            log.emit(Box::default());
        }
        let lost = dropped(&metrics);
        assert!(lost >= 10, "dropped {lost}");
        assert!(lost <= sent as u64);
        drop(unstick);
    }

    fn attempt(pool: &str, outcome: Outcome) -> AttemptRecord {
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

    /// A small deterministic generator (splitmix64) for the tests' samples.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A timestamp as the line writes it, without its quotes.
    fn stamp(t: SystemTime) -> String {
        let json = serde_json::to_string(&Timestamp(t)).unwrap();
        json.trim_matches('"').to_string()
    }

    fn check_stamp(secs: u64, nanos: u32) {
        if secs >= YEAR_10000 {
            return; // see out_of_range_timestamps_are_clamped_not_a_panic
        }
        let t = UNIX_EPOCH + Duration::new(secs, nanos);
        let want = humantime::format_rfc3339_millis(t).to_string();
        assert_eq!(stamp(t), want, "{secs}.{nanos:09}");
    }

    #[test]
    fn timestamps_are_humantime_rfc3339_millis() {
        let day = 86_400;
        // The epoch, the last instant humantime formats, and every second
        // boundary around them.
        for nanos in [
            0,
            1,
            999_999,
            1_000_000,
            500_000_000,
            999_000_000,
            999_999_999,
        ] {
            for secs in [0, 1, 59, 60, 3599, 3600, day - 1, day, YEAR_10000 - 1] {
                check_stamp(secs, nanos);
            }
        }
        // Around the end of February and of the year, for leap years (1972,
        // 2000, 2400, 9996), common years, and the century rules (2100,
        // 2200, 2300 are not leap years; 2000 and 2400 are).
        for year in [
            1970, 1971, 1972, 1999, 2000, 2001, 2024, 2025, 2026, 2100, 2200, 2300, 2400, 2401,
            9996, 9999,
        ] {
            let jan1 = humantime::parse_rfc3339(&format!("{year}-01-01T00:00:00Z")).unwrap();
            let jan1 = jan1.duration_since(UNIX_EPOCH).unwrap().as_secs();
            for d in (0..3).chain(57..62).chain(363..366) {
                for s in [0, 1, day / 2, day - 1] {
                    check_stamp(jan1 + d * day + s, 999_999_999);
                    check_stamp(jan1 + d * day + s, 0);
                }
            }
        }
        // Random instants over all the years, each one also just before
        // and after its second.
        let mut rng = Rng(42);
        for _ in 0..200_000 {
            let secs = rng.below(YEAR_10000);
            let nanos = rng.below(1_000_000_000) as u32;
            check_stamp(secs, nanos);
            check_stamp(secs, 999_999_999);
            check_stamp(secs + 1, 0);
            check_stamp(secs, nanos);
        }
        // Every day of a few 400-year cycles (at a random time of day).
        for d in (0..146_097 * 2).chain(YEAR_10000 / day - 146_097..YEAR_10000 / day) {
            check_stamp(d * day + rng.below(day), rng.below(1_000_000_000) as u32);
        }
    }

    #[test]
    fn out_of_range_timestamps_are_clamped_not_a_panic() {
        assert_eq!(
            stamp(UNIX_EPOCH - Duration::from_millis(1)),
            "1970-01-01T00:00:00.000Z"
        );
        for t in [
            UNIX_EPOCH + Duration::from_secs(YEAR_10000),
            UNIX_EPOCH + Duration::from_secs(u64::MAX / 2),
        ] {
            assert_eq!(stamp(t), "9999-12-31T23:59:59.999Z");
        }
    }

    /// What the handler logs: a duration's milliseconds, to the microsecond.
    fn handler_ms(d: Duration) -> f64 {
        (d.as_secs_f64() * 1e6).round() / 1e3
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
            first_outcome: Some(Outcome::Status5xx),
            fallback_outcome: Some(Outcome::Ok),
            final_route: Some("fallback".into()),
            outcome: Outcome::Ok,
            status: 200,
            elapsed_ms: 0.1,
            deadline_ms: Some(u64::MAX),
            queue_wait_ms: 1e-7,
            attempts: vec![
                attempt("primary", Outcome::Status5xx),
                attempt("fallback", Outcome::Ok),
            ],
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

    /// A record with every field set: escapes, non-ASCII, large and odd
    /// numbers, one attempt of each kind.
    fn pinned_record() -> RouteRecord {
        RouteRecord {
            request_id: "id \"q\" \\ \u{1} \u{1f} \u{7f} é 🦀".into(),
            offered_at: Timestamp(UNIX_EPOCH + Duration::from_millis(1_764_000_123_456)),
            method: http::Method::POST,
            path: "/v1/chat/completions".into(),
            route: Some("default".into()),
            first_route: Some("primary".into()),
            first_outcome: Some(Outcome::Status5xx),
            fallback_outcome: Some(Outcome::Ok),
            final_route: Some("fallback".into()),
            outcome: Outcome::Ok,
            status: 200,
            elapsed_ms: 1234.567,
            deadline_ms: Some(u64::MAX),
            queue_wait_ms: 1e-7,
            attempts: vec![
                attempt("primary", Outcome::Status5xx),
                AttemptRecord {
                    status: None,
                    timeout_ms: None,
                    latency_ms: 0.1 + 0.2,
                    queue_wait_ms: 5e-324,
                    ..attempt("fallback", Outcome::Ok)
                },
            ],
            risk: Some("READ"),
            reason: "route \"default\";\n\tthen \u{8}\u{c}\r".into(),
            model: Some("llama3.1:8b".into()),
            tokens_in: Some(0),
            tokens_out: Some(1_000_000),
            cost_usd: Some(123_456.789e10),
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            config_version: "v42".into(),
            ..RouteRecord::default()
        }
    }

    /// The line, pinned byte for byte: these are the bytes the route log
    /// wrote when it formatted lines by hand (checked against serde_json
    /// field by field), so a change to the record's fields, their order, or
    /// to how a value is written shows here. A clock outside 1970-9999 is
    /// clamped, never a panic.
    #[test]
    fn lines_are_pinned_byte_for_byte() {
        const EMPTY: &str = concat!(
            r#"{"request_id":"","offered_at":"1970-01-01T00:00:00.000Z","method":"GET","#,
            r#""path":"","route":null,"first_route":null,"first_outcome":null,"#,
            r#""fallback_outcome":null,"final_route":null,"outcome":"ok","status":0,"#,
            r#""elapsed_ms":0.0,"deadline_ms":null,"queue_wait_ms":0.0,"attempts":[],"#,
            r#""risk":null,"reason":"","model":null,"tokens_in":null,"tokens_out":null,"#,
            r#""cost_usd":null,"trace_id":null,"config_version":""}"#,
        );
        const FULL: &str = concat!(
            r#"{"request_id":"id \"q\" \\ \u0001 \u001f "#,
            "\u{7f}",
            r#" é 🦀","offered_at":"2025-11-24T16:02:03.456Z","method":"POST","#,
            r#""path":"/v1/chat/completions","route":"default","first_route":"primary","#,
            r#""first_outcome":"status_5xx","fallback_outcome":"ok","#,
            r#""final_route":"fallback","outcome":"ok","status":200,"#,
            r#""elapsed_ms":1234.567,"deadline_ms":18446744073709551615,"#,
            r#""queue_wait_ms":1e-7,"attempts":[{"pool":"primary","#,
            r#""endpoint":"http://127.0.0.1:8000/v1","outcome":"status_5xx","#,
            r#""status":503,"latency_ms":12.345,"queue_wait_ms":0.0,"timeout_ms":1500},"#,
            r#"{"pool":"fallback","endpoint":"http://127.0.0.1:8000/v1","outcome":"ok","#,
            r#""status":null,"latency_ms":0.30000000000000004,"queue_wait_ms":5e-324,"#,
            r#""timeout_ms":null}],"risk":"READ","#,
            r#""reason":"route \"default\";\n\tthen \b\f\r","model":"llama3.1:8b","#,
            r#""tokens_in":0,"tokens_out":1000000,"cost_usd":1234567890000000.0,"#,
            r#""trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","config_version":"v42"}"#,
        );
        assert_eq!(line(&RouteRecord::default()), EMPTY);
        let mut r = pinned_record();
        assert_eq!(line(&r), FULL);
        let at = r#""offered_at":"2025-11-24T16:02:03.456Z""#;
        let elapsed = r#""elapsed_ms":1234.567"#;
        let cost = r#""cost_usd":1234567890000000.0"#;
        r.offered_at = Timestamp(UNIX_EPOCH - Duration::from_millis(1));
        r.elapsed_ms = -0.0;
        r.cost_usd = Some(f64::NAN);
        let before_1970 = FULL
            .replace(at, r#""offered_at":"1970-01-01T00:00:00.000Z""#)
            .replace(elapsed, r#""elapsed_ms":-0.0"#)
            .replace(cost, r#""cost_usd":null"#);
        assert_eq!(line(&r), before_1970);
        r.offered_at = Timestamp(UNIX_EPOCH + Duration::from_secs(YEAR_10000));
        r.elapsed_ms = f64::INFINITY;
        r.cost_usd = Some(-1.5);
        let after_9999 = FULL
            .replace(at, r#""offered_at":"9999-12-31T23:59:59.999Z""#)
            .replace(elapsed, r#""elapsed_ms":null"#)
            .replace(cost, r#""cost_usd":-1.5"#);
        assert_eq!(line(&r), after_9999);
    }

    /// A random record: every optional field `None` or `Some`, strings with
    /// and without escapes, unicode, control characters, floats of every
    /// kind, zero to three attempts.
    fn random_record(rng: &mut Rng) -> RouteRecord {
        const STRINGS: [&str; 8] = [
            "",
            "default",
            "01a22fd6-eb8a-731b-8a43-f7eefa2c69e8",
            "route \"default\" (risk READ); default chosen",
            "tab\there, newline\n, nul \u{0}, bell \u{7}, unit sep \u{1f}, del \u{7f}",
            "ünïcode ✓ 🦀 \\ back\\slashes\\",
            "/v1/chat/completions?q=\"x\"",
            "\u{8}\u{c}\r\u{b}",
        ];
        const PLAIN: [Outcome; 4] = [
            Outcome::Ok,
            Outcome::Status5xx,
            Outcome::ConnectError,
            Outcome::ClientCancelled,
        ];
        let pick = |rng: &mut Rng| STRINGS[rng.below(8) as usize];
        let some = |rng: &mut Rng| rng.below(3) > 0;
        let float = |rng: &mut Rng| match rng.below(6) {
            0 => 0.0,
            1 => handler_ms(Duration::from_nanos(rng.below(100_000_000_000))),
            2 => f64::from_bits(rng.next()),
            3 => rng.below(1_000_000) as f64 * 1e-9,
            4 => 1.5e300,
            _ => 5e-324,
        };
        let attempts = (0..rng.below(4))
            .map(|_| AttemptRecord {
                pool: pick(rng).into(),
                endpoint: pick(rng).into(),
                outcome: PLAIN[rng.below(4) as usize],
                status: some(rng).then(|| rng.below(1000) as u16),
                latency_ms: float(rng),
                queue_wait_ms: float(rng),
                timeout_ms: some(rng).then(|| rng.next() >> rng.below(64)),
                ..AttemptRecord::default()
            })
            .collect();
        RouteRecord {
            request_id: pick(rng).into(),
            offered_at: Timestamp(
                UNIX_EPOCH + Duration::new(rng.below(YEAR_10000), rng.below(1_000_000_000) as u32),
            ),
            method: [http::Method::GET, http::Method::POST, http::Method::OPTIONS]
                [rng.below(3) as usize]
                .clone(),
            path: pick(rng).into(),
            route: some(rng).then(|| pick(rng).into()),
            first_route: some(rng).then(|| pick(rng).into()),
            first_outcome: Some(PLAIN[rng.below(4) as usize]),
            fallback_outcome: some(rng).then(|| PLAIN[rng.below(4) as usize]),
            final_route: some(rng).then(|| pick(rng).into()),
            outcome: PLAIN[rng.below(4) as usize],
            status: rng.below(600) as u16,
            elapsed_ms: float(rng),
            deadline_ms: some(rng).then(|| rng.next() >> rng.below(64)),
            queue_wait_ms: float(rng),
            attempts,
            risk: some(rng)
                .then(|| ["READ", "DRAFT", "SEND", "DESTRUCTIVE"][rng.below(4) as usize]),
            reason: pick(rng).into(),
            model: some(rng).then(|| pick(rng).into()),
            tokens_in: some(rng).then(|| rng.next() >> rng.below(64)),
            tokens_out: some(rng).then(|| rng.next() >> rng.below(64)),
            cost_usd: some(rng).then(|| float(rng)),
            trace_id: some(rng).then(|| pick(rng).into()),
            config_version: pick(rng).into(),
            ..RouteRecord::default()
        }
    }

    #[test]
    fn random_records_are_serde_json_byte_for_byte() {
        let mut rng = Rng(2026);
        for _ in 0..20_000 {
            let r = random_record(&mut rng);
            assert_eq!(line(&r), serde_json::to_string(&r).unwrap());
        }
    }
}
