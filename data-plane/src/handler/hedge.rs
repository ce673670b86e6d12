//! Hedged requests: a second attempt when the first is slow to start.
//!
//! Most of a model call's tail is time to first token: a request queued
//! behind long prompts, an engine preempting, a cold replica. Waiting for
//! it costs the user the whole tail; retrying after a timeout costs the
//! timeout *and* a second generation. A hedge (Dean and Barroso, "The Tail
//! at Scale", 2013) starts a second attempt once the first has gone
//! without a first token for `after` (a fixed delay, or the pool's recent
//! p95: then only about one request in twenty is hedged), and keeps
//! whichever produces its first token first. The other is cancelled at
//! once: its connection is closed, so the backend stops generating.
//!
//! - Only READ and DRAFT requests are hedged: a SEND or DESTRUCTIVE
//!   request is never sent twice at once (validation refuses a hedge on a
//!   route that takes only those).
//! - The second attempt goes to the next eligible pool of the chain (which
//!   the walk then does not try again), or to another endpoint of the same
//!   pool (`to: same_pool`), taken at once or not at all: a hedge never
//!   queues behind other requests.
//! - Each hedge draws on the route's retry budget
//!   ([`router_policy::retry_budget`]) like a retry: during an overload
//!   the budget runs dry and hedging stops, so it cannot multiply the
//!   load.
//! - Both attempts carry the same request id. Both are in the route log,
//!   each with its part (`hedge`: `primary_won`, `hedge_cancelled`...); a
//!   cancelled attempt's time so far is its endpoint's latency sample (a
//!   lower bound, which keeps the p95, and so the hedge delay, honest)
//!   and does not count against its circuit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TraceContextExt;
use opentelemetry::KeyValue;
use router_policy::Outcome;
use tokio::time::Instant;

use super::answer::Pending;
use super::attempt::{Attempt, AttemptEnd, AttemptProgress};
use super::chain::{Exchange, HedgeReport};
use crate::pool::{PoolRuntime, Sample};
use crate::route_log::{AttemptRecord, HedgeRole};

/// A hedge to run alongside an attempt.
pub(super) struct Hedge<'a> {
    /// Start the second attempt after this long without a first token.
    pub(super) after: Duration,
    /// The second attempt's pool.
    pub(super) to: &'a Arc<PoolRuntime>,
    /// `to` is the first attempt's own pool: another endpoint of it.
    pub(super) same_pool: bool,
    /// The route's retry budget, which the hedge draws on.
    pub(super) budget: Option<&'a crate::config::RouteBudget>,
}

type AttemptFuture<'a> = Pin<Box<dyn Future<Output = AttemptEnd> + Send + 'a>>;

/// An attempt that produced an answer (its first token, or a whole body).
fn answered(end: &AttemptEnd) -> bool {
    matches!(end, AttemptEnd::Stream { .. } | AttemptEnd::Whole { .. })
}

/// The record of an attempt's end, with its part in the hedge.
fn tag(end: &mut AttemptEnd, part: HedgeRole) {
    match end {
        AttemptEnd::Stream { record, .. }
        | AttemptEnd::Whole { record, .. }
        | AttemptEnd::Failed { record, .. } => record.hedge = Some(part),
        AttemptEnd::Shed(_) => {}
    }
}

/// The record of an attempt that ended unanswered, to note it apart.
fn failed_record(end: AttemptEnd, pool: &PoolRuntime) -> AttemptRecord {
    match end {
        AttemptEnd::Stream { record, .. }
        | AttemptEnd::Whole { record, .. }
        | AttemptEnd::Failed { record, .. } => record,
        AttemptEnd::Shed(shed) => AttemptRecord {
            pool: Arc::clone(pool.shared_name()),
            outcome: shed.outcome(),
            ..AttemptRecord::default()
        },
    }
}

/// The record (and latency sample) of an attempt cancelled because the
/// other one answered first.
fn cancelled(
    progress: &AttemptProgress,
    pool: &PoolRuntime,
    timeout_ms: Option<u64>,
    part: HedgeRole,
) -> AttemptRecord {
    let mut record = AttemptRecord {
        pool: Arc::clone(pool.shared_name()),
        outcome: Outcome::HedgeCancelled,
        timeout_ms,
        hedge: Some(part),
        ..AttemptRecord::default()
    };
    // Still queued when cancelled: no endpoint, nothing to sample.
    if let Some(leased) = progress.get() {
        let waited = leased.started.elapsed();
        leased.handle.observe(Sample::Cancelled(waited));
        record.endpoint = leased.endpoint;
        record.latency_ms = super::ms(waited);
        record.queue_wait_ms = leased.queue_wait_ms;
    }
    record
}

