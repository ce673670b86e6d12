//! Entry points for `fuzz/`; not an API.
//!
//! Compiled only with the non-default `fuzzing` feature, which the
//! `router-fuzz` crate (`fuzz/`) turns on. Each function takes the
//! fuzzer's bytes, runs one private part of the proxy on them and panics
//! only when a property of that part fails (see `docs/fuzzing.md`):
//!
//! - [`request_headers`]: `RequestHeaders::scan` against plain
//!   `HeaderMap` lookups, header by header;
//! - [`route_log`]: the hand-written `RouteRecord::write_json` against
//!   `serde_json::to_string` of the same record;
//! - [`snapshot`]: a control-plane message decoded from protobuf bytes,
//!   validated (`managed::decode`) and applied to a `ConfigStore`
//!   (`managed::apply`): errors are values, and what is served is what was
//!   decoded.
//!
//! These live in the proxy because the parts are private to it; the
//! properties are written against independent oracles (`HeaderMap::get`,
//! serde_json, the decoded policy), never against the code under test.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use prost::Message;
use router_policy::{Outcome, Policy, QueueSettings, Risk};
use router_proto::v1 as pb;

use crate::config::ConfigStore;
use crate::metrics::Metrics;
use crate::request_headers::RequestHeaders;
use crate::route_log::{AttemptRecord, HedgeRole, IdempotencyRole, LogLine, Stopped, Timestamp};

// ---- Request headers ----

/// The hop-by-hop names (RFC 9110 §7.6.1, plus `Transfer-Encoding` and the
/// non-standard `Proxy-Connection` and `Keep-Alive`): the oracle's own
/// list, so that the scan's list is checked, not restated.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// A header block from bytes, read like HTTP/1.1's: one `name: value` a
/// line (`\n`, an `\r` before it dropped), the value's leading blanks
/// dropped. Lines whose name or value `http` refuses are left out (hyper
/// would have refused the request). Repeated names are appended, in order.
fn header_block(data: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = match value.iter().position(|&b| b != b' ' && b != b'\t') {
            Some(start) => &value[start..],
            None => &[],
        };
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            continue;
        };
        headers.append(name, value);
    }
    headers
}

/// `RequestHeaders::scan` on a header block read from `data` (see
/// `header_block`) finds, for every header it reads, what
/// `HeaderMap::get` finds (the first value), says `X-Forwarded-Proto` and
/// `X-Forwarded-Host` were sent exactly when they were, and notices a
/// hop-by-hop header exactly when one of [`HOP_BY_HOP`] is there.
pub fn request_headers(data: &[u8]) {
    let headers = header_block(data);
    let seen = RequestHeaders::scan(&headers);
    let get = |name: &str| headers.get(name).cloned();
    let slots = [
        ("idempotency-key", &seen.idempotency_key),
        ("x-request-id", &seen.request_id),
        ("x-router-deadline-ms", &seen.deadline_ms),
        ("x-router-risk", &seen.risk),
        ("x-router-approval", &seen.approval),
        ("content-length", &seen.content_length),
        ("host", &seen.host),
        ("x-forwarded-for", &seen.forwarded_for),
    ];
    for (name, slot) in slots {
        assert_eq!(*slot, get(name), "{name} in {headers:?}");
    }
    assert_eq!(
        seen.forwarded_proto,
        headers.contains_key("x-forwarded-proto"),
        "{headers:?}"
    );
    assert_eq!(
        seen.forwarded_host,
        headers.contains_key("x-forwarded-host"),
        "{headers:?}"
    );
    let hop = headers.keys().any(|k| HOP_BY_HOP.contains(&k.as_str()));
    assert_eq!(seen.hop_by_hop, hop, "{headers:?}");
}

// ---- Route log ----

