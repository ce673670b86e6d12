//! The proxies' load, fetched over their config streams when the
//! console's Pools page asks: [`Hub::fetch_load`] puts a `LoadRequest` on
//! every stream open on this replica (the channel `decisions.rs` keeps
//! per stream) and gathers the `Load` answers ([`Hub::load_received`])
//! until each proxy asked has answered or the wait is over. Each proxy
//! answers with one message (its pools' queue depths and its endpoints'
//! load and state, under `router_proto::MAX_PROXY_MESSAGE_BYTES`).
//!
//! A proxy that does not answer in time (busy, or from before load
//! reports: it NACKs the request) is listed without a load; the page does
//! not wait past the wait for it. Bounded: answers wait in one channel per
//! fetch with room for one answer per open stream (a proxy's second
//! answer is dropped once it is full, and only the first counts); a
//! stream whose request channel is full is not asked, and listed as not
//! answering.
//!
//! This asks the proxies connected to this replica; [`Hub::fleet_load`]
//! (`fleet.rs`, what the Pools page calls) asks the other replicas for
//! theirs through the store at the same time, and each of them answers
//! with this same fetch.

use super::*;

use tokio::sync::mpsc;

use super::decisions::StreamQuery;

/// One proxy's answer to a load fetch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyLoad {
    /// Its node id.
    pub node: String,
    /// What it sent; `None`: it did not answer in time.
    pub load: Option<pb::Load>,
    /// The replica it is connected to, when that is another one (empty:
    /// this one).
    pub replica: String,
}

impl Hub {
    /// A proxy's answer, from the stream of `node`; one no fetch waits for
    /// (late, or never asked) is dropped.
    pub fn load_received(&self, node: &str, load: pb::Load) {
        let to = self.queries().loads.get(&load.id).cloned();
        if let Some(to) = to {
            if to.try_send((node.to_string(), load)).is_err() {
                tracing::debug!(node, "a load answer dropped: the fetch has enough queued");
            }
        }
    }

    /// Asks every stream open on this replica for its load and gathers
    /// the answers for at most `wait`: one entry per open stream, by node
    /// (`load: None` for those that did not answer in time, or whose
    /// stream was too far behind to be asked).
    pub async fn fetch_load(&self, wait: Duration) -> Vec<ProxyLoad> {
        let id = uuid::Uuid::now_v7().to_string();
        let streams: Vec<(String, mpsc::Sender<StreamQuery>)> =
            self.queries().streams.values().cloned().collect();
        let (tx, mut rx) = mpsc::channel(streams.len().max(1));
        self.queries().loads.insert(id.clone(), tx);
        let mut answers: BTreeMap<String, ProxyLoad> = BTreeMap::new();
        let mut waiting = 0usize;
        for (node, to) in &streams {
            // A stream too far behind to take the request is listed all
            // the same, as a proxy that did not answer.
            if to
                .try_send(StreamQuery::Load(pb::LoadRequest { id: id.clone() }))
                .is_ok()
            {
                waiting += 1;
            }
            answers.insert(
                node.clone(),
                ProxyLoad {
                    node: node.clone(),
                    ..ProxyLoad::default()
                },
            );
        }
        let deadline = Instant::now() + wait;
        while waiting > 0 {
            let (node, load) = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(a)) => a,
                Ok(None) | Err(_) => break,
            };
            if let Some(a) = answers.get_mut(&node) {
                if a.load.is_none() {
                    a.load = Some(load);
                    waiting -= 1;
                }
            }
        }
        self.queries().loads.remove(&id);
        answers.into_values().collect()
    }
}

