//! The chain walk's executor: it carries out what
//! [`router_policy::walk::Walk`] decides and decides nothing itself.
//!
//! ```text
//! walk.start ─▶ Try(plan) ─▶ attempt_for, then the attempt (hedged if planned)
//!            ◀─ walk.ended(Ended { outcome, shed, held, reached, .. })
//!            ─▶ Try again | Signal (span event, budget metric) ─▶ walk.resume
//!            ─▶ Answer: pass_on (a whole answer, or a stream's finisher)
//!            ─▶ End(how): end_unanswered (deadline_exhausted, the failure
//!               answer passed on, the last error, no_backend, or park)
//! ```
//!
//! [`LivePools`] is the walk's view of the pools (readiness, endpoints,
//! the retry budget). A keyed request's lease is settled where the walk
//! ends ([`router_policy::idempotency::settle`] decides): with the answer
//! passed on (a whole one here, a stream by its finisher when it ends),
//! or, when no pool answered, with whether any attempt may have reached a
//! backend.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderMap;
use http::{Method, Response};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::KeyValue;
use router_policy::idempotency::Ending;
use router_policy::walk::{
    Action, Availability, Ended, Pools, Ready, Signal, TryPlan, Walk, WalkEnd, WalkOptions,
};
use router_policy::{Outcome, Risk, Route};
use tokio::time::Instant;