/// The fuzzer's bytes as a source of values: each read takes what it needs
/// from the front; past the end, every read is zero.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u64(&mut self) -> u64 {
        let mut word = [0u8; 8];
        for b in &mut word {
            *b = self.byte();
        }
        u64::from_le_bytes(word)
    }

    /// A number below `n` (`n > 0`), from one byte when `n` fits in one.
    fn below(&mut self, n: u64) -> u64 {
        if n <= 256 {
            u64::from(self.byte()) % n
        } else {
            self.u64() % n
        }
    }

    fn some(&mut self) -> bool {
        self.byte() & 3 != 0
    }

    /// A string: one of a few realistic ones (ids, names, a reason with
    /// escapes), or up to 255 raw bytes read as UTF-8 (invalid sequences
    /// become U+FFFD), which brings control characters, quotes,
    /// backslashes and any character.
    fn string(&mut self) -> String {
        const STRINGS: [&str; 6] = [
            "",
            "default",
            "01a22fd6-eb8a-731b-8a43-f7eefa2c69e8",
            "route \"default\" (risk READ); default chosen",
            "http://127.0.0.1:8000/v1",
            "/v1/chat/completions",
        ];
        let pick = self.byte();
        if usize::from(pick) < STRINGS.len() * 16 {
            return STRINGS[usize::from(pick) % STRINGS.len()].to_string();
        }
        let len = usize::from(self.byte()).min(self.0.len());
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8_lossy(text).into_owned()
    }

    /// A float: zero, the handler's milliseconds (whole microseconds over
    /// 1000, the writer's short path), a sum of two, a small cost, or any
    /// double at all (NaN, infinities, negative zero, subnormals).
    fn float(&mut self) -> f64 {
        let ms = |b: &mut Self| {
            let nanos = b.u64() >> b.below(64);
            (Duration::from_nanos(nanos).as_secs_f64() * 1e6).round() / 1e3
        };
        match self.byte() % 8 {
            0 => 0.0,
            1 | 2 => ms(self),
            3 => ms(self) + ms(self),
            4 => self.below(1_000_000) as f64 * 1e-9,
            5 => (self.u64() >> self.below(64)) as f64 / 1000.0,
            _ => f64::from_bits(self.u64()),
        }
    }

    fn outcome(&mut self) -> Outcome {
        Outcome::ALL[usize::from(self.byte()) % Outcome::ALL.len()]
    }

    fn opt_u64(&mut self) -> Option<u64> {
        self.some().then(|| self.u64() >> self.below(64))
    }
}

/// First second of the year 10000 (RFC 3339 text stops before it).
const YEAR_10000: u64 = 253_402_300_800;

/// A wall-clock time: mostly between 1970 and 9999, now and then before
/// the epoch or after 9999 (a host's clock can be set anywhere).
fn time(b: &mut Bytes<'_>) -> SystemTime {
    let nanos = b.below(1_000_000_000) as u32;
    match b.byte() % 16 {
        0 => UNIX_EPOCH
            .checked_sub(Duration::new(b.u64() >> b.below(64), nanos))
            .unwrap_or(UNIX_EPOCH - Duration::from_nanos(1)),
        1 => UNIX_EPOCH
            .checked_add(Duration::new(YEAR_10000 + (b.u64() >> 40), nanos))
            .unwrap_or(UNIX_EPOCH + Duration::from_secs(YEAR_10000)),
        _ => UNIX_EPOCH + Duration::new(b.below(YEAR_10000), nanos),
    }
}

/// The time the line shows for `t`: RFC 3339 cannot show a time before
/// 1970 or after 9999, so the writer clamps it to the nearest end.
fn clamped(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Err(_) => UNIX_EPOCH,
        Ok(d) if d.as_secs() >= YEAR_10000 => {
            UNIX_EPOCH + Duration::from_millis(YEAR_10000 * 1000 - 1)
        }
        Ok(_) => t,
    }
}

fn method(b: &mut Bytes<'_>) -> http::Method {
    const COMMON: [http::Method; 4] = [
        http::Method::GET,
        http::Method::POST,
        http::Method::OPTIONS,
        http::Method::DELETE,
    ];
    match b.byte() % 8 {
        // Any token (an extension method); `from_bytes` refuses the rest.
        0 => http::Method::from_bytes(b.string().as_bytes()).unwrap_or(http::Method::PUT),
        n => COMMON[usize::from(n) % COMMON.len()].clone(),
    }
}

