//! A request's arrival: everything read and decided before any pool is
//! tried, as phases in order, each handing the next a typed value:
//!
//! 0. hand-offs: the admin paths, a parked task's handle, the router's own
//!    endpoints of another dialect;
//! 1. [`arrive`] (`handler/arrival.rs`, with phase 2): the request id, deadline and risk headers, read in one
//!    pass ([`RequestHeaders::scan`]): an [`Arrival`];
//! 2. [`read_body`]: the body, bounded, with a timeout;
//! 3. [`ask`]: on OpenAI-style JSON paths the body is peeked for its
//!    `model`, `stream`, `response_format` and token caps; the route is
//!    matched: an [`Asked`];
//! 4. admitted: who is calling and the request rate
//!    (`tenancy::identify`), and the route's approval;
//! 5. the route's response cache (`handler/cache.rs`): a hit answers
//!    here, having drawn on nothing but the request rate;
//! 6. held: what the call draws on the tenant's other limits until it
//!    ends (`tenancy::hold`: token rate, concurrency, budget);
//! 7. [`plan`]: the policy's decision picks the candidate pools; the
//!    `Idempotency-Key`'s fingerprint; what parking keeps: a [`Planned`]
//!    (no pool may take it: parked or refused);
//! 8. [`outbound`]: the body written for each pool's dialect, and parsed
//!    when a pool rewrites its model (one serde_json cannot re-encode is
//!    refused): an [`Outbound`];
//! 9. the key: join the request in flight, replay a stored answer, or
//!    lead;
//! 10. [`exchange`]: the router's own `X-Router-*` headers stripped, the
//!     forwarded ones added: the [`Exchange`] the chain walk
//!     ([`super::chain`]) carries out.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::HeaderValue;
use http::{HeaderMap, Method, Request, Response};
use hyper::body::Incoming;
use router_dialect::Dialect;
use router_json_peek::RequestPeek;
use router_policy::approval::Refusal as TokenRefusal;
use router_policy::decide::{decide_on_route, Refusal, RequestFacts};
use router_policy::split::{Headers, SplitKeys};
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use super::answer::Pending;
use super::arrival::{arrive, normalize_path, read_body, Arrival, OVERLOADED};
use super::chain::Exchange;
use super::dialect::{self, Own};
use super::upstream_request::ParsedBody;
use super::{full, spans, tenancy, ProxyBody, IDEMPOTENCY_KEY, X_REQUEST_ID};
use crate::config::Snapshot;
use crate::error::{ApprovalRefusal, ProxyError};
use crate::forward::{self, UpstreamClient};
use crate::idempotency::{self, Begin, Fingerprint, KeyedRequest};
use crate::limits::Reservation;
use crate::request_headers::RequestHeaders;
use crate::route_log::{IdempotencyRole, RouteRecord, WalkNote};
use crate::Shared;

/// Paths whose JSON body's `model` selects the route.
const OPENAI_JSON_PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

