//! What a pool knows, behind its one lock: its endpoints, its queue, its
//! latencies, and the judgements made from them.
//!
//! An endpoint takes requests when it is not drained, its circuit admits
//! ([`Breaker::admits`]), with a capacity probe configured its last
//! reading is fresh and healthy ([`ProbeReading::usable`]), and with health
//! checks configured its checks say healthy. Two soft marks take it out
//! too, unless every endpoint those rules admit carries one
//! ([`router_policy::health::admits`]): the fleet's suspicion and an
//! outlier ejection. Among those, the balancer
//! ([`router_policy::balance`]) picks by latency and load;
//! [`PoolState::fill_loads`] gives it what it needs, in a buffer kept
//! across calls so that a grant allocates nothing.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use router_policy::affinity::{LastServed, Ring};
use router_policy::balance::{self, EndpointLoad, Scoring};
use router_policy::deadline::PoolOutlook;
use router_policy::engine_aware::{self, EngineLoad, Picked, PrefixMatch, TokenLatency};
use router_policy::health::{CheckState, Suspicion};
use router_policy::prefix_cache::BlockIndex;
use router_policy::quota::{self, Estimate, QuotaState};
use router_policy::{Endpoint, Probe};
use tokio::time::Instant;

use super::circuit::Breaker;
use super::latency::LatencyWindow;
use super::queue::Waiter;
use super::wake::WakeTimer;
use super::{Availability, PoolSettings, Shed};
use crate::probe::ProbeReading;
use router_upstream::forward::UpstreamTarget;

/// Session keys a pool remembers the last endpoint of (8 bytes of key and
/// 8 of id each, plus the table's overhead: a few MiB at most).
const LAST_SERVED_KEYS: usize = 65_536;

/// One endpoint of a pool.
pub(super) struct EndpointState {
    /// Names the endpoint to its leases across updates of the pool.
    pub(super) id: u64,
    pub(super) endpoint: Arc<Endpoint>,
    /// Its URI parts and `Host` header, parsed once.
    pub(super) target: Option<Arc<UpstreamTarget>>,
    pub(super) addr: Arc<str>,
    /// EWMA latency, seconds; `None` before the first answer.
    pub(super) ewma: Option<f64>,
    /// EWMA time per output token, seconds (from streams); `None` before
    /// the first stream with two tokens or more.
    pub(super) tpot: Option<f64>,
    pub(super) in_flight: u32,
    pub(super) draining: bool,
    pub(super) breaker: Breaker,
    pub(super) probe: Option<ProbeReading>,
    /// `in_flight` when `probe` was recorded (what the router has sent
    /// and seen end since corrects the engine's counts).
    pub(super) in_flight_at_scrape: u32,
    /// Latency per token (engine-aware balancing).
    pub(super) tokens: TokenLatency,
    /// Prompt tokens of this router's requests there that have no first
    /// token yet.
    pub(super) pending_prefill_tokens: u64,
    /// What the active health checks say (used when the pool has them).
    pub(super) checks: CheckState,
    /// Suspicion this proxy raised (and reported).
    pub(super) suspect: Suspicion<Instant>,
    /// The fleet's suspicion marks, from the control plane.
    pub(super) fleet_suspect: Suspicion<Instant>,
    /// This proxy has had an answer from it (a failure there then is no
    /// longer a first failure, see [`router_policy::health`]).
    pub(super) answered: bool,
    /// Requests and errors in the outlier window.
    pub(super) outlier: OutlierCounts,
    /// Ejected as an outlier until then.
    pub(super) ejected_until: Option<Instant>,
    /// Ejections in a row (an endpoint that served a window cleanly
    /// starts over).
    pub(super) ejections: u32,
    /// Prompt tokens the other proxies of a fleet sent here (uncached,
    /// as they estimated), as of when: drained at the endpoint's rate
    /// ([`router_policy::engine_aware::peer_prefill_left`]).
    pub(super) peer_prefill: (f64, Option<Instant>),
    /// Requests other proxies sent here since the last scrape (reset by
    /// the next: it counts them).
    pub(super) peer_sent: u32,
    /// The prompt blocks it likely holds (prefix affinity; made on first
    /// use, sized by [`router_policy::engine_aware::PrefixAffinity::index_blocks`]).
    pub(super) prefix_index: Option<BlockIndex>,
    /// What its provider's rate-limit headers said is left of its key's
    /// quota ([`router_policy::quota`]).
    pub(super) quota: QuotaState<Instant>,
    /// Until when the fleet was told this key is out of quota (a
    /// `quota` suspicion), so one window is reported once.
    pub(super) quota_reported_until: Option<Instant>,
}

