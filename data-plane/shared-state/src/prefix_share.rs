//! What one proxy learns of where prompts went reaches the others, over the
//! shared store's publish/subscribe.
//!
//! Prefix affinity ([`router_policy::prefix_cache`]) keeps, per endpoint,
//! the block hashes this proxy sent there. Behind a round-robin load
//! balancer each proxy of a fleet sees a share of a conversation's turns:
//! without sharing, the proxy that gets turn 3 does not know that another
//! sent turns 1 and 2 to one endpoint. So every proxy publishes, for each
//! request it placed, `(pool, endpoint, chain)` on the channel
//! `router:prefix`, and records what the others publish into its own
//! indexes, as if it had sent the requests itself. Placement of a prefix
//! nobody holds needs no sharing (its home on the ring is the same on
//! every proxy); sharing carries the rest, a few milliseconds late.
//!
//! The pools reach it as a [`PlacementSink`] (the endpoints crate links
//! no store). Off the request path: a grant puts the entry in a bounded queue
//! ([`QUEUE`] entries and [`MAX_QUEUED_BYTES`]; when full, entries are
//! dropped and counted, a
//! proxy's own placement is unaffected); a task publishes them in batches
//! of at most [`MAX_MESSAGE_BYTES`] every [`FLUSH_EVERY`]; another
//! subscribes and applies what others sent (its own messages, recognised
//! by a random sender id, are skipped). A lost message costs a cache miss,
//! never a wrong answer, so delivery is best effort (pub/sub keeps
//! nothing for a proxy that was away).
//!
//! The message, little-endian: `b"PX1"`, the sender id (u64), then
//! entries of: the pool's name and the endpoint's address (each a u16
//! length and the bytes), the prompt tokens the sender expects the
//! endpoint to prefill (u32: the others count them as that endpoint's
//! pending work until drained), the block count (u16) and the blocks (u64
//! each). A message that does not parse is dropped whole.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use router_endpoints::PlacementSink;

/// Entries waiting to be published, at most.
pub const QUEUE: usize = 4096;
/// Bytes those entries may hold, at most (a chain of 512 blocks is 4 KiB;
/// [`QUEUE`] of the longest, 4,096 blocks, would be 128 MiB).
pub const MAX_QUEUED_BYTES: usize = 4 * 1024 * 1024;
/// The largest message published or accepted.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// How often queued entries are published.
pub const FLUSH_EVERY: Duration = Duration::from_millis(5);
/// The most blocks an entry carries: as many as a policy may hash.
pub const MAX_BLOCKS: usize = router_policy::engine_aware::MAX_PREFIX_BLOCKS;

const MAGIC: &[u8; 3] = b"PX1";
/// A message's header: the magic and the sender's id.
const HEADER_LEN: usize = MAGIC.len() + 8;

/// One placement: `pool` sent a prompt with `chain` to `endpoint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned {
    /// The pool's name.
    pub pool: Arc<str>,
    /// The endpoint's address.
    pub endpoint: Arc<str>,
    /// The prompt's block hashes, first block first.
    pub chain: Vec<u64>,
    /// Prompt tokens the sender expects the endpoint to prefill.
    pub uncached: u32,
}

impl Learned {
    /// What it holds, for the queue's byte budget.
    fn bytes(&self) -> usize {
        self.pool.len() + self.endpoint.len() + 8 * self.chain.len()
    }
}

/// Where placements the other proxies made are applied (the proxy's
/// pools: each entry is learned by the pool it names, as if this proxy
/// had placed it).
pub trait PlacementTarget: Send + Sync + 'static {
    /// Applies one message's entries.
    fn learned_elsewhere(&self, entries: Vec<Learned>);
}

