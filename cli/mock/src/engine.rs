//! A small, honest model of a vLLM-like inference engine on one GPU, as a
//! pure state machine driven by a virtual clock (no I/O, no real time).
//!
//! # The model
//!
//! - **Requests** arrive with their prompt as token ids and the number of
//!   tokens they will generate. They wait in a FIFO queue.
//! - **KV cache**: a fixed number of tokens, split into blocks of
//!   [`EngineConfig::block_size`] tokens. A running sequence holds
//!   `ceil((prompt + generated + 1) / block_size)` blocks (the `+ 1` is the
//!   slot of the token it is about to produce).
//! - **Prefix caching**: every *full* prompt block is named by a chained
//!   hash (its tokens and the hash of the block before it), so two prompts
//!   share a block only if they share everything up to its end. A block
//!   stays cached after its last user finishes, and is evicted least
//!   recently used first, only when a new block is needed. An admitted
//!   request skips the prefill of its longest cached prefix (at least its
//!   last prompt token is always computed, as in vLLM).
//! - **Scheduling** (one call of [`Engine::step`]): first every running
//!   sequence gets the block for its next token; if the cache is full, the
//!   most recently admitted sequence is *preempted* (its blocks released,
//!   it goes back to the front of the queue and is recomputed later, prompt
//!   and tokens generated so far, minus what is still cached). Then, unless
//!   a preemption happened, waiting requests are admitted in order while the
//!   batch has room ([`EngineConfig::max_batch`]) and their blocks fit; the
//!   first one that does not fit stops admission (queueing, no overtaking).
//! - **Step time**: `uncached prefill tokens / prefill speed`, plus, when
//!   sequences are decoding, `decode_step_base + decode_step_per_seq × n`.
//!   Every running sequence (newly prefilled ones included) emits one token
//!   at the end of the step. Decode is memory-bound: the base is reading the
//!   weights once per step, the per-sequence part is reading each
//!   sequence's KV cache, which is why a bigger batch makes each step slower
//!   but the engine's throughput higher.
//!
//! What it leaves out: chunked prefill and a per-step token budget, the
//! attention cost of long contexts beyond the per-sequence constant,
//! speculative decoding, swapping to CPU, sampling parameters, stop strings
//! (a request always produces exactly its output length), and tokenization
//! (token ids are given).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

/// Identifies one request inside an [`Engine`].
pub type RequestId = u64;

/// The parameters of a simulated engine. See `docs/simulator.md` for why the
/// defaults are plausible for a mid-size model on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most sequences in the running batch (vLLM's `max_num_seqs`).
    pub max_batch: usize,
    /// KV cache capacity in tokens.
    pub kv_capacity_tokens: u32,
    /// Tokens per KV block (vLLM's default is 16).
    pub block_size: u32,
    /// Prefill speed, prompt tokens per second.
    pub prefill_tokens_per_s: u32,
    /// Fixed part of a decode step's time.
    pub decode_step_base: Duration,
    /// Added to a decode step's time for each decoding sequence.
    pub decode_step_per_seq: Duration,
    /// Tokens generated for an HTTP request that sets no `max_tokens`.
    pub default_output_tokens: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch: 64,
            kv_capacity_tokens: 32_768,
            block_size: 16,
            prefill_tokens_per_s: 4_000,
            decode_step_base: Duration::from_millis(25),
            decode_step_per_seq: Duration::from_micros(500),
            default_output_tokens: 128,
        }
    }
}

impl EngineConfig {
    /// Number of KV blocks.
    pub fn total_blocks(&self) -> u32 {
        self.kv_capacity_tokens / self.block_size.max(1)
    }

    /// Time of one decode step with `sequences` decoding.
    pub fn decode_step_time(&self, sequences: usize) -> Duration {
        let per_seq = u32::try_from(sequences).unwrap_or(u32::MAX);
        self.decode_step_base + self.decode_step_per_seq.saturating_mul(per_seq)
    }