/// Handles one request from the TCP peer `peer` (`client_ip` is its
/// X-Forwarded-For value, see [`forward::client_ip_header`]); its attempts
/// go through `client`, the upstream connection pool of the worker thread
/// serving the connection. Admin paths go to [`crate::admin`], which
/// checks the peer.
///
/// The request walks its phases in order, each a function that hands the
/// next a typed value (the first two in `handler/arrival.rs`, the rest in
/// this file): [`arrive`] (the headers: an
/// [`Arrival`]), [`read_body`], [`ask`] (what the body asks, and its
/// route: an [`Asked`]), tenancy and approval (admitted), the response
/// cache, the tenant's holds, [`plan`] (the
/// policy's decision, the key and parking: a [`Planned`]), [`outbound`]
/// (the body each pool is sent: an [`Outbound`]), the `Idempotency-Key`
/// (the leader's lease), and [`exchange`] (what the walk needs: an
/// [`Exchange`]), then the walk ([`super::chain`]). The phases that wait
/// (the body, tenancy, the cache, parking, the key) are awaited here, in one future;
/// the others are plain functions, so no phase's future is moved into
/// another's.
///
/// Not an `async fn`: an `async fn` future keeps its arguments twice (as
/// given, and as the body's locals), and every move of the future copies
/// both; an `async move` block uses them in place.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub(crate) fn handle(
    shared: Arc<Shared>,
    client: UpstreamClient,
    peer: std::net::IpAddr,
    client_ip: HeaderValue,
    mut req: Request<Incoming>,
) -> impl std::future::Future<Output = Response<ProxyBody>> {
    async move {
        // One path for every decision and for the backend: normalized
        // before anything matches on it (`router_policy::request_path`).
        if let Err(e) = normalize_path(&mut req) {
            let snapshot = shared.config.load();
            return Pending::new(Arc::clone(&shared), &req, &snapshot).reject(e);
        }
        let path = req.uri().path();
        if path.starts_with("/_custom_router/") || path == "/metrics" {
            // Boxed: the admin future is large and rare; unboxed, it would set
            // the size of every request's future.
            return full(Box::pin(crate::admin::handle(&shared, peer, req)).await);
        }
        if path.starts_with(crate::tasks::TASKS_PATH) && req.method() == Method::GET {
            // A parked task's handle (`on_all_down: park`).
            return full(Box::pin(crate::tasks::view(&shared.tasks, path)).await);
        }
        // The router's endpoints of another dialect (`dialect`): one
        // compare for every other path.
        let mut client_dialect = Dialect::OpenAi;
        if path.starts_with("/v1/m") {
            match dialect::own_endpoint(req.method(), path) {
                Some(Own::Messages) => client_dialect = Dialect::Anthropic,
                Some(Own::CountTokens) => {
                    return Box::pin(dialect::count_tokens(&shared, req)).await
                }
                Some(Own::Models) => {
                    if let Some(list) = dialect::models(&shared, &req) {
                        return full(list);
                    }
                }
                None => {}
            }
        }
        let snapshot = shared.config.load();
        let mut pending = Pending::new(Arc::clone(&shared), &req, &snapshot);
        pending.dialect = client_dialect;
        if crate::telemetry::enabled() {
            spans::start_server_span(&req, pending.rec());
        }

        // 1. The headers (`seen` stays where `scan` wrote it: it is large,
        // and the phases borrow it).
        let seen = RequestHeaders::scan(req.headers());
        let arrival = match arrive(&shared, &snapshot, &req, &seen, &mut pending) {
            Ok(a) => a,
            Err(e) => return pending.reject(e),
        };
        // 2. The body. `reserved` holds its bytes under the proxy's cap
        // until the request is done.
        let (parts, body) = req.into_parts();
        let read = read_body(&shared, pending.t0, seen.content_length.as_ref(), body);
        let (mut body, mut reserved) = match read.await {
            Ok(b) => b,
            Err(e) => return pending.reject(e),
        };
        // 3. What it asks, and its route.
        let asked = match ask(
            &snapshot,
            &parts.method,
            &parts.uri,
            &body,
            &arrival,
            &mut pending,
        ) {
            Ok(a) => a,
            Err(e) => return pending.reject(e),
        };
        let route = asked.route;
        // The request's time bound: its header's, else the route's.
        let deadline = arrival.header_deadline.or(route.deadline);
        // 4. Admitted: who is calling and the request rate (boxed: rare,
        // and its store calls' state stays out of every request's
        // future), then the route's approval.
        let mut tenant = None;
        if let Some(tenants) = &snapshot.policy.tenants {
            // A parked task's run is admitted under the tenant that parked
            // it (its name is in the run's mark), as the policy has it now.
            let caller = match &arrival.task_run {
                Some(run) => tenancy::Caller::Task(run.tenant.as_deref()),
                None => tenancy::Caller::Key(
                    parts
                        .headers
                        .get(http::header::AUTHORIZATION)
                        .map(HeaderValue::as_bytes),
                    parts
                        .headers
                        .get(dialect::X_API_KEY)
                        .map(HeaderValue::as_bytes),
                ),
            };
            let identified = Box::pin(tenancy::identify(
                &shared,
                tenants,
                caller,
                route,
                arrival.risk,
                pending.rec(),
            ))
            .await;
            match identified {
                Ok(t) => tenant = Some(t),
                Err(e) => return pending.reject(e),
            }
        }
        if let Err(e) = check_approval(&shared, &snapshot, route, &seen, &arrival, &mut pending) {
            return pending.reject(e);
        }
        // 5. The route's response cache (`handler/cache.rs`): a hit
        // answers here, having drawn nothing but the request rate (not
        // even that with `rate_limit_hits: false`); a miss leads and keeps
        // the answer.
        let mut cache_lease = None;
        if let Some(settings) = &route.cache {
            let (wait_until, inflight_ttl) = claim_bounds(&shared, pending.t0, deadline);
            let looked = Box::pin(super::cache::look(
                &shared,
                &snapshot,
                route,
                settings,
                super::cache::CacheRequest {
                    headers: &parts.headers,
                    path: parts.uri.path(),
                    body: &body,
                    risk: arrival.risk,
                    dialect: pending.dialect,
                    wait_until,
                    inflight_ttl,
                },
                &mut pending,
            ))
            .await;
            match looked {
                super::cache::Cached::Hit(answer, age) => {
                    return pending.cache_hit(&snapshot, &answer, age)
                }
                super::cache::Cached::Walk(lease) => cache_lease = lease,
            }
        }
        // 6. What the call draws on the tenant's limits until it ends
        // (the request rate too, on a route whose hits do not count it).
        if let Some(tenant) = tenant {
            if route.cache.as_ref().is_some_and(|c| !c.rate_limit_hits) {
                if let Err(e) = tenancy::request_rate(&shared, tenant).await {
                    return pending.reject(e);
                }
            }
            let held = Box::pin(tenancy::hold(
                &shared,
                &snapshot,
                tenant,
                route,
                asked.estimate,
                deadline,
                pending.rec(),
            ))
            .await;
            if let Err(e) = held {
                return pending.reject(e);
            }
        }
        // 7. The policy's decision, the key, parking.
        let mut planned = plan(
            &snapshot,
            &parts,
            &body,
            &seen,
            &asked,
            &arrival,
            &mut pending,
        );
        match planned.refusal {
            Some(Refusal::BudgetExceeded) => {
                let detail = pending.rec().reason.clone();
                return pending.reject(ProxyError::BudgetExceeded { detail });
            }
            Some(_) => {
                let detail = pending.rec().reason.clone();
                if let Some(intent) = &planned.park {
                    // As its client sent it (its own path and body).
                    let path_and_query = parts
                        .uri
                        .path_and_query()
                        .map_or(parts.uri.path(), |p| p.as_str());
                    let ctx = intent.context(
                        &parts.method,
                        path_and_query,
                        &parts.headers,
                        &body,
                        arrival.risk,
                    );
                    return Box::pin(super::parking::park(pending, route, &ctx, detail)).await;
                }
                return pending.reject(ProxyError::NoBackend { detail });
            }
            None => {}
        }
        // A keyed retry of a request parked earlier: its task's state, or
        // its answer (never a second run beside the task's).
        if let Some(ctx) = planned
            .park
            .as_ref()
            .filter(|c| c.keyed.is_some() && !c.run)
        {
            let found = Box::pin(super::parking::existing(
                pending,
                &ctx.task_id(),
                ctx.respond_async,
            ))
            .await;
            pending = match found {
                Ok(resp) => return resp,
                Err(p) => p,
            };
        }
        // 8. The body each pool is sent.
        let outbound = match outbound(
            &snapshot,
            &parts.uri,
            &mut body,
            &mut reserved,
            &asked,
            &mut planned.candidates,
            &mut pending,
        ) {
            Ok(o) => o,
            Err(e) => return pending.reject(e),
        };
        // 9. Idempotency: join a request in flight, replay a stored
        // answer, or lead.
        let mut leader = None;
        if let Some((key, fp)) = planned.keyed.take() {
            let (wait_until, inflight_ttl) = claim_bounds(&shared, pending.t0, planned.deadline);
            let begun = shared
                .idempotency
                .begin(KeyedRequest {
                    key: &key,
                    fp,
                    risk: arrival.risk,
                    inflight_ttl,
                    wait_until,
                })
                .await;
            match begun {
                Begin::Lead(lease) => {
                    let local = lease.is_local() && shared.idempotency.is_shared();
                    pending.rec().idempotency = Some(if local {
                        IdempotencyRole::LeadLocal
                    } else {
                        IdempotencyRole::Lead
                    });
                    leader = Some(lease);
                }
                Begin::Untracked => {}
                Begin::Replay { answer, joined } => return pending.replay(&answer, joined),
                Begin::Refuse(e) => return pending.reject(e.into()),
            }
        }
        // With a key the client will retry: unless the route says
        // otherwise, the request runs in a task of its own, which a
        // client going away does not cancel, and its answer is kept.
        let keyed = leader.is_some();
        // The cache entry's lease is settled with the key's (one answer).
        let leader = match (leader, cache_lease) {
            (Some(key), Some(entry)) => Some(key.with(entry)),
            (key, entry) => key.or(entry),
        };
        // 10. What the walk needs.
        let request = (parts.method, &parts.uri, parts.headers, body);
        let phases = (&seen, &arrival, asked, planned, outbound);
        let exchange = exchange(
            shared,
            client,
            &client_ip,
            &snapshot,
            request,
            phases,
            &mut pending,
        );
        if router_policy::idempotency::finish_when_client_leaves(keyed, route.finish_on_client_gone)
        {
            let route = route.clone();
            let task =
                tokio::spawn(async move { exchange.walk_chain(pending, &route, leader).await });
            return match task.await {
                Ok(resp) => resp,
                Err(e) => {
                    tracing::error!(error = %e, "a keyed request's task failed");
                    let body = router_dialect::errors::openai_envelope(
                        "internal error",
                        "internal_error",
                        Some("internal_error"),
                    );
                    let mut resp = Response::new(Bytes::from(body.to_string()));
                    *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                    full(resp)
                }
            };
        }
        exchange.walk_chain(pending, route, leader).await
    }
}

