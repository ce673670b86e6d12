//! Phases 1 and 2 of a request's arrival (see [`super::ingress`]): its
//! path put in normal form, the headers the router reads (the request id,
//! deadline, risk and a parked task's run mark: an [`Arrival`]), and its
//! body, read whole within its size limit, its timeout and the proxy's cap
//! on buffered request bytes.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::HeaderValue;
use http::Request;
use hyper::body::Incoming;
use router_policy::Risk;
use tokio::time::Instant;

use super::answer::Pending;
use crate::config::Snapshot;
use crate::error::ProxyError;
use crate::forward::{self, ReadWholeError};
use crate::limits::Reservation;
use crate::request_headers::RequestHeaders;
use crate::Shared;

/// The longest deadline a client may ask for.
const MAX_DEADLINE_MS: u64 = 24 * 3600 * 1000;

/// Phase 1: what the request's headers say (beside the headers the
/// router reads, found in one pass: [`RequestHeaders`]).
pub(super) struct Arrival {
    /// This proxy's own run of a parked task (see `crate::tasks`).
    pub(super) task_run: Option<crate::tasks::TaskRun>,
    /// `X-Router-Deadline-Ms`.
    pub(super) header_deadline: Option<Duration>,
    /// `X-Router-Risk`, else the policy's default.
    pub(super) risk: Risk,
}

/// Reads the request id, deadline, risk and task-run headers, and notes
/// them in the record.
pub(super) fn arrive(
    shared: &Shared,
    snapshot: &Snapshot,
    req: &Request<Incoming>,
    seen: &RequestHeaders,
    pending: &mut Pending,
) -> Result<Arrival, ProxyError> {
    let task_run = if seen.router_headers {
        shared.tasks.run_of(req.headers())
    } else {
        None
    };
    if let Some(run) = &task_run {
        pending.rec().parked_task = Some(run.id.clone());
    }
    let (id, header) = request_id(seen, pending.rec().offered_at.0)?;
    pending.id_header = header;
    pending.rec().request_id = id;
    let header_deadline = deadline_header(seen.deadline_ms.as_ref())?;
    let risk = match &seen.risk {
        None => snapshot.policy.default_risk,
        Some(v) => v.to_str().ok().and_then(Risk::parse).ok_or_else(|| {
            ProxyError::InvalidRequest(
                "X-Router-Risk must be READ, DRAFT, SEND or DESTRUCTIVE".into(),
            )
        })?,
    };
    pending.rec().risk = Some(risk);
    Ok(Arrival {
        task_run,
        header_deadline,
        risk,
    })
}

/// Puts the request's path in normal form (see
/// `router_policy::request_path`), keeping its query; a path that cannot
/// be normalized is a 400.
pub(super) fn normalize_path(req: &mut Request<Incoming>) -> Result<(), ProxyError> {
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

pub(super) const OVERLOADED: ProxyError = ProxyError::Overloaded {
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
