//! The request path: read, route, walk the chain inside the deadline,
//! answer exactly once, log.
//!
//! ```text
//! request ─▶ admin? ─▶ request id ─▶ body (limit, timeout) ─▶ model (JSON paths)
//!   ─▶ route (first match) ─▶ deadline (header, else route default)
//!   ─▶ Idempotency-Key: join the request in flight / replay a stored answer
//!   ─▶ for each pool of the chain:
//!        unavailable (no endpoints, drained, circuits open)  → skip
//!        plan_attempt (deadline share, p95, queue wait)       → skip, or try with a timeout
//!        lease (queue) → forward → answer head (JSON answers: whole body)
//!        retryable failure and fallback allowed               → next pool, same request id
//!   ─▶ answer (stream or buffered) ─▶ route log + metrics
//! ```
//!
//! Every request ends in exactly one of three ways, each writing one route
//! decision line and one `router_requests_total` sample: the router answers
//! it itself ([`Pending::reject`]), a backend's answer is passed on (a
//! buffered answer at once; a stream by [`Finisher`] when it ends), or the
//! client goes away first ([`Pending`]'s `Drop`).
//!
//! An abandoned attempt (timed out, or failed over) is cancelled by
//! dropping its future or body, which closes its upstream connection, so
//! the backend can stop generating.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use router_json_peek::RequestPeek;
use router_policy::deadline::{plan_attempt, AttemptPlan, Budget};
use router_policy::decide::{decide_on_route, Refusal, RequestFacts};
use router_policy::{RetryOn, Risk, Route};
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use crate::config::Snapshot;
use crate::error::ProxyError;
use crate::forward::{self, BodyEnd, Completion, ReadWholeError, TrackedBody};
use crate::idempotency::{self, Claim, FollowResult, LeaderGuard, StoredAnswer};
use crate::pool::{Lease, PoolRuntime, Sample, Shed};
use crate::request_headers::RequestHeaders;
use crate::route_log::{AttemptRecord, RouteRecord, Timestamp};
use crate::telemetry;
use crate::upstream::UpstreamBody;
use crate::Shared;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::KeyValue;

/// The body type of every response the proxy sends: a whole body (the
/// router's own answers, buffered backend answers) or a backend stream
/// passed on. An enum rather than a boxed body: no allocation and no
/// dynamic call per answer.
pub type ProxyBody = Either<Full<Bytes>, TrackedBody>;

/// Paths whose JSON body's `model` selects the route.
const OPENAI_JSON_PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

/// JSON answers up to this size are read whole before they are passed on
/// (so a malformed one can fail over and a complete one can be replayed).
const BUFFERED_ANSWER_LIMIT: usize = 16 * 1024 * 1024;

/// The longest deadline a client may ask for.
const MAX_DEADLINE_MS: u64 = 24 * 3600 * 1000;

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const X_ROUTER_DEADLINE_MS: HeaderName = HeaderName::from_static("x-router-deadline-ms");
const X_ROUTER_ROUTE: HeaderName = HeaderName::from_static("x-router-route");
const X_ROUTER_ATTEMPTS: HeaderName = HeaderName::from_static("x-router-attempts");
const X_ROUTER_CONFIG_VERSION: HeaderName = HeaderName::from_static("x-router-config-version");
const X_ROUTER_REPLAYED: HeaderName = HeaderName::from_static("x-router-replayed");

/// A body the router made itself.
pub fn full(body: Response<Bytes>) -> Response<ProxyBody> {
    body.map(|b| Either::Left(Full::new(b)))
}