use super::answer::Pending;
use super::attempt::{Attempt, AttemptEnd, Held};
use super::ProxyBody;
use crate::config::{RouteBudget, Snapshot};
use crate::error::ProxyError;
use crate::forward::UpstreamClient;
use crate::idempotency::{KeyLease, StoredAnswer};
use crate::pool::{PoolRuntime, Shed};
use crate::route_log::{AttemptRecord, WalkNote};
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
    /// Chain positions of the pools that may take it, in its order.
    pub(super) candidates: Vec<usize>,
    /// The chain position of the request's first pool (the chain's first,
    /// or a first split's chosen side): a walk that begins elsewhere
    /// counts as a fallback from it.
    pub(super) first: usize,
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
    /// Walks the decision's pools as [`Walk`] says: the executor of the
    /// walk, with no decision of its own. (An `async move` block, like
    /// [`super::handle`], so that `self` and `pending` are kept once.)
    #[allow(clippy::manual_async_fn)] // on purpose: see `handle`
    pub(super) fn walk_chain<'r>(
        mut self,
        mut pending: Pending,
        route: &'r Route,
        mut leader: Option<KeyLease>,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> + 'r {
        async move {
            let candidates = std::mem::take(&mut self.candidates);
            let snapshot = Arc::clone(&self.snapshot);
            // The route's retry budget: this request pays in; retries and
            // hedges draw on it.
            let budget = snapshot.budget_of(route);
            if let Some(b) = budget {
                b.deposit(pending.t0);
            }
            let view = LivePools {
                route,
                snapshot: &snapshot,
                budget,
                now: std::cell::Cell::new(pending.t0),
                last: std::cell::Cell::new(None),
            };
            let mut walk = Walk::new(
                route,
                &candidates,
                WalkOptions {
                    risk: self.risk,
                    has_retry_budget: budget.is_some(),
                    parks: self.park.is_some(),
                    may_park: self.park.as_ref().is_some_and(|p| !p.run),
                    default_attempt_timeout: self.shared.settings.attempt_timeout,
                },
            );
            // The decision's own skips are already in the reason.
            let decided = std::mem::take(&mut pending.rec().reason);
            // A backend's failure answer, kept until a later attempt.
            let mut held: Option<(Held, AttemptRecord)> = None;
            let mut last_error: Option<ProxyError> = None;
            let mut attempted = 0usize;
            let mut action = walk.start(&view, view.tick(self.deadline_at));
            loop {
                action = match action {
                    Action::Try(plan) => {
                        let Some(pool) = view.pool(plan.at) else {
                            break;
                        };
                        // A new attempt: the failure answer kept so far is
                        // dropped (its upstream connection closes).
                        held = None;
                        attempted += 1;
                        if plan.first {
                            let rec = pending.rec();
                            rec.first_route = Some(Arc::clone(pool.shared_name()));
                            if plan.at != self.first {
                                rec.primary_passed_over = route.pool_at(self.first).map(Arc::from);
                            }
                        }
                        let avoid = if plan.in_pool {
                            walk.tried().to_vec()
                        } else {
                            Vec::new()
                        };
                        // The walk's clock reading (no wait since).
                        let now = view.now.get();
                        let (attempt, hedge) = self.attempt_for(&plan, pool, &view, now, &avoid);
                        let (end, hedge) = match hedge {
                            None => (self.attempt(attempt).await, HedgeReport::default()),
                            Some(h) => self.hedged(attempt, h, &mut pending, &mut attempted).await,
                        };
                        let (ended, error) = match end {
                            AttemptEnd::Failed {
                                record,
                                held: answer,
                            } => {
                                let mut ended = Ended::plain(record.outcome);
                                ended.endpoint = pool.endpoint_id(&record.endpoint);
                                let error = failure_error(pool.name(), &record, answer.is_none());
                                pending.note_attempt(record.clone(), attempted);
                                ended.held = answer.is_some();
                                held = answer.map(|h| (h, record));
                                (ended, error)
                            }
                            AttemptEnd::Shed(shed) => {
                                let err = shed_error(shed, pool.name(), now);
                                pending.rec().queue_wait_ms = super::ms(now.elapsed());
                                pending.pool = Some(Arc::clone(pool.shared_name()));
                                (Ended::shed(shed.outcome()), Some(err))
                            }
                            answer => {
                                let notes = note_walk(&walk, &view, &mut pending);
                                let passed = self.pass_on(
                                    answer,
                                    pending,
                                    route,
                                    &mut leader,
                                    decided,
                                    &notes,
                                    attempted,
                                );
                                return match passed {
                                    Passed::Stream(resp) => resp,
                                    Passed::Whole(resp, outcome, summary) => {
                                        if let Some(l) = leader.take() {
                                            settle_whole(l, &resp, outcome, summary).await;
                                        }
                                        super::full(resp)
                                    }
                                };
                            }
                        };
                        if let Some(e) = error {
                            last_error = Some(e);
                        }
                        let ended = Ended {
                            reached: ended.reached || hedge.other_reached,
                            hedged_into: plan.hedge.map(|h| h.to).filter(|_| hedge.other_pool),
                            ..ended
                        };
                        walk.ended(&view, ended, view.tick(self.deadline_at))
                    }
                    Action::Signal(signal) => {
                        self.signal(signal, route, &mut pending);
                        walk.resume(&view, view.tick(self.deadline_at))
                    }
                    // Answers are passed on where the attempt ends (above).
                    Action::Answer => break,
                    Action::End(end) => {
                        let notes = note_walk(&walk, &view, &mut pending);
                        pending.rec().reason = format!("{decided}; then {notes}");
                        // Boxed: the failure path's state stays out of every
                        // request's future.
                        return Box::pin(self.end_unanswered(
                            end, pending, route, leader, held, last_error, notes, attempted,
                        ))
                        .await;
                    }
                };
            }
            // Unreachable by the walk's contract (a Try names a pool; an
            // answer returns above): still one answer.
            leader.take();
            pending.reject(ProxyError::NoBackend {
                detail: format!("route {:?}: the walk ended without a pool", route.name),
            })
        }
    }

    /// The attempt the walk planned, and its hedge if the plan has one.
    /// (Not async: the attempt's future is awaited in the walk itself, so
    /// it is moved once, not once more inside a future of this.)
    fn attempt_for<'a>(
        &mut self,
        plan: &TryPlan,
        pool: &'a Arc<PoolRuntime>,
        view: &'a LivePools<'_>,
        now: Instant,
        avoid: &'a [u64],
    ) -> (Attempt<'a>, Option<super::hedge::Hedge<'a>>) {
        // The client's headers go to the last attempt there can be as they
        // are; earlier ones send a copy.
        let headers = if plan.last_chance {
            std::mem::take(&mut self.headers)
        } else {
            self.headers.clone()
        };
        let policy_pool = view.policy_pool(plan.at);
        let attempt = Attempt {
            pool,
            planned_at: now,
            deadline: Some(attempt_deadline(now, plan.timeout, self.deadline_at)),
            timeout: Some(plan.timeout),
            headers,
            first_token: policy_pool
                .and_then(|p| p.first_token_timeout)
                .or(view.route.first_token_timeout),
            stall: policy_pool
                .and_then(|p| p.stall_timeout)
                .or(view.route.stall_timeout),
            progress: None,
            avoid: (!avoid.is_empty()).then_some(avoid),
        };
        let hedge = plan.hedge.and_then(|h| {
            view.pool(h.to).map(|to| super::hedge::Hedge {
                after: h.after,
                to,
                same_pool: h.same_pool,
                budget: view.budget,
            })
        });
        (attempt, hedge)
    }
}