/// The proxy's side of the sharing: where grants put what they learned.
pub struct PrefixShare {
    tx: tokio::sync::mpsc::Sender<Learned>,
    /// Bytes of the entries queued ([`MAX_QUEUED_BYTES`]).
    queued: Arc<AtomicUsize>,
    dropped: AtomicU64,
    /// What the tasks need, taken when the first pool with prefix
    /// affinity asks ([`PrefixShare::activate`]): a proxy without such a
    /// pool opens no connection for this.
    start: std::sync::Mutex<Option<Start>>,
}

/// The publisher's and subscriber's makings, until started.
struct Start {
    client: redis::Client,
    channel: String,
    target: std::sync::Weak<dyn PlacementTarget>,
    rx: tokio::sync::mpsc::Receiver<Learned>,
    queued: Arc<AtomicUsize>,
    runtime: tokio::runtime::Handle,
}

impl PrefixShare {
    /// Sharing through `client`'s server on `channel`, with `target`
    /// (the proxy's pools) applying what the others send; nothing runs until
    /// [`PrefixShare::activate`]. Call within a tokio runtime (the tasks
    /// run on it).
    pub fn new(
        client: redis::Client,
        channel: String,
        target: std::sync::Weak<dyn PlacementTarget>,
    ) -> Option<Arc<Self>> {
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let queued = Arc::new(AtomicUsize::new(0));
        Some(Arc::new(Self {
            tx,
            queued: Arc::clone(&queued),
            dropped: AtomicU64::new(0),
            start: std::sync::Mutex::new(Some(Start {
                client,
                channel,
                target,
                rx,
                queued,
                runtime,
            })),
        }))
    }
}

impl PlacementSink for PrefixShare {
    /// Notes a placement for the other proxies (never waits).
    fn learned(&self, pool: &Arc<str>, endpoint: &Arc<str>, chain: &[u64], uncached: u64) {
        let entry = Learned {
            pool: Arc::clone(pool),
            endpoint: Arc::clone(endpoint),
            chain: chain[..chain.len().min(MAX_BLOCKS)].to_vec(),
            uncached: u32::try_from(uncached).unwrap_or(u32::MAX),
        };
        let bytes = entry.bytes();
        if reserve(&self.queued, bytes) {
            if self.tx.try_send(entry).is_ok() {
                return;
            }
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
        }
        if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                "prefix sharing: the publish queue is full; placements are not shared until it drains"
            );
        }
    }

    /// Starts publishing and subscribing (once; a pool with prefix
    /// affinity calls it).
    fn activate(&self) {
        let start = self.start.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = start {
            let sender = router_endpoints::random::u64();
            s.runtime.spawn(publish(
                s.client.clone(),
                s.channel.clone(),
                sender,
                s.rx,
                s.queued,
            ));
            s.runtime
                .spawn(subscribe(s.client, s.channel, sender, s.target));
        }
    }
}

/// Takes `bytes` of the queue's budget; false (and nothing taken) when
/// they do not fit.
fn reserve(queued: &AtomicUsize, bytes: usize) -> bool {
    if queued.fetch_add(bytes, Ordering::Relaxed) + bytes <= MAX_QUEUED_BYTES {
        return true;
    }
    queued.fetch_sub(bytes, Ordering::Relaxed);
    false
}

/// Appends `entry` to a message being built; false (and nothing written)
/// when it would pass [`MAX_MESSAGE_BYTES`] or a field is too long.
pub fn encode_entry(out: &mut Vec<u8>, entry: &Learned) -> bool {
    let (pool, endpoint) = (entry.pool.as_bytes(), entry.endpoint.as_bytes());
    let blocks = entry.chain.len().min(MAX_BLOCKS);
    let size = 2 + pool.len() + 2 + endpoint.len() + 4 + 2 + 8 * blocks;
    let (Ok(pool_len), Ok(endpoint_len), Ok(count)) = (
        u16::try_from(pool.len()),
        u16::try_from(endpoint.len()),
        u16::try_from(blocks),
    ) else {
        return false;
    };
    if out.len() + size > MAX_MESSAGE_BYTES {
        return false;
    }
    out.extend_from_slice(&pool_len.to_le_bytes());
    out.extend_from_slice(pool);
    out.extend_from_slice(&endpoint_len.to_le_bytes());
    out.extend_from_slice(endpoint);
    out.extend_from_slice(&entry.uncached.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    for b in &entry.chain[..blocks] {
        out.extend_from_slice(&b.to_le_bytes());
    }
    true
}

/// A message's header for `sender`.
pub fn message_header(sender: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&sender.to_le_bytes());
    out
}

