//! A pool's bounded FIFO queue and its endpoints.
//!
//! Each pool owns one mutex-protected [`PoolState`]: its endpoints (with
//! their EWMA latency and in-flight count) and a FIFO of waiting requests.
//! A request asks for a [`Lease`] on an endpoint:
//!
//! - With no endpoint at all, it is refused at once (`no_backend`): there
//!   is nothing to wait for.
//! - With an empty queue and an eligible endpoint (see
//!   [`router_policy::balance`]), it gets its lease at once without
//!   touching the queue.
//! - Otherwise it joins the back of the queue. If the queue is then over
//!   its size, the *oldest* waiter is evicted with `queue_full` (it has
//!   already waited longest and is the most likely to miss its deadline).
//!   A waiter that reaches the queue timeout leaves with `queue_timeout`.
//!   A waiter whose client goes away (its future is dropped) leaves the
//!   queue at once.
//!
//! Dispatch is event-driven, with no polling tick: everything that can make
//! an endpoint eligible (a lease released, an EWMA sample folded in,
//! endpoints added) runs [`PoolState::dispatch`] under the same lock, which
//! hands leases to waiters from the front of the queue until no endpoint is
//! eligible. Because an idle endpoint is always eligible and every lease is
//! released when its request ends (the lease's `Drop`), a non-empty pool
//! never stalls.
//!
//! Exactly one answer per waiter: a waiter's oneshot sender is consumed by
//! whichever comes first (grant, eviction, shutdown), and the timeout path
//! removes the waiter under the lock before deciding, so a grant racing a
//! timeout is either received or was never sent. A grant sent to a waiter
//! that vanished in between is taken back under the lock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use router_policy::balance::{self, failure_sample, EndpointLoad};
use router_policy::deadline::PoolOutlook;
use router_policy::decide::PoolMeasurements;
use router_policy::{CircuitSettings, Endpoint, Probe, QueueSettings};

use crate::forward::UpstreamClient;
use crate::probe::{ProbeReading, Probed};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Why a pool refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// Evicted as the oldest waiter of a full queue.
    QueueFull,
    /// Waited past the queue timeout.
    QueueTimeout,
    /// The pool has no endpoints (or was removed, or drained).
    NoBackend,
    /// The attempt's own deadline came first.
    AttemptTimeout,
}

/// Whether a pool can take a request at all right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// At least one endpoint can take requests (now or after queueing).
    Ready,
    /// No endpoints configured.
    NoEndpoints,
    /// Every endpoint (or the pool) is drained.
    Drained,
    /// Every endpoint that is not drained has an open circuit or a failing
    /// (or stale) capacity probe.
    Unhealthy,
}

impl Availability {
    /// Text for the route log's reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::NoEndpoints => "no endpoints",
            Self::Drained => "drained",
            Self::Unhealthy => "unhealthy (circuits open or capacity probes failing)",
        }
    }
}

/// An endpoint's circuit breaker, as shown in health and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Traffic flows.
    Closed,
    /// No traffic until the open period ends.
    Open,
    /// One probe in flight decides.
    HalfOpen,
}

impl CircuitState {
    /// `closed`, `open`, `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// Circuit breaker state machine of one endpoint.
///
/// `Closed` counts consecutive failures; at the threshold it opens for the
/// configured duration. An open circuit whose time is up admits exactly one
/// request (the probe) and becomes `HalfOpen`: the probe's success closes
/// it, its failure reopens it for twice as long as last time (capped at 16×).
/// A probe that ends without a verdict (client gone) lets the next request
/// probe instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    Closed { failures: u32 },
    Open { until: Instant, reopenings: u32 },
    HalfOpen { reopenings: u32 },
}

impl Circuit {
    fn admits(&self, now: Instant) -> bool {
        match *self {
            Circuit::Closed { .. } => true,
            Circuit::Open { until, .. } => now >= until,
            Circuit::HalfOpen { .. } => false,
        }
    }

    fn state(&self, now: Instant) -> CircuitState {
        match *self {
            Circuit::Closed { .. } => CircuitState::Closed,
            Circuit::Open { until, .. } if now >= until => CircuitState::HalfOpen,
            Circuit::Open { .. } => CircuitState::Open,
            Circuit::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    fn on_failure(&mut self, now: Instant, settings: &CircuitSettings) {
        *self = match *self {
            Circuit::Closed { failures } if failures + 1 >= settings.consecutive_errors => {
                Circuit::Open {
                    until: now + settings.open_duration,
                    reopenings: 0,
                }
            }
            Circuit::Closed { failures } => Circuit::Closed {
                failures: failures + 1,
            },
            Circuit::HalfOpen { reopenings } => {
                let r = (reopenings + 1).min(4);
                Circuit::Open {
                    until: now + settings.open_duration * (1 << r),
                    reopenings: r,
                }
            }
            open @ Circuit::Open { .. } => open,
        };
    }
}

/// A circuit transition, for the control plane (shared with the fleet).
#[derive(Debug, Clone, PartialEq)]
pub struct CircuitEvent {
    /// Pool.
    pub pool: String,
    /// Endpoint URL.
    pub endpoint: String,
    /// Opened (true) or closed.
    pub open: bool,
    /// Until when it stays open.
    pub until: Option<Instant>,
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
}

impl PoolSettings {
    /// Settings with no draining and the default circuit breaker.
    pub fn new(queue: QueueSettings, max_concurrency: Option<u32>) -> Self {
        Self {
            queue,
            max_concurrency,
            circuit: CircuitSettings::default(),
            drain: false,
            drained: Vec::new(),
            probe: None,
            model: None,
        }
    }
}

/// How many recent latencies a pool keeps for its p95.
const LATENCY_WINDOW: usize = 128;
/// The p95 is recomputed at most this often under load.
const P95_REFRESH: Duration = Duration::from_millis(50);

/// How long a latency sample counts toward the p95.
const LATENCY_MAX_AGE: Duration = Duration::from_secs(60);

/// What one attempt taught us about an endpoint's latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sample {
    /// The endpoint answered; latency to its first byte.
    Success(Duration),
    /// The attempt failed after this long (connect error, 429, 5xx).
    Failure(Duration),
    /// The attempt was given up after this long without an answer.
    Timeout(Duration),
    /// A 429 after this long; its `Retry-After`, if any, extends an open
    /// circuit.
    RateLimited(Duration, Option<Duration>),
}

/// A live view of one endpoint, for health, metrics and the state log.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointStatus {
    /// `http://host:port[/base]`.
    pub addr: Arc<str>,
    /// Requests in flight.
    pub in_flight: u32,
    /// EWMA latency in seconds, `None` before the first answer.
    pub ewma_s: Option<f64>,
    /// Circuit breaker state.
    pub circuit: CircuitState,
    /// Drained (no new requests).
    pub draining: bool,
}

