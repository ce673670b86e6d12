//! The route decision log: one JSON line per request on stdout.
//!
//! A request's finished record is queued (bounded); a writer thread
//! serialises and writes the queue out every 10 ms (see [`RouteLog`]), so a
//! slow stdout (a pipe nobody reads fast enough) never blocks request
//! handling, logging costs no thread wake-up per request, and the
//! formatting runs off the request path.

use std::cell::RefCell;
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
    /// The part of `tokens_in` read from a prompt cache (logged per
    /// request).
    #[serde(skip)]
    pub cache_read_tokens: Option<u64>,
    /// The part of `tokens_in` written to a prompt cache (logged per
    /// request).
    #[serde(skip)]
    pub cache_write_tokens: Option<u64>,
    /// Cost from `usage` and the pool's prices (logged per request).
    #[serde(skip)]
    pub cost_usd: Option<f64>,
    /// The model the answer says it came from.
    #[serde(skip)]
    pub response_model: Option<String>,
    /// What the backend generated for this attempt, for the tenant's
    /// settlement (`router_policy::tenant::Charge`).
    #[serde(skip)]
    pub generated: router_policy::tenant::Charge,
    /// Its part in a hedged request: `primary`, `hedge` (the second
    /// attempt), each `won` or `cancelled`: `primary_won`, `hedge_won`...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hedge: Option<&'static str>,
    /// How session affinity placed it, when it did: `session_kept`,
    /// `session_placed`, `session_spilled`
    /// (`router_policy::affinity::SessionPlacement`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<&'static str>,
    /// How longest-prefix affinity placed it, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixRecord>,
    /// The dialect the attempt spoke to its pool, for a request whose
    /// client or pools speak another than OpenAI chat (`openai`,
    /// `anthropic`, `gemini`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialect: Option<&'static str>,
    /// The backend's own `x-request-id`, when its answer carried one
    /// (a provider's id, for its support), cut to
    /// [`UPSTREAM_REQUEST_ID_MAX`] bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_request_id: Option<Box<str>>,
}

/// How longest-prefix affinity placed an attempt: the prompt's blocks, the
/// blocks the chosen endpoint likely held and its expected time to first
/// token, and the same for the runner-up
/// (`router_policy::engine_aware::pick`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct PrefixRecord {
    /// `prefix_matched`, `prefix_home` or `prefix_scored`.
    pub placement: &'static str,
    /// Whole blocks in the prompt.
    pub blocks: usize,
    /// Leading blocks the chosen endpoint likely held.
    pub matched: usize,
    /// Its expected time to first token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// The best other endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_up: Option<Arc<str>>,
    /// Leading blocks it likely held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_up_matched: Option<usize>,
    /// Its expected time to first token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_up_ttft_ms: Option<f64>,
}

/// The longest backend request id kept (in the route log and the
/// client's `x-upstream-request-id`): longer ones are cut to it.
pub(crate) const UPSTREAM_REQUEST_ID_MAX: usize = 128;

/// What a streamed (server-sent events) answer told of itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct StreamRecord {
    /// Time to the first token (after the queue).
    pub ttft_ms: f64,
    /// Time per output token, when two tokens or more came.
    pub tpot_ms: Option<f64>,
    /// Content events passed on.
    pub content_events: u64,
    /// The stream's usage chunk; `null` when the backend sent none.
    pub usage: Option<UsageRecord>,
}

/// A stream's reported usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct UsageRecord {
    /// Prompt tokens.
    pub input_tokens: Option<u64>,
    /// Completion tokens.
    pub output_tokens: Option<u64>,
}

/// A cache count that is absent or zero is left out of the line.
fn no_tokens(n: &Option<u64>) -> bool {
    n.is_none_or(|n| n == 0)
}

/// A wall-clock time, written as RFC 3339 with milliseconds (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timestamp(pub SystemTime);

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
/// write from the `Serialize` derive, which the tests check, and a pinned
/// line guards the format). Hand-written because it was measured: with
/// `serde_json::to_writer` the writer thread spent 11.6k instructions per
/// line instead of 3.2k (`bench/callgrind.sh`), and on two cores that
/// thread shares the CPU with the workers: the wrk yardstick lost 6% of
/// its throughput (docs/benchmarks.md, "Data-plane reshape"). Fields are
/// cheap to fill on the request path: shared names (`Arc<str>`), outcomes
/// as [`Outcome`], and a timestamp formatted only when the line is written.
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
    /// Input (prompt) tokens reported by the backend, cached ones
    /// included (`router_policy::usage`).
    pub tokens_in: Option<u64>,
    /// Output tokens reported by the backend.
    pub tokens_out: Option<u64>,
    /// The part of `tokens_in` read from a prompt cache (written when the
    /// backend reported any).
    #[serde(skip_serializing_if = "no_tokens")]
    pub cache_read_tokens: Option<u64>,
    /// The part of `tokens_in` written to a prompt cache (written when
    /// the backend reported any).
    #[serde(skip_serializing_if = "no_tokens")]
    pub cache_write_tokens: Option<u64>,
    /// Estimated cost.
    pub cost_usd: Option<f64>,
    /// A streamed answer's timing and usage (streams only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamRecord>,
    /// Why the walk stopped early, when a limit stopped it
    /// (`retry_budget_exhausted`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<&'static str>,
    /// Trace id, when tracing is on.
    pub trace_id: Option<String>,
    /// What the `Idempotency-Key` did: `lead`, `lead_local` (the shared
    /// store was down), `join` (waited for the first request), `replay`;
    /// absent without a key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<&'static str>,
    /// The client's dialect when it is not OpenAI's (`anthropic`: the
    /// request was translated to the pools' and its answer back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialect: Option<&'static str>,
    /// The tenant the request's key named (tenancy on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Arc<str>>,
    /// The parked task this request parked, or the task this request is a
    /// run of (`on_all_down: park`): the link between the two lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parked_task: Option<String>,
    /// What the tenant's limits hold for the request until it ends
    /// (boxed: tenancy is rare, the record is filled for every request).
    #[serde(skip)]
    pub tenant_holds: Option<Box<crate::handler::tenancy::TenantHolds>>,
    /// The route's first pool, when the walk began past it (passed over
    /// by the decision or the walk): counted as a fallback from it.
    #[serde(skip)]
    pub primary_passed_over: Option<Arc<str>>,
    /// Config version that routed the request.
    pub config_version: Arc<str>,
}

