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
//! 5. **Longest-prefix affinity** (optional, [`crate::prefix_cache`]): the
//!    request's prompt as a chain of block hashes, and per endpoint how
//!    many of its leading blocks that endpoint likely holds. The score is
//!    the expected time to first token there: the cost above plus `unit ×`
//!    the prompt tokens it does not hold. Only endpoints within the bounded
//!    load compete (`load < ceil(c × (total + 1) / open)`, Mirrokni,
//!    Thorup and Zadimoghaddam, 2018; `c` defaults to 2), so a hot prompt
//!    spills to the next best *by the same score* instead of piling onto
//!    one GPU. Endpoints holding as much of the prompt as the best and
//!    within [`NEAR_BEST`] of its score are taken in turn, so the proxies
//!    of a fleet, which read the same scrapes, do not all pick the same
//!    one between two scrapes. A prefix no endpoint holds goes to its **home**, the first
//!    endpoint within the bound clockwise from its first block's hash on
//!    the pool's consistent-hash ring, unless that is slower than the best
//!    by more than [`PrefixAffinity::new_prefix_slack`] of the request's
//!    own prefill: every proxy of a fleet puts a new system prompt, or a
//!    new conversation's first turn, on the same endpoint without sharing
//!    anything, and later turns reached through another proxy find it
//!    there.
//!
//! Endpoints where the pool's model is already resident are preferred, as
//! in [`crate::balance`].
//!
//! Where an engine publishes KV-cache events (vLLM's `KVEvents` over ZMQ,
//! block stored / removed with their hashes), the inferred index could be
//! fed from those events instead; the score here would not change.
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
/// Default [`PrefixAffinity::block_bytes`]: 64 tokens of ~4 bytes (four of
/// vLLM's blocks): fine enough that a match is off by at most 64 tokens,
/// coarse enough that a 128 KiB agent prompt is 512 hashes.
pub const DEFAULT_BLOCK_BYTES: usize = 256;
/// Default [`PrefixAffinity::max_blocks`]: 128 KiB of prompt, about 32k
/// tokens.
pub const DEFAULT_MAX_BLOCKS: usize = 512;
/// Default [`PrefixAffinity::bytes_per_token`]: English text in the
/// common BPE tokenizers.
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;
/// Default [`PrefixAffinity::cache_tokens`] for an engine that does not
/// report its cache (vLLM does: `vllm:cache_config_info`): the simulated
/// 8B model's 32,768 tokens doubled, a middle for 24-80 GB cards.
pub const DEFAULT_CACHE_TOKENS: u64 = 65_536;
/// Endpoints holding as many of the prompt's blocks as the best, with an
/// expected time to first token within this fraction of its, are near
/// ties, taken in turn ([`pick`]).
pub const NEAR_BEST: f64 = 0.1;
/// The most blocks a prompt may be hashed in (`prefix_max_blocks`; the
/// fleet's shared placements carry at most this many).
pub const MAX_PREFIX_BLOCKS: usize = 4096;
/// The most blocks one endpoint's index holds, whatever its engine
/// reports: 256 Ki blocks, a 16M-token cache at 64 tokens a block, about
/// 17 MiB resident (67 bytes a block, docs/benchmarks.md).
pub const MAX_INDEX_BLOCKS: usize = 1 << 18;
/// Default [`PrefixAffinity::new_prefix_slack`].
pub const DEFAULT_NEW_PREFIX_SLACK: f64 = 0.25;

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
    /// Bytes per block of the prompt's text.
    pub block_bytes: usize,
    /// Blocks hashed at most.
    pub max_blocks: usize,
    /// Bounded-load factor `c` (> 1).
    pub load_factor: f64,
    /// Prompt bytes per token (the pool's tokenizer ratio).
    pub bytes_per_token: f64,
    /// Each endpoint's prefix cache, in tokens, when its engine does not
    /// report it; `None`: [`DEFAULT_CACHE_TOKENS`].
    pub cache_tokens: Option<u64>,
    /// A prefix no endpoint holds goes home unless home's expected time
    /// to first token exceeds the best's by more than this fraction of the
    /// request's own prefill.
    pub new_prefix_slack: f64,
}