/// Requests and errors of one endpoint in the current and the previous
/// outlier window (the judged rate is over both: a window that just
/// started still sees the last one).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OutlierCounts {
    pub(super) started: Option<Instant>,
    pub(super) requests: u32,
    pub(super) errors: u32,
    pub(super) prev_requests: u32,
    pub(super) prev_errors: u32,
}

impl OutlierCounts {
    /// Counts one ended request at `now`, rolling the window first.
    pub(super) fn record(&mut self, failed: bool, now: Instant, window: Duration) {
        match self.started {
            Some(t) if now.saturating_duration_since(t) < window => {}
            Some(t) if now.saturating_duration_since(t) < window * 2 => {
                self.prev_requests = self.requests;
                self.prev_errors = self.errors;
                self.requests = 0;
                self.errors = 0;
                self.started = Some(now);
            }
            _ => {
                *self = Self {
                    started: Some(now),
                    ..Self::default()
                }
            }
        }
        self.requests = self.requests.saturating_add(1);
        self.errors = self.errors.saturating_add(u32::from(failed));
    }

    /// Requests and errors over the two windows as of `now`; none once
    /// both have ended.
    pub(super) fn totals(&self, now: Instant, window: Duration) -> (u32, u32) {
        match self.started {
            Some(t) if now.saturating_duration_since(t) < window * 2 => (
                self.requests.saturating_add(self.prev_requests),
                self.errors.saturating_add(self.prev_errors),
            ),
            _ => (0, 0),
        }
    }
}

impl EndpointState {
    /// A new endpoint: closed circuit, nothing measured.
    pub(super) fn new(id: u64, endpoint: &Endpoint) -> Self {
        Self {
            id,
            addr: endpoint.to_string().into(),
            endpoint: Arc::new(endpoint.clone()),
            target: UpstreamTarget::new(endpoint).map(Arc::new),
            ewma: None,
            tpot: None,
            in_flight: 0,
            draining: false,
            breaker: Breaker::new(),
            probe: None,
            in_flight_at_scrape: 0,
            tokens: TokenLatency::default(),
            pending_prefill_tokens: 0,
            checks: CheckState::new(),
            suspect: Suspicion::none(),
            fleet_suspect: Suspicion::none(),
            answered: false,
            outlier: OutlierCounts::default(),
            ejected_until: None,
            ejections: 0,
            prefix_index: None,
            peer_prefill: (0.0, None),
            peer_sent: 0,
            quota: QuotaState::default(),
            quota_reported_until: None,
        }
    }

    /// Its quota admits a request of `estimate` at `now` (always, when its
    /// provider said nothing of it).
    #[inline]
    pub(super) fn quota_admits(&self, estimate: Estimate, now: Instant) -> bool {
        !self.quota.is_known() || quota::admit(&self.quota, estimate, now).admits()
    }

    /// The fleet's prompt tokens still to prefill here as of `now`.
    pub(super) fn peer_prefill_left(&self, now: Instant) -> u64 {
        let (tokens, Some(at)) = self.peer_prefill else {
            return 0;
        };
        let elapsed = now.saturating_duration_since(at).as_secs_f64();
        engine_aware::peer_prefill_left(tokens, elapsed, self.tokens.prefill_s_per_token) as u64
    }