/// An attempt's deadline: `timeout` from `now`, never past the request's
/// own deadline (a retry inside a pool has less time than the first).
fn attempt_deadline(now: Instant, timeout: Duration, request_deadline: Option<Instant>) -> Instant {
    let own = crate::clock::later(now, timeout, crate::clock::A_YEAR);
    request_deadline.map_or(own, |d| own.min(d))
}

impl Exchange {
    /// Carries out a signal of the walk: the log line, the metric, the span.
    fn signal(&self, signal: Signal, route: &Route, pending: &mut Pending) {
        let name = |at: usize| route.pool_at(at).unwrap_or("");
        match signal {
            Signal::FellBack { from, outcome } => {
                if let Some(cx) = &self.otel {
                    cx.span().add_event(
                        "fallback",
                        vec![
                            KeyValue::new("router.pool", name(from).to_string()),
                            KeyValue::new("router.outcome", outcome.as_str()),
                        ],
                    );
                }
            }
            Signal::RetryBudgetExhausted { at } => self.note_budget_exhausted(pending, name(at)),
        }
    }

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

    /// An attempt answered: its answer passed on (a stream through its
    /// finisher, which settles a keyed request when it ends), or a whole
    /// answer committed for the walk to settle its key with (not async:
    /// the answer is moved once).
    #[allow(clippy::too_many_arguments)]
    fn pass_on(
        &self,
        end: AttemptEnd,
        mut pending: Pending,
        route: &Route,
        leader: &mut Option<KeyLease>,
        decided: String,
        notes: &str,
        attempted: usize,
    ) -> Passed {
        match end {
            AttemptEnd::Stream {
                resp,
                lease,
                started,
                record,
                mut watch,
            } => {
                // The answering pool (a hedge's may be another).
                let by = Arc::clone(lease.pool_name());
                // A pool of another dialect than the client's: its events
                // translated as they flow.
                if let (Some((t, from)), true) =
                    (self.translated_from(&by), watch.scanner.is_some())
                {
                    watch.translate = t.stream_translator(from);
                }
                pending.note_attempt(record, attempted);
                pending.rec().reason = reason(decided, &by, notes);
                let keyed = leader.take().map(|l| {
                    let finish = l.is_idempotency_key() && route.finish_on_client_gone;
                    (l, finish)
                });
                let price = self.snapshot.policy.pool(&by).map(|p| p.price);
                Passed::Stream(pending.commit_stream(
                    resp,
                    lease,
                    started,
                    self.deadline_at,
                    attempted,
                    keyed,
                    watch,
                    (price, self.estimated_input_tokens),
                ))
            }
            AttemptEnd::Whole { head, body, record } => {
                let outcome = record.outcome;
                let name = Arc::clone(&record.pool);
                pending.note_attempt(record, attempted);
                pending.rec().reason = reason(decided, &name, notes);
                let by = self.snapshot.pools.get(&*name);
                let route_header = by.and_then(|p| p.route_header().cloned());
                let summary = leader.as_ref().map(|_| super::route_summary(pending.rec()));
                let resp = pending.commit_whole(head, body, &name, route_header, attempted);
                Passed::Whole(resp, outcome, summary)
            }
            // Not answers: never passed here.
            AttemptEnd::Failed { .. } | AttemptEnd::Shed(_) => {
                Passed::Stream(pending.reject(ProxyError::NoBackend {
                    detail: format!("route {:?}: no answer to pass on", route.name),
                }))
            }
        }
    }

