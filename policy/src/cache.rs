//! The response cache's rules: which requests may be answered from the
//! cache, which answers may be kept, and what an entry's key is made of.
//!
//! A cache that serves agents must never turn a request that acts into a
//! silent no-op, never serve one tenant another's answer, never keep an
//! error or half a stream, and never replay a sampled answer as if it were
//! the only one. So, per request, in this order ([`lookup`]):
//!
//! 1. a SEND or DESTRUCTIVE request is never cached ("send the email"
//!    answered from the cache sends nothing); a route that only takes
//!    those may not turn the cache on (the policy is refused);
//! 2. `Cache-Control: no-store` on the request: neither read nor written;
//! 3. a sampled request (`temperature` above 0, or absent: the providers'
//!    default is 1) is not cached unless the route says `sampled: true`;
//! 4. `Cache-Control: no-cache`: the entry is not read but refreshed;
//! 5. otherwise the entry is read, if no older than `max-age=N` when the
//!    request gives one.
//!
//! An answer is kept ([`keep`]) only when it is a success, whole (a stream
//! that ended with its terminal event: not cut, stalled, or failed inside
//! a 200), and within the route's `max_entry_bytes`.
//!
//! The key ([`key`]) is a SHA-256 of the partition (the tenant by default,
//! the route, or a header's value), the route, the route's pools as the
//! policy has them now (so a policy change of those pools leaves the old
//! entries unreachable: the purge on a policy change), the client's
//! dialect, and the body normalized ([`normalized_body`]): object keys
//! sorted, no whitespace, and the fields that do not change the answer
//! ([`IGNORED_FIELDS`]: the end user's identifiers in each dialect,
//! `metadata`, `prompt_cache_key`, `store`, `stream_options`) left out,
//! `stream` too: it chooses the answer's form, not its content, so on
//! the paths where one form can be rebuilt from the other (chat
//! completions, messages) a plain and a streamed request share an entry
//! ([`KeyParts::form`] keeps them apart elsewhere).
//! The route and the partition's own hash lead the key in clear
//! ([`partition_prefix`], [`route_prefix`]), so that a purge finds a
//! route's or a tenant's entries by prefix.

use std::time::Duration;

use crate::idempotency::Ending;
use crate::Risk;

/// A route's cache, resolved (`cache: {ttl_s, max_entry_bytes,
/// partition, sampled, rate_limit_hits}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSettings {
    /// How long an entry is kept.
    pub ttl: Duration,
    /// Largest answer kept, in bytes (a stream: its frames together).
    pub max_entry_bytes: usize,
    /// Whose entries are shared.
    pub partition: Partition,
    /// Whether sampled requests (`temperature` above 0) are cached too.
    pub sampled: bool,
    /// Whether a hit counts against the tenant's request rate limit
    /// (`rate_limit_hits`, default true).
    pub rate_limit_hits: bool,
}

impl CacheSettings {
    /// The default largest entry: 1 MiB.
    pub const DEFAULT_MAX_ENTRY_BYTES: usize = 1024 * 1024;
    /// The largest `max_entry_bytes` a route may set: 16 MiB.
    pub const MAX_ENTRY_BYTES: usize = 16 * 1024 * 1024;
    /// The longest TTL a route may set: 30 days.
    pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
}

/// Who shares a cache entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partition {
    /// Each tenant its own entries (the default; without tenants, one
    /// partition for all).
    Tenant,
    /// Every caller of the route shares them.
    Route,
    /// Callers with the same value of this request header (lowercase
    /// name); a request without it is not cached.
    Header(String),
}

/// The request's `Cache-Control` directives the cache obeys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheControl {
    /// `no-cache`: do not answer from the cache; refresh the entry.
    pub no_cache: bool,
    /// `no-store`: neither read nor write.
    pub no_store: bool,
    /// `max-age=N`: accept an entry no older than this.
    pub max_age: Option<Duration>,
}

impl CacheControl {
    /// Reads `Cache-Control` header values (comma-separated directives,
    /// case-insensitive; unknown ones and malformed `max-age` ignored, as
    /// RFC 9111 asks of a cache).
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut cc = Self::default();
        for value in values {
            let Ok(text) = std::str::from_utf8(value) else {
                continue;
            };
            for directive in text.split(',') {
                let directive = directive.trim();
                let (name, arg) = match directive.split_once('=') {
                    Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                    None => (directive, None),
                };
                if name.eq_ignore_ascii_case("no-cache") {
                    cc.no_cache = true;
                } else if name.eq_ignore_ascii_case("no-store") {
                    cc.no_store = true;
                } else if name.eq_ignore_ascii_case("max-age") {
                    if let Some(secs) = arg.and_then(|a| a.parse::<u64>().ok()) {
                        // Two max-ages: the stricter holds.
                        let age = Duration::from_secs(secs);
                        cc.max_age = Some(cc.max_age.map_or(age, |m| m.min(age)));
                    }
                }
            }
        }
        cc
    }
}