/// A message's sender and entries; `None` when it does not parse.
pub fn decode(message: &[u8]) -> Option<(u64, Vec<Learned>)> {
    if message.len() > MAX_MESSAGE_BYTES {
        return None;
    }
    let mut rest = message.strip_prefix(MAGIC)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        rest = tail;
        Some(head)
    };
    let sender = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let mut entries = Vec::new();
    while let Some(len) = take(2) {
        let pool_len = usize::from(u16::from_le_bytes(len.try_into().ok()?));
        let pool = std::str::from_utf8(take(pool_len)?).ok()?;
        let endpoint_len = usize::from(u16::from_le_bytes(take(2)?.try_into().ok()?));
        let endpoint = std::str::from_utf8(take(endpoint_len)?).ok()?;
        let uncached = u32::from_le_bytes(take(4)?.try_into().ok()?);
        let count = usize::from(u16::from_le_bytes(take(2)?.try_into().ok()?));
        if count > MAX_BLOCKS {
            return None;
        }
        let blocks = take(8 * count)?;
        let chain = blocks
            .chunks_exact(8)
            .map(|b| b.try_into().map(u64::from_le_bytes))
            .collect::<Result<Vec<u64>, _>>()
            .ok()?;
        entries.push(Learned {
            pool: pool.into(),
            endpoint: endpoint.into(),
            chain,
            uncached,
        });
    }
    Some((sender, entries))
}

async fn publish(
    client: redis::Client,
    channel: String,
    sender: u64,
    mut rx: tokio::sync::mpsc::Receiver<Learned>,
    queued: Arc<AtomicUsize>,
) {
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    let mut carried: Option<Learned> = None;
    // Out of the queue: its bytes leave the budget.
    let taken = |e: Learned| {
        queued.fetch_sub(e.bytes(), Ordering::Relaxed);
        e
    };
    loop {
        let first = match carried.take() {
            Some(e) => e,
            None => match rx.recv().await {
                Some(e) => taken(e),
                None => return,
            },
        };
        tokio::time::sleep(FLUSH_EVERY).await;
        let mut message = message_header(sender);
        let mut next = Some(first);
        while let Some(entry) = next.take() {
            if !encode_entry(&mut message, &entry) {
                // Too big for what is left of this message: the next one.
                if message.len() > HEADER_LEN {
                    carried = Some(entry);
                }
                break;
            }
            next = rx.try_recv().ok().map(taken);
        }
        if message.len() <= HEADER_LEN {
            continue;
        }
        if conn.is_none() {
            conn = tokio::time::timeout(
                Duration::from_secs(1),
                client.get_multiplexed_async_connection(),
            )
            .await
            .ok()
            .and_then(Result::ok);
        }
        let Some(c) = conn.as_mut() else {
            tracing::debug!("prefix sharing: shared store unreachable; placements not shared");
            continue;
        };
        let sent = tokio::time::timeout(
            Duration::from_secs(1),
            redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(&message)
                .query_async::<i64>(c),
        )
        .await;
        if !matches!(sent, Ok(Ok(_))) {
            conn = None;
        }
    }
}