    /// No pool answered: the answer the walk chose. A keyed request is
    /// settled without an answer unless a failure answer is passed on.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::manual_async_fn)] // on purpose: see `handle`
    fn end_unanswered<'a>(
        &'a self,
        end: WalkEnd,
        mut pending: Pending,
        route: &'a Route,
        mut leader: Option<KeyLease>,
        held: Option<(Held, AttemptRecord)>,
        last_error: Option<ProxyError>,
        notes: String,
        attempted: usize,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> + 'a {
        async move {
            let passed_on = end == WalkEnd::PassOnFailureAnswer && held.is_some();
            if let Some(l) = leader.take_if(|_| !passed_on) {
                let rec = pending.rec();
                let reached = rec
                    .attempts
                    .iter()
                    .any(|a| a.outcome.may_have_reached_backend());
                let summary = super::route_summary(rec);
                l.settle(Ending::NoAnswer { reached }, None, move || summary)
                    .await;
            }
            let no_backend = || ProxyError::NoBackend {
                detail: format!("route {:?}: {notes}", route.name),
            };
            let err = match (end, held) {
                (WalkEnd::PassOnFailureAnswer, Some((h, record))) => {
                    return self
                        .pass_on_failure(h, record, pending, route, leader, attempted)
                        .await;
                }
                (WalkEnd::DeadlineExhausted | WalkEnd::SkippedForTime, _) => {
                    ProxyError::DeadlineExhausted { detail: notes }
                }
                (WalkEnd::Park, _) => {
                    let Some(intent) = &self.park else {
                        return pending.reject(no_backend());
                    };
                    let detail = format!("route {:?}: {notes}", route.name);
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
                (WalkEnd::LastFailure | WalkEnd::PassOnFailureAnswer, _) => {
                    last_error.unwrap_or_else(no_backend)
                }
                (WalkEnd::NoBackend, _) => no_backend(),
            };
            pending.reject(err)
        }
    }

    /// A backend's failure answer (a 503, a 429...) passed on as it came,
    /// in the client's dialect.
    #[allow(clippy::manual_async_fn)] // on purpose: see `handle`
    fn pass_on_failure<'a>(
        &'a self,
        h: Held,
        record: AttemptRecord,
        pending: Pending,
        route: &'a Route,
        mut leader: Option<KeyLease>,
        attempted: usize,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> + 'a {
        async move {
            let mut pending = pending;
            match h {
                Held::Stream(resp, lease, started) => {
                    let keyed = leader.take().map(|l| {
                        let finish = l.is_idempotency_key() && route.finish_on_client_gone;
                        (l, finish)
                    });
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
                    let route_header = self
                        .snapshot
                        .pools
                        .get(&*name)
                        .and_then(|p| p.route_header().cloned());
                    let resp = pending.commit_whole(head, body, &name, route_header, attempted);
                    if let Some(l) = leader.take() {
                        settle_whole(l, &resp, record.outcome, summary).await;
                    }
                    super::full(resp)
                }
            }
        }
    }
}

impl Exchange {
    /// The request's token estimate for the endpoints' quotas: its prompt
    /// and its output cap (else the decision's default), as the `quota`
    /// gate counts it.
    pub(super) fn quota_estimate(&self) -> router_policy::quota::Estimate {
        router_policy::quota::Estimate {
            input: self.estimated_input_tokens,
            output: self
                .output_cap
                .unwrap_or(router_policy::decide::DEFAULT_MAX_TOKENS),
        }
    }
}

/// The live pools as the walk reads them (see [`router_policy::walk::Pools`]).
pub(super) struct LivePools<'a> {
    route: &'a Route,
    snapshot: &'a Snapshot,
    budget: Option<&'a RouteBudget>,
    /// The clock, read once per call into the walk ([`Self::tick`]).
    now: std::cell::Cell<Instant>,
    /// The last policy pool looked up (a walk asks of one pool at a time).
    last: std::cell::Cell<Option<(usize, &'a router_policy::Pool)>>,
}

impl<'a> LivePools<'a> {
    /// The pool at the route's chain position `at`.
    fn pool(&self, at: usize) -> Option<&Arc<PoolRuntime>> {
        self.route
            .pool_at(at)
            .and_then(|name| self.snapshot.pools.get(name))
    }