/// Handles one proxied request from a client at `client_ip` (see
/// [`forward::client_ip_header`]).
///
/// Not an `async fn`: an `async fn` future keeps its arguments twice (as
/// given, and as the body's locals), and every move of the future copies
/// both; an `async move` block uses them in place.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub fn handle(
    shared: Arc<Shared>,
    client_ip: HeaderValue,
    req: Request<Incoming>,
) -> impl std::future::Future<Output = Response<ProxyBody>> {
    async move {
        let path = req.uri().path();
        if path.starts_with("/_custom_router/") || path == "/metrics" {
            // Boxed: the admin future is large and rare; unboxed, it would set
            // the size of every request's future.
            return full(Box::pin(crate::admin::handle(&shared, req)).await);
        }
        let snapshot = shared.config.load();
        let mut pending = Pending::new(Arc::clone(&shared), &req, &snapshot);
        if telemetry::enabled() {
            // The server span, a child of the client's `traceparent` if any.
            let parent = telemetry::extract(req.headers());
            let tracer = telemetry::tracer();
            let span = tracer
                .span_builder(format!("{} {}", req.method(), req.uri().path()))
                .with_kind(SpanKind::Server)
                .start_with_context(&tracer, &parent);
            let cx = parent.with_span(span);
            pending.rec().trace_id = telemetry::trace_id(&cx);
            pending.rec().otel = Some(cx);
        }

        let seen = RequestHeaders::scan(req.headers());
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
        pending.rec().risk = Some(risk.as_str());
        let (parts, body) = req.into_parts();
        let body = match read_body(&shared, pending.t0, seen.content_length.as_ref(), body).await {
            Ok(b) => b,
            Err(e) => return pending.reject(e),
        };
        let path = parts.uri.path();
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
            Some("json_object" | "json_schema") => {
                serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| router_policy::structured::expected(&v))
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
        let approval = seen.approval.as_ref().map(HeaderValue::as_bytes);
        if route.requires_approval && !approved(&snapshot, approval) {
            return pending.reject(ProxyError::ApprovalRequired(route.name.clone()));
        }
        let deadline = header_deadline.or(route.deadline);
        pending.rec().deadline_ms =
            deadline.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let deadline_at = deadline.map(|d| pending.t0 + d);

        // The policy's decision, on live measurements: which pools of the
        // chain pass their gates.
        let facts = RequestFacts {
            risk,
            model: model.as_deref(),
            path,
            structured_output: structured.is_some()
                || peek
                    .response_format
                    .as_ref()
                    .is_some_and(|r| r.kind != "text"),
            deadline_ms: pending.rec().deadline_ms,
            input_tokens: Some((body.len() as u64).div_ceil(4)),
            max_tokens: peek
                .max_tokens
                .or(peek.max_completion_tokens)
                .or(peek.max_output_tokens),
        };
        // Measured at the request's own start time: a few microseconds old,
        // and one clock reading instead of one per pool call.
        let decision = decide_on_route(&snapshot.policy, route, &facts, |_, name| {
            snapshot
                .pools
                .get(name)
                .map(|p| p.measurements_at(pending.t0))
        });
        let estimated_input_tokens = facts.input_tokens.unwrap_or(0);
        pending.rec().reason = decision.reason;
        match decision.refusal {
            Some(Refusal::BudgetExceeded) => {
                let detail = pending.rec().reason.clone();
                return pending.reject(ProxyError::BudgetExceeded { detail });
            }
            Some(_) => {
                let detail = pending.rec().reason.clone();
                return pending.reject(ProxyError::NoBackend { detail });
            }
            None => {}
        }

        // Idempotency: join a request in flight, or replay a stored answer.
        let key = seen
            .idempotency_key
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(|k| k.trim().to_string());
        let mut leader = None;
        if let Some(key) = key {
            let fp = idempotency::fingerprint(parts.method.as_str(), path, &body);
            let wait_until =
                deadline_at.unwrap_or_else(|| pending.t0 + shared.settings.queue.timeout);
            let mut claims = 0;
            loop {
                claims += 1;
                match shared.idempotency.claim(&key, fp, streaming) {
                    Claim::Leader(g) => {
                        leader = Some(g);
                        break;
                    }
                    Claim::Untracked => break,
                    Claim::Replay(stored) => return pending.replay(&stored),
                    Claim::Duplicate => return pending.reject(ProxyError::DuplicateRequest(key)),
                    Claim::Mismatch => return pending.reject(ProxyError::IdempotencyMismatch(key)),
                    Claim::Follower(f) => match tokio::time::timeout_at(wait_until, f.wait()).await
                    {
                        Ok(FollowResult::Replay(stored)) => return pending.replay(&stored),
                        Ok(FollowResult::Duplicate) => {
                            return pending.reject(ProxyError::DuplicateRequest(key))
                        }
                        // The first request ended without an answer to share:
                        // route this one (a bounded number of times).
                        Ok(FollowResult::LeaderGone) if claims < 3 => continue,
                        Ok(FollowResult::LeaderGone) => break,
                        Err(_) => {
                            return pending.reject(ProxyError::DeadlineExhausted {
                                detail: "waited for the first request with this Idempotency-Key"
                                    .into(),
                            })
                        }
                    },
                }
            }
        }

        // The scan said which of these are there: absent ones are not looked up.
        let mut headers = parts.headers;
        if seen.hop_by_hop {
            forward::strip_hop_by_hop(&mut headers);
        }
        // `Host` is replaced and `Content-Length` kept or replaced when the
        // upstream request is made (`upstream_request`).
        if seen.deadline_ms.is_some() {
            headers.remove(X_ROUTER_DEADLINE_MS);
        }
        forward::add_forwarded(&mut headers, &client_ip, seen.host.clone(), &seen);
        if let Some(id) = &pending.id_header {
            headers.insert(X_REQUEST_ID, id.clone());
            headers.insert(IDEMPOTENCY_KEY, id.clone());
        }
        let exchange = Exchange {
            otel: pending.rec().otel.clone(),
            operation: operation_name(path),
            risk,
            structured,
            candidates: decision.candidates,
            estimated_input_tokens,
            shared,
            snapshot: Arc::clone(&snapshot),
            method: parts.method,
            path_and_query: parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
            headers,
            body,
            json_call,
            streaming,
            model,
            deadline_at,
        };
        exchange.walk_chain(pending, route, leader).await
    }
}

/// Everything an attempt needs to build its upstream request.
struct Exchange {
    /// The server span's context (tracing on).
    otel: Option<opentelemetry::Context>,
    /// `gen_ai.operation.name` of the call.
    operation: &'static str,
    risk: Risk,
    structured: Option<router_policy::structured::Expected>,
    /// Indices into the route's chain of the pools that may take it.
    candidates: Vec<usize>,
    estimated_input_tokens: u64,
    shared: Arc<Shared>,
    snapshot: Arc<Snapshot>,
    method: Method,
    path_and_query: http::uri::PathAndQuery,
    headers: HeaderMap,
    body: Bytes,
    json_call: bool,
    streaming: bool,
    model: Option<Arc<str>>,
    deadline_at: Option<Instant>,
}

/// How one attempt ended.
enum AttemptEnd {
    /// A streamed answer to pass on.
    Stream {
        resp: Response<UpstreamBody>,
        lease: Lease,
        started: Instant,
        record: AttemptRecord,
    },
    /// A complete answer.
    Whole {
        head: http::response::Parts,
        body: Bytes,
        record: AttemptRecord,
    },
    /// Failed; `held` is the backend's failure answer, if it gave one.
    Failed {
        retry: RetryOn,
        record: AttemptRecord,
        held: Option<Held>,
    },
    /// The pool shed the request before it was sent.
    Shed(Shed),
}

/// A failure answer kept in case no later pool answers.
enum Held {
    Stream(Response<UpstreamBody>, Lease, Instant),
    Whole(http::response::Parts, Bytes),
}