/// A live view of one pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolStatus {
    /// Pool name.
    pub name: Arc<str>,
    /// Requests waiting.
    pub queue_depth: usize,
    /// How long the oldest waiter has waited.
    pub oldest_wait: Option<Duration>,
    /// Endpoints.
    pub endpoints: Vec<EndpointStatus>,
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
}

struct EndpointState {
    id: u64,
    endpoint: Arc<Endpoint>,
    /// Its URI parts and `Host` header, parsed once.
    target: Option<Arc<crate::forward::UpstreamTarget>>,
    addr: Arc<str>,
    ewma: Option<f64>,
    in_flight: u32,
    draining: bool,
    circuit: Circuit,
    probe: Option<ProbeReading>,
    /// Forced by the control plane: open (true) or closed, until then.
    forced: Option<(bool, Instant)>,
}

impl EndpointState {
    /// The circuit admits a request now, taking forced states into account.
    fn admits(&self, now: Instant) -> bool {
        match self.forced {
            Some((true, until)) if now < until => false,
            Some((false, until)) if now < until => true,
            _ => self.circuit.admits(now),
        }
    }

    /// Fresh, healthy probe data when a probe is configured.
    fn probe_ok(&self, probe: Option<&Probe>, now: Instant) -> bool {
        let Some(p) = probe else { return true };
        self.probe.as_ref().is_some_and(|r| r.usable(p, now))
    }
}

struct Waiter {
    id: u64,
    enqueued_at: Instant,
    tx: oneshot::Sender<Result<Lease, Shed>>,
}

struct PoolState {
    settings: PoolSettings,
    endpoints: Vec<EndpointState>,
    queue: VecDeque<Waiter>,
    loads: Vec<EndpointLoad>,
    latencies: VecDeque<(Instant, Duration)>,
    /// The p95 of `latencies` and when it was computed: recomputed after
    /// they change, at most every [`P95_REFRESH`] (it sorts the window).
    p95_cache: Option<(Instant, Option<Duration>)>,
    p95_dirty: bool,
    wake_at: Option<Instant>,
    structured_degraded_until: Option<Instant>,
    next_id: u64,
    rotation: usize,
    closed: bool,
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
            state: Mutex::new(PoolState {
                settings: settings.clone(),
                endpoints: Vec::new(),
                queue: VecDeque::new(),
                loads: Vec::new(),
                latencies: VecDeque::new(),
                p95_cache: None,
                p95_dirty: false,
                wake_at: None,
                structured_degraded_until: None,
                next_id: 0,
                rotation: 0,
                closed: false,
            }),
            counters,
            probe_task: Mutex::new(None),
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

    /// Whether the pool can take requests at all.
    pub fn availability(&self) -> Availability {
        availability_of(&self.lock(), Instant::now())
    }

    /// What the deadline planner needs to know about this pool now.
    pub fn outlook(&self) -> PoolOutlook {
        outlook_of(&mut self.lock(), Instant::now())
    }

    /// The outlook as of `now` (a request passes its own clock reading)
    /// when the pool can take requests, else why not: [`Self::availability`]
    /// and [`Self::outlook`] under one lock.
    pub fn ready_outlook_at(&self, now: Instant) -> Result<PoolOutlook, Availability> {
        let mut st = self.lock();
        match availability_of(&st, now) {
            Availability::Ready => Ok(outlook_of(&mut st, now)),
            other => Err(other),
        }
    }
}

/// [`PoolRuntime::outlook`] on a locked state.
fn outlook_of(st: &mut PoolState, now: Instant) -> PoolOutlook {
    st.expire_latencies(now);
    let p95 = st.p95(now);
    st.fill_loads(now);
    let free_now = st.queue.is_empty()
        && balance::choose(
            &st.loads,
            st.settings.queue.scoring,
            st.settings.queue.latency_threshold_s,
            st.rotation,
        )
        .is_some();
    let expected_wait = if free_now {
        Some(Duration::ZERO)
    } else {
        st.expected_wait(now)
    };
    PoolOutlook {
        free_now,
        expected_wait,
        p95,
    }
}

