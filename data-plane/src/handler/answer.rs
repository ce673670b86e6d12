//! A request not answered yet ([`Pending`]), and the four ways it is
//! answered: the router's own typed error, a stored answer replayed, a
//! complete backend answer, or a backend stream passed on.
//!
//! Each answer takes the request's route record out of `Pending` (which
//! turns its drop guard off) and either finishes it at once
//! ([`super::finish::finish_record`]) or hands it to the stream's
//! [`Finisher`], which finishes it when the body ends. A `Pending` dropped
//! with its record still in it is a client that went away
//! ([`super::finish`]).

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use http_body_util::Either;
use hyper::body::Incoming;
use opentelemetry::trace::TraceContextExt;
use opentelemetry::KeyValue;
use router_dialect::Dialect;
use router_policy::Outcome;
use tokio::time::Instant;

use super::finish::{finish_record, Finisher, KeyedStream, StreamTally};
use super::{
    full, ProxyBody, X_REQUEST_ID, X_ROUTER_ATTEMPTS, X_ROUTER_CACHE, X_ROUTER_CONFIG_VERSION,
    X_ROUTER_REPLAYED, X_ROUTER_ROUTE, X_UPSTREAM_REQUEST_ID,
};
use crate::config::Snapshot;
use crate::error::ProxyError;
use crate::idempotency::{KeyLease, StoredAnswer};
use crate::pool::Lease;
use crate::route_log::{
    AttemptRecord, IdempotencyRole, LogLine, RouteRecord, Timestamp, UPSTREAM_REQUEST_ID_MAX,
};
use crate::tracked_body::{StreamWatch, TrackedBody};
use crate::upstream::UpstreamBody;
use crate::Shared;

/// A request the router has not answered yet. If it is dropped unanswered
/// (the client went away), its log line says so.
pub(super) struct Pending {
    pub(super) shared: Arc<Shared>,
    /// Boxed: the record is most of a pending request's size, and it is
    /// moved several times (into the walk, the answer, the log queue).
    /// `None` once taken to answer: the drop guard is then off.
    pub(super) record: Option<Box<RouteRecord>>,
    /// When the request arrived.
    pub(super) t0: Instant,
    /// The pool the request ended on, once known.
    pub(super) pool: Option<Arc<str>>,
    /// The request id as a header value, once known.
    pub(super) id_header: Option<HeaderValue>,
    /// The config version as a header value.
    version_header: Option<HeaderValue>,
    /// The client's dialect: the router's own errors are written in it,
    /// and a stream of another dialect is translated to it.
    pub(super) dialect: Dialect,
}

impl Pending {
    pub(super) fn new(shared: Arc<Shared>, req: &Request<Incoming>, snapshot: &Snapshot) -> Self {
        // The log's `offered_at` is a wall time: the one clock reading
        // that must not be tokio's.
        let offered_at = Timestamp(router_policy::wall_clock::now());
        let record = Box::new(RouteRecord {
            line: LogLine {
                offered_at,
                method: req.method().clone(),
                path: req.uri().path().to_string(),
                config_version: Arc::clone(&snapshot.version),
                ..LogLine::default()
            },
            ..RouteRecord::default()
        });
        Self {
            shared,
            record: Some(record),
            t0: Instant::now(),
            pool: None,
            id_header: None,
            version_header: snapshot.version_header.clone(),
            dialect: Dialect::OpenAi,
        }
    }

    /// The record being filled in.
    pub(super) fn rec(&mut self) -> &mut RouteRecord {
        self.record.get_or_insert_with(Box::default)
    }

    /// Takes the record to finish it elsewhere; the drop guard is off.
    fn take_record(&mut self) -> Box<RouteRecord> {
        self.record.take().unwrap_or_default()
    }

