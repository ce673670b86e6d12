//! Longest-prefix affinity: which leading blocks of a prompt an endpoint
//! likely holds in its prefix cache.
//!
//! An engine with prefix caching (vLLM, SGLang) names each full block of a
//! prompt's tokens by a hash that covers the block *and every block before
//! it*, keeps the blocks it computed in a fixed-size cache and evicts the
//! least recently used first. A request then skips the prefill of its
//! longest cached prefix: the next turn of a conversation reuses the whole
//! previous turn, another conversation with the same system prompt reuses
//! that system prompt. One hash over a fixed prefix cannot see either (the
//! next turn is longer, the other conversation diverges after the system
//! prompt), so the router mirrors the engine instead:
//!
//! 1. **The chain** ([`block_chain`]): the prompt's text (roles and
//!    contents, in order: [`prompt_text`]) cut into whole blocks of
//!    `block_bytes`, each block hashed with the previous block's hash as
//!    its seed (xxh3, a fixed specification: every proxy of a fleet gets
//!    the same chain). Two prompts share the first `k` hashes exactly when
//!    they share their first `k` blocks.
//! 2. **The index** ([`BlockIndex`], one per endpoint): the block hashes
//!    the router sent there recently, at most `capacity` of them (the
//!    engine's cache size in the router's blocks), the least recently
//!    used forgotten first, like the engine's own cache. A request's chain
//!    is recorded tail first, so a block is always at least as fresh as
//!    any block after it; the least recently used block is therefore never
//!    the parent of a block still held, and what the index holds of any
//!    chain is a prefix of it (property-tested). That makes
//!    [`BlockIndex::matched`] a binary search: `log2(blocks)` lookups per
//!    endpoint, not one per block.
//! 3. **The score** ([`crate::engine_aware::choose`]): the expected time to
//!    first token on each endpoint, the prefill of the blocks it does not
//!    hold plus the wait its queue and batch imply.
//!
//! The index is an inference: the engine may have evicted a block sooner
//! (other clients, long decodes holding KV) or the router may not know what
//! another client sent. A wrong guess costs one prefill, never a wrong
//! answer. Pure: no clock, no I/O.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// The seed of a chain's first block (any fixed value; part of the format,
/// since every proxy of a fleet must compute the same chain).
const CHAIN_SEED: u64 = 0x5052_4546_4958_3331;

/// The chained block hashes of `text`: one per whole block of
/// `block_bytes`, at most `max_blocks`; the hash of block `i` covers blocks
/// `0..=i`. Bytes past the last whole block do not count (an engine caches
/// only full blocks).
pub fn block_chain(text: &[u8], block_bytes: usize, max_blocks: usize) -> Vec<u64> {
    let block_bytes = block_bytes.max(1);
    let mut out = Vec::with_capacity((text.len() / block_bytes).min(max_blocks));
    let mut previous = CHAIN_SEED;
    for block in text.chunks_exact(block_bytes).take(max_blocks) {
        previous = xxhash_rust::xxh3::xxh3_64_with_seed(block, previous);
        out.push(previous);
    }
    out
}

#[derive(serde::Deserialize)]
struct Body<'a> {
    #[serde(default, borrow)]
    system: Option<Content<'a>>,
    #[serde(default, borrow)]
    messages: Vec<Message<'a>>,
    #[serde(default, borrow)]
    prompt: Option<Content<'a>>,
}

#[derive(serde::Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    role: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    content: Option<Content<'a>>,
}

/// A message's content: a string or a list of parts (OpenAI's content
/// parts, Anthropic's content blocks), of which the texts count.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(#[serde(borrow)] std::borrow::Cow<'a, str>),
    Parts(#[serde(borrow)] Vec<Part<'a>>),
    Other(serde::de::IgnoredAny),
}

#[derive(serde::Deserialize)]
struct Part<'a> {
    #[serde(default, borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
}

impl Content<'_> {
    fn push(&self, out: &mut Vec<u8>) {
        match self {
            Content::Text(t) => out.extend_from_slice(t.as_bytes()),
            Content::Parts(parts) => {
                for t in parts.iter().filter_map(|p| p.text.as_deref()) {
                    out.extend_from_slice(t.as_bytes());
                }
            }
            Content::Other(_) => {}
        }
    }
}

/// The text of a request's whole prompt, in the order an engine sees it:
/// an Anthropic-style top-level `system`, then every message's role and
/// text contents; for a completion, its `prompt`. `None` for a body that
/// is not such JSON. Only the order and the bytes matter: the same prompt
/// gives the same text on every proxy, and a prompt that extends another
/// gives a text that extends the other's.
pub fn prompt_text(body: &[u8]) -> Option<Vec<u8>> {
    let parsed: Body<'_> = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len());
    if let Some(system) = &parsed.system {
        out.extend_from_slice(b"system\n");
        system.push(&mut out);
        out.push(b'\n');
    }
    if parsed.messages.is_empty() {
        parsed.prompt.as_ref()?.push(&mut out);
        return Some(out);
    }
    for m in &parsed.messages {
        out.extend_from_slice(m.role.as_bytes());
        out.push(b'\n');
        if let Some(c) = &m.content {
            c.push(&mut out);
        }
        out.push(b'\n');
    }
    Some(out)
}