impl Default for PrefixAffinity {
    fn default() -> Self {
        Self {
            block_bytes: DEFAULT_BLOCK_BYTES,
            max_blocks: DEFAULT_MAX_BLOCKS,
            load_factor: DEFAULT_LOAD_FACTOR,
            bytes_per_token: DEFAULT_BYTES_PER_TOKEN,
            cache_tokens: None,
            new_prefix_slack: DEFAULT_NEW_PREFIX_SLACK,
        }
    }
}

impl PrefixAffinity {
    /// Tokens per block.
    pub fn block_tokens(&self) -> f64 {
        self.block_bytes as f64 / self.bytes_per_token.max(f64::MIN_POSITIVE)
    }

    /// An endpoint's index capacity in blocks for a cache of
    /// `reported_tokens` (the engine's figure, else the policy's, else the
    /// default).
    pub fn index_blocks(&self, reported_tokens: Option<u64>) -> usize {
        let tokens = reported_tokens
            .or(self.cache_tokens)
            .unwrap_or(DEFAULT_CACHE_TOKENS);
        let blocks = (tokens as f64 / self.block_tokens()).ceil();
        // At most [`MAX_INDEX_BLOCKS`]: the index is bounded in bytes
        // whatever an engine reports.
        (blocks as usize).clamp(1, MAX_INDEX_BLOCKS)
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

/// Prompt tokens other proxies of a fleet sent to an endpoint, still to
/// prefill `elapsed_s` after `tokens` were counted: the engine works them
/// off at `1 / unit` tokens a second (its measured prefill rate; `unit`
/// includes queueing, so this drains slowly, on the safe side), 4,000 a
/// second when unmeasured. Each proxy counts only its own requests in
/// `pending_prefill_tokens`; this is the rest of the fleet's, learnt from
/// the placements they share.
pub fn peer_prefill_left(tokens: f64, elapsed_s: f64, unit: Option<f64>) -> f64 {
    let rate = unit
        .filter(|u| u.is_finite() && *u > 0.0)
        .map_or(4000.0, |u| 1.0 / u);
    if !(tokens.is_finite() && elapsed_s.is_finite()) {
        return 0.0;
    }
    (tokens - elapsed_s.max(0.0) * rate).max(0.0)
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
    /// Requests the other proxies of a fleet sent there since that scrape
    /// (learnt from their shared placements; their endings are not seen,
    /// so this only grows until the next scrape counts them).
    pub peer_sent: u32,
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
        let own_delta = now - i64::from(self.in_flight_at_scrape);
        let delta = own_delta + i64::from(self.peer_sent);
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
        let kv_usage = if own_delta < 0 {
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
    /// Longest-prefix affinity placed it.
    Prefix(Placement),
    /// The lowest cost.
    LowestCost,
}

/// How longest-prefix affinity placed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Some endpoint holds leading blocks: the lowest expected time to
    /// first token within the bound.
    Matched,
    /// No endpoint holds any: the prefix's home on the ring, alike on
    /// every proxy.
    Home,
    /// No endpoint holds any and home is slower than the best by more than
    /// the slack: the lowest expected time to first token.
    Scored,
}

impl Placement {
    /// How the route log and explain name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Matched => "prefix_matched",
            Self::Home => "prefix_home",
            Self::Scored => "prefix_scored",
        }
    }
}

/// What longest-prefix affinity knows of a request
/// ([`crate::prefix_cache`]).
#[derive(Debug, Clone, Copy)]
pub struct PrefixMatch<'a> {
    /// The pool's ring, built over the same endpoints in the same order.
    pub ring: &'a Ring,
    /// The hash of the prompt's first block: where a prefix no endpoint
    /// holds goes.
    pub anchor: u64,
    /// Per endpoint (same order), how many leading blocks it likely holds.
    pub matched_blocks: &'a [usize],
    /// Tokens per block.
    pub block_tokens: f64,
    /// The prompt's tokens (estimated).
    pub prompt_tokens: u64,
}

/// One endpoint's score for a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// The endpoint (index).
    pub endpoint: usize,
    /// Leading blocks of the prompt it likely holds.
    pub matched_blocks: usize,
    /// Expected seconds to the first token there.
    pub ttft_s: f64,
}

/// The balancer's pick, with the scores behind it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Picked {
    /// The endpoint (index).
    pub endpoint: usize,
    /// Why.
    pub choice: Choice,
    /// The chosen endpoint's score (longest-prefix affinity only).
    pub chosen: Option<Scored>,
    /// The best other endpoint's score (longest-prefix affinity only).
    pub runner_up: Option<Scored>,
}

