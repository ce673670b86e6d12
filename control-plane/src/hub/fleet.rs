//! The whole fleet's route records and load, across control-plane
//! replicas: what the console's Decisions and Pools pages show.
//!
//! A replica asks its own proxies over their streams (`decisions.rs`,
//! `load.rs`) and, at the same time, the other replicas through the store
//! ([`crate::store::exchange`]: a query key, answers on its lease). Every
//! replica answers others' questions in [`answer_loop`] with the same
//! fetch restricted to its own proxies, and the asker merges: each proxy
//! once (its own answer first, else the most complete one), with the
//! replica it came through. A replica that did not answer within the
//! page's wait is named, and the proxies its presence records list as
//! connected are listed as not answering.
//!
//! An answer is cut to fit [`ANSWER_MAX_BYTES`] ([`encode_decisions`],
//! [`encode_load`]): route records are kept newest first, a proxy at a
//! time in turn, so each proxy keeps its newest; a load too large for its
//! share loses endpoints from the end and says so (`truncated`, as a proxy
//! that reports too many does). The answer counts what was cut.
//!
//! Bounded: [`ASKS_AT_ONCE`] questions asked at once by this replica (a
//! page drawn beyond that shows this replica's proxies, and says the
//! others were not asked), [`ANSWERS_AT_ONCE`] answered at once, answers
//! capped in bytes, and each wait bounded by the page's.

use super::*;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::store::exchange::{
    Asked, Query, Question, ANSWERS_AT_ONCE, ANSWER_MAX_BYTES, ASKS_AT_ONCE,
};

/// The longest a page waits, past its wait, to learn the proxies of the
/// replicas that did not answer.
const SILENT_LOOKUP: Duration = Duration::from_millis(500);

/// A fleet-wide fetch: every proxy once, and the replicas that did not
/// answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet<T> {
    /// One entry per proxy (this replica's first, then the others', by
    /// node).
    pub proxies: Vec<T>,
    /// Other replicas that did not answer in time.
    pub silent: Vec<String>,
    /// Whether the other replicas were left unasked (too many questions
    /// in flight from this replica).
    pub unasked: bool,
    /// Proxies the other replicas left out of their answers (or sent
    /// without their load) to keep them under [`ANSWER_MAX_BYTES`].
    pub proxies_cut: u64,
}

/// A replica's answer, as it travels (JSON).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Answer {
    /// The answering replica.
    replica: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    decisions: Vec<ProxyDecisions>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    load: Vec<LoadEntry>,
    /// Route records (decisions) or endpoints (load) left out to fit
    /// [`ANSWER_MAX_BYTES`].
    #[serde(default)]
    records_cut: u64,
    /// Proxies left out whole (or whose load was) to fit.
    #[serde(default)]
    proxies_cut: u64,
}

/// One proxy's load in an answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct LoadEntry {
    node: String,
    /// Its `Load` message, protobuf then base64; absent: it did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    load: Option<String>,
}

fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    serde_json::to_vec(value).map_or(usize::MAX, |v| v.len())
}