    /// Time to prefill `tokens` prompt tokens.
    pub fn prefill_time(&self, tokens: u32) -> Duration {
        Duration::from_secs_f64(f64::from(tokens) / f64::from(self.prefill_tokens_per_s.max(1)))
    }
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EngineError {
    /// The request alone needs more KV blocks than the whole cache holds, so
    /// it could never run.
    #[error("request needs {needed} KV blocks, the cache has {capacity}")]
    TooLong {
        /// Blocks the request needs at its longest.
        needed: u32,
        /// Blocks in the cache.
        capacity: u32,
    },
}

/// A request given to [`Engine::submit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineRequest {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// How many tokens it generates (at least 1).
    pub output_tokens: u32,
}

/// One token produced by a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmittedToken {
    /// Whose token.
    pub request: RequestId,
    /// 0 for the first generated token.
    pub index: u32,
}

/// A request that produced its last token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FinishedRequest {
    /// Which request.
    pub request: RequestId,
    /// Its prompt length.
    pub prompt_tokens: u32,
    /// Prompt tokens found in the prefix cache at its first admission.
    pub cached_prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Virtual time of arrival.
    pub arrived_at: Duration,
    /// Virtual time its first token was emitted.
    pub first_token_at: Duration,
    /// Virtual time its last token was emitted.
    pub finished_at: Duration,
}

/// What one [`Engine::step`] did. Its tokens are emitted at
/// `started_at + duration`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Virtual time the step started.
    pub started_at: Duration,
    /// How long it took.
    pub duration: Duration,
    /// Prompt tokens computed (cached ones excluded).
    pub prefill_tokens: u32,
    /// Sequences that decoded (not newly prefilled).
    pub decode_sequences: usize,
    /// Tokens emitted at the end of the step.
    pub tokens: Vec<EmittedToken>,
    /// Requests that finished with this step.
    pub finished: Vec<FinishedRequest>,
    /// Requests preempted (sent back to the queue) at the start of the step.
    pub preempted: Vec<RequestId>,
}

/// The engine's counters, named after vLLM's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineMetrics {
    /// `vllm:num_requests_waiting`.
    pub waiting: usize,
    /// `vllm:num_requests_running`.
    pub running: usize,
    /// `vllm:kv_cache_usage_perc`: blocks held by requests over all blocks
    /// (cached blocks that nobody holds count as free, as in vLLM), 0 to 1.
    pub kv_cache_usage: f64,
    /// `vllm:prefix_cache_hits_total`: prompt tokens found cached.
    pub prefix_cache_hits: u64,
    /// `vllm:prefix_cache_queries_total`: prompt tokens looked up.
    pub prefix_cache_queries: u64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: u64,
}

/// A cached (named) KV block.
#[derive(Clone, Copy, Debug)]
struct CachedBlock {
    /// Running sequences holding it.
    refs: u32,
    /// When it was last released (orders the eviction).
    last_used: u64,
}

/// A request inside the engine.
#[derive(Debug)]
struct Sequence {
    id: RequestId,
    prompt: Vec<u32>,
    /// Chained hashes of the prompt's full blocks.
    block_hashes: Vec<u64>,
    output_tokens: u32,
    generated: u32,
    /// Blocks held besides the named prompt blocks (while running).
    private_blocks: u32,
    /// Whether it holds its named blocks (while running).
    holds_named: bool,
    arrived_at: Duration,
    first_token_at: Option<Duration>,
    /// Cached prompt tokens at first admission (`None` before it).
    cached_prompt_tokens: Option<u32>,
    /// Admitted in the current step (prefills instead of decoding).
    prefilling: bool,
}

impl Sequence {
    /// Blocks it needs to hold `tokens` tokens.
    fn blocks_for(tokens: u32, block_size: u32) -> u32 {
        tokens.div_ceil(block_size)
    }
}