/// How long a keyed request (an `Idempotency-Key`, a cache entry) waits
/// for the first one in flight, and how long its claim holds if this
/// proxy dies holding it: the request's own time bound (`deadline` from
/// `t0`, else the queue timeout and the attempt timeout), and a margin.
fn claim_bounds(shared: &Shared, t0: Instant, deadline: Option<Duration>) -> (Instant, Duration) {
    let wait = deadline.unwrap_or(shared.settings.queue.timeout);
    let wait_until = crate::clock::later(t0, wait, crate::clock::A_YEAR);
    let bound = deadline.unwrap_or(shared.settings.attempt_timeout);
    (wait_until, bound.saturating_add(CLAIM_MARGIN))
}

/// Phase 3: what the request asks, read from its path and body, and the
/// route that takes it.
struct Asked<'a> {
    /// The path routes match (a chat path for a client of another
    /// dialect).
    path: &'a str,
    /// An OpenAI-style JSON call (its body was peeked).
    json_call: bool,
    /// One copy of the model name, shared by the record and the attempts.
    model: Option<Arc<str>>,
    streaming: bool,
    /// Structured output: only a non-streaming answer can be checked
    /// before it reaches the client.
    structured: Option<router_policy::structured::Expected>,
    route: &'a router_policy::Route,
    /// What the call may use, estimated once (tenants' limits, the
    /// policy's cost gates).
    estimate: tenancy::CallEstimate,
}