    /// Another proxy sent `uncached` prompt tokens here.
    pub(super) fn add_peer_prefill(&mut self, uncached: u64, now: Instant) {
        let left = self.peer_prefill_left(now) as f64;
        self.peer_prefill = (left + uncached as f64, Some(now));
        self.peer_sent = self.peer_sent.saturating_add(1);
    }

    /// Leading blocks of `chain` it likely holds.
    pub(super) fn prefix_matched(&self, chain: &[u64]) -> usize {
        self.prefix_index.as_ref().map_or(0, |i| i.matched(chain))
    }

    /// It was sent (or, by another proxy, is known to hold) a prompt with
    /// this chain; `capacity` is its index size in blocks.
    pub(super) fn prefix_record(&mut self, chain: &[u64], capacity: usize) {
        let index = self
            .prefix_index
            .get_or_insert_with(|| BlockIndex::new(capacity));
        if index.capacity() != capacity {
            index.resize(capacity);
        }
        index.record(chain);
    }

    /// Fresh, healthy probe data when a probe is configured.
    #[inline]
    fn probe_ok(&self, probe: Option<&Probe>, now: Instant) -> bool {
        let Some(p) = probe else { return true };
        self.probe.as_ref().is_some_and(|r| r.usable(p, now))
    }

    /// Not drained, the circuit admits, the capacity probe and the health
    /// checks (`checks`: the pool has them) are fine.
    #[inline]
    pub(super) fn usable(&self, probe: Option<&Probe>, checks: bool, now: Instant) -> bool {
        !self.draining
            && self.breaker.admits(now)
            && self.probe_ok(probe, now)
            && (!checks || self.checks.admits())
    }

    /// Would be usable but for its first health check, still under way:
    /// requests may queue for it.
    #[inline]
    pub(super) fn awaiting_first_check(&self, probe: Option<&Probe>, now: Instant) -> bool {
        !self.draining
            && self.breaker.admits(now)
            && self.probe_ok(probe, now)
            && self.checks.awaiting_first()
    }

    /// Suspect or ejected at `now` (the soft marks).
    #[inline]
    pub(super) fn soft_marked(&self, now: Instant) -> bool {
        self.suspect.holds(now)
            || self.fleet_suspect.holds(now)
            || self.ejected_until.is_some_and(|u| u > now)
    }
}

/// A pool's state, behind its lock.
pub(super) struct PoolState {
    pub(super) settings: PoolSettings,
    pub(super) endpoints: Vec<EndpointState>,
    pub(super) queue: VecDeque<Waiter>,
    /// The balancer's input, refilled for every choice (kept to reuse its
    /// allocation).
    pub(super) loads: Vec<EndpointLoad>,
    /// The endpoints the planner's p95 leaves out, refilled for every
    /// outlook (kept to reuse its allocation).
    pub(super) left_out: Vec<u64>,
    /// The engine-aware balancer's input (engine-aware pools only).
    pub(super) engine_loads: Vec<EngineLoad>,
    /// The consistent-hash ring of the endpoints, in their order (prefix
    /// and session affinity).
    pub(super) ring: Ring,
    /// Which endpoint (id) served each session key last.
    pub(super) last_served: LastServed,
    pub(super) latencies: LatencyWindow,
    pub(super) wake: WakeTimer,
    pub(super) structured_degraded_until: Option<Instant>,
    /// Every endpoint that could take a request is soft-marked (as of the
    /// last [`Self::fill_loads`]).
    pub(super) only_marked: bool,
    /// Recent malformed structured answers (`router_policy::structured`).
    pub(super) structured_failures: router_policy::structured::DegradeWatch<Instant>,
    /// The last id given to an endpoint or a waiter.
    pub(super) next_id: u64,
    /// Breaks the balancer's ties in turn.
    pub(super) rotation: usize,
    /// When each tenant was last served a lease (a counter), for fairness
    /// between tenants in the queue; one entry per tenant of the policy.
    pub(super) tenant_served: std::collections::HashMap<Option<u64>, u64>,
    /// The counter of `tenant_served`.
    pub(super) grants: u64,
    /// A request with a tenant has queued here: from then on the queue is
    /// served fairly between tenants (until then, plain FIFO, with no scan).
    pub(super) tenanted: bool,
    /// Removed from service.
    pub(super) closed: bool,
}

