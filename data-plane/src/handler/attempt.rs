//! One attempt on one pool: queue for a lease, send, read the answer's
//! head (and, for a JSON answer, its whole body), and say how it ended.
//!
//! The attempt is bounded by its deadline from the first step: the queue
//! wait, the connection, the answer head and a buffered body all count.
//! Each ending records the endpoint's latency sample exactly once (a
//! success, a failure, a timeout at its timeout, a 429 with its
//! `Retry-After`), and is classified as an [`Outcome`] here, where the
//! answer is seen; what follows is [`router_policy::next_step`]'s call.
//!
//! On a timeout, dropping the request future closes the upstream
//! connection: the backend can stop generating.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Response, StatusCode};
use router_policy::Outcome;
use tokio::time::Instant;

use super::chain::Exchange;
use super::spans;
use crate::forward;
use crate::pool::{Lease, PoolRuntime, Sample, Shed, MAX_RETRY_AFTER};
use crate::route_log::AttemptRecord;
use crate::upstream::UpstreamBody;

/// JSON answers up to this size are read whole before they are passed on
/// (so a malformed one can fail over and a complete one can be replayed).
const BUFFERED_ANSWER_LIMIT: usize = 16 * 1024 * 1024;

/// What the chain walk gives an attempt.
pub(super) struct Attempt<'a> {
    /// The pool to try.
    pub(super) pool: &'a Arc<PoolRuntime>,
    /// The walk's clock reading when it planned this attempt (reused as the
    /// send time when there is no queue wait).
    pub(super) planned_at: Instant,
    /// When the attempt must have its answer (queue wait included).
    pub(super) deadline: Option<Instant>,
    /// The attempt's timeout (for the record and the span).
    pub(super) timeout: Option<Duration>,
    /// The request headers to send (the pool's key and `Host` are added).
    pub(super) headers: HeaderMap,
}

/// How one attempt ended.
pub(super) enum AttemptEnd {
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
    /// Failed (`record.outcome` says how); `held` is the backend's failure
    /// answer, if it gave one.
    Failed {
        record: AttemptRecord,
        held: Option<Held>,
    },
    /// The pool shed the request before it was sent.
    Shed(Shed),
}

/// A failure answer kept in case no later pool answers.
pub(super) enum Held {
    Stream(Response<UpstreamBody>, Lease, Instant),
    Whole(http::response::Parts, Bytes),
}

