//! The encoder against serde_json, byte for byte, and the pinned lines.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use router_policy::{Outcome, Risk};

use super::*;
use crate::record::{
    HedgeRole, IdempotencyRole, PrefixRecord, Stopped, StreamRecord, Timestamp, UsageRecord,
    WalkNote,
};

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
        1970, 1971, 1972, 1999, 2000, 2001, 2024, 2025, 2026, 2100, 2200, 2300, 2400, 2401, 9996,
        9999,
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

/// `x` is written in plain decimal with at most three digits after the
/// point (how a thousandth of a millisecond, the handler's rounding,
/// reads in the log: `12.345`, never `12.345000000000001`).
fn has_three_decimals_at_most(x: f64) {
    let text = float(x);
    let decimals = text.split_once('.').map_or(0, |(_, d)| d.len());
    assert!(!text.contains('e') && decimals <= 3, "{x:e} written {text}");
}

#[test]
fn floats_are_serde_json_floats() {
    // Every thousandth up to 2000 (and its neighbouring doubles, which
    // are not thousandths).
    for k in 0..2_000_000u64 {
        let x = k as f64 / 1000.0;
        has_three_decimals_at_most(x);
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
        has_three_decimals_at_most(ms);
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
        offered_at: Timestamp(SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_000_123_456)),
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
        risk: Some(Risk::Read),
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
        risk: Some(Risk::Read),
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

/// The line of a blank record, pinned.
const EMPTY: &str = concat!(
    r#"{"request_id":"","offered_at":"1970-01-01T00:00:00.000Z","method":"GET","#,
    r#""path":"","route":null,"first_route":null,"first_outcome":null,"#,
    r#""fallback_outcome":null,"final_route":null,"outcome":"ok","status":0,"#,
    r#""elapsed_ms":0.0,"deadline_ms":null,"queue_wait_ms":0.0,"attempts":[],"#,
    r#""risk":null,"reason":"","model":null,"tokens_in":null,"tokens_out":null,"#,
    r#""cost_usd":null,"trace_id":null,"config_version":""}"#,
);

/// Issue 32, item 3: the typed fields (hedge role, risk, stop reason,
/// idempotency role) write, for every value, the very strings the
/// `&'static str` fields wrote before (the log format is a contract):
/// each value's line is the blank line with the field put in its place.
#[test]
fn typed_fields_write_the_strings_they_replaced() {
    let hedge = [
        (HedgeRole::PrimaryWon, "primary_won"),
        (HedgeRole::PrimaryFailed, "primary_failed"),
        (HedgeRole::PrimaryCancelled, "primary_cancelled"),
        (HedgeRole::HedgeWon, "hedge_won"),
        (HedgeRole::HedgeFailed, "hedge_failed"),
        (HedgeRole::HedgeCancelled, "hedge_cancelled"),
    ];
    assert_eq!(hedge.len(), HedgeRole::ALL.len());
    for (role, text) in hedge {
        let r = RouteRecord {
            attempts: vec![AttemptRecord {
                hedge: Some(role),
                ..AttemptRecord::default()
            }],
            ..RouteRecord::default()
        };
        let attempt = format!(
            concat!(
                r#""attempts":[{{"pool":"","endpoint":"","outcome":"ok","status":null,"#,
                r#""latency_ms":0.0,"queue_wait_ms":0.0,"timeout_ms":null,"hedge":"{}"}}],"#
            ),
            text
        );
        assert_eq!(line(&r), EMPTY.replace(r#""attempts":[],"#, &attempt));
    }
    let risk = [
        (Risk::Read, "READ"),
        (Risk::Draft, "DRAFT"),
        (Risk::Send, "SEND"),
        (Risk::Destructive, "DESTRUCTIVE"),
    ];
    assert_eq!(risk.len(), Risk::ALL.len());
    for (risk, text) in risk {
        let r = RouteRecord {
            risk: Some(risk),
            ..RouteRecord::default()
        };
        let field = format!(r#""risk":"{text}""#);
        assert_eq!(line(&r), EMPTY.replace(r#""risk":null"#, &field));
    }
    let stopped = [(Stopped::RetryBudgetExhausted, "retry_budget_exhausted")];
    assert_eq!(stopped.len(), Stopped::ALL.len());
    for (why, text) in stopped {
        let r = RouteRecord {
            stopped: Some(why),
            ..RouteRecord::default()
        };
        let fields = format!(r#""cost_usd":null,"stopped":"{text}","trace_id""#);
        assert_eq!(
            line(&r),
            EMPTY.replace(r#""cost_usd":null,"trace_id""#, &fields)
        );
    }
    let idempotency = [
        (IdempotencyRole::Lead, "lead"),
        (IdempotencyRole::LeadLocal, "lead_local"),
        (IdempotencyRole::Join, "join"),
        (IdempotencyRole::Replay, "replay"),
    ];
    assert_eq!(idempotency.len(), IdempotencyRole::ALL.len());
    for (role, text) in idempotency {
        let r = RouteRecord {
            idempotency: Some(role),
            ..RouteRecord::default()
        };
        let fields = format!(r#""trace_id":null,"idempotency":"{text}","config_version""#);
        let want = EMPTY.replace(r#""trace_id":null,"config_version""#, &fields);
        assert_eq!(line(&r), want);
        assert_eq!(line(&r), serde_json::to_string(&r).unwrap());
    }
}

/// The line, pinned byte for byte: these are the bytes the route log
/// wrote when it formatted lines by hand (checked against serde_json
/// field by field), so a change to the record's fields, their order, or
/// to how a value is written shows here. A clock outside 1970-9999 is
/// clamped, never a panic.
#[test]
fn lines_are_pinned_byte_for_byte() {
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
            hedge: some(rng)
                .then(|| HedgeRole::ALL[rng.below(HedgeRole::ALL.len() as u64) as usize]),
            affinity: some(rng).then(|| ["session_kept", "session_spilled"][rng.below(2) as usize]),
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
        risk: some(rng).then(|| Risk::ALL[rng.below(Risk::ALL.len() as u64) as usize]),
        reason: pick(rng).into(),
        walk: (0..rng.below(3))
            .map(|_| {
                use router_policy::walk::{Availability, Note};
                let notes = [
                    Note::Failed(0, PLAIN[rng.below(4) as usize]),
                    Note::Unavailable(1, Availability::Drained),
                    Note::Stopped(router_policy::StopReason::RetryBudgetExhausted),
                    Note::RetriedInPool(2),
                ];
                let k = rng.below(5) as usize;
                let name: std::sync::Arc<str> = std::sync::Arc::from(pick(rng));
                let named = rng.below(2) == 0;
                match notes.get(k) {
                    Some(note) => WalkNote::of(note, |_| named.then(|| name.clone())),
                    // A split's choice.
                    None => WalkNote::split(name, rng.below(101) as u32, "request_id"),
                }
            })
            .collect(),
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
        stopped: some(rng).then_some(Stopped::RetryBudgetExhausted),
        trace_id: some(rng).then(|| pick(rng).into()),
        idempotency: some(rng)
            .then(|| IdempotencyRole::ALL[rng.below(IdempotencyRole::ALL.len() as u64) as usize]),
        cache: some(rng).then(|| ["hit", "miss", "bypass", "refresh"][rng.below(4) as usize]),
        cache_saved_usd: some(rng).then(|| float(rng)),
        dialect: some(rng).then_some("anthropic"),
        tenant: some(rng).then(|| pick(rng).into()),
        parked_task: some(rng).then(|| pick(rng).into()),
        config_version: pick(rng).into(),
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
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/observability.md"),
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

/// A usual line: a plain chat completion answered by its first pool.
fn usual_record() -> RouteRecord {
    RouteRecord {
        request_id: "01a22fd6-eb8a-731b-8a43-f7eefa2c69e8".into(),
        offered_at: Timestamp(UNIX_EPOCH + Duration::from_millis(1_764_000_123_456)),
        method: http::Method::POST,
        path: "/v1/chat/completions".into(),
        route: Some("default".into()),
        first_route: Some("primary".into()),
        first_outcome: Some(Outcome::Ok),
        final_route: Some("primary".into()),
        outcome: Outcome::Ok,
        status: 200,
        elapsed_ms: 184.207,
        deadline_ms: Some(30_000),
        queue_wait_ms: 0.0,
        attempts: vec![AttemptRecord {
            status: Some(200),
            latency_ms: 183.95,
            ..attempt("primary", Outcome::Ok)
        }],
        risk: Some(Risk::Read),
        reason: "route \"default\" (risk READ); primary chosen".into(),
        model: Some("llama3.1:8b".into()),
        tokens_in: Some(1_234),
        tokens_out: Some(87),
        cost_usd: Some(0.000_412_5),
        config_version: "v42".into(),
        ..RouteRecord::default()
    }
}

/// Issue 32, item 3: what encoding a line costs, in nanoseconds (run in
/// release: `cargo test -p router-route-log --release -- --ignored
/// --nocapture encode_cost`). `ROUTE_LOG_ENCODE_LINES` lines (a million
/// by default) of each kind (`ROUTE_LOG_ENCODE_RECORD`: `usual` or
/// `pinned`, both by default), best of five runs; the line must still be
/// serde_json's. Under callgrind (`--toggle-collect='*write_json*'`) it
/// counts instructions per line, which a shared machine does not blur.
#[test]
#[ignore = "a measurement: run in release with --nocapture"]
// A wall-clock measurement with no runtime: std's clock is the one.
#[allow(clippy::disallowed_types)]
fn encode_cost_per_record() {
    let lines: u32 = std::env::var("ROUTE_LOG_ENCODE_LINES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let only = std::env::var("ROUTE_LOG_ENCODE_RECORD").ok();
    for (name, r) in [("usual", usual_record()), ("pinned", pinned_record())] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let want = serde_json::to_string(&r).unwrap();
        let mut out = Vec::with_capacity(4096);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            for _ in 0..lines {
                out.clear();
                std::hint::black_box(&r).write_json(&mut out);
                std::hint::black_box(&out);
            }
            best = best.min(t0.elapsed().as_nanos() as f64 / f64::from(lines));
        }
        assert_eq!(String::from_utf8_lossy(&out), want);
        println!("encode {name}: {best:.1} ns/line ({} bytes)", out.len());
    }
}

/// Issue 33: what the decision ring holds per proxy, at its default of
/// 256 records, filled with the usual line and with the pinned (long)
/// one (docs/benchmarks.md, "The console"; `--nocapture` prints it).
#[test]
fn a_full_ring_of_usual_lines_holds_about_200_kib() {
    for (name, r, per_line) in [
        ("usual", usual_record(), 500..=900),
        ("pinned", pinned_record(), 900..=2500),
    ] {
        let ring = crate::ring::DecisionRing::new(256);
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        for _ in 0..256 {
            let start = buf.len();
            r.write_json(&mut buf);
            ends.push((start, buf.len()));
            buf.push(b'\n');
        }
        ring.push_lines(&buf, &ends);
        let (held, bytes) = ring.held();
        assert_eq!(held, 256);
        let each = bytes / 256;
        println!(
            "decision ring, 256 {name} lines: {bytes} bytes ({each} a record, {} of them the ring's own)",
            crate::ring::RECORD_OVERHEAD
        );
        assert!(per_line.contains(&each), "{name}: {each} bytes a record");
    }
}
