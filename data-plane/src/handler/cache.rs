//! The response cache's phase (a route with `cache:`), between the body
//! each pool is sent and the `Idempotency-Key`: what
//! [`router_policy::cache::lookup`] decides for the request, carried out
//! against the proxy's cache store (`Shared::cache`, built like the
//! idempotency keys: the shared store's `cache:` keys, or this proxy's own
//! byte-bounded store, which a store outage falls back to, so an outage is
//! a miss, never an error).
//!
//! - a hit answers at once with the stored answer, `x-router-cache: hit`
//!   and `Age`; it costs nothing and draws nothing from budgets (no
//!   attempt was made, so the tenant's holds settle at 0);
//! - a miss leads: the walk runs and its lease keeps the answer when
//!   [`router_policy::cache::keep`] says so; identical requests arriving
//!   meanwhile join it (single flight) and get its answer, or, when it is
//!   not kept, go to a backend each;
//! - `no-cache` drops the entry first, then leads (`refresh`);
//! - a bypass reaches the walk untouched.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use router_dialect::Dialect;
use router_policy::cache::{self, CacheSettings, KeyParts, Lookup, Partition};
use router_policy::Risk;
use tokio::time::Instant;

use super::answer::Pending;
use crate::config::Snapshot;
use crate::idempotency::{Begin, KeyLease, KeyedRequest, StoredAnswer};
use crate::Shared;

/// What the phase hands on.
pub(super) enum Cached {
    /// Answered from the cache.
    Hit(Arc<StoredAnswer>, Duration),
    /// Go on with the walk, keeping the answer with this lease if any.
    Walk(Option<KeyLease>),
}

/// What the key needs from the request.
pub(super) struct CacheRequest<'a> {
    pub(super) headers: &'a http::HeaderMap,
    pub(super) path: &'a str,
    pub(super) body: &'a Bytes,
    pub(super) risk: Risk,
    pub(super) dialect: Dialect,
    pub(super) wait_until: Instant,
    pub(super) inflight_ttl: Duration,
}

/// Carries out the cache's decision for a request on a route with
/// `settings`; `pending`'s record says what it did.
pub(super) async fn look(
    shared: &Shared,
    snapshot: &Snapshot,
    route: &router_policy::Route,
    settings: &CacheSettings,
    req: CacheRequest<'_>,
    pending: &mut Pending,
) -> Cached {
    let cache_control = cache::CacheControl::parse(
        req.headers
            .get_all(http::header::CACHE_CONTROL)
            .iter()
            .map(http::HeaderValue::as_bytes),
    );
    let normalized = cache::normalized_body(req.body);
    let temperature = normalized.as_ref().and_then(|n| n.temperature);
    let mut decided = cache::lookup(settings, req.risk, temperature, cache_control);
    let partition = match &settings.partition {
        Partition::Tenant => pending.rec().tenant.as_deref().map(str::to_owned),
        Partition::Route => Some(String::new()),
        Partition::Header(name) => req
            .headers
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    }
    // Without tenants: one partition for every caller.
    .or_else(|| (settings.partition == Partition::Tenant).then(String::new));
    let key = match (&normalized, &partition, decided) {
        (_, _, Lookup::Bypass(_)) => None,
        (None, _, _) => {
            decided = Lookup::Bypass(cache::Bypass::Unkeyable);
            None
        }
        (_, None, _) => {
            decided = Lookup::Bypass(cache::Bypass::NoPartition);
            None
        }
        (Some(n), Some(p), _) => Some(cache::key(&KeyParts {
            partition: p,
            route: &route.name,
            pools: snapshot
                .cache_pools
                .get(&route.name)
                .map_or(&[][..], |p| &p[..]),
            dialect: req.dialect.as_str(),
            path: req.path,
            form: match (shares_forms(req.dialect, req.path), n.stream) {
                (true, _) => "",
                (false, true) => "stream",
                (false, false) => "plain",
            },
            body: &n.bytes,
        })),
    };
    let (Some(key), false) = (key, matches!(decided, Lookup::Bypass(_))) else {
        mark(shared, pending, "bypass");
        return Cached::Walk(None);
    };
    let max_age = match decided {
        Lookup::Refresh => {
            shared.cache.forget(&key).await;
            None
        }
        Lookup::Read { max_age } => max_age,
        Lookup::Bypass(_) => None,
    };
    // A hit too old for the client: dropped and led again (a refresh).
    let mut stale = false;
    for _ in 0..2 {
        let begun = shared
            .cache
            .begin(KeyedRequest {
                key: &key,
                // The key is the request: no other request can share it.
                fp: crate::idempotency::Fingerprint([0; 16]),
                risk: Risk::Read,
                inflight_ttl: req.inflight_ttl,
                wait_until: req.wait_until,
            })
            .await;
        match begun {
            Begin::Lead(lease) => {
                let refreshed = stale || decided == Lookup::Refresh;
                mark(shared, pending, if refreshed { "refresh" } else { "miss" });
                return Cached::Walk(Some(
                    lease.for_cache(settings.ttl, settings.max_entry_bytes),
                ));
            }
            Begin::Replay { answer, .. } => {
                let now = router_policy::wall_clock::unix_ms_i64();
                let age = answer.stored_at_ms().map_or(Duration::ZERO, |at| {
                    Duration::from_millis(u64::try_from(now.saturating_sub(at)).unwrap_or(0))
                });
                if cache::fresh_enough(age, max_age) {
                    let (stream, include_usage) = normalized
                        .as_ref()
                        .map_or((false, false), |n| (n.stream, n.include_usage));
                    // Stored in the other form and not rebuilt: a miss
                    // that keeps the entry (no lease).
                    let Some(answer) = in_form(answer, stream, include_usage, req.dialect) else {
                        break;
                    };
                    mark(shared, pending, "hit");
                    return Cached::Hit(answer, age);
                }
                shared.cache.forget(&key).await;
                stale = true;
            }
            // The first request's answer was not kept (or the store is
            // full): this one goes to a backend on its own.
            Begin::Untracked | Begin::Refuse(_) => break,
        }
    }
    mark(shared, pending, "miss");
    Cached::Walk(None)
}

