//! Engine-aware balancing: choose an endpoint by what its GPU is doing.
//!
//! Latency EWMAs ([`crate::balance`]) see an engine only through answers
//! that have already come back; an LLM engine says much more about itself.
//! vLLM, SGLang and TGI publish, on their Prometheus `/metrics`, how many
//! requests run in the current batch, how many wait for room in it, and how
//! full the KV cache is. A continuous-batching engine admits a request into
//! its batch while its KV blocks fit; past that, requests queue *inside the
//! engine*, where no router can take them back. So:
//!
//! 1. **Signals** ([`EngineSignals`]): the last scrape (`waiting`, `running`,
//!    `kv_usage`), combined with the router's own in-flight count, which
//!    is fresher than any scrape: the requests this router sent since the
//!    scrape are added to the engine's count, those that ended are taken
//!    off ([`EngineLoad::estimate`]). One router is usually not the only
//!    client, so the engine's numbers are the floor; the router's are the
//!    correction between scrapes.
//! 2. **Saturation** ([`Estimate::saturated`]): an endpoint whose estimated
//!    waiting count is above [`EngineAware::max_waiting`] or whose KV usage
//!    is above [`EngineAware::max_kv_usage`] takes nothing new. Defaults 5
//!    and 0.8, in the spirit of the Gateway API Inference Extension's
//!    endpoint picker (its queue and KV-cache thresholds). KV usage is only
//!    believed while the router has not seen one of its requests to that
//!    endpoint end since the scrape (an ending frees blocks).
//! 3. **Late binding**: when every endpoint is saturated the chooser says
//!    `None`; the request stays in the router's FIFO and is bound when an
//!    endpoint frees (a request ends, a scrape shows room), instead of
//!    piling onto an engine queue it can no longer leave. The choice is
//!    made as late as possible, with the freshest information.
//! 4. **Cost** ([`EngineLoad::cost`]): among unsaturated endpoints, the
//!    lowest `unit × (pending_prefill + RUNNING_REQUEST_TOKENS × (load + 1)
//!    × (1 + kv_usage))`, an estimate of the wait for a first token there
//!    in seconds. `pending_prefill` is the prompt tokens of this router's
//!    requests sent there that have no first token yet: an engine prefills
//!    what it was sent before it can produce this request's first token,
//!    so queued prefill work, not the request count, is what a new
//!    request's time to first token waits for (a 6,000-token prompt ahead
//!    weighs as much as dozens of short ones). `load` is the estimated
//!    running plus waiting count, each request in the batch counted as
//!    [`RUNNING_REQUEST_TOKENS`] tokens of work (an assumption: a running
//!    sequence slows every step a little and holds KV blocks), more as the
//!    KV cache fills. `unit` is the endpoint's token-normalised latency
//!    (seconds of prefill per input token, [`TokenLatency`]), so a faster
//!    GPU takes more and one long prompt does not make an endpoint look
//!    slow for everyone. Endpoints without a measurement yet are given the
//!    best unit of the pool (optimistic, as untried endpoints are
//!    elsewhere).
//! 5. **Prefix affinity** (optional, [`crate::affinity`]): a request
//!    carrying a prefix key that was served before ([`Affinity::last`],
//!    remembered by [`crate::affinity::LastServed`]) goes back to the
//!    endpoint that served it, while that endpoint is unsaturated and its
//!    load stays within `c ×` (default 2) the average of the unsaturated
//!    endpoints (bounded loads, Mirrokni, Thorup and Zadimoghaddam, 2018).
//!    Over the bound it spills along the key's consistent-hash ring to the
//!    first endpoint within it, so a hot prefix's overflow lands on the
//!    same neighbours every time instead of queueing on one GPU. A key
//!    never seen has nothing cached anywhere: it goes by cost, so affinity
//!    costs nothing on traffic without shared prefixes.
//!
//! Endpoints where the pool's model is already resident are preferred, as
//! in [`crate::balance`].
//!
//! Where an engine publishes KV-cache events (vLLM's `KVEvents` over ZMQ,
//! block stored / removed with their hashes), the router's memory of "who
//! served this prefix last" could be replaced by an index of which endpoint
//! holds which block hashes, built from those events: [`Affinity::last`]
//! becomes the endpoint with the longest cached prefix, and the same
//! bounded-load rule decides whether it may take one more. Nothing else
//! here changes.
//!
//! Pure: the caller brings the clock-free facts; no I/O.