impl Exchange {
    /// Tries the decision's pools in order. (An `async move` block, like
    /// [`handle`], so that `self` and `pending` are kept once.)
    #[allow(clippy::manual_async_fn)] // on purpose: see `handle`
    fn walk_chain<'r>(
        mut self,
        mut pending: Pending,
        route: &'r Route,
        mut leader: Option<LeaderGuard>,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> + 'r {
        async move {
            // The decision's candidates (chain positions) and their pools,
            // looked up as they are needed: no list is built per request.
            let candidates = &self.candidates;
            let pools = &self.snapshot.pools;
            let pool_at = |k: &usize| route.chain.get(*k).and_then(|name| pools.get(name));
            // The decision's own skips are already in the reason.
            let mut decided = std::mem::take(&mut pending.rec().reason);
            let mut notes: Vec<String> = Vec::new();
            let mut held: Option<(Held, AttemptRecord)> = None;
            let mut last_error: Option<ProxyError> = None;
            let mut time_skips = 0;
            let mut attempted = 0usize;

            for (i, k) in candidates.iter().enumerate() {
                let Some(pool) = pool_at(k) else {
                    continue;
                };
                let later = || candidates[i + 1..].iter().filter_map(pool_at);
                if attempted > 0 && !route.fallback {
                    break;
                }
                let name = pool.name();
                let shared_name = pool.shared_name();
                let now = Instant::now();
                let outlook = match pool.ready_outlook_at(now) {
                    Ok(o) => o,
                    Err(unavailable) => {
                        notes.push(format!("{name}: {}", unavailable.as_str()));
                        continue;
                    }
                };
                // The outlook of the next pool that could take the request, if
                // this one fails (looked up lazily: only the first available
                // one matters).
                let next = if route.fallback {
                    later().find_map(|p| p.ready_outlook_at(now).ok())
                } else {
                    None
                };
                let policy_pool = self.snapshot.policy.pool(name);
                let budget = Budget {
                    remaining: self.deadline_at.map(|d| d.saturating_duration_since(now)),
                    attempt_timeout: policy_pool
                        .and_then(|p| p.attempt_timeout)
                        .or(route.attempt_timeout),
                    next_p95: next.and_then(|o| o.p95),
                    last_candidate: next.is_none(),
                };
                let timeout = match plan_attempt(budget, outlook) {
                    AttemptPlan::Skip(why) => {
                        time_skips += 1;
                        notes.push(format!("{name}: skipped, {why}"));
                        continue;
                    }
                    AttemptPlan::Try { timeout } => timeout,
                };
                // A new attempt: the failure answer kept so far is dropped
                // (its upstream connection closes).
                held = None;
                attempted += 1;
                if attempted == 1 {
                    pending.rec().first_route = Some(Arc::clone(shared_name));
                }
                let attempt_deadline = timeout.map(|t| now + t);
                // The client's headers go to the last attempt there can be as
                // they are; earlier ones send a copy.
                let last_chance = !route.fallback || later().next().is_none();
                let headers = if last_chance {
                    std::mem::take(&mut self.headers)
                } else {
                    self.headers.clone()
                };
                match self
                    .attempt(pool, now, attempt_deadline, timeout, headers)
                    .await
                {
                    AttemptEnd::Stream {
                        resp,
                        lease,
                        started,
                        record,
                    } => {
                        pending.note_attempt(record, attempted);
                        pending.rec().reason = reason(std::mem::take(&mut decided), name, &notes);
                        if let Some(g) = leader.take() {
                            g.streamed();
                        }
                        return pending.commit_stream(
                            resp,
                            lease,
                            started,
                            self.deadline_at,
                            attempted,
                        );
                    }
                    AttemptEnd::Whole { head, body, record } => {
                        pending.note_attempt(record, attempted);
                        pending.rec().reason = reason(std::mem::take(&mut decided), name, &notes);
                        let route = pool.route_header().cloned();
                        return pending.commit_whole(
                            head,
                            body,
                            leader.take(),
                            shared_name,
                            route,
                            attempted,
                        );
                    }
                    AttemptEnd::Failed {
                        retry,
                        record,
                        held: answer,
                    } => {
                        let outcome = record.outcome;
                        notes.push(format!("{name}: {outcome}"));
                        pending.note_attempt(record.clone(), attempted);
                        // A request with side effects that may have reached the
                        // backend is never sent again: only refusals before
                        // processing (refused connections, 429) move it on.
                        let reached = !(outcome == "connect_error" || retry == RetryOn::Status429);
                        let retryable =
                            route.retries_on(retry) && !(self.risk.has_side_effects() && reached);
                        if let (Some(cx), true) = (&self.otel, retryable) {
                            cx.span().add_event(
                                "fallback",
                                vec![
                                    KeyValue::new("router.pool", name.to_string()),
                                    KeyValue::new("router.outcome", outcome),
                                ],
                            );
                        }
                        match answer {
                            Some(h) => held = Some((h, record)),
                            None => {
                                last_error = Some(match retry {
                                    RetryOn::Timeout => ProxyError::DeadlineExhausted {
                                        detail: format!(
                                            "{name}: no answer within {} ms",
                                            record.latency_ms.round()
                                        ),
                                    },
                                    _ => ProxyError::Upstream {
                                        endpoint: record.endpoint.to_string(),
                                        detail: outcome.replace('_', " "),
                                    },
                                })
                            }
                        }
                        if !retryable {
                            break;
                        }
                    }
                    AttemptEnd::Shed(shed) => {
                        let err = match shed {
                            Shed::QueueFull => ProxyError::QueueFull {
                                pool: name.to_string(),
                            },
                            Shed::QueueTimeout => ProxyError::QueueTimeout {
                                pool: name.to_string(),
                                waited_ms: millis(now.elapsed()),
                            },
                            Shed::NoBackend => ProxyError::NoBackend {
                                detail: format!("pool {name:?} has no endpoints"),
                            },
                            Shed::AttemptTimeout => ProxyError::DeadlineExhausted {
                                detail: format!(
                                    "{name}: no answer possible in the time left after queueing"
                                ),
                            },
                        };
                        notes.push(format!("{name}: {}", err.kind()));
                        pending.rec().queue_wait_ms = ms(now.elapsed());
                        pending.pool = Some(Arc::clone(shared_name));
                        last_error = Some(err);
                        if !route.fallback {
                            break;
                        }
                    }
                }
            }

            // No pool answered. Never answer after the deadline with anything
            // but deadline_exhausted; otherwise pass on the last backend
            // failure answer, or say why nothing was tried.
            let past_deadline = self.deadline_at.is_some_and(|d| Instant::now() >= d);
            pending.rec().reason = format!("{decided}; then {}", notes.join("; "));
            if past_deadline {
                return pending.reject(ProxyError::DeadlineExhausted {
                    detail: notes.join("; "),
                });
            }
            if let Some((h, record)) = held {
                let name = record.pool.clone();
                return match h {
                    Held::Stream(resp, lease, started) => {
                        pending.commit_stream(resp, lease, started, self.deadline_at, attempted)
                    }
                    Held::Whole(head, body) => {
                        let pools = &self.snapshot.pools;
                        let route = pools.get(&*name).and_then(|p| p.route_header().cloned());
                        pending.commit_whole(head, body, None, &name, route, attempted)
                    }
                };
            }
            let err = match last_error {
                Some(e) => e,
                None if time_skips > 0 => ProxyError::DeadlineExhausted {
                    detail: notes.join("; "),
                },
                None => ProxyError::NoBackend {
                    detail: format!("route {:?}: {}", route.name, notes.join("; ")),
                },
            };
            pending.reject(err)
        }
    }

    /// One attempt on one pool, bounded by `deadline` (queue wait included).
    ///
    /// With tracing off this is [`Exchange::attempt_inner`] itself; with
    /// it on, that wrapped in a client span, boxed (its span bookkeeping
    /// would otherwise make every request's future larger).
    fn attempt<'a>(
        &'a self,
        pool: &'a Arc<PoolRuntime>,
        now: Instant,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
        headers: HeaderMap,
    ) -> impl std::future::Future<Output = AttemptEnd> + 'a {
        use futures_util::future::Either;
        match &self.otel {
            None => Either::Left(self.attempt_inner(pool, now, deadline, timeout, headers, None)),
            Some(parent) => Either::Right(Box::pin(
                self.attempt_traced(parent, pool, now, deadline, timeout, headers),
            )),
        }
    }

    /// [`Exchange::attempt`] with tracing on.
    async fn attempt_traced(
        &self,
        parent: &opentelemetry::Context,
        pool: &Arc<PoolRuntime>,
        now: Instant,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
        headers: HeaderMap,
    ) -> AttemptEnd {
        // A client span per attempt; its context goes upstream as `traceparent`.
        let policy_pool = self.snapshot.policy.pool(pool.name());
        let model = policy_pool
            .and_then(|p| p.model.clone())
            .or_else(|| self.model.as_deref().map(str::to_string))
            .unwrap_or_default();
        let tracer = telemetry::tracer();
        let span = tracer
            .span_builder(format!("{} {model}", self.operation))
            .with_kind(SpanKind::Client)
            .start_with_context(&tracer, parent);
        let cx = parent.with_span(span);
        let end = self
            .attempt_inner(pool, now, deadline, timeout, headers, Some(&cx))
            .await;
        let span = cx.span();
        span.set_attribute(KeyValue::new("gen_ai.operation.name", self.operation));
        span.set_attribute(KeyValue::new("gen_ai.request.model", model));
        if let Some(p) = policy_pool {
            span.set_attribute(KeyValue::new(
                "gen_ai.provider.name",
                provider_name(p.provider),
            ));
        }
        span.set_attribute(KeyValue::new("router.pool", pool.name().to_string()));
        if let Some(t) = timeout {
            span.set_attribute(KeyValue::new("router.attempt_timeout_ms", millis(t) as i64));
        }
        let record = match &end {
            AttemptEnd::Stream { record, .. }
            | AttemptEnd::Whole { record, .. }
            | AttemptEnd::Failed { record, .. } => Some(record),
            AttemptEnd::Shed(shed) => {
                span.set_attribute(KeyValue::new("router.outcome", format!("{shed:?}")));
                None
            }
        };
        if let Some(r) = record {
            span.set_attribute(KeyValue::new("server.address", r.endpoint.clone()));
            span.set_attribute(KeyValue::new("router.outcome", r.outcome));
            span.set_attribute(KeyValue::new("router.queue_wait_ms", r.queue_wait_ms));
            if let Some(s) = r.status {
                span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
            }
            if let Some(m) = &r.response_model {
                span.set_attribute(KeyValue::new("gen_ai.response.model", m.clone()));
            }
            if let Some(n) = r.tokens_in {
                span.set_attribute(KeyValue::new("gen_ai.usage.input_tokens", n as i64));
            }
            if let Some(n) = r.tokens_out {
                span.set_attribute(KeyValue::new("gen_ai.usage.output_tokens", n as i64));
            }
            if r.outcome != "ok" {
                span.set_status(Status::error(r.outcome));
                // The failure may have opened the endpoint's circuit.
                let open = pool.status().endpoints.iter().any(|e| {
                    *e.addr == *r.endpoint && e.circuit == crate::pool::CircuitState::Open
                });
                if open {
                    span.add_event(
                        "circuit_open",
                        vec![KeyValue::new("server.address", r.endpoint.clone())],
                    );
                }
            }
        }
        span.end();
        end
    }

    /// One attempt, untraced. (An `async move` block, like [`handle`], so
    /// that its arguments are kept once.)
    #[allow(clippy::manual_async_fn)] // on purpose: see `handle`
    fn attempt_inner<'a>(
        &'a self,
        pool: &'a Arc<PoolRuntime>,
        now: Instant,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
        headers: HeaderMap,
        otel: Option<&'a opentelemetry::Context>,
    ) -> impl std::future::Future<Output = AttemptEnd> + 'a {
        async move {
            let lease = match pool.acquire_at(deadline, now).await {
                Ok(l) => l,
                Err(shed) => return AttemptEnd::Shed(shed),
            };
            // Queued: the pool may have learned meanwhile that it cannot answer
            // in what is left (its first answers came back). Then do not start
            // a generation that would be cut: give the slot back at once.
            if let (Some(d), false) = (deadline, lease.queue_wait().is_zero()) {
                let left = d.saturating_duration_since(Instant::now());
                if pool.outlook().p95.is_some_and(|p95| p95 >= left) {
                    return AttemptEnd::Shed(Shed::AttemptTimeout);
                }
            }
            self.shared
                .metrics
                .queue_wait(pool.name(), lease.queue_wait().as_secs_f64());
            // Sent now: the walk's clock reading when there was no wait.
            let started = if lease.queue_wait().is_zero() {
                now
            } else {
                Instant::now()
            };
            let mut record = AttemptRecord {
                pool: Arc::clone(pool.shared_name()),
                endpoint: Arc::clone(lease.addr()),
                outcome: "ok",
                status: None,
                latency_ms: 0.0,
                queue_wait_ms: ms(lease.queue_wait()),
                timeout_ms: timeout.map(millis),
                ..AttemptRecord::default()
            };
            let upstream = match self.upstream_request(&lease, pool.name(), headers) {
                Ok(mut r) => {
                    if let Some(cx) = otel {
                        telemetry::inject(cx, r.headers_mut());
                    }
                    r
                }
                Err(e) => {
                    record.outcome = "invalid_request";
                    return AttemptEnd::Failed {
                        retry: RetryOn::ConnectError,
                        record: AttemptRecord {
                            endpoint: e.into(),
                            ..record
                        },
                        held: None,
                    };
                }
            };
            // On a timeout, dropping the request future closes the upstream
            // connection: the backend can stop generating.
            let client = crate::worker_client().unwrap_or_else(|| self.shared.client.clone());
            let sent = client.send(lease.target().map(|t| t.key()), upstream);
            // The answer's head, in a block of its own: what it binds is not
            // kept (in the future's state) while the body is read.
            let (head, incoming) = {
                let resp = match within(deadline, sent).await {
                    None => return timed_out(&lease, record, started),
                    Some(Ok(r)) => r,
                    Some(Err(e)) => {
                        let waited = started.elapsed();
                        lease.observe(Sample::Failure(waited));
                        record.outcome = if e.is_connect() {
                            "connect_error"
                        } else {
                            "upstream_error"
                        };
                        record.latency_ms = ms(waited);
                        return AttemptEnd::Failed {
                            retry: RetryOn::ConnectError,
                            record,
                            held: None,
                        };
                    }
                };
                let status = resp.status();
                record.status = Some(status.as_u16());
                let failure = if status == StatusCode::TOO_MANY_REQUESTS {
                    Some((RetryOn::Status429, "status_429"))
                } else if status.is_server_error() {
                    Some((RetryOn::Status5xx, "status_5xx"))
                } else {
                    None
                };
                if let Some((retry, outcome)) = failure {
                    let waited = started.elapsed();
                    if retry == RetryOn::Status429 {
                        let retry_after = resp
                            .headers()
                            .get(header::RETRY_AFTER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.trim().parse::<u64>().ok())
                            .map(Duration::from_secs);
                        lease.observe(Sample::RateLimited(waited, retry_after));
                    } else {
                        lease.observe(Sample::Failure(waited));
                    }
                    record.outcome = outcome;
                    record.latency_ms = ms(waited);
                    return AttemptEnd::Failed {
                        retry,
                        record,
                        held: Some(Held::Stream(resp, lease, started)),
                    };
                }
                if !self.should_buffer(&resp) {
                    return AttemptEnd::Stream {
                        resp,
                        lease,
                        started,
                        record,
                    };
                }
                // A JSON answer: read it whole inside the attempt's time.
                resp.into_parts()
            };
            let read = forward::read_whole(incoming, BUFFERED_ANSWER_LIMIT);
            let Some(body) = within(deadline, read).await else {
                return timed_out(&lease, record, started);
            };
            let answered = Instant::now();
            let waited = answered.saturating_duration_since(started);
            record.latency_ms = ms(waited);
            let body = match body {
                Ok(b) => b,
                Err(_) => {
                    lease.observe(Sample::Failure(waited));
                    record.outcome = "upstream_error";
                    return AttemptEnd::Failed {
                        retry: RetryOn::ConnectError,
                        record,
                        held: None,
                    };
                }
            };
            let mut answer = router_json_peek::peek_answer(&body);
            let structured_ok = match (&self.structured, head.status.is_success()) {
                (Some(expected), true) => router_policy::structured::check(&body, expected),
                _ => Ok(()),
            };
            if head.status.is_success() && (answer.is_err() || structured_ok.is_err()) {
                lease.observe(Sample::Failure(waited));
                if let Err(why) = &structured_ok {
                    // This pool cannot be trusted with structured output for a while.
                    pool.mark_structured_degraded(
                        Instant::now() + self.snapshot.policy.structured_degrade,
                    );
                    tracing::info!(pool = pool.name(), %why, "malformed structured output; pool degraded for structured requests");
                }
                record.outcome = "malformed_json";
                return AttemptEnd::Failed {
                    retry: RetryOn::MalformedJson,
                    record,
                    held: Some(Held::Whole(head, body)),
                };
            }
            if let Ok(a) = &mut answer {
                record.response_model = a.model.take();
            }
            if let Ok(Some(usage)) = answer.map(|a| a.usage) {
                record.tokens_in = usage.prompt_tokens.or(usage.input_tokens);
                record.tokens_out = usage.completion_tokens.or(usage.output_tokens);
                if let Some(p) = self.snapshot.policy.pool(pool.name()) {
                    record.cost_usd = Some(p.price.cost(
                        record.tokens_in.unwrap_or(self.estimated_input_tokens),
                        record.tokens_out.unwrap_or(0),
                    ));
                }
            }
            lease.finish(Sample::Success(waited), answered);
            AttemptEnd::Whole { head, body, record }
        }
    }

    /// Non-streaming OpenAI-style calls with a JSON answer of known,
    /// modest size are read whole.
    fn should_buffer(&self, resp: &Response<UpstreamBody>) -> bool {
        if !self.json_call || self.streaming {
            return false;
        }
        // One pass over the answer's few headers instead of two lookups
        // (each header by its first value, as a lookup would give).
        let (mut content_type, mut length) = (None, None);
        for (name, value) in resp.headers() {
            if name == header::CONTENT_TYPE {
                content_type = content_type.or(Some(value));
            } else if name == header::CONTENT_LENGTH {
                length = length.or(Some(value));
            }
        }
        let json = content_type
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("json"));
        let small = length
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .is_none_or(|n| n <= BUFFERED_ANSWER_LIMIT);
        json && small
    }

    fn upstream_request(
        &self,
        lease: &Lease,
        pool: &str,
        headers: HeaderMap,
    ) -> Result<Request<Full<Bytes>>, String> {
        let uri = match lease.target() {
            Some(t) => t.uri(lease.endpoint(), &self.path_and_query),
            None => forward::upstream_uri(lease.endpoint(), self.path_and_query.as_str()),
        }
        .map_err(|e| format!("bad upstream URI: {e}"))?;
        let pool_model = self
            .snapshot
            .policy
            .pool(pool)
            .and_then(|p| p.model.as_deref());
        let rewritten = match pool_model {
            Some(m) if self.json_call && self.model.as_deref() != Some(m) => {
                rewrite_model(&self.body, m)
            }
            _ => None,
        };
        let mut headers = headers;
        // The client's `Content-Length` is right for its own body (hyper
        // read the body by it); a rewritten body gets its own.
        let body = match rewritten {
            Some(b) => {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(b.len()));
                b
            }
            None => self.body.clone(),
        };
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        if let Some(key) = self.snapshot.secrets.api_keys.get(pool) {
            // The pool's own credential replaces whatever the client sent.
            req.headers_mut().insert(header::AUTHORIZATION, key.clone());
        }
        match lease.target() {
            // The value a client of the backend would send.
            Some(t) => {
                req.headers_mut().insert(header::HOST, t.host().clone());
            }
            // hyper's client adds none: the URI's authority is the host.
            None => {
                req.headers_mut().remove(header::HOST);
            }
        }
        Ok(req)
    }
}