/// Where a new pool's turn among equal endpoints starts: at random, so
/// that a fleet of proxies started together does not send every first
/// request to the same endpoint (Envoy's round robin starts at random for
/// the same reason); with one failing endpoint among two, half the proxies
/// find it with their first request, not all
/// (`pool::tests::new_pools_start_their_turn_at_random`).
fn first_rotation() -> usize {
    crate::random::u64() as usize
}

impl PoolState {
    /// Empty, with these settings.
    pub(super) fn new(settings: PoolSettings) -> Self {
        Self {
            settings,
            endpoints: Vec::new(),
            queue: VecDeque::new(),
            loads: Vec::new(),
            left_out: Vec::new(),
            engine_loads: Vec::new(),
            ring: Ring::new::<&str>(&[]),
            last_served: LastServed::new(LAST_SERVED_KEYS),
            latencies: LatencyWindow::default(),
            wake: WakeTimer::default(),
            structured_degraded_until: None,
            structured_failures: Default::default(),
            only_marked: false,
            next_id: 0,
            rotation: first_rotation(),
            tenant_served: std::collections::HashMap::new(),
            grants: 0,
            tenanted: false,
            closed: false,
        }
    }

    /// The index of the waiter to serve next: the oldest, unless tenants
    /// share the queue (then `router_policy::tenant::fair_next`).
    pub(super) fn next_waiter(&self) -> usize {
        if !self.tenanted {
            return 0;
        }
        let tenants: Vec<Option<u64>> = self.queue.iter().map(|w| w.tenant()).collect();
        router_policy::tenant::fair_next(&tenants, &self.tenant_served).unwrap_or(0)
    }

    /// A waiter of `tenant` got its lease.
    pub(super) fn note_served(&mut self, tenant: Option<u64>) {
        if self.tenanted {
            self.grants += 1;
            self.tenant_served.insert(tenant, self.grants);
        }
    }

    /// The endpoint with this id, if still in the pool.
    #[inline]
    pub(super) fn endpoint_mut(&mut self, id: u64) -> Option<&mut EndpointState> {
        self.endpoints.iter_mut().find(|e| e.id == id)
    }

    /// Whether the pool can take requests at all, as of `now`.
    pub(super) fn availability(&self, now: Instant) -> Availability {
        if self.closed || self.endpoints.is_empty() {
            return Availability::NoEndpoints;
        }
        if self.settings.drain || self.endpoints.iter().all(|e| e.draining) {
            return Availability::Drained;
        }
        let probe = self.settings.probe.as_ref();
        let checks = self.settings.health_check.is_some();
        // An endpoint whose first check is under way counts: requests
        // queue for it (a round trip) instead of the pool counting as
        // down; if the check fails, they are shed (`record_check`).
        if !self
            .endpoints
            .iter()
            .any(|e| e.usable(probe, checks, now) || (checks && e.awaiting_first_check(probe, now)))
        {
            return Availability::Unhealthy;
        }
        Availability::Ready
    }