/// Whether a pool in state `st` can take requests at all, as of `now`.
fn availability_of(st: &PoolState, now: Instant) -> Availability {
    if st.closed || st.endpoints.is_empty() {
        return Availability::NoEndpoints;
    }
    if st.settings.drain || st.endpoints.iter().all(|e| e.draining) {
        return Availability::Drained;
    }
    let probe = st.settings.probe;
    let usable = |e: &&EndpointState| e.admits(now);
    let healthy = |e: &&EndpointState| usable(e) && e.probe_ok(probe.as_ref(), now);
    if !st
        .endpoints
        .iter()
        .filter(|e| !e.draining)
        .any(|e| healthy(&e))
    {
        return Availability::Unhealthy;
    }
    Availability::Ready
}

impl PoolRuntime {
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
                    EndpointState {
                        id: st.next_id,
                        addr: ep.to_string().into(),
                        endpoint: Arc::new(ep.clone()),
                        target: crate::forward::UpstreamTarget::new(ep).map(Arc::new),
                        ewma: None,
                        in_flight: 0,
                        draining: false,
                        circuit: Circuit::Closed { failures: 0 },
                        probe: None,
                        forced: None,
                    }
                }
            };
            st.endpoints.push(state);
        }
        for e in &mut st.endpoints {
            e.draining = settings.drain || settings.drained.contains(&e.endpoint);
        }
        st.settings = settings;
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
        let mut st = self.lock();
        st.closed = true;
        st.endpoints.clear();
        st.shed_all(Shed::NoBackend);
    }

    /// Waits for an endpoint, at most until the queue timeout or
    /// `attempt_deadline`, whichever comes first. Cancel-safe: dropping the
    /// future leaves the queue at once.
    pub async fn acquire(
        self: &Arc<Self>,
        attempt_deadline: Option<Instant>,
    ) -> Result<Lease, Shed> {
        self.acquire_at(attempt_deadline, Instant::now()).await
    }

    /// [`Self::acquire`], the caller having read the clock (`now`) just
    /// before.
    pub async fn acquire_at(
        self: &Arc<Self>,
        attempt_deadline: Option<Instant>,
        now: Instant,
    ) -> Result<Lease, Shed> {
        let (id, mut rx, timeout_at, on_timeout) = {
            let mut st = self.lock();
            if st.closed || st.endpoints.is_empty() || st.endpoints.iter().all(|e| e.draining) {
                return Err(Shed::NoBackend);
            }
            if st.queue.is_empty() {
                if let Some(lease) = self.try_grant(&mut st, now, now) {
                    self.counters.dispatched.inc();
                    return Ok(lease);
                }
            }
            st.next_id += 1;
            let id = st.next_id;
            let (tx, rx) = oneshot::channel();
            st.queue.push_back(Waiter {
                id,
                enqueued_at: now,
                tx,
            });
            if st.queue.len() > st.settings.queue.max_size {
                if let Some(oldest) = st.queue.pop_front() {
                    self.counters.evicted.inc();
                    let _ = oldest.tx.send(Err(Shed::QueueFull));
                }
            }
            self.dispatch(&mut st);
            let queue_deadline = now + st.settings.queue.timeout;
            match attempt_deadline {
                Some(d) if d < queue_deadline => (id, rx, d, Shed::AttemptTimeout),
                _ => (id, rx, queue_deadline, Shed::QueueTimeout),
            }
        };
        let mut guard = QueuedGuard {
            pool: self,
            id,
            armed: true,
        };
        match tokio::time::timeout_at(timeout_at, &mut rx).await {
            Ok(Ok(grant)) => {
                guard.armed = false;
                grant
            }
            // The sender was dropped without a word: the pool went away.
            Ok(Err(_)) => {
                guard.armed = false;
                Err(Shed::NoBackend)
            }
            Err(_elapsed) => {
                guard.armed = false;
                if self.remove_waiter(id) {
                    if on_timeout == Shed::QueueTimeout {
                        self.counters.timed_out.inc();
                    }
                    Err(on_timeout)
                } else {
                    // Granted or evicted at the same instant: that answer
                    // is already in the channel.
                    rx.try_recv().unwrap_or(Err(on_timeout))
                }
            }
        }
    }

    fn remove_waiter(&self, id: u64) -> bool {
        let mut st = self.lock();
        match st.queue.iter().position(|w| w.id == id) {
            Some(i) => {
                st.queue.remove(i);
                true
            }
            None => false,
        }
    }

    /// Picks an eligible endpoint and charges it one request.
    fn try_grant(
        self: &Arc<Self>,
        st: &mut PoolState,
        enqueued_at: Instant,
        now: Instant,
    ) -> Option<Lease> {
        st.fill_loads(now);
        st.rotation = st.rotation.wrapping_add(1);
        let i = balance::choose(
            &st.loads,
            st.settings.queue.scoring,
            st.settings.queue.latency_threshold_s,
            st.rotation,
        )?;
        let e = &mut st.endpoints[i];
        e.in_flight += 1;
        let probe = match e.circuit {
            Circuit::Open { reopenings, .. } => {
                e.circuit = Circuit::HalfOpen { reopenings };
                true
            }
            _ => false,
        };
        Some(Lease {
            pool: Arc::clone(self),
            endpoint_id: e.id,
            endpoint: Arc::clone(&e.endpoint),
            target: e.target.clone(),
            addr: Arc::clone(&e.addr),
            queue_wait: now.saturating_duration_since(enqueued_at),
            probe,
            sampled: std::sync::atomic::AtomicBool::new(false),
            armed: true,
        })
    }

    /// Hands leases to waiters from the front while endpoints are eligible.
    fn dispatch(self: &Arc<Self>, st: &mut PoolState) {
        // Read the clock only when someone is waiting (not on every release).
        let mut now = None;
        while let Some(front) = st.queue.front() {
            if front.tx.is_closed() {
                st.queue.pop_front();
                continue;
            }
            let enqueued_at = front.enqueued_at;
            let now = *now.get_or_insert_with(Instant::now);
            let Some(lease) = self.try_grant(st, enqueued_at, now) else {
                break;
            };
            let Some(waiter) = st.queue.pop_front() else {
                break;
            };
            match waiter.tx.send(Ok(lease)) {
                Ok(()) => {
                    self.counters.dispatched.inc();
                }
                Err(Ok(mut lease)) => {
                    // The waiter vanished after the check above: take the
                    // lease back here, under the lock we already hold.
                    lease.armed = false;
                    st.uncharge(lease.endpoint_id, lease.probe);
                }
                Err(Err(_)) => {}
            }
        }
        if !st.queue.is_empty() {
            self.schedule_wake(st);
        }
    }

    /// Waiters remain and nothing is eligible: if an open circuit will
    /// admit a probe later, wake the dispatcher then (a timer event, not a
    /// polling tick).
    fn schedule_wake(self: &Arc<Self>, st: &mut PoolState) {
        let next = st
            .endpoints
            .iter()
            .filter(|e| !e.draining)
            .filter_map(|e| match e.circuit {
                Circuit::Open { until, .. } => Some(until),
                _ => None,
            })
            .min();
        let Some(at) = next else { return };
        if st.wake_at.is_some_and(|w| w <= at) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        st.wake_at = Some(at);
        let pool = Arc::downgrade(self);
        handle.spawn(async move {
            tokio::time::sleep_until(at).await;
            if let Some(pool) = pool.upgrade() {
                let mut st = pool.lock();
                if st.wake_at == Some(at) {
                    st.wake_at = None;
                }
                pool.dispatch(&mut st);
            }
        });
    }

    fn release(self: &Arc<Self>, endpoint_id: u64, unjudged_probe: bool) {
        let mut st = self.lock();
        st.uncharge(endpoint_id, unjudged_probe);
        self.dispatch(&mut st);
    }

    fn observe(self: &Arc<Self>, endpoint_id: u64, sample: Sample) {
        let mut st = self.lock();
        self.record_sample(&mut st, endpoint_id, sample, Instant::now());
        self.dispatch(&mut st);
    }

    /// [`Self::observe`] (as of `now`) and [`Self::release`] under one lock.
    fn observe_and_release(self: &Arc<Self>, endpoint_id: u64, sample: Sample, now: Instant) {
        let mut st = self.lock();
        self.record_sample(&mut st, endpoint_id, sample, now);
        // Sampled: a probe's verdict is in.
        st.uncharge(endpoint_id, false);
        self.dispatch(&mut st);
    }

    fn record_sample(&self, st: &mut PoolState, endpoint_id: u64, sample: Sample, now: Instant) {
        let q = st.settings.queue;
        let circuit = st.settings.circuit;
        match sample {
            Sample::Success(d) | Sample::Timeout(d) => {
                st.latencies.push_back((now, d));
                if st.latencies.len() > LATENCY_WINDOW {
                    st.latencies.pop_front();
                }
                st.p95_dirty = true;
            }
            Sample::Failure(_) | Sample::RateLimited(..) => {}
        }
        if let Some(e) = st.endpoints.iter_mut().find(|e| e.id == endpoint_id) {
            let value = match sample {
                Sample::Success(d) => {
                    if !matches!(e.circuit, Circuit::Closed { .. }) {
                        if let Some(tx) = &self.counters.events {
                            let _ = tx.try_send(CircuitEvent {
                                pool: self.name.to_string(),
                                endpoint: e.addr.to_string(),
                                open: false,
                                until: None,
                            });
                        }
                    }
                    e.circuit = Circuit::Closed { failures: 0 };
                    d.as_secs_f64()
                }
                Sample::Failure(d) | Sample::Timeout(d) | Sample::RateLimited(d, _) => {
                    let before = e.circuit.state(now);
                    e.circuit.on_failure(now, &circuit);
                    if let (
                        Sample::RateLimited(_, Some(retry_after)),
                        Circuit::Open { until, reopenings },
                    ) = (sample, e.circuit)
                    {
                        // The provider said when to come back: not before.
                        e.circuit = Circuit::Open {
                            until: until.max(now + retry_after),
                            reopenings,
                        };
                    }
                    if before != CircuitState::Open && e.circuit.state(now) == CircuitState::Open {
                        tracing::warn!(pool = &*self.name, endpoint = &*e.addr, "circuit opened");
                        if let (Some(tx), Circuit::Open { until, .. }) =
                            (&self.counters.events, e.circuit)
                        {
                            let _ = tx.try_send(CircuitEvent {
                                pool: self.name.to_string(),
                                endpoint: e.addr.to_string(),
                                open: true,
                                until: Some(until),
                            });
                        }
                    }
                    failure_sample(d.as_secs_f64(), q.latency_threshold_s)
                }
            };
            e.ewma = Some(q.scoring.update(e.ewma, value, q.ewma_alpha));
        }
    }

    /// The measurements the policy's gates look at.
    pub fn measurements(&self) -> PoolMeasurements {
        self.measurements_at(Instant::now())
    }

    /// [`Self::measurements`] as of `now`.
    pub fn measurements_at(&self, now: Instant) -> PoolMeasurements {
        let st = self.lock();
        let availability = availability_of(&st, now);
        let fresh: Vec<&ProbeReading> = match st.settings.probe {
            None => Vec::new(),
            Some(p) => st
                .endpoints
                .iter()
                .filter(|e| !e.draining)
                .filter_map(|e| e.probe.as_ref())
                .filter(|r| r.usable(&p, now))
                .collect(),
        };
        let waiting: u32 = fresh.iter().filter_map(|r| r.waiting).sum();
        PoolMeasurements {
            vram_free_mb: fresh.iter().filter_map(|r| r.vram_free_mb).max(),
            queue_depth: Some(
                u32::try_from(st.queue.len())
                    .unwrap_or(u32::MAX)
                    .saturating_add(waiting),
            ),
            latency_ms: st
                .endpoints
                .iter()
                .filter(|e| !e.draining)
                .filter_map(|e| e.ewma)
                .reduce(f64::min)
                .map(|s| s * 1000.0),
            healthy: Some(availability == Availability::Ready),
            structured_degraded: st.structured_degraded_until.is_some_and(|u| now < u),
            unhealthy_because: (availability != Availability::Ready).then(|| availability.as_str()),
        }
    }

    /// Applies the control plane's forced circuit states: `(endpoint, open,
    /// until)`, an endpoint of `None` meaning every endpoint of the pool.
    /// Anything not listed goes back to the local breaker.
    pub fn set_forced(self: &Arc<Self>, forced: &[(Option<Endpoint>, bool, Instant)]) {
        let mut st = self.lock();
        for e in &mut st.endpoints {
            e.forced = forced
                .iter()
                .filter(|(ep, _, _)| ep.as_ref().is_none_or(|x| *x == *e.endpoint))
                .map(|(_, open, until)| (*open, *until))
                // An open override wins over a closed one.
                .max_by_key(|(open, until)| (*open, *until));
        }
        self.dispatch(&mut st);
        if !st.queue.is_empty() {
            // A forced-open circuit that expires frees the endpoint.
            if let Some(at) = st
                .endpoints
                .iter()
                .filter_map(|e| e.forced.map(|f| f.1))
                .min()
            {
                let pool = Arc::downgrade(self);
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        tokio::time::sleep_until(at).await;
                        if let Some(p) = pool.upgrade() {
                            let mut st = p.lock();
                            p.dispatch(&mut st);
                        }
                    });
                }
            }
        }
    }

    /// Marks the pool degraded for structured output until `until`.
    pub fn mark_structured_degraded(&self, until: Instant) {
        let mut st = self.lock();
        st.structured_degraded_until =
            Some(st.structured_degraded_until.map_or(until, |u| u.max(until)));
    }

    /// A consistent view of the pool right now.
    pub fn status(&self) -> PoolStatus {
        let st = self.lock();
        PoolStatus {
            name: Arc::clone(&self.name),
            queue_depth: st.queue.len(),
            oldest_wait: st.queue.front().map(|w| w.enqueued_at.elapsed()),
            endpoints: st
                .endpoints
                .iter()
                .map(|e| EndpointStatus {
                    addr: Arc::clone(&e.addr),
                    in_flight: e.in_flight,
                    ewma_s: e.ewma,
                    circuit: match e.forced {
                        Some((true, until)) if Instant::now() < until => CircuitState::Open,
                        _ => e.circuit.state(Instant::now()),
                    },
                    draining: e.draining,
                })
                .collect(),
        }
    }
}

