//! The proxies' latest route records, fetched over their config streams
//! when the console's Decisions page asks: each open stream registers a
//! channel here ([`Hub::decision_stream_opened`]); [`Hub::fetch_decisions`]
//! puts a `DecisionsRequest` on every one and gathers the `Decisions`
//! parts the proxies send back ([`Hub::decisions_received`]) until each
//! has sent its last part or the wait is over.
//!
//! The same channel per stream carries the Pools page's load requests
//! ([`StreamQuery::Load`], `load.rs`).
//!
//! Bounded: a request per stream waits in a channel of
//! [`QUERIES_PER_STREAM`] (a stream that is that far behind is skipped),
//! parts wait in one channel of [`PARTS_QUEUED`] per fetch (more are
//! dropped), and what is kept of each proxy's answer is cut at the bytes
//! the fetch asked of it. [`Hub::fetch_decisions`] asks the proxies
//! connected to this replica; [`Hub::fleet_decisions`] (`fleet.rs`, what
//! the page calls) asks the other replicas for theirs through the store
//! at the same time, and each of them answers with this same fetch.

use super::*;

use tokio::sync::mpsc;

/// Requests queued per stream at most.
pub(crate) const QUERIES_PER_STREAM: usize = 4;
/// Parts queued per fetch at most.
const PARTS_QUEUED: usize = 256;

/// The open streams and the fetches waiting for their answers.
#[derive(Default)]
pub(super) struct Queries {
    next: u64,
    /// Per stream: its node and where its requests go.
    pub(super) streams: HashMap<u64, (String, mpsc::Sender<StreamQuery>)>,
    /// Per fetch id: where the parts go.
    pending: HashMap<String, mpsc::Sender<(String, pb::Decisions)>>,
    /// Per load fetch id: where the answers go (`load.rs`).
    pub(super) loads: HashMap<String, mpsc::Sender<(String, pb::Load)>>,
}

/// What the console asks of a proxy over its config stream, between
/// snapshots.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamQuery {
    /// Its latest route records (the Decisions page).
    Decisions(pb::DecisionsRequest),
    /// Its pools' load (the Pools page).
    Load(pb::LoadRequest),
}

impl StreamQuery {
    /// The control message that carries it (no snapshot: a proxy applies
    /// nothing; one from before NACKs it).
    pub fn into_message(self) -> pb::ControlMessage {
        match self {
            Self::Decisions(q) => pb::ControlMessage {
                decisions: Some(q),
                ..Default::default()
            },
            Self::Load(q) => pb::ControlMessage {
                load: Some(q),
                ..Default::default()
            },
        }
    }
}

