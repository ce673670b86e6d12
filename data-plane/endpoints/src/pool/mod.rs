//! A pool: a set of interchangeable endpoints behind one bounded queue.
//!
//! A request asks its pool for a [`Lease`] on one endpoint, waiting in a
//! FIFO while none is eligible. An endpoint can take requests when it is
//! not drained, its circuit breaker admits, and its capacity probe (if one
//! is configured) is fresh and healthy; among those, the balancer
//! ([`router_policy::balance`]) takes one under its concurrency limit that
//! is idle, untried, or faster than the latency threshold, and picks the
//! lowest peak-EWMA score (latency × requests in flight), so that slow or
//! busy endpoints get less traffic without fixed weights.
//!
//! Every attempt ends in a [`Sample`] (answered, failed, timed out, rate
//! limited) which feeds three things at once, under the pool's one lock:
//! the endpoint's EWMA, the endpoint's circuit breaker, and the pool's
//! latency window (its p95 is what the deadline planner holds a request's
//! time left against). Then dispatch runs: the sample may have made an
//! endpoint eligible for the waiters.
//!
//! Why one lock per pool and no background dispatcher: a grant must see
//! the queue, every endpoint's load and every circuit at one instant, and
//! the work under the lock is a handful of comparisons per endpoint (pools
//! have a few endpoints, not hundreds). Dispatch runs on the events that
//! can change eligibility (a release, a sample, a probe reading, an update,
//! an override) and on the one wake timer for what only time changes, so a
//! waiter is served the moment it can be, with no polling tick and no task
//! per request.
//!
//! The request path (`acquire_at`, [`Lease::finish`], [`Lease::observe`],
//! `ready_outlook_at`, `measurements_at`) was tuned by instruction counts
//! under callgrind: the caller passes the clock reading it already has,
//! each call takes the lock once, and a grant reuses the balancer's buffer.
//! Keep it free of new locks, clock reads and allocations.
//!
//! # Modules
//!
//! - `circuit`: the circuit-breaker state machine and the control plane's
//!   overrides, pure; [`CircuitState`].
//! - `latency`: [`Sample`], the EWMA update, the latency window and its
//!   p95.
//! - `queue`: the bounded FIFO, event-driven dispatch, [`Lease`], [`Shed`].
//! - `state`: the pool's locked state and the endpoint eligibility rules.
//! - `status`: [`Availability`], [`PoolStatus`], [`EndpointStatus`], the
//!   planner's outlook and the gates' measurements.
//! - `wake`: the pool's one timer, for open periods and overrides ending.
//! - `tests` (tests only): the pool as a whole, and helpers the others'
//!   tests share.
//!
//! Capacity probes live in the crate's `probe` module; a pool implements
//! its `Probed` and keeps the `ProbeReading`s it is given. Its placements
//! go to a [`PlacementSink`] when the proxy gives it one.

use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::metrics::counter::Counter;
use router_policy::health::{HealthCheck, OutlierEjection, SuspectCause};
use router_policy::{CircuitSettings, Endpoint, Probe, QueueSettings};
use tokio::time::Instant;

use crate::probe::{ProbeReading, Probed};
use router_upstream::forward::UpstreamClient;

mod circuit;
mod latency;
mod queue;
mod state;
mod status;
mod wake;

pub use circuit::{CircuitState, MAX_RETRY_AFTER};
pub use latency::Sample;
pub use queue::{EndpointHandle, Lease, PrefixPlacement, RequestShape, Shed, TokenSample};

/// Where a pool reports the prompts it placed, for the other proxies of
/// a fleet to learn (the proxy's `prefix_share` implements it over the
/// shared store's publish/subscribe). Called under the pool's lock on the
/// request path: it must never wait.
pub trait PlacementSink: Send + Sync {
    /// `pool` sent a prompt with `chain` to `endpoint`, `uncached` of its
    /// tokens to prefill there.
    fn learned(&self, pool: &Arc<str>, endpoint: &Arc<str>, chain: &[u64], uncached: u64);

    /// A pool with prefix affinity shares through this sink: start what
    /// the sharing needs (every such pool calls it; the sink starts once).
    fn activate(&self);
}

