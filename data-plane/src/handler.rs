//! The request path: read, route, queue, forward, answer, log.
//!
//! ```text
//! request ─▶ admin? ─▶ request id ─▶ body (limit, timeout) ─▶ model (JSON paths)
//!        ─▶ route (first match) ─▶ pool (first in chain with endpoints)
//!        ─▶ lease (queue) ─▶ forward ─▶ stream answer ─▶ route log + metrics
//! ```
//!
//! Every request ends in exactly one of three ways, and each writes one
//! route decision log line and one `router_requests_total` sample:
//! the router answers it itself ([`Pending::reject`]), the backend's answer
//! is streamed to the end or cut ([`Finisher`], run by the body wrapper),
//! or the client goes away first ([`Pending`]'s `Drop`).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use tokio::time::Instant;

use crate::error::ProxyError;
use crate::forward::{self, BodyEnd, Completion, TrackedBody};
use crate::pool::{Lease, Sample, Shed};
use crate::route_log::{rfc3339, AttemptRecord, RouteRecord};
use crate::Shared;

/// Error type of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every response the proxy sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Paths whose JSON body's `model` selects the route.
const OPENAI_JSON_PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const X_ROUTER_ROUTE: HeaderName = HeaderName::from_static("x-router-route");
const X_ROUTER_ATTEMPTS: HeaderName = HeaderName::from_static("x-router-attempts");
const X_ROUTER_CONFIG_VERSION: HeaderName = HeaderName::from_static("x-router-config-version");

/// A body the router made itself.
pub fn full(body: Response<Bytes>) -> Response<ProxyBody> {
    body.map(|b| Full::new(b).map_err(|never| match never {}).boxed_unsync())
}

/// Handles one proxied request.
pub async fn handle(
    shared: Arc<Shared>,
    remote: SocketAddr,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let path = req.uri().path();
    if path.starts_with("/_custom_router/") || path == "/metrics" {
        return full(crate::admin::handle(&shared, req).await);
    }
    let snapshot = shared.config.load();
    let mut pending = Pending::new(Arc::clone(&shared), &req, Arc::clone(&snapshot.version));

    let request_id = match request_id(req.headers()) {
        Ok(id) => id,
        Err(e) => return pending.reject(e),
    };
    pending.record.request_id = request_id;

    let (parts, body) = req.into_parts();
    let body = match read_body(&shared, &parts.headers, body).await {
        Ok(b) => b,
        Err(e) => return pending.reject(e),
    };
    let path = parts.uri.path();
    let peek = if parts.method == Method::POST && OPENAI_JSON_PATHS.contains(&path) {
        match serde_json::from_slice::<ModelPeek<'_>>(&body) {
            Ok(p) => Some(p),
            Err(e) => {
                return pending.reject(ProxyError::InvalidRequest(format!(
                    "request body is not valid JSON: {e}"
                )))
            }
        }
    } else {
        None
    };
    let model = peek.as_ref().and_then(|p| p.model.as_deref());
    pending.record.model = model.map(str::to_string);

    let Some(route) = snapshot.policy.route_for(model, path) else {
        return pending.reject(ProxyError::NoBackend {
            detail: "no route matches this request".into(),
        });
    };
    pending.record.route = Some(route.name.clone());
    let mut skipped = Vec::new();
    let mut chosen = None;
    for name in &route.chain {
        match snapshot.pools.get(name) {
            Some(p) if p.has_endpoints() => {
                chosen = Some(p);
                break;
            }
            _ => skipped.push(format!("{name}: no endpoints")),
        }
    }
    let Some(pool) = chosen else {
        return pending.reject(ProxyError::NoBackend {
            detail: format!("route {:?}: {}", route.name, skipped.join("; ")),
        });
    };
    let pool_name = pool.name().to_string();
    pending.record.first_route = Some(pool_name.clone());
    pending.record.reason = if skipped.is_empty() {
        format!("route {:?}; pool {pool_name:?} first in chain", route.name)
    } else {
        format!(
            "route {:?}; pool {pool_name:?} first in chain with endpoints (skipped {})",
            route.name,
            skipped.join("; ")
        )
    };

    // The pool's model replaces the client's, for OpenAI-style bodies.
    let pool_model = snapshot
        .policy
        .pool(&pool_name)
        .and_then(|p| p.model.as_deref());
    let body = match (peek.is_some(), pool_model) {
        (true, Some(m)) if model != Some(m) => match rewrite_model(&body, m) {
            Some(b) => b,
            None => body,
        },
        _ => body,
    };

    let lease = match pool.acquire().await {
        Ok(l) => l,
        Err(shed) => {
            let waited = pending.t0.elapsed();
            let err = match shed {
                Shed::QueueFull => ProxyError::QueueFull { pool: pool_name },
                Shed::QueueTimeout => ProxyError::QueueTimeout {
                    pool: pool_name,
                    waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                },
                Shed::NoBackend => ProxyError::NoBackend {
                    detail: format!("pool {pool_name:?} has no endpoints"),
                },
            };
            pending.record.queue_wait_ms = ms(waited);
            return pending.reject(err);
        }
    };
    pending.record.queue_wait_ms = ms(lease.queue_wait());
    shared
        .metrics
        .queue_wait(&pool_name, lease.queue_wait().as_secs_f64());
    forward_to(pending, lease, parts, body, remote).await
}