use serde::{Deserialize, Serialize};

use crate::affinity::Ring;
use crate::balance::EndpointLoad;

/// A request in an engine's batch, in tokens of prefill work, for
/// [`EngineLoad::cost`] (an assumption, see the module docs).
pub const RUNNING_REQUEST_TOKENS: f64 = 128.0;

/// Default [`EngineAware::max_waiting`].
pub const DEFAULT_MAX_WAITING: u32 = 5;
/// Default [`EngineAware::max_kv_usage`].
pub const DEFAULT_MAX_KV_USAGE: f64 = 0.8;
/// Default [`PrefixAffinity::load_factor`]: 2, looser than the paper's
/// 1.25 because a miss here is expensive (a spilled turn of a long
/// conversation recomputes its whole history), while overload is already
/// guarded by the saturation thresholds. Measured in docs/benchmarks.md:
/// on the prefix-heavy simulated workload at 80% load, TTFT p99 fell from
/// 840–890 ms at 1.25 and 1.5 to 554 ms at 2.
pub const DEFAULT_LOAD_FACTOR: f64 = 2.0;
/// Default [`PrefixAffinity::block_bytes`]: 16 tokens of ~4 bytes, vLLM's
/// block.
pub const DEFAULT_BLOCK_BYTES: usize = 64;
/// Default [`PrefixAffinity::max_blocks`]: 16 KiB of prompt, about 4k tokens.
pub const DEFAULT_MAX_BLOCKS: usize = 256;

/// What an engine said about itself at its last scrape.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineSignals {
    /// Requests queued inside the engine (`vllm:num_requests_waiting`,
    /// `sglang:num_queue_reqs`, `tgi_queue_size`).
    pub waiting: Option<u32>,
    /// Requests in the running batch (`vllm:num_requests_running`,
    /// `sglang:num_running_reqs`, `tgi_batch_current_size`).
    pub running: Option<u32>,
    /// KV-cache usage, 0..1 (`vllm:kv_cache_usage_perc`, the older
    /// `vllm:gpu_cache_usage_perc`, `sglang:token_usage`).
    pub kv_usage: Option<f64>,
}

/// Prefix-affinity settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefixAffinity {
    /// Bytes per block of the prompt's leading text.
    pub block_bytes: usize,
    /// Blocks hashed at most.
    pub max_blocks: usize,
    /// Bounded-load factor `c` (> 1).
    pub load_factor: f64,
}

impl Default for PrefixAffinity {
    fn default() -> Self {
        Self {
            block_bytes: DEFAULT_BLOCK_BYTES,
            max_blocks: DEFAULT_MAX_BLOCKS,
            load_factor: DEFAULT_LOAD_FACTOR,
        }
    }
}

/// Engine-aware settings of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EngineAware {
    /// An endpoint with more requests waiting inside it is saturated.
    pub max_waiting: u32,
    /// An endpoint with a fuller KV cache is saturated.
    pub max_kv_usage: f64,
    /// Prefix affinity, when on.
    pub affinity: Option<PrefixAffinity>,
}

impl Default for EngineAware {
    fn default() -> Self {
        Self {
            max_waiting: DEFAULT_MAX_WAITING,
            max_kv_usage: DEFAULT_MAX_KV_USAGE,
            affinity: None,
        }
    }
}

/// Token-normalised latency of one endpoint: seconds per token, so that
/// samples of short and long requests are comparable.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TokenLatency {
    /// Time to first token per input token (prefill), EWMA.
    pub prefill_s_per_token: Option<f64>,
    /// Time per output token after the first (decode), EWMA.
    pub decode_s_per_token: Option<f64>,
}