impl Exchange {
    /// One attempt, bounded by its deadline (queue wait included).
    ///
    /// With tracing off this is [`Exchange::attempt_untraced`] itself; with
    /// it on, that wrapped in a client span, boxed (its span bookkeeping
    /// would otherwise make every request's future larger).
    pub(super) fn attempt<'a>(
        &'a self,
        attempt: Attempt<'a>,
    ) -> impl std::future::Future<Output = AttemptEnd> + 'a {
        use futures_util::future::Either;
        match &self.otel {
            None => Either::Left(self.attempt_untraced(attempt, None)),
            Some(parent) => Either::Right(Box::pin(spans::traced_attempt(self, parent, attempt))),
        }
    }

    /// One attempt, untraced (`otel`: the client span's context to send
    /// upstream, when traced). An `async move` block, like
    /// [`super::handle`], so that its arguments are kept once.
    #[allow(clippy::manual_async_fn)] // on purpose: see `handle`
    pub(super) fn attempt_untraced<'a>(
        &'a self,
        attempt: Attempt<'a>,
        otel: Option<&'a opentelemetry::Context>,
    ) -> impl std::future::Future<Output = AttemptEnd> + 'a {
        async move {
            let Attempt {
                pool,
                planned_at: now,
                deadline,
                timeout,
                headers,
            } = attempt;
            let shape = crate::pool::RequestShape {
                prefix_key: pool.prefix_key(&self.body),
                input_tokens: self.estimated_input_tokens,
            };
            let lease = match pool.acquire_at(deadline, now, shape).await {
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
                outcome: Outcome::Ok,
                status: None,
                latency_ms: 0.0,
                queue_wait_ms: super::ms(lease.queue_wait()),
                timeout_ms: timeout.map(super::millis),
                ..AttemptRecord::default()
            };
            let upstream = match self.upstream_request(&lease, pool.name(), headers) {
                Ok(mut r) => {
                    if let Some(cx) = otel {
                        crate::telemetry::inject(cx, r.headers_mut());
                    }
                    r
                }
                Err(e) => {
                    // Never sent: another pool's endpoint may work.
                    record.outcome = Outcome::InvalidRequest;
                    return AttemptEnd::Failed {
                        record: AttemptRecord {
                            endpoint: e.to_string().into(),
                            ..record
                        },
                        held: None,
                    };
                }
            };
            let sent = self.client.send(lease.target().map(|t| t.key()), upstream);
            // One timer for the whole attempt (answer head, then a JSON
            // body): registered once, not once per wait.
            let expiry = deadline.map(tokio::time::sleep_until);
            tokio::pin!(expiry);
            // The answer's head, in a block of its own: what it binds is not
            // kept (in the future's state) while the body is read.
            let (head, incoming) = {
                let resp = match within(expiry.as_mut(), sent).await {
                    None => return timed_out(&lease, record, started),
                    Some(Ok(r)) => r,
                    Some(Err(e)) => {
                        let waited = started.elapsed();
                        lease.observe(Sample::Failure(waited));
                        record.outcome = if e.is_connect() {
                            Outcome::ConnectError
                        } else {
                            Outcome::UpstreamError
                        };
                        record.latency_ms = super::ms(waited);
                        return AttemptEnd::Failed { record, held: None };
                    }
                };
                let status = resp.status();
                record.status = Some(status.as_u16());
                let failure = if status == StatusCode::TOO_MANY_REQUESTS {
                    Some(Outcome::Status429)
                } else if status.is_server_error() {
                    Some(Outcome::Status5xx)
                } else {
                    None
                };
                if let Some(outcome) = failure {
                    let waited = started.elapsed();
                    if outcome == Outcome::Status429 {
                        let retry_after = resp
                            .headers()
                            .get(header::RETRY_AFTER)
                            .and_then(retry_after);
                        lease.observe(Sample::RateLimited(waited, retry_after));
                    } else {
                        lease.observe(Sample::Failure(waited));
                    }
                    record.outcome = outcome;
                    record.latency_ms = super::ms(waited);
                    return AttemptEnd::Failed {
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
            let Some(body) = within(expiry.as_mut(), read).await else {
                return timed_out(&lease, record, started);
            };
            let answered = Instant::now();
            let waited = answered.saturating_duration_since(started);
            record.latency_ms = super::ms(waited);
            let body = match body {
                Ok(b) => b,
                Err(_) => {
                    lease.observe(Sample::Failure(waited));
                    record.outcome = Outcome::UpstreamError;
                    return AttemptEnd::Failed { record, held: None };
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
                    pool.mark_structured_degraded(crate::clock::later(
                        Instant::now(),
                        self.snapshot.policy.structured_degrade,
                        crate::clock::A_YEAR,
                    ));
                    tracing::info!(pool = pool.name(), %why, "malformed structured output; pool degraded for structured requests");
                }
                record.outcome = Outcome::MalformedJson;
                return AttemptEnd::Failed {
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
            if let (Some(i), Some(o)) = (record.tokens_in, record.tokens_out) {
                lease.observe_tokens(crate::pool::TokenSample::Whole {
                    took: waited,
                    input_tokens: i,
                    output_tokens: o,
                });
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
}

/// A `Retry-After` in seconds, at most [`MAX_RETRY_AFTER`] (an hour: the
/// value is the backend's, and a huge one must neither overflow the clock
/// nor shut an endpoint out for good). An HTTP date is not read.
fn retry_after(value: &http::HeaderValue) -> Option<Duration> {
    let secs = value.to_str().ok()?.trim().parse::<u64>().ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Runs `work` until `expiry` (if any) fires; `None` when it came first.
/// The attempt's one timer is shared by its waits: `expiry` is borrowed,
/// not made per wait (each `tokio::time::timeout` registers a timer of its
/// own).
async fn within<F: std::future::Future>(
    expiry: std::pin::Pin<&mut Option<tokio::time::Sleep>>,
    work: F,
) -> Option<F::Output> {
    match expiry.as_pin_mut() {
        None => Some(work.await),
        Some(sleep) => tokio::select! {
            biased;
            out = work => Some(out),
            () = sleep => None,
        },
    }
}

/// The attempt ran out of time: a slow sample, and a retryable failure.
fn timed_out(lease: &Lease, mut record: AttemptRecord, started: Instant) -> AttemptEnd {
    let waited = started.elapsed();
    lease.observe(Sample::Timeout(waited));
    record.outcome = Outcome::Timeout;
    record.latency_ms = super::ms(waited);
    AttemptEnd::Failed { record, held: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_capped_at_an_hour() {
        let v = |s: &'static str| http::HeaderValue::from_static(s);
        assert_eq!(retry_after(&v(" 2 ")), Some(Duration::from_secs(2)));
        assert_eq!(retry_after(&v("3600")), Some(MAX_RETRY_AFTER));
        assert_eq!(
            retry_after(&v("18446744073709551615")),
            Some(MAX_RETRY_AFTER)
        );
        for ignored in [
            "",
            "-1",
            "1.5",
            "Wed, 21 Oct 2015 07:28:00 GMT",
            "99999999999999999999",
        ] {
            assert_eq!(retry_after(&v(ignored)), None, "{ignored}");
        }
    }
}