impl Probed for PoolRuntime {
    /// Endpoints a capacity probe should poll now.
    fn probe_targets(&self) -> Vec<Endpoint> {
        let st = self.lock();
        st.endpoints.iter().map(|e| (*e.endpoint).clone()).collect()
    }

    /// Records what a capacity probe saw at `endpoint`; a change may make
    /// endpoints eligible, so waiters are dispatched.
    fn record_probe(self: &Arc<Self>, endpoint: &Endpoint, reading: ProbeReading) {
        let mut st = self.lock();
        if let Some(e) = st.endpoints.iter_mut().find(|e| *e.endpoint == *endpoint) {
            e.probe = Some(reading);
        }
        self.dispatch(&mut st);
    }
}

impl PoolState {
    fn uncharge(&mut self, endpoint_id: u64, unjudged_probe: bool) {
        if let Some(e) = self.endpoints.iter_mut().find(|e| e.id == endpoint_id) {
            e.in_flight = e.in_flight.saturating_sub(1);
            if let (true, Circuit::HalfOpen { reopenings }) = (unjudged_probe, e.circuit) {
                // The probe ended without a verdict: let the next one try.
                e.circuit = Circuit::Open {
                    until: Instant::now(),
                    reopenings,
                };
            }
        }
    }

    fn fill_loads(&mut self, now: Instant) {
        let max_concurrency = self.settings.max_concurrency;
        let probe = self.settings.probe;
        let model = self.settings.model.as_deref();
        self.loads.clear();
        self.loads
            .extend(self.endpoints.iter().map(|e| EndpointLoad {
                ewma: e.ewma,
                in_flight: e.in_flight,
                max_concurrency,
                available: !e.draining && e.admits(now) && e.probe_ok(probe.as_ref(), now),
                preferred: match (model, &e.probe) {
                    (Some(m), Some(r)) => r.resident.iter().any(|x| x == m),
                    _ => false,
                },
            }));
    }