/// Picks the endpoint for the next request: `None` when every endpoint is
/// unavailable, full or saturated (the request then waits in the router's
/// queue). `prefix` is given for a request with a prompt at least one
/// block long in a pool with prefix affinity; `rotation` breaks ties.
pub fn choose(
    endpoints: &[EngineLoad],
    settings: &EngineAware,
    prefix: Option<PrefixMatch<'_>>,
    rotation: usize,
) -> Option<(usize, Choice)> {
    pick(endpoints, settings, prefix, rotation).map(|p| (p.endpoint, p.choice))
}

/// [`choose`], with the scores of the chosen endpoint and the runner-up.
///
/// With longest-prefix affinity: among the endpoints that are open,
/// unsaturated and within the bounded load, the lowest expected time to
/// first token (cost plus the prefill of the blocks not held); a prefix
/// no endpoint holds goes home within the slack (module docs).
pub fn pick(
    endpoints: &[EngineLoad],
    settings: &EngineAware,
    prefix: Option<PrefixMatch<'_>>,
    rotation: usize,
) -> Option<Picked> {
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
    let unit_of = |i: usize| unit_for(endpoints, i);
    if let (Some(pm), Some(affinity)) = (prefix, settings.affinity) {
        if pm.matched_blocks.len() == n {
            let open: Vec<Option<Estimate>> = (0..n)
                .map(|i| estimates[i].filter(|_| candidate(i)))
                .collect();
            return pick_by_prefix(endpoints, &open, &pm, &affinity, rotation);
        }
    }

    let mut best: Option<(usize, f64)> = None;
    for k in 0..n {
        let i = rotation.wrapping_add(k) % n;
        if !candidate(i) {
            continue;
        }
        let Some(est) = estimates[i] else { continue };
        let cost = endpoints[i].cost(&est, unit_of(i));
        if best.is_none_or(|(_, b)| cost < b) {
            best = Some((i, cost));
        }
    }
    best.map(|(i, _)| Picked {
        endpoint: i,
        choice: Choice::LowestCost,
        chosen: None,
        runner_up: None,
    })
}

/// The seconds of prefill per token endpoint `i` is taken at: its own
/// measurement, else the best of the pool's (optimistic, as untried
/// endpoints are elsewhere), else 1.
pub fn unit_for(endpoints: &[EngineLoad], i: usize) -> f64 {
    let usable = |u: &f64| u.is_finite() && *u > 0.0;
    endpoints[i]
        .unit
        .filter(usable)
        .or_else(|| {
            endpoints
                .iter()
                .filter_map(|e| e.unit)
                .filter(usable)
                .reduce(f64::min)
        })
        .unwrap_or(1.0)
}

impl EngineLoad {
    /// The expected seconds to the first token of a prompt of
    /// `prompt_tokens` here, `held_tokens` of them cached: the wait
    /// ([`EngineLoad::cost`]) plus the prefill of the rest.
    pub fn expected_ttft(
        &self,
        estimate: &Estimate,
        unit: f64,
        prompt_tokens: u64,
        held_tokens: u64,
    ) -> f64 {
        self.cost(estimate, unit) + unit * prompt_tokens.saturating_sub(held_tokens) as f64
    }
}