impl Exchange {
    /// Runs `first`, hedged as `hedge` says; returns the end the walk goes
    /// on with (the winner's, or the last failure) and whether the hedge
    /// went to another pool. The other attempt, if there was one, is noted
    /// in `pending` here; `attempted` counts it.
    pub(super) async fn hedged<'a>(
        &'a self,
        first: Attempt<'a>,
        hedge: Hedge<'a>,
        pending: &mut Pending,
        attempted: &mut usize,
    ) -> (AttemptEnd, HedgeReport) {
        let p1 = AttemptProgress::default();
        let p2 = AttemptProgress::default();
        let first_pool = first.pool;
        let (deadline, timeout, first_token, stall) = (
            first.deadline,
            first.timeout,
            first.first_token,
            first.stall,
        );
        let headers = first.headers.clone();
        let timeout_ms = timeout.map(super::millis);
        let mut primary: AttemptFuture<'_> = Box::pin(self.attempt(Attempt {
            progress: Some(&p1),
            ..first
        }));
        let delay = tokio::time::sleep(hedge.after);
        tokio::pin!(delay);
        tokio::select! {
            biased;
            end = &mut primary => return (end, HedgeReport::default()),
            () = &mut delay => {}
        }
        // No first token yet: hedge, if the budget has room.
        if !crate::config::RouteBudget::draw(hedge.budget) {
            self.note_budget_exhausted(pending, first_pool.name());
            return (primary.await, HedgeReport::default());
        }
        // Still queued: any endpoint but none (no id is u64::MAX).
        let avoid_ids = [p1.get().map_or(u64::MAX, |l| l.handle.id())];
        let avoid = hedge.same_pool.then_some(&avoid_ids[..]);
        self.shared
            .metrics
            .stream_event(hedge.to.name(), "hedge_started");
        if let Some(cx) = &self.otel {
            cx.span().add_event(
                "hedge_started",
                vec![KeyValue::new("router.pool", hedge.to.name().to_string())],
            );
        }
        *attempted += 1;
        let second_attempt = Attempt {
            pool: hedge.to,
            planned_at: Instant::now(),
            deadline,
            timeout,
            headers,
            first_token,
            stall,
            progress: Some(&p2),
            avoid,
        };
        let mut second: AttemptFuture<'_> = Box::pin(self.attempt(second_attempt));
        let other_pool = !hedge.same_pool;
        // Whichever answers first wins; a failure waits for the other.
        let (first_end, primary_first) = tokio::select! {
            end = &mut primary => (end, true),
            end = &mut second => (end, false),
        };
        let (winner_pool, loser_pool, loser_progress) = if primary_first {
            (first_pool, hedge.to, &p2)
        } else {
            (hedge.to, first_pool, &p1)
        };
        let (won, lost, cancelled_part) = if primary_first {
            (
                HedgeRole::PrimaryWon,
                HedgeRole::PrimaryFailed,
                HedgeRole::HedgeCancelled,
            )
        } else {
            (
                HedgeRole::HedgeWon,
                HedgeRole::HedgeFailed,
                HedgeRole::PrimaryCancelled,
            )
        };
        let mut first_end = first_end;
        if answered(&first_end) {
            // Cancel the other at once: its connection closes.
            if primary_first {
                drop(second);
            } else {
                drop(primary);
            }
            tag(&mut first_end, won);
            let record = cancelled(loser_progress, loser_pool, timeout_ms, cancelled_part);
            let other_reached = record.outcome.may_have_reached_backend();
            pending.note_attempt(record, *attempted - 1);
            let metrics = &self.shared.metrics;
            metrics.stream_event(loser_pool.name(), "hedge_cancelled");
            if !primary_first {
                metrics.stream_event(winner_pool.name(), "hedge_won");
            }
            if let Some(cx) = &self.otel {
                cx.span().add_event(
                    won.as_str(),
                    vec![KeyValue::new("router.pool", winner_pool.name().to_string())],
                );
            }
            let report = HedgeReport {
                other_pool,
                other_reached,
            };
            return (first_end, report);
        }
        // The first to end failed: the other may still answer.
        tag(&mut first_end, lost);
        let record = failed_record(first_end, winner_pool);
        let other_reached = record.outcome.may_have_reached_backend();
        pending.note_attempt(record, *attempted - 1);
        let mut last = if primary_first {
            second.await
        } else {
            primary.await
        };
        let part = match (primary_first, answered(&last)) {
            (true, true) => HedgeRole::HedgeWon,
            (true, false) => HedgeRole::HedgeFailed,
            (false, true) => HedgeRole::PrimaryWon,
            (false, false) => HedgeRole::PrimaryFailed,
        };
        if part == HedgeRole::HedgeWon {
            self.shared
                .metrics
                .stream_event(loser_pool.name(), "hedge_won");
        }
        tag(&mut last, part);
        let report = HedgeReport {
            other_pool,
            other_reached,
        };
        (last, report)
    }
}