/// Each endpoint's quota across the proxies that answered
/// (`routerctl backends list`): the fewest requests and tokens left any
/// of them reports, with its name, the latest requests reset, and how
/// many rest the key now. Endpoints are taken as each proxy names them
/// (proxies of one policy name them alike); only those some proxy has a
/// reading for, or rests, are listed. Sorted by pool and endpoint.
pub fn endpoint_quotas(answers: &[ProxyLoad]) -> Vec<pb::EndpointQuota> {
    let mut by: BTreeMap<(&str, &str), pb::EndpointQuota> = BTreeMap::new();
    for a in answers {
        let Some(load) = &a.load else { continue };
        for p in &load.pools {
            for e in &p.endpoints {
                let reading = e.quota_requests_remaining.is_some()
                    || e.quota_tokens_remaining.is_some()
                    || !e.quota_resting.is_empty();
                if !reading {
                    continue;
                }
                let q = by
                    .entry((p.name.as_str(), e.addr.as_str()))
                    .or_insert_with(|| pb::EndpointQuota {
                        pool: p.name.clone(),
                        endpoint: e.addr.clone(),
                        ..Default::default()
                    });
                if let Some(n) = e.quota_requests_remaining {
                    if q.requests_remaining.is_none_or(|m| n < m) {
                        q.requests_remaining = Some(n);
                        q.requests_node = a.node.clone();
                    }
                }
                if let Some(n) = e.quota_tokens_remaining {
                    if q.tokens_remaining.is_none_or(|m| n < m) {
                        q.tokens_remaining = Some(n);
                        q.tokens_node = a.node.clone();
                    }
                }
                if let Some(s) = e.quota_requests_reset_s.filter(|s| s.is_finite()) {
                    if q.requests_reset_s.is_none_or(|m| s > m) {
                        q.requests_reset_s = Some(s);
                    }
                }
                if !e.quota_resting.is_empty() {
                    q.resting += 1;
                    if q.resting_why.is_empty() {
                        q.resting_why = e.quota_resting.clone();
                    }
                }
            }
        }
    }
    by.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn hub(name: &str) -> (Arc<Hub>, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("router-hub-load-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::store::RedbStore::open(&dir).unwrap();
        let hub = Hub::open(Box::new(store), Guards::default(), Limits::default())
            .await
            .unwrap();
        (hub, dir)
    }

    fn asked(q: Option<StreamQuery>) -> pb::LoadRequest {
        match q {
            Some(StreamQuery::Load(q)) => q,
            other => panic!("not a load request: {other:?}"),
        }
    }

    fn answer(id: &str, queue_depth: u32) -> pb::Load {
        pb::Load {
            id: id.into(),
            pools: vec![pb::PoolLoad {
                name: "gpu".into(),
                queue_depth,
                endpoints: vec![],
            }],
            truncated: false,
        }
    }

    #[tokio::test]
    async fn a_fetch_gathers_each_proxys_answer_and_names_the_silent_one_without_waiting_past_the_wait(
    ) {
        let (hub, dir) = hub("silent").await;
        let (_a, mut ra) = hub.decision_stream_opened("edge-a");
        let (_b, mut rb) = hub.decision_stream_opened("edge-b");
        let (c, _rc) = hub.decision_stream_opened("edge-c");
        hub.decision_stream_closed(c);
        let answering = Arc::clone(&hub);
        let proxies = tokio::spawn(async move {
            let qa = asked(ra.recv().await);
            answering.load_received("edge-a", answer(&qa.id, 3));
            // A second answer from edge-a and a stranger's are not counted.
            answering.load_received("edge-a", answer(&qa.id, 99));
            answering.load_received("edge-z", answer(&qa.id, 7));
            // edge-b is asked and never answers (a proxy from before NACKs).
            asked(rb.recv().await)
        });
        let wait = Duration::from_millis(400);
        let started = tokio::time::Instant::now();
        let got = hub.fetch_load(wait).await;
        let took = started.elapsed();
        proxies.await.unwrap();
        assert!(took >= wait, "gave up early: {took:?}");
        assert!(
            took < wait + Duration::from_millis(300),
            "held past the wait: {took:?}"
        );
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].node, "edge-a");
        assert_eq!(
            got[0].load.as_ref().map(|l| l.pools[0].queue_depth),
            Some(3)
        );
        assert_eq!(
            got[1],
            ProxyLoad {
                node: "edge-b".into(),
                ..ProxyLoad::default()
            }
        );
        assert!(hub.queries().loads.is_empty(), "the fetch cleaned up");
        // A late answer, after the fetch: dropped, nothing kept.
        hub.load_received("edge-b", answer("gone", 1));
        assert!(hub.queries().loads.is_empty());
        drop(hub);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_fetch_ends_as_soon_as_every_proxy_answered() {
        let (hub, dir) = hub("quick").await;
        let mut receivers = Vec::new();
        for node in ["edge-a", "edge-b"] {
            receivers.push((node, hub.decision_stream_opened(node).1));
        }
        let answering = Arc::clone(&hub);
        let proxies = tokio::spawn(async move {
            for (node, mut rx) in receivers {
                let q = asked(rx.recv().await);
                answering.load_received(node, answer(&q.id, 1));
            }
        });
        let started = tokio::time::Instant::now();
        let got = hub.fetch_load(Duration::from_secs(10)).await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(got.iter().all(|a| a.load.is_some()), "{got:?}");
        proxies.await.unwrap();
        // Streams that cannot be asked (their receivers are gone) are
        // listed as not answering, and nothing waits for them.
        let started = tokio::time::Instant::now();
        let got = hub.fetch_load(Duration::from_secs(10)).await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|a| a.load.is_none()), "{got:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn endpoint(
        addr: &str,
        requests: Option<u64>,
        tokens: Option<u64>,
        resting: &str,
    ) -> pb::EndpointLoad {
        pb::EndpointLoad {
            addr: addr.into(),
            circuit: "closed".into(),
            quota_requests_remaining: requests,
            quota_tokens_remaining: tokens,
            quota_requests_reset_s: requests.map(|_| 2.0),
            quota_resting: resting.into(),
            ..Default::default()
        }
    }

    fn proxy(node: &str, endpoints: Vec<pb::EndpointLoad>) -> ProxyLoad {
        ProxyLoad {
            node: node.into(),
            load: Some(pb::Load {
                id: "x".into(),
                pools: vec![pb::PoolLoad {
                    name: "openai".into(),
                    queue_depth: 0,
                    endpoints,
                }],
                truncated: false,
            }),
            ..ProxyLoad::default()
        }
    }

    /// The fewest left any proxy reports, with its name; resting counted;
    /// an endpoint without a reading, and a silent proxy, add nothing.
    #[test]
    fn quotas_take_the_fewest_left_and_count_the_proxies_resting_the_key() {
        let a = "http://127.0.0.1:1#A_KEY";
        let b = "http://127.0.0.1:1#B_KEY";
        let quotas = endpoint_quotas(&[
            proxy(
                "edge-1",
                vec![
                    endpoint(a, Some(40), Some(9000), ""),
                    endpoint(b, None, None, ""),
                ],
            ),
            proxy(
                "edge-2",
                vec![
                    endpoint(a, Some(0), Some(12000), "requests"),
                    endpoint(b, Some(300), None, ""),
                ],
            ),
            ProxyLoad {
                node: "edge-3".into(),
                ..ProxyLoad::default()
            },
        ]);
        assert_eq!(quotas.len(), 2, "{quotas:?}");
        let qa = &quotas[0];
        assert_eq!(qa.endpoint, a);
        assert_eq!(
            (qa.requests_remaining, qa.requests_node.as_str()),
            (Some(0), "edge-2")
        );
        assert_eq!(
            (qa.tokens_remaining, qa.tokens_node.as_str()),
            (Some(9000), "edge-1")
        );
        assert_eq!((qa.resting, qa.resting_why.as_str()), (1, "requests"));
        let qb = &quotas[1];
        assert_eq!(
            (qb.requests_remaining, qb.tokens_remaining, qb.resting),
            (Some(300), None, 0)
        );
    }
}
