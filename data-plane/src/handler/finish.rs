//! The end of every request: one route record queued for the log, one
//! `router_requests_total` sample, usage and fallback counters, and the
//! server span ended. Reached exactly once per request, from one of:
//!
//! - an answer made at once ([`super::answer`]'s `reject`, `replay`,
//!   `commit_whole`);
//! - a streamed answer's end ([`Finisher`], run by `TrackedBody` when the
//!   body completes, breaks, is cut at the deadline, or the client leaves);
//! - a client that went away before any answer (`Pending`'s `Drop`:
//!   `client_cancelled`, logged with nginx's status 499).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use router_policy::idempotency::Ending;
use router_policy::stream::StreamUsage;
use router_policy::tenant::Charge;
use router_policy::{Outcome, Price};
use tokio::time::Instant;

use super::answer::Pending;
use super::{ms, spans};
use crate::idempotency::{KeyLease, StoredAnswer};
use crate::pool::{Lease, Sample};
use crate::route_log::{AttemptRecord, RouteRecord, StreamRecord, UsageRecord};
use crate::tracked_body::{BodyEnd, Completion};
use crate::Shared;

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            let pool = self.pool.take().or_else(|| record.first_route.clone());
            // 499: nginx's "client closed request".
            finish_record(
                &self.shared,
                record,
                self.t0,
                Outcome::ClientCancelled,
                499,
                pool,
            );
        }
    }
}

/// Completes `record` (its outcome, status and elapsed time), counts it,
/// ends its span and queues it for the route log.
pub(super) fn finish_record(
    shared: &Shared,
    mut record: Box<RouteRecord>,
    t0: Instant,
    outcome: Outcome,
    status: u16,
    pool: Option<Arc<str>>,
) {
    let elapsed = t0.elapsed();
    record.elapsed_ms = ms(elapsed);
    record.outcome = outcome;
    record.status = status;
    record.first_outcome.get_or_insert(outcome);
    // A fallback: more than one attempt, or a walk that began past the
    // route's first pool (passed over as down: RouterFallbackSpike sees a
    // dead primary too).
    let from = match (&record.primary_passed_over, record.attempts.len() > 1) {
        (Some(primary), _) => Some(&**primary),
        (None, true) => record.first_route.as_deref(),
        (None, false) => None,
    };
    if let Some(from) = from {
        shared.metrics.fallback(from, pool.as_deref().unwrap_or(""));
    }
    let pool = pool.as_deref().unwrap_or_default();
    shared.metrics.request_done(
        record.route.as_deref().unwrap_or_default(),
        pool,
        outcome,
        elapsed.as_secs_f64(),
    );
    // A ramped split's sides: each attempt on one of them counted for the
    // control plane (nothing but one flag read without a ramp). The last
    // attempt of a stream that broke after its head counts as the stream
    // ended.
    if shared.config.ramped() {
        tally_ramp_sides(shared, &record, outcome);
    }
    // Every attempt that generated is paid for, whichever answered.
    // (A few additions: one per attempt.)
    let charge = record
        .attempts
        .iter()
        .fold(Charge::default(), |sum, a| sum.plus(a.generated));
    if let Some(t) = &record.tenant {
        shared.metrics.tenant_request(t, outcome);
        shared.metrics.tenant_cost(t, charge.spend(0));
        // Its hour's rollup in the shared store: queued, never awaited
        // (`router_shared_state::rollup`).
        if let Some(rollups) = &shared.rollups {
            rollups.record(router_shared_state::rollup::Settled {
                tenant: Arc::clone(t),
                at_unix_secs: super::ingress::unix_seconds(record.offered_at.0),
                tokens: charge.tokens(0),
                micros: charge.spend(0),
                failed: outcome != Outcome::Ok,
            });
        }
    }
    if let Some(holds) = record.tenant_holds.take() {
        super::tenancy::settle(shared, *holds, charge);
    }
    if let Some(cx) = record.otel.take() {
        spans::end_server_span(&cx, &record, pool);
    }
    if record.tokens_in.is_some() || record.tokens_out.is_some() {
        shared.metrics.usage(
            pool,
            router_policy::usage::Tokens {
                prompt: record.tokens_in.unwrap_or(0),
                output: record.tokens_out.unwrap_or(0),
                cache_read: record.cache_read_tokens.unwrap_or(0),
                cache_write: record.cache_write_tokens.unwrap_or(0),
            },
            record.cost_usd.unwrap_or(0.0),
        );
    }
    record.emit(&shared.route_log);
}

/// Adds `record`'s attempts to the tallies of the ramped (route, pool)s
/// they were on ([`crate::ramp_tally`]).
fn tally_ramp_sides(shared: &Shared, record: &RouteRecord, outcome: Outcome) {
    let Some(route) = record.route.as_deref() else {
        return;
    };
    let snapshot = shared.config.load();
    let last = record.attempts.len().saturating_sub(1);
    for (i, attempt) in record.attempts.iter().enumerate() {
        let Some(tally) = snapshot
            .ramp_sides
            .iter()
            .find(|t| *t.route == *route && t.pool == attempt.pool)
        else {
            continue;
        };
        let ended = if i == last
            && attempt.outcome == Outcome::Ok
            && router_policy::ramp::counts_as_error(outcome) == Some(true)
        {
            outcome
        } else {
            attempt.outcome
        };
        tally.note(ended, attempt.latency_ms);
    }
}