impl TokenLatency {
    /// Folds a time to first token for `input_tokens` of prompt.
    pub fn observe_first_token(&mut self, ttft_s: f64, input_tokens: u64, alpha: f64) {
        if let Some(v) = per_token(ttft_s, input_tokens) {
            self.prefill_s_per_token = Some(fold(self.prefill_s_per_token, v, alpha));
        }
    }

    /// Folds the time from the first token to the last for `output_tokens`
    /// generated.
    pub fn observe_decode(&mut self, decode_s: f64, output_tokens: u64, alpha: f64) {
        if let Some(v) = per_token(decode_s, output_tokens.saturating_sub(1)) {
            self.decode_s_per_token = Some(fold(self.decode_s_per_token, v, alpha));
        }
    }
}

impl TokenLatency {
    /// Folds a whole (not streamed) answer: `total_s` for `input_tokens` in
    /// and `output_tokens` out. The first token's time is not seen, so the
    /// prefill is taken at the measured rate and the rest is decode; with
    /// no prefill rate yet, nothing is learnt.
    pub fn observe_whole(
        &mut self,
        total_s: f64,
        input_tokens: u64,
        output_tokens: u64,
        alpha: f64,
    ) {
        let Some(prefill) = self.prefill_s_per_token else {
            return;
        };
        let decode = (total_s - prefill * input_tokens as f64).max(0.0);
        self.observe_decode(decode, output_tokens.saturating_add(1), alpha);
    }
}

/// `seconds / tokens`, for a positive count and a finite, non-negative time.
pub fn per_token(seconds: f64, tokens: u64) -> Option<f64> {
    (tokens > 0 && seconds.is_finite() && seconds >= 0.0).then(|| seconds / tokens as f64)
}

fn fold(previous: Option<f64>, sample: f64, alpha: f64) -> f64 {
    match previous {
        None => sample,
        Some(p) => alpha * sample + (1.0 - alpha) * p,
    }
}

/// What the chooser knows about one endpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineLoad {
    /// Availability, concurrency limit, in-flight count, residency.
    pub base: EndpointLoad,
    /// The last usable scrape, if any.
    pub signals: Option<EngineSignals>,
    /// The router's in-flight count at that scrape.
    pub in_flight_at_scrape: u32,
    /// Seconds of prefill per input token, if measured.
    pub unit: Option<f64>,
    /// Prompt tokens of this router's requests there with no first token
    /// yet.
    pub pending_prefill_tokens: u64,
}

/// An endpoint's estimated state now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Requests waiting inside the engine.
    pub waiting: u32,
    /// Requests running plus waiting.
    pub load: u32,
    /// KV-cache usage believed now (0 when unknown or stale).
    pub kv_usage: f64,
    /// Takes nothing new.
    pub saturated: bool,
}

impl EngineLoad {
    /// The endpoint's state now: the scrape corrected by what this router
    /// sent and saw end since (see the module docs).
    pub fn estimate(&self, settings: &EngineAware) -> Estimate {
        let now = i64::from(self.base.in_flight);
        let delta = now - i64::from(self.in_flight_at_scrape);
        let Some(s) = self.signals else {
            return Estimate {
                waiting: 0,
                load: self.base.in_flight,
                kv_usage: 0.0,
                saturated: false,
            };
        };
        let w = i64::from(s.waiting.unwrap_or(0));
        // Endings since the scrape let waiters in; new requests join the
        // engine's queue only if it was queueing already.
        let waiting = match delta {
            d if d < 0 => (w + d).max(0),
            d if w > 0 => w + d,
            _ => 0,
        };
        let engine_total = i64::from(s.waiting.unwrap_or(0)) + i64::from(s.running.unwrap_or(0));
        let load = (engine_total + delta).max(now).max(0);
        // An ending since the scrape freed blocks: the usage is out of date.
        let kv_usage = if delta < 0 {
            0.0
        } else {
            s.kv_usage.unwrap_or(0.0).clamp(0.0, 1.0)
        };
        let waiting = u32::try_from(waiting).unwrap_or(u32::MAX);
        Estimate {
            waiting,
            load: u32::try_from(load).unwrap_or(u32::MAX),
            kv_usage,
            saturated: waiting > settings.max_waiting || kv_usage > settings.max_kv_usage,
        }
    }