// ---- Strings ----

/// Where the first byte of `s` that must be escaped in a JSON string (a
/// control character, `"` or `\\`) is, if any. Eight bytes at a time: the
/// strings logged are mostly ids, paths and names with nothing to escape,
/// so the scan is the whole cost of writing them.
#[inline(always)]
fn find_escape(s: &[u8]) -> Option<usize> {
    let n = s.len();
    if n < 8 {
        if n < 4 {
            return s.iter().position(|&b| ESCAPED[usize::from(b)]);
        }
        // The first four bytes and the last four (they overlap unless there
        // are eight) as one word: a byte found among the last four comes
        // after the first four, which are clean.
        let word = u64::from(u32_at(s, 0)) | u64::from(u32_at(s, n - 4)) << 32;
        return find_escape_in_word(word).map(|i| if i < 4 { i } else { n + i - 8 });
    }
    let mut at = 0;
    while at + 8 <= n {
        if let Some(i) = find_escape_in_word(u64_at(s, at)) {
            return Some(at + i);
        }
        at += 8;
    }
    if at == n {
        return None;
    }
    // The last eight bytes (overlapping the ones checked already, which are
    // clean, so the byte found is one of those left).
    find_escape_in_word(u64_at(s, n - 8)).map(|i| n - 8 + i)
}

/// [`find_escape`] on eight bytes as one little-endian word: the index of
/// the first byte to escape in it.
#[inline(always)]
fn find_escape_in_word(w: u64) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // "Some byte is < n" and "some byte is zero" on a word. A flag can be
    // set spuriously only above a byte that really matches (a borrow runs
    // upwards), so the lowest flag of the three tests is the first match
    // (little-endian: the lowest byte of the word is the first one).
    let less = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGH;
    let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
    let hits =
        less(w, 0x20) | zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\')));
    (hits != 0).then(|| (hits.trailing_zeros() / 8) as usize)
}

