//! The bounded FIFO, event-driven dispatch, and the [`Lease`] a request
//! holds while it uses an endpoint.
//!
//! A request asks for a lease:
//!
//! - With no endpoint at all, it is refused at once (`no_backend`): there
//!   is nothing to wait for.
//! - With an empty queue and an eligible endpoint, it gets its lease at
//!   once without touching the queue.
//! - Otherwise it joins the back of the queue. If the queue is then over
//!   its size, the *oldest* waiter is evicted with `queue_full` (it has
//!   already waited longest and is the most likely to miss its deadline).
//!   A waiter that reaches the queue timeout (or its attempt's deadline,
//!   when sooner) leaves with `queue_timeout` (`attempt_timeout`). A waiter
//!   whose client goes away (its future is dropped) leaves the queue at
//!   once.
//!
//! Dispatch has no polling tick: everything that can make an endpoint
//! eligible (a lease released, a sample folded in, a probe reading,
//! endpoints added, an override set) runs [`PoolRuntime::dispatch`] under
//! the same lock, which hands leases to waiters from the front of the queue
//! until no endpoint is eligible. Because an idle endpoint is always
//! eligible and every lease is released when its request ends (the lease's
//! `Drop`), a non-empty pool never stalls on requests; what time alone
//! changes (a circuit's open period, an override) the pool's wake timer
//! covers.
//!
//! Exactly one answer per waiter: a waiter's oneshot sender is consumed by
//! whichever comes first (grant, eviction, shutdown), and the timeout path
//! removes the waiter under the lock before deciding, so a grant racing a
//! timeout is either received or was never sent. A grant sent to a waiter
//! that vanished in between is taken back under the lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use router_policy::affinity::SessionPlacement;
use router_policy::Endpoint;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::state::PoolState;
use super::{PoolRuntime, Sample};
use router_upstream::forward::UpstreamTarget;

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
    /// Every endpoint went down while it waited (the last circuit opened,
    /// the health checks failed): it moves on at once rather than wait
    /// out its timeout.
    AllDown,
}

impl Shed {
    /// The outcome the attempt records (an attempt timeout given back
    /// before sending is `deadline_exhausted`).
    pub fn outcome(self) -> router_policy::Outcome {
        use router_policy::Outcome;
        match self {
            Self::QueueFull => Outcome::QueueFull,
            Self::QueueTimeout => Outcome::QueueTimeout,
            Self::NoBackend | Self::AllDown => Outcome::NoBackend,
            Self::AttemptTimeout => Outcome::DeadlineExhausted,
        }
    }
}

/// A request waiting in the queue.
pub(super) struct Waiter {
    id: u64,
    pub(super) enqueued_at: Instant,
    /// What the balancer knows of the request.
    shape: RequestShape,
    pub(super) tx: oneshot::Sender<Result<Lease, Shed>>,
}

impl PoolRuntime {
    /// The id of the endpoint at `addr`, if the pool has it.
    pub fn endpoint_id(&self, addr: &str) -> Option<u64> {
        self.lock()
            .endpoints
            .iter()
            .find(|e| *e.addr == *addr)
            .map(|e| e.id)
    }

    /// Whether an endpoint none of `avoid` could take a request now (a
    /// retry inside the pool), without taking it.
    pub fn other_endpoint_ready(&self, avoid: &[u64], now: Instant) -> bool {
        let mut st = self.lock();
        if st.closed || !st.queue.is_empty() {
            return false;
        }
        st.fill_loads(now, Default::default());
        let mut any = false;
        for (load, e) in st.loads.iter().zip(&st.endpoints) {
            any |= load.available && !avoid.contains(&e.id);
        }
        any
    }
}

impl Waiter {
    /// Its request's tenant, if any.
    pub(super) fn tenant(&self) -> Option<u64> {
        self.shape.tenant
    }
}