/// Runs `work` until `deadline` (if any); `None` when the deadline came first.
///
/// A plain function returning a combinator, not an `async fn`: an `async fn`
/// would keep `work` as an argument *and* inside the timeout it awaits,
/// doubling the size of every future that awaits this one.
fn within<F: std::future::Future>(
    deadline: Option<Instant>,
    work: F,
) -> impl std::future::Future<Output = Option<F::Output>> {
    use futures_util::future::{Either, FutureExt};
    match deadline {
        Some(d) => Either::Left(tokio::time::timeout_at(d, work).map(Result::ok)),
        None => Either::Right(work.map(Some)),
    }
}

/// The attempt ran out of time: a slow sample, and a retryable failure.
fn timed_out(lease: &Lease, mut record: AttemptRecord, started: Instant) -> AttemptEnd {
    let waited = started.elapsed();
    lease.observe(Sample::Timeout(waited));
    record.outcome = "timeout";
    record.latency_ms = ms(waited);
    AttemptEnd::Failed {
        retry: RetryOn::Timeout,
        record,
        held: None,
    }
}

/// The log line's reason for an answered request: the decision's own,
/// then what happened on the way (the decision's text moved, not copied,
/// when nothing did).
fn reason(decided: String, pool: &str, notes: &[String]) -> String {
    if notes.is_empty() {
        decided
    } else {
        format!("{decided}; then {}; answered by {pool}", notes.join("; "))
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn set_router_headers<B>(
    resp: &mut Response<B>,
    record: &RouteRecord,
    id: Option<&HeaderValue>,
    route: Option<HeaderValue>,
    version: Option<&HeaderValue>,
    attempts: usize,
) {
    let h = resp.headers_mut();
    match id {
        Some(v) => {
            h.insert(X_REQUEST_ID, v.clone());
        }
        None => {
            if let Ok(v) = HeaderValue::from_str(&record.request_id) {
                h.insert(X_REQUEST_ID, v);
            }
        }
    }
    if let Some(v) = route {
        h.insert(X_ROUTER_ROUTE, v);
    }
    h.insert(X_ROUTER_ATTEMPTS, count_header(attempts));
    if let Some(v) = version {
        h.insert(X_ROUTER_CONFIG_VERSION, v.clone());
    }
}

/// A header value for a small count, without an allocation below 10.
fn count_header(n: usize) -> HeaderValue {
    const SMALL: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match SMALL.get(n) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(n),
    }
}

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

async fn read_body(
    shared: &Shared,
    t0: Instant,
    content_length: Option<&HeaderValue>,
    body: Incoming,
) -> Result<Bytes, ProxyError> {
    let limit = shared.settings.max_body_bytes;
    let declared = content_length
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    let timeout = shared.settings.client_body_timeout;
    // From the request's arrival (already read), not a new clock reading.
    match tokio::time::timeout_at(t0 + timeout, forward::read_whole(body, limit)).await {
        Err(_) => Err(ProxyError::RequestTimeout(timeout)),
        Ok(Ok(body)) => Ok(body),
        Ok(Err(ReadWholeError::TooLarge)) => Err(ProxyError::PayloadTooLarge { limit }),
        Ok(Err(ReadWholeError::Body(e))) => Err(ProxyError::InvalidRequest(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// True when the approval token given matches the configured one
/// (constant-time compare; no token configured means nothing passes).
fn approved(snapshot: &Snapshot, given: Option<&[u8]>) -> bool {
    match (&snapshot.secrets.approval_token, given) {
        (Some(expected), Some(given)) => bool::from(given.ct_eq(expected.as_bytes())),
        _ => false,
    }
}

/// `gen_ai.operation.name` for an OpenAI-style path.
fn operation_name(path: &str) -> &'static str {
    match path {
        "/v1/completions" => "text_completion",
        "/v1/embeddings" => "embeddings",
        _ => "chat",
    }
}

fn provider_name(p: router_policy::Provider) -> &'static str {
    match p {
        router_policy::Provider::Openai => "openai",
        router_policy::Provider::Ollama => "ollama",
        router_policy::Provider::Vllm => "vllm",
        router_policy::Provider::Tgi => "tgi",
    }
}

fn rewrite_model(body: &[u8], model: &str) -> Option<Bytes> {
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    map.insert("model".into(), serde_json::Value::String(model.to_string()));
    serde_json::to_vec(&map).ok().map(Bytes::from)
}

/// A request the router has not answered yet. If it is dropped unanswered
/// (the client went away), its log line says so.
struct Pending {
    shared: Arc<Shared>,
    /// Boxed: the record is most of a pending request's size, and it is
    /// moved several times (into the walk, the answer, the log queue).
    /// `None` once taken to answer: the drop guard is then off.
    record: Option<Box<RouteRecord>>,
    t0: Instant,
    pool: Option<Arc<str>>,
    /// The request id as a header value, once known.
    id_header: Option<HeaderValue>,
    /// The config version as a header value.
    version_header: Option<HeaderValue>,
}

impl Pending {
    fn new(shared: Arc<Shared>, req: &Request<Incoming>, snapshot: &Snapshot) -> Self {
        let record = Box::new(RouteRecord {
            offered_at: Timestamp(SystemTime::now()),
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            config_version: Arc::clone(&snapshot.version),
            ..RouteRecord::default()
        });
        Self {
            shared,
            record: Some(record),
            t0: Instant::now(),
            pool: None,
            id_header: None,
            version_header: snapshot.version_header.clone(),
        }
    }

    /// The record being filled in.
    fn rec(&mut self) -> &mut RouteRecord {
        self.record.get_or_insert_with(Box::default)
    }

    /// Takes the record to finish it elsewhere; the drop guard is off.
    fn take_record(&mut self) -> Box<RouteRecord> {
        self.record.take().unwrap_or_default()
    }

    fn note_attempt(&mut self, mut attempt: AttemptRecord, n: usize) {
        self.pool = Some(attempt.pool.clone());
        let rec = self.rec();
        if attempt.tokens_in.is_some() || attempt.tokens_out.is_some() {
            rec.tokens_in = attempt.tokens_in;
            rec.tokens_out = attempt.tokens_out;
            rec.cost_usd = attempt.cost_usd;
        }
        if attempt.response_model.is_some() {
            // Moved: an attempt's own copy is never logged.
            rec.response_model = attempt.response_model.take();
        }
        if n == 1 {
            rec.first_outcome = attempt.outcome;
        } else {
            rec.fallback_outcome = Some(attempt.outcome);
        }
        rec.queue_wait_ms += attempt.queue_wait_ms;
        // The same attempt may be noted once as failed, then committed as
        // the answer passed on: keep one entry per attempt.
        if rec.attempts.len() < n {
            rec.attempts.push(attempt);
        }
    }

    /// Answers with the router's own error.
    fn reject(mut self, err: ProxyError) -> Response<ProxyBody> {
        let mut record = self.take_record();
        let pool = self.pool.take().or_else(|| record.first_route.clone());
        if record.first_outcome.is_empty() {
            record.first_outcome = err.kind();
        }
        if err.is_shed() {
            self.shared
                .metrics
                .shed(pool.as_deref().unwrap_or(""), err.kind());
            if let Some(cx) = &record.otel {
                let name = if matches!(err, ProxyError::QueueFull { .. }) {
                    "evicted"
                } else {
                    "shed"
                };
                cx.span()
                    .add_event(name, vec![KeyValue::new("router.reason", err.kind())]);
            }
        }
        if record.reason.is_empty() {
            record.reason = err.to_string();
        }
        let id = (!record.request_id.is_empty()).then_some(record.request_id.as_str());
        let mut resp = err.to_response(id);
        set_router_headers(
            &mut resp,
            &record,
            self.id_header.as_ref(),
            None,
            self.version_header.as_ref(),
            record.attempts.len(),
        );
        finish_record(
            &self.shared,
            record,
            self.t0,
            err.kind(),
            resp.status().as_u16(),
            pool,
        );
        full(resp)
    }

    /// Answers with a stored answer (an `Idempotency-Key` retry).
    fn replay(mut self, stored: &StoredAnswer) -> Response<ProxyBody> {
        let mut record = self.take_record();
        record.first_outcome = "replayed";
        record.reason = "Idempotency-Key retry: the stored answer of the first request".into();
        let mut resp = Response::new(stored.body.clone());
        *resp.status_mut() = stored.status;
        *resp.headers_mut() = stored.headers.clone();
        resp.headers_mut()
            .insert(X_ROUTER_REPLAYED, HeaderValue::from_static("true"));
        let pool = resp
            .headers()
            .get(X_ROUTER_ROUTE)
            .and_then(|v| v.to_str().ok())
            .map(Arc::<str>::from);
        // The stored answer keeps its own `x-router-route`.
        set_router_headers(
            &mut resp,
            &record,
            self.id_header.as_ref(),
            None,
            self.version_header.as_ref(),
            0,
        );
        finish_record(
            &self.shared,
            record,
            self.t0,
            "replayed",
            stored.status.as_u16(),
            pool,
        );
        full(resp)
    }

    /// Passes on a complete backend answer.
    fn commit_whole(
        mut self,
        mut head: http::response::Parts,
        body: Bytes,
        leader: Option<LeaderGuard>,
        pool: &Arc<str>,
        route: Option<HeaderValue>,
        attempts: usize,
    ) -> Response<ProxyBody> {
        let mut record = self.take_record();
        let outcome = record.attempts.last().map_or("ok", |a| a.outcome);
        record.final_route = Some(Arc::clone(pool));
        // The backend's `Content-Length`, if it sent one, is the length of
        // `body` (hyper read the body by it): kept, not recomputed.
        forward::strip_hop_by_hop(&mut head.headers);
        let mut resp = Response::from_parts(head, body);
        set_router_headers(
            &mut resp,
            &record,
            self.id_header.as_ref(),
            route,
            self.version_header.as_ref(),
            attempts,
        );
        if let Some(g) = leader {
            if outcome == "ok" {
                g.store(StoredAnswer {
                    status: resp.status(),
                    headers: resp.headers().clone(),
                    body: resp.body().clone(),
                });
            }
        }
        let status = resp.status().as_u16();
        finish_record(
            &self.shared,
            record,
            self.t0,
            outcome,
            status,
            Some(Arc::clone(pool)),
        );
        full(resp)
    }

    /// Passes on a streamed backend answer; the log line is written when
    /// the stream ends.
    fn commit_stream(
        mut self,
        resp: Response<UpstreamBody>,
        lease: Lease,
        started: Instant,
        deadline_at: Option<Instant>,
        attempts: usize,
    ) -> Response<ProxyBody> {
        let mut record = self.take_record();
        let pool = Arc::clone(lease.pool_name());
        record.final_route = Some(Arc::clone(&pool));
        let attempt = record.attempts.pop().unwrap_or_default();
        let (mut head, incoming) = resp.into_parts();
        forward::strip_hop_by_hop(&mut head.headers);
        let sse = head
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        if deadline_at.is_some() {
            // The body may be cut (and an SSE error event added).
            head.headers.remove(header::CONTENT_LENGTH);
        }
        let failed = attempt.outcome != "ok";
        let status = head.status.as_u16();
        let mut resp = Response::from_parts(head, ());
        set_router_headers(
            &mut resp,
            &record,
            self.id_header.as_ref(),
            lease.route_header().cloned(),
            self.version_header.as_ref(),
            attempts,
        );
        let finisher = Finisher {
            shared: Arc::clone(&self.shared),
            lease,
            record,
            attempt,
            t0: self.t0,
            started,
            sample_on_first_byte: !failed,
            status,
        };
        resp.map(|()| {
            Either::Right(TrackedBody::new(
                incoming,
                Box::new(finisher),
                deadline_at,
                sse,
            ))
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            let pool = self.pool.take().or_else(|| record.first_route.clone());
            // 499: nginx's "client closed request".
            finish_record(&self.shared, record, self.t0, "client_cancelled", 499, pool);
        }
    }
}

fn finish_record(
    shared: &Shared,
    mut record: Box<RouteRecord>,
    t0: Instant,
    outcome: &'static str,
    status: u16,
    pool: Option<Arc<str>>,
) {
    let elapsed = t0.elapsed();
    record.elapsed_ms = ms(elapsed);
    record.outcome = outcome;
    record.status = status;
    if record.first_outcome.is_empty() {
        record.first_outcome = outcome;
    }
    if record.attempts.len() > 1 {
        shared.metrics.fallback(
            record.first_route.as_deref().unwrap_or(""),
            pool.as_deref().unwrap_or(""),
        );
    }
    let pool = pool.as_deref().unwrap_or_default();
    shared.metrics.request_done(
        record.route.as_deref().unwrap_or_default(),
        pool,
        outcome,
        elapsed.as_secs_f64(),
    );
    if let Some(cx) = record.otel.take() {
        end_server_span(&cx, &record, pool);
    }
    if record.tokens_in.is_some() || record.tokens_out.is_some() {
        shared.metrics.usage(
            pool,
            record.tokens_in.unwrap_or(0),
            record.tokens_out.unwrap_or(0),
            record.cost_usd.unwrap_or(0.0),
        );
    }
    shared.route_log.emit(record);
}

/// Annotates and ends the request's server span.
fn end_server_span(cx: &opentelemetry::Context, record: &RouteRecord, pool: &str) {
    let span = cx.span();
    let mut attrs = vec![
        KeyValue::new("http.request.method", record.method.to_string()),
        KeyValue::new("url.path", record.path.clone()),
        KeyValue::new("http.response.status_code", i64::from(record.status)),
        KeyValue::new("router.request_id", record.request_id.clone()),
        KeyValue::new("router.config_version", record.config_version.to_string()),
        KeyValue::new("router.outcome", record.outcome),
        KeyValue::new("router.reason", record.reason.clone()),
        KeyValue::new("router.queue_wait_ms", record.queue_wait_ms),
        KeyValue::new("router.attempts", record.attempts.len() as i64),
        KeyValue::new("gen_ai.operation.name", operation_name(&record.path)),
    ];
    let optional = [
        ("router.route", record.route.clone()),
        ("router.pool", (!pool.is_empty()).then(|| pool.to_string())),
        ("router.risk", record.risk.map(str::to_string)),
        (
            "gen_ai.request.model",
            record.model.as_deref().map(str::to_string),
        ),
        ("gen_ai.response.model", record.response_model.clone()),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            attrs.push(KeyValue::new(k, v));
        }
    }
    if let Some(d) = record.deadline_ms {
        attrs.push(KeyValue::new("router.deadline_ms", d as i64));
    }
    if let Some(n) = record.tokens_in {
        attrs.push(KeyValue::new("gen_ai.usage.input_tokens", n as i64));
    }
    if let Some(n) = record.tokens_out {
        attrs.push(KeyValue::new("gen_ai.usage.output_tokens", n as i64));
    }
    span.set_attributes(attrs);
    if record.status >= 500 || record.outcome != "ok" && record.outcome != "replayed" {
        span.set_status(Status::error(record.outcome));
    }
    span.end();
}

/// Runs when a streamed answer's body ends.
struct Finisher {
    shared: Arc<Shared>,
    lease: Lease,
    record: Box<RouteRecord>,
    attempt: AttemptRecord,
    t0: Instant,
    started: Instant,
    sample_on_first_byte: bool,
    status: u16,
}

impl Completion for Finisher {
    fn first_byte(&mut self) {
        let ttfb = self.started.elapsed();
        self.attempt.latency_ms = ms(ttfb);
        if self.sample_on_first_byte {
            self.lease.observe(Sample::Success(ttfb));
        }
    }

    fn finish(self: Box<Self>, end: BodyEnd) {
        let Finisher {
            shared,
            lease,
            mut record,
            mut attempt,
            t0,
            status,
            ..
        } = *self;
        let outcome = match end {
            BodyEnd::Complete => attempt.outcome,
            BodyEnd::UpstreamError => "upstream_reset",
            BodyEnd::ClientGone => "client_cancelled",
            BodyEnd::DeadlineCut => "deadline_exhausted",
        };
        if end == BodyEnd::UpstreamError {
            lease.observe(Sample::Failure(t0.elapsed()));
        }
        attempt.outcome = outcome;
        let pool = Arc::clone(lease.pool_name());
        // Release the endpoint before logging: the slot is free now.
        drop(lease);
        if record.attempts.is_empty() {
            record.first_outcome = outcome;
        } else {
            record.fallback_outcome = Some(outcome);
        }
        record.attempts.push(attempt);
        if end == BodyEnd::DeadlineCut {
            shared.metrics.shed(&pool, "deadline_exhausted");
        }
        finish_record(&shared, record, t0, outcome, status, Some(pool));
    }
}