/// A request's prompt as prefix affinity sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixRequest {
    /// Its chained block hashes ([`router_policy::prefix_cache::block_chain`]).
    pub(crate) chain: Vec<u64>,
    /// Its prompt tokens, estimated from its bytes and the pool's ratio.
    pub prompt_tokens: u64,
}
pub use status::{Availability, EndpointStatus, PoolStatus, QuotaStatus};

use state::{EndpointState, PoolState};

/// A circuit transition or a suspicion, for the control plane (shared
/// with the fleet).
#[derive(Debug, Clone, PartialEq)]
pub struct CircuitEvent {
    /// Pool.
    pub pool: String,
    /// Endpoint URL.
    pub endpoint: String,
    /// Opened (true) or closed; for a suspicion, raised or cleared.
    pub open: bool,
    /// Until when it stays open (suspect).
    pub until: Option<Instant>,
    /// `Some`: this is a suspicion ([`router_policy::health`]), not a
    /// circuit.
    pub suspect: Option<SuspectCause>,
}

/// Counters a pool increments (the HF `custom_router_requests_*_total`),
/// and where it reports circuit transitions.
#[derive(Clone, Default)]
pub struct PoolCounters {
    /// Circuit transitions go here (managed mode); full: dropped.
    pub events: Option<tokio::sync::mpsc::Sender<CircuitEvent>>,
    /// Leases granted.
    pub dispatched: Counter,
    /// Waiters evicted from a full queue.
    pub evicted: Counter,
    /// Waiters timed out in the queue.
    pub timed_out: Counter,
    /// Health checks that passed.
    pub checks_passed: Counter,
    /// Health checks that failed.
    pub checks_failed: Counter,
    /// Outlier ejections.
    pub ejections: Counter,
}

/// A pool's settings that can change on reload.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSettings {
    /// Queue and scoring.
    pub queue: QueueSettings,
    /// Per-endpoint concurrency limit.
    pub max_concurrency: Option<u32>,
    /// Circuit breaker.
    pub circuit: CircuitSettings,
    /// The whole pool is drained.
    pub drain: bool,
    /// Endpoints drained one by one.
    pub drained: Vec<Endpoint>,
    /// Capacity probe, when configured.
    pub probe: Option<Probe>,
    /// The pool's model (to prefer endpoints where it is resident).
    pub model: Option<String>,
    /// Active health checks, when configured.
    pub health_check: Option<HealthCheck>,
    /// Outlier ejection, when configured.
    pub outlier: Option<OutlierEjection>,
    /// Session affinity, when configured: the header naming a session and
    /// the bounded-load factor ([`router_policy::affinity::choose_session`]).
    pub session_affinity: Option<(http::HeaderName, f64)>,
}

impl PoolSettings {
    /// Settings with no draining and the default circuit breaker.
    #[cfg(test)]
    pub(crate) fn new(queue: QueueSettings, max_concurrency: Option<u32>) -> Self {
        Self {
            queue,
            max_concurrency,
            circuit: CircuitSettings::default(),
            drain: false,
            drained: Vec::new(),
            probe: None,
            model: None,
            health_check: None,
            outlier: None,
            session_affinity: None,
        }
    }
}

/// A pool's running health check task and what it was started with.
struct CheckTask {
    check: HealthCheck,
    key: Option<crate::PoolKeys>,
    handle: tokio::task::JoinHandle<()>,
}

/// One pool: endpoints, queue, dispatcher.
pub struct PoolRuntime {
    name: Arc<str>,
    /// The name as the `x-router-route` answer header (made once).
    route_header: Option<http::HeaderValue>,
    state: Mutex<PoolState>,
    counters: PoolCounters,
    /// The capacity probe task, with the settings it runs with.
    probe_task: Mutex<Option<(Probe, tokio::task::JoinHandle<()>)>>,
    /// The health check task, with the settings and the API key it runs
    /// with.
    check_task: Mutex<Option<CheckTask>>,
    /// Wakes the health check task when endpoints change (a new one is
    /// checked at once).
    endpoints_changed: tokio::sync::Notify,
    /// The settings ask for prefix affinity (read without the lock).
    uses_affinity: std::sync::atomic::AtomicBool,
    /// The settings ask for session affinity (read without the lock).
    uses_sessions: std::sync::atomic::AtomicBool,
    /// Where placements go for the other proxies (with a shared store).
    prefix_share: std::sync::OnceLock<Arc<dyn PlacementSink>>,
}

