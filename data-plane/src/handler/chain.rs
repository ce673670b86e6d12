//! The chain walk: the decision's candidate pools tried in order, inside
//! the request's deadline.
//!
//! For each candidate pool:
//!
//! 1. a pool that cannot take anything now (no endpoints, drained, every
//!    circuit open) is passed over, with its reason;
//! 2. [`plan_attempt`] (pure) gives the attempt's timeout, or skips the pool
//!    when its expected wait plus p95 cannot fit what is left (keeping the
//!    next pool's p95 in reserve);
//! 3. the attempt runs ([`super::attempt`]) and ends with an
//!    [`Outcome`](router_policy::Outcome);
//! 4. [`next_step`] (pure) says what follows: pass the answer on, try the
//!    next pool (same request id), or stop and say why.
//!
//! When no pool answers, the request gets, in this order of preference:
//! `deadline_exhausted` if the deadline has passed; the last backend
//! failure answer as it came (a 503, a 429...); `deadline_exhausted` if
//! pools were skipped for time; the last shed or failure; `no_backend`.
//!
//! A keyed request's lease is settled where the walk ends
//! ([`router_policy::idempotency::settle`] decides): with the answer
//! passed on (a whole one here, a stream by its finisher when it ends),
//! or, when no pool answered, with whether any attempt may have reached a
//! backend.

use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderMap;
use http::{Method, Response};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::KeyValue;
use router_policy::deadline::{plan_attempt, AttemptPlan, Budget};
use router_policy::document::{HedgeDelay, HedgeTarget};
use router_policy::idempotency::Ending;
use router_policy::{next_step, Outcome, Risk, Route, Step, StopReason};
use tokio::time::Instant;

use super::answer::Pending;
use super::attempt::{Attempt, AttemptEnd, Held};
use super::ProxyBody;
use crate::config::Snapshot;
use crate::error::ProxyError;
use crate::forward::UpstreamClient;
use crate::idempotency::{KeyLease, StoredAnswer};
use crate::pool::{PoolRuntime, Shed};
use crate::route_log::AttemptRecord;
use crate::Shared;

/// A request ready to be sent: what every attempt needs to build its
/// upstream request, and what the walk needs to decide.
pub(super) struct Exchange {
    /// The server span's context (tracing on).
    pub(super) otel: Option<opentelemetry::Context>,
    /// `gen_ai.operation.name` of the call.
    pub(super) operation: &'static str,
    pub(super) risk: Risk,
    pub(super) structured: Option<router_policy::structured::Expected>,
    /// Indices into the route's chain of the pools that may take it.
    pub(super) candidates: Vec<usize>,
    pub(super) estimated_input_tokens: u64,
    /// The request's output cap, the largest it gave.
    pub(super) output_cap: Option<u64>,
    pub(super) shared: Arc<Shared>,
    /// The upstream connection pool of the worker thread serving the request.
    pub(super) client: UpstreamClient,
    pub(super) snapshot: Arc<Snapshot>,
    pub(super) method: Method,
    pub(super) path_and_query: http::uri::PathAndQuery,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// The body parsed for its model to be rewritten, when a candidate
    /// pool rewrites it (see `upstream_request`).
    pub(super) parsed: Option<super::upstream_request::ParsedBody>,
    /// The client asked for usage in its stream itself (then its usage
    /// chunk is passed on).
    pub(super) client_asks_usage: bool,
    /// The request's tenant (a hash of its name), for fairness in queues.
    pub(super) tenant_key: Option<u64>,
    pub(super) json_call: bool,
    pub(super) streaming: bool,
    pub(super) model: Option<Arc<str>>,
    pub(super) deadline_at: Option<Instant>,
    /// On a route with `on_all_down: park`: what parking noted of the
    /// request on arrival ([`super::parking`]).
    pub(super) park: Option<Box<crate::tasks::ParkIntent>>,
    /// A client of another dialect: what was translated, and how its
    /// answers are ([`super::dialect`]).
    pub(super) translation: Option<Box<super::dialect::Translation>>,
}

