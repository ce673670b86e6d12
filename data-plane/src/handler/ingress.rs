//! A request's arrival: everything read and decided before any pool is
//! tried.
//!
//! In order: the admin paths are handed off; the request id, deadline and
//! risk headers are read (one pass, [`RequestHeaders::scan`]); the body is
//! read (bounded, with a timeout) and, on OpenAI-style JSON paths, peeked
//! for its `model`, `stream`, `response_format` and token cap; the route is
//! matched and its approval checked; the policy's decision picks the
//! candidate pools; a body whose model a candidate pool rewrites is parsed
//! (one serde_json cannot re-encode is refused); a request with an
//! `Idempotency-Key` joins the one in flight, replays a stored answer, or
//! leads; the router's own `X-Router-*` headers are stripped. What is left
//! is an [`Exchange`] for the chain walk ([`super::chain`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use router_dialect::Dialect;
use router_json_peek::RequestPeek;
use router_policy::approval::Refusal as TokenRefusal;
use router_policy::decide::{decide_on_route, Refusal, RequestFacts};
use router_policy::Risk;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use super::answer::Pending;
use super::chain::Exchange;
use super::dialect::{self, Own};
use super::upstream_request::ParsedBody;
use super::{full, spans, tenancy, ProxyBody, IDEMPOTENCY_KEY, X_REQUEST_ID};
use crate::config::Snapshot;
use crate::error::{ApprovalRefusal, ProxyError};
use crate::forward::{self, ReadWholeError, UpstreamClient};
use crate::idempotency::{self, Begin, KeyedRequest};
use crate::limits::Reservation;
use crate::request_headers::RequestHeaders;
use crate::route_log::IdempotencyRole;
use crate::Shared;

/// Paths whose JSON body's `model` selects the route.
const OPENAI_JSON_PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

/// The longest deadline a client may ask for.
const MAX_DEADLINE_MS: u64 = 24 * 3600 * 1000;