    /// Notes the `n`th attempt (1-based) in the record.
    pub(super) fn note_attempt(&mut self, mut attempt: AttemptRecord, n: usize) {
        self.pool = Some(attempt.pool.clone());
        let rec = self.rec();
        if attempt.tokens_in.is_some() || attempt.tokens_out.is_some() {
            rec.tokens_in = attempt.tokens_in;
            rec.tokens_out = attempt.tokens_out;
            rec.cache_read_tokens = attempt.cache_read_tokens;
            rec.cache_write_tokens = attempt.cache_write_tokens;
            rec.cost_usd = attempt.cost_usd;
        }
        if attempt.response_model.is_some() {
            // Moved: an attempt's own copy is never logged.
            rec.response_model = attempt.response_model.take();
        }
        if n == 1 {
            rec.first_outcome = Some(attempt.outcome);
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

    /// The router's headers on an answer to this request (see
    /// [`set_router_headers`]).
    fn stamp<B>(
        &self,
        resp: &mut Response<B>,
        record: &RouteRecord,
        route: Option<HeaderValue>,
        attempts: usize,
    ) {
        set_router_headers(
            resp,
            record,
            self.id_header.as_ref(),
            route,
            self.version_header.as_ref(),
            attempts,
        );
    }

    /// Answers with the router's own error.
    pub(super) fn reject(mut self, err: ProxyError) -> Response<ProxyBody> {
        let mut record = self.take_record();
        let pool = self.pool.take().or_else(|| record.first_route.clone());
        let outcome = err.outcome();
        record.first_outcome.get_or_insert(outcome);
        if err.is_shed() {
            self.shared
                .metrics
                .shed(pool.as_deref().unwrap_or(""), outcome);
            if let Some(cx) = &record.otel {
                let name = if outcome == Outcome::QueueFull {
                    "evicted"
                } else {
                    "shed"
                };
                cx.span()
                    .add_event(name, vec![KeyValue::new("router.reason", outcome.as_str())]);
            }
        }
        if record.reason.is_empty() {
            record.reason = err.to_string();
        }
        let id = (!record.request_id.is_empty()).then_some(record.request_id.as_str());
        let mut resp = err.to_response_in(self.dialect, id);
        self.stamp(&mut resp, &record, None, record.attempts.len());
        let status = resp.status().as_u16();
        finish_record(&self.shared, record, self.t0, outcome, status, pool);
        full(resp)
    }

    /// Answers with a stored answer (an `Idempotency-Key` retry; `joined`:
    /// it waited for the first request in flight). A stream's frames are
    /// sent as they were stored, with the stream's own content type.
    pub(super) fn replay(mut self, stored: &StoredAnswer, joined: bool) -> Response<ProxyBody> {
        let mut record = self.take_record();
        record.first_outcome = Some(Outcome::Replayed);
        record.idempotency = Some(if joined {
            IdempotencyRole::Join
        } else {
            IdempotencyRole::Replay
        });
        record.reason = if joined {
            "Idempotency-Key retry: joined the first request in flight and got its answer".into()
        } else {
            "Idempotency-Key retry: the stored answer of the first request".into()
        };
        let (mut resp, pool) = stored_response(stored);
        resp.headers_mut()
            .insert(X_ROUTER_REPLAYED, HeaderValue::from_static("true"));
        self.send_stored(resp, record, pool)
    }

    /// Answers from the response cache: the stored answer, with
    /// `x-router-cache: hit` and its `Age`. No attempt was made, so the
    /// tenant's holds settle at 0 (a hit draws nothing from budgets); the
    /// record gives the tokens the answer saved and what they cost when
    /// it was generated (a whole JSON answer's `usage`, priced at the
    /// pool that answered it).
    pub(super) fn cache_hit(
        mut self,
        snapshot: &Snapshot,
        stored: &StoredAnswer,
        age: std::time::Duration,
    ) -> Response<ProxyBody> {
        let mut record = self.take_record();
        record.first_outcome = Some(Outcome::Replayed);
        record.reason = "answered from the route's response cache".into();
        let (mut resp, pool) = stored_response(stored);
        resp.headers_mut()
            .insert(header::AGE, HeaderValue::from(age.as_secs()));
        let usage = if stored.stream {
            streamed_usage(self.dialect, &stored.body)
        } else {
            saved_usage(&stored.body)
        };
        if let Some(usage) = usage {
            record.tokens_in = usage.prompt;
            record.tokens_out = usage.output;
            let price = pool
                .as_deref()
                .and_then(|p| snapshot.policy.pool(p))
                .map(|p| p.price);
            if let Some(price) = price {
                let tokens = router_policy::usage::Tokens {
                    prompt: usage.prompt.unwrap_or(0),
                    output: usage.output.unwrap_or(0),
                    cache_read: 0,
                    cache_write: 0,
                };
                record.cache_saved_usd = Some(price.cost_of(&tokens));
            }
        }
        record.cost_usd = Some(0.0);
        self.send_stored(resp, record, pool)
    }

    /// Sends a stored answer (a replay, a cache hit: no attempt made; the
    /// stored answer keeps its own `x-router-route`) and logs `record`.
    fn send_stored(
        self,
        mut resp: Response<Bytes>,
        record: Box<RouteRecord>,
        pool: Option<Arc<str>>,
    ) -> Response<ProxyBody> {
        self.stamp(&mut resp, &record, None, 0);
        let status = resp.status().as_u16();
        finish_record(
            &self.shared,
            record,
            self.t0,
            Outcome::Replayed,
            status,
            pool,
        );
        full(resp)
    }

    /// Passes on a complete backend answer (the caller settles the key
    /// with it, then wraps it).
    pub(super) fn commit_whole(
        mut self,
        mut head: http::response::Parts,
        body: Bytes,
        pool: &Arc<str>,
        route: Option<HeaderValue>,
        attempts: usize,
    ) -> Response<Bytes> {
        let mut record = self.take_record();
        let outcome = record.attempts.last().map_or(Outcome::Ok, |a| a.outcome);
        record.final_route = Some(Arc::clone(pool));
        // The backend's `Content-Length`, if it sent one, is the length of
        // `body` (hyper read the body by it): kept, not recomputed.
        crate::hop_by_hop::strip_hop_by_hop(&mut head.headers);
        move_upstream_request_id(&mut head.headers);
        let mut resp = Response::from_parts(head, body);
        self.stamp(&mut resp, &record, route, attempts);
        let status = resp.status().as_u16();
        finish_record(
            &self.shared,
            record,
            self.t0,
            outcome,
            status,
            Some(Arc::clone(pool)),
        );
        resp
    }

    /// Passes on a streamed backend answer; the log line is written when
    /// the stream ends. `watch`: what was read of it and how the rest is
    /// watched; `price`: the pool's, for the cost of a watched stream's
    /// usage, with the request's input tokens estimated.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit_stream(
        mut self,
        resp: Response<UpstreamBody>,
        lease: Lease,
        started: Instant,
        deadline_at: Option<Instant>,
        attempts: usize,
        leader: Option<(KeyLease, bool)>,
        watch: Box<StreamWatch>,
        (price, input_estimate): (Option<router_policy::Price>, u64),
    ) -> Response<ProxyBody> {
        let mut record = self.take_record();
        let pool = Arc::clone(lease.pool_name());
        record.final_route = Some(Arc::clone(&pool));
        let attempt = record.attempts.pop().unwrap_or_default();
        let (mut head, incoming) = resp.into_parts();
        crate::hop_by_hop::strip_hop_by_hop(&mut head.headers);
        move_upstream_request_id(&mut head.headers);
        let sse = head
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        // The router's own cut events in the client's dialect; a stream
        // translated to it (the walk set its translator) gets a length of
        // its own.
        let mut watch = watch;
        watch.client = self.dialect;
        if watch.translate.is_some() {
            head.headers.remove(header::CONTENT_LENGTH);
        }
        // A keyed stream that is finished even if its client leaves is
        // bounded: by its deadline, else by the attempt timeout (a backend
        // that never ends must not hold its slot and key for ever).
        let finish = leader.as_ref().is_some_and(|(_, f)| *f);
        let deadline_at = match deadline_at {
            None if finish => Some(crate::clock::later(
                Instant::now(),
                self.shared.settings.attempt_timeout,
                crate::clock::A_YEAR,
            )),
            d => d,
        };
        if deadline_at.is_some() {
            // The body may be cut (and an SSE error event added).
            head.headers.remove(header::CONTENT_LENGTH);
        }
        let failed = !attempt.outcome.is_success();
        let status = head.status.as_u16();
        let mut resp = Response::from_parts(head, ());
        self.stamp(&mut resp, &record, lease.route_header().cloned(), attempts);
        // A keyed stream keeps its frames for the retry and, unless the
        // route turned it off, is read to its end if the client leaves.
        let keyed = leader.map(|(lease, _)| {
            let (head, ()) = Response::new(()).into_parts();
            let mut head = head;
            head.status = resp.status();
            head.headers = resp.headers().clone();
            KeyedStream {
                lease,
                head,
                frames: bytes::BytesMut::new(),
                seen: 0,
            }
        });
        let finisher = Finisher {
            shared: Arc::clone(&self.shared),
            lease,
            record,
            attempt,
            t0: self.t0,
            started,
            sample_on_first_byte: !failed,
            status,
            keyed,
            tally: watch
                .scanner
                .is_some()
                .then(|| StreamTally::new(price, input_estimate)),
        };
        resp.map(|()| {
            Either::Right(TrackedBody::new(
                incoming,
                Box::new(finisher),
                deadline_at,
                sse,
                finish,
                *watch,
            ))
        })
    }
}

/// The backend's own `x-request-id`, cut to
/// [`UPSTREAM_REQUEST_ID_MAX`] bytes (a prefix of a header value is one).
pub(super) fn upstream_request_id(headers: &http::HeaderMap) -> Option<HeaderValue> {
    let v = headers.get(X_REQUEST_ID)?;
    if v.len() <= UPSTREAM_REQUEST_ID_MAX {
        return Some(v.clone());
    }
    let cut = v.as_bytes().get(..UPSTREAM_REQUEST_ID_MAX)?;
    HeaderValue::from_bytes(cut).ok()
}

/// A backend's answer keeps its own `x-request-id` as
/// `x-upstream-request-id` (the router's id takes `x-request-id`, as the
/// contract says); a backend's own `x-upstream-request-id` is not passed
/// on, so the header is always the backend's request id.
fn move_upstream_request_id(headers: &mut http::HeaderMap) {
    let id = upstream_request_id(headers);
    headers.remove(X_UPSTREAM_REQUEST_ID);
    if let Some(id) = id {
        headers.insert(X_UPSTREAM_REQUEST_ID, id);
    }
}

/// `x-request-id` (the client's own value, else the record's id),
/// `x-router-route` (when given), `x-router-attempts` and
/// `x-router-config-version`.
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
    if let Some(c) = record.cache {
        h.insert(X_ROUTER_CACHE, HeaderValue::from_static(c));
    }
    if let Some(v) = version {
        h.insert(X_ROUTER_CONFIG_VERSION, v.clone());
    }
}