async fn forward_to(
    mut pending: Pending,
    lease: Lease,
    parts: http::request::Parts,
    body: Bytes,
    remote: SocketAddr,
) -> Response<ProxyBody> {
    let shared = Arc::clone(&pending.shared);
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri = match forward::upstream_uri(lease.endpoint(), path_and_query) {
        Ok(u) => u,
        Err(e) => {
            return pending.reject(ProxyError::InvalidRequest(format!("bad request path: {e}")))
        }
    };
    let mut headers = parts.headers;
    let original_host = headers.get(header::HOST).cloned();
    forward::strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    forward::add_forwarded(&mut headers, remote.ip(), original_host);
    if let Ok(id) = HeaderValue::from_str(&pending.record.request_id) {
        headers.insert(X_REQUEST_ID, id.clone());
        headers.insert(IDEMPOTENCY_KEY, id);
    }
    let mut upstream = Request::new(Full::new(body));
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = uri;
    *upstream.headers_mut() = headers;

    let pool = lease.pool_name().to_string();
    let started = Instant::now();
    let result = shared.client.request(upstream).await;
    let elapsed = started.elapsed();
    let mut attempt = AttemptRecord {
        pool: pool.clone(),
        endpoint: lease.addr().to_string(),
        outcome: "ok",
        status: None,
        latency_ms: ms(elapsed),
    };
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            lease.observe(Sample::Failure(elapsed));
            attempt.outcome = if e.is_connect() {
                "connect_error"
            } else {
                "upstream_error"
            };
            let err = ProxyError::Upstream {
                endpoint: attempt.endpoint.clone(),
                detail: attempt.outcome.replace('_', " "),
            };
            pending.record.first_outcome = attempt.outcome.to_string();
            pending.record.attempts.push(attempt);
            pending.pool = Some(pool);
            return pending.reject(err);
        }
    };
    let status = resp.status();
    let failed = status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS;
    attempt.status = Some(status.as_u16());
    attempt.outcome = outcome_of(status);
    if failed {
        lease.observe(Sample::Failure(elapsed));
    }
    let (mut head, incoming) = resp.into_parts();
    forward::strip_hop_by_hop(&mut head.headers);
    let record = pending.take_record();
    let finisher = Finisher {
        shared: Arc::clone(&shared),
        lease,
        record,
        attempt,
        t0: pending.t0,
        started,
        sample_on_first_byte: !failed,
        status: status.as_u16(),
    };
    let mut resp = Response::from_parts(head, ());
    set_router_headers(&mut resp, &finisher.record, Some(&pool), 1);
    resp.map(|()| {
        TrackedBody::new(incoming, Box::new(finisher))
            .map_err(BoxError::from)
            .boxed_unsync()
    })
}

fn outcome_of(status: StatusCode) -> &'static str {
    if status == StatusCode::TOO_MANY_REQUESTS {
        "status_429"
    } else if status.is_server_error() {
        "status_5xx"
    } else {
        "ok"
    }
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn set_router_headers<B>(
    resp: &mut Response<B>,
    record: &RouteRecord,
    pool: Option<&str>,
    attempts: usize,
) {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&record.request_id) {
        h.insert(X_REQUEST_ID, v);
    }
    if let Some(Ok(v)) = pool.map(HeaderValue::from_str) {
        h.insert(X_ROUTER_ROUTE, v);
    }
    h.insert(X_ROUTER_ATTEMPTS, HeaderValue::from(attempts));
    if let Ok(v) = HeaderValue::from_str(&record.config_version) {
        h.insert(X_ROUTER_CONFIG_VERSION, v);
    }
}