/// The hasher of the index's map: the keys are already xxh3 hashes, so the
/// map uses them as they are.
#[derive(Default, Clone, Copy)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The block hashes one endpoint likely holds: at most `capacity`, least
/// recently used forgotten first (see the module docs).
#[derive(Debug, Clone)]
pub struct BlockIndex {
    /// Block hash → the stamp of its last use.
    held: HashMap<u64, u64, BuildHasherDefault<Identity>>,
    /// Uses in stamp order, oldest first; an entry whose stamp is not its
    /// block's current one is stale and skipped (compacted when the stale
    /// ones outnumber the live).
    uses: VecDeque<(u64, u64)>,
    next_stamp: u64,
    capacity: usize,
}

/// Bytes one held block costs the index, for the memory figure in
/// docs/benchmarks.md: a map slot (key, stamp, control byte, at a load of
/// 7/8) and up to two use records (live and stale before compaction).
pub const BYTES_PER_BLOCK: usize = 16 * 8 / 7 + 1 + 2 * 16;

impl BlockIndex {
    /// An empty index of at most `capacity` blocks (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            held: HashMap::default(),
            uses: VecDeque::new(),
            next_stamp: 0,
            capacity: capacity.max(1),
        }
    }

    /// Most blocks held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// A new size (the engine reported its cache, or the policy changed):
    /// the least recently used blocks go first if it shrank.
    pub fn resize(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        self.evict();
    }

    /// The endpoint was sent a prompt with this chain: its blocks are held
    /// now, the leading ones freshest. A chain longer than the capacity
    /// keeps its first `capacity` blocks, as an engine's cache would.
    pub fn record(&mut self, chain: &[u64]) {
        let kept = &chain[..chain.len().min(self.capacity)];
        for &block in kept.iter().rev() {
            self.next_stamp += 1;
            self.held.insert(block, self.next_stamp);
            self.uses.push_back((block, self.next_stamp));
        }
        self.evict();
        if self.uses.len() > 2 * self.held.len() + 64 {
            self.compact();
        }
    }

    /// How many leading blocks of `chain` this endpoint likely holds.
    pub fn matched(&self, chain: &[u64]) -> usize {
        // What is held of a chain is a prefix of it (module docs): find
        // its end by bisection.
        let (mut lo, mut hi) = (0, chain.len());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.held.contains_key(&chain[mid - 1]) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Forgets everything (the engine restarted, or lost its cache).
    pub fn clear(&mut self) {
        self.held.clear();
        self.uses.clear();
    }

    fn evict(&mut self) {
        while self.held.len() > self.capacity {
            let Some((block, stamp)) = self.uses.pop_front() else {
                break;
            };
            if self.held.get(&block) == Some(&stamp) {
                self.held.remove(&block);
            }
        }
    }

    fn compact(&mut self) {
        let held = &self.held;
        self.uses
            .retain(|(block, stamp)| held.get(block) == Some(stamp));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_chain_covers_whole_blocks_and_shares_exactly_the_shared_prefix() {
        let a = b"system: you are a helpful agent. user: hello there, how are you";
        let b = b"system: you are a helpful agent. user: goodbye, see you later";
        let (ca, cb) = (block_chain(a, 16, 8), block_chain(b, 16, 8));
        assert_eq!(ca.len(), a.len() / 16);
        assert_eq!(ca[..2], cb[..2]);
        assert_ne!(ca[2], cb[2]);
        // A longer prompt extends the chain of the shorter.
        let longer = [a.as_slice(), b" and more text for a next turn".as_slice()].concat();
        let cl = block_chain(&longer, 16, 8);
        assert_eq!(cl[..ca.len()], ca[..]);
        assert_eq!(block_chain(&longer, 16, 2), cl[..2]);
        assert!(block_chain(b"short", 16, 8).is_empty());
        // The same block after a different prefix hashes differently.
        let x = block_chain(b"aaaaaaaaaaaaaaaaBBBBBBBBBBBBBBBB", 16, 4);
        let y = block_chain(b"cccccccccccccccCBBBBBBBBBBBBBBBB", 16, 4);
        assert_ne!(x[1], y[1]);
    }

    #[test]
    fn the_prompt_text_is_every_message_in_order_and_a_next_turn_extends_it() {
        let turn1 = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#;
        let turn2 = br#"{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}"#;
        let a = prompt_text(turn1).expect("chat");
        assert_eq!(a, b"system\nbe brief\nuser\nhi\n");
        let b = prompt_text(turn2).expect("chat");
        assert!(b.starts_with(&a));
        assert!(b.ends_with(b"assistant\nhello\nuser\nmore\n"));
        // Content parts, an Anthropic top-level system, a completion.
        let parts = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        assert_eq!(prompt_text(parts).expect("parts"), b"user\nhi\n");
        let anthropic = br#"{"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            prompt_text(anthropic).expect("anthropic"),
            b"system\nbe brief\nuser\nhi\n"
        );
        assert_eq!(prompt_text(br#"{"prompt":"abc"}"#).expect("prompt"), b"abc");
        // Escapes are decoded, so "\u0041" and "A" are the same prompt.
        assert_eq!(
            prompt_text(br#"{"prompt":"\u0041"}"#),
            prompt_text(br#"{"prompt":"A"}"#)
        );
        assert_eq!(prompt_text(b"not json"), None);
        assert_eq!(prompt_text(br#"{"model":"m"}"#), None);
    }

    #[test]
    fn the_index_matches_the_longest_held_prefix_and_forgets_the_least_recent() {
        let chain = |text: &str| block_chain(text.as_bytes(), 4, 64);
        let mut index = BlockIndex::new(8);
        let turn1 = chain("sys1sys1user");
        index.record(&turn1);
        let turn2 = chain("sys1sys1useransrnext");
        assert_eq!(index.matched(&turn2), 3);
        let other = chain("sys1sys1diff");
        assert_eq!(index.matched(&other), 2);
        assert_eq!(index.matched(&chain("sys2sys2")), 0);
        // Fill past the capacity with other prompts: turn 1's tail goes
        // first, its head last.
        index.record(&chain("abcdabcdabcdabcd"));
        index.record(&chain("wxyz"));
        assert_eq!(index.len(), 8);
        index.record(&chain("qqqq"));
        assert_eq!(index.matched(&turn2), 2);
        index.record(&chain("rrrrssss"));
        assert_eq!(index.matched(&turn2), 0);
        assert!(index.len() <= 8);
    }

    /// A random conversation forest: chains of prompts that share prefixes
    /// the way conversations do (a few roots, growing branches).
    fn chains() -> impl Strategy<Value = Vec<Vec<u64>>> {
        proptest::collection::vec((0usize..6, 0u8..4, 1usize..6), 1..60).prop_map(|steps| {
            let mut made: Vec<Vec<u8>> = Vec::new();
            for (parent, fill, grow) in steps {
                let mut text = made
                    .get(parent % made.len().max(1))
                    .cloned()
                    .unwrap_or_default();
                text.extend(std::iter::repeat_n(b'a' + fill, grow * 2));
                made.push(text);
            }
            made.iter().map(|t| block_chain(t, 2, 64)).collect()
        })
    }

    proptest! {
        /// What the index holds of any recorded chain is a prefix of it, so
        /// the bisection equals a scan from the first block; and it never
        /// holds more than its capacity.
        #[test]
        fn what_is_held_of_a_chain_is_a_prefix_and_bisection_equals_a_scan(
            recorded in chains(),
            capacity in 1usize..24,
        ) {
            let mut index = BlockIndex::new(capacity);
            for chain in &recorded {
                index.record(chain);
                prop_assert!(index.len() <= capacity);
                for c in &recorded {
                    let scan = c.iter().take_while(|b| index.held.contains_key(b)).count();
                    let held = c.iter().filter(|b| index.held.contains_key(b)).count();
                    prop_assert_eq!(index.matched(c), scan);
                    // Nothing held past the first missing block.
                    prop_assert_eq!(held, scan);
                }
            }
            prop_assert!(index.uses.len() <= 2 * index.held.len() + 64 + recorded.iter().map(Vec::len).max().unwrap_or(0));
        }

        /// A chain just recorded is held in full (up to the capacity).
        #[test]
        fn a_recorded_chain_is_matched_in_full(recorded in chains(), capacity in 1usize..24) {
            let mut index = BlockIndex::new(capacity);
            for chain in &recorded {
                index.record(chain);
                prop_assert_eq!(index.matched(chain), chain.len().min(capacity));
            }
        }
    }

    #[test]
    fn shrinking_the_index_forgets_the_least_recent_first() {
        let mut index = BlockIndex::new(16);
        let old = block_chain(b"oldoldoldold", 4, 8);
        let new = block_chain(b"newnewnewnew", 4, 8);
        index.record(&old);
        index.record(&new);
        index.resize(3);
        assert_eq!(index.matched(&new), 3);
        assert_eq!(index.matched(&old), 0);
        index.clear();
        assert!(index.is_empty());
    }
}