    fn expire_latencies(&mut self, now: Instant) {
        while self
            .latencies
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > LATENCY_MAX_AGE)
        {
            self.latencies.pop_front();
            self.p95_dirty = true;
        }
    }

    fn p95(&mut self, now: Instant) -> Option<Duration> {
        if let Some((at, cached)) = self.p95_cache {
            let fresh_enough = now.saturating_duration_since(at) < P95_REFRESH;
            // The first samples (or the last ones expiring) always count.
            let emptiness_changed = cached.is_some() == self.latencies.is_empty();
            if !self.p95_dirty || (fresh_enough && !emptiness_changed) {
                return cached;
            }
        }
        let p95 = self.compute_p95();
        self.p95_cache = Some((now, p95));
        self.p95_dirty = false;
        p95
    }

    fn compute_p95(&self) -> Option<Duration> {
        if self.latencies.is_empty() {
            return None;
        }
        let mut v: Vec<Duration> = self.latencies.iter().map(|(_, d)| *d).collect();
        v.sort_unstable();
        let rank = (v.len() * 95).div_ceil(100).max(1) - 1;
        v.get(rank).copied()
    }

    /// Queue wait estimate: the waiters ahead (and this request) served by
    /// the open slots at the best endpoint's EWMA. `None` without an EWMA.
    fn expected_wait(&self, now: Instant) -> Option<Duration> {
        let usable: Vec<&EndpointState> = self
            .endpoints
            .iter()
            .filter(|e| {
                !e.draining && e.admits(now) && e.probe_ok(self.settings.probe.as_ref(), now)
            })
            .collect();
        let service = usable.iter().filter_map(|e| e.ewma).reduce(f64::min)?;
        let slots: u32 = usable
            .iter()
            .map(|e| self.settings.max_concurrency.unwrap_or(e.in_flight.max(1)))
            .sum();
        let ahead = self.queue.len() as f64 + 1.0;
        let wait = service * ahead / f64::from(slots.max(1));
        Some(Duration::from_secs_f64(wait.min(1e6)))
    }

    fn shed_all(&mut self, why: Shed) {
        for w in self.queue.drain(..) {
            let _ = w.tx.send(Err(why));
        }
    }
}