/// The simulated engine: call [`Engine::submit`] as requests arrive and
/// [`Engine::step`] to run; the clock moves only by step durations and
/// [`Engine::advance_to`].
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    now: Duration,
    next_id: RequestId,
    waiting: VecDeque<Sequence>,
    /// Oldest admission first.
    running: Vec<Sequence>,
    total_blocks: u32,
    private_in_use: u32,
    cache: HashMap<u64, CachedBlock>,
    /// Cached blocks nobody holds, least recently used first.
    evictable: BTreeSet<(u64, u64)>,
    tick: u64,
    metrics: EngineMetrics,
}

/// Chained hash of one block: FNV-1a over the parent hash and the tokens.
fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ parent.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for token in tokens {
        for byte in token.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

impl Engine {
    /// An idle engine at virtual time zero.
    pub fn new(config: EngineConfig) -> Engine {
        let config = EngineConfig {
            block_size: config.block_size.max(1),
            max_batch: config.max_batch.max(1),
            ..config
        };
        Engine {
            total_blocks: config.total_blocks(),
            config,
            now: Duration::ZERO,
            next_id: 1,
            waiting: VecDeque::new(),
            running: Vec::new(),
            private_in_use: 0,
            cache: HashMap::new(),
            evictable: BTreeSet::new(),
            tick: 0,
            metrics: EngineMetrics::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The virtual time.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Moves the clock forward to `at` (never back); meant for an idle
    /// engine waiting for the next arrival.
    pub fn advance_to(&mut self, at: Duration) {
        self.now = self.now.max(at);
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Queues a request, arriving now.
    pub fn submit(&mut self, request: EngineRequest) -> Result<RequestId, EngineError> {
        let output_tokens = request.output_tokens.max(1);
        let prompt_len = u32::try_from(request.prompt.len()).unwrap_or(u32::MAX);
        let needed = Sequence::blocks_for(
            prompt_len.saturating_add(output_tokens),
            self.config.block_size,
        );
        if needed > self.total_blocks {
            return Err(EngineError::TooLong {
                needed,
                capacity: self.total_blocks,
            });
        }
        let block_size = self.config.block_size as usize;
        let mut parent = 0;
        let block_hashes = request
            .prompt
            .chunks_exact(block_size)
            .map(|block| {
                parent = block_hash(parent, block);
                parent
            })
            .collect();
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Sequence {
            id,
            prompt: request.prompt,
            block_hashes,
            output_tokens,
            generated: 0,
            private_blocks: 0,
            holds_named: false,
            arrived_at: self.now,
            first_token_at: None,
            cached_prompt_tokens: None,
            prefilling: false,
        });
        self.refresh_gauges();
        Ok(id)
    }

    /// Drops a request (its client went away), waiting or running. Returns
    /// whether it was there.
    pub fn abort(&mut self, id: RequestId) -> bool {
        if let Some(at) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(at);
        } else if let Some(at) = self.running.iter().position(|s| s.id == id) {
            let mut seq = self.running.remove(at);
            self.release(&mut seq);
        } else {
            return false;
        }
        self.refresh_gauges();
        true
    }

    /// The counters.
    pub fn metrics(&self) -> EngineMetrics {
        self.metrics
    }

    fn free_blocks(&self) -> u32 {
        let used = self.private_in_use + u32::try_from(self.cache.len()).unwrap_or(u32::MAX);
        self.total_blocks.saturating_sub(used)
    }

    /// Makes `n` blocks free by evicting least recently used unheld cached
    /// blocks; false (nothing evicted) if even that is not enough.
    fn make_free(&mut self, n: u32) -> bool {
        let evictable = u32::try_from(self.evictable.len()).unwrap_or(u32::MAX);
        if self.free_blocks().saturating_add(evictable) < n {
            return false;
        }
        while self.free_blocks() < n {
            let Some((_, hash)) = self.evictable.pop_first() else {
                return false;
            };
            self.cache.remove(&hash);
        }
        true
    }

    /// Releases a running sequence's blocks: private ones are freed, named
    /// ones stay cached; the prompt's tail blocks become the least recently
    /// used so that a shared head outlives them.
    fn release(&mut self, seq: &mut Sequence) {
        self.private_in_use -= seq.private_blocks;
        seq.private_blocks = 0;
        if seq.holds_named {
            let n = seq.block_hashes.len() as u64;
            for (i, hash) in seq.block_hashes.iter().enumerate() {
                if let Some(block) = self.cache.get_mut(hash) {
                    block.refs -= 1;
                    if block.refs == 0 {
                        block.last_used = self.tick + (n - 1 - i as u64);
                        self.evictable.insert((block.last_used, *hash));
                    }
                }
            }
            self.tick += n;
            seq.holds_named = false;
        }
    }

    /// Admits `seq` if its blocks fit; returns the prompt tokens it must
    /// compute, or gives it back.
    fn try_admit(&mut self, mut seq: Sequence) -> Result<(Sequence, u32), Sequence> {
        let bs = self.config.block_size;
        let prompt_len = u32::try_from(seq.prompt.len()).unwrap_or(u32::MAX);
        let named = u32::try_from(seq.block_hashes.len()).unwrap_or(u32::MAX);
        let total = Sequence::blocks_for(prompt_len + seq.generated + 1, bs);
        let private = total - named;
        let mut reused_evictable = 0;
        let mut fresh = private;
        for hash in &seq.block_hashes {
            match self.cache.get(hash) {
                Some(block) if block.refs == 0 => reused_evictable += 1,
                Some(_) => {}
                None => fresh += 1,
            }
        }
        let evictable = u32::try_from(self.evictable.len()).unwrap_or(u32::MAX);
        if fresh > self.free_blocks() + evictable - reused_evictable {
            return Err(seq);
        }
        let mut hit_blocks = seq
            .block_hashes
            .iter()
            .take_while(|hash| self.cache.contains_key(hash))
            .count() as u32;
        if hit_blocks * bs >= prompt_len && hit_blocks > 0 {
            // The last prompt token is always computed.
            hit_blocks -= 1;
        }
        let hit_tokens = hit_blocks * bs;
        // Hold the cached blocks first, so that making room cannot evict them.
        for hash in &seq.block_hashes {
            if let Some(block) = self.cache.get_mut(hash) {
                if block.refs == 0 {
                    self.evictable.remove(&(block.last_used, *hash));
                }
                block.refs += 1;
            }
        }
        for hash in &seq.block_hashes {
            if !self.cache.contains_key(hash) {
                let made_room = self.make_free(1);
                debug_assert!(made_room, "admission checked the room");
                self.cache.insert(
                    *hash,
                    CachedBlock {
                        refs: 1,
                        last_used: 0,
                    },
                );
            }
        }
        let made_room = self.make_free(private);
        debug_assert!(made_room, "admission checked the room");
        self.private_in_use += private;
        seq.private_blocks = private;
        seq.holds_named = true;
        seq.prefilling = true;
        self.metrics.prefix_cache_queries += u64::from(prompt_len);
        self.metrics.prefix_cache_hits += u64::from(hit_tokens);
        seq.cached_prompt_tokens.get_or_insert(hit_tokens);
        let prefill = prompt_len + seq.generated - hit_tokens;
        Ok((seq, prefill))
    }

    /// Runs one scheduler step (see the module docs) and moves the clock by
    /// its duration. `None` when there is nothing to do.
    pub fn step(&mut self) -> Option<StepReport> {
        if !self.has_work() {
            return None;
        }
        let mut report = StepReport {
            started_at: self.now,
            ..StepReport::default()
        };
        let bs = self.config.block_size;
        // 1. Each running sequence gets the block for its next token,
        //    oldest first; the newest are preempted when the cache is full.
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            let prompt_len = u32::try_from(seq.prompt.len()).unwrap_or(u32::MAX);
            let needed = Sequence::blocks_for(prompt_len + seq.generated + 1, bs);
            let held = seq.block_hashes.len() as u32 + seq.private_blocks;
            if needed <= held {
                i += 1;
                continue;
            }
            let extra = needed - held;
            if self.make_free(extra) {
                self.private_in_use += extra;
                self.running[i].private_blocks += extra;
                i += 1;
                continue;
            }
            let Some(mut victim) = self.running.pop() else {
                break;
            };
            self.release(&mut victim);
            self.metrics.preemptions += 1;
            report.preempted.push(victim.id);
            self.waiting.push_front(victim);
        }
        // 2. Admit waiting requests in order, unless this step preempted.
        if report.preempted.is_empty() {
            while self.running.len() < self.config.max_batch {
                let Some(seq) = self.waiting.pop_front() else {
                    break;
                };
                match self.try_admit(seq) {
                    Ok((seq, prefill)) => {
                        report.prefill_tokens += prefill;
                        self.running.push(seq);
                    }
                    Err(seq) => {
                        self.waiting.push_front(seq);
                        break;
                    }
                }
            }
        }
        // 3. The step's time.
        report.decode_sequences = self.running.iter().filter(|s| !s.prefilling).count();
        report.duration = self.config.prefill_time(report.prefill_tokens);
        if report.decode_sequences > 0 {
            report.duration += self.config.decode_step_time(report.decode_sequences);
        }
        self.now += report.duration;
        // 4. One token per running sequence; finished ones leave.
        let now = self.now;
        let mut still_running = Vec::with_capacity(self.running.len());
        for mut seq in std::mem::take(&mut self.running) {
            seq.prefilling = false;
            report.tokens.push(EmittedToken {
                request: seq.id,
                index: seq.generated,
            });
            seq.generated += 1;
            let first_token_at = *seq.first_token_at.get_or_insert(now);
            if seq.generated >= seq.output_tokens {
                report.finished.push(FinishedRequest {
                    request: seq.id,
                    prompt_tokens: u32::try_from(seq.prompt.len()).unwrap_or(u32::MAX),
                    cached_prompt_tokens: seq.cached_prompt_tokens.unwrap_or(0),
                    completion_tokens: seq.generated,
                    arrived_at: seq.arrived_at,
                    first_token_at,
                    finished_at: now,
                });
                self.release(&mut seq);
            } else {
                still_running.push(seq);
            }
        }
        self.running = still_running;
        self.refresh_gauges();
        Some(report)
    }

    fn refresh_gauges(&mut self) {
        self.metrics.waiting = self.waiting.len();
        self.metrics.running = self.running.len();
        let held = self.total_blocks - self.free_blocks() - self.evictable.len() as u32;
        self.metrics.kv_cache_usage = f64::from(held) / f64::from(self.total_blocks.max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round numbers: 1000 prompt tokens/s (1 ms per token), decode 10 ms +
    /// 1 ms per sequence, blocks of 4 tokens.
    fn config() -> EngineConfig {
        EngineConfig {
            max_batch: 4,
            kv_capacity_tokens: 64,
            block_size: 4,
            prefill_tokens_per_s: 1000,
            decode_step_base: Duration::from_millis(10),
            decode_step_per_seq: Duration::from_millis(1),
            default_output_tokens: 8,
        }
    }

    fn request(first_token: u32, prompt_len: u32, output_tokens: u32) -> EngineRequest {
        EngineRequest {
            prompt: (first_token..first_token + prompt_len).collect(),
            output_tokens,
        }
    }

    fn run_to_end(engine: &mut Engine) -> Vec<StepReport> {
        let mut steps = Vec::new();
        while let Some(step) = engine.step() {
            steps.push(step);
        }
        steps
    }

    #[test]
    fn prefill_then_decode_steps_have_the_modelled_durations() {
        let mut engine = Engine::new(config());
        engine.submit(request(0, 10, 3)).expect("fits");
        let steps = run_to_end(&mut engine);
        let durations: Vec<_> = steps.iter().map(|s| s.duration).collect();
        // 10 prompt tokens at 1 ms, then two decode steps of 10 + 1 ms.
        assert_eq!(durations, [10, 11, 11].map(Duration::from_millis).to_vec());
        assert_eq!(steps[2].finished.len(), 1);
        let done = steps[2].finished[0];
        assert_eq!(done.first_token_at, Duration::from_millis(10));
        assert_eq!(done.finished_at, Duration::from_millis(32));
        assert_eq!(done.completion_tokens, 3);
    }

    #[test]
    fn decode_step_slows_with_batch_size() {
        let mut engine = Engine::new(config());
        for i in 0..3 {
            engine.submit(request(i * 100, 4, 2)).expect("fits");
        }
        let steps = run_to_end(&mut engine);
        // One prefill step of 12 tokens, then one decode step of 3 sequences.
        assert_eq!(steps[0].prefill_tokens, 12);
        assert_eq!(steps[1].decode_sequences, 3);
        assert_eq!(steps[1].duration, Duration::from_millis(13));
        assert_eq!(config().decode_step_time(1), Duration::from_millis(11));
    }

    #[test]
    fn batch_cap_is_respected() {
        let mut engine = Engine::new(EngineConfig {
            kv_capacity_tokens: 1024,
            ..config()
        });
        for i in 0..6 {
            engine.submit(request(i * 100, 4, 3)).expect("fits");
        }
        let first = engine.step().expect("work");
        assert_eq!(first.tokens.len(), 4);
        assert_eq!(engine.metrics().running, 4);
        assert_eq!(engine.metrics().waiting, 2);
        let steps = run_to_end(&mut engine);
        assert!(steps.iter().all(|s| s.tokens.len() <= 4));
        let finished: usize = steps.iter().map(|s| s.finished.len()).sum();
        assert_eq!(finished, 6);
    }

    #[test]
    fn a_cached_prefix_skips_its_prefill() {
        let mut engine = Engine::new(config());
        // 12 shared tokens (3 blocks) + 4 of its own.
        let shared: Vec<u32> = (0..12).collect();
        let prompt = |own: u32| EngineRequest {
            prompt: shared.iter().copied().chain(own..own + 4).collect(),
            output_tokens: 1,
        };
        engine.submit(prompt(1000)).expect("fits");
        let first = run_to_end(&mut engine);
        assert_eq!(first[0].prefill_tokens, 16);
        assert_eq!(first[0].duration, Duration::from_millis(16));
        engine.submit(prompt(2000)).expect("fits");
        let second = run_to_end(&mut engine);
        assert_eq!(second[0].prefill_tokens, 4);
        assert_eq!(second[0].duration, Duration::from_millis(4));
        assert_eq!(second[0].finished[0].cached_prompt_tokens, 12);
        let metrics = engine.metrics();
        assert_eq!(metrics.prefix_cache_queries, 32);
        assert_eq!(metrics.prefix_cache_hits, 12);
    }

    #[test]
    fn a_fully_cached_prompt_still_computes_its_last_block() {
        let mut engine = Engine::new(config());
        engine.submit(request(0, 8, 1)).expect("fits");
        run_to_end(&mut engine);
        engine.submit(request(0, 8, 1)).expect("fits");
        let steps = run_to_end(&mut engine);
        assert_eq!(steps[0].prefill_tokens, 4);
        assert_eq!(engine.metrics().prefix_cache_hits, 4);
    }

    #[test]
    fn least_recently_used_cached_blocks_are_evicted_first() {
        // 16 blocks. A (8 blocks) then B (8 blocks) leave 16 cached blocks;
        // C (4 blocks) evicts A's, the least recently used, so B still hits.
        let mut engine = Engine::new(config());
        engine.submit(request(0, 31, 1)).expect("fits");
        run_to_end(&mut engine);
        engine.submit(request(1000, 31, 1)).expect("fits");
        run_to_end(&mut engine);
        engine.submit(request(5000, 15, 1)).expect("fits");
        run_to_end(&mut engine);
        engine.submit(request(1000, 31, 1)).expect("fits");
        let b_again = run_to_end(&mut engine);
        assert_eq!(b_again[0].finished[0].cached_prompt_tokens, 28);
        engine.submit(request(0, 31, 1)).expect("fits");
        let a_again = run_to_end(&mut engine);
        // A's tail went first: its first 5 blocks are still cached.
        assert_eq!(a_again[0].finished[0].cached_prompt_tokens, 20);
    }

    #[test]
    fn a_full_cache_queues_the_next_request() {
        // 16 blocks; each request needs 10 (36 prompt + 4 output tokens).
        let mut engine = Engine::new(config());
        engine.submit(request(0, 36, 4)).expect("fits");
        engine.submit(request(100, 36, 4)).expect("fits");
        let first = engine.step().expect("work");
        assert_eq!(first.tokens.len(), 1);
        assert_eq!(engine.metrics().running, 1);
        assert_eq!(engine.metrics().waiting, 1);
        assert!(engine.metrics().kv_cache_usage > 0.6);
        let steps = run_to_end(&mut engine);
        let second_admitted = steps
            .iter()
            .position(|s| s.prefill_tokens > 0)
            .expect("admitted once the first finished");
        assert!(steps[..second_admitted]
            .iter()
            .any(|s| !s.finished.is_empty()));
    }

    #[test]
    fn a_full_cache_preempts_the_newest_sequence_which_is_recomputed() {
        // 16 blocks. Two requests of 28 prompt tokens (8 blocks each with the
        // next token's slot) fit together; at their 5th token both need a 9th block.
        let mut engine = Engine::new(config());
        let a = engine.submit(request(0, 28, 8)).expect("fits");
        let b = engine.submit(request(100, 28, 8)).expect("fits");
        let steps = run_to_end(&mut engine);
        assert_eq!(steps[0].tokens.len(), 2);
        let preempting = steps
            .iter()
            .find(|s| !s.preempted.is_empty())
            .expect("a preemption");
        assert_eq!(preempting.preempted, vec![b]);
        assert_eq!(preempting.tokens.len(), 1);
        assert_eq!(preempting.tokens[0].request, a);
        assert_eq!(engine.metrics().preemptions, 1);
        // B is recomputed: its uncached prompt and generated tokens again.
        let recompute = steps
            .iter()
            .skip(1)
            .find(|s| s.prefill_tokens > 0)
            .expect("B readmitted");
        assert!(recompute
            .tokens
            .iter()
            .any(|t| t.request == b && t.index == 4));
        let b_tokens: Vec<u32> = steps
            .iter()
            .flat_map(|s| s.tokens.iter())
            .filter(|t| t.request == b)
            .map(|t| t.index)
            .collect();
        assert_eq!(b_tokens, (0..8).collect::<Vec<_>>());
        assert_eq!(engine.metrics().kv_cache_usage, 0.0);
    }

    #[test]
    fn a_request_larger_than_the_cache_is_refused() {
        let mut engine = Engine::new(config());
        assert_eq!(
            engine.submit(request(0, 64, 1)),
            Err(EngineError::TooLong {
                needed: 17,
                capacity: 16
            })
        );
    }

    #[test]
    fn aborting_releases_the_blocks() {
        let mut engine = Engine::new(config());
        let id = engine.submit(request(0, 20, 10)).expect("fits");
        engine.step();
        assert!(engine.metrics().kv_cache_usage > 0.0);
        assert!(engine.abort(id));
        assert!(!engine.has_work());
        assert_eq!(engine.metrics().kv_cache_usage, 0.0);
        assert_eq!(engine.metrics().running, 0);
    }
}