impl PoolRuntime {
    /// Waits for an endpoint, at most until the queue timeout or
    /// `attempt_deadline`, whichever comes first. Cancel-safe: dropping the
    /// future leaves the queue at once.
    #[cfg(test)]
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        attempt_deadline: Option<Instant>,
    ) -> Result<Lease, Shed> {
        self.acquire_at(attempt_deadline, Instant::now(), RequestShape::default())
            .await
    }

    /// Waits for an endpoint, at most until the queue timeout or
    /// `attempt_deadline`, whichever comes first; the caller has read the
    /// clock (`now`) just before. Cancel-safe: dropping the future leaves
    /// the queue at once. `shape` is what the balancer may know of the
    /// request (its prefix-affinity key and prompt size).
    pub async fn acquire_at(
        self: &Arc<Self>,
        attempt_deadline: Option<Instant>,
        now: Instant,
        shape: RequestShape,
    ) -> Result<Lease, Shed> {
        let (id, mut rx, timeout_at, on_timeout) = {
            let mut st = self.lock();
            if st.closed || st.endpoints.is_empty() || st.endpoints.iter().all(|e| e.draining) {
                return Err(Shed::NoBackend);
            }
            if st.queue.is_empty() {
                if let Some(lease) = self.try_grant(&mut st, now, now, &shape) {
                    self.counters.dispatched.inc();
                    return Ok(lease);
                }
            }
            st.next_id += 1;
            let id = st.next_id;
            let (tx, rx) = oneshot::channel();
            st.tenanted |= shape.tenant.is_some();
            st.queue.push_back(Waiter {
                id,
                enqueued_at: now,
                shape,
                tx,
            });
            if st.queue.len() > st.settings.queue.max_size {
                if let Some(oldest) = st.queue.pop_front() {
                    self.counters.evicted.inc();
                    let _ = oldest.tx.send(Err(Shed::QueueFull));
                }
            }
            self.dispatch(&mut st);
            let queue_deadline =
                crate::clock::later(now, st.settings.queue.timeout, crate::clock::A_YEAR);
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
    /// A lease on an endpoint none of `avoid`, at once or not at all
    /// (the second attempt of a request hedged inside its pool: it never
    /// queues, and never jumps a queue).
    pub fn try_acquire_avoiding(
        self: &Arc<Self>,
        avoid: &[u64],
        now: Instant,
        shape: RequestShape,
    ) -> Option<Lease> {
        let mut st = self.lock();
        if st.closed || !st.queue.is_empty() {
            return None;
        }
        let lease = self.try_grant_avoiding(&mut st, now, now, &shape, avoid)?;
        self.counters.dispatched.inc();
        Some(lease)
    }

    fn try_grant(
        self: &Arc<Self>,
        st: &mut PoolState,
        enqueued_at: Instant,
        now: Instant,
        shape: &RequestShape,
    ) -> Option<Lease> {
        self.try_grant_avoiding(st, enqueued_at, now, shape, &[])
    }

    fn try_grant_avoiding(
        self: &Arc<Self>,
        st: &mut PoolState,
        enqueued_at: Instant,
        now: Instant,
        shape: &RequestShape,
        avoid: &[u64],
    ) -> Option<Lease> {
        st.fill_loads(now, shape.quota);
        if !avoid.is_empty() {
            for (load, e) in st.loads.iter_mut().zip(&st.endpoints) {
                if avoid.contains(&e.id) {
                    load.available = false;
                }
            }
        }
        st.rotation = st.rotation.wrapping_add(1);
        let prefix = shape.prefix.as_deref();
        let (i, session, placed) = match shape.session_key.and_then(|key| st.choose_session(key)) {
            Some((i, how)) => (i, Some(how), None),
            None if prefix.is_some() => {
                let picked = st.pick_engine_aware(prefix)?;
                (picked.endpoint, None, Some(picked))
            }
            None => (st.choose()?, None, None),
        };
        // A session's home is where it was placed; a spill is a visit (the
        // session goes home once there is room, as on every other proxy).
        if let Some(key) = shape
            .session_key
            .filter(|_| session.is_some_and(|s| s != SessionPlacement::Spilled))
        {
            let id = st.endpoints[i].id;
            st.last_served.record(key, id);
        }
        let (uncached, placement) = match prefix {
            Some(req) => st.record_prefix(i, req, placed, self.prefix_share.get(), &self.name),
            None => (None, None),
        };
        // With prefix affinity, the prefill is of the tokens not held.
        let prefill_tokens = uncached.unwrap_or(shape.input_tokens);
        let e = &mut st.endpoints[i];
        e.in_flight += 1;
        if e.quota.is_known() {
            // Counted against what its provider last said is left.
            e.quota.charge(shape.quota);
        }
        e.pending_prefill_tokens = e.pending_prefill_tokens.saturating_add(prefill_tokens);
        let probe = e.breaker.on_grant();
        Some(Lease {
            pool: Arc::clone(self),
            endpoint_id: e.id,
            endpoint: Arc::clone(&e.endpoint),
            target: e.target.clone(),
            addr: Arc::clone(&e.addr),
            queue_wait: now.saturating_duration_since(enqueued_at),
            input_tokens: prefill_tokens,
            prefill_pending: AtomicBool::new(prefill_tokens > 0),
            probe,
            session,
            prefix: placement.map(Box::new),
            sampled: AtomicBool::new(false),
            armed: true,
        })
    }

    /// Hands leases to waiters from the front while endpoints are eligible;
    /// with waiters left, arms the wake timer for the next circuit change.
    pub(super) fn dispatch(self: &Arc<Self>, st: &mut PoolState) {
        // Read the clock only when someone is waiting (not on every release).
        let mut now = None;
        while !st.queue.is_empty() {
            // FIFO, or, when tenants share the queue, round robin between
            // them (`router_policy::tenant::fair_next`).
            let i = st.next_waiter();
            let Some(next) = st.queue.get(i) else {
                break;
            };
            if next.tx.is_closed() {
                st.queue.remove(i);
                continue;
            }
            let (enqueued_at, shape) = (next.enqueued_at, next.shape.clone());
            let now = *now.get_or_insert_with(Instant::now);
            let Some(lease) = self.try_grant(st, enqueued_at, now, &shape) else {
                break;
            };
            let Some(waiter) = st.queue.remove(i) else {
                break;
            };
            st.note_served(waiter.shape.tenant);
            match waiter.tx.send(Ok(lease)) {
                Ok(()) => {
                    self.counters.dispatched.inc();
                }
                Err(Ok(mut lease)) => {
                    // The waiter vanished after the check above: take the
                    // lease back here, under the lock we already hold.
                    lease.armed = false;
                    st.uncharge(lease.endpoint_id, lease.probe, lease.unprefilled());
                }
                Err(Err(_)) => {}
            }
        }
        // Waiters remain (so the clock was read): nothing is eligible.
        if let (false, Some(now)) = (st.queue.is_empty(), now) {
            if let Some(at) = st.next_circuit_change(now) {
                st.wake.arm(at, self, Self::wake);
            }
        }
    }

    /// The wake timer's call: an open period or an override ended at `at`.
    fn wake(self: &Arc<Self>, at: Instant) {
        let mut st = self.lock();
        st.wake.fired(at);
        self.dispatch(&mut st);
    }

    fn release(self: &Arc<Self>, endpoint_id: u64, unjudged_probe: bool, unprefilled: u64) {
        let mut st = self.lock();
        st.uncharge(endpoint_id, unjudged_probe, unprefilled);
        self.dispatch(&mut st);
    }

    /// Folds a per-token latency sample into the endpoint's
    /// [`router_policy::engine_aware::TokenLatency`]; `prefilled` tokens
    /// are no longer waiting for their prefill there.
    fn observe_tokens(&self, endpoint_id: u64, sample: TokenSample, prefilled: u64) {
        let mut st = self.lock();
        let alpha = st.settings.queue.ewma_alpha;
        if let Some(e) = st.endpoint_mut(endpoint_id) {
            e.pending_prefill_tokens = e.pending_prefill_tokens.saturating_sub(prefilled);
            match sample {
                TokenSample::FirstToken {
                    after,
                    input_tokens,
                } => e
                    .tokens
                    .observe_first_token(after.as_secs_f64(), input_tokens, alpha),
                TokenSample::Whole {
                    took,
                    input_tokens,
                    output_tokens,
                } => e
                    .tokens
                    .observe_whole(took.as_secs_f64(), input_tokens, output_tokens, alpha),
            }
        }
    }

    fn observe(self: &Arc<Self>, endpoint_id: u64, sample: Sample) {
        let mut st = self.lock();
        self.record_sample(&mut st, endpoint_id, sample, Instant::now());
        self.dispatch(&mut st);
    }

    /// [`Self::observe`] (as of `now`) and [`Self::release`] under one lock.
    #[inline]
    fn observe_and_release(
        self: &Arc<Self>,
        endpoint_id: u64,
        sample: Sample,
        now: Instant,
        unprefilled: u64,
    ) {
        let mut st = self.lock();
        self.record_sample(&mut st, endpoint_id, sample, now);
        // Sampled: a probe's verdict is in.
        st.uncharge(endpoint_id, false, unprefilled);
        self.dispatch(&mut st);
    }
}

/// What the balancer may know of a request before choosing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestShape {
    /// Its prompt's block chain ([`PoolRuntime::prefix_request`]).
    pub prefix: Option<Arc<super::PrefixRequest>>,
    /// Its session key ([`PoolRuntime::session_key`]): when given, it
    /// places the request, before any other rule.
    pub session_key: Option<u64>,
    /// Its prompt size, tokens (estimated; 0 when unknown).
    pub input_tokens: u64,
    /// Its tenant (a hash of the name), for fairness in the queue.
    pub tenant: Option<u64>,
    /// Its token estimate, for the endpoints' quotas
    /// ([`router_policy::quota::admit`]).
    pub quota: router_policy::quota::Estimate,
}