fn encode(answer: &Answer) -> Result<Vec<u8>, StoreError> {
    let bytes = serde_json::to_vec(answer).map_err(crate::store::backend)?;
    if bytes.len() > ANSWER_MAX_BYTES {
        return Err(crate::store::backend(format!(
            "an answer of {} bytes, over the {ANSWER_MAX_BYTES}-byte cap",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The envelope's size with its counters at their largest.
fn envelope_len(replica: &str) -> usize {
    json_len(&Answer {
        replica: replica.to_string(),
        records_cut: u64::MAX,
        proxies_cut: u64::MAX,
        ..Answer::default()
    }) + 16
}

/// `replica`'s answer to a decisions question, at most `cap` bytes: whole
/// proxies dropped from the end if even their names do not fit, then
/// route records kept newest first, one per proxy in turn, while they fit.
pub(crate) fn encode_decisions(
    replica: &str,
    mut proxies: Vec<ProxyDecisions>,
    cap: usize,
) -> Result<Vec<u8>, StoreError> {
    let mut answer = Answer {
        replica: replica.to_string(),
        ..Answer::default()
    };
    let bare = |p: &ProxyDecisions| {
        json_len(&ProxyDecisions {
            node: p.node.clone(),
            capacity: p.capacity,
            complete: p.complete,
            cut: u32::MAX,
            ..ProxyDecisions::default()
        }) + 1
    };
    let mut used = envelope_len(replica) + proxies.iter().map(bare).sum::<usize>();
    while used > cap {
        let Some(p) = proxies.pop() else { break };
        used -= bare(&p);
        answer.proxies_cut += 1;
        answer.records_cut += p.lines.len() as u64;
    }
    let mut budget = cap.saturating_sub(used);
    let mut queues: Vec<std::vec::IntoIter<String>> = Vec::with_capacity(proxies.len());
    for p in &mut proxies {
        queues.push(std::mem::take(&mut p.lines).into_iter());
    }
    let mut open: Vec<bool> = vec![true; proxies.len()];
    while open.iter().any(|o| *o) {
        for (i, p) in proxies.iter_mut().enumerate() {
            if !open[i] {
                continue;
            }
            let Some(line) = queues[i].next() else {
                open[i] = false;
                continue;
            };
            let cost = json_len(&line) + 1;
            if cost <= budget {
                budget -= cost;
                p.lines.push(line);
            } else {
                // The rest of this proxy's records are older: none kept.
                open[i] = false;
                p.cut = u32::try_from(1 + queues[i].len()).unwrap_or(u32::MAX);
            }
        }
    }
    answer.records_cut += proxies.iter().map(|p| u64::from(p.cut)).sum::<u64>();
    answer.decisions = proxies;
    encode(&answer)
}

/// `load` with its first `keep` endpoints (in pool order), `truncated` if
/// any went.
fn first_endpoints(load: &pb::Load, keep: usize) -> pb::Load {
    let mut left = keep;
    let mut cut = load.clone();
    for pool in &mut cut.pools {
        let k = pool.endpoints.len().min(left);
        pool.endpoints.truncate(k);
        left -= k;
    }
    cut.truncated |= endpoints_of(&cut) < endpoints_of(load);
    cut
}

fn endpoints_of(load: &pb::Load) -> usize {
    load.pools.iter().map(|p| p.endpoints.len()).sum()
}

fn load_entry(node: &str, load: Option<&pb::Load>) -> LoadEntry {
    LoadEntry {
        node: node.to_string(),
        load: load.map(|l| base64::engine::general_purpose::STANDARD.encode(l.encode_to_vec())),
    }
}

/// `replica`'s answer to a load question, at most `cap` bytes: each proxy
/// gets an equal share of what is left (the smallest first, so what they
/// do not use goes to the larger ones); a load over its share keeps its
/// first endpoints and is marked `truncated`; one whose pools alone do not
/// fit is sent without a load.
pub(crate) fn encode_load(
    replica: &str,
    mut proxies: Vec<ProxyLoad>,
    cap: usize,
) -> Result<Vec<u8>, StoreError> {
    let mut answer = Answer {
        replica: replica.to_string(),
        ..Answer::default()
    };
    let bare = |p: &ProxyLoad| json_len(&load_entry(&p.node, None)) + 1;
    let mut used = envelope_len(replica) + proxies.iter().map(bare).sum::<usize>();
    while used > cap {
        let Some(p) = proxies.pop() else { break };
        used -= bare(&p);
        answer.proxies_cut += 1;
        answer.records_cut += p.load.as_ref().map_or(0, endpoints_of) as u64;
    }
    let mut budget = cap.saturating_sub(used);
    // The smallest loads first.
    let mut order: Vec<(usize, usize)> = proxies
        .iter()
        .enumerate()
        .map(|(i, p)| (p.load.as_ref().map_or(0, Message::encoded_len), i))
        .collect();
    order.sort_unstable();
    let mut entries: Vec<LoadEntry> = proxies.iter().map(|p| load_entry(&p.node, None)).collect();
    let count = order.len();
    for (n, (_, i)) in order.into_iter().enumerate() {
        let Some(load) = proxies[i].load.as_ref() else {
            continue;
        };
        let share = budget / (count - n);
        let node = proxies[i].node.clone();
        // What the load adds to the bare entry.
        let extra = |l: &pb::Load| {
            json_len(&load_entry(&node, Some(l))).saturating_sub(json_len(&load_entry(&node, None)))
        };
        let whole = extra(load);
        let fitted = if whole <= share {
            Some((load.clone(), whole))
        } else {
            // The most endpoints that fit (the size grows with them).
            let (mut lo, mut hi) = (0usize, endpoints_of(load));
            let mut best = None;
            while lo <= hi {
                let mid = lo + (hi - lo) / 2;
                let cut = first_endpoints(load, mid);
                let size = extra(&cut);
                if size <= share {
                    best = Some((cut, size));
                    lo = mid + 1;
                } else if mid == 0 {
                    break;
                } else {
                    hi = mid - 1;
                }
            }
            best
        };
        match fitted {
            Some((kept, size)) => {
                answer.records_cut += (endpoints_of(load) - endpoints_of(&kept)) as u64;
                budget -= size;
                entries[i] = load_entry(&node, Some(&kept));
            }
            None => {
                answer.proxies_cut += 1;
                answer.records_cut += endpoints_of(load) as u64;
            }
        }
    }
    answer.load = entries;
    encode(&answer)
}

/// A replica's answer, read back into the hub's types (`None`: it does
/// not decode).
fn decode(bytes: &[u8]) -> Option<Answer> {
    serde_json::from_slice(bytes).ok()
}

fn decode_load(entry: LoadEntry, replica: &str) -> ProxyLoad {
    let load = entry.load.and_then(|b64| {
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        pb::Load::decode(bytes.as_slice()).ok()
    });
    ProxyLoad {
        node: entry.node,
        load,
        replica: replica.to_string(),
    }
}

/// Answers the other replicas' questions until the hub goes (a no-op with
/// one control plane): [`ANSWERS_AT_ONCE`] at a time, the rest dropped.
pub async fn answer_loop(hub: Weak<Hub>) {
    let Some(mut questions) = hub.upgrade().and_then(|h| h.store.questions()) else {
        return;
    };
    let mut answering: JoinSet<()> = JoinSet::new();
    loop {
        tokio::select! {
            q = questions.recv() => {
                let Some(query) = q else { return };
                let Some(h) = hub.upgrade() else { return };
                if answering.len() >= ANSWERS_AT_ONCE {
                    tracing::warn!(asker = %query.asker, "a replica's question left unanswered: {ANSWERS_AT_ONCE} being answered");
                    continue;
                }
                answering.spawn(async move { h.answer_query(query).await });
            }
            Some(_) = answering.join_next(), if !answering.is_empty() => {}
        }
    }
}

impl Hub {
    /// Answers another replica's question with this replica's proxies.
    async fn answer_query(&self, query: Query) {
        let wait = query.wait();
        let replica = self.replica().to_string();
        let answer = match query.question {
            Question::Decisions {
                max_records,
                max_bytes,
            } => {
                let got = self.fetch_decisions(max_records, max_bytes, wait).await;
                encode_decisions(&replica, got, ANSWER_MAX_BYTES)
            }
            Question::Load => {
                let got = self.fetch_load(wait).await;
                encode_load(&replica, got, ANSWER_MAX_BYTES)
            }
        };
        let sent = match answer {
            Ok(bytes) => self.store.answer(&query, bytes).await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            // Late (the asker gave up and revoked the query's lease), or
            // the store is unreachable: the asker names this replica.
            tracing::debug!(asker = %query.asker, error = %e, "a replica's question not answered");
        }
    }

    /// Asks the other replicas (`None`: a single control plane, or too
    /// many questions in flight, which `unasked` tells).
    async fn ask_replicas(&self, question: Question, wait: Duration) -> (Option<Asked>, bool) {
        let Ok(_slot) = self.asking.try_acquire() else {
            tracing::warn!("other replicas not asked: {ASKS_AT_ONCE} questions in flight");
            return (None, true);
        };
        match self.store.ask_replicas(&question, wait).await {
            Ok(asked) => (asked, false),
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask the other replicas; showing this replica's proxies");
                (None, true)
            }
        }
    }

    /// The proxies the silent replicas' presence records list as connected
    /// (none if the store does not say within [`SILENT_LOOKUP`]).
    async fn proxies_of(&self, replicas: &[String]) -> Vec<(String, String)> {
        if replicas.is_empty() {
            return Vec::new();
        }
        match tokio::time::timeout(SILENT_LOOKUP, self.store.fleet_proxies()).await {
            Ok(Ok(Some(records))) => records
                .into_iter()
                .filter(|(_, r)| r.connected && replicas.contains(&r.control_plane))
                .map(|(node, r)| (node, r.control_plane))
                .collect(),
            Ok(Ok(None) | Err(_)) | Err(_) => Vec::new(),
        }
    }

    /// [`Hub::fetch_decisions`] across the fleet: this replica's proxies
    /// and the other replicas', each proxy once, within `wait`.
    pub async fn fleet_decisions(
        &self,
        max_records: u32,
        max_bytes: u32,
        wait: Duration,
    ) -> Fleet<ProxyDecisions> {
        let question = Question::Decisions {
            max_records,
            max_bytes,
        };
        let (local, asked) = tokio::join!(
            self.fetch_decisions(max_records, max_bytes, wait),
            self.ask_replicas(question, wait)
        );
        self.merge(local, asked, |answer, replica| {
            let mut decisions = answer.decisions;
            for p in &mut decisions {
                replica.clone_into(&mut p.replica);
            }
            decisions
        })
        .await
    }

    /// [`Hub::fetch_load`] across the fleet: this replica's proxies and
    /// the other replicas', each proxy once, within `wait`.
    pub async fn fleet_load(&self, wait: Duration) -> Fleet<ProxyLoad> {
        let (local, asked) = tokio::join!(
            self.fetch_load(wait),
            self.ask_replicas(Question::Load, wait)
        );
        self.merge(local, asked, |answer, replica| {
            answer
                .load
                .into_iter()
                .map(|entry| decode_load(entry, replica))
                .collect()
        })
        .await
    }

    /// This replica's entries and the other replicas' answers as one
    /// fleet: each proxy once (the entry that says more when two replicas
    /// list it), the replicas that did not answer named and their proxies
    /// listed as not answering.
    async fn merge<T: FleetEntry>(
        &self,
        local: Vec<T>,
        (asked, unasked): (Option<Asked>, bool),
        entries: impl Fn(Answer, &str) -> Vec<T>,
    ) -> Fleet<T> {
        let mut by_node: BTreeMap<String, T> = local
            .into_iter()
            .map(|p| (p.node().to_string(), p))
            .collect();
        let mut fleet = Fleet {
            proxies: Vec::new(),
            silent: Vec::new(),
            unasked,
            proxies_cut: 0,
        };
        let Some(asked) = asked else {
            fleet.proxies = by_node.into_values().collect();
            return fleet;
        };
        let mut silent = asked.silent();
        for (replica, bytes) in &asked.answers {
            let Some(answer) = decode(bytes) else {
                tracing::warn!(%replica, "a replica's answer does not decode");
                silent.push(replica.clone());
                continue;
            };
            fleet.proxies_cut += answer.proxies_cut;
            for p in entries(answer, replica) {
                if by_node.get(p.node()).is_none_or(|have| p.better_than(have)) {
                    by_node.insert(p.node().to_string(), p);
                }
            }
        }
        for (node, replica) in self.proxies_of(&silent).await {
            by_node
                .entry(node.clone())
                .or_insert_with(|| T::not_answered(node, replica));
        }
        silent.sort();
        fleet.silent = silent;
        fleet.proxies = by_node.into_values().collect();
        fleet
    }
}

/// One proxy's entry in a [`Fleet`].
trait FleetEntry {
    /// Its node id.
    fn node(&self) -> &str;
    /// A proxy of a replica that did not answer.
    fn not_answered(node: String, replica: String) -> Self;
    /// Whether it says more than `have`, the entry of the same proxy
    /// another replica sent.
    fn better_than(&self, have: &Self) -> bool;
}

impl FleetEntry for ProxyDecisions {
    fn node(&self) -> &str {
        &self.node
    }

    fn not_answered(node: String, replica: String) -> Self {
        ProxyDecisions {
            node,
            replica,
            ..ProxyDecisions::default()
        }
    }

    fn better_than(&self, have: &Self) -> bool {
        (self.complete, self.lines.len()) > (have.complete, have.lines.len())
    }
}

impl FleetEntry for ProxyLoad {
    fn node(&self) -> &str {
        &self.node
    }

    fn not_answered(node: String, replica: String) -> Self {
        ProxyLoad {
            node,
            load: None,
            replica,
        }
    }

    fn better_than(&self, have: &Self) -> bool {
        have.load.is_none() && self.load.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decisions(node: &str, lines: usize, line_bytes: usize) -> ProxyDecisions {
        ProxyDecisions {
            node: node.into(),
            lines: (0..lines)
                .map(|i| format!("{i:06}{}", "x".repeat(line_bytes.saturating_sub(6))))
                .collect(),
            capacity: 256,
            complete: true,
            ..ProxyDecisions::default()
        }
    }

    #[test]
    fn a_decisions_answer_is_cut_to_the_cap_keeping_each_proxys_newest_and_says_so() {
        // Small enough: everything, nothing said cut.
        let small = vec![decisions("edge-a", 3, 100), decisions("edge-b", 2, 100)];
        let bytes = encode_decisions("cp-b", small.clone(), ANSWER_MAX_BYTES).unwrap();
        let a = decode(&bytes).unwrap();
        assert_eq!(a.replica, "cp-b");
        assert_eq!((a.records_cut, a.proxies_cut), (0, 0));
        assert_eq!(a.decisions, small);

        // Two proxies of 256 records of 2 KiB each (1 MiB): cut to 512 KiB,
        // each keeping about half, newest first, with the count cut.
        let big = vec![
            decisions("edge-a", 256, 2048),
            decisions("edge-b", 256, 2048),
        ];
        let bytes = encode_decisions("cp-b", big.clone(), ANSWER_MAX_BYTES).unwrap();
        assert!(bytes.len() <= ANSWER_MAX_BYTES, "{}", bytes.len());
        assert!(
            bytes.len() > ANSWER_MAX_BYTES - 8 * 1024,
            "uses the room: {}",
            bytes.len()
        );
        let a = decode(&bytes).unwrap();
        let kept: Vec<usize> = a.decisions.iter().map(|p| p.lines.len()).collect();
        assert!(kept.iter().all(|k| (120..=128).contains(k)), "{kept:?}");
        for (p, whole) in a.decisions.iter().zip(&big) {
            assert_eq!(
                p.lines[..],
                whole.lines[..p.lines.len()],
                "the newest, in order"
            );
            assert_eq!(p.cut as usize, 256 - p.lines.len());
        }
        assert_eq!(a.records_cut as usize, 512 - kept.iter().sum::<usize>());
        assert_eq!(a.proxies_cut, 0);

        // A smaller cap with many proxies: some left out whole, counted.
        let many: Vec<ProxyDecisions> = (0..100)
            .map(|i| decisions(&format!("edge-{i:03}"), 1, 10))
            .collect();
        let bytes = encode_decisions("cp-b", many, 4096).unwrap();
        assert!(bytes.len() <= 4096);
        let a = decode(&bytes).unwrap();
        assert!(a.proxies_cut > 0 && a.decisions.len() + a.proxies_cut as usize == 100);
        assert!(a.records_cut >= a.proxies_cut);
    }

    fn endpoint(i: usize) -> pb::EndpointLoad {
        pb::EndpointLoad {
            addr: format!("http://10.0.{}.{}:8000", i / 250, i % 250),
            in_flight: 3,
            circuit: "closed".into(),
            health: "healthy".into(),
            ..pb::EndpointLoad::default()
        }
    }

    fn load(node: &str, endpoints: usize) -> ProxyLoad {
        ProxyLoad {
            node: node.into(),
            load: Some(pb::Load {
                id: "q".into(),
                pools: vec![
                    pb::PoolLoad {
                        name: "gpu".into(),
                        queue_depth: 2,
                        endpoints: (0..endpoints).map(endpoint).collect(),
                    },
                    pb::PoolLoad {
                        name: "cpu".into(),
                        queue_depth: 0,
                        endpoints: vec![endpoint(9999)],
                    },
                ],
                truncated: false,
            }),
            replica: String::new(),
        }
    }

    #[test]
    fn a_load_answer_is_cut_to_the_cap_by_endpoints_and_marked_truncated() {
        let small = vec![
            load("edge-a", 3),
            ProxyLoad {
                node: "edge-b".into(),
                ..ProxyLoad::default()
            },
        ];
        let a = decode(&encode_load("cp-b", small.clone(), ANSWER_MAX_BYTES).unwrap()).unwrap();
        let back: Vec<ProxyLoad> = a.load.into_iter().map(|e| decode_load(e, "")).collect();
        assert_eq!(
            back, small,
            "every field back, the silent one without a load"
        );
        assert_eq!((a.records_cut, a.proxies_cut), (0, 0));

        // A small load and a large one under a 16 KiB cap: the small whole,
        // the large one's first endpoints, truncated, under the cap.
        let cap = 16 * 1024;
        let bytes = encode_load(
            "cp-b",
            vec![load("edge-big", 2000), load("edge-small", 2)],
            cap,
        )
        .unwrap();
        assert!(bytes.len() <= cap, "{}", bytes.len());
        let a = decode(&bytes).unwrap();
        let back: Vec<ProxyLoad> = a.load.into_iter().map(|e| decode_load(e, "")).collect();
        let big = back[0].load.as_ref().unwrap();
        assert!(big.truncated);
        let kept = endpoints_of(big);
        assert!(kept > 50 && kept < 2001, "{kept}");
        assert_eq!(
            big.pools[0].endpoints[..],
            load("edge-big", kept).load.unwrap().pools[0].endpoints[..]
        );
        assert_eq!(a.records_cut as usize, 2001 - kept);
        let small = back[1].load.as_ref().unwrap();
        assert!(!small.truncated && endpoints_of(small) == 3);
    }
}