/// Whether a plain and a streamed request on `path` (normalized on
/// arrival, `router_policy::request_path`) share an entry: chat
/// completions and messages, the paths the router itself reads in each
/// dialect, whose whole answer and stream are rebuilt from each other
/// ([`in_form`]); any other path keys the form.
fn shares_forms(dialect: Dialect, path: &str) -> bool {
    match dialect {
        Dialect::OpenAi => path == super::dialect::CHAT_PATH,
        Dialect::Anthropic => path == super::dialect::MESSAGES_PATH,
        Dialect::Gemini => false,
    }
}

/// `stored` in the form the request asks for: as it is when the forms
/// agree; else a stream's frames folded into the whole answer
/// ([`router_dialect::stream::collect_answer`]), or a whole answer written
/// as a stream ([`router_dialect::stream::answer_stream`], with the usage
/// chunk when an OpenAI client asked for it). `None` when it cannot be
/// rebuilt (a non-2xx entry is never stored, so only a body the dialect
/// does not read).
fn in_form(
    stored: Arc<StoredAnswer>,
    want_stream: bool,
    include_usage: bool,
    dialect: Dialect,
) -> Option<Arc<StoredAnswer>> {
    if stored.stream == want_stream {
        return Some(stored);
    }
    let body = if want_stream {
        let answer = router_dialect::parse_answer(dialect, &stored.body).ok()?;
        let opts = router_dialect::stream::StreamOptions {
            id: answer.id.clone(),
            model: Some(answer.model.clone()),
            created: router_policy::wall_clock::unix_ms() / 1000,
            include_usage,
            ..Default::default()
        };
        router_dialect::stream::answer_stream(&answer, dialect, &opts).ok()?
    } else {
        let answer = router_dialect::stream::collect_answer(dialect, &stored.body).ok()?;
        router_dialect::write_answer(
            &answer,
            dialect,
            router_policy::wall_clock::unix_ms() / 1000,
        )
        .ok()?
    };
    let content_type = if want_stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let headers: Vec<(http::HeaderName, http::HeaderValue)> = stored
        .headers
        .iter()
        .filter(|(k, _)| k != http::header::CONTENT_TYPE && k != http::header::CONTENT_LENGTH)
        .cloned()
        .chain(std::iter::once((
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        )))
        .collect();
    Some(Arc::new(StoredAnswer {
        status: stored.status,
        headers: headers.into_boxed_slice(),
        body: Bytes::from(body),
        stream: want_stream,
    }))
}

fn mark(shared: &Shared, pending: &mut Pending, what: &'static str) {
    shared.metrics.cache_event(what);
    pending.rec().cache = Some(what);
}