/// How prefix affinity placed a request, for the route log: the matched
/// blocks and expected time to first token of the chosen endpoint and of
/// the runner-up.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixPlacement {
    /// `prefix_matched`, `prefix_home`, `prefix_scored`
    /// ([`router_policy::engine_aware::Placement`]).
    pub placement: &'static str,
    /// Whole blocks in the prompt.
    pub blocks: usize,
    /// Leading blocks the chosen endpoint likely held.
    pub matched: usize,
    /// Its expected time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// The runner-up: address, matched blocks, expected time to first
    /// token (ms).
    pub runner_up: Option<(Arc<str>, usize, f64)>,
}

/// A latency measured against a token count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TokenSample {
    /// The first token came `after` the request was sent, for a prompt of
    /// `input_tokens`.
    FirstToken {
        /// Time to first token.
        after: Duration,
        /// Prompt tokens (counted or estimated).
        input_tokens: u64,
    },
    /// A whole answer: `input_tokens` in, `output_tokens` out, in `took`.
    Whole {
        /// Sent to answered.
        took: Duration,
        /// Prompt tokens.
        input_tokens: u64,
        /// Tokens generated.
        output_tokens: u64,
    },
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
    target: Option<Arc<UpstreamTarget>>,
    addr: Arc<str>,
    queue_wait: Duration,
    /// The request's prompt tokens (estimated), for per-token latency.
    input_tokens: u64,
    /// Its prompt is counted in the endpoint's pending prefill (no first
    /// token yet).
    prefill_pending: AtomicBool,
    /// This request is a half-open circuit's probe.
    probe: bool,
    /// How session affinity placed it, when it did.
    session: Option<router_policy::affinity::SessionPlacement>,
    /// How prefix affinity placed it, when it did (boxed: leases move
    /// through the hot path, most without one).
    prefix: Option<Box<PrefixPlacement>>,
    sampled: AtomicBool,
    armed: bool,
}