/// Longest-prefix affinity's pick ([`pick`]); `open[i]`: the estimate of
/// an endpoint that may take the request.
fn pick_by_prefix(
    endpoints: &[EngineLoad],
    open: &[Option<Estimate>],
    pm: &PrefixMatch<'_>,
    affinity: &PrefixAffinity,
    rotation: usize,
) -> Option<Picked> {
    let n = endpoints.len();
    let c = affinity.load_factor;
    let loads: Vec<Option<u32>> = open.iter().map(|e| e.map(|e| e.load)).collect();
    let count = loads.iter().flatten().count();
    if count == 0 {
        return None;
    }
    let total: u64 = loads.iter().flatten().map(|l| u64::from(*l)).sum::<u64>() + 1;
    let bound = (c * total as f64 / count as f64).ceil() as u64;
    let within: Vec<Option<u32>> = loads
        .iter()
        .map(|l| l.filter(|l| u64::from(*l) < bound))
        .collect();
    // Every endpoint within the bound, scored once, in turn order.
    let scores: Vec<Scored> = (0..n)
        .map(|k| rotation.wrapping_add(k) % n)
        .filter(|&i| within[i].is_some())
        .filter_map(|i| {
            let est = open[i]?;
            let held = (pm.matched_blocks[i] as f64 * pm.block_tokens) as u64;
            Some(Scored {
                endpoint: i,
                matched_blocks: pm.matched_blocks[i],
                ttft_s: endpoints[i].expected_ttft(
                    &est,
                    unit_for(endpoints, i),
                    pm.prompt_tokens,
                    held,
                ),
            })
        })
        .collect();
    // The best, the first in turn order among equals.
    let best = *scores
        .iter()
        .reduce(|b, s| if s.ttft_s < b.ttft_s { s } else { b })?;
    // Near ties holding as much of the prompt go in turn: proxies of a
    // fleet that read the same scrape would otherwise all pick the same
    // best between two scrapes (herding); each starts its turn at random.
    // An endpoint holding more or less is never a tie: affinity is not
    // diluted.
    let near: Vec<&Scored> = scores
        .iter()
        .filter(|s| {
            s.matched_blocks == best.matched_blocks && s.ttft_s <= best.ttft_s * (1.0 + NEAR_BEST)
        })
        .collect();
    let chosen = match near.len() {
        0 => best,
        k => *near[rotation % k],
    };
    // A prefix no endpoint holds goes home within the slack.
    let mut placement = Placement::Matched;
    let mut chosen = chosen;
    if pm.matched_blocks.iter().all(|m| *m == 0) {
        placement = Placement::Scored;
        let home = pm
            .ring
            .choose_among(pm.anchor, &within, c)
            .and_then(|h| scores.iter().find(|s| s.endpoint == h));
        if let Some(home) = home {
            let slack = affinity.new_prefix_slack.max(0.0)
                * unit_for(endpoints, best.endpoint)
                * pm.prompt_tokens as f64;
            if home.ttft_s <= best.ttft_s + slack {
                placement = Placement::Home;
                chosen = *home;
            }
        }
    }
    // The runner-up: the best of the others.
    let runner_up = scores
        .iter()
        .filter(|s| s.endpoint != chosen.endpoint)
        .copied()
        .reduce(|b, s| if s.ttft_s < b.ttft_s { s } else { b });
    Some(Picked {
        endpoint: chosen.endpoint,
        choice: Choice::Prefix(placement),
        chosen: Some(chosen),
        runner_up,
    })
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
    /// Leading blocks of the situation's `prompt` this endpoint likely
    /// holds (a live proxy fills it from its index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_matched_blocks: Option<usize>,
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
    /// Leading blocks of the prompt it likely holds (prefix affinity).
    pub prefix_matched_blocks: Option<usize>,
    /// Expected seconds to the first token there (prefix affinity; `None`
    /// for an endpoint that is saturated or over the bounded load).
    pub expected_ttft_s: Option<f64>,
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
    /// The hash of the prompt's first block (hex): where a prefix no
    /// endpoint holds goes.
    pub prefix_key: Option<String>,
    /// Whole blocks in the prompt (prefix affinity).
    pub prefix_blocks: Option<usize>,
    /// How prefix affinity placed it: `prefix_matched`, `prefix_home`,
    /// `prefix_scored`.
    pub placement: Option<String>,
    /// The runner-up endpoint and its expected time to first token.
    pub runner_up: Option<String>,
    /// The runner-up's expected seconds to the first token.
    pub runner_up_ttft_s: Option<f64>,
    /// The signals, endpoint by endpoint.
    pub signals: Vec<EndpointExplained>,
}