/// Handles one request from the TCP peer `peer` (`client_ip` is its
/// X-Forwarded-For value, see [`forward::client_ip_header`]); its attempts
/// go through `client`, the upstream connection pool of the worker thread
/// serving the connection. Admin paths go to [`crate::admin`], which
/// checks the peer.
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

        let seen = RequestHeaders::scan(req.headers());
        // This proxy's own run of a parked task (see `crate::tasks`).
        let task_run = if seen.router_headers {
            shared.tasks.run_of(req.headers())
        } else {
            None
        };
        if let Some(run) = &task_run {
            pending.rec().parked_task = Some(run.id.clone());
        }
        match request_id(&seen, pending.rec().offered_at.0) {
            Ok((id, header)) => {
                pending.id_header = header;
                pending.rec().request_id = id;
            }
            Err(e) => return pending.reject(e),
        }
        let header_deadline = match deadline_header(seen.deadline_ms.as_ref()) {
            Ok(d) => d,
            Err(e) => return pending.reject(e),
        };
        let risk = match &seen.risk {
            None => snapshot.policy.default_risk,
            Some(v) => match v.to_str().ok().and_then(Risk::parse) {
                Some(r) => r,
                None => {
                    return pending.reject(ProxyError::InvalidRequest(
                        "X-Router-Risk must be READ, DRAFT, SEND or DESTRUCTIVE".into(),
                    ))
                }
            },
        };
        pending.rec().risk = Some(risk);
        let (parts, body) = req.into_parts();
        // `reserved` holds the body's bytes under the proxy's cap until the
        // request is done.
        let (mut body, mut reserved) =
            match read_body(&shared, pending.t0, seen.content_length.as_ref(), body).await {
                Ok(b) => b,
                Err(e) => return pending.reject(e),
            };
        // An Anthropic client's request must be one; it is routed as a
        // chat completion, and written for each pool's dialect once the
        // pools are known (`dialect`). Boxed: rare, and large.
        // (Checked here, parsed again once the pools are known: nothing of
        // it is kept across the waits in between, which every request's
        // future would carry.)
        let path = if pending.dialect == Dialect::OpenAi {
            parts.uri.path()
        } else {
            if let Err(e) = dialect::parse_messages(&body) {
                return pending.reject(e);
            }
            pending.rec().dialect = Some(pending.dialect.as_str());
            dialect::CHAT_PATH
        };
        let json_call = parts.method == Method::POST && OPENAI_JSON_PATHS.contains(&path);
        let peek = if json_call {
            match router_json_peek::peek_request(&body) {
                Ok(p) => p,
                Err(e) => {
                    return pending.reject(ProxyError::InvalidRequest(format!(
                        "request body is not valid JSON: {e}"
                    )))
                }
            }
        } else {
            RequestPeek::default()
        };
        // One copy of the model name, shared by the log record and the
        // attempts.
        let model: Option<Arc<str>> = peek.model.as_deref().map(Arc::from);
        let streaming = peek.stream.unwrap_or(false);
        // Structured output: only a non-streaming answer can be checked before
        // it reaches the client.
        let structured = match peek.response_format.as_ref().map(|r| r.kind.as_ref()) {
            Some(kind) if router_policy::structured::is_structured_type(kind) => {
                router_policy::structured::expected_in_body(&body)
            }
            _ => None,
        };
        pending.rec().model = model.clone();

        let Some(route) = snapshot.policy.route_for_risk(risk, model.as_deref(), path) else {
            return pending.reject(ProxyError::NoBackend {
                detail: format!("no route matches risk {}", risk.as_str()),
            });
        };
        pending.rec().route = Some(route.name.clone());
        // What the call may use, estimated once (tenants' limits, the
        // policy's cost gates).
        let estimate = tenancy::CallEstimate {
            input_tokens: (body.len() as u64).div_ceil(4),
            // The largest cap given: engines differ in which they honour.
            max_tokens: router_policy::tenant::output_cap([
                peek.max_tokens,
                peek.max_completion_tokens,
                peek.max_output_tokens,
            ]),
        };
        // Tenancy: who is calling, may they ask this, and what it draws on
        // their limits (boxed: rare, and its store calls' state stays out of
        // every request's future).
        if let Some(tenants) = &snapshot.policy.tenants {
            // A parked task's run is admitted under the tenant that parked
            // it (its name is in the run's mark), as the policy has it now.
            let caller = match &task_run {
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
            let admitted = Box::pin(tenancy::admit(
                &shared,
                &snapshot,
                tenants,
                caller,
                route,
                risk,
                estimate,
                header_deadline.or(route.deadline),
                pending.rec(),
            ))
            .await;
            if let Err(e) = admitted {
                return pending.reject(e);
            }
        }
        // A parked task's run: the operator's approval stands for the token.
        if route.requires_approval && task_run.is_none() {
            let given = seen.approval.as_ref().map(HeaderValue::as_bytes);
            let rec = pending.rec();
            let now = unix_seconds(rec.offered_at.0);
            let checked = approve(&shared, &snapshot, &route.name, &rec.request_id, given, now);
            if let Err(why) = checked {
                return pending.reject(ProxyError::ApprovalRequired {
                    route: route.name.clone(),
                    why,
                });
            }
        }
        let deadline = header_deadline.or(route.deadline);
        pending.rec().deadline_ms =
            deadline.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // Checked: a policy's deadline_ms may be anything up to u64::MAX.
        let deadline_at =
            deadline.map(|d| crate::clock::later(pending.t0, d, crate::clock::A_YEAR));

        // The policy's decision, on live measurements: which pools of the
        // chain pass their gates.
        let facts = RequestFacts {
            risk,
            model: model.as_deref(),
            path,
            // One definition of structured output: what is gated is what
            // is checked.
            structured_output: structured.is_some(),
            deadline_ms: pending.rec().deadline_ms,
            input_tokens: Some(estimate.input_tokens),
            max_tokens: estimate.max_tokens,
        };
        // Measured at the request's own start time: a few microseconds old,
        // and one clock reading instead of one per pool call.
        let mut decision = decide_on_route(&snapshot.policy, route, &facts, |_, name| {
            snapshot
                .pools
                .get(name)
                .map(|p| p.measurements_at(pending.t0))
        });
        let estimated_input_tokens = facts.input_tokens.unwrap_or(0);
        pending.rec().reason = decision.reason;
        // Safe mode: what a parking route keeps of the request. A parked
        // task's own run is never parked again (it answers `no_backend`,
        // and its task waits again).
        // The request's `Idempotency-Key` and fingerprint, computed once
        // (parking and idempotency both go by them). A parked task's run
        // carries its client's key to the backend but is no keyed request
        // of its own here: its task is what runs it once.
        let keyed = seen
            .idempotency_key
            .as_ref()
            .filter(|_| task_run.is_none())
            .and_then(|v| v.to_str().ok())
            .map(|k| {
                // The client's own path: the same key on another dialect's
                // path is another request.
                let fp = idempotency::fingerprint(
                    parts.method.as_str(),
                    parts.uri.path(),
                    &body,
                    &parts.headers,
                );
                (k.trim().to_string(), fp)
            });
        let park = match &route.park {
            Some(_) if task_run.is_some() => Some(crate::tasks::ParkIntent::run()),
            Some(_) => Some(crate::tasks::ParkIntent::new(
                &parts.headers,
                header_deadline,
                keyed.clone(),
            )),
            None => None,
        };
        match decision.refusal {
            Some(Refusal::BudgetExceeded) => {
                let detail = pending.rec().reason.clone();
                return pending.reject(ProxyError::BudgetExceeded { detail });
            }
            Some(_) => {
                let detail = pending.rec().reason.clone();
                if let Some(intent) = &park {
                    // As its client sent it (its own path and body).
                    let path_and_query = parts
                        .uri
                        .path_and_query()
                        .map_or(parts.uri.path(), |p| p.as_str());
                    let ctx =
                        intent.context(&parts.method, path_and_query, &parts.headers, &body, risk);
                    return Box::pin(super::parking::park(pending, route, &ctx, detail)).await;
                }
                return pending.reject(ProxyError::NoBackend { detail });
            }
            None => {}
        }
        // A keyed retry of a request parked earlier: its task's state, or
        // its answer (never a second run beside the task's).
        if let Some(ctx) = park.as_ref().filter(|c| c.keyed.is_some() && !c.run) {
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

        // Clients or pools of another dialect (`dialect`): the request is
        // written for each pool's dialect; a pool whose dialect cannot
        // carry it is passed over, saying why (none left: 400).
        // (The request's own bindings are updated, not new ones made: the
        // future keeps one of each across its waits.)
        let mut translation = None;
        if pending.dialect != Dialect::OpenAi
            || (snapshot.translating_pools && json_call && path == dialect::CHAT_PATH)
        {
            let client = dialect::ClientRequest {
                dialect: pending.dialect,
                body: body.clone(),
                path: parts.uri.path_and_query(),
                stream: streaming,
                created: unix_seconds(pending.rec().offered_at.0),
            };
            let policy = &snapshot.policy;
            let prepared = dialect::prepare(client, &decision.candidates, |k| {
                let name = route.chain.get(k).map_or("", String::as_str);
                (name.to_owned(), dialect::pool_dialect(policy.pool(name)))
            });
            let prepared = match prepared {
                Ok(p) => p,
                Err(e) => return pending.reject(e),
            };
            if !prepared.notes.is_empty() {
                let rec = pending.rec();
                rec.reason = format!("{}; {}", rec.reason, prepared.notes.join("; "));
            }
            // Both bodies are held until the request is done.
            if !reserved.grow_to(prepared.body.len() + body.len()) {
                return pending.reject(OVERLOADED);
            }
            body = prepared.body;
            decision.candidates = prepared.candidates;
            translation = Some(prepared.translation);
        }

        // A pool that may take it rewrites the model: the body must be one
        // serde_json can re-encode, else the request is refused (never sent
        // with the client's own model instead).
        let rewrites = json_call
            && decision.candidates.iter().any(|k| {
                route
                    .chain
                    .get(*k)
                    .and_then(|name| snapshot.policy.pool(name))
                    .and_then(|p| p.model.as_deref())
                    .is_some_and(|m| model.as_deref() != Some(m))
            });
        // A stream a candidate pool asks usage for: the body is parsed to
        // see whether the client asked itself, and to add the option.
        let usage_wanted = streaming
            && json_call
            && super::upstream_request::STREAM_USAGE_PATHS.contains(&path)
            && decision.candidates.iter().any(|k| {
                route
                    .chain
                    .get(*k)
                    .and_then(|name| snapshot.policy.pool(name))
                    .is_some_and(|p| p.stream_usage && p.provider.speaks_openai())
            });
        let parsed = if rewrites {
            match ParsedBody::parse(&body) {
                Ok(p) => Some(p),
                Err(e) => {
                    return pending.reject(ProxyError::InvalidRequest(format!(
                        "the request body cannot be re-encoded with the pool's model: {e}"
                    )))
                }
            }
        } else if usage_wanted {
            // Optional: a body serde_json cannot take goes as it came.
            ParsedBody::parse(&body).ok()
        } else {
            None
        };
        let client_asks_usage = parsed.as_ref().is_some_and(ParsedBody::asks_stream_usage);

        // Idempotency: join a request in flight, or replay a stored answer.
        let mut leader = None;
        if let Some((key, fp)) = keyed {
            let wait_until = deadline_at.unwrap_or_else(|| {
                crate::clock::later(
                    pending.t0,
                    shared.settings.queue.timeout,
                    crate::clock::A_YEAR,
                )
            });
            // A claim outlives a proxy that dies holding it by this much:
            // the request's own time bound, and a margin.
            let bound = deadline.unwrap_or(shared.settings.attempt_timeout);
            let begun = shared
                .idempotency
                .begin(KeyedRequest {
                    key: &key,
                    fp,
                    risk,
                    inflight_ttl: bound.saturating_add(CLAIM_MARGIN),
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

        // The scan said which of these are there: absent ones are not looked up.
        let mut headers = parts.headers;
        if seen.hop_by_hop {
            crate::hop_by_hop::strip_hop_by_hop(&mut headers);
        }
        // `Host` is replaced and `Content-Length` kept or replaced when the
        // upstream request is made (`upstream_request`).
        // The router's own headers (the approval token among them) never
        // reach a backend.
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
            let authority = parts.uri.authority()?;
            http::HeaderValue::from_str(authority.as_str()).ok()
        });
        let tls = shared.tls.is_some();
        forward::add_forwarded(&mut headers, &client_ip, host, &seen, tls);
        if let Some(id) = &pending.id_header {
            headers.insert(X_REQUEST_ID, id.clone());
            headers.insert(IDEMPOTENCY_KEY, id.clone());
        }
        let exchange = Exchange {
            otel: pending.rec().otel.clone(),
            operation: spans::operation_name(path),
            risk,
            structured,
            candidates: decision.candidates,
            estimated_input_tokens,
            output_cap: estimate.max_tokens,
            shared,
            client,
            snapshot: Arc::clone(&snapshot),
            method: parts.method,
            path_and_query: match &translation {
                // The client's query stays with it (a pool of Anthropic's
                // dialect gets its own path: `upstream_request`).
                Some(_) => http::uri::PathAndQuery::from_static(dialect::CHAT_PATH),
                None => parts
                    .uri
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
            },
            headers,
            body,
            parsed,
            client_asks_usage,
            tenant_key: pending.rec().tenant.as_deref().map(tenant_key),
            json_call,
            streaming,
            model,
            deadline_at,
            park,
            translation,
        };
        // With a key the client will retry: unless the route says
        // otherwise, the request runs in a task of its own, which a
        // client going away does not cancel, and its answer is kept.
        let keyed = leader.is_some();
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

/// Puts the request's path in normal form (see
/// `router_policy::request_path`), keeping its query; a path that cannot
/// be normalized is a 400.
fn normalize_path(req: &mut Request<Incoming>) -> Result<(), ProxyError> {
    let normal = match router_policy::request_path::normalize(req.uri().path()) {
        Ok(std::borrow::Cow::Borrowed(_)) => return Ok(()),
        Ok(std::borrow::Cow::Owned(p)) => p,
        Err(why) => return Err(ProxyError::InvalidRequest(why.to_string())),
    };
    let with_query = match req.uri().query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(
        http::uri::PathAndQuery::try_from(with_query)
            .map_err(|e| ProxyError::InvalidRequest(format!("request path: {e}")))?,
    );
    *req.uri_mut() = http::Uri::from_parts(parts)
        .map_err(|e| ProxyError::InvalidRequest(format!("request path: {e}")))?;
    Ok(())
}

/// How long a claim outlives its request's time bound.
const CLAIM_MARGIN: Duration = Duration::from_secs(10);

thread_local! {
    /// Keeps this thread's request ids ordered (v7: time, then a counter).
    static UUID_V7: uuid::ContextV7 = const { uuid::ContextV7::new() };
}

/// The request id and its header value: the client's `Idempotency-Key` or
/// `X-Request-Id`, else a new UUIDv7 stamped `now` (the request's arrival,
/// already read: no second clock reading).
fn request_id(
    seen: &RequestHeaders,
    now: SystemTime,
) -> Result<(String, Option<HeaderValue>), ProxyError> {
    match seen.idempotency_key.as_ref().or(seen.request_id.as_ref()) {
        None => {
            let since = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            // A per-thread v7 context: `Uuid::now_v7` would take one global
            // mutex, shared by every worker thread, on every request.
            let id = UUID_V7.with(|ctx| {
                let ts = uuid::Timestamp::from_unix(ctx, since.as_secs(), since.subsec_nanos());
                uuid::Uuid::new_v7(ts)
            });
            let mut buf = uuid::Uuid::encode_buffer();
            let text = id.hyphenated().encode_lower(&mut buf);
            // `to_owned`, not `to_string`: on a `&mut str` the latter goes
            // through the formatter.
            Ok(((*text).to_owned(), HeaderValue::from_str(text).ok()))
        }
        Some(v) => match v.to_str() {
            Ok(s) if !s.trim().is_empty() && s.len() <= 255 => {
                let id = s.trim();
                // The client's own value when it needs no trimming.
                let header = if id.len() == s.len() {
                    Some(v.clone())
                } else {
                    HeaderValue::from_str(id).ok()
                };
                Ok((id.to_string(), header))
            }
            _ => Err(ProxyError::InvalidRequest(
                "Idempotency-Key / X-Request-Id must be 1-255 visible ASCII characters".into(),
            )),
        },
    }
}

fn deadline_header(value: Option<&HeaderValue>) -> Result<Option<Duration>, ProxyError> {
    let Some(v) = value else {
        return Ok(None);
    };
    match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
        Some(ms) if (1..=MAX_DEADLINE_MS).contains(&ms) => Ok(Some(Duration::from_millis(ms))),
        _ => Err(ProxyError::InvalidRequest(format!(
            "X-Router-Deadline-Ms must be a whole number of milliseconds from 1 to {MAX_DEADLINE_MS}"
        ))),
    }
}

/// Reads the request body whole, within the size limit, the body timeout
/// and the proxy's cap on buffered request bytes; the reservation holds
/// the body's bytes under that cap until it is dropped (when the request
/// is done).
pub(super) async fn read_body(
    shared: &Shared,
    t0: Instant,
    content_length: Option<&HeaderValue>,
    body: Incoming,
) -> Result<(Bytes, Reservation), ProxyError> {
    let limit = shared.settings.max_body_bytes;
    let declared = content_length
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    let timeout = shared.settings.client_body_timeout;
    // From the request's arrival (already read), not a new clock reading.
    let until = crate::clock::later(t0, timeout, crate::clock::A_YEAR);
    let mut reserved = shared.buffered.reservation();
    if let Some(n) = declared.and_then(|n| usize::try_from(n).ok()) {
        if !reserved.grow_to(n) {
            // Answered at once; the body is read and dropped meanwhile, so
            // the client sees the answer, not a reset connection.
            tokio::spawn(discard(body, until));
            return Err(OVERLOADED);
        }
    }
    let read = forward::read_whole_admitting(body, limit, |total| reserved.grow_to(total));
    match tokio::time::timeout_at(until, read).await {
        Err(_) => Err(ProxyError::RequestTimeout(timeout)),
        Ok(Ok(body)) => Ok((body, reserved)),
        Ok(Err(ReadWholeError::TooLarge)) => Err(ProxyError::PayloadTooLarge { limit }),
        Ok(Err(ReadWholeError::OverBudget)) => Err(OVERLOADED),
        Ok(Err(ReadWholeError::Body(e))) => Err(ProxyError::InvalidRequest(format!(
            "could not read the request body: {e}"
        ))),
    }
}

const OVERLOADED: ProxyError = ProxyError::Overloaded {
    what: "buffered request bytes",
};

/// Reads `body` to its end (or until `until`) and keeps none of it.
async fn discard(body: Incoming, until: Instant) {
    use http_body_util::BodyExt;
    let mut body = std::pin::pin!(body);
    let _ = tokio::time::timeout_at(until, async {
        while let Some(Ok(_)) = body.as_mut().frame().await {}
    })
    .await;
}

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

/// `at` as whole seconds since the Unix epoch (0 before it).
/// A tenant's name as a queue-fairness key (FNV-1a).
fn tenant_key(name: &str) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(name.as_bytes());
    h.finish()
}

pub(super) fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(headers: &[(&str, &str)]) -> RequestHeaders {
        let mut map = http::HeaderMap::new();
        for (k, v) in headers {
            if let (Ok(k), Ok(v)) = (
                http::header::HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                map.append(k, v);
            }
        }
        RequestHeaders::scan(&map)
    }

    #[test]
    fn the_request_id_is_the_clients_key_trimmed_else_a_new_uuid_v7() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (id, header) = request_id(&scanned(&[("idempotency-key", " k-1 ")]), now)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(id, "k-1");
        assert_eq!(
            header.as_ref().map(HeaderValue::as_bytes),
            Some(&b"k-1"[..])
        );
        // The key wins over X-Request-Id.
        let (id, _) = request_id(
            &scanned(&[("x-request-id", "r-1"), ("idempotency-key", "k-2")]),
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(id, "k-2");
        let (a, _) = request_id(&scanned(&[]), now).unwrap_or_else(|e| panic!("{e}"));
        let (b, _) = request_id(&scanned(&[]), now).unwrap_or_else(|e| panic!("{e}"));
        let ua = uuid::Uuid::parse_str(&a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ua.get_version_num(), 7);
        assert!(a < b, "ordered on one thread: {a} {b}");
    }

    #[test]
    fn a_blank_or_long_request_id_is_refused() {
        let now = SystemTime::UNIX_EPOCH;
        assert!(request_id(&scanned(&[("x-request-id", "  ")]), now).is_err());
        let long = "x".repeat(256);
        assert!(request_id(&scanned(&[("x-request-id", long.as_str())]), now).is_err());
    }

    #[test]
    fn the_deadline_header_is_whole_milliseconds_in_range() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(deadline_header(None), Ok(None));
        assert_eq!(
            deadline_header(Some(&v(" 1500 "))),
            Ok(Some(Duration::from_millis(1500)))
        );
        for bad in ["0", "-1", "1.5", "x", "86400001"] {
            assert!(deadline_header(Some(&v(bad))).is_err(), "{bad}");
        }
    }
}
