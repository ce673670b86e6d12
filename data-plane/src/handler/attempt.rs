//! One attempt on one pool: queue for a lease, send, read the answer's
//! head (and, for a JSON answer, its whole body), and say how it ended.
//!
//! The attempt is bounded by its deadline from the first step: the queue
//! wait, the connection, the answer head and a buffered body all count.
//! Each ending is named here, where the answer is seen, as an
//! [`AttemptEnding`]; which [`Outcome`] that is and which latency sample
//! it feeds (a success, a failure, a timeout at its timeout, a 429 with
//! its `Retry-After`) is the policy crate's rule, applied once per
//! attempt by `ended`. What follows is [`router_policy::walk`]'s call.
//!
//! On a timeout, dropping the request future closes the upstream
//! connection: the backend can stop generating.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::Response;
use router_policy::{AttemptEnding, Outcome};
use tokio::time::Instant;

use super::chain::Exchange;
use super::spans;
use crate::forward;
use crate::pool::{EndpointHandle, Lease, PoolRuntime, Sample, Shed, MAX_RETRY_AFTER};
use crate::route_log::AttemptRecord;
use crate::tracked_body::StreamWatch;
use crate::upstream::UpstreamBody;

/// JSON answers up to this size are read whole before they are passed on
/// (so a malformed one can fail over and a complete one can be replayed).
const BUFFERED_ANSWER_LIMIT: usize = 16 * 1024 * 1024;

/// A translated request's failure answer (a 429 or 5xx) is kept up to
/// this size, to be passed on in the client's dialect.
const HELD_ERROR_LIMIT: usize = 64 * 1024;

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
    /// Longest wait for a stream's first content (pool's, else route's).
    pub(super) first_token: Option<Duration>,
    /// Longest silence in a stream after its first token.
    pub(super) stall: Option<Duration>,
    /// A hedged attempt tells here how far it got (so that it can be
    /// recorded and sampled if it is cancelled).
    pub(super) progress: Option<&'a AttemptProgress>,
    /// Take an endpoint none of these, at once or not at all (a hedge or
    /// a retry inside the same pool).
    pub(super) avoid: Option<&'a [u64]>,
}

/// How far an attempt got: its lease, once it has one.
#[derive(Default)]
pub(super) struct AttemptProgress(std::sync::Mutex<Option<Leased>>);

/// An attempt's endpoint and when it was sent.
#[derive(Clone)]
pub(super) struct Leased {
    pub(super) endpoint: Arc<str>,
    pub(super) handle: EndpointHandle,
    pub(super) started: Instant,
    pub(super) queue_wait_ms: f64,
}

impl AttemptProgress {
    fn set(&self, leased: Leased) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(leased);
    }

    /// The attempt's endpoint and start, once it has a lease.
    pub(super) fn get(&self) -> Option<Leased> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How one attempt ended.