/// Peeks the body (on OpenAI-style JSON paths) for its model, stream,
/// response format and token caps, and matches the route.
fn ask<'a>(
    snapshot: &'a Snapshot,
    method: &Method,
    uri: &'a http::Uri,
    body: &Bytes,
    arrival: &Arrival,
    pending: &mut Pending,
) -> Result<Asked<'a>, ProxyError> {
    // An Anthropic client's request must be one; it is routed as a chat
    // completion, and written for each pool's dialect once the pools are
    // known (`dialect`). (Checked here, parsed again once the pools are
    // known: nothing of it is kept across the waits in between, which
    // every request's future would carry.)
    let path = if pending.dialect == Dialect::OpenAi {
        uri.path()
    } else {
        dialect::parse_messages(body)?;
        pending.rec().dialect = Some(pending.dialect.as_str());
        dialect::CHAT_PATH
    };
    let json_call = method == Method::POST && OPENAI_JSON_PATHS.contains(&path);
    let peek = if json_call {
        router_json_peek::peek_request(body).map_err(|e| {
            ProxyError::InvalidRequest(format!("request body is not valid JSON: {e}"))
        })?
    } else {
        RequestPeek::default()
    };
    let model: Option<Arc<str>> = peek.model.as_deref().map(Arc::from);
    let structured = match peek.response_format.as_ref().map(|r| r.kind.as_ref()) {
        Some(kind) if router_policy::structured::is_structured_type(kind) => {
            router_policy::structured::expected_in_body(body)
        }
        _ => None,
    };
    pending.rec().model = model.clone();
    let risk = arrival.risk;
    let Some(route) = snapshot.policy.route_for_risk(risk, model.as_deref(), path) else {
        return Err(ProxyError::NoBackend {
            detail: format!("no route matches risk {}", risk.as_str()),
        });
    };
    pending.rec().route = Some(route.name.clone());
    let estimate = tenancy::CallEstimate {
        input_tokens: (body.len() as u64).div_ceil(4),
        // The largest cap given: engines differ in which they honour.
        max_tokens: router_policy::tenant::output_cap([
            peek.max_tokens,
            peek.max_completion_tokens,
            peek.max_output_tokens,
        ]),
    };
    Ok(Asked {
        path,
        json_call,
        model,
        streaming: peek.stream.unwrap_or(false),
        structured,
        route,
        estimate,
    })
}