async fn subscribe(
    client: redis::Client,
    channel: String,
    sender: u64,
    target: std::sync::Weak<dyn PlacementTarget>,
) {
    loop {
        let connected = tokio::time::timeout(Duration::from_secs(1), client.get_async_pubsub())
            .await
            .ok()
            .and_then(Result::ok);
        if let Some(mut pubsub) = connected {
            if pubsub.subscribe(&channel).await.is_ok() {
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let Some(target) = target.upgrade() else {
                        return;
                    };
                    let payload: &[u8] = msg.get_payload_bytes();
                    let Some((from, entries)) = decode(payload) else {
                        tracing::debug!("prefix sharing: a message that does not parse, dropped");
                        continue;
                    };
                    if from == sender {
                        continue;
                    }
                    target.learned_elsewhere(entries);
                }
            }
        }
        if target.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pool: &str, endpoint: &str, n: u64) -> Learned {
        Learned {
            pool: pool.into(),
            endpoint: endpoint.into(),
            chain: (0..n)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect(),
            uncached: 1234,
        }
    }

    #[test]
    fn the_queue_holds_at_most_its_byte_budget() {
        let queued = AtomicUsize::new(0);
        let longest = entry("gpus", "http://10.0.0.1:8000", MAX_BLOCKS as u64).bytes();
        let mut kept = 0;
        while reserve(&queued, longest) {
            kept += 1;
        }
        assert_eq!(kept, MAX_QUEUED_BYTES / longest);
        assert!(kept < QUEUE, "the bytes bind before the count");
        assert!(queued.load(Ordering::Relaxed) <= MAX_QUEUED_BYTES);
        // Taken out of the queue, an entry's bytes make room again.
        queued.fetch_sub(longest, Ordering::Relaxed);
        assert!(reserve(&queued, longest));
    }

    #[test]
    fn a_message_decodes_to_what_was_encoded() {
        let mut m = message_header(7);
        let entries = [
            entry("gpus", "http://10.0.0.1:8000", 3),
            entry("p", "h:1", 0),
        ];
        for e in &entries {
            assert!(encode_entry(&mut m, e));
        }
        assert_eq!(decode(&m), Some((7, entries.to_vec())));
        assert_eq!(decode(&message_header(9)), Some((9, Vec::new())));
    }

    #[test]
    fn a_message_stays_under_its_bound_and_garbage_is_refused() {
        let mut m = message_header(1);
        let big = entry("gpus", "h:1", MAX_BLOCKS as u64);
        let mut fitted = 0;
        while encode_entry(&mut m, &big) {
            fitted += 1;
        }
        assert!(m.len() <= MAX_MESSAGE_BYTES && fitted >= 7, "{fitted}");
        assert_eq!(decode(&m).map(|(_, e)| e.len()), Some(fitted));
        // Truncated, wrong magic, a count past the bound: refused whole.
        assert_eq!(decode(&m[..m.len() - 3]), None);
        assert_eq!(decode(b"PX2\0\0\0\0\0\0\0\0"), None);
        let mut bad = message_header(1);
        bad.extend_from_slice(&1u16.to_le_bytes());
        bad.push(b'p');
        bad.extend_from_slice(&1u16.to_le_bytes());
        bad.push(b'h');
        bad.extend_from_slice(&7u32.to_le_bytes());
        bad.extend_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(decode(&bad), None);
        assert_eq!(decode(b""), None);
    }

    proptest::proptest! {
        /// Whatever a message holds (another program on the channel, a
        /// truncated or corrupted one), decoding answers without
        /// panicking, and a valid message with bytes flipped decodes to
        /// entries within the bounds or not at all.
        #[test]
        fn any_message_decodes_or_is_refused_without_panicking(
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
            flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 0..8),
        ) {
            let _ = decode(&junk);
            let mut m = message_header(3);
            let entries = [entry("gpus", "http://10.0.0.1:8000", 40), entry("p", "h:1", 3)];
            for e in &entries {
                proptest::prop_assert!(encode_entry(&mut m, e));
            }
            for (at, byte) in flips {
                let len = m.len();
                m[at % len] ^= byte;
            }
            if let Some((_, got)) = decode(&m) {
                for e in got {
                    proptest::prop_assert!(e.chain.len() <= MAX_BLOCKS);
                }
            }
        }
    }
}