    /// What the deadline planner needs to know about this pool as of
    /// `now`.
    pub(super) fn outlook(&mut self, now: Instant) -> PoolOutlook {
        self.latencies.expire(now);
        self.fill_loads(now, Estimate::default());
        // The endpoints that would not take this request are left out of
        // the p95 (see LatencyWindow); none when none would. (In a buffer
        // kept across calls, like `loads`: no allocation per request.)
        self.left_out.clear();
        if self.loads.iter().any(|l| l.available) {
            let out = self.endpoints.iter().zip(&self.loads);
            self.left_out
                .extend(out.filter(|(_, l)| !l.available).map(|(e, _)| e.id));
        }
        let p95 = self.latencies.p95(now, &self.left_out);
        let free_now = self.queue.is_empty() && self.choose().is_some();
        let expected_wait = if free_now {
            Some(Duration::ZERO)
        } else {
            self.expected_wait(now)
        };
        PoolOutlook {
            free_now,
            expected_wait,
            p95,
        }
    }

    /// The balancer's pick among [`Self::loads`] (fill them first) for a
    /// request without a prompt chain ([`Self::pick_engine_aware`] takes
    /// one).
    #[inline]
    pub(super) fn choose(&self) -> Option<usize> {
        let q = &self.settings.queue;
        if q.scoring == Scoring::EngineAware {
            return self.pick_engine_aware(None).map(|p| p.endpoint);
        }
        balance::choose(&self.loads, q.scoring, q.latency_threshold_s, self.rotation)
    }

    /// The engine-aware pick with its scores (fill [`Self::loads`] first).
    pub(super) fn pick_engine_aware(
        &self,
        prefix: Option<&super::PrefixRequest>,
    ) -> Option<Picked> {
        let q = &self.settings.queue;
        let chain = prefix.filter(|r| !r.chain.is_empty());
        let Some((affinity, req)) = q.engine.affinity.zip(chain) else {
            return engine_aware::pick(&self.engine_loads, &q.engine, None, self.rotation);
        };
        let matched: Vec<usize> = self
            .endpoints
            .iter()
            .map(|e| e.prefix_matched(&req.chain))
            .collect();
        let pm = PrefixMatch {
            ring: &self.ring,
            anchor: req.chain[0],
            matched_blocks: &matched,
            block_tokens: affinity.block_tokens(),
            prompt_tokens: req.prompt_tokens,
        };
        engine_aware::pick(&self.engine_loads, &q.engine, Some(pm), self.rotation)
    }

    /// Endpoint `i` is sent a prompt with `req`'s chain: its index records
    /// it, the fleet hears of it (with a `share`), and the route log gets
    /// how prefix affinity placed it (`placed`: its pick, when it chose).
    /// Also the prompt tokens it will prefill there (those it did not
    /// hold): the request's pending prefill, and what its first token's
    /// time is measured per, so that the prefill rate is per token
    /// computed, not per token sent.
    pub(super) fn record_prefix(
        &mut self,
        i: usize,
        req: &super::PrefixRequest,
        placed: Option<Picked>,
        share: Option<&Arc<dyn super::PlacementSink>>,
        pool: &Arc<str>,
    ) -> (Option<u64>, Option<super::queue::PrefixPlacement>) {
        let Some(affinity) = self.settings.queue.engine.affinity else {
            return (None, None);
        };
        let Some(e) = self.endpoints.get_mut(i) else {
            return (None, None);
        };
        // What the pick matched there, else (a session placed it) a match.
        let matched = placed
            .and_then(|p| p.chosen)
            .filter(|c| c.endpoint == i)
            .map_or_else(|| e.prefix_matched(&req.chain), |c| c.matched_blocks);
        let held = (matched as f64 * affinity.block_tokens()) as u64;
        let uncached = req.prompt_tokens.saturating_sub(held).max(1);
        let capacity = affinity.index_blocks(e.probe.as_ref().and_then(|p| p.cache_tokens));
        e.prefix_record(&req.chain, capacity);
        if let Some(share) = share {
            share.learned(pool, &e.addr, &req.chain, uncached);
        }
        let Some(picked) = placed else {
            return (Some(uncached), None);
        };
        let chosen = picked.chosen;
        let placement = super::queue::PrefixPlacement {
            placement: match picked.choice {
                engine_aware::Choice::Prefix(p) => p.as_str(),
                engine_aware::Choice::LowestCost => "lowest_cost",
            },
            blocks: req.chain.len(),
            matched: chosen.map_or(0, |c| c.matched_blocks),
            ttft_ms: chosen.map(|c| c.ttft_s * 1000.0),
            runner_up: picked.runner_up.and_then(|r| {
                let addr = Arc::clone(&self.endpoints.get(r.endpoint)?.addr);
                Some((addr, r.matched_blocks, r.ttft_s * 1000.0))
            }),
        };
        (Some(uncached), Some(placement))
    }