impl Exchange {
    /// Tries the decision's pools in order. (An `async move` block, like
    /// [`super::handle`], so that `self` and `pending` are kept once.)
    #[allow(clippy::manual_async_fn)] // on purpose: see `handle`
    pub(super) fn walk_chain<'r>(
        mut self,
        mut pending: Pending,
        route: &'r Route,
        mut leader: Option<KeyLease>,
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
            // The route's retry budget: this request pays in; retries and
            // hedges draw on it.
            let retry_budget = self.snapshot.budget_of(route);
            if let Some(b) = &retry_budget {
                b.deposit(pending.t0);
            }
            // A pool the hedge already tried is not tried again.
            let mut hedged_into: Option<&str> = None;

            'walk: for (i, k) in candidates.iter().enumerate() {
                let Some(pool) = pool_at(k) else {
                    continue;
                };
                let later = || candidates[i + 1..].iter().filter_map(pool_at);
                let name = pool.name();
                if hedged_into == Some(name) {
                    notes.push(format!("{name}: tried as the hedge"));
                    continue;
                }
                let now = Instant::now();
                let outlook = match pool.ready_outlook_marked_at(now) {
                    Ok((o, only_marked)) => {
                        // Every endpoint suspect or ejected: down for this
                        // walk when a later pool is clean
                        // (`router_policy::health::pass_over_marked_pool`).
                        let clean_later = || {
                            later()
                                .any(|p| matches!(p.ready_outlook_marked_at(now), Ok((_, false))))
                        };
                        if only_marked
                            && router_policy::health::pass_over_marked_pool(
                                only_marked,
                                route.fallback,
                                clean_later(),
                            )
                        {
                            notes.push(format!(
                                "{name}: skipped, every endpoint suspect or ejected and a later pool is clean"
                            ));
                            continue;
                        }
                        o
                    }
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
                    // Without a deadline or a configured timeout, the
                    // process's default bounds the attempt (not the plan:
                    // it skips nothing), so a silent backend cannot hold a
                    // request forever.
                    AttemptPlan::Try { timeout } => {
                        timeout.or(Some(self.shared.settings.attempt_timeout))
                    }
                };
                // Attempts on this pool: the first, then retries on its other
                // endpoints (`tried` holds the endpoints that failed).
                let mut tried: Vec<u64> = Vec::new();
                let mut attempt_now = now;
                loop {
                    // A new attempt: the failure answer kept so far is dropped
                    // (its upstream connection closes).
                    held = None;
                    attempted += 1;
                    if attempted == 1 {
                        let rec = pending.rec();
                        rec.first_route = Some(Arc::clone(pool.shared_name()));
                        if *k != 0 {
                            rec.primary_passed_over = route.chain.first().map(|p| Arc::from(&**p));
                        }
                    }
                    // The client's headers go to the last attempt there can be as
                    // they are; earlier ones send a copy. On a parking route
                    // the last one sends a copy too: a request that every
                    // pool refused is parked with its headers.
                    let more_in_pool =
                        policy_pool.map_or(0, |p| p.endpoints.len()) > tried.len() + 1;
                    let may_park = self.park.as_ref().is_some_and(|p| !p.run);
                    let last_chance =
                        (!route.fallback || later().next().is_none()) && !more_in_pool && !may_park;
                    let headers = if last_chance {
                        std::mem::take(&mut self.headers)
                    } else {
                        self.headers.clone()
                    };
                    // The first attempt of a READ or DRAFT request on a route
                    // that hedges: the second attempt's delay and pool.
                    let hedge = match (route.hedge, retry_budget) {
                        (Some(h), Some(b)) if attempted == 1 && !self.risk.has_side_effects() => {
                            let after = match h.after {
                                HedgeDelay::Fixed(d) => Some(d),
                                HedgeDelay::PoolP95 => outlook.p95,
                            };
                            let to = match h.to {
                                HedgeTarget::SamePool => Some(pool),
                                HedgeTarget::NextPool => {
                                    later().find(|p| p.ready_outlook_at(now).is_ok())
                                }
                            };
                            after.zip(to).map(|(after, to)| super::hedge::Hedge {
                                after,
                                to,
                                same_pool: h.to == HedgeTarget::SamePool,
                                budget: b,
                            })
                        }
                        _ => None,
                    };
                    let attempt = Attempt {
                        pool,
                        planned_at: attempt_now,
                        deadline: attempt_deadline(attempt_now, timeout, self.deadline_at),
                        timeout,
                        headers,
                        first_token: policy_pool
                            .and_then(|p| p.first_token_timeout)
                            .or(route.first_token_timeout),
                        stall: policy_pool
                            .and_then(|p| p.stall_timeout)
                            .or(route.stall_timeout),
                        progress: None,
                        avoid: (!tried.is_empty()).then_some(&tried[..]),
                    };
                    let hedging = hedge.is_some();
                    let end = match hedge {
                        None => self.attempt(attempt).await,
                        Some(h) => {
                            let hedge_pool = h.to.name();
                            let (end, other_pool) =
                                self.hedged(attempt, h, &mut pending, &mut attempted).await;
                            if other_pool {
                                hedged_into = Some(hedge_pool);
                            }
                            end
                        }
                    };
                    let mut backend_failed = false;
                    let (outcome, failure) = match end {
                        AttemptEnd::Stream {
                            resp,
                            lease,
                            started,
                            record,
                            mut watch,
                        } => {
                            // The answering pool (a hedge's may be another).
                            let by = Arc::clone(lease.pool_name());
                            // A pool of another dialect than the client's:
                            // its events translated as they flow.
                            if let (Some((t, from)), true) =
                                (self.translated_from(&by), watch.scanner.is_some())
                            {
                                watch.translate = t.stream_translator(from);
                            }
                            pending.note_attempt(record, attempted);
                            pending.rec().reason =
                                reason(std::mem::take(&mut decided), &by, &notes);
                            let keyed = leader.take().map(|l| (l, route.finish_on_client_gone));
                            let price = self.snapshot.policy.pool(&by).map(|p| p.price);
                            return pending.commit_stream(
                                resp,
                                lease,
                                started,
                                self.deadline_at,
                                attempted,
                                keyed,
                                watch,
                                (price, self.estimated_input_tokens),
                            );
                        }
                        AttemptEnd::Whole { head, body, record } => {
                            let outcome = record.outcome;
                            // The answering pool (a hedge's may be another).
                            let by = pools.get(&*record.pool).unwrap_or(pool);
                            pending.note_attempt(record, attempted);
                            pending.rec().reason =
                                reason(std::mem::take(&mut decided), by.name(), &notes);
                            let route = by.route_header().cloned();
                            let summary =
                                leader.as_ref().map(|_| super::route_summary(pending.rec()));
                            let resp = pending.commit_whole(
                                head,
                                body,
                                by.shared_name(),
                                route,
                                attempted,
                            );
                            if let Some(l) = leader.take() {
                                settle_whole(l, &resp, outcome, summary).await;
                            }
                            return super::full(resp);
                        }
                        AttemptEnd::Failed {
                            record,
                            held: answer,
                        } => {
                            let outcome = record.outcome;
                            backend_failed = true;
                            notes.push(format!("{name}: {outcome}"));
                            pending.note_attempt(record.clone(), attempted);
                            let error = match answer {
                                Some(h) => {
                                    held = Some((h, record));
                                    None
                                }
                                None if outcome == Outcome::Timeout => {
                                    Some(ProxyError::DeadlineExhausted {
                                        detail: format!(
                                            "{name}: no answer within {} ms",
                                            record.latency_ms.round()
                                        ),
                                    })
                                }
                                // The pool, not the endpoint: the client
                                // is not told internal addresses (the route
                                // log's attempt has the endpoint).
                                None => Some(ProxyError::Upstream {
                                    pool: name.to_string(),
                                    detail: outcome.as_str().replace('_', " "),
                                }),
                            };
                            (outcome, error)
                        }
                        AttemptEnd::Shed(shed) => {
                            let err = shed_error(shed, name, now);
                            notes.push(format!("{name}: {}", err.kind()));
                            pending.rec().queue_wait_ms = super::ms(now.elapsed());
                            pending.pool = Some(Arc::clone(pool.shared_name()));
                            (err.outcome(), Some(err))
                        }
                    };
                    if failure.is_some() {
                        last_error = failure;
                    }
                    let time_left = self
                        .deadline_at
                        .map(|d| d.saturating_duration_since(Instant::now()));
                    match next_step(route, self.risk, outcome, time_left) {
                        Step::NextPool => {
                            // Retry inside the pool first: another endpoint,
                            // at once, inside the deadline.
                            let in_pool = backend_failed
                                && !hedging
                                && self.retry_in_pool(pool, &pending, &mut tried);
                            // An extra attempt after one that may have cost a
                            // backend work draws on the route's budget; after
                            // a shed it does not.
                            let another = in_pool || later().next().is_some();
                            if another
                                && outcome.may_have_reached_backend()
                                && retry_budget.is_some_and(|b| !b.withdraw())
                            {
                                notes
                                    .push(format!("stopped: {}", StopReason::RetryBudgetExhausted));
                                self.note_budget_exhausted(&mut pending, name);
                                break 'walk;
                            }
                            if in_pool {
                                notes.push(format!("{name}: retried on another endpoint"));
                                attempt_now = Instant::now();
                                continue;
                            }
                            if let Some(cx) = &self.otel {
                                cx.span().add_event(
                                    "fallback",
                                    vec![
                                        KeyValue::new("router.pool", name.to_string()),
                                        KeyValue::new("router.outcome", outcome.as_str()),
                                    ],
                                );
                            }
                        }
                        Step::Stop(why) => {
                            // The walk ends here; say why unless it is plain
                            // (nothing after, or fallback off).
                            if later().next().is_some() && route.fallback {
                                notes.push(format!("stopped: {why}"));
                            }
                            break 'walk;
                        }
                        // A failed attempt is never an answer.
                        Step::Answer => break 'walk,
                    }
                    // On to the next pool.
                    break;
                }
            }

            // No pool answered. Never answer after the deadline with anything
            // but deadline_exhausted; otherwise pass on the last backend
            // failure answer, or say why nothing was tried.
            let past_deadline = self.deadline_at.is_some_and(|d| Instant::now() >= d);
            pending.rec().reason = format!("{decided}; then {}", notes.join("; "));
            // A failure answer passed on settles the key with its own
            // outcome (below); anything else ends without an answer.
            let passed_on = !past_deadline && held.is_some();
            let unanswered = if passed_on { None } else { leader.take() };
            if let Some(l) = unanswered {
                let rec = pending.rec();
                let reached = rec
                    .attempts
                    .iter()
                    .any(|a| a.outcome.may_have_reached_backend());
                let summary = super::route_summary(rec);
                l.settle(Ending::NoAnswer { reached }, None, move || summary)
                    .await;
            }
            if past_deadline {
                return pending.reject(ProxyError::DeadlineExhausted {
                    detail: notes.join("; "),
                });
            }
            if let Some((h, record)) = held {
                return match h {
                    Held::Stream(resp, lease, started) => {
                        let keyed = leader.take().map(|l| (l, route.finish_on_client_gone));
                        pending.commit_stream(
                            resp,
                            lease,
                            started,
                            self.deadline_at,
                            attempted,
                            keyed,
                            Box::default(),
                            (None, self.estimated_input_tokens),
                        )
                    }
                    Held::Whole(mut head, mut body) => {
                        if let Some((t, _)) = self.translated_from(&record.pool) {
                            // A failure answer, in the client's dialect.
                            body = t.error(&mut head, &body);
                        }
                        let summary = leader.as_ref().map(|_| super::route_summary(pending.rec()));
                        let name = record.pool;
                        let route = pools.get(&*name).and_then(|p| p.route_header().cloned());
                        let resp = pending.commit_whole(head, body, &name, route, attempted);
                        if let Some(l) = leader.take() {
                            settle_whole(l, &resp, record.outcome, summary).await;
                        }
                        super::full(resp)
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
            // Safe mode, on a route that parks: every pool was down (none
            // could take the request, or each refused the connection), so
            // nothing reached a backend.
            if let (ProxyError::NoBackend { .. } | ProxyError::Upstream { .. }, Some(intent)) =
                (&err, &self.park)
            {
                let rec = pending.rec();
                if !rec
                    .attempts
                    .iter()
                    .any(|a| a.outcome.may_have_reached_backend())
                {
                    let detail = format!("route {:?}: {}", route.name, notes.join("; "));
                    // A translated request parks as its client sent it.
                    let (path_and_query, body) = match &self.translation {
                        None => (self.path_and_query.as_str(), &self.body),
                        Some(t) => (t.client_path.as_str(), &t.client_body),
                    };
                    let ctx = intent.context(
                        &self.method,
                        path_and_query,
                        &self.headers,
                        body,
                        self.risk,
                    );
                    return Box::pin(super::parking::park(pending, route, &ctx, detail)).await;
                }
            }
            pending.reject(err)
        }
    }
}