fn attempt(b: &mut Bytes<'_>) -> AttemptRecord {
    AttemptRecord {
        pool: b.string().into(),
        endpoint: b.string().into(),
        outcome: b.outcome(),
        status: b.some().then(|| b.u64() as u16),
        latency_ms: b.float(),
        queue_wait_ms: b.float(),
        timeout_ms: b.opt_u64(),
        // Not logged per attempt: set anyway, so a leak would show.
        tokens_in: b.opt_u64(),
        tokens_out: b.opt_u64(),
        cache_read_tokens: b.opt_u64(),
        cache_write_tokens: b.opt_u64(),
        cost_usd: b.some().then(|| b.float()),
        response_model: b.some().then(|| b.string()),
        generated: router_policy::tenant::Charge::default(),
        hedge: b
            .some()
            .then(|| HedgeRole::ALL[usize::from(b.byte()) % HedgeRole::ALL.len()]),
        affinity: b.some().then(|| {
            ["session_kept", "session_placed", "session_spilled"][usize::from(b.byte()) % 3]
        }),
        prefix: b.some().then(|| crate::route_log::PrefixRecord {
            placement: ["prefix_matched", "prefix_home", "prefix_scored"]
                [usize::from(b.byte()) % 3],
            blocks: b.u64() as usize,
            matched: b.u64() as usize,
            ttft_ms: b.some().then(|| b.float()),
            runner_up: b.some().then(|| b.string().into()),
            runner_up_matched: b.some().then(|| b.u64() as usize),
            runner_up_ttft_ms: b.some().then(|| b.float()),
        }),
        dialect: b
            .some()
            .then(|| ["openai", "anthropic", "gemini"][usize::from(b.byte()) % 3]),
        upstream_request_id: b.some().then(|| b.string().into()),
    }
}

/// A route record with every field taken from `data`.
fn record(data: &[u8]) -> LogLine {
    let b = &mut Bytes(data);
    LogLine {
        request_id: b.string(),
        offered_at: Timestamp(time(b)),
        method: method(b),
        path: b.string(),
        route: b.some().then(|| b.string()),
        first_route: b.some().then(|| b.string().into()),
        first_outcome: b.some().then(|| b.outcome()),
        fallback_outcome: b.some().then(|| b.outcome()),
        final_route: b.some().then(|| b.string().into()),
        outcome: b.outcome(),
        status: b.u64() as u16,
        elapsed_ms: b.float(),
        deadline_ms: b.opt_u64(),
        queue_wait_ms: b.float(),
        attempts: (0..b.below(5)).map(|_| attempt(b)).collect(),
        risk: b
            .some()
            .then(|| Risk::ALL[usize::from(b.byte()) % Risk::ALL.len()]),
        reason: b.string(),
        walk: (0..b.byte() % 3)
            .map(|_| {
                use router_policy::walk::{Availability, Note};
                let note = match b.byte() % 4 {
                    0 => Note::Failed(0, Outcome::Status5xx),
                    1 => Note::Unavailable(1, Availability::Drained),
                    2 => Note::RetriedInPool(0),
                    _ => Note::Stopped(router_policy::StopReason::RetryBudgetExhausted),
                };
                let pool: Arc<str> = b.string().into();
                crate::route_log::WalkNote::of(&note, |_| Some(Arc::clone(&pool)))
            })
            .collect(),
        model: b.some().then(|| b.string().into()),
        tokens_in: b.opt_u64(),
        tokens_out: b.opt_u64(),
        cache_read_tokens: b.opt_u64(),
        cache_write_tokens: b.opt_u64(),
        cost_usd: b.some().then(|| b.float()),
        stream: b.some().then(|| crate::route_log::StreamRecord {
            ttft_ms: b.float(),
            tpot_ms: b.some().then(|| b.float()),
            content_events: b.u64(),
            usage: b.some().then(|| crate::route_log::UsageRecord {
                input_tokens: b.opt_u64(),
                output_tokens: b.opt_u64(),
            }),
        }),
        stopped: b.some().then_some(Stopped::RetryBudgetExhausted),
        trace_id: b.some().then(|| b.string()),
        idempotency: b
            .some()
            .then(|| IdempotencyRole::ALL[usize::from(b.byte()) % IdempotencyRole::ALL.len()]),
        cache: b.some().then_some("hit"),
        cache_saved_usd: b.some().then(|| b.float()),
        dialect: b.some().then_some("anthropic"),
        tenant: b.some().then(|| b.string().into()),
        parked_task: b.some().then(|| b.string()),
        config_version: b.string().into(),
    }
}

