//! What a pool tells the rest of the router about itself: whether it can
//! take requests ([`Availability`]), what the deadline planner expects of it
//! ([`PoolOutlook`]), what the policy's gates measure
//! ([`PoolMeasurements`]), and a live view for health and metrics
//! ([`PoolStatus`]).
//!
//! Each is read under the pool's lock, in one go, as of one clock reading:
//! the answers are consistent with each other and with what admission
//! does at that instant. In particular an endpoint's reported circuit is
//! [`Breaker::effective_state`](super::circuit::Breaker::effective_state),
//! the same function admission uses, overrides included.

use std::sync::Arc;
use std::time::Duration;

use router_policy::deadline::PoolOutlook;
use router_policy::decide::PoolMeasurements;
use tokio::time::Instant;

use super::{CircuitState, PoolRuntime};
use crate::probe::ProbeReading;

/// Whether a pool can take a request now (the walk's own type).
pub use router_policy::walk::Availability;

/// A live view of one endpoint, for health, metrics and the state log.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointStatus {
    /// `http://host:port[/base]`.
    pub addr: Arc<str>,
    /// Requests in flight.
    pub in_flight: u32,
    /// EWMA latency in seconds, `None` before the first answer.
    pub ewma_s: Option<f64>,
    /// EWMA time per output token in seconds, from streams.
    pub tpot_s: Option<f64>,
    /// The p95 of its latencies among the pool's recent ones (the pool's
    /// window: its last 128 answers and timeouts of the last minute),
    /// seconds; `None` without a sample there.
    pub p95_s: Option<f64>,
    /// Circuit breaker state, overrides included: what admission goes by.
    pub circuit: CircuitState,
    /// Drained (no new requests).
    pub draining: bool,
    /// What the health checks say; `None`: the pool has none.
    pub health: Option<router_policy::health::Health>,
    /// Why it is suspect now (this proxy's mark or the fleet's), if it is.
    pub suspect: Option<router_policy::health::SuspectCause>,
    /// Ejected as an outlier now.
    pub ejected: bool,
    /// What its provider's rate-limit headers said is left of its key's
    /// quota; `None` before any answer said.
    pub quota: Option<QuotaStatus>,
}

/// An endpoint's quota as its provider last reported it, less what the
/// balancer sent since ([`router_policy::quota`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaStatus {
    /// Requests left (`None`: no requests limit holds).
    pub requests_remaining: Option<u64>,
    /// Seconds until the requests limit resets.
    pub requests_reset_s: Option<f64>,
    /// Tokens left: the smallest of the token limits that hold.
    pub tokens_remaining: Option<u64>,
    /// Seconds until the token limit resets (the latest of those that
    /// hold).
    pub tokens_reset_s: Option<f64>,
    /// Rested now (no request left, or a 429's `retry-after`): why
    /// ([`router_policy::quota::Why::label`]).
    pub resting: Option<&'static str>,
}

impl QuotaStatus {
    /// The quota of `q` as of `now`; `None` when nothing of it holds.
    pub(super) fn of(q: &router_policy::quota::QuotaState<Instant>, now: Instant) -> Option<Self> {
        use router_policy::quota::{admit, Admission, Estimate};
        if !q.is_known() {
            return None;
        }
        let secs = |t: Instant| t.saturating_duration_since(now).as_secs_f64();
        let requests = q.requests.filter(|w| w.reset_at > now);
        let tokens_reset = [q.tokens, q.input_tokens, q.output_tokens]
            .into_iter()
            .flatten()
            .filter(|w| w.reset_at > now)
            .map(|w| w.reset_at)
            .max();
        let status = Self {
            requests_remaining: q.requests_left(now),
            requests_reset_s: requests.map(|w| secs(w.reset_at)),
            tokens_remaining: q.tokens_left(now),
            tokens_reset_s: tokens_reset.map(secs),
            resting: match admit(q, Estimate::default(), now) {
                Admission::Admit => None,
                Admission::Skip { why, .. } => Some(why.label()),
            },
        };
        (status.requests_remaining.is_some()
            || status.tokens_remaining.is_some()
            || status.resting.is_some())
        .then_some(status)
    }
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

impl PoolRuntime {
    /// Whether the pool can take requests at all.
    pub fn availability(&self) -> Availability {
        self.lock().availability(Instant::now())
    }