/// The route's approval token, unless the request is a parked task's run
/// (the operator's approval stands for it).
fn check_approval(
    shared: &Shared,
    snapshot: &Snapshot,
    route: &router_policy::Route,
    seen: &RequestHeaders,
    arrival: &Arrival,
    pending: &mut Pending,
) -> Result<(), ProxyError> {
    if !route.requires_approval || arrival.task_run.is_some() {
        return Ok(());
    }
    let given = seen.approval.as_ref().map(HeaderValue::as_bytes);
    let rec = pending.rec();
    let now = unix_seconds(rec.offered_at.0);
    approve(shared, snapshot, &route.name, &rec.request_id, given, now).map_err(|why| {
        ProxyError::ApprovalRequired {
            route: route.name.clone(),
            why,
        }
    })
}

/// Phase 5: the policy's decision on live measurements, the request's
/// deadline, its key and what parking keeps.
struct Planned {
    /// The request's time bound: its header's, else the route's.
    deadline: Option<Duration>,
    deadline_at: Option<Instant>,
    /// Chain positions of the pools that may take it, in its order.
    candidates: Vec<usize>,
    /// The chain position of its first pool before any gate.
    first: usize,
    /// Why none may, when so.
    refusal: Option<Refusal>,
    estimated_input_tokens: u64,
    /// The `Idempotency-Key` and the request's fingerprint, computed
    /// once (parking and idempotency both go by them).
    keyed: Option<(String, Fingerprint)>,
    /// On a parking route: what parking keeps of the request.
    park: Option<Box<crate::tasks::ParkIntent>>,
}