/// `RouteRecord::write_json` on a record built from `data` writes exactly
/// the bytes `serde_json::to_string` writes for it (with the time clamped
/// to 1970-9999, which serde's humantime path cannot show), a JSON object;
/// it appends to what the buffer holds without touching it, and writes
/// the same line twice (the per-second timestamp cache).
pub fn route_log(data: &[u8]) {
    let mut r = record(data);
    let mut line = b"earlier line\n".to_vec();
    r.write_json(&mut line);
    let line = line
        .strip_prefix(&b"earlier line\n"[..])
        .expect("what the buffer held is kept");
    let line = std::str::from_utf8(line).expect("a line is UTF-8");
    let mut again = Vec::new();
    r.write_json(&mut again);
    assert_eq!(line.as_bytes(), again, "written twice");
    r.offered_at = Timestamp(clamped(r.offered_at.0));
    let want = serde_json::to_string(&r).expect("serde_json writes any record");
    assert_eq!(line, want, "{r:?}");
    let value: serde_json::Value = serde_json::from_str(line).expect("a line is JSON");
    assert!(value.is_object(), "{line}");
}

// ---- Control-plane snapshots ----

/// A control-plane message decoded from `data` (protobuf) and handled as
/// the stream handles one: without a snapshot, or with one that
/// `managed::decode` refuses, nothing is applied and the refusal is a
/// value (the NACK's text). A snapshot it accepts is applied to a
/// `ConfigStore` (`managed::apply`), twice, as a repeated message would
/// be. Never a panic; after each apply the store serves the version
/// `cp-<config revision>` (the snapshot's, else the message's revision), a runtime for every pool of the decoded policy, and
/// that policy with the snapshot's backend sets in place of its pools'
/// endpoints. The second apply keeps every pool's runtime.
pub fn snapshot(data: &[u8]) {
    let Ok(msg) = pb::ControlMessage::decode(data) else {
        return;
    };
    let Some(snapshot) = &msg.snapshot else {
        return;
    };
    let defaults = QueueSettings::default();
    let store = ConfigStore::new(
        Policy::sidecar(defaults, None),
        "boot",
        Arc::new(Metrics::new()),
        None,
        None,
    );
    let boot = store.version();
    let decoded =
        match crate::managed::decode(snapshot, &defaults, &router_policy::Guards::default()) {
            Ok(d) => d,
            Err(nack) => {
                assert!(!nack.to_string().is_empty(), "a NACK says why");
                assert_eq!(store.version(), boot, "a refused snapshot is not applied");
                return;
            }
        };
    let mut want = decoded.policy.clone();
    for pool in &mut want.pools {
        if let Some(endpoints) = decoded.backends.get(&pool.name) {
            pool.endpoints.clone_from(endpoints);
        }
    }
    let again = crate::managed::Decoded {
        policy: decoded.policy.clone(),
        backends: decoded.backends.clone(),
        marks: crate::managed::Marks {
            circuits: decoded.marks.circuits.clone(),
            suspects: decoded.marks.suspects.clone(),
            skipped: decoded.marks.skipped.clone(),
        },
    };
    let version = format!("cp-{}", crate::managed::config_revision(&msg));
    let applied = crate::managed::apply(&store, decoded, &msg);
    assert_eq!(*applied, version);
    let first = store.load();
    assert_eq!(*first.version, version);
    assert_eq!(*first.policy, want);
    assert_eq!(first.pools.len(), want.pools.len(), "one runtime a pool");
    for pool in &want.pools {
        assert!(first.pools.contains_key(&pool.name), "{}", pool.name);
    }
    crate::managed::apply(&store, again, &msg);
    let second = store.load();
    assert_eq!(*second.policy, want);
    for (name, runtime) in &first.pools {
        assert!(Arc::ptr_eq(runtime, &second.pools[name]), "{name} kept");
    }
}