    /// What the deadline planner needs to know about this pool now.
    pub fn outlook(&self) -> PoolOutlook {
        self.lock().outlook(Instant::now())
    }

    /// The outlook as of `now` (a request passes its own clock reading)
    /// when the pool can take requests, else why not (availability and
    /// [`Self::outlook`] under one lock).
    pub fn ready_outlook_at(&self, now: Instant) -> Result<PoolOutlook, Availability> {
        self.ready_outlook_marked_at(now).map(|(o, _)| o)
    }

    /// As [`Self::ready_outlook_at`], with whether every endpoint that
    /// could take the request carries a soft mark (suspect or ejected:
    /// the marks were set aside so as not to empty the pool).
    pub fn ready_outlook_marked_at(
        &self,
        now: Instant,
    ) -> Result<(PoolOutlook, bool), Availability> {
        let mut st = self.lock();
        match st.availability(now) {
            Availability::Ready => {
                let outlook = st.outlook(now);
                Ok((outlook, st.only_marked))
            }
            other => Err(other),
        }
    }

    /// The measurements the policy's gates look at.
    #[cfg(test)]
    pub(crate) fn measurements(&self) -> PoolMeasurements {
        self.measurements_at(Instant::now())
    }

    /// For an engine-aware pool, each endpoint's signals as the balancer
    /// sees them now, and with prefix affinity how many leading blocks of
    /// `prompt` (a prompt's text) each likely holds (for `route explain`);
    /// `None` for other pools.
    pub fn endpoint_situations(
        &self,
        prompt: Option<&str>,
    ) -> Option<Vec<router_policy::engine_aware::EndpointSituation>> {
        let st = self.lock();
        if st.settings.queue.scoring != router_policy::Scoring::EngineAware {
            return None;
        }
        let chain = st.settings.queue.engine.affinity.zip(prompt).map(|(a, p)| {
            router_policy::prefix_cache::block_chain(p.as_bytes(), a.block_bytes, a.max_blocks)
        });
        let now = Instant::now();
        let probe = st.settings.probe;
        Some(
            st.endpoints
                .iter()
                .map(|e| {
                    let fresh = match (&probe, &e.probe) {
                        (Some(p), Some(r)) if r.usable(p, now) => Some(r),
                        _ => None,
                    };
                    router_policy::engine_aware::EndpointSituation {
                        addr: e.addr.to_string(),
                        in_flight: e.in_flight,
                        in_flight_at_scrape: Some(e.in_flight_at_scrape),
                        waiting: fresh.and_then(|r| r.waiting),
                        running: fresh.and_then(|r| r.running),
                        kv_usage: fresh.and_then(|r| r.kv_cache_usage),
                        prefill_s_per_token: e.tokens.prefill_s_per_token,
                        pending_prefill_tokens: Some(e.pending_prefill_tokens),
                        prefix_matched_blocks: chain.as_deref().map(|c| e.prefix_matched(c)),
                    }
                })
                .collect(),
        )
    }

    /// The measurements the policy's gates look at, as of `now`, for any
    /// request.
    pub fn measurements_at(&self, now: Instant) -> PoolMeasurements {
        self.measurements_for(now, router_policy::quota::Estimate::default())
    }

    /// The measurements the policy's gates look at, as of `now`, for a
    /// request of `estimate`: when no endpoint that can take requests has
    /// quota for it, the quota fields say what the best one has left
    /// (the `quota` gate, [`router_policy::decide`]); otherwise they are
    /// empty.
    pub fn measurements_for(
        &self,
        now: Instant,
        estimate: router_policy::quota::Estimate,
    ) -> PoolMeasurements {
        let st = self.lock();
        let quota = st.quota_shortfall(estimate, now);
        let availability = st.availability(now);
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
            tpot_ms: st
                .endpoints
                .iter()
                .filter(|e| !e.draining)
                .filter_map(|e| e.tpot)
                .reduce(f64::min)
                .map(|s| s * 1000.0),
            unhealthy_because: (availability != Availability::Ready).then(|| availability.as_str()),
            quota_requests_remaining: quota.map(|q| q.0),
            quota_tokens_remaining: quota.and_then(|q| q.1),
            quota_reset_ms: quota.map(|q| q.2),
        }
    }