fn plan(
    snapshot: &Snapshot,
    parts: &http::request::Parts,
    body: &Bytes,
    seen: &RequestHeaders,
    asked: &Asked<'_>,
    arrival: &Arrival,
    pending: &mut Pending,
) -> Planned {
    let route = asked.route;
    let deadline = arrival.header_deadline.or(route.deadline);
    pending.rec().deadline_ms = deadline.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    // Checked: a policy's deadline_ms may be anything up to u64::MAX.
    let deadline_at = deadline.map(|d| crate::clock::later(pending.t0, d, crate::clock::A_YEAR));
    // Measured at the request's own start time: a few microseconds old,
    // and one clock reading instead of one per pool call.
    let t0 = pending.t0;
    // A split's key: the request's `Idempotency-Key` or id (the same for
    // every retry of the request), its tenant, its headers
    // (`router_policy::split`).
    let rec: &RouteRecord = pending.rec();
    let keys = SplitKeys {
        request_id: Some(rec.request_id.as_str()),
        idempotency_key: seen
            .idempotency_key
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(str::trim),
        tenant: rec.tenant.as_deref(),
        headers: Headers::Map(&parts.headers),
    };
    let facts = RequestFacts {
        risk: arrival.risk,
        model: asked.model.as_deref(),
        path: asked.path,
        // One definition of structured output: what is gated is what is
        // checked.
        structured_output: asked.structured.is_some(),
        deadline_ms: rec.deadline_ms,
        input_tokens: Some(asked.estimate.input_tokens),
        max_tokens: asked.estimate.max_tokens,
        keys,
    };
    // The request's size against the pools' quotas (the `quota` gate).
    let estimate = router_policy::quota::Estimate {
        input: asked.estimate.input_tokens,
        output: asked
            .estimate
            .max_tokens
            .unwrap_or(router_policy::decide::DEFAULT_MAX_TOKENS),
    };
    let decision = decide_on_route(&snapshot.policy, route, &facts, |_, name| {
        snapshot
            .pools
            .get(name)
            .map(|p| p.measurements_for(t0, estimate))
    });
    pending.rec().reason = decision.reason;
    // Each split's choice, typed (the reason says the same in words):
    // the walk's first notes.
    for c in &decision.splits {
        let pool = route.pool_at(c.at).unwrap_or("");
        let pool = match snapshot.pools.get(pool) {
            Some(p) => Arc::clone(p.shared_name()),
            None => Arc::from(pool),
        };
        pending
            .rec()
            .walk
            .push(WalkNote::split(pool, c.weight, c.key.label()));
    }
    // The pools the decision passed over, typed (the reason says the same
    // in words); none on the usual path.
    if !decision.gated.is_empty() {
        let name = |i: usize| {
            let pool = route.pool_at(i).unwrap_or("");
            match snapshot.pools.get(pool) {
                Some(p) => Arc::clone(p.shared_name()),
                None => Arc::from(pool),
            }
        };
        let gated = decision
            .gated
            .iter()
            .map(|&(i, g)| WalkNote::gated(name(i), g.label()));
        pending.rec().walk.extend(gated);
    }
    // A parked task's run carries its client's key to the backend but is
    // no keyed request of its own here: its task is what runs it once.
    let keyed = seen
        .idempotency_key
        .as_ref()
        .filter(|_| arrival.task_run.is_none())
        .and_then(|v| v.to_str().ok())
        .map(|k| {
            // The client's own path: the same key on another dialect's
            // path is another request.
            let fp = idempotency::fingerprint(
                parts.method.as_str(),
                parts.uri.path(),
                body,
                &parts.headers,
            );
            (k.trim().to_string(), fp)
        });
    // Safe mode: a parked task's own run is never parked again (it
    // answers `no_backend`, and its task waits again).
    let park = match &route.park {
        Some(_) if arrival.task_run.is_some() => Some(crate::tasks::ParkIntent::run()),
        Some(_) => Some(crate::tasks::ParkIntent::new(
            &parts.headers,
            arrival.header_deadline,
            keyed.clone(),
        )),
        None => None,
    };
    Planned {
        deadline,
        deadline_at,
        candidates: decision.candidates,
        first: decision.first.unwrap_or(0),
        refusal: decision.refusal,
        estimated_input_tokens: asked.estimate.input_tokens,
        keyed,
        park,
    }
}