    fn open(&self) -> bool {
        self.base.available
            && self
                .base
                .max_concurrency
                .is_none_or(|max| self.base.in_flight < max)
    }

    /// The cost of sending one more request here (lower is better): the
    /// estimated wait for a first token, seconds (see the module docs).
    pub fn cost(&self, estimate: &Estimate, unit: f64) -> f64 {
        let running = RUNNING_REQUEST_TOKENS
            * f64::from(estimate.load.saturating_add(1))
            * (1.0 + estimate.kv_usage);
        unit * (self.pending_prefill_tokens as f64 + running)
    }
}

/// Why an endpoint was chosen (for `route explain` and the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The endpoint that served the prefix last, or after a spill its
    /// neighbour on the ring.
    Affinity {
        /// The endpoint that served it last was over the bound: spilled.
        spilled: bool,
    },
    /// The lowest cost.
    LowestCost,
}

/// What prefix affinity knows of a request.
#[derive(Debug, Clone, Copy)]
pub struct Affinity<'a> {
    /// The pool's ring, built over the same endpoints in the same order.
    pub ring: &'a Ring,
    /// The request's prefix key.
    pub key: u64,
    /// The endpoint that served this key last, if remembered
    /// ([`crate::affinity::LastServed`]).
    pub last: Option<usize>,
}

/// Picks the endpoint for the next request: `None` when every endpoint is
/// unavailable, full or saturated (the request then waits in the router's
/// queue). `affinity` is given for a request with a prefix key in a pool
/// with prefix affinity; `rotation` breaks ties.
///
/// With affinity: the endpoint that served the key last keeps it while it
/// is open, unsaturated and within the bounded load; over the bound, the
/// request spills along the key's consistent-hash ring to the first
/// endpoint within it (so a hot prefix's overflow lands on the same
/// neighbours, whose caches warm up too). A key never seen has nothing
/// cached anywhere: it goes by cost, like a request without a key.
pub fn choose(
    endpoints: &[EngineLoad],
    settings: &EngineAware,
    affinity: Option<Affinity<'_>>,
    rotation: usize,
) -> Option<(usize, Choice)> {
    let n = endpoints.len();
    if n == 0 {
        return None;
    }
    let estimates: Vec<Option<Estimate>> = endpoints
        .iter()
        .map(|e| {
            let est = e.estimate(settings);
            (e.open() && !est.saturated).then_some(est)
        })
        .collect();
    let any_preferred = endpoints
        .iter()
        .zip(&estimates)
        .any(|(e, est)| est.is_some() && e.base.preferred);
    // Only preferred endpoints compete when some are open.
    let candidate =
        |i: usize| estimates[i].is_some() && (!any_preferred || endpoints[i].base.preferred);

    let remembered = affinity.and_then(|a| a.last.map(|last| (a, last)));
    if let (Some((a, last)), Some(c)) = (remembered, settings.affinity.map(|a| a.load_factor)) {
        let loads: Vec<Option<u32>> = (0..n)
            .map(|i| candidate(i).then(|| estimates[i].map_or(0, |e| e.load)))
            .collect();
        let open = loads.iter().flatten().count();
        if open > 0 {
            let total: u64 = loads.iter().flatten().map(|l| u64::from(*l)).sum::<u64>() + 1;
            let bound = (c * total as f64 / open as f64).ceil() as u64;
            if loads
                .get(last)
                .copied()
                .flatten()
                .is_some_and(|l| u64::from(l) < bound)
            {
                return Some((last, Choice::Affinity { spilled: false }));
            }
        }
        if let Some(i) = a.ring.choose_among(a.key, &loads, c) {
            return Some((i, Choice::Affinity { spilled: true }));
        }
    }

    let best_unit = endpoints
        .iter()
        .filter_map(|e| e.unit)
        .filter(|u| u.is_finite() && *u > 0.0)
        .reduce(f64::min);
    let mut best: Option<(usize, f64)> = None;
    for k in 0..n {
        let i = rotation.wrapping_add(k) % n;
        if !candidate(i) {
            continue;
        }
        let Some(est) = estimates[i] else { continue };
        let unit = endpoints[i]
            .unit
            .filter(|u| u.is_finite() && *u > 0.0)
            .or(best_unit)
            .unwrap_or(1.0);
        let cost = endpoints[i].cost(&est, unit);
        if best.is_none_or(|(_, b)| cost < b) {
            best = Some((i, cost));
        }
    }
    best.map(|(i, _)| (i, Choice::LowestCost))
}