impl PoolRuntime {
    /// A pool with these endpoints.
    pub fn new(
        name: &str,
        settings: PoolSettings,
        endpoints: &[Endpoint],
        counters: PoolCounters,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            name: name.into(),
            route_header: http::HeaderValue::from_str(name).ok(),
            state: Mutex::new(PoolState::new(settings.clone())),
            counters,
            probe_task: Mutex::new(None),
            check_task: Mutex::new(None),
            endpoints_changed: tokio::sync::Notify::new(),
            uses_affinity: std::sync::atomic::AtomicBool::new(false),
            uses_sessions: std::sync::atomic::AtomicBool::new(false),
            prefix_share: std::sync::OnceLock::new(),
        });
        pool.update(settings, endpoints);
        pool
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pool's name, shared (a clone costs no allocation).
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// The pool's name as an `x-router-route` header value.
    pub fn route_header(&self) -> Option<&http::HeaderValue> {
        self.route_header.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding this lock would be a bug in this module;
        // the state is still consistent enough to keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces settings and endpoints. Endpoints that stay keep their EWMA
    /// and in-flight count; removed ones are forgotten (their in-flight
    /// requests finish; their leases then release nothing). With no
    /// endpoints left, every waiter is answered `no_backend` at once.
    pub fn update(self: &Arc<Self>, settings: PoolSettings, endpoints: &[Endpoint]) {
        let mut st = self.lock();
        let mut old = std::mem::take(&mut st.endpoints);
        for ep in endpoints {
            let kept = old
                .iter()
                .position(|e| *e.endpoint == *ep)
                .map(|i| old.swap_remove(i));
            let state = match kept {
                Some(s) => s,
                None => {
                    st.next_id += 1;
                    EndpointState::new(st.next_id, ep)
                }
            };
            st.endpoints.push(state);
        }
        for e in &mut st.endpoints {
            e.draining = settings.drain || settings.drained.contains(&e.endpoint);
        }
        self.uses_affinity.store(
            settings.queue.scoring == router_policy::Scoring::EngineAware
                && settings.queue.engine.affinity.is_some(),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.uses_sessions.store(
            settings.session_affinity.is_some(),
            std::sync::atomic::Ordering::Relaxed,
        );
        st.settings = settings;
        st.rebuild_ring();
        self.endpoints_changed.notify_one();
        let all_drained = st.endpoints.iter().all(|e| e.draining);
        if st.endpoints.is_empty() || all_drained {
            st.shed_all(Shed::NoBackend);
        } else {
            self.dispatch(&mut st);
        }
    }

    /// Starts, restarts or stops the capacity probe task to match `probe`.
    pub fn ensure_probe(self: &Arc<Self>, probe: Option<Probe>, client: Option<&UpstreamClient>) {
        let mut task = self.probe_task.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(want), Some((running, handle))) = (probe, task.as_ref()) {
            if want == *running && !handle.is_finished() {
                return;
            }
        }
        if let Some((_, handle)) = task.take() {
            handle.abort();
        }
        let (Some(probe), Some(client)) = (probe, client) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let handle = rt.spawn(crate::probe::run(
            Arc::downgrade(self),
            client.clone(),
            probe,
        ));
        *task = Some((probe, handle));
    }

    /// Removes the pool from service: waiters get `no_backend`, new
    /// requests too; requests in flight finish.
    pub fn close(&self) {
        if let Some((_, handle)) = self
            .probe_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            handle.abort();
        }
        if let Some(t) = self
            .check_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.handle.abort();
        }
        let mut st = self.lock();
        st.closed = true;
        st.endpoints.clear();
        st.rebuild_ring();
        st.shed_all(Shed::NoBackend);
    }

    /// Folds `sample`, taken at `now`, into the endpoint's EWMA and circuit
    /// and the pool's latency window; reports circuit transitions.
    fn record_sample(&self, st: &mut PoolState, endpoint_id: u64, sample: Sample, now: Instant) {
        let q = st.settings.queue;
        let circuit = st.settings.circuit;
        st.latencies.record(sample, endpoint_id, now);
        let Some(e) = st.endpoint_mut(endpoint_id) else {
            return;
        };
        let failed = matches!(sample, Sample::Failure(_) | Sample::Timeout(_));
        let opened = match sample {
            Sample::Success(_) => {
                e.answered = true;
                if e.breaker.on_success() {
                    self.report(e, false, None, None);
                }
                // An answer is the probe that ends a suspicion (sent while
                // every endpoint was marked, or after a mark expired
                // here): the fleet's too.
                if e.suspect.holds(now) || e.fleet_suspect.holds(now) {
                    self.end_suspicion(e, SuspectCause::Check, now);
                    self.end_suspicion(e, SuspectCause::Attempt, now);
                }
                None
            }
            Sample::Failure(_) | Sample::Timeout(_) => e.breaker.on_failure(now, &circuit, None),
            Sample::RateLimited(_, retry_after) => e.breaker.on_failure(now, &circuit, retry_after),
            Sample::Cancelled(_) => None,
        };
        if let Some(until) = opened {
            tracing::warn!(pool = &*self.name, endpoint = &*e.addr, "circuit opened");
            self.report(e, true, Some(until), None);
        }
        if router_policy::health::suspect_after_attempt(failed, e.answered) {
            self.raise_suspicion(e, SuspectCause::Attempt, now, circuit.open_duration);
        }
        e.ewma = Some(latency::fold_ewma(e.ewma, sample, &q));
        if opened.is_some() {
            st.shed_if_down(now);
        }
        if !matches!(sample, Sample::Cancelled(_)) {
            if let Some(rules) = st.settings.outlier {
                self.judge_outliers(st, endpoint_id, failed, now, &rules);
            }
        }
    }

    /// Marks `e` suspect for `cause` until `now + open_for` and tells the
    /// fleet, unless this proxy's mark of that cause already holds.
    fn raise_suspicion(
        &self,
        e: &mut EndpointState,
        cause: SuspectCause,
        now: Instant,
        open_for: std::time::Duration,
    ) {
        if e.suspect.held_for(cause, now) {
            return;
        }
        let until = crate::clock::later(now, open_for, crate::clock::A_YEAR);
        // A standalone proxy has no fleet to tell.
        if self.counters.events.is_some() {
            tracing::warn!(
                pool = &*self.name,
                endpoint = &*e.addr,
                cause = cause.as_str(),
                "endpoint marked suspect; reported to the fleet"
            );
        } else {
            tracing::warn!(
                pool = &*self.name,
                endpoint = &*e.addr,
                cause = cause.as_str(),
                "endpoint marked suspect"
            );
        }
        e.suspect.set(cause, until);
        self.report(e, true, Some(until), Some(cause));
    }

    /// Ends `e`'s marks of `cause` (this proxy's and the fleet's) and tells
    /// the fleet, when one holds.
    fn end_suspicion(&self, e: &mut EndpointState, cause: SuspectCause, now: Instant) {
        if e.suspect.held_for(cause, now) || e.fleet_suspect.held_for(cause, now) {
            e.suspect.clear(cause);
            e.fleet_suspect.clear(cause);
            self.report(e, false, None, Some(cause));
        }
    }

    /// Counts an ended request for outlier ejection and, after a failure,
    /// ejects the pool's outliers ([`router_policy::health::ejections`]).
    fn judge_outliers(
        &self,
        st: &mut PoolState,
        endpoint_id: u64,
        failed: bool,
        now: Instant,
        rules: &OutlierEjection,
    ) {
        let Some(e) = st.endpoint_mut(endpoint_id) else {
            return;
        };
        e.outlier.record(failed, now, rules.window);
        if !failed {
            if e.ejected_until.is_none_or(|u| u <= now)
                && e.outlier.totals(now, rules.window).1 == 0
            {
                e.ejections = 0;
            }
            return;
        }
        let counts: Vec<router_policy::health::ErrorCount> = st
            .endpoints
            .iter()
            .map(|e| {
                let (requests, errors) = e.outlier.totals(now, rules.window);
                router_policy::health::ErrorCount {
                    requests,
                    errors,
                    ejected: e.ejected_until.is_some_and(|u| u > now),
                }
            })
            .collect();
        for i in router_policy::health::ejections(&counts, rules) {
            let e = &mut st.endpoints[i];
            e.ejections = e.ejections.saturating_add(1);
            let until = crate::clock::later(now, rules.duration(e.ejections), crate::clock::A_YEAR);
            e.ejected_until = Some(until);
            // Judged afresh when it comes back.
            e.outlier = state::OutlierCounts::default();
            self.counters.ejections.inc();
            tracing::warn!(
                pool = &*self.name,
                endpoint = &*e.addr,
                requests = counts[i].requests,
                errors = counts[i].errors,
                ejection_s = rules.duration(e.ejections).as_secs_f64(),
                "outlier ejected: its error rate is far above the rest of its pool's"
            );
        }
    }

    /// Keeps what an answer of `endpoint_id` said of its key's quota, read
    /// at `now` ([`router_policy::quota::QuotaState::record`]); a reset
    /// may make it eligible again, so waiters are dispatched.
    pub(crate) fn record_quota(
        self: &Arc<Self>,
        endpoint_id: u64,
        reading: &router_policy::quota::Reading,
        now: Instant,
    ) {
        use router_policy::quota::{admit, Admission, Estimate};
        let mut st = self.lock();
        if let Some(e) = st.endpoint_mut(endpoint_id) {
            let before = admit(&e.quota, Estimate::default(), now).admits();
            e.quota.record(reading, now, |d| {
                crate::clock::later(now, d, crate::clock::A_YEAR)
            });
            // Just read, nothing spent since: what the provider says.
            if let Admission::Skip { until, why } = admit(&e.quota, Estimate::default(), now) {
                if before {
                    tracing::info!(
                        pool = &*self.name,
                        endpoint = &*e.addr,
                        why = why.label(),
                        rest_s = until.saturating_duration_since(now).as_secs_f64(),
                        "key out of quota: rested until its reset"
                    );
                }
                // The fleet rests it too, until the same reset: told once
                // a window.
                if e.quota_reported_until.is_none_or(|r| r <= now) {
                    e.quota_reported_until = Some(until);
                    self.report(e, true, Some(until), Some(SuspectCause::Quota));
                }
            }
        }
        self.dispatch(&mut st);
    }

    /// Folds a stream's time per output token into the endpoint's EWMA
    /// (the pool's smoothing factor; plain EWMA, no peak rule: a fast token
    /// rate after a slow one is believed at once only in part).
    pub(crate) fn record_tpot(&self, endpoint_id: u64, tpot: std::time::Duration) {
        let mut st = self.lock();
        let alpha = st.settings.queue.ewma_alpha;
        if let Some(e) = st.endpoint_mut(endpoint_id) {
            let v = tpot.as_secs_f64();
            e.tpot = Some(match e.tpot {
                None => v,
                Some(old) => old + alpha * (v - old),
            });
        }
    }

    /// Tells the control plane (managed mode) a circuit opened or closed,
    /// or a suspicion was raised or cleared.
    fn report(
        &self,
        e: &EndpointState,
        open: bool,
        until: Option<Instant>,
        suspect: Option<SuspectCause>,
    ) {
        if let Some(tx) = &self.counters.events {
            let _ = tx.try_send(CircuitEvent {
                pool: self.name.to_string(),
                endpoint: e.addr.to_string(),
                open,
                until,
                suspect,
            });
        }
    }

    /// Applies the fleet's suspicion marks: `(endpoint, cause, until)`;
    /// anything not listed is not suspect by the fleet. (A mark this proxy
    /// raised itself is kept apart, until it expires or a check here
    /// clears it: a snapshot that predates the report does not undo it.)
    pub fn set_suspects(self: &Arc<Self>, marks: &[(Endpoint, SuspectCause, Instant)]) {
        let mut st = self.lock();
        for e in &mut st.endpoints {
            let of = |cause: SuspectCause| {
                marks
                    .iter()
                    .filter(|(ep, c, _)| *c == cause && *ep == *e.endpoint)
                    .map(|(_, _, until)| *until)
                    .max()
            };
            e.fleet_suspect.check_until = of(SuspectCause::Check);
            e.fleet_suspect.attempt_until = of(SuspectCause::Attempt);
            e.fleet_suspect.quota_until = of(SuspectCause::Quota);
        }
        self.dispatch(&mut st);
    }

    /// Records one health check's result at `endpoint`: the endpoint's
    /// health, the pool's counters, and the fleet (a failed check raises
    /// suspicion, a passing one clears a check's suspicion). A change may
    /// make endpoints eligible, so waiters are dispatched.
    pub(crate) fn record_check(self: &Arc<Self>, endpoint: &Endpoint, passed: bool, now: Instant) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let Some(check) = &st.settings.health_check else {
            return;
        };
        let open_for = st.settings.circuit.open_duration;
        if passed {
            self.counters.checks_passed.inc();
        } else {
            self.counters.checks_failed.inc();
        }
        let Some(e) = st.endpoints.iter_mut().find(|e| *e.endpoint == *endpoint) else {
            return;
        };
        if let Some(health) = e.checks.record(passed, check) {
            tracing::info!(
                pool = &*self.name,
                endpoint = &*e.addr,
                health = health.as_str(),
                "health check state changed"
            );
        }
        if passed {
            self.end_suspicion(e, SuspectCause::Check, now);
            // A backend that came back is found by its checks: its open
            // circuit's probe is due now, not at the end of the open
            // period (`router_policy::health::open_until_after_passing_check`).
            // The fleet's too: this proxy withdraws its open report (which
            // the control plane holds every proxy, this one included, to),
            // as an answer would.
            if e.breaker.on_passing_check(now) {
                tracing::info!(
                    pool = &*self.name,
                    endpoint = &*e.addr,
                    "a passing health check ended the open circuit's wait: the next request probes"
                );
                self.report(e, false, None, None);
            }
        } else {
            self.raise_suspicion(e, SuspectCause::Check, now, open_for);
            // Those waiting (for a first check, say) move on now if the
            // pool is down, rather than wait out their timeout.
            st.shed_if_down(now);
        }
        self.dispatch(st);
    }

    /// Starts, restarts or stops the health check task to match `check`
    /// and the pool's API key (sent with each check to the origins it may
    /// go to, as with requests: a cloud API's `/v1/models` wants it).
    pub fn ensure_checks(
        self: &Arc<Self>,
        check: Option<HealthCheck>,
        key: Option<&crate::PoolKeys>,
        client: Option<&UpstreamClient>,
    ) {
        let mut task = self.check_task.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(want), Some(running)) = (&check, task.as_ref()) {
            let same_key = match (key, &running.key) {
                (None, None) => true,
                (Some(a), Some(b)) => a.same_as(b),
                _ => false,
            };
            if *want == running.check && same_key && !running.handle.is_finished() {
                return;
            }
        }
        if let Some(t) = task.take() {
            t.handle.abort();
        }
        let (Some(check), Some(client)) = (check, client) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let handle = rt.spawn(crate::health_check::run(
            Arc::downgrade(self),
            client.clone(),
            check.clone(),
            key.cloned(),
        ));
        *task = Some(CheckTask {
            check,
            key: key.cloned(),
            handle,
        });
    }

    /// Waits until the endpoints change (for the health check task).
    pub(crate) async fn endpoints_changed(&self) {
        self.endpoints_changed.notified().await;
    }

    /// Applies the control plane's forced circuit states: `(endpoint, open,
    /// until)`, an endpoint of `None` meaning every endpoint of the pool.
    /// Anything not listed goes back to the local breaker. Waiters are
    /// dispatched, and woken again when an override ends.
    pub fn set_forced(self: &Arc<Self>, forced: &[(Option<Endpoint>, bool, Instant)]) {
        let mut st = self.lock();
        for e in &mut st.endpoints {
            e.breaker.set_forced(
                forced
                    .iter()
                    .filter(|(ep, _, _)| ep.as_ref().is_none_or(|x| *x == *e.endpoint))
                    .map(|(_, open, until)| (*open, *until))
                    // An open override wins over a closed one.
                    .max_by_key(|(open, until)| (*open, *until)),
            );
        }
        self.dispatch(&mut st);
    }

    /// The session key of a request (`headers`: the client's), when this
    /// pool has session affinity and the request names a session
    /// ([`router_policy::affinity::session_key`]: the value hashed, never
    /// kept).
    pub fn session_key(&self, headers: &http::HeaderMap) -> Option<u64> {
        // Most pools have no session affinity: no lock for them.
        if !self
            .uses_sessions
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        let header = self.lock().settings.session_affinity.as_ref()?.0.clone();
        router_policy::affinity::session_key(headers.get(&header)?.as_bytes())
    }

    /// Shares this pool's prefix placements with the other proxies
    /// (through `share`, the proxy's `prefix_share`); the first call wins.
    pub fn share_prefixes(&self, share: &Arc<dyn PlacementSink>) {
        let _ = self.prefix_share.set(Arc::clone(share));
        // Only a pool with prefix affinity needs the fleet's placements:
        // without one, no connection is opened for them.
        if self
            .uses_affinity
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            share.activate();
        }
    }

    /// Another proxy placed a prompt with `chain` on `addr`, `uncached`
    /// of its tokens to prefill there: this pool's index of that endpoint
    /// records it, and its prefill counts in the endpoint's pending work
    /// until drained (nothing for an endpoint this pool does not have, or
    /// without prefix affinity).
    pub fn learn(&self, addr: &str, chain: &[u64], uncached: u64) {
        if !self
            .uses_affinity
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let mut st = self.lock();
        let Some(affinity) = st.settings.queue.engine.affinity else {
            return;
        };
        let chain = &chain[..chain.len().min(affinity.max_blocks)];
        if let Some(e) = st.endpoints.iter_mut().find(|e| &*e.addr == addr) {
            let capacity = affinity.index_blocks(e.probe.as_ref().and_then(|p| p.cache_tokens));
            e.prefix_record(chain, capacity);
            e.add_peer_prefill(uncached, Instant::now());
        }
    }

    /// The prompt of a request body as a chain of block hashes, when this
    /// pool balances with prefix affinity
    /// ([`router_policy::prefix_cache`]); `None` otherwise or for a body
    /// without a prompt one block long.
    pub fn prefix_request(&self, body: &[u8]) -> Option<Arc<PrefixRequest>> {
        // Most pools have no affinity: no lock for them.
        if !self
            .uses_affinity
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        let q = self.lock().settings.queue;
        if q.scoring != router_policy::Scoring::EngineAware {
            return None;
        }
        let a = q.engine.affinity?;
        let text = router_policy::prefix_cache::prompt_text(body)?;
        let chain = router_policy::prefix_cache::block_chain(&text, a.block_bytes, a.max_blocks);
        (!chain.is_empty()).then(|| {
            Arc::new(PrefixRequest {
                chain,
                prompt_tokens: (text.len() as f64 / a.bytes_per_token) as u64,
            })
        })
    }

    /// Notes a malformed structured answer for `caller` (a tenant's key,
    /// `None` without tenancy); `explained`: the request's own parameters
    /// explain it. Degrades the pool for structured output for `period`
    /// when the failures make the backend's pattern
    /// (`router_policy::structured::DegradeWatch`); true when it did.
    pub fn note_structured_failure(
        &self,
        period: std::time::Duration,
        caller: Option<u64>,
        explained: bool,
        tenancy: bool,
    ) -> bool {
        let now = Instant::now();
        let since = now.checked_sub(period).unwrap_or(now);
        let mut st = self.lock();
        if !st
            .structured_failures
            .failed(now, since, caller, explained, tenancy)
        {
            return false;
        }
        let until = crate::clock::later(now, period, crate::clock::A_YEAR);
        st.structured_degraded_until =
            Some(st.structured_degraded_until.map_or(until, |u| u.max(until)));
        true
    }
}

impl Probed for PoolRuntime {
    /// Endpoints a capacity probe should poll now.
    fn probe_targets(&self) -> Vec<Endpoint> {
        let st = self.lock();
        st.endpoints.iter().map(|e| (*e.endpoint).clone()).collect()
    }

    /// Records what a capacity probe saw at `endpoint` (an answer, or a
    /// failure counted against the last answer); a change may make
    /// endpoints eligible, so waiters are dispatched.
    fn record_probe(self: &Arc<Self>, endpoint: &Endpoint, answer: Option<ProbeReading>) {
        let mut st = self.lock();
        if let Some(e) = st.endpoints.iter_mut().find(|e| *e.endpoint == *endpoint) {
            let answered = answer.is_some();
            e.probe = Some(ProbeReading::after(e.probe.take(), answer, Instant::now()));
            if answered {
                e.in_flight_at_scrape = e.in_flight;
                // The scrape counts what the other proxies sent.
                e.peer_sent = 0;
            }
        }
        self.dispatch(&mut st);
    }
}

#[cfg(test)]
mod tests;