/// Phase 6: how the body goes to the pools.
struct Outbound {
    /// A client of another dialect: what was translated, and how its
    /// answers are.
    translation: Option<Box<super::dialect::Translation>>,
    /// The body parsed for its model to be rewritten (or stream usage
    /// asked), when a candidate pool does so.
    parsed: Option<ParsedBody>,
    /// The client asked for usage in its stream itself.
    client_asks_usage: bool,
}

/// Writes the body for each candidate pool's dialect (a pool whose
/// dialect cannot carry it is passed over, saying why; none left: 400),
/// and parses it when a candidate pool rewrites the model (a body
/// serde_json cannot re-encode is refused, never sent with the client's
/// own model instead) or adds stream usage.
fn outbound(
    snapshot: &Snapshot,
    uri: &http::Uri,
    body: &mut Bytes,
    reserved: &mut Reservation,
    asked: &Asked<'_>,
    candidates: &mut Vec<usize>,
    pending: &mut Pending,
) -> Result<Outbound, ProxyError> {
    let (route, path, json_call) = (asked.route, asked.path, asked.json_call);
    let mut translation = None;
    if pending.dialect != Dialect::OpenAi
        || (snapshot.translating_pools && json_call && path == dialect::CHAT_PATH)
    {
        let client = dialect::ClientRequest {
            dialect: pending.dialect,
            body: body.clone(),
            path: uri.path_and_query(),
            stream: asked.streaming,
            created: unix_seconds(pending.rec().offered_at.0),
        };
        let policy = &snapshot.policy;
        let prepared = dialect::prepare(client, candidates, |k| {
            let name = route.pool_at(k).unwrap_or("");
            (name.to_owned(), dialect::pool_dialect(policy.pool(name)))
        })?;
        if !prepared.notes.is_empty() {
            let rec = pending.rec();
            rec.reason = format!("{}; {}", rec.reason, prepared.notes.join("; "));
        }
        // Both bodies are held until the request is done.
        if !reserved.grow_to(prepared.body.len() + body.len()) {
            return Err(OVERLOADED);
        }
        *body = prepared.body;
        *candidates = prepared.candidates;
        translation = Some(prepared.translation);
    }
    let candidate_pools = || {
        candidates
            .iter()
            .filter_map(|k| route.pool_at(*k))
            .filter_map(|name| snapshot.policy.pool(name))
    };
    let rewrites = json_call
        && candidate_pools().any(|p| {
            p.model
                .as_deref()
                .is_some_and(|m| asked.model.as_deref() != Some(m))
        });
    let usage_wanted = asked.streaming
        && json_call
        && super::upstream_request::STREAM_USAGE_PATHS.contains(&path)
        && candidate_pools().any(|p| p.stream_usage && p.provider.speaks_openai());
    let parsed = if rewrites {
        Some(ParsedBody::parse(body).map_err(|e| {
            ProxyError::InvalidRequest(format!(
                "the request body cannot be re-encoded with the pool's model: {e}"
            ))
        })?)
    } else if usage_wanted {
        // Optional: a body serde_json cannot take goes as it came.
        ParsedBody::parse(body).ok()
    } else {
        None
    };
    let client_asks_usage = parsed.as_ref().is_some_and(ParsedBody::asks_stream_usage);
    Ok(Outbound {
        translation,
        parsed,
        client_asks_usage,
    })
}