/// A stored answer as a response (a replay's, a cache hit's), and the
/// pool that answered it (the stored answer keeps its own
/// `x-router-route`).
fn stored_response(stored: &StoredAnswer) -> (Response<Bytes>, Option<Arc<str>>) {
    let mut resp = Response::new(stored.body.clone());
    *resp.status_mut() = stored.status;
    *resp.headers_mut() = stored.header_map();
    let pool = resp
        .headers()
        .get(X_ROUTER_ROUTE)
        .and_then(|v| v.to_str().ok())
        .map(Arc::<str>::from);
    (resp, pool)
}

/// The tokens a whole JSON answer says it used (OpenAI's
/// `prompt_tokens`/`completion_tokens`, Anthropic's
/// `input_tokens`/`output_tokens`).
struct SavedUsage {
    prompt: Option<u64>,
    output: Option<u64>,
}

/// The tokens a complete stream reported (its last usage; none when it
/// reported none, e.g. OpenAI without `stream_options.include_usage`).
fn streamed_usage(dialect: Dialect, body: &[u8]) -> Option<SavedUsage> {
    let answer = router_dialect::stream::collect_answer(dialect, body).ok()?;
    let u = answer.usage;
    (u.prompt() > 0 || u.output > 0).then_some(SavedUsage {
        prompt: Some(u.prompt()),
        output: Some(u.output),
    })
}