/// Why a request on a cached route goes past the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    /// A SEND or DESTRUCTIVE request.
    SideEffects,
    /// `Cache-Control: no-store`.
    NoStore,
    /// A sampled request on a route without `sampled: true`.
    Sampled,
    /// The body is not a JSON object (nothing to key it by).
    Unkeyable,
    /// The partition's header is missing.
    NoPartition,
}

impl Bypass {
    /// Its name in the route log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SideEffects => "side_effects",
            Self::NoStore => "no_store",
            Self::Sampled => "sampled",
            Self::Unkeyable => "unkeyable",
            Self::NoPartition => "no_partition",
        }
    }
}

/// What the cache does for a request on a cached route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Neither read nor written.
    Bypass(Bypass),
    /// Read (an entry no older than `max_age`, when given); on a miss the
    /// answer is kept.
    Read {
        /// The oldest entry the client accepts.
        max_age: Option<Duration>,
    },
    /// Not read; the answer replaces the entry.
    Refresh,
}

/// Decides what the cache does for a `risk` request whose `temperature`
/// is as given (`None`: absent), with the request's `cache_control`.
pub fn lookup(
    settings: &CacheSettings,
    risk: Risk,
    temperature: Option<f64>,
    cache_control: CacheControl,
) -> Lookup {
    if risk.has_side_effects() {
        return Lookup::Bypass(Bypass::SideEffects);
    }
    if cache_control.no_store {
        return Lookup::Bypass(Bypass::NoStore);
    }
    if !settings.sampled && is_sampled(temperature) {
        return Lookup::Bypass(Bypass::Sampled);
    }
    if cache_control.no_cache {
        return Lookup::Refresh;
    }
    Lookup::Read {
        max_age: cache_control.max_age,
    }
}

/// Whether a request samples: `temperature` above 0, or absent (the
/// providers' default is 1). A negative or non-number value is the
/// backend's to refuse; it is treated as sampled.
pub fn is_sampled(temperature: Option<f64>) -> bool {
    !matches!(temperature, Some(t) if t == 0.0)
}

/// Whether an entry `age` old may answer a client that accepts `max_age`.
pub fn fresh_enough(age: Duration, max_age: Option<Duration>) -> bool {
    max_age.is_none_or(|m| age <= m)
}

/// Whether an answer that ended as `ending` is kept, with entries of at
/// most `max_entry_bytes`: a success, whole, and small enough.
pub fn keep(ending: Ending, max_entry_bytes: usize) -> bool {
    match ending {
        Ending::Answered {
            outcome,
            bytes,
            complete,
        } => outcome.is_success() && complete && bytes <= max_entry_bytes,
        Ending::NoAnswer { .. } => false,
    }
}

/// Body fields that do not change the answer, left out of the key: who
/// the end user is, in each dialect's spelling (OpenAI's `user` and
/// `safety_identifier`, Anthropic's `metadata.user_id`, OpenAI's
/// `metadata` tags), the provider's own prompt-cache routing key and
/// storage flag, and how usage is reported in a stream.
pub const IGNORED_FIELDS: [&str; 6] = [
    "user",
    "safety_identifier",
    "metadata",
    "prompt_cache_key",
    "store",
    "stream_options",
];

/// A request body as the cache reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    /// The body as the key sees it.
    pub bytes: Vec<u8>,
    /// Its `temperature`, if it gives a number.
    pub temperature: Option<f64>,
    /// It asks for a stream (`stream: true`): the answer's form, not its
    /// content, so not in `bytes` ([`KeyParts::form`] says whether the
    /// path's two forms share an entry).
    pub stream: bool,
    /// A stream that asks for its usage (`stream_options.include_usage`).
    pub include_usage: bool,
}

/// The body as the key sees it: a JSON object with its keys sorted at
/// every depth, without whitespace and without [`IGNORED_FIELDS`] and
/// `stream` at the top; `None` when the body is not a JSON object.
pub fn normalized_body(body: &[u8]) -> Option<Normalized> {
    let serde_json::Value::Object(mut top) = serde_json::from_slice(body).ok()? else {
        return None;
    };
    let stream = top.remove("stream").and_then(|v| v.as_bool()) == Some(true);
    let include_usage = top
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(serde_json::Value::as_bool)
        == Some(true);
    for field in IGNORED_FIELDS {
        top.remove(field);
    }
    let temperature = top.get("temperature").and_then(serde_json::Value::as_f64);
    let mut out = Vec::with_capacity(body.len());
    canonical(&serde_json::Value::Object(top), &mut out);
    Some(Normalized {
        bytes: out,
        temperature,
        stream,
        include_usage,
    })
}