/// An attempt's deadline: `timeout` from `now`, never past the request's
/// own deadline (a retry inside a pool has less time than the first).
fn attempt_deadline(
    now: Instant,
    timeout: Option<std::time::Duration>,
    request_deadline: Option<Instant>,
) -> Option<Instant> {
    let own = timeout.map(|t| crate::clock::later(now, t, crate::clock::A_YEAR));
    match (own, request_deadline) {
        (Some(a), Some(d)) => Some(a.min(d)),
        (a, d) => a.or(d),
    }
}

impl Exchange {
    /// The route's retry budget refused an extra attempt (a retry, a hedge)
    /// on `pool`: the log line, the metric and the span say so.
    pub(super) fn note_budget_exhausted(&self, pending: &mut Pending, pool: &str) {
        pending.rec().stopped = Some(crate::route_log::Stopped::RetryBudgetExhausted);
        self.shared
            .metrics
            .stream_event(pool, "retry_budget_exhausted");
        if let Some(cx) = &self.otel {
            cx.span().add_event(
                "retry_budget_exhausted",
                vec![KeyValue::new("router.pool", pool.to_string())],
            );
        }
    }

    /// Whether the attempt that just failed on `pool` can be retried on
    /// another of its endpoints now: the failed endpoint joins `tried`,
    /// and one of the others must be ready at once (a retry never queues)
    /// with time left.
    fn retry_in_pool(&self, pool: &PoolRuntime, pending: &Pending, tried: &mut Vec<u64>) -> bool {
        let failed = pending
            .record_ref()
            .and_then(|r| r.attempts.last())
            .and_then(|a| pool.endpoint_id(&a.endpoint));
        let Some(id) = failed else {
            return false;
        };
        tried.push(id);
        let now = Instant::now();
        let time_left = self.deadline_at.is_none_or(|d| d > now);
        time_left && pool.other_endpoint_ready(tried, now)
    }
}