/// Runs when a streamed answer's body ends.
pub(super) struct Finisher {
    pub(super) shared: Arc<Shared>,
    pub(super) lease: Lease,
    pub(super) record: Box<RouteRecord>,
    pub(super) attempt: AttemptRecord,
    pub(super) t0: Instant,
    pub(super) started: Instant,
    pub(super) sample_on_first_byte: bool,
    pub(super) status: u16,
    /// A keyed request's lease and what is kept of its stream for replay.
    pub(super) keyed: Option<KeyedStream>,
    /// A watched (server-sent events) stream's tokens, usage and timing.
    pub(super) tally: Option<StreamTally>,
}

/// What a watched stream told of itself as it passed.
pub(super) struct StreamTally {
    content_events: u64,
    first_content: Option<Instant>,
    last_content: Option<Instant>,
    usage: Option<StreamUsage>,
    price: Option<Price>,
    /// The request's input tokens, estimated (for a stream cut before its
    /// usage came).
    input_estimate: u64,
}

impl StreamTally {
    pub(super) fn new(price: Option<Price>, input_estimate: u64) -> Self {
        Self {
            content_events: 0,
            first_content: None,
            last_content: None,
            usage: None,
            price,
            input_estimate,
        }
    }

    /// What the stream generated, for the tenant's settlement: its usage
    /// when it sent one that can be believed; when its client left before
    /// the usage came, what was relayed (the input estimate and one token
    /// per content event, never less); otherwise, content with no usage
    /// is unreadable (the reservation is kept).
    fn charge(&self, end: BodyEnd) -> Charge {
        let cost = |input: u64, output: u64| {
            self.price
                .map_or(0, |p| router_policy::tenant::micros(p.cost(input, output)))
        };
        if let Some(u) = self.usage {
            if u.reported() && router_policy::tenant::plausible_usage(u.prompt(), u.output()) {
                let mut tokens = u.tokens(self.input_estimate);
                if u.output().is_none() {
                    tokens.output = self.content_events;
                }
                let cost = self
                    .price
                    .map_or(0, |p| router_policy::tenant::micros(p.cost_of(&tokens)));
                return Charge::reported(cost, tokens.total());
            }
            return Charge::unreadable();
        }
        if self.content_events == 0 {
            return Charge::default();
        }
        match end {
            BodyEnd::ClientGone => {
                let (input, output) = (self.input_estimate, self.content_events);
                Charge::reported(cost(input, output), input.saturating_add(output))
            }
            _ => Charge::unreadable(),
        }
    }

    /// Time per output token: from the first content event to the last,
    /// over the tokens the usage reports (else one per content event,
    /// which is what engines send).
    fn tpot(&self) -> Option<std::time::Duration> {
        let (first, last) = (self.first_content?, self.last_content?);
        let tokens = self
            .usage
            .and_then(|u| u.output())
            .unwrap_or(self.content_events);
        router_policy::stream::time_per_output_token(last.saturating_duration_since(first), tokens)
    }

    /// Fills the record's usage, cost and stream summary.
    fn record(
        &self,
        record: &mut RouteRecord,
        attempt: &AttemptRecord,
    ) -> Option<std::time::Duration> {
        let tpot = self.tpot();
        if let Some(u) = self
            .usage
            .filter(|u| router_policy::tenant::plausible_usage(u.prompt(), u.output()))
        {
            let tokens = u.tokens(0);
            record.tokens_in = u.prompt();
            record.tokens_out = u.output();
            record.cache_read_tokens = u.prompt().map(|_| tokens.cache_read);
            record.cache_write_tokens = u.prompt().map(|_| tokens.cache_write);
            if let Some(price) = self.price {
                record.cost_usd = Some(price.cost_of(&tokens));
            }
        }
        record.stream = Some(StreamRecord {
            ttft_ms: attempt.latency_ms,
            tpot_ms: tpot.map(ms),
            content_events: self.content_events,
            usage: self.usage.map(|u| UsageRecord {
                input_tokens: u.prompt(),
                output_tokens: u.output(),
            }),
        });
        tpot
    }
}

/// A keyed request's stream, kept (up to the lease's cap) for the retry.
pub(super) struct KeyedStream {
    pub(super) lease: KeyLease,
    /// The answer's status and headers, as the client got them.
    pub(super) head: http::response::Parts,
    pub(super) frames: BytesMut,
    /// Bytes seen, kept or not.
    pub(super) seen: usize,
}

impl KeyedStream {
    /// Settles the lease for a stream that ended as `end` with `outcome`.
    fn settle(self, outcome: Outcome, end: BodyEnd, record: &RouteRecord) {
        let KeyedStream {
            lease,
            head,
            frames,
            seen,
        } = self;
        let complete = matches!(end, BodyEnd::Complete | BodyEnd::FinishedAfterClientLeft);
        let ending = Ending::Answered {
            outcome,
            bytes: seen,
            complete,
        };
        // Copied to its length: `frames` grew by doubling.
        let answer = (seen == frames.len())
            .then(|| StoredAnswer::keep(head.status, &head.headers, &frames, true));
        let route = super::route_summary(record);
        tokio::spawn(lease.settle(ending, answer, move || route));
    }
}

