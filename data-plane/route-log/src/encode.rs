//! The JSON line encoder: [`RouteRecord::write_json`], by hand, the same
//! bytes as `serde_json` writes from the records' `Serialize` derives.
//!
//! Strings go through a measured fast escaper (eight bytes at a time: the
//! strings logged are mostly ids, paths and names with nothing to escape),
//! keys are written together with the quotes around them, integers by
//! `itoa`, milliseconds by a short path and other floats by `zmij`
//! (serde_json's own float formatting), and a timestamp's date is computed
//! once a second.
//!
//! Measured (issue 32; `encode_cost_per_record` under callgrind,
//! instructions per line, a usual line / the pinned one): the hand-written
//! numbers 2,729 / 4,972; `itoa` for integers with the milliseconds' path
//! kept 2,741 / 4,771; `ryu` for every float 4,063 / 6,578 (its
//! `format64` is about 300 instructions a float, the milliseconds' path
//! about 65); `zmij` for every float 2,964 / 4,920. So the milliseconds
//! keep their path, and `ryu` is not used: it also writes `1.5e300` where
//! serde_json writes `1.5e+300`.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use router_policy::{Outcome, Risk};

use crate::record::{AttemptRecord, RouteRecord};

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

// ---- Numbers ----

/// Appends `n` in decimal.
#[inline(always)]
fn json_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `00` to `99`, for the timestamps' two-digit fields.
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
/// through serde_json's own float formatting ([`json_f64_other`]).
#[inline(always)]
fn json_f64(out: &mut Vec<u8>, x: f64) {
    if x.to_bits() == 0 {
        // 0.0 (not -0.0): no queueing, no cost; the most common value.
        out.extend_from_slice(b"0.0");
        return;
    }
    match thousandths(x) {
        Some(k) => write_thousandths(out, k),
        None => json_f64_other(out, x),
    }
}

/// [`json_f64`] off the milliseconds' path: `zmij`, serde_json's own
/// float formatting (the same bytes: `1e-7`, `1.5e+300`,
/// `0.30000000000000004`), `null` when not finite.
#[cold]
fn json_f64_other(out: &mut Vec<u8>, x: f64) {
    if x.is_finite() {
        out.extend_from_slice(zmij::Buffer::new().format_finite(x).as_bytes());
    } else {
        out.extend_from_slice(b"null");
    }
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
/// `x`. Negative numbers (and `-0.0`) are left to [`json_f64_other`].
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
            json_plain_contents(out, h.as_str());
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
    pub fn write_json(&self, out: &mut Vec<u8>) {
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
        let risk = self.risk.map(Risk::as_str);
        json_opt_plain(out, opt_key!("]", "risk", "\""), risk);
        out.extend_from_slice(b",\"reason\":\"");
        json_str_contents(out, &self.reason);
        out.push(b'"');
        if !self.walk.is_empty() {
            // Failures only, and rare enough: serde_json writes it.
            out.extend_from_slice(b",\"walk\":");
            let _ = serde_json::to_writer(&mut *out, &self.walk);
        }
        json_opt_str(out, opt_key!("", "model", "\""), self.model.as_deref());
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
            json_plain_contents(out, s.as_str());
            out.push(b'"');
        }
        json_opt_str(
            out,
            opt_key!("", "trace_id", "\""),
            self.trace_id.as_deref(),
        );
        if let Some(i) = self.idempotency {
            out.extend_from_slice(b",\"idempotency\":\"");
            json_plain_contents(out, i.as_str());
            out.push(b'"');
        }
        if let Some(c) = self.cache {
            out.extend_from_slice(b",\"cache\":\"");
            json_plain_contents(out, c);
            out.push(b'"');
        }
        if let Some(usd) = self.cache_saved_usd {
            out.extend_from_slice(b",\"cache_saved_usd\":");
            json_f64(out, usd);
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

#[cfg(test)]
mod tests;