    /// A consistent view of the pool right now.
    pub fn status(&self) -> PoolStatus {
        let st = self.lock();
        let now = Instant::now();
        let ids: Vec<u64> = st.endpoints.iter().map(|e| e.id).collect();
        let p95s = st.latencies.endpoint_p95s(&ids, now);
        PoolStatus {
            name: Arc::clone(&self.name),
            queue_depth: st.queue.len(),
            oldest_wait: st
                .queue
                .front()
                .map(|w| now.saturating_duration_since(w.enqueued_at)),
            endpoints: st
                .endpoints
                .iter()
                .zip(p95s)
                .map(|(e, p95)| EndpointStatus {
                    addr: Arc::clone(&e.addr),
                    in_flight: e.in_flight,
                    ewma_s: e.ewma,
                    tpot_s: e.tpot,
                    p95_s: p95.map(|d| d.as_secs_f64()),
                    circuit: e.breaker.effective_state(now).reported(),
                    draining: e.draining,
                    health: st.settings.health_check.as_ref().map(|_| e.checks.health()),
                    suspect: {
                        use router_policy::health::SuspectCause::{Attempt, Check, Quota};
                        [Check, Attempt, Quota].into_iter().find(|c| {
                            e.suspect.held_for(*c, now) || e.fleet_suspect.held_for(*c, now)
                        })
                    },
                    ejected: e.ejected_until.is_some_and(|u| u > now),
                    quota: QuotaStatus::of(&e.quota, now),
                })
                .collect(),
        }
    }

    /// The circuit of the endpoint at `addr` as status reports it; `None`
    /// when the pool has no such endpoint.
    pub fn circuit_of(&self, addr: &str) -> Option<CircuitState> {
        let st = self.lock();
        let now = Instant::now();
        st.endpoints
            .iter()
            .find(|e| *e.addr == *addr)
            .map(|e| e.breaker.effective_state(now).reported())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{pool, with_breaker};
    use super::super::Sample;
    use super::*;
    use router_policy::Endpoint;

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
        assert_eq!(
            p.status().endpoints[0].p95_s,
            Some(0.2),
            "the endpoint's own"
        );
        // One slot at 200 ms: this request would wait about 200 ms.
        assert_eq!(o.expected_wait, Some(Duration::from_millis(200)));
        drop(l);
        // Samples older than a minute no longer count.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(p.outlook().p95, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_forced_closed_endpoint_reports_what_admission_does() {
        let p = with_breaker(&["h:1"], 1, 60_000);
        let l = p.acquire(None).await.unwrap();
        l.finish(Sample::Failure(Duration::from_millis(1)), Instant::now());
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
        assert_eq!(p.availability(), Availability::Unhealthy);

        // The control plane forces it closed: traffic flows again, and
        // health must say so (it used to keep saying `open`).
        let h1 = Endpoint::parse("h:1").unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        p.set_forced(&[(Some(h1.clone()), false, until)]);
        assert!(p.outlook().free_now, "admission takes it");
        assert_eq!(p.availability(), Availability::Ready);
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Closed);
        assert_eq!(
            p.circuit_of(&p.status().endpoints[0].addr),
            Some(CircuitState::Closed)
        );
        assert_eq!(p.measurements().healthy, Some(true));

        // The override ends: the local breaker, still open, is back.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!p.outlook().free_now);
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
        assert_eq!(
            p.circuit_of(&p.status().endpoints[0].addr),
            Some(CircuitState::Open)
        );
        assert_eq!(p.circuit_of("nowhere:1"), None);
        assert_eq!(p.availability(), Availability::Unhealthy);

        // Forced closed again: a request gets its lease at once.
        let started = Instant::now();
        p.set_forced(&[(Some(h1), false, started + Duration::from_secs(10))]);
        let l = p.acquire(None).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        drop(l);
    }

    #[tokio::test(start_paused = true)]
    async fn a_forced_open_endpoint_reports_open_and_takes_nothing() {
        let p = pool(10, 60_000, None, &["h:1"]);
        let until = Instant::now() + Duration::from_secs(10);
        p.set_forced(&[(None, true, until)]);
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
        assert_eq!(p.availability(), Availability::Unhealthy);
        assert_eq!(
            p.measurements().unhealthy_because,
            Some(Availability::Unhealthy.as_str())
        );
        // Anything not listed goes back to the local breaker.
        p.set_forced(&[]);
        assert_eq!(p.status().endpoints[0].circuit, CircuitState::Closed);
        assert_eq!(p.availability(), Availability::Ready);
    }
}