/// Settles a keyed request answered with a whole body: `resp` as the
/// client got it, `outcome` its attempt's.
async fn settle_whole(
    lease: KeyLease,
    resp: &Response<Bytes>,
    outcome: Outcome,
    summary: Option<Bytes>,
) {
    let ending = Ending::Answered {
        outcome,
        bytes: resp.body().len(),
        complete: true,
    };
    // Copied: the body and header values are slices of the upstream
    // connection's read buffer, which a kept slice would hold whole.
    let answer = (resp.body().len() <= lease.cap())
        .then(|| StoredAnswer::keep(resp.status(), resp.headers(), resp.body(), false));
    lease
        .settle(ending, answer, move || summary.unwrap_or_default())
        .await;
}

/// The router's answer for a pool that shed the request (`now`: when the
/// walk reached the pool).
fn shed_error(shed: Shed, pool: &str, now: Instant) -> ProxyError {
    match shed {
        Shed::QueueFull => ProxyError::QueueFull {
            pool: pool.to_string(),
        },
        Shed::QueueTimeout => ProxyError::QueueTimeout {
            pool: pool.to_string(),
            waited_ms: super::millis(now.elapsed()),
        },
        Shed::NoBackend => ProxyError::NoBackend {
            detail: format!("pool {pool:?} has no endpoints"),
        },
        Shed::AllDown => ProxyError::NoBackend {
            detail: format!(
                "pool {pool:?}: every endpoint went down while the request waited (circuits open or health checks failing)"
            ),
        },
        Shed::AttemptTimeout => ProxyError::DeadlineExhausted {
            detail: format!("{pool}: no answer possible in the time left after queueing"),
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sheds_answer_records_the_sheds_outcome() {
        let now = Instant::now();
        for shed in [
            Shed::QueueFull,
            Shed::QueueTimeout,
            Shed::NoBackend,
            Shed::AttemptTimeout,
            Shed::AllDown,
        ] {
            assert_eq!(shed_error(shed, "p", now).outcome(), shed.outcome());
        }
    }
}