fn saved_usage(body: &[u8]) -> Option<SavedUsage> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let u = v.get("usage")?;
    let field = |names: [&str; 2]| names.iter().find_map(|n| u.get(*n)?.as_u64());
    Some(SavedUsage {
        prompt: field(["prompt_tokens", "input_tokens"]),
        output: field(["completion_tokens", "output_tokens"]),
    })
}

/// A header value for a small count, without an allocation below 10.
fn count_header(n: usize) -> HeaderValue {
    const SMALL: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match SMALL.get(n) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_headers_with_or_without_the_table() {
        assert_eq!(count_header(0), "0");
        assert_eq!(count_header(9), "9");
        assert_eq!(count_header(10), "10");
        assert_eq!(count_header(123), "123");
    }

    #[test]
    fn router_headers_carry_the_id_route_attempts_and_version() {
        let record = RouteRecord {
            line: LogLine {
                request_id: "generated-1".into(),
                ..LogLine::default()
            },
            ..RouteRecord::default()
        };
        let mut resp = Response::new(());
        set_router_headers(
            &mut resp,
            &record,
            None,
            Some(HeaderValue::from_static("primary")),
            Some(&HeaderValue::from_static("v7")),
            2,
        );
        let h = resp.headers();
        assert_eq!(h[X_REQUEST_ID], "generated-1");
        assert_eq!(h[X_ROUTER_ROUTE], "primary");
        assert_eq!(h[X_ROUTER_ATTEMPTS], "2");
        assert_eq!(h[X_ROUTER_CONFIG_VERSION], "v7");
        // The client's own id header wins over the record's text.
        let mut resp = Response::new(());
        let id = HeaderValue::from_static("client-id");
        set_router_headers(&mut resp, &record, Some(&id), None, None, 0);
        assert_eq!(resp.headers()[X_REQUEST_ID], "client-id");
        assert!(resp.headers().get(X_ROUTER_ROUTE).is_none());
    }
}