/// The request id: the client's `Idempotency-Key` or `X-Request-Id`, else a
/// new UUIDv7.
fn request_id(headers: &http::HeaderMap) -> Result<String, ProxyError> {
    let given = headers
        .get(IDEMPOTENCY_KEY)
        .or_else(|| headers.get(X_REQUEST_ID));
    match given {
        None => Ok(uuid::Uuid::now_v7().to_string()),
        Some(v) => match v.to_str() {
            Ok(s) if !s.trim().is_empty() && s.len() <= 255 => Ok(s.trim().to_string()),
            _ => Err(ProxyError::InvalidRequest(
                "Idempotency-Key / X-Request-Id must be 1-255 visible ASCII characters".into(),
            )),
        },
    }
}

async fn read_body(
    shared: &Shared,
    headers: &http::HeaderMap,
    body: Incoming,
) -> Result<Bytes, ProxyError> {
    let limit = shared.settings.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    let timeout = shared.settings.client_body_timeout;
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => Err(ProxyError::RequestTimeout(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::PayloadTooLarge { limit })
        }
        Ok(Err(e)) => Err(ProxyError::InvalidRequest(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// The fields of an OpenAI-style body the router reads. Parsing into this
/// (instead of a full `Value`) checks the JSON syntax without building it.
#[derive(Deserialize)]
struct ModelPeek<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
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
    record: RouteRecord,
    answered: bool,
    t0: Instant,
    pool: Option<String>,
}

impl Pending {
    fn new(shared: Arc<Shared>, req: &Request<Incoming>, version: Arc<str>) -> Self {
        let record = RouteRecord {
            offered_at: rfc3339(SystemTime::now()),
            method: req.method().to_string(),
            path: req.uri().path().to_string(),
            config_version: version.to_string(),
            ..RouteRecord::default()
        };
        Self {
            shared,
            record,
            answered: false,
            t0: Instant::now(),
            pool: None,
        }
    }

    /// Takes the record to finish it elsewhere; the drop guard is off.
    fn take_record(&mut self) -> RouteRecord {
        self.answered = true;
        std::mem::take(&mut self.record)
    }

    /// Answers with the router's own error.
    fn reject(mut self, err: ProxyError) -> Response<ProxyBody> {
        let mut record = self.take_record();
        let pool = self.pool.take().or_else(|| record.first_route.clone());
        if record.first_outcome.is_empty() {
            record.first_outcome = err.kind().to_string();
        }
        if err.is_shed() {
            self.shared
                .metrics
                .shed(pool.as_deref().unwrap_or(""), err.kind());
        }
        if record.reason.is_empty() {
            record.reason = err.to_string();
        }
        let id = (!record.request_id.is_empty()).then_some(record.request_id.as_str());
        let mut resp = err.to_response(id);
        set_router_headers(&mut resp, &record, None, record.attempts.len());
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
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            let record = std::mem::take(&mut self.record);
            let pool = self.pool.take().or_else(|| record.first_route.clone());
            // 499: nginx's "client closed request".
            finish_record(&self.shared, record, self.t0, "client_cancelled", 499, pool);
        }
    }
}

fn finish_record(
    shared: &Shared,
    mut record: RouteRecord,
    t0: Instant,
    outcome: &str,
    status: u16,
    pool: Option<String>,
) {
    let elapsed = t0.elapsed();
    record.elapsed_ms = ms(elapsed);
    record.outcome = outcome.to_string();
    record.status = status;
    if record.first_outcome.is_empty() {
        record.first_outcome = outcome.to_string();
    }
    let labels = crate::metrics::RequestLabels {
        route: record.route.clone().unwrap_or_default(),
        pool: pool.unwrap_or_default(),
        outcome: outcome.to_string(),
    };
    shared.metrics.request_done(&labels, elapsed.as_secs_f64());
    shared.route_log.emit(&record);
}

/// Runs when a forwarded answer's body ends.
struct Finisher {
    shared: Arc<Shared>,
    lease: Lease,
    record: RouteRecord,
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
        };
        if end == BodyEnd::UpstreamError {
            lease.observe(Sample::Failure(t0.elapsed()));
        }
        attempt.outcome = outcome;
        let pool = lease.pool_name().to_string();
        // Release the endpoint before logging: the slot is free now.
        drop(lease);
        record.first_outcome = outcome.to_string();
        record.final_route = Some(pool.clone());
        record.attempts.push(attempt);
        finish_record(&shared, record, t0, outcome, status, Some(pool));
    }
}