/// The eight bytes of `s` from `at` (there must be eight), little-endian.
#[inline(always)]
fn u64_at(s: &[u8], at: usize) -> u64 {
    s.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The four bytes of `s` from `at` (there must be four), little-endian.
#[inline(always)]
fn u32_at(s: &[u8], at: usize) -> u32 {
    s.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The bytes a JSON string escapes, for the shortest strings (one look-up
/// a byte).
static ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// True when some byte of `s` must be escaped in a JSON string.
fn needs_escape(s: &[u8]) -> bool {
    find_escape(s).is_some()
}

/// Appends the escape of one byte that [`find_escape`] found, exactly as
/// serde_json writes it: the short forms `\" \\ \b \t \n \f \r`, else
/// `\u00xx` with lowercase hex. (serde_json escapes nothing else: DEL and
/// non-ASCII characters are written as they are.)
fn push_escape(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short = match b {
        b'"' => b'"',
        b'\\' => b'\\',
        0x08 => b'b',
        b'\t' => b't',
        b'\n' => b'n',
        0x0c => b'f',
        b'\r' => b'r',
        _ => {
            let hex = [
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ];
            out.extend_from_slice(&hex);
            return;
        }
    };
    out.extend_from_slice(&[b'\\', short]);
}

/// Appends the inside of `s` as a JSON string, the same bytes as
/// serde_json (no quotes: the keys around it carry them, one write less
/// each). Most strings need no escape and are copied as they are.
/// (Inlined: it is called for a dozen fields a line, and its call costs
/// about as much as checking a short string.)
#[inline(always)]
fn json_str_contents(out: &mut Vec<u8>, s: &str) {
    match find_escape(s.as_bytes()) {
        None => out.extend_from_slice(s.as_bytes()),
        Some(first) => json_str_escaped(out, s.as_bytes(), first),
    }
}

/// [`json_str_contents`] for a string with a byte to escape at `first`:
/// runs of bytes that need no escape are copied in one go, and only the
/// bytes [`find_escape`] finds are escaped one by one.
#[cold]
fn json_str_escaped(out: &mut Vec<u8>, s: &[u8], first: usize) {
    let mut rest = s;
    let mut next = Some(first);
    while let Some(i) = next {
        out.extend_from_slice(&rest[..i]);
        push_escape(out, rest[i]);
        rest = &rest[i + 1..];
        next = find_escape(rest);
    }
    out.extend_from_slice(rest);
}

/// Appends the inside of a JSON string for a string that never needs
/// escaping (the router's own outcome names, risk classes, an HTTP method
/// token).
#[inline]
fn json_plain_contents(out: &mut Vec<u8>, s: &str) {
    debug_assert!(!needs_escape(s.as_bytes()), "{s:?}");
    out.extend_from_slice(s.as_bytes());
}

// ---- Optional fields ----

/// The key of an optional field as the line writes it, before a value and
/// before `null`: `,"name":` with, in the same write, the end of the value
/// before it (a string's closing quote, the attempts' `]`) and the start
/// of its own (a string's opening quote, or `null`). Made by [`opt_key!`].
#[derive(Clone, Copy)]
struct OptKey {
    /// The key before a value.
    some: &'static [u8],
    /// The key and `null`.
    none: &'static [u8],
}

/// [`OptKey`] for the field `$name`: `$before` ends the value before it
/// (`"` after a string, `]` after the attempts, else nothing),
/// `$value_start` starts its value (`"` for a string, else nothing).
macro_rules! opt_key {
    ($before:literal, $name:literal, $value_start:literal) => {
        OptKey {
            some: concat!($before, ",\"", $name, "\":", $value_start).as_bytes(),
            none: concat!($before, ",\"", $name, "\":null").as_bytes(),
        }
    };
}

/// An optional field: its key and the value (written by `write`), or its
/// key and `null`.
#[inline(always)]
fn json_opt<T>(out: &mut Vec<u8>, key: OptKey, v: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        Some(v) => {
            out.extend_from_slice(key.some);
            write(out, v);
        }
        None => out.extend_from_slice(key.none),
    }
}

/// An optional string field, escaped as JSON needs (its key ends with the
/// opening quote).
#[inline(always)]
fn json_opt_str(out: &mut Vec<u8>, key: OptKey, s: Option<&str>) {
    json_opt(out, key, s, |out, s| {
        json_str_contents(out, s);
        out.push(b'"');
    });
}

/// [`json_opt_str`] for strings that never need escaping.
#[inline(always)]
fn json_opt_plain(out: &mut Vec<u8>, key: OptKey, s: Option<&str>) {
    json_opt(out, key, s, |out, s| {
        json_plain_contents(out, s);
        out.push(b'"');
    });
}

/// An optional number field.
#[inline(always)]
fn json_opt_u64(out: &mut Vec<u8>, key: OptKey, n: Option<u64>) {
    json_opt(out, key, n, json_u64);
}

/// [`json_opt_u64`] for a float.
#[inline(always)]
fn json_opt_f64(out: &mut Vec<u8>, key: OptKey, x: Option<f64>) {
    json_opt(out, key, x, json_f64);
}

// ---- Integers ----

/// Appends `n` in decimal. Inlined for the usual numbers, below 1000
/// (statuses, token counts, milliseconds).
#[inline(always)]
fn json_u64(out: &mut Vec<u8>, n: u64) {
    match n {
        0..=9 => out.push(b'0' + n as u8),
        10..=99 => out.extend_from_slice(&DIGIT_PAIRS[n as usize]),
        100..=999 => {
            let [tens, units] = DIGIT_PAIRS[(n % 100) as usize];
            out.extend_from_slice(&[b'0' + (n / 100) as u8, tens, units]);
        }
        _ => json_u64_long(out, n),
    }
}

/// [`json_u64`] from 1000 on.
fn json_u64_long(out: &mut Vec<u8>, mut n: u64) {
    if n < 100_000_000 {
        let mut text = Backwards::default();
        text.prepend_digits(n);
        text.append_to(out);
        return;
    }
    let len = n.ilog10() as usize + 1;
    let mut digits = [b'0'; 20];
    for d in digits[..len].iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
    extend_first(out, &digits, len);
}

/// `00` to `99`: numbers are written two digits a division.
static DIGIT_PAIRS: [[u8; 2]; 100] = {
    let mut pairs = [[0; 2]; 100];
    let mut n = 0;
    while n < 100 {
        pairs[n] = [b'0' + (n / 10) as u8, b'0' + (n % 10) as u8];
        n += 1;
    }
    pairs
};

/// Up to eight bytes of text (a number), written from the last to the
/// first into one word, so that the number's digits come out of the usual
/// divisions in the right order and the text is appended with one
/// fixed-size store (see [`extend_first`]).
#[derive(Default)]
struct Backwards {
    /// The text's first byte is the word's lowest (little-endian).
    word: u64,
    len: usize,
}

impl Backwards {
    /// Puts `b` before the text.
    fn prepend(&mut self, b: u8) {
        debug_assert!(self.len < 8);
        self.word = self.word << 8 | u64::from(b);
        self.len += 1;
    }

    /// Puts the two digits of `n` (below 100) before the text.
    fn prepend_pair(&mut self, n: u64) {
        debug_assert!(self.len < 7);
        let pair = DIGIT_PAIRS[n as usize % 100];
        self.word = self.word << 16 | u64::from(u16::from_le_bytes(pair));
        self.len += 2;
    }

    /// Puts the decimal digits of `n` before the text, two at a time.
    fn prepend_digits(&mut self, mut n: u64) {
        while n >= 100 {
            self.prepend_pair(n % 100);
            n /= 100;
        }
        if n >= 10 {
            self.prepend_pair(n);
        } else {
            self.prepend(b'0' + n as u8);
        }
    }

    fn append_to(&self, out: &mut Vec<u8>) {
        extend_first(out, &self.word.to_le_bytes(), self.len);
    }
}

/// Appends the first `len` bytes of `buf`. A copy of a short, variable
/// length is a call to `memcpy`; copying the whole fixed-size `buf` is a
/// few stores, and the bytes past `len` are then cut off again.
fn extend_first<const N: usize>(out: &mut Vec<u8>, buf: &[u8; N], len: usize) {
    debug_assert!(len <= N);
    let end = out.len() + len;
    out.extend_from_slice(buf);
    out.truncate(end);
}

// ---- Floats ----

/// Appends `x` as serde_json writes it: the shortest decimal that reads
/// back as `x`, `null` when it is not finite. Milliseconds (and zero
/// costs) take the short path of [`thousandths`]; anything else goes
/// through serde_json's own float formatting.
#[inline(always)]
fn json_f64(out: &mut Vec<u8>, x: f64) {
    if x.to_bits() == 0 {
        // 0.0 (not -0.0): no queueing, no cost; the most common value.
        out.extend_from_slice(b"0.0");
        return;
    }
    match thousandths(x) {
        Some(k) => write_thousandths(out, k),
        None => json_f64_serde(out, x),
    }
}

/// serde_json's own float formatting (`null` when not finite).
#[cold]
fn json_f64_serde(out: &mut Vec<u8>, x: f64) {
    // Writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &x);
}

/// Where [`thousandths`] stops: below 10^12, `k / 1000` has at most 15
/// significant digits.
const THOUSANDTHS_BELOW: f64 = 1e12;

/// `Some(k)` when `x` is the double nearest to `k / 1000` for a whole `k`
/// in `0..10^15`, as the handler's milliseconds are (whole microseconds
/// divided by 1000).
///
/// Then `k / 1000`, without its trailing zeros, is the shortest decimal
/// that reads back as `x`, which is what serde_json writes: it has at most
/// 15 significant digits, and two different decimals of at most 15
/// significant digits never read back as the same double (the 15 of
/// `f64::DIGITS`), so no other decimal as short or shorter reads back as
/// `x`. Negative numbers (and `-0.0`) are left to serde_json.
fn thousandths(x: f64) -> Option<u64> {
    // The bits of doubles from +0.0 up compare as the doubles do, and
    // negative numbers (with -0.0) and NaN have larger bits: one test.
    if x.to_bits() >= THOUSANDTHS_BELOW.to_bits() {
        return None;
    }
    // For these k (below 2^50) x * 1000 is within a quarter of k. Adding
    // 2^52, where doubles are the whole numbers, rounds it to k (`round`
    // would be a libm call, `as` a few tests); the division back checks
    // that x is k's double.
    const TWO_52: f64 = 4_503_599_627_370_496.0;
    let shifted = x * 1000.0 + TWO_52;
    let k = shifted - TWO_52;
    (k / 1000.0 == x).then(|| shifted.to_bits() - TWO_52.to_bits())
}

/// Appends `k / 1000` as serde_json writes the double nearest to it (see
/// [`thousandths`]): the whole part, a point, and the thousandths without
/// trailing zeros but at least one digit (`0.0`, `1.5`, `12.345`).
fn write_thousandths(out: &mut Vec<u8>, k: u64) {
    let whole = k / 1000;
    let (fraction, len) = FRACTIONS[(k % 1000) as usize];
    let mut text = Backwards {
        word: u64::from(fraction),
        len: usize::from(len),
    };
    if whole < 10_000 {
        // Up to 9999.999: all in one word.
        text.prepend_digits(whole);
    } else {
        json_u64(out, whole);
    }
    text.append_to(out);
}

/// The point and digits after it for each count of thousandths (`.0`,
/// `.09`, `.123`: trailing zeros cut, one digit kept), as little-endian
/// [`Backwards`] text and its length: one look-up instead of dividing and
/// cutting on every line.
static FRACTIONS: [(u32, u8); 1000] = {
    let mut table = [(0, 0); 1000];
    let mut k = 0;
    while k < 1000 {
        let digits = [
            b'.',
            b'0' + (k / 100) as u8,
            b'0' + (k / 10 % 10) as u8,
            b'0' + (k % 10) as u8,
        ];
        let len = if k % 10 != 0 {
            4
        } else if k % 100 != 0 {
            3
        } else {
            2
        };
        table[k] = (u32::from_le_bytes(digits), len);
        k += 1;
    }
    table
};

// ---- Timestamps ----

/// First second of the year 10000, from which humantime formats no time.
const YEAR_10000: u64 = 253_402_300_800;

/// A second's timestamp text, `YYYY-MM-DDTHH:MM:SS.000Z`.
struct Stamp {
    /// Seconds since the epoch.
    second: u64,
    text: [u8; 24],
}

thread_local! {
    /// The last second this thread wrote a timestamp for (none at first).
    /// Lines come many per second, so most of them only write the
    /// milliseconds.
    static LAST_STAMP: RefCell<Stamp> = const {
        RefCell::new(Stamp { second: u64::MAX, text: [0; 24] })
    };
}

/// Appends `t` as RFC 3339 with milliseconds in UTC, the same bytes as
/// `humantime::format_rfc3339_millis` (`2026-12-01T04:15:47.123Z`, the
/// milliseconds truncated), without going through `fmt` and with the date
/// and time of day computed once per second and thread.
fn rfc3339_millis(out: &mut Vec<u8>, t: SystemTime) {
    // A clock set outside the years 1970-9999 (which RFC 3339 text, and
    // humantime, cannot show) is clamped to the nearest end: a log line
    // must never fail, let alone panic, because of the host's clock.
    let since_epoch = match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.as_secs() < YEAR_10000 => d,
        Ok(_) => Duration::from_millis(YEAR_10000 * 1000 - 1),
        Err(_) => Duration::ZERO,
    };
    let second = since_epoch.as_secs();
    let ms = since_epoch.subsec_millis();
    LAST_STAMP.with_borrow_mut(|stamp| {
        if stamp.second != second {
            *stamp = Stamp {
                second,
                text: date_time_stamp(second),
            };
        }
        let [tens, units] = DIGIT_PAIRS[(ms % 100) as usize];
        stamp.text[20..23].copy_from_slice(&[b'0' + (ms / 100) as u8, tens, units]);
        out.extend_from_slice(&stamp.text);
    });
}

/// `YYYY-MM-DDTHH:MM:SS.000Z` (UTC) for `secs` seconds after the epoch,
/// before the year 10000. The date is Howard Hinnant's `civil_from_days`
/// (days counted from 0000-03-01, so a leap day ends its year; 400-year
/// eras of 146097 days, with the Gregorian 100- and 400-year rules).
fn date_time_stamp(secs: u64) -> [u8; 24] {
    let z = secs / 86_400 + 719_468;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = z / 146_097 * 400 + year_of_era + u64::from(month <= 2);
    let second_of_day = secs % 86_400;
    let two_digits = |n: u64| DIGIT_PAIRS[n as usize % 100];
    let mut p = *b"0000-00-00T00:00:00.000Z";
    p[0..2].copy_from_slice(&two_digits(year / 100));
    p[2..4].copy_from_slice(&two_digits(year % 100));
    p[5..7].copy_from_slice(&two_digits(month));
    p[8..10].copy_from_slice(&two_digits(day));
    p[11..13].copy_from_slice(&two_digits(second_of_day / 3600));
    p[14..16].copy_from_slice(&two_digits(second_of_day / 60 % 60));
    p[17..19].copy_from_slice(&two_digits(second_of_day % 60));
    p
}

impl AttemptRecord {
    fn write_json(&self, out: &mut Vec<u8>) {
        // Keys before strings end with the string's opening quote, and the
        // ones after with its closing quote (optional fields: see OptKey):
        // fewer writes.
        out.extend_from_slice(b"{\"pool\":\"");
        json_str_contents(out, &self.pool);
        out.extend_from_slice(b"\",\"endpoint\":\"");
        json_str_contents(out, &self.endpoint);
        out.extend_from_slice(b"\",\"outcome\":\"");
        json_plain_contents(out, self.outcome.as_str());
        json_opt_u64(
            out,
            opt_key!("\"", "status", ""),
            self.status.map(u64::from),
        );
        out.extend_from_slice(b",\"latency_ms\":");
        json_f64(out, self.latency_ms);
        out.extend_from_slice(b",\"queue_wait_ms\":");
        json_f64(out, self.queue_wait_ms);
        json_opt_u64(out, opt_key!("", "timeout_ms", ""), self.timeout_ms);
        if let Some(h) = self.hedge {
            out.extend_from_slice(b",\"hedge\":\"");
            json_plain_contents(out, h);
            out.push(b'"');
        }
        if let Some(a) = self.affinity {
            out.extend_from_slice(b",\"affinity\":\"");
            json_plain_contents(out, a);
            out.push(b'"');
        }
        if let Some(p) = &self.prefix {
            out.extend_from_slice(b",\"prefix\":{\"placement\":\"");
            json_plain_contents(out, p.placement);
            out.extend_from_slice(b"\",\"blocks\":");
            json_u64(out, p.blocks as u64);
            out.extend_from_slice(b",\"matched\":");
            json_u64(out, p.matched as u64);
            if let Some(t) = p.ttft_ms {
                out.extend_from_slice(b",\"ttft_ms\":");
                json_f64(out, t);
            }
            if let Some(r) = &p.runner_up {
                out.extend_from_slice(b",\"runner_up\":\"");
                json_str_contents(out, r);
                out.push(b'"');
            }
            if let Some(m) = p.runner_up_matched {
                out.extend_from_slice(b",\"runner_up_matched\":");
                json_u64(out, m as u64);
            }
            if let Some(t) = p.runner_up_ttft_ms {
                out.extend_from_slice(b",\"runner_up_ttft_ms\":");
                json_f64(out, t);
            }
            out.push(b'}');
        }
        if let Some(d) = self.dialect {
            out.extend_from_slice(b",\"dialect\":\"");
            json_plain_contents(out, d);
            out.push(b'"');
        }
        if let Some(id) = &self.upstream_request_id {
            out.extend_from_slice(b",\"upstream_request_id\":\"");
            json_str_contents(out, id);
            out.push(b'"');
        }
        out.push(b'}');
    }
}

/// Room for a usual line (about 700 bytes), reserved once; a longer one
/// (long ids or reason) grows the buffer as it is written.
const LINE_RESERVE: usize = 1024;

impl RouteRecord {
    /// Appends the record as one JSON object (no newline).
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) {
        out.reserve(LINE_RESERVE);
        // Keys before strings end with the string's opening quote, and the
        // ones after with its closing quote (optional fields: see OptKey):
        // fewer writes.
        out.extend_from_slice(b"{\"request_id\":\"");
        json_str_contents(out, &self.request_id);
        out.extend_from_slice(b"\",\"offered_at\":\"");
        // RFC 3339 never needs escaping.
        rfc3339_millis(out, self.offered_at.0);
        out.extend_from_slice(b"\",\"method\":\"");
        // A method is a token: no quote, backslash or control character.
        json_plain_contents(out, self.method.as_str());
        out.extend_from_slice(b"\",\"path\":\"");
        json_str_contents(out, &self.path);
        json_opt_str(out, opt_key!("\"", "route", "\""), self.route.as_deref());
        let first_route = self.first_route.as_deref();
        json_opt_str(out, opt_key!("", "first_route", "\""), first_route);
        // Always set on a finished record (`null` only on a blank one).
        match self.first_outcome {
            Some(o) => {
                out.extend_from_slice(b",\"first_outcome\":\"");
                json_plain_contents(out, o.as_str());
                out.push(b'"');
            }
            None => out.extend_from_slice(b",\"first_outcome\":null"),
        }
        let fallback = opt_key!("", "fallback_outcome", "\"");
        json_opt_plain(out, fallback, self.fallback_outcome.map(Outcome::as_str));
        let final_route = self.final_route.as_deref();
        json_opt_str(out, opt_key!("", "final_route", "\""), final_route);
        out.extend_from_slice(b",\"outcome\":\"");
        json_plain_contents(out, self.outcome.as_str());
        out.extend_from_slice(b"\",\"status\":");
        json_u64(out, u64::from(self.status));
        out.extend_from_slice(b",\"elapsed_ms\":");
        json_f64(out, self.elapsed_ms);
        json_opt_u64(out, opt_key!("", "deadline_ms", ""), self.deadline_ms);
        out.extend_from_slice(b",\"queue_wait_ms\":");
        json_f64(out, self.queue_wait_ms);
        out.extend_from_slice(b",\"attempts\":[");
        for (i, a) in self.attempts.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            a.write_json(out);
        }
        json_opt_plain(out, opt_key!("]", "risk", "\""), self.risk);
        out.extend_from_slice(b",\"reason\":\"");
        json_str_contents(out, &self.reason);
        json_opt_str(out, opt_key!("\"", "model", "\""), self.model.as_deref());
        json_opt_u64(out, opt_key!("", "tokens_in", ""), self.tokens_in);
        json_opt_u64(out, opt_key!("", "tokens_out", ""), self.tokens_out);
        for (key, n) in [
            (&b",\"cache_read_tokens\":"[..], self.cache_read_tokens),
            (&b",\"cache_write_tokens\":"[..], self.cache_write_tokens),
        ] {
            if let Some(n) = n.filter(|n| *n > 0) {
                out.extend_from_slice(key);
                json_u64(out, n);
            }
        }
        json_opt_f64(out, opt_key!("", "cost_usd", ""), self.cost_usd);
        if let Some(stream) = &self.stream {
            // Streams only, and rare enough: serde_json writes it.
            out.extend_from_slice(b",\"stream\":");
            let _ = serde_json::to_writer(&mut *out, stream);
        }
        if let Some(s) = self.stopped {
            out.extend_from_slice(b",\"stopped\":\"");
            json_plain_contents(out, s);
            out.push(b'"');
        }
        json_opt_str(
            out,
            opt_key!("", "trace_id", "\""),
            self.trace_id.as_deref(),
        );
        if let Some(i) = self.idempotency {
            out.extend_from_slice(b",\"idempotency\":\"");
            json_plain_contents(out, i);
            out.push(b'"');
        }
        if let Some(d) = self.dialect {
            out.extend_from_slice(b",\"dialect\":\"");
            json_plain_contents(out, d);
            out.push(b'"');
        }
        if let Some(t) = &self.tenant {
            out.extend_from_slice(b",\"tenant\":\"");
            json_str_contents(out, t);
            out.push(b'"');
        }
        if let Some(t) = &self.parked_task {
            out.extend_from_slice(b",\"parked_task\":\"");
            json_str_contents(out, t);
            out.push(b'"');
        }
        out.extend_from_slice(b",\"config_version\":\"");
        json_str_contents(out, &self.config_version);
        out.extend_from_slice(b"\"}");
    }
}