/// Removes a queued waiter whose future was dropped (client gone).
struct QueuedGuard<'a> {
    pool: &'a Arc<PoolRuntime>,
    id: u64,
    armed: bool,
}

impl Drop for QueuedGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.pool.remove_waiter(self.id);
        }
    }
}

/// The right to send one request to one endpoint. Dropping it releases the
/// endpoint's slot and wakes the next waiter.
pub struct Lease {
    pool: Arc<PoolRuntime>,
    endpoint_id: u64,
    endpoint: Arc<Endpoint>,
    target: Option<Arc<crate::forward::UpstreamTarget>>,
    addr: Arc<str>,
    queue_wait: Duration,
    /// This request is a half-open circuit's probe.
    probe: bool,
    sampled: std::sync::atomic::AtomicBool,
    armed: bool,
}

impl Lease {
    /// The endpoint to send to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The endpoint's URI parts and `Host` header, when they parse.
    pub fn target(&self) -> Option<&crate::forward::UpstreamTarget> {
        self.target.as_deref()
    }

    /// The endpoint's address label.
    pub fn addr(&self) -> &Arc<str> {
        &self.addr
    }

    /// The pool's name.
    pub fn pool_name(&self) -> &Arc<str> {
        &self.pool.name
    }

    /// The pool's name as an `x-router-route` header value.
    pub fn route_header(&self) -> Option<&http::HeaderValue> {
        self.pool.route_header()
    }

    /// How long the request waited in the queue.
    pub fn queue_wait(&self) -> Duration {
        self.queue_wait
    }

    /// Folds what the attempt taught us into the endpoint's EWMA.
    pub fn observe(&self, sample: Sample) {
        self.sampled
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.pool.observe(self.endpoint_id, sample);
    }