    fn policy_pool(&self, at: usize) -> Option<&'a router_policy::Pool> {
        if let Some((k, p)) = self.last.get() {
            if k == at {
                return Some(p);
            }
        }
        let snapshot: &'a Snapshot = self.snapshot;
        let found = self
            .route
            .pool_at(at)
            .and_then(|name| snapshot.policy.pool(name));
        if let Some(p) = found {
            self.last.set(Some((at, p)));
        }
        found
    }

    /// Reads the clock for the next call into the walk; the time left of
    /// `deadline` then.
    fn tick(&self, deadline: Option<Instant>) -> Option<Duration> {
        let now = Instant::now();
        self.now.set(now);
        deadline.map(|d| d.saturating_duration_since(now))
    }
}

impl Pools for LivePools<'_> {
    fn exists(&self, at: usize) -> bool {
        self.pool(at).is_some()
    }

    fn readiness(&self, at: usize) -> Result<Ready, Availability> {
        let pool = self.pool(at).ok_or(Availability::NoEndpoints)?;
        pool.ready_outlook_marked_at(self.now.get())
            .map(|(outlook, only_marked)| Ready {
                outlook,
                only_marked,
            })
    }

    fn endpoint_count(&self, at: usize) -> usize {
        self.policy_pool(at).map_or(0, |p| p.endpoints.len())
    }

    fn attempt_timeout(&self, at: usize) -> Option<Duration> {
        self.policy_pool(at).and_then(|p| p.attempt_timeout)
    }

    fn other_endpoint_ready(&self, at: usize, tried: &[u64]) -> bool {
        self.pool(at)
            .is_some_and(|p| p.other_endpoint_ready(tried, self.now.get()))
    }

    fn draw_retry_budget(&self) -> bool {
        RouteBudget::draw(self.budget)
    }
}

/// An answer passed on: whole ones still settle a keyed request.
enum Passed {
    /// The response, done (a stream settles its key when it ends).
    Stream(Response<ProxyBody>),
    /// A whole answer, its attempt's outcome and the route summary a keyed
    /// request is settled with.
    Whole(Response<Bytes>, Outcome, Option<Bytes>),
}

/// What a hedged attempt tells the walk beyond its end.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HedgeReport {
    /// The hedge went to another pool than the first attempt's.
    pub(super) other_pool: bool,
    /// The attempt that is not the one reported may have reached a backend.
    pub(super) other_reached: bool,
}

/// The walk's notes in the record, typed (`walk`), and as the route log's
/// reason writes them (returned).
fn note_walk(walk: &Walk<'_>, view: &LivePools<'_>, pending: &mut Pending) -> String {
    if walk.notes().is_empty() {
        return String::new();
    }
    let route = view.route;
    // The pools' own shared names: no copy of the text.
    let pool = |at: usize| view.pool(at).map(|p| Arc::clone(p.shared_name()));
    // After the notes of the pools the decision passed over (`gated`).
    let notes = walk.notes().iter().map(|n| WalkNote::of(n, pool));
    pending.rec().walk.extend(notes);
    let name = |at: usize| route.pool_at(at).unwrap_or("");
    let mut out = String::new();
    for (i, note) in walk.notes().iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        use std::fmt::Write as _;
        let _ = write!(out, "{}", note.render(name));
    }
    out
}

/// The router's own error for a failed attempt on `pool` when no failure
/// answer is kept (`None` when one is).
fn failure_error(pool: &str, record: &AttemptRecord, nothing_held: bool) -> Option<ProxyError> {
    if !nothing_held {
        return None;
    }
    Some(if record.outcome == Outcome::Timeout {
        ProxyError::DeadlineExhausted {
            detail: format!("{pool}: no answer within {} ms", record.latency_ms.round()),
        }
    } else {
        // The pool, not the endpoint: the client is not told internal
        // addresses (the route log's attempt has the endpoint).
        ProxyError::Upstream {
            pool: pool.to_string(),
            detail: record.outcome.as_str().replace('_', " "),
        }
    })
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
fn reason(decided: String, pool: &str, notes: &str) -> String {
    if notes.is_empty() {
        decided
    } else {
        format!("{decided}; then {notes}; answered by {pool}")
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