/// Where route records go.
///
/// Each request hands its finished record over (one short lock, a move); a
/// writer thread takes the records every [`FLUSH_INTERVAL`], serialises
/// them and writes them in one go. Requests never format, wait for stdout
/// or wake the writer: the line costs the request path a push, and its
/// formatting (about 2k instructions) runs on the writer's thread, which
/// is otherwise idle. The queue is bounded: past [`MAX_QUEUED`] records,
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

    fn must_escape(b: u8) -> bool {
        b < 0x20 || b == b'"' || b == b'\\'
    }

    #[test]
    fn escape_detection_is_exact() {
        for b in 0u8..=255 {
            for len in [1, 7, 8, 9, 16, 17, 24, 31] {
                for pos in [0, len - 1, len / 2, 7.min(len - 1), 8.min(len - 1)] {
                    let mut v = vec![b'a'; len];
                    v[pos] = b;
                    let want = must_escape(b).then_some(pos);
                    assert_eq!(find_escape(&v), want, "byte {b} at {pos} of {len}");
                    assert_eq!(needs_escape(&v), want.is_some());
                    // With a second byte to escape after it (a borrow from
                    // the first must not hide or move it).
                    for later in (pos + 1)..len {
                        for second in [0u8, 0x1f, b'"', b'\\'] {
                            v[later] = second;
                            let want = Some(if must_escape(b) { pos } else { later });
                            assert_eq!(find_escape(&v), want, "{b} at {pos}, {second} at {later}");
                            v[later] = b'a';
                        }
                    }
                }
            }
        }
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let len = rng.below(40) as usize;
            let v: Vec<u8> = (0..len)
                .map(|_| match rng.below(4) {
                    0 => rng.below(256) as u8,
                    _ => b'a',
                })
                .collect();
            assert_eq!(
                find_escape(&v),
                v.iter().position(|&b| must_escape(b)),
                "{v:?}"
            );
        }
        assert!(!needs_escape(b""));
        assert!(!needs_escape("ünïcode and spaces ~ \u{7f}".as_bytes()));
    }

    #[test]
    fn strings_are_escaped_as_serde_json_does() {
        let json = |s: &str| {
            let mut out = b"\"".to_vec();
            json_str_contents(&mut out, s);
            out.push(b'"');
            String::from_utf8(out).unwrap()
        };
        // Every character below 0x800 alone, first, last and in the middle
        // of a longer string.
        for c in (0u32..0x800).filter_map(char::from_u32) {
            for s in [
                format!("{c}"),
                format!("{c}abcdefghij"),
                format!("abcdefghij{c}"),
                format!("abc{c}{c}defghijklmnop{c}q"),
            ] {
                assert_eq!(json(&s), serde_json::to_string(&s).unwrap(), "{s:?}");
            }
        }
        let mut rng = Rng(11);
        let alphabet = [
            'a', 'Z', ' ', '"', '\\', '\n', '\t', '\u{0}', '\u{1f}', '\u{7f}', 'é', '€', '🦀',
        ];
        for _ in 0..20_000 {
            let len = rng.below(50) as usize;
            let s: String = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            assert_eq!(json(&s), serde_json::to_string(&s).unwrap(), "{s:?}");
        }
        assert_eq!(json(""), "\"\"");
    }

    fn stamp(t: SystemTime) -> String {
        let mut out = Vec::new();
        rfc3339_millis(&mut out, t);
        String::from_utf8(out).unwrap()
    }

    fn check_stamp(secs: u64, nanos: u32) {
        if secs >= YEAR_10000 {
            return; // see out_of_range_timestamps_panic_as_before
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
        // and after its second (through the per-second cache and past it).
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
        let text = |t: SystemTime| {
            let mut out = Vec::new();
            rfc3339_millis(&mut out, t);
            String::from_utf8(out).unwrap_or_default()
        };
        assert_eq!(
            text(UNIX_EPOCH - Duration::from_millis(1)),
            "1970-01-01T00:00:00.000Z"
        );
        for t in [
            UNIX_EPOCH + Duration::from_secs(YEAR_10000),
            UNIX_EPOCH + Duration::from_secs(u64::MAX / 2),
        ] {
            assert_eq!(text(t), "9999-12-31T23:59:59.999Z");
        }
    }

    #[test]
    fn integers_are_decimal() {
        let mut rng = Rng(5);
        let powers = (0..20).map(|p| 10u64.pow(p));
        let edges = powers.flat_map(|p| [p - 1, p, p + 1]);
        let random = (0..100_000).map(|_| rng.next() >> rng.below(64));
        for n in edges.chain(random).chain([u64::MAX - 1, u64::MAX]) {
            let mut out = b"x".to_vec();
            json_u64(&mut out, n);
            assert_eq!(out, format!("x{n}").as_bytes());
        }
    }

    fn float(x: f64) -> String {
        let mut out = Vec::new();
        json_f64(&mut out, x);
        String::from_utf8(out).unwrap()
    }

    fn check_float(x: f64) {
        assert_eq!(
            float(x),
            serde_json::to_string(&x).unwrap(),
            "{x:e} ({:#x})",
            x.to_bits()
        );
    }

    /// What the handler logs: a duration's milliseconds, to the microsecond.
    fn handler_ms(d: Duration) -> f64 {
        (d.as_secs_f64() * 1e6).round() / 1e3
    }

    #[test]
    fn floats_are_serde_json_floats() {
        // Every thousandth up to 2000 (and its neighbouring doubles, which
        // are not thousandths and go through serde_json).
        for k in 0..2_000_000u64 {
            let x = k as f64 / 1000.0;
            assert_eq!(thousandths(x), Some(k));
            check_float(x);
            if k % 64 == 0 {
                check_float(f64::from_bits(x.to_bits() + 1));
                check_float(f64::from_bits(x.to_bits().saturating_sub(1)));
            }
        }
        let mut rng = Rng(3);
        for _ in 0..300_000 {
            // Thousandths of every size up to 10^15 (and just past).
            let digits = rng.below(17) as u32;
            let k = rng.below(10u64.pow(digits).max(2));
            let x = k as f64 / 1000.0;
            check_float(x);
            // The handler's milliseconds, from durations up to days.
            let magnitude = 10u64.pow(rng.below(15) as u32 + 1);
            let d = Duration::from_nanos(rng.below(magnitude));
            let ms = handler_ms(d);
            assert!(thousandths(ms).is_some(), "{d:?}");
            check_float(ms);
            // A sum of two (the record's queue wait adds the attempts').
            check_float(ms + x);
            // Any double at all, and costs.
            check_float(f64::from_bits(rng.next()));
            check_float(rng.below(1 << 53) as f64 / (1u64 << rng.below(64)) as f64);
            check_float(rng.below(1_000_000) as f64 * 1e-9);
        }
        for x in [
            0.0,
            -0.0,
            1.0,
            0.25,
            12.345,
            0.001,
            0.1,
            0.0005,
            -1.5,
            1e-7,
            5e-324,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
            f64::EPSILON,
            999_999_999_999.999,
            1e12,
            1e15,
            1e16,
            9_007_199_254_740_992.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            check_float(x);
        }
        assert_eq!(float(0.0), "0.0");
        assert_eq!(float(1.0), "1.0");
        assert_eq!(float(0.25), "0.25");
        assert_eq!(float(12.345), "12.345");
        assert_eq!(float(f64::NAN), "null");
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
        other.attempts[1].upstream_request_id = Some("req_\"ünï\u{1}".into());
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
                hedge: some(rng).then(|| ["primary_won", "hedge_cancelled"][rng.below(2) as usize]),
                affinity: some(rng)
                    .then(|| ["session_kept", "session_spilled"][rng.below(2) as usize]),
                dialect: some(rng).then(|| ["anthropic", "gemini"][rng.below(2) as usize]),
                prefix: some(rng).then(|| PrefixRecord {
                    placement: ["prefix_matched", "prefix_home"][rng.below(2) as usize],
                    blocks: rng.below(5000) as usize,
                    matched: rng.below(5000) as usize,
                    ttft_ms: some(rng).then(|| float(rng)),
                    runner_up: some(rng).then(|| pick(rng).into()),
                    runner_up_matched: some(rng).then(|| rng.below(5000) as usize),
                    runner_up_ttft_ms: some(rng).then(|| float(rng)),
                }),
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
            cache_read_tokens: some(rng).then(|| rng.next() >> rng.below(64)),
            cache_write_tokens: some(rng).then(|| rng.below(3)),
            cost_usd: some(rng).then(|| float(rng)),
            stream: some(rng).then(|| StreamRecord {
                ttft_ms: float(rng),
                tpot_ms: some(rng).then(|| float(rng)),
                content_events: rng.next() >> rng.below(64),
                usage: some(rng).then(|| UsageRecord {
                    input_tokens: some(rng).then(|| rng.below(100_000)),
                    output_tokens: some(rng).then(|| rng.below(100_000)),
                }),
            }),
            stopped: some(rng).then_some("retry_budget_exhausted"),
            trace_id: some(rng).then(|| pick(rng).into()),
            idempotency: some(rng).then(|| ["lead", "join", "replay"][rng.below(3) as usize]),
            dialect: some(rng).then_some("anthropic"),
            tenant: some(rng).then(|| pick(rng).into()),
            parked_task: some(rng).then(|| pick(rng).into()),
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

    /// Issue 30, item 13: every field a route-log line can carry is named
    /// in docs/observability.md's "Route decision log" section.
    #[test]
    fn every_route_log_field_is_documented() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/observability.md"),
        )
        .expect("docs/observability.md");
        let section = doc
            .split_once("## Route decision log")
            .and_then(|(_, rest)| rest.split("\n## ").next())
            .expect("the route log's section");
        fn keys(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    for (k, v) in m {
                        out.insert(k.clone());
                        keys(v, out);
                    }
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
                _ => {}
            }
        }
        let mut all = std::collections::BTreeSet::new();
        let mut rng = Rng(30);
        for _ in 0..2_000 {
            let v: serde_json::Value =
                serde_json::from_str(&line(&random_record(&mut rng))).expect("JSON");
            keys(&v, &mut all);
        }
        let missing: Vec<&String> = all
            .iter()
            .filter(|k| !section.contains(k.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "not in the route log's docs: {missing:?}"
        );
    }
}