/// One proxy's answer (also what a replica passes on to another, as
/// JSON: `fleet.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProxyDecisions {
    /// Its node id.
    pub node: String,
    /// Its route records' JSON lines, newest first.
    pub lines: Vec<String>,
    /// The records its ring keeps at most.
    pub capacity: u32,
    /// Whether it sent its last part in time.
    pub complete: bool,
    /// Its oldest records left out by the replica it is connected to, to
    /// keep its answer to this one under the cap (`fleet.rs`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cut: u32,
    /// The replica it is connected to, when that is another one (empty:
    /// this one).
    #[serde(skip)]
    pub replica: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Hub {
    pub(super) fn queries(&self) -> std::sync::MutexGuard<'_, Queries> {
        self.queries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stream of `node` opened: its id and the console's requests to
    /// send on it (decisions and load).
    pub fn decision_stream_opened(&self, node: &str) -> (u64, mpsc::Receiver<StreamQuery>) {
        let (tx, rx) = mpsc::channel(QUERIES_PER_STREAM);
        let mut q = self.queries();
        q.next += 1;
        let id = q.next;
        q.streams.insert(id, (node.to_string(), tx));
        (id, rx)
    }

    /// Config streams open on this replica now.
    pub fn open_streams(&self) -> usize {
        self.queries().streams.len()
    }

    /// Stream `id` closed.
    pub fn decision_stream_closed(&self, id: u64) {
        self.queries().streams.remove(&id);
    }

    /// A part of a proxy's answer, from the stream of `node`; one no fetch
    /// waits for (late, or never asked) is dropped.
    pub fn decisions_received(&self, node: &str, d: pb::Decisions) {
        let to = self.queries().pending.get(&d.id).cloned();
        if let Some(to) = to {
            if to.try_send((node.to_string(), d)).is_err() {
                tracing::debug!(
                    node,
                    "a decisions part dropped: the fetch has enough queued"
                );
            }
        }
    }

    /// Asks every stream open on this replica for its latest `max_records`
    /// records (`max_bytes` of lines at most each) and gathers the answers
    /// for at most `wait`: one entry per stream asked, by node.
    pub async fn fetch_decisions(
        &self,
        max_records: u32,
        max_bytes: u32,
        wait: Duration,
    ) -> Vec<ProxyDecisions> {
        let id = uuid::Uuid::now_v7().to_string();
        let (tx, mut rx) = mpsc::channel(PARTS_QUEUED);
        let streams: Vec<(String, mpsc::Sender<StreamQuery>)> = {
            let mut q = self.queries();
            q.pending.insert(id.clone(), tx);
            q.streams.values().cloned().collect()
        };
        let mut answers: BTreeMap<String, ProxyDecisions> = BTreeMap::new();
        for (node, to) in &streams {
            let asked = to
                .try_send(StreamQuery::Decisions(pb::DecisionsRequest {
                    id: id.clone(),
                    max_records,
                    max_bytes,
                }))
                .is_ok();
            if asked {
                answers.insert(
                    node.clone(),
                    ProxyDecisions {
                        node: node.clone(),
                        ..ProxyDecisions::default()
                    },
                );
            }
        }
        let mut bytes: HashMap<String, usize> = HashMap::new();
        let deadline = Instant::now() + wait;
        while answers.values().any(|a| !a.complete) {
            let part = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(p)) => p,
                Ok(None) | Err(_) => break,
            };
            let (node, d) = part;
            let Some(a) = answers.get_mut(&node) else {
                continue;
            };
            let used = bytes.entry(node).or_default();
            for line in d.lines {
                if a.lines.len() >= max_records as usize
                    || used.saturating_add(line.len()) > max_bytes as usize
                {
                    break;
                }
                *used += line.len();
                a.lines.push(line);
            }
            a.capacity = d.capacity;
            a.complete |= d.last;
        }
        self.queries().pending.remove(&id);
        answers.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fetch_asks_every_stream_and_gathers_the_parts_until_the_last() {
        let dir = std::env::temp_dir().join(format!("router-hub-decisions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::store::RedbStore::open(&dir).unwrap();
        let hub = Hub::open(Box::new(store), Guards::default(), Limits::default())
            .await
            .unwrap();
        let (a, mut ra) = hub.decision_stream_opened("edge-a");
        let (_b, mut rb) = hub.decision_stream_opened("edge-b");
        let (c, _rc) = hub.decision_stream_opened("edge-c");
        hub.decision_stream_closed(c);
        let answering = Arc::clone(&hub);
        let asked = |q: Option<StreamQuery>| match q {
            Some(StreamQuery::Decisions(q)) => q,
            other => panic!("not a decisions request: {other:?}"),
        };
        let proxies = tokio::spawn(async move {
            let qa = asked(ra.recv().await);
            assert_eq!((qa.max_records, qa.max_bytes), (3, 100));
            for (lines, last) in [(vec!["a1", "a2"], false), (vec!["a3", "a4"], true)] {
                answering.decisions_received(
                    "edge-a",
                    pb::Decisions {
                        id: qa.id.clone(),
                        lines: lines.into_iter().map(String::from).collect(),
                        last,
                        capacity: 256,
                    },
                );
            }
            // edge-b is asked and never answers; a stranger's part is dropped.
            let qb = asked(rb.recv().await);
            answering.decisions_received(
                "edge-z",
                pb::Decisions {
                    id: qb.id,
                    lines: vec!["z".into()],
                    last: true,
                    capacity: 1,
                },
            );
        });
        let got = hub
            .fetch_decisions(3, 100, Duration::from_millis(300))
            .await;
        proxies.await.unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].node, "edge-a");
        assert_eq!(got[0].lines, ["a1", "a2", "a3"], "at most max_records");
        assert!(got[0].complete);
        assert_eq!(got[1].node, "edge-b");
        assert!(!got[1].complete && got[1].lines.is_empty());
        assert!(hub.queries().pending.is_empty());
        hub.decision_stream_closed(a);
        drop(hub);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