    /// Session affinity's pick among [`Self::loads`] (fill them first) for
    /// a request of session `key`; `None` when the pool has no session
    /// affinity or no endpoint can take the request.
    pub(super) fn choose_session(
        &self,
        key: u64,
    ) -> Option<(usize, router_policy::affinity::SessionPlacement)> {
        let (_, c) = self.settings.session_affinity.as_ref()?;
        let loads: Vec<Option<u32>> = self
            .loads
            .iter()
            .map(|l| {
                (l.available && l.max_concurrency.is_none_or(|m| l.in_flight < m))
                    .then_some(l.in_flight)
            })
            .collect();
        let last = self
            .last_served
            .get(key)
            .and_then(|id| self.endpoints.iter().position(|e| e.id == id));
        router_policy::affinity::choose_session(&self.ring, key, last, &loads, *c)
    }

    /// Rebuilds the affinity ring after the endpoints changed.
    pub(super) fn rebuild_ring(&mut self) {
        let names: Vec<&str> = self.endpoints.iter().map(|e| &*e.addr).collect();
        self.ring = Ring::new(&names);
    }

    /// Gives back a request's slot; a probe that ended without a verdict
    /// lets the next request probe.
    #[inline]
    pub(super) fn uncharge(&mut self, endpoint_id: u64, unjudged_probe: bool, unprefilled: u64) {
        if let Some(e) = self.endpoint_mut(endpoint_id) {
            e.in_flight = e.in_flight.saturating_sub(1);
            e.pending_prefill_tokens = e.pending_prefill_tokens.saturating_sub(unprefilled);
            if unjudged_probe && e.breaker.is_probing() {
                e.breaker.on_probe_abandoned(Instant::now());
            }
        }
    }

    /// Refills [`Self::loads`] as of `now`, for a request of `estimate`
    /// (an endpoint whose quota cannot take it is not available: see
    /// [`router_policy::quota`]; the default estimate leaves out only the
    /// keys with no request left).
    #[inline]
    pub(super) fn fill_loads(&mut self, now: Instant, estimate: Estimate) {
        let max_concurrency = self.settings.max_concurrency;
        let probe = self.settings.probe;
        let checks = self.settings.health_check.is_some();
        let model = self.settings.model.as_deref();
        self.loads.clear();
        let (mut any_clean, mut any_marked) = (false, false);
        self.loads.extend(self.endpoints.iter().map(|e| {
            let usable = e.usable(probe.as_ref(), checks, now) && e.quota_admits(estimate, now);
            let marked = usable && e.soft_marked(now);
            any_clean |= usable && !marked;
            any_marked |= marked;
            EndpointLoad {
                ewma: e.ewma,
                in_flight: e.in_flight,
                max_concurrency,
                available: usable,
                preferred: match (model, &e.probe) {
                    (Some(m), Some(r)) => r.resident.iter().any(|x| x == m),
                    _ => false,
                },
            }
        }));
        self.only_marked = any_marked && !any_clean;
        if any_marked {
            // The soft marks, which never empty a pool.
            for (load, e) in self.loads.iter_mut().zip(&self.endpoints) {
                load.available =
                    router_policy::health::admits(load.available, e.soft_marked(now), any_clean);
            }
        }
        if self.settings.queue.scoring == Scoring::EngineAware {
            self.engine_loads.clear();
            self.engine_loads
                .extend(self.endpoints.iter().zip(&self.loads).map(|(e, base)| {
                    EngineLoad {
                        base: *base,
                        signals: match (&probe, &e.probe) {
                            (Some(p), Some(r)) if r.usable(p, now) => Some(r.signals()),
                            _ => None,
                        },
                        in_flight_at_scrape: e.in_flight_at_scrape,
                        peer_sent: e.peer_sent,
                        unit: e.tokens.prefill_s_per_token,
                        pending_prefill_tokens: e
                            .pending_prefill_tokens
                            .saturating_add(e.peer_prefill_left(now)),
                    }
                }));
        }
    }

