//! The request path: read, route, walk the chain inside the deadline,
//! answer exactly once, log.
//!
//! One file per step, in the order a request meets them:
//!
//! ```text
//! ingress.rs   admin? ─▶ request id ─▶ deadline, risk ─▶ body (limit, timeout)
//!              ─▶ another dialect's body translated (dialect.rs)
//!              ─▶ model (JSON paths) ─▶ route (first match), approval
//!              ─▶ decide_on_route (gates on live measurements)
//!              ─▶ Idempotency-Key: join the request in flight / replay / lead
//!                 (a leader runs in a task of its own: its client leaving
//!                 does not cancel it)
//! chain.rs     the executor of router_policy::walk: start ─▶ Try(plan)
//!                ─▶ attempt (hedged if planned) ─▶ walk.ended(how) ─▶
//!                Try again / Signal (span event, budget) / Answer / End(how)
//! attempt.rs   lease (queue) ─▶ send ─▶ answer head (JSON answers: whole body)
//!              ─▶ the attempt's Outcome, its latency sample, its record
//! upstream_request.rs  URI, model rewrite, the pool's own key, Host
//! dialect.rs   clients of another dialect (Anthropic Messages): the
//!              translation, its answers and errors; count_tokens, /v1/models
//! answer.rs    Pending: the router's own answer, a replay, or the backend's
//!              answer passed on (buffered, or streamed through TrackedBody)
//! finish.rs    one route record + metrics per request (at once, or when a
//!              stream ends, or when the client goes away)
//! spans.rs     OpenTelemetry attributes of the server and client spans
//! ```
//!
//! The rules live in `router_policy` and are only carried out here: the
//! route and its gates ([`router_policy::decide`]), the walk along the
//! chain ([`router_policy::walk`]: which pool, the time an attempt may
//! take, hedges, retries in the pool, the retry budget, which error wins,
//! parking), and how an attempt ended ([`router_policy::AttemptEnding`]:
//! its [`router_policy::Outcome`] and latency sample).
//!
//! Every request ends in exactly one of three ways, each writing one route
//! decision line and one `router_requests_total` sample: the router answers
//! it itself (`Pending::reject`), a backend's answer is passed on (a
//! buffered answer at once; a stream by `Finisher` when it ends), or the
//! client goes away first (`Pending`'s `Drop`). A keyed request whose
//! client goes away is not dropped: it runs to one of the first two ends
//! and its answer is kept for the retry.
//!
//! An abandoned attempt (timed out, or failed over) is cancelled by
//! dropping its future or body, which closes its upstream connection, so
//! the backend can stop generating.

mod answer;
mod arrival;
mod attempt;
mod cache;
mod chain;
mod dialect;
mod finish;
mod hedge;
mod ingress;
mod parking;
mod spans;
pub(crate) mod tenancy;
mod upstream_request;

use bytes::Bytes;
use http::header::HeaderName;
use http::Response;
use http_body_util::{Either, Full};

use crate::tracked_body::TrackedBody;

pub(crate) use ingress::handle;

/// The body type of every response the proxy sends: a whole body (the
/// router's own answers, buffered backend answers) or a backend stream
/// passed on. An enum rather than a boxed body: no allocation and no
/// dynamic call per answer.
pub(crate) type ProxyBody = Either<Full<Bytes>, TrackedBody>;

/// A body the router made itself.
pub(crate) fn full(body: Response<Bytes>) -> Response<ProxyBody> {
    body.map(|b| Either::Left(Full::new(b)))
}

pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The backend's own `x-request-id`, passed on to the client under this
/// name (the router's id keeps `x-request-id`).
pub(crate) const X_UPSTREAM_REQUEST_ID: HeaderName =
    HeaderName::from_static("x-upstream-request-id");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub(crate) const X_ROUTER_ROUTE: HeaderName = HeaderName::from_static("x-router-route");
const X_ROUTER_ATTEMPTS: HeaderName = HeaderName::from_static("x-router-attempts");
const X_ROUTER_CONFIG_VERSION: HeaderName = HeaderName::from_static("x-router-config-version");
const X_ROUTER_REPLAYED: HeaderName = HeaderName::from_static("x-router-replayed");
/// What the route's response cache did: `hit`, `miss`, `bypass`, `refresh`.
const X_ROUTER_CACHE: HeaderName = HeaderName::from_static("x-router-cache");

/// The route record a retry of an `outcome_unknown` request is shown: the
/// first request's id, route, pools and outcomes (no endpoint addresses:
/// those are internal).
fn route_summary(record: &crate::route_log::RouteRecord) -> Bytes {
    let attempts: Vec<serde_json::Value> = record
        .attempts
        .iter()
        .map(|a| {
            serde_json::json!({
                "pool": &*a.pool,
                "outcome": a.outcome.as_str(),
                "status": a.status,
                "latency_ms": a.latency_ms,
            })
        })
        .collect();
    let v = serde_json::json!({
        "request_id": record.request_id,
        "offered_at": record.offered_at,
        "route": record.route,
        "first_route": record.first_route.as_deref(),
        "attempts": attempts,
        "risk": record.risk,
        "reason": record.reason,
    });
    Bytes::from(v.to_string())
}

/// Milliseconds with microsecond precision, as the route log writes them.
fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Whole milliseconds, saturating.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