pub(super) enum AttemptEnd {
    /// A streamed answer to pass on.
    Stream {
        resp: Response<UpstreamBody>,
        lease: Lease,
        started: Instant,
        record: AttemptRecord,
        /// What was read of it (up to the first token) and how to watch
        /// the rest (boxed: only streams pay for it, and every attempt's
        /// end is moved a few times).
        watch: Box<StreamWatch>,
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
                first_token,
                stall,
                progress,
                avoid,
            } = attempt;
            let shape = crate::pool::RequestShape {
                prefix: pool.prefix_request(&self.body),
                session_key: pool.session_key(&headers),
                input_tokens: self.estimated_input_tokens,
                tenant: self.tenant_key,
                quota: self.quota_estimate(),
            };
            let acquired = match avoid {
                None => pool.acquire_at(deadline, now, shape).await,
                Some(ids) => pool
                    .try_acquire_avoiding(ids, now, shape)
                    .ok_or(Shed::NoBackend),
            };
            let lease = match acquired {
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
            if let Some(p) = progress {
                p.set(Leased {
                    endpoint: Arc::clone(lease.addr()),
                    handle: lease.endpoint_handle(),
                    started,
                    queue_wait_ms: super::ms(lease.queue_wait()),
                });
            }
            let mut record = AttemptRecord {
                pool: Arc::clone(pool.shared_name()),
                endpoint: Arc::clone(lease.addr()),
                outcome: Outcome::Ok,
                status: None,
                latency_ms: 0.0,
                queue_wait_ms: super::ms(lease.queue_wait()),
                timeout_ms: timeout.map(super::millis),
                affinity: lease.session().map(|s| s.as_str()),
                prefix: lease.prefix().map(|p| crate::route_log::PrefixRecord {
                    placement: p.placement,
                    blocks: p.blocks,
                    matched: p.matched,
                    ttft_ms: p.ttft_ms,
                    runner_up: p.runner_up.as_ref().map(|r| Arc::clone(&r.0)),
                    runner_up_matched: p.runner_up.as_ref().map(|r| r.1),
                    runner_up_ttft_ms: p.runner_up.as_ref().map(|r| r.2),
                }),
                // A request of another dialect (or to a pool of one): the
                // dialect this attempt spoke.
                dialect: self.translation.as_ref().map(|_| {
                    super::dialect::pool_dialect(self.snapshot.policy.pool(pool.name())).as_str()
                }),
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
                    record.outcome = AttemptEnding::NotSent.outcome();
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
            let (mut head, incoming) = {
                let resp = match within(expiry.as_mut(), sent).await {
                    None => return timed_out(&lease, record, started),
                    Some(Ok(r)) => r,
                    Some(Err(e)) => {
                        let waited = started.elapsed();
                        let ending = AttemptEnding::of_send_error(e.is_connect());
                        ended(&lease, &mut record, ending, waited, None);
                        return AttemptEnd::Failed { record, held: None };
                    }
                };
                let status = resp.status();
                record.status = Some(status.as_u16());
                // What the provider says is left of this key's quota, on
                // every answer (2xx and 429 alike).
                lease.observe_quota(
                    resp.headers(),
                    status == http::StatusCode::TOO_MANY_REQUESTS,
                );
                record.upstream_request_id = super::answer::upstream_request_id(resp.headers())
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into());
                if let Some(ending) = AttemptEnding::of_status(status.as_u16()) {
                    let waited = started.elapsed();
                    let retry_after = resp
                        .headers()
                        .get(header::RETRY_AFTER)
                        .and_then(retry_after);
                    ended(&lease, &mut record, ending, waited, retry_after);
                    if self.translated_from(pool.name()).is_some() {
                        // Kept whole, to be passed on in the client's
                        // dialect if no later pool answers (the slot is
                        // given back now). Boxed: this rare wait stays
                        // out of every attempt's future.
                        let (head, incoming) = resp.into_parts();
                        let body = Box::pin(read_held(incoming, deadline)).await;
                        return AttemptEnd::Failed {
                            record,
                            held: Some(Held::Whole(head, body)),
                        };
                    }
                    return AttemptEnd::Failed {
                        record,
                        held: Some(Held::Stream(resp, lease, started)),
                    };
                }
                if !self.should_buffer(&resp) {
                    let sse = is_sse(resp.headers());
                    let strip_usage = sse && self.router_asks_usage(pool.name());
                    if !sse && first_token.is_none() {
                        // Nothing to wait for: passed on from its head.
                        let watch = Box::new(StreamWatch {
                            stall,
                            ..StreamWatch::default()
                        });
                        return AttemptEnd::Stream {
                            resp,
                            lease,
                            started,
                            record,
                            watch,
                        };
                    }
                    // Held until its first token (see `first_token`).
                    let (head, mut body) = resp.into_parts();
                    let token_by =
                        first_token.map(|t| crate::clock::later(started, t, crate::clock::A_YEAR));
                    let limit = match (deadline, token_by) {
                        (Some(d), Some(t)) => Some(d.min(t)),
                        (d, t) => d.or(t),
                    };
                    // Boxed, with its timer: its state stays out of every
                    // attempt's future (which JSON answers move around).
                    let start = Box::pin(first_token::read_until(&mut body, sse, limit)).await;
                    let waited = started.elapsed();
                    record.latency_ms = super::ms(waited);
                    let failed = match start {
                        Some(first_token::Start::Content {
                            prefix,
                            scanner,
                            ended,
                        }) => {
                            let watch = Box::new(StreamWatch {
                                scanner,
                                prefix,
                                ended,
                                stall,
                                strip_usage,
                                ..StreamWatch::default()
                            });
                            return AttemptEnd::Stream {
                                resp: Response::from_parts(head, body),
                                lease,
                                started,
                                record,
                                watch,
                            };
                        }
                        // The first token's limit came first, not the deadline.
                        None if token_by.is_some() && token_by == limit => {
                            AttemptEnding::FirstTokenLate
                        }
                        None => return timed_out(&lease, record, started),
                        Some(first_token::Start::Failed(outcome)) => outcome,
                    };
                    // Nothing reached the client: a failed attempt, its
                    // upstream cancelled (the body dropped).
                    drop(body);
                    // A late first token is a timeout (its wait counts in
                    // the pool's p95); an error a failure.
                    ended(&lease, &mut record, failed, waited, None);
                    if matches!(
                        failed,
                        AttemptEnding::FirstTokenLate | AttemptEnding::ErrorInStream
                    ) {
                        self.shared
                            .metrics
                            .stream_event(pool.name(), record.outcome.as_str());
                    }
                    return AttemptEnd::Failed { record, held: None };
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
            let mut body = match body {
                Ok(b) => b,
                Err(_) => {
                    ended(&lease, &mut record, AttemptEnding::Broken, waited, None);
                    return AttemptEnd::Failed { record, held: None };
                }
            };
            let mut answer = router_json_peek::peek_answer(&body);
            if let (Ok(a), Some((_, router_dialect::Dialect::Gemini))) =
                (&mut answer, self.translated_from(pool.name()))
            {
                // Gemini's usage has a shape of its own (`usageMetadata`).
                a.usage = super::dialect::gemini_usage(&body);
            }
            let structured_ok = match (&self.structured, head.status.is_success()) {
                (Some(expected), true) => router_policy::structured::check(&body, expected),
                _ => Ok(()),
            };
            // The answer's usage, normalized once: believable counts only
            // (absurd ones are neither logged nor counted; the charge then
            // keeps the reservation).
            let usage = answer
                .as_ref()
                .ok()
                .and_then(|a| a.usage.as_ref())
                .map(reported)
                .filter(|u| {
                    u.reported() && router_policy::tenant::plausible_usage(u.prompt(), u.output())
                });
            let tokens = usage.map(|u| u.tokens(self.estimated_input_tokens));
            let cost = tokens.and_then(|t| {
                self.snapshot
                    .policy
                    .pool(pool.name())
                    .map(|p| p.price.cost_of(&t))
            });
            if head.status.is_success() {
                // Generated, whether or not it is passed on: paid for.
                record.generated = match tokens {
                    Some(t) => router_policy::tenant::Charge::reported(
                        router_policy::tenant::micros(cost.unwrap_or(0.0)),
                        t.total(),
                    ),
                    None => router_policy::tenant::Charge::unreadable(),
                };
            }
            if head.status.is_success() && (answer.is_err() || structured_ok.is_err()) {
                // A body that is not JSON is the endpoint's failure; JSON
                // that is not the structure asked for is the structured
                // degrade's business (one tenant's prompts must not open
                // the circuit for all), and the endpoint did answer.
                let ending = if answer.is_err() {
                    AttemptEnding::NotJson
                } else {
                    AttemptEnding::OffSchema
                };
                ended(&lease, &mut record, ending, waited, None);
                if let Err(why) = &structured_ok {
                    // Degraded on the backend's pattern, never on one
                    // request (nor on one its own cap explains).
                    let done = usage.and_then(|u| u.output());
                    let explained =
                        router_policy::structured::explained_by_request(self.output_cap, done);
                    let degraded = pool.note_structured_failure(
                        self.snapshot.policy.structured_degrade,
                        self.tenant_key,
                        explained,
                        self.snapshot.policy.tenants.is_some(),
                    );
                    if degraded {
                        tracing::info!(pool = pool.name(), %why, "malformed structured output from several requests; pool degraded for structured requests");
                    }
                }
                return AttemptEnd::Failed {
                    record,
                    held: Some(Held::Whole(head, body)),
                };
            }
            if let Ok(a) = &mut answer {
                record.response_model = a.model.take();
            }
            if let (Some(usage), Some(tokens)) = (usage, tokens) {
                let tokens_in = usage.prompt();
                record.tokens_in = tokens_in;
                record.tokens_out = usage.output();
                record.cache_read_tokens = tokens_in.map(|_| tokens.cache_read);
                record.cache_write_tokens = tokens_in.map(|_| tokens.cache_write);
                record.cost_usd = cost;
            }
            if let (Some(i), Some(o)) = (record.tokens_in, record.tokens_out) {
                // Per token computed: a prompt cache's tokens cost no
                // prefill.
                let computed = i.saturating_sub(record.cache_read_tokens.unwrap_or(0));
                lease.observe_tokens(crate::pool::TokenSample::Whole {
                    took: waited,
                    input_tokens: computed.max(1),
                    output_tokens: o,
                });
            }
            if let Some((t, from)) = self.translated_from(pool.name()) {
                // The client's dialect: an answer that cannot be written
                // in it fails over as a malformed one (the endpoint did
                // answer).
                if head.status.is_success() {
                    match t.answer(from, &mut head, &body) {
                        Ok(b) => body = b,
                        Err(why) => {
                            tracing::debug!(pool = pool.name(), %why, "an answer the client's dialect cannot take");
                            let ending = AttemptEnding::Untranslatable;
                            ended(&lease, &mut record, ending, waited, None);
                            return AttemptEnd::Failed {
                                record,
                                held: Some(Held::Whole(head, body)),
                            };
                        }
                    }
                } else {
                    body = t.error(&mut head, &body);
                }
            }
            lease.finish(Sample::Success(waited), answered);
            AttemptEnd::Whole { head, body, record }
        }
    }

    /// Non-streaming OpenAI-style calls with a JSON answer of known,
    /// modest size are read whole.
    /// A translated request's JSON answer is read whole even when a
    /// stream was asked for (an error, or a pool that ignored `stream`):
    /// it is translated whole.
    fn should_buffer(&self, resp: &Response<UpstreamBody>) -> bool {
        if !self.json_call || (self.streaming && self.translation.is_none()) {
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

/// A `text/event-stream` answer.
pub(super) fn is_sse(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"))
}

/// Reading a streamed answer up to its first token.
///
/// The answer's head is held until then, so that nothing has reached the
/// client when the attempt fails: a stream that sends an error event (or
/// what is not an event) before any content fails over like a 5xx, and
/// one whose first token does not come within `first_token_timeout` like
/// a timeout. What was read is kept, in order, for the client.
mod first_token {
    use http_body_util::BodyExt;
    use router_policy::stream::{RawEvent, SseEvent, SseScanner};
    use router_policy::AttemptEnding;

    use crate::upstream::UpstreamBody;

    /// Bytes held before the first token at most: past this, the stream
    /// is passed on as it is (a backend sending a long preamble is not a
    /// failure).
    const MAX_HELD: usize = 64 * 1024;

    /// How the start of a stream went.
    pub(super) enum Start {
        /// Its first token came (or the stream ended, or its preamble
        /// outgrew [`MAX_HELD`]): pass it on, `prefix` first.
        Content {
            prefix: Vec<RawEvent>,
            scanner: Option<SseScanner>,
            ended: bool,
        },
        /// A failed attempt: an error in the stream, or a broken body.
        Failed(AttemptEnding),
    }

    /// [`read`] until `limit`; `None` when the limit came first.
    pub(super) async fn read_until(
        body: &mut UpstreamBody,
        sse: bool,
        limit: Option<tokio::time::Instant>,
    ) -> Option<Start> {
        match limit {
            None => Some(read(body, sse).await),
            Some(at) => tokio::time::timeout_at(at, read(body, sse)).await.ok(),
        }
    }

    /// Reads `body` up to its first token (`sse`: as server-sent events;
    /// otherwise the first bytes are the first token).
    async fn read(body: &mut UpstreamBody, sse: bool) -> Start {
        let mut scanner = sse.then(SseScanner::new);
        let mut prefix = Vec::new();
        let mut held = 0usize;
        let mut events = Vec::new();
        loop {
            let data = match body.frame().await {
                None => {
                    return Start::Content {
                        prefix,
                        scanner,
                        ended: true,
                    }
                }
                Some(Err(_)) => return Start::Failed(AttemptEnding::Broken),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(d) if !d.is_empty() => d,
                    // Trailers or an empty frame: nothing to learn.
                    _ => continue,
                },
            };
            let ended = http_body::Body::is_end_stream(body);
            let Some(s) = scanner.as_mut() else {
                prefix.push(RawEvent {
                    bytes: data,
                    kind: SseEvent::Content { usage: None },
                });
                return Start::Content {
                    prefix,
                    scanner,
                    ended,
                };
            };
            if s.feed(&data, &mut events).is_err() {
                return Start::Failed(AttemptEnding::ErrorInStream);
            }
            held += data.len();
            let mut content = false;
            for ev in events.drain(..) {
                match ev.kind {
                    SseEvent::Error { .. } | SseEvent::Malformed => {
                        return Start::Failed(AttemptEnding::ErrorInStream)
                    }
                    SseEvent::Content { .. } => content = true,
                    _ => {}
                }
                prefix.push(ev);
            }
            if content || ended || held > MAX_HELD {
                return Start::Content {
                    prefix,
                    scanner,
                    ended,
                };
            }
        }
    }
}

/// A `Retry-After` in seconds, at most [`MAX_RETRY_AFTER`] (an hour: the
/// value is the backend's, and a huge one must neither overflow the clock
/// nor shut an endpoint out for good). An HTTP date is not read.
fn retry_after(value: &http::HeaderValue) -> Option<Duration> {
    let secs = value.to_str().ok()?.trim().parse::<u64>().ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// A failure answer's body, read whole up to [`HELD_ERROR_LIMIT`] bytes
/// until `deadline` (empty when it is larger, broken or late).
async fn read_held(incoming: UpstreamBody, deadline: Option<Instant>) -> Bytes {
    let read = forward::read_whole(incoming, HELD_ERROR_LIMIT);
    let body = match deadline {
        Some(d) => tokio::time::timeout_at(d, read).await.ok(),
        None => Some(read.await),
    };
    body.and_then(Result::ok).unwrap_or_default()
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
    ended(
        lease,
        &mut record,
        AttemptEnding::TimedOut,
        started.elapsed(),
        None,
    );
    AttemptEnd::Failed { record, held: None }
}

/// An attempt ended as `ending` after `waited`: its outcome and latency in
/// the record, its sample for the endpoint (the classification is
/// [`AttemptEnding`]'s).
fn ended(
    lease: &Lease,
    record: &mut AttemptRecord,
    ending: AttemptEnding,
    waited: Duration,
    retry_after: Option<Duration>,
) {
    if let Some(kind) = ending.sample() {
        lease.observe(Sample::of(kind, waited, retry_after));
    }
    record.outcome = ending.outcome();
    record.latency_ms = super::ms(waited);
}

/// An answer's usage fields, as the router's usage rules take them
/// (`router_policy::usage`: which counts hold which).
pub(super) fn reported(u: &router_json_peek::Usage) -> router_policy::usage::ReportedUsage {
    router_policy::usage::ReportedUsage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cached_tokens: u
            .prompt_tokens_details
            .or(u.input_tokens_details)
            .and_then(|d| d.cached_tokens),
        cache_read_input_tokens: u.cache_read_input_tokens,
        cache_creation_input_tokens: u.cache_creation_input_tokens,
    }
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