/// Explains the engine-aware choice among `endpoints` for a request whose
/// prompt text is `prompt` ([`crate::prefix_cache::prompt_text`]); each
/// endpoint's `prefix_matched_blocks` says how much of it that endpoint
/// holds, and `last_served` (an endpoint's address, the older spelling)
/// holds all of it.
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
            peer_sent: 0,
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
    let chain = match (settings.affinity, prompt) {
        (Some(a), Some(p)) => {
            crate::prefix_cache::block_chain(p.as_bytes(), a.block_bytes, a.max_blocks)
        }
        _ => Vec::new(),
    };
    let matched: Vec<usize> = endpoints
        .iter()
        .map(|e| {
            if last_served == Some(e.addr.as_str()) {
                chain.len()
            } else {
                e.prefix_matched_blocks.unwrap_or(0).min(chain.len())
            }
        })
        .collect();
    let prefix = match (settings.affinity, chain.first()) {
        (Some(a), Some(&anchor)) => Some(PrefixMatch {
            ring: &ring,
            anchor,
            matched_blocks: &matched,
            block_tokens: a.block_tokens(),
            prompt_tokens: prompt.map_or(0, |p| (p.len() as f64 / a.bytes_per_token) as u64),
        }),
        _ => None,
    };
    let picked = pick(&loads, settings, prefix, 0);
    // Every unsaturated endpoint's score, for the table (the chooser
    // scores only those within the bound, by the same rule).
    let scores: Vec<Option<f64>> = (0..endpoints.len())
        .map(|i| {
            let p = prefix?;
            let est = loads[i].estimate(settings);
            let held = (p.matched_blocks[i] as f64 * p.block_tokens) as u64;
            (!est.saturated)
                .then(|| loads[i].expected_ttft(&est, unit_for(&loads, i), p.prompt_tokens, held))
        })
        .collect();
    let why = match picked.map(|p| p.choice) {
        None if endpoints.is_empty() => "no endpoint measurements given".to_string(),
        None => "every endpoint is saturated: the request waits in the router's queue and is bound when one frees".to_string(),
        Some(Choice::Prefix(Placement::Matched)) => "longest prefix: the lowest expected time to first token (prefill of the blocks the endpoint does not hold + the wait its queue and batch imply), among the endpoints within the bounded load".to_string(),
        Some(Choice::Prefix(Placement::Home)) => "new prefix: no endpoint holds its first block; its home on the ring (first within the bounded load clockwise from the first block's hash), the same on every proxy".to_string(),
        Some(Choice::Prefix(Placement::Scored)) => "new prefix, home too slow: no endpoint holds its first block and its home's expected time to first token exceeds the best's by more than the slack; the lowest".to_string(),
        Some(Choice::LowestCost) => "lowest cost: the estimated wait for a first token, prefill seconds per token × (pending prefill tokens + 128 × (load + 1) × (1 + KV use))".to_string(),
    };
    let runner_up = picked.and_then(|p| p.runner_up);
    BalanceExplanation {
        pool: pool.to_string(),
        balance: "engine_aware".to_string(),
        endpoint: picked.map(|p| endpoints[p.endpoint].addr.clone()),
        why,
        prefix_key: chain.first().map(|k| format!("{k:016x}")),
        prefix_blocks: prefix.map(|_| chain.len()),
        placement: picked.and_then(|p| match p.choice {
            Choice::Prefix(how) => Some(how.as_str().to_string()),
            Choice::LowestCost => None,
        }),
        runner_up: runner_up.map(|r| endpoints[r.endpoint].addr.clone()),
        runner_up_ttft_s: runner_up.map(|r| r.ttft_s),
        signals: endpoints
            .iter()
            .zip(&loads)
            .enumerate()
            .map(|(i, (e, l))| {
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
                    prefix_matched_blocks: prefix.map(|_| matched[i]),
                    expected_ttft_s: scores[i],
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
            prefix_matched_blocks: None,
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
            peer_sent: 0,
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
    fn the_longest_held_prefix_wins_and_spills_by_score_past_the_bound() {
        let s = EngineAware {
            affinity: Some(PrefixAffinity::default()),
            ..EngineAware::default()
        };
        let ring = Ring::new(&["a", "b", "c", "d"]);
        let mut even: Vec<_> = (0..4).map(|_| ep(2, sig(0, 2, 0.3), 2)).collect();
        for e in &mut even {
            e.unit = Some(0.0002);
        }
        let pm = |matched: &'static [usize]| {
            Some(PrefixMatch {
                ring: &ring,
                anchor: 0x1234_5678_9abc_def0,
                matched_blocks: matched,
                block_tokens: 64.0,
                prompt_tokens: 40 * 64,
            })
        };
        // 2 holds 30 of the 40 blocks, 1 holds 10: 2, with 1 the runner-up.
        let p = pick(&even, &s, pm(&[0, 10, 30, 0]), 0).expect("placed");
        assert_eq!(
            (p.endpoint, p.choice),
            (2, Choice::Prefix(Placement::Matched))
        );
        let (chosen, runner) = (p.chosen.expect("scored"), p.runner_up.expect("runner-up"));
        assert_eq!((chosen.matched_blocks, runner.endpoint), (30, 1));
        // The difference is the prefill of 20 blocks at 0.2 ms a token.
        assert!((runner.ttft_s - chosen.ttft_s - 20.0 * 64.0 * 0.0002).abs() < 1e-9);
        // 2 carries 6 while the others carry 1: bound ceil(2 × 10 / 4) = 5;
        // the next best by the same score (1), not a ring neighbour.
        let mut skewed = even.clone();
        for e in &mut skewed {
            *e = EngineLoad {
                base: EndpointLoad {
                    in_flight: 1,
                    ..e.base
                },
                signals: sig(0, 1, 0.3),
                in_flight_at_scrape: 1,
                ..*e
            };
        }
        skewed[2] = EngineLoad {
            base: EndpointLoad {
                in_flight: 6,
                ..skewed[2].base
            },
            signals: sig(0, 6, 0.3),
            in_flight_at_scrape: 6,
            ..skewed[2]
        };
        let p = pick(&skewed, &s, pm(&[0, 10, 30, 0]), 0).expect("placed");
        assert_eq!(p.endpoint, 1);
        // A saturated endpoint is skipped too.
        let mut sat = even.clone();
        sat[2].signals = sig(9, 2, 0.3);
        assert_eq!(
            pick(&sat, &s, pm(&[0, 10, 30, 0]), 0).map(|p| p.endpoint),
            Some(1)
        );
    }

    #[test]
    fn what_other_proxies_sent_since_the_scrape_counts_against_the_engine() {
        let s = EngineAware::default();
        // The scrape said 1 running on both; other proxies sent 3 to the
        // first since.
        let mut eps = [ep(1, sig(0, 1, 0.1), 1), ep(1, sig(0, 1, 0.1), 1)];
        eps[0].peer_sent = 3;
        assert_eq!(eps[0].estimate(&s).load, 4);
        assert_eq!(choose(&eps, &s, None, 0).map(|c| c.0), Some(1));
        // The engine was queueing: they wait there too.
        let mut q = ep(1, sig(2, 4, 0.1), 1);
        q.peer_sent = 4;
        assert!(q.estimate(&s).saturated);
    }

    #[test]
    fn an_index_is_sized_from_the_engine_then_the_policy_and_bounded() {
        let a = PrefixAffinity::default();
        // 64 tokens a block: a 32,768-token cache is 512 blocks.
        assert_eq!(a.index_blocks(Some(32_768)), 512);
        let policy = PrefixAffinity {
            cache_tokens: Some(6_400),
            ..a
        };
        assert_eq!(policy.index_blocks(None), 100);
        assert_eq!(policy.index_blocks(Some(640)), 10);
        assert_eq!(a.index_blocks(None), (DEFAULT_CACHE_TOKENS / 64) as usize);
        assert_eq!(a.index_blocks(Some(u64::MAX)), MAX_INDEX_BLOCKS);
        assert_eq!(a.index_blocks(Some(0)), 1);
    }

    #[test]
    fn the_fleets_prefill_drains_at_the_endpoints_rate() {
        assert_eq!(peer_prefill_left(4000.0, 0.5, Some(0.0005)), 3000.0);
        assert_eq!(peer_prefill_left(4000.0, 3.0, Some(0.0005)), 0.0);
        assert_eq!(peer_prefill_left(4000.0, 0.5, None), 2000.0);
        assert_eq!(peer_prefill_left(f64::NAN, 0.5, None), 0.0);
        assert_eq!(peer_prefill_left(100.0, -1.0, Some(0.001)), 100.0);
    }

    #[test]
    fn a_new_prefix_goes_home_unless_home_is_too_slow() {
        let s = EngineAware {
            affinity: Some(PrefixAffinity::default()),
            ..EngineAware::default()
        };
        let ring = Ring::new(&["a", "b", "c", "d"]);
        let anchor = 0x0fed_cba9_8765_4321;
        let home = ring.owner(anchor).expect("an owner");
        let mut eps: Vec<_> = (0..4).map(|_| ep(2, sig(0, 2, 0.3), 2)).collect();
        for e in &mut eps {
            e.unit = Some(0.0002);
        }
        let none = [0usize; 4];
        let pm = Some(PrefixMatch {
            ring: &ring,
            anchor,
            matched_blocks: &none,
            block_tokens: 64.0,
            prompt_tokens: 2000,
        });
        // Whatever the rotation, home: every proxy agrees.
        for rotation in 0..4 {
            let p = pick(&eps, &s, pm, rotation).expect("placed");
            assert_eq!(
                (p.endpoint, p.choice),
                (home, Choice::Prefix(Placement::Home))
            );
        }
        // Home has 1,500 prompt tokens pending (0.3 s): more than a quarter
        // of this request's own prefill (0.1 s) above the best.
        eps[home].pending_prefill_tokens = 1500;
        let p = pick(&eps, &s, pm, 0).expect("placed");
        assert_ne!(p.endpoint, home);
        assert_eq!(p.choice, Choice::Prefix(Placement::Scored));
        // 200 pending (40 ms): within the slack, still home.
        eps[home].pending_prefill_tokens = 200;
        assert_eq!(pick(&eps, &s, pm, 0).map(|p| p.endpoint), Some(home));
    }

    #[test]
    fn explain_shows_the_matched_blocks_and_the_runner_up() {
        let s = EngineAware {
            affinity: Some(PrefixAffinity {
                block_bytes: 4,
                ..PrefixAffinity::default()
            }),
            ..EngineAware::default()
        };
        let sit = |addr: &str, matched| EndpointSituation {
            addr: addr.into(),
            in_flight: 1,
            in_flight_at_scrape: None,
            waiting: Some(0),
            running: Some(1),
            kv_usage: Some(0.2),
            prefill_s_per_token: Some(0.001),
            pending_prefill_tokens: None,
            prefix_matched_blocks: matched,
        };
        let eps = [
            sit("http://a:1", Some(2)),
            sit("http://b:1", Some(50)),
            sit("http://c:1", None),
        ];
        let prompt = format!(
            "system\n{}\nuser\n{}\n",
            "abcdefgh".repeat(25),
            "ijkl".repeat(50)
        );
        let prompt = prompt.as_str();
        let e = explain("gpus", &s, &eps, Some(prompt), None);
        assert_eq!(e.endpoint.as_deref(), Some("http://b:1"));
        assert_eq!(e.placement.as_deref(), Some("prefix_matched"));
        assert_eq!(e.prefix_blocks, Some(prompt.len() / 4));
        assert_eq!(e.runner_up.as_deref(), Some("http://a:1"));
        assert_eq!(e.signals[1].prefix_matched_blocks, Some(50));
        let (b, a) = (
            e.signals[1].expected_ttft_s.expect("b"),
            e.runner_up_ttft_s.expect("a"),
        );
        assert!((a - b - 48.0 * 0.001).abs() < 1e-9, "{a} {b}");
        // The older spelling: the endpoint that served it last holds it all.
        let e = explain("gpus", &s, &eps, Some(prompt), Some("http://c:1"));
        assert_eq!(e.endpoint.as_deref(), Some("http://c:1"));
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
            let matched: Vec<usize> = (0..eps.len()).map(|i| usize::try_from((key >> (i * 3)) % 8).unwrap_or(0)).collect();
            let pm = Some(PrefixMatch { ring: &ring, anchor: key, matched_blocks: &matched, block_tokens: 64.0, prompt_tokens: 8 * 64 });
            match pick(&eps, &s, pm, rotation) {
                None => prop_assert!(open.is_empty()),
                Some(p) => {
                    prop_assert!(open.contains(&p.endpoint));
                    let total: u64 = open.iter().map(|&j| u64::from(eps[j].estimate(&s).load)).sum::<u64>() + 1;
                    let bound = (DEFAULT_LOAD_FACTOR * total as f64 / open.len() as f64).ceil() as u64;
                    prop_assert!(u64::from(eps[p.endpoint].estimate(&s).load) < bound);
                    // The chosen scores no worse than the runner-up, unless
                    // a new prefix went home (within the slack).
                    if let (Some(c), Some(r)) = (p.chosen, p.runner_up) {
                        prop_assert_ne!(c.endpoint, r.endpoint);
                        if p.choice != Choice::Prefix(Placement::Home) {
                            prop_assert!(c.ttft_s <= r.ttft_s * (1.0 + NEAR_BEST) + 1e-12);
                        }
                    }
                }
            }
        }
    }
}