/// Phase 8: the headers a backend gets, and the [`Exchange`] the walk
/// carries out.
///
/// `request`: the client's method, URI, headers and body; `phases`: the
/// values the earlier phases handed on.
fn exchange(
    shared: Arc<Shared>,
    client: UpstreamClient,
    client_ip: &HeaderValue,
    snapshot: &Arc<Snapshot>,
    (method, uri, mut headers, body): (Method, &http::Uri, HeaderMap, Bytes),
    (seen, arrival, asked, planned, outbound): (
        &RequestHeaders,
        &Arrival,
        Asked<'_>,
        Planned,
        Outbound,
    ),
    pending: &mut Pending,
) -> Exchange {
    // The scan said which of these are there: absent ones are not looked up.
    if seen.hop_by_hop {
        crate::hop_by_hop::strip_hop_by_hop(&mut headers);
    }
    // `Host` is replaced and `Content-Length` kept or replaced when the
    // upstream request is made (`upstream_request`). The router's own
    // headers (the approval token among them) never reach a backend.
    if seen.router_headers {
        crate::request_headers::strip_router_headers(&mut headers);
    }
    if snapshot.policy.tenants.is_some() {
        // The tenant's key never leaves the router: a pool with a key of
        // its own sends that one, any other nothing.
        headers.remove(http::header::AUTHORIZATION);
        headers.remove(dialect::X_API_KEY);
    }
    // Over HTTP/2 the host is the `:authority`, not a header.
    let host = seen.host.clone().or_else(|| {
        let authority = uri.authority()?;
        http::HeaderValue::from_str(authority.as_str()).ok()
    });
    let tls = shared.tls.is_some();
    forward::add_forwarded(&mut headers, client_ip, host, seen, tls);
    if let Some(id) = &pending.id_header {
        headers.insert(X_REQUEST_ID, id.clone());
        headers.insert(IDEMPOTENCY_KEY, id.clone());
    }
    Exchange {
        otel: pending.rec().otel.clone(),
        operation: spans::operation_name(asked.path),
        risk: arrival.risk,
        structured: asked.structured,
        candidates: planned.candidates,
        first: planned.first,
        estimated_input_tokens: planned.estimated_input_tokens,
        output_cap: asked.estimate.max_tokens,
        shared,
        client,
        snapshot: Arc::clone(snapshot),
        method,
        path_and_query: match &outbound.translation {
            // The client's query stays with it (a pool of Anthropic's
            // dialect gets its own path: `upstream_request`).
            Some(_) => http::uri::PathAndQuery::from_static(dialect::CHAT_PATH),
            None => uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        },
        headers,
        body,
        parsed: outbound.parsed,
        client_asks_usage: outbound.client_asks_usage,
        tenant_key: pending.rec().tenant.as_deref().map(tenant_key),
        json_call: asked.json_call,
        streaming: asked.streaming,
        model: asked.model,
        deadline_at: planned.deadline_at,
        park: planned.park,
        translation: outbound.translation,
    }
}

/// How long a claim outlives its request's time bound.
const CLAIM_MARGIN: Duration = Duration::from_secs(10);

/// Whether `given` approves this request on `route` at `now` (Unix
/// seconds): a token signed with the proxy's key
/// (`CUSTOM_ROUTER_APPROVAL_KEY`) for this route and request id, or the
/// policy's static token where it opts in (`allow_static_token`), compared
/// in constant time. See `router_policy::approval`.
fn approve(
    shared: &Shared,
    snapshot: &Snapshot,
    route: &str,
    request_id: &str,
    given: Option<&[u8]>,
    now: u64,
) -> Result<(), ApprovalRefusal> {
    let key = shared.settings.approval_key.as_ref();
    let fixed = snapshot.secrets.approval_token.as_deref();
    if key.is_none() && fixed.is_none() {
        return Err(ApprovalRefusal::NotConfigured);
    }
    let given = given.ok_or(ApprovalRefusal::Token(TokenRefusal::Missing))?;
    if let Some(fixed) = fixed {
        if bool::from(given.ct_eq(fixed.as_bytes())) {
            return Ok(());
        }
    }
    match key {
        Some(key) => key
            .verify(given, route, request_id, now)
            .map_err(ApprovalRefusal::Token),
        None => Err(ApprovalRefusal::Token(TokenRefusal::Mismatch)),
    }
}

/// A tenant's name as a queue-fairness key (FNV-1a).
fn tenant_key(name: &str) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(name.as_bytes());
    h.finish()
}

/// `at` as whole seconds since the Unix epoch (0 before it).
pub(super) fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