    /// Records the attempt's sample, taken at `now`, and gives the slot
    /// back: what [`Lease::observe`] then dropping the lease do, under one
    /// lock.
    pub fn finish(mut self, sample: Sample, now: Instant) {
        self.sampled
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if self.armed {
            self.armed = false;
            self.pool.observe_and_release(self.endpoint_id, sample, now);
        } else {
            self.pool.observe(self.endpoint_id, sample);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            let unjudged = self.probe && !self.sampled.load(std::sync::atomic::Ordering::Relaxed);
            self.pool.release(self.endpoint_id, unjudged);
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("pool", &self.pool.name)
            .field("addr", &self.addr)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_policy::Scoring;

    fn settings(max_size: usize, timeout_ms: u64, max_concurrency: Option<u32>) -> PoolSettings {
        PoolSettings::new(
            QueueSettings {
                max_size,
                timeout: Duration::from_millis(timeout_ms),
                latency_threshold_s: 3.0,
                ewma_alpha: 0.3,
                scoring: Scoring::PeakEwma,
            },
            max_concurrency,
        )
    }

    fn eps(addrs: &[&str]) -> Vec<Endpoint> {
        addrs.iter().map(|a| Endpoint::parse(a).unwrap()).collect()
    }

    fn pool(
        max_size: usize,
        timeout_ms: u64,
        cap: Option<u32>,
        addrs: &[&str],
    ) -> Arc<PoolRuntime> {
        PoolRuntime::new(
            "p",
            settings(max_size, timeout_ms, cap),
            &eps(addrs),
            PoolCounters::default(),
        )
    }

    fn in_flight(p: &PoolRuntime) -> u32 {
        p.status().endpoints.iter().map(|e| e.in_flight).sum()
    }

    #[tokio::test(start_paused = true)]
    async fn no_endpoints_is_an_immediate_no_backend() {
        let p = pool(10, 1_000_000, None, &[]);
        let started = Instant::now();
        assert_eq!(p.acquire(None).await.unwrap_err(), Shed::NoBackend);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_slot_wakes_the_next_waiter_without_a_tick() {
        let p = pool(10, 60_000, Some(1), &["h:1"]);
        let first = p.acquire(None).await.unwrap();
        let waiter = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire(None).await.map(|l| l.queue_wait()) }
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(p.status().queue_depth, 1);
        drop(first);
        let waited = waiter.await.unwrap().unwrap();
        // Woken exactly when the slot was freed: no 50 ms polling step.
        assert_eq!(waited, Duration::from_millis(250));
        assert_eq!(in_flight(&p), 0);
        assert_eq!(p.counters.dispatched.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_waiter_is_evicted_when_the_queue_is_full() {
        let p = pool(2, 60_000, Some(1), &["h:1"]);
        let _busy = p.acquire(None).await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let p2 = Arc::clone(&p);
            waiters.push(tokio::spawn(async move { p2.acquire(None).await }));
            tokio::task::yield_now().await;
        }
        let oldest = waiters.remove(0).await.unwrap();
        assert_eq!(oldest.unwrap_err(), Shed::QueueFull);
        assert_eq!(p.status().queue_depth, 2);
        assert_eq!(p.counters.evicted.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_past_the_timeout_is_shed() {
        let p = pool(10, 500, Some(1), &["h:1"]);
        let _busy = p.acquire(None).await.unwrap();
        let started = Instant::now();
        assert_eq!(p.acquire(None).await.unwrap_err(), Shed::QueueTimeout);
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(p.status().queue_depth, 0);
        assert_eq!(p.counters.timed_out.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_leaves_the_queue_at_once() {
        let p = pool(10, 60_000, Some(1), &["h:1"]);
        let busy = p.acquire(None).await.unwrap();
        let waiter = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire(None).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(p.status().queue_depth, 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(p.status().queue_depth, 0);
        drop(busy);
        assert_eq!(in_flight(&p), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn emptying_the_pool_sheds_waiters_and_keeps_in_flight_sane() {
        let p = pool(10, 60_000, Some(1), &["h:1"]);
        let busy = p.acquire(None).await.unwrap();
        let waiter = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire(None).await }
        });
        tokio::task::yield_now().await;
        p.update(settings(10, 60_000, Some(1)), &[]);
        assert_eq!(waiter.await.unwrap().unwrap_err(), Shed::NoBackend);
        // The removed endpoint's lease releases nothing and breaks nothing.
        drop(busy);
        p.update(settings(10, 60_000, Some(1)), &eps(&["h:2"]));
        let l = p.acquire(None).await.unwrap();
        assert_eq!(l.endpoint().authority(), "h:2");
        drop(l);
        assert_eq!(in_flight(&p), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn untried_endpoints_get_one_probe_each() {
        let p = pool(10, 60_000, None, &["h:1", "h:2"]);
        let a = p.acquire(None).await.unwrap();
        let b = p.acquire(None).await.unwrap();
        assert_ne!(a.endpoint(), b.endpoint());
        // Both probes in flight and no samples: the third request waits.
        let third = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire(None).await.map(|l| l.endpoint().clone()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(p.status().queue_depth, 1);
        b.observe(Sample::Success(Duration::from_millis(10)));
        // The sample makes b's endpoint eligible (under threshold) at once.
        assert_eq!(&third.await.unwrap().unwrap(), b.endpoint());
        drop((a, b));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_count_as_slow() {
        let p = pool(10, 60_000, None, &["h:1", "h:2"]);
        let a = p.acquire(None).await.unwrap();
        let b = p.acquire(None).await.unwrap();
        a.observe(Sample::Failure(Duration::from_micros(50)));
        b.observe(Sample::Success(Duration::from_millis(100)));
        let (dead, live) = (a.endpoint().clone(), b.endpoint().clone());
        drop((a, b));
        for _ in 0..5 {
            let l = p.acquire(None).await.unwrap();
            assert_eq!(l.endpoint(), &live, "a failing endpoint must not look fast");
            assert_ne!(l.endpoint(), &dead);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_deadline_before_the_queue_timeout_wins() {
        let p = pool(10, 60_000, Some(1), &["h:1"]);
        let _busy = p.acquire(None).await.unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        assert_eq!(
            p.acquire(Some(deadline)).await.unwrap_err(),
            Shed::AttemptTimeout
        );
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        // An attempt timeout is not a queue timeout.
        assert_eq!(p.counters.timed_out.get(), 0);
        assert_eq!(p.status().queue_depth, 0);
    }

    fn with_breaker(addrs: &[&str], errors: u32, open_ms: u64) -> Arc<PoolRuntime> {
        let mut s = settings(10, 60_000, None);
        s.circuit = CircuitSettings {
            consecutive_errors: errors,
            open_duration: Duration::from_millis(open_ms),
        };
        PoolRuntime::new("p", s, &eps(addrs), PoolCounters::default())
    }

    #[tokio::test(start_paused = true)]
    async fn the_circuit_opens_probes_once_and_backs_off() {
        let p = with_breaker(&["h:1"], 2, 1000);
        for _ in 0..2 {
            let l = p.acquire(None).await.unwrap();
            l.observe(Sample::Failure(Duration::from_millis(1)));
        }
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
        assert_eq!(p.availability(), Availability::Unhealthy);
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::HalfOpen);
        assert_eq!(p.availability(), Availability::Ready);
        // One probe; a second request waits for its verdict.
        let probe = p.acquire(None).await.unwrap();
        let second = tokio::spawn({
            let p = Arc::clone(&p);
            async move {
                p.acquire(Some(Instant::now() + Duration::from_millis(50)))
                    .await
            }
        });
        assert_eq!(second.await.unwrap().unwrap_err(), Shed::AttemptTimeout);
        // The probe fails: open again, for twice as long.
        probe.observe(Sample::Failure(Duration::from_millis(1)));
        drop(probe);
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
        tokio::time::advance(Duration::from_millis(1)).await;
        let probe = p.acquire(None).await.unwrap();
        probe.observe(Sample::Success(Duration::from_millis(5)));
        drop(probe);
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn finish_records_the_sample_and_frees_the_slot_for_the_next_waiter() {
        let p = pool(10, 60_000, Some(1), &["h:1"]);
        let first = p.acquire(None).await.unwrap();
        let waiter = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire(None).await.map(|l| l.queue_wait()) }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(p.status().queue_depth, 1);
        first.finish(Sample::Success(Duration::from_millis(40)), Instant::now());
        assert_eq!(p.status().endpoints[0].ewma_s, Some(0.04));
        let waited = waiter.await.unwrap().unwrap();
        assert_eq!(waited, Duration::from_millis(100));
        assert_eq!(in_flight(&p), 0);
        assert_eq!(p.counters.dispatched.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_finished_with_a_success_closes_the_circuit() {
        let p = with_breaker(&["h:1"], 1, 500);
        let l = p.acquire(None).await.unwrap();
        l.finish(Sample::Timeout(Duration::from_millis(100)), Instant::now());
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
        tokio::time::advance(Duration::from_millis(500)).await;
        let probe = p.acquire(None).await.unwrap();
        probe.finish(Sample::Success(Duration::from_millis(5)), Instant::now());
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Closed);
        assert_eq!(in_flight(&p), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_when_the_circuit_admits_a_probe() {
        let p = with_breaker(&["h:1"], 1, 500);
        let l = p.acquire(None).await.unwrap();
        l.observe(Sample::Timeout(Duration::from_millis(100)));
        drop(l);
        let started = Instant::now();
        // Queued behind an open circuit: no release will ever come, only
        // the timer.
        let lease = p.acquire(None).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        drop(lease);
        // A probe that ends without a verdict lets the next one probe.
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::HalfOpen);
        let again = p.acquire(None).await.unwrap();
        drop(again);
    }

    #[tokio::test(start_paused = true)]
    async fn drained_endpoints_take_nothing_new() {
        let p = pool(10, 60_000, None, &["h:1", "h:2"]);
        let busy = p.acquire(None).await.unwrap();
        let drained = busy.endpoint().clone();
        let mut s = settings(10, 60_000, None);
        s.drained = vec![drained.clone()];
        p.update(s, &eps(&["h:1", "h:2"]));
        for _ in 0..5 {
            let l = p.acquire(None).await.unwrap();
            assert_ne!(l.endpoint(), &drained);
        }
        drop(busy);
        let mut s = settings(10, 60_000, None);
        s.drain = true;
        p.update(s, &eps(&["h:1", "h:2"]));
        assert_eq!(p.availability(), Availability::Drained);
        assert_eq!(p.acquire(None).await.unwrap_err(), Shed::NoBackend);
    }

    #[tokio::test(start_paused = true)]
    async fn the_outlook_estimates_wait_and_p95() {
        let p = pool(10, 60_000, Some(1), &["h:1"]);
        assert_eq!(
            p.outlook(),
            PoolOutlook {
                free_now: true,
                expected_wait: Some(Duration::ZERO),
                p95: None
            }
        );
        let l = p.acquire(None).await.unwrap();
        // Busy and unmeasured: the wait cannot be estimated.
        assert_eq!(p.outlook().expected_wait, None);
        l.observe(Sample::Success(Duration::from_millis(200)));
        let o = p.outlook();
        assert!(!o.free_now);
        assert_eq!(o.p95, Some(Duration::from_millis(200)));
        // One slot at 200 ms: this request would wait about 200 ms.
        assert_eq!(o.expected_wait, Some(Duration::from_millis(200)));
        drop(l);
        // Samples older than a minute no longer count.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(p.outlook().p95, None);
    }
}