/// Writes `v` with object keys sorted (whatever map type serde_json was
/// built with).
fn canonical(v: &serde_json::Value, out: &mut Vec<u8>) {
    match v {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // A string always serializes.
                let _ = serde_json::to_writer(&mut *out, k);
                out.push(b':');
                if let Some(value) = map.get(k) {
                    canonical(value, out);
                }
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// The route's pools as `policy` has them, as stable text for the key
/// ([`KeyParts::pools`]): a policy version that changes any of them (an
/// endpoint, a model rewrite, a provider) changes it, so the entries made
/// before are never served again (they expire with their TTL). Computed
/// once per policy, not per request.
pub fn pools_text(policy: &crate::Policy, route: &crate::Route) -> Vec<u8> {
    let mut out = Vec::new();
    for name in route.pools() {
        if let Some(pool) = policy.pool(name) {
            out.extend_from_slice(format!("{pool:?}").as_bytes());
        }
        out.push(0);
    }
    out
}

/// What an entry's key is made of.
#[derive(Debug, Clone, Copy)]
pub struct KeyParts<'a> {
    /// The partition's value (a tenant's name, a header's value; empty for
    /// `partition: route` or a policy without tenants).
    pub partition: &'a str,
    /// The route.
    pub route: &'a str,
    /// The route's pools as the policy has them now (any stable text: a
    /// change of it is a purge).
    pub pools: &'a [u8],
    /// The client's dialect (`openai`, `anthropic`).
    pub dialect: &'a str,
    /// The request's path.
    pub path: &'a str,
    /// The answer's form where a path's plain and streamed answers do not
    /// share an entry (`plain`, `stream`); empty where they do (chat
    /// completions, messages: each form is rebuilt from the other).
    pub form: &'a str,
    /// [`normalized_body`].
    pub body: &'a [u8],
}

/// The prefix of every entry of `route` (a purge of the route, or of a
/// route whose pools changed). The trailing `:` keeps route `a` from
/// naming route `a-b`'s entries.
pub fn route_prefix(route: &str) -> String {
    format!("cache:{route}:")
}

/// The prefix of every entry of `route` in `partition` (a purge of a
/// tenant's entries).
pub fn partition_prefix(route: &str, partition: &str) -> String {
    format!(
        "{}{}:",
        route_prefix(route),
        hex(&sha256(&[partition.as_bytes()])[..8])
    )
}

/// The entry's key: `cache:<route>:<partition hash>:<hash of the rest>`.
pub fn key(parts: &KeyParts<'_>) -> String {
    let rest = sha256(&[
        parts.partition.as_bytes(),
        parts.route.as_bytes(),
        parts.pools,
        parts.dialect.as_bytes(),
        parts.path.as_bytes(),
        parts.form.as_bytes(),
        parts.body,
    ]);
    format!(
        "{}{}",
        partition_prefix(parts.route, parts.partition),
        hex(&rest[..16])
    )
}

/// SHA-256 of `fields`, each preceded by its length (no two field lists
/// hash alike by moving bytes from one field to the next).
fn sha256(fields: &[&[u8]]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for f in fields {
        ctx.update(&(f.len() as u64).to_le_bytes());
        ctx.update(f);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outcome;

    fn settings(sampled: bool) -> CacheSettings {
        CacheSettings {
            ttl: Duration::from_secs(60),
            max_entry_bytes: 1000,
            partition: Partition::Tenant,
            sampled,
            rate_limit_hits: true,
        }
    }

    fn cc(text: &str) -> CacheControl {
        CacheControl::parse([text.as_bytes()])
    }

    #[test]
    fn a_request_that_acts_is_never_cached_whatever_it_asks() {
        for risk in [Risk::Send, Risk::Destructive] {
            for c in ["", "max-age=5", "no-cache"] {
                assert_eq!(
                    lookup(&settings(true), risk, Some(0.0), cc(c)),
                    Lookup::Bypass(Bypass::SideEffects)
                );
            }
        }
    }

    #[test]
    fn sampled_requests_are_cached_only_when_the_route_says_so() {
        for t in [None, Some(0.7), Some(-1.0)] {
            assert_eq!(
                lookup(&settings(false), Risk::Read, t, CacheControl::default()),
                Lookup::Bypass(Bypass::Sampled),
                "{t:?}"
            );
            assert_eq!(
                lookup(&settings(true), Risk::Read, t, CacheControl::default()),
                Lookup::Read { max_age: None }
            );
        }
        assert_eq!(
            lookup(&settings(false), Risk::Draft, Some(0.0), cc("")),
            Lookup::Read { max_age: None }
        );
    }

    #[test]
    fn cache_control_no_store_no_cache_and_max_age() {
        let s = settings(false);
        assert_eq!(
            lookup(&s, Risk::Read, Some(0.0), cc("no-store")),
            Lookup::Bypass(Bypass::NoStore)
        );
        assert_eq!(
            lookup(&s, Risk::Read, Some(0.0), cc("No-Cache")),
            Lookup::Refresh
        );
        assert_eq!(
            lookup(&s, Risk::Read, Some(0.0), cc("max-age=30, foo")),
            Lookup::Read {
                max_age: Some(Duration::from_secs(30))
            }
        );
        // Two values, the stricter max-age; a malformed one ignored.
        let two = CacheControl::parse([&b"max-age=30"[..], &b"max-age=\"10\""[..]]);
        assert_eq!(two.max_age, Some(Duration::from_secs(10)));
        assert_eq!(cc("max-age=soon").max_age, None);
        assert!(fresh_enough(
            Duration::from_secs(10),
            Some(Duration::from_secs(10))
        ));
        assert!(!fresh_enough(
            Duration::from_secs(11),
            Some(Duration::from_secs(10))
        ));
        assert!(fresh_enough(Duration::from_secs(1 << 30), None));
    }

    #[test]
    fn only_whole_successes_within_the_cap_are_kept() {
        let answered = |outcome, bytes, complete| Ending::Answered {
            outcome,
            bytes,
            complete,
        };
        assert!(keep(answered(Outcome::Ok, 1000, true), 1000));
        assert!(!keep(answered(Outcome::Ok, 1001, true), 1000));
        // A stream cut, stalled or failed inside its 200.
        assert!(!keep(answered(Outcome::Ok, 10, false), 1000));
        assert!(!keep(answered(Outcome::StreamStalled, 10, true), 1000));
        assert!(!keep(answered(Outcome::StreamError, 10, true), 1000));
        // A backend failure passed on.
        assert!(!keep(answered(Outcome::Status5xx, 10, true), 1000));
        assert!(!keep(Ending::NoAnswer { reached: true }, 1000));
    }

    #[test]
    fn the_normalized_body_ignores_order_whitespace_and_the_user() {
        let a = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0,"user":"u1"}"#;
        let b = br#"{ "temperature": 0, "user": "u2", "stream_options": {"include_usage": true},
                      "messages": [ {"content": "hi", "role": "user"} ], "model": "m", "stream": true }"#;
        let (na, nb) = (normalized_body(a).unwrap(), normalized_body(b).unwrap());
        assert_eq!(na.bytes, nb.bytes, "the form is not the content");
        assert!(!na.stream && !na.include_usage);
        assert!(nb.stream && nb.include_usage);
        // Every dialect's way of naming the end user is left out.
        let anthropic = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0,
            "metadata":{"user_id":"u9"},"safety_identifier":"s","prompt_cache_key":"k","store":true}"#;
        assert_eq!(normalized_body(a), normalized_body(anthropic));
        let c = br#"{"model":"m","messages":[{"role":"user","content":"hi!"}],"temperature":0}"#;
        assert_ne!(normalized_body(a), normalized_body(c));
        // Array order is meaning.
        let d = br#"{"model":"m","stop":["a","b"]}"#;
        let e = br#"{"model":"m","stop":["b","a"]}"#;
        assert_ne!(normalized_body(d), normalized_body(e));
        assert_eq!(normalized_body(a).unwrap().temperature, Some(0.0));
        assert_eq!(normalized_body(d).unwrap().temperature, None);
        assert_eq!(normalized_body(b"[1,2]"), None);
        assert_eq!(normalized_body(b"{not json"), None);
    }

    #[test]
    fn keys_differ_by_partition_route_pools_dialect_path_and_body() {
        let base = KeyParts {
            partition: "acme",
            route: "r",
            pools: b"p1",
            dialect: "openai",
            path: "/v1/chat/completions",
            form: "",
            body: b"{}",
        };
        let k = key(&base);
        assert!(k.starts_with(&partition_prefix("r", "acme")));
        assert!(k.starts_with("cache:r:"));
        assert_eq!(key(&base), k, "stable");
        let others = [
            KeyParts {
                partition: "globex",
                ..base
            },
            KeyParts {
                route: "r2",
                ..base
            },
            KeyParts {
                pools: b"p1'",
                ..base
            },
            KeyParts {
                dialect: "anthropic",
                ..base
            },
            KeyParts {
                path: "/v1/messages",
                ..base
            },
            KeyParts {
                body: b"{\"a\":1}",
                ..base
            },
            KeyParts {
                form: "stream",
                ..base
            },
        ];
        for o in others {
            assert_ne!(key(&o), k, "{o:?}");
        }
        // Bytes moved between fields do not collide.
        let moved = KeyParts {
            partition: "acm",
            route: "er",
            ..base
        };
        assert_ne!(key(&moved), k);
        assert!(!k.starts_with(&partition_prefix("r", "globex")));
    }
}