/// One endpoint's measurements, as `routerctl route explain` is given
/// them (the situation JSON's `endpoints.<pool>[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSituation {
    /// The endpoint's address (names it on the ring).
    pub addr: String,
    /// The router's requests in flight there.
    #[serde(default)]
    pub in_flight: u32,
    /// The router's in-flight count at the scrape (default: `in_flight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight_at_scrape: Option<u32>,
    /// Scraped: requests waiting in the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<u32>,
    /// Scraped: requests running in the engine's batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<u32>,
    /// Scraped: KV-cache usage, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_usage: Option<f64>,
    /// Measured: prefill seconds per input token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_s_per_token: Option<f64>,
    /// The router's prompt tokens there with no first token yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_prefill_tokens: Option<u64>,
}

/// One endpoint as the engine-aware choice saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndpointExplained {
    /// The endpoint.
    pub addr: String,
    /// The router's requests in flight.
    pub in_flight: u32,
    /// Scraped waiting, running and KV usage.
    pub waiting: Option<u32>,
    /// Scraped running.
    pub running: Option<u32>,
    /// Scraped KV usage.
    pub kv_usage: Option<f64>,
    /// Prefill seconds per input token.
    pub prefill_s_per_token: Option<f64>,
    /// The router's prompt tokens there with no first token yet.
    pub pending_prefill_tokens: u64,
    /// Estimated running plus waiting now.
    pub estimated_load: u32,
    /// Estimated waiting now.
    pub estimated_waiting: u32,
    /// Takes nothing new.
    pub saturated: bool,
}

/// How an engine-aware pool would place the request, and on what.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BalanceExplanation {
    /// The pool.
    pub pool: String,
    /// Its scoring (`engine_aware`).
    pub balance: String,
    /// The endpoint chosen; `None` when the request would wait.
    pub endpoint: Option<String>,
    /// Why, in words.
    pub why: String,
    /// The request's prefix-affinity key (hex), when it has one.
    pub prefix_key: Option<String>,
    /// The signals, endpoint by endpoint.
    pub signals: Vec<EndpointExplained>,
}