    /// Queue wait estimate: the waiters ahead (and this request) served by
    /// the open slots at the best endpoint's EWMA. `None` without an EWMA.
    fn expected_wait(&self, now: Instant) -> Option<Duration> {
        let probe = self.settings.probe.as_ref();
        let checks = self.settings.health_check.is_some();
        let usable: Vec<&EndpointState> = self
            .endpoints
            .iter()
            .filter(|e| e.usable(probe, checks, now))
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

    /// The next instant at which an endpoint's circuit may start admitting
    /// by time alone, or a quota of its reset, if any.
    pub(super) fn next_circuit_change(&self, now: Instant) -> Option<Instant> {
        self.endpoints
            .iter()
            .filter(|e| !e.draining)
            .flat_map(|e| [e.breaker.next_change(now), e.quota.next_change(now)])
            .flatten()
            .min()
    }

    /// When no endpoint that can take requests (as of `now`) has quota for
    /// a request of `estimate`: the requests left (0 when that is what is
    /// short, else 1), the tokens left when tokens are what is short, and
    /// the ms until the first of them gets quota back. `None` when one has
    /// (or none can take requests: the health gate says so).
    pub(super) fn quota_shortfall(
        &self,
        estimate: Estimate,
        now: Instant,
    ) -> Option<(u64, Option<u64>, u64)> {
        let probe = self.settings.probe.as_ref();
        let checks = self.settings.health_check.is_some();
        // Most pools have no quota readings: nothing to compute.
        if self.endpoints.iter().all(|e| !e.quota.is_known()) {
            return None;
        }
        // The first reset, and the most tokens left on a key that has a
        // request left (when one has: then tokens are what is short).
        let mut first: Option<Instant> = None;
        let mut tokens: Option<u64> = None;
        for e in self
            .endpoints
            .iter()
            .filter(|e| e.usable(probe, checks, now))
        {
            match quota::admit(&e.quota, estimate, now) {
                quota::Admission::Admit => return None,
                quota::Admission::Skip { until, why } => {
                    first = Some(first.map_or(until, |f| f.min(until)));
                    if !matches!(why, quota::Why::Requests | quota::Why::RetryAfter) {
                        let left = e.quota.tokens_left(now).unwrap_or(0);
                        tokens = Some(tokens.map_or(left, |t| t.max(left)));
                    }
                }
            }
        }
        let ms =
            u64::try_from(first?.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX);
        Some(match tokens {
            None => (0, None, ms),
            Some(t) => (1, Some(t), ms),
        })
    }

    /// Answers every waiter [`Shed::AllDown`] when the pool can take
    /// nothing now (called where that can start: a circuit opening, a
    /// failed health check): they move on to their next pool at once
    /// instead of waiting out their timeout. (An operator's forced-open
    /// override keeps its waiters: they are served when it ends.)
    pub(super) fn shed_if_down(&mut self, now: Instant) {
        if !self.queue.is_empty() && self.availability(now) != Availability::Ready {
            self.shed_all(Shed::AllDown);
        }
    }

    /// Answers every waiter `why`.
    pub(super) fn shed_all(&mut self, why: Shed) {
        for w in self.queue.drain(..) {
            let _ = w.tx.send(Err(why));
        }
    }
}