impl Lease {
    /// The endpoint to send to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The endpoint's URI parts and `Host` header, when they parse.
    pub fn target(&self) -> Option<&UpstreamTarget> {
        self.target.as_deref()
    }

    /// How session affinity placed the request, when it did.
    pub fn session(&self) -> Option<router_policy::affinity::SessionPlacement> {
        self.session
    }

    /// How prefix affinity placed the request, when it did.
    pub fn prefix(&self) -> Option<&PrefixPlacement> {
        self.prefix.as_deref()
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

    /// Reads the rate-limit headers of the endpoint's answer (`headers`;
    /// `rate_limited`: a 429) into its quota ([`router_policy::quota`]);
    /// an answer without them changes nothing (and takes no lock).
    pub fn observe_quota(&self, headers: &http::HeaderMap, rate_limited: bool) {
        if !router_policy::quota::headers::has_limits(headers) {
            return;
        }
        let reading = router_policy::quota::headers::read(
            headers,
            rate_limited,
            router_policy::wall_clock::unix_ms(),
        );
        if !reading.is_empty() {
            self.pool
                .record_quota(self.endpoint_id, &reading, Instant::now());
        }
    }

    /// Folds what the attempt taught us into the endpoint's EWMA.
    pub fn observe(&self, sample: Sample) {
        self.sampled.store(true, Ordering::Relaxed);
        self.pool.observe(self.endpoint_id, sample);
    }

    /// A handle on the leased endpoint that outlives the lease (to sample
    /// an attempt that was cancelled with its lease).
    pub fn endpoint_handle(&self) -> EndpointHandle {
        EndpointHandle {
            pool: Arc::clone(&self.pool),
            endpoint_id: self.endpoint_id,
        }
    }

    /// Folds a stream's time per output token into its endpoint's EWMA.
    pub fn observe_tpot(&self, tpot: std::time::Duration) {
        self.pool.record_tpot(self.endpoint_id, tpot);
    }

    /// The prompt tokens still counted as waiting for their prefill (and
    /// no longer, after this call).
    fn unprefilled(&self) -> u64 {
        if self.prefill_pending.swap(false, Ordering::Relaxed) {
            self.input_tokens
        } else {
            0
        }
    }

    /// Folds a latency-per-token sample (engine-aware balancing).
    pub fn observe_tokens(&self, sample: TokenSample) {
        self.pool.observe_tokens(self.endpoint_id, sample, 0);
    }

    /// The first token of a streamed answer came `after` the request was
    /// sent: its prompt is no longer pending prefill there, and a
    /// prefill-per-input-token sample, when the prompt size is known.
    pub fn observe_first_token(&self, after: Duration) {
        let prefilled = self.unprefilled();
        if prefilled > 0 {
            self.pool.observe_tokens(
                self.endpoint_id,
                TokenSample::FirstToken {
                    after,
                    input_tokens: prefilled,
                },
                prefilled,
            );
        }
    }

    /// Records the attempt's sample, taken at `now`, and gives the slot
    /// back: what [`Lease::observe`] then dropping the lease do, under one
    /// lock.
    pub fn finish(mut self, sample: Sample, now: Instant) {
        self.sampled.store(true, Ordering::Relaxed);
        if self.armed {
            self.armed = false;
            let unprefilled = self.unprefilled();
            self.pool
                .observe_and_release(self.endpoint_id, sample, now, unprefilled);
        } else {
            self.pool.observe(self.endpoint_id, sample);
        }
    }
}

/// One endpoint of a pool, named beyond its lease (see
/// [`Lease::endpoint_handle`]).
#[derive(Clone)]
pub struct EndpointHandle {
    pool: Arc<PoolRuntime>,
    endpoint_id: u64,
}

impl EndpointHandle {
    /// Records a sample for the endpoint.
    pub fn observe(&self, sample: Sample) {
        self.pool.observe(self.endpoint_id, sample);
    }

    /// The endpoint's id in its pool.
    pub fn id(&self) -> u64 {
        self.endpoint_id
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            let unjudged = self.probe && !self.sampled.load(Ordering::Relaxed);
            let unprefilled = self.unprefilled();
            self.pool.release(self.endpoint_id, unjudged, unprefilled);
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
    use super::super::tests::{eps, in_flight, pool, settings};
    use super::*;

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
        assert_eq!(p.availability(), super::super::Availability::Drained);
        assert_eq!(p.acquire(None).await.unwrap_err(), Shed::NoBackend);
    }
}