/// Explains the engine-aware choice among `endpoints` for a request whose
/// leading prompt is `prompt` (system prompt and first user message), that
/// `last_served` (an endpoint's address) served last.
pub fn explain(
    pool: &str,
    settings: &EngineAware,
    endpoints: &[EndpointSituation],
    prompt: Option<&str>,
    last_served: Option<&str>,
) -> BalanceExplanation {
    let loads: Vec<EngineLoad> = endpoints
        .iter()
        .map(|e| EngineLoad {
            base: EndpointLoad {
                ewma: None,
                in_flight: e.in_flight,
                max_concurrency: None,
                available: true,
                preferred: false,
            },
            signals: (e.waiting.is_some() || e.running.is_some() || e.kv_usage.is_some())
                .then_some(EngineSignals {
                    waiting: e.waiting,
                    running: e.running,
                    kv_usage: e.kv_usage,
                }),
            in_flight_at_scrape: e.in_flight_at_scrape.unwrap_or(e.in_flight),
            unit: e.prefill_s_per_token,
            pending_prefill_tokens: e.pending_prefill_tokens.unwrap_or(0),
        })
        .collect();
    let ring = Ring::new(
        &endpoints
            .iter()
            .map(|e| e.addr.as_str())
            .collect::<Vec<_>>(),
    );
    let key = match (settings.affinity, prompt) {
        (Some(a), Some(p)) => {
            crate::affinity::prefix_key(p.as_bytes(), a.block_bytes, a.max_blocks)
        }
        _ => None,
    };
    let last = last_served.and_then(|addr| endpoints.iter().position(|e| e.addr == addr));
    let choice = choose(
        &loads,
        settings,
        key.map(|key| Affinity {
            ring: &ring,
            key,
            last,
        }),
        0,
    );
    let why = match choice {
        None if endpoints.is_empty() => "no endpoint measurements given".to_string(),
        None => "every endpoint is saturated: the request waits in the router's queue and is bound when one frees".to_string(),
        Some((_, Choice::Affinity { spilled: false })) => "prefix affinity: the endpoint that served this prefix last, within the bounded load".to_string(),
        Some((_, Choice::Affinity { spilled: true })) => "prefix affinity, spilled: the endpoint that served this prefix last is over the bounded load (or saturated); the first within it on the key's ring".to_string(),
        Some((_, Choice::LowestCost)) => "lowest cost: the estimated wait for a first token, prefill seconds per token × (pending prefill tokens + 128 × (load + 1) × (1 + KV use))".to_string(),
    };
    BalanceExplanation {
        pool: pool.to_string(),
        balance: "engine_aware".to_string(),
        endpoint: choice.map(|(i, _)| endpoints[i].addr.clone()),
        why,
        prefix_key: key.map(|k| format!("{k:016x}")),
        signals: endpoints
            .iter()
            .zip(&loads)
            .map(|(e, l)| {
                let est = l.estimate(settings);
                EndpointExplained {
                    addr: e.addr.clone(),
                    in_flight: e.in_flight,
                    waiting: e.waiting,
                    running: e.running,
                    kv_usage: e.kv_usage,
                    prefill_s_per_token: e.prefill_s_per_token,
                    pending_prefill_tokens: l.pending_prefill_tokens,
                    estimated_load: est.load,
                    estimated_waiting: est.waiting,
                    saturated: est.saturated,
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn explain_shows_the_signals_and_the_choice() {
        let sit = |addr: &str, waiting, running, kv| EndpointSituation {
            addr: addr.into(),
            in_flight: 1,
            in_flight_at_scrape: None,
            waiting: Some(waiting),
            running: Some(running),
            kv_usage: Some(kv),
            prefill_s_per_token: Some(0.0003),
            pending_prefill_tokens: None,
        };
        let eps = [sit("http://a:1", 0, 4, 0.5), sit("http://b:1", 7, 9, 0.9)];
        let e = explain("gpus", &EngineAware::default(), &eps, None, None);
        assert_eq!(e.endpoint.as_deref(), Some("http://a:1"));
        assert!(e.why.starts_with("lowest cost"), "{}", e.why);
        assert!(e.signals[1].saturated);
        assert_eq!(e.signals[0].estimated_load, 4);
        let all = [sit("http://b:1", 7, 9, 0.9)];
        let e = explain("gpus", &EngineAware::default(), &all, None, None);
        assert_eq!(e.endpoint, None);
        assert!(e.why.contains("waits in the router's queue"), "{}", e.why);
    }

    fn ep(in_flight: u32, signals: Option<EngineSignals>, at_scrape: u32) -> EngineLoad {
        EngineLoad {
            base: EndpointLoad {
                ewma: None,
                in_flight,
                max_concurrency: None,
                available: true,
                preferred: false,
            },
            signals,
            in_flight_at_scrape: at_scrape,
            unit: None,
            pending_prefill_tokens: 0,
        }
    }

    fn sig(waiting: u32, running: u32, kv: f64) -> Option<EngineSignals> {
        Some(EngineSignals {
            waiting: Some(waiting),
            running: Some(running),
            kv_usage: Some(kv),
        })
    }

    #[test]
    fn the_least_loaded_engine_wins_and_the_kv_cache_counts() {
        let s = EngineAware::default();
        let eps = [ep(2, sig(0, 4, 0.5), 2), ep(2, sig(0, 2, 0.3), 2)];
        assert_eq!(choose(&eps, &s, None, 0), Some((1, Choice::LowestCost)));
        // Equal counts: the emptier cache wins.
        let eps = [ep(2, sig(0, 3, 0.7), 2), ep(2, sig(0, 3, 0.2), 2)];
        assert_eq!(choose(&eps, &s, None, 0).map(|c| c.0), Some(1));
    }

    #[test]
    fn requests_sent_since_the_scrape_count_against_the_engine() {
        let s = EngineAware::default();
        // The scrape said 1 running on both; this router sent 3 more to
        // the first since.
        let eps = [ep(4, sig(0, 1, 0.1), 1), ep(1, sig(0, 1, 0.1), 1)];
        assert_eq!(eps[0].estimate(&s).load, 4);
        assert_eq!(choose(&eps, &s, None, 0).map(|c| c.0), Some(1));
    }

    #[test]
    fn saturated_engines_take_nothing_and_an_ending_frees_them() {
        let s = EngineAware::default();
        let waiting = [ep(3, sig(6, 10, 0.5), 3), ep(3, sig(0, 10, 0.9), 3)];
        assert!(waiting[0].estimate(&s).saturated);
        assert!(waiting[1].estimate(&s).saturated);
        // Every endpoint saturated: the request waits in the router.
        assert_eq!(choose(&waiting, &s, None, 0), None);
        // One of this router's requests to the second ended since: its
        // blocks are free, the scraped KV usage is out of date.
        let freed = [waiting[0], ep(2, sig(0, 10, 0.9), 3)];
        assert_eq!(choose(&freed, &s, None, 0).map(|c| c.0), Some(1));
        // Waiting 5 is not above the threshold of 5.
        assert!(!ep(0, sig(5, 1, 0.1), 0).estimate(&s).saturated);
    }

    #[test]
    fn a_long_prompt_waiting_for_its_prefill_steers_the_next_request_away() {
        let s = EngineAware::default();
        // Equal counts, but the first engine has a 6,000-token prompt of
        // this router's still in prefill.
        let mut busy = ep(2, sig(0, 2, 0.3), 2);
        busy.pending_prefill_tokens = 6000;
        let mut light = ep(2, sig(0, 2, 0.3), 2);
        light.pending_prefill_tokens = 200;
        assert_eq!(choose(&[busy, light], &s, None, 0).map(|c| c.0), Some(1));
        // A few more requests in a batch weigh less than that prompt.
        let idle_but_prefilling = busy;
        let fuller = ep(6, sig(0, 6, 0.3), 6);
        assert_eq!(
            choose(&[idle_but_prefilling, fuller], &s, None, 0).map(|c| c.0),
            Some(1)
        );
    }

    #[test]
    fn without_signals_the_router_count_decides() {
        let s = EngineAware::default();
        let eps = [ep(3, None, 0), ep(1, None, 0)];
        assert_eq!(choose(&eps, &s, None, 0).map(|c| c.0), Some(1));
    }

    #[test]
    fn a_faster_engine_takes_more_by_its_token_normalised_latency() {
        let s = EngineAware::default();
        let mut fast = ep(3, sig(0, 3, 0.2), 3);
        fast.unit = Some(0.0002);
        let mut slow = ep(1, sig(0, 1, 0.2), 1);
        slow.unit = Some(0.001);
        // 4 × 0.0002 < 2 × 0.001.
        assert_eq!(choose(&[fast, slow], &s, None, 0).map(|c| c.0), Some(0));
    }

    #[test]
    fn token_latency_is_per_token() {
        let mut t = TokenLatency::default();
        // 2 s for 4000 prompt tokens and 0.1 s for 100: the same speed.
        t.observe_first_token(2.0, 4000, 0.5);
        t.observe_first_token(0.1, 200, 0.5);
        assert_eq!(t.prefill_s_per_token, Some(0.0005));
        t.observe_decode(0.99, 100, 0.3);
        assert_eq!(t.decode_s_per_token, Some(0.01));
        // A whole answer: 1 s for 1000 in (0.5 s of prefill), 50 out.
        t.observe_whole(1.0, 1000, 50, 1.0);
        assert_eq!(t.decode_s_per_token, Some(0.01));
        t.observe_first_token(1.0, 0, 0.3);
        assert_eq!(t.prefill_s_per_token, Some(0.0005));
        assert_eq!(per_token(f64::NAN, 3), None);
    }

    #[test]
    fn affinity_keeps_a_prefix_where_it_was_served_until_that_is_overloaded() {
        let s = EngineAware {
            affinity: Some(PrefixAffinity::default()),
            ..EngineAware::default()
        };
        let ring = Ring::new(&["a", "b", "c", "d"]);
        let key = 0x1234_5678_9abc_def0;
        let even: Vec<_> = (0..4).map(|_| ep(2, sig(0, 2, 0.3), 2)).collect();
        let aff = |last| {
            Some(Affinity {
                ring: &ring,
                key,
                last,
            })
        };
        // A key never seen: by cost (nothing is cached anywhere).
        assert_eq!(
            choose(&even, &s, aff(None), 0).map(|c| c.1),
            Some(Choice::LowestCost)
        );
        // Served by 2 before: 2 again, though all cost the same.
        assert_eq!(
            choose(&even, &s, aff(Some(2)), 0),
            Some((2, Choice::Affinity { spilled: false }))
        );
        // 2 carries 6 while the others carry 1: bound ceil(2 × 10 / 4) = 5,
        // it spills along the ring.
        let mut skewed: Vec<_> = (0..4).map(|_| ep(1, sig(0, 1, 0.3), 1)).collect();
        skewed[2] = ep(6, sig(0, 6, 0.3), 6);
        let (i, why) = choose(&skewed, &s, aff(Some(2)), 0).expect("placed");
        assert_ne!(i, 2);
        assert_eq!(why, Choice::Affinity { spilled: true });
        // A saturated endpoint is skipped too.
        let mut sat = even.clone();
        sat[2] = ep(2, sig(9, 2, 0.3), 2);
        assert_ne!(choose(&sat, &s, aff(Some(2)), 0).map(|c| c.0), Some(2));
    }

    proptest! {
        /// Whatever the loads: the choice is an open, unsaturated endpoint,
        /// and with affinity its load stays within the bounded-load cap of
        /// the open endpoints.
        #[test]
        fn choices_are_open_unsaturated_and_bounded(
            loads in proptest::collection::vec((0u32..20, 0u32..10, 0u32..20, 0.0f64..1.0, any::<bool>()), 1..8),
            key in any::<u64>(),
            rotation in 0usize..16,
        ) {
            let s = EngineAware {
                affinity: Some(PrefixAffinity::default()),
                ..EngineAware::default()
            };
            let names: Vec<String> = (0..loads.len()).map(|i| format!("e{i}")).collect();
            let ring = Ring::new(&names);
            let eps: Vec<EngineLoad> = loads
                .iter()
                .map(|&(inf, w, r, kv, avail)| {
                    let mut e = ep(inf, sig(w, r, kv), inf);
                    e.base.available = avail;
                    e
                })
                .collect();
            let open: Vec<usize> = (0..eps.len())
                .filter(|&i| eps[i].base.available && !eps[i].estimate(&s).saturated)
                .collect();
            let last = usize::try_from(key % eps.len() as u64).ok();
            let aff = Some(Affinity { ring: &ring, key, last });
            match choose(&eps, &s, aff, rotation) {
                None => prop_assert!(open.is_empty()),
                Some((i, Choice::LowestCost)) => prop_assert!(open.contains(&i)),
                Some((i, Choice::Affinity { .. })) => {
                    prop_assert!(open.contains(&i));
                    let total: u64 = open.iter().map(|&j| u64::from(eps[j].estimate(&s).load)).sum::<u64>() + 1;
                    let bound = (DEFAULT_LOAD_FACTOR * total as f64 / open.len() as f64).ceil() as u64;
                    prop_assert!(u64::from(eps[i].estimate(&s).load) < bound);
                }
            }
        }
    }
}