/// How a stream that began with `attempt_outcome` ended.
fn stream_outcome(attempt_outcome: Outcome, end: BodyEnd) -> Outcome {
    match end {
        BodyEnd::Complete => attempt_outcome,
        BodyEnd::UpstreamError => Outcome::UpstreamReset,
        BodyEnd::ClientGone | BodyEnd::FinishedAfterClientLeft => Outcome::ClientCancelled,
        BodyEnd::DeadlineCut => Outcome::DeadlineExhausted,
        BodyEnd::StreamError => Outcome::StreamError,
        BodyEnd::Stalled => Outcome::StreamStalled,
    }
}

impl Completion for Finisher {
    fn first_byte(&mut self) {
        let ttfb = self.started.elapsed();
        self.attempt.latency_ms = ms(ttfb);
        if self.sample_on_first_byte {
            self.lease.observe(Sample::Success(ttfb));
            self.lease.observe_first_token(ttfb);
        }
    }

    fn content(&mut self) {
        if let Some(t) = &mut self.tally {
            let now = Instant::now();
            t.content_events += 1;
            t.first_content.get_or_insert(now);
            t.last_content = Some(now);
        }
    }

    fn usage(&mut self, usage: StreamUsage) {
        if let Some(t) = &mut self.tally {
            // Merged: Anthropic's input comes in message_start, its
            // output (cumulative) in message_delta.
            t.usage = Some(t.usage.map_or(usage, |u| u.merge(usage)));
        }
    }

    fn data(&mut self, bytes: &Bytes) {
        if let Some(k) = &mut self.keyed {
            k.seen = k.seen.saturating_add(bytes.len());
            if k.seen <= k.lease.cap() {
                k.frames.extend_from_slice(bytes);
            }
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
            keyed,
            tally,
            ..
        } = *self;
        // The attempt's own outcome (a failure answer passed on keeps it).
        let answered = attempt.outcome;
        let outcome = stream_outcome(attempt.outcome, end);
        let pool = Arc::clone(lease.pool_name());
        // A stream that broke, failed inside or stalled counts as failed
        // for the endpoint's circuit (its first token was a success).
        if matches!(
            end,
            BodyEnd::UpstreamError | BodyEnd::StreamError | BodyEnd::Stalled
        ) {
            lease.observe(Sample::Failure(t0.elapsed()));
        }
        if matches!(end, BodyEnd::StreamError | BodyEnd::Stalled) {
            shared.metrics.stream_event(&pool, outcome.as_str());
        }
        attempt.generated = match &tally {
            Some(t) => t.charge(end),
            // An unwatched stream: a 2xx one generated what nobody read.
            None if (200..300).contains(&status) => Charge::unreadable(),
            None => Charge::default(),
        };
        if let Some(t) = &tally {
            let tpot = t.record(&mut record, &attempt);
            if let (Some(tpot), BodyEnd::Complete | BodyEnd::FinishedAfterClientLeft) = (tpot, end)
            {
                lease.observe_tpot(tpot);
            }
            if t.usage.is_none() && answered.is_success() {
                shared.metrics.stream_event(&pool, "usage_missing");
            }
        }
        attempt.outcome = outcome;
        // Release the endpoint before logging: the slot is free now.
        drop(lease);
        if record.attempts.is_empty() {
            record.first_outcome = Some(outcome);
        } else {
            record.fallback_outcome = Some(outcome);
        }
        record.attempts.push(attempt);
        if end == BodyEnd::DeadlineCut {
            shared.metrics.shed(&pool, outcome);
        }
        if end == BodyEnd::FinishedAfterClientLeft {
            record
                .reason
                .push_str("; the client left: the answer was finished and kept for its retry");
        }
        if let Some(k) = keyed {
            let settled_as = match end {
                BodyEnd::UpstreamError | BodyEnd::StreamError | BodyEnd::Stalled => outcome,
                _ => answered,
            };
            k.settle(settled_as, end, &record);
        }
        finish_record(&shared, record, t0, outcome, status, Some(pool));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_ends_as_its_body_did() {
        assert_eq!(stream_outcome(Outcome::Ok, BodyEnd::Complete), Outcome::Ok);
        // A failure answer passed on as a stream keeps its own outcome.
        assert_eq!(
            stream_outcome(Outcome::Status5xx, BodyEnd::Complete),
            Outcome::Status5xx
        );
        assert_eq!(
            stream_outcome(Outcome::Ok, BodyEnd::UpstreamError),
            Outcome::UpstreamReset
        );
        assert_eq!(
            stream_outcome(Outcome::Ok, BodyEnd::ClientGone),
            Outcome::ClientCancelled
        );
        assert_eq!(
            stream_outcome(Outcome::Ok, BodyEnd::DeadlineCut),
            Outcome::DeadlineExhausted
        );
    }
}
