//! The etcd store: state shared by several control-plane replicas.
//!
//! Keys, under a prefix (default `/router/`):
//!
//! | key | value |
//! |---|---|
//! | `state` | the [`State`] as JSON; its etcd `mod_revision` is the revision |
//! | `policies/<version, 20 digits>` | a [`PolicyRecord`] as JSON |
//! | `store_id` | the store's identity (created by the first replica; see [`Store::identity`]) |
//! | `singleton` | the node id of the replica holding the singleton lease |
//! | `proxies/<replica>/<proxy>` | a replica's record of a proxy, on that replica's presence lease |
//!
//! **Writes** are one etcd transaction: *if `mod_revision(state)` is still
//! the revision the writer read, put the state (and the new policy
//! version); else read the state*. Of two replicas applying at once, one
//! wins and the other gets [`StoreError::Conflict`] with the winner's
//! revision. The revision is etcd's own, so every replica (and every proxy,
//! whichever replica it talks to) names the same state with the same number.
//!
//! **Following** ([`Store::follow`]) is list-then-watch, as a Kubernetes
//! informer does: read every key under the prefix at some etcd revision R,
//! then watch the prefix from R+1. A broken watch (etcd restarted, a
//! network cut) is resumed from the revision after the last event seen,
//! with backoff; a watch whose start revision was compacted away is
//! cancelled by etcd with `compact_revision` set, and the follower lists
//! again ([`StoreChange::Relisted`]), so no change is ever skipped.
//!
//! **The singleton lease**: work that must run once across replicas
//! (expiring circuit overrides, pruning history) runs on the replica whose
//! lease owns the `singleton` key. The key is created only if absent and is
//! attached to a lease of [`SINGLETON_TTL`]; a replica that stops renewing
//! loses it within that time and another takes over.
//!
//! **The fleet's proxies**: each replica publishes the records of the
//! proxies it serves (changed ones, once a second) under its own key per
//! proxy, attached to its own presence lease, so `proxies list` through any
//! replica shows the whole fleet and a dead replica's records vanish within
//! [`PRESENCE_TTL`]. No two replicas write the same key, so no write races.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::{mpsc, Mutex};

use std::collections::BTreeMap;

use super::{
    backend, Contents, PolicyRecord, ProxyRecord, State, Store, StoreChange, StoreError,
    StoreEvent, StoreFuture,
};

/// Longest wait for one etcd call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the singleton lease outlives its holder's last renewal.
pub const SINGLETON_TTL: Duration = Duration::from_secs(10);
/// How long a replica's proxy records outlive its last renewal.
pub const PRESENCE_TTL: Duration = Duration::from_secs(15);
/// etcd refuses transactions of more than 128 operations by default.
const TXN_OPS: usize = 100;
/// Resume and relist backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Where the etcd store lives, as `--store etcd://host:2379,host:2379/prefix` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAddress {
    /// `http://host:port` for each member.
    pub endpoints: Vec<String>,
    /// Key prefix, ending with `/`.
    pub prefix: String,
}

impl EtcdAddress {
    /// Parses `etcd://host:port[,host:port...][/prefix]`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url.strip_prefix("etcd://").ok_or_else(|| {
            format!("{url:?}: an etcd store is etcd://host:port[,host:port...][/prefix]")
        })?;
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/router"),
        };
        let mut endpoints = Vec::new();
        for host in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            let Some((name, port)) = host.rsplit_once(':') else {
                return Err(format!("{host:?}: expected host:port"));
            };
            if name.is_empty() || port.parse::<u16>().is_err() {
                return Err(format!("{host:?}: expected host:port"));
            }
            endpoints.push(format!("http://{host}"));
        }
        if endpoints.is_empty() {
            return Err(format!("{url:?}: no etcd member given"));
        }
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() {
            return Err(format!("{url:?}: the key prefix must not be empty"));
        }
        Ok(Self {
            endpoints,
            prefix: format!("{prefix}/"),
        })
    }
}

/// The store's keys.
#[derive(Debug, Clone)]
struct Keys {
    prefix: String,
}

impl Keys {
    fn state(&self) -> String {
        format!("{}state", self.prefix)
    }
    fn policies(&self) -> String {
        format!("{}policies/", self.prefix)
    }
    fn policy(&self, version: u64) -> String {
        format!("{}policies/{version:020}", self.prefix)
    }
    fn store_id(&self) -> String {
        format!("{}store_id", self.prefix)
    }
    fn singleton(&self) -> String {
        format!("{}singleton", self.prefix)
    }
    fn proxies(&self) -> String {
        format!("{}proxies/", self.prefix)
    }
    fn proxy(&self, replica: &str, node: &str) -> String {
        format!("{}proxies/{replica}/{node}", self.prefix)
    }
}

/// A proxy record as published: the node id travels in the value, so
/// any node id works in a key.
#[derive(serde::Serialize, serde::Deserialize)]
struct PublishedProxy {
    node: String,
    #[serde(flatten)]
    record: ProxyRecord,
}

/// A held lease and its renewal stream.
struct Lease {
    id: i64,
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
}

impl Lease {
    /// Renews; false when the lease is gone (expired, or etcd unreachable).
    async fn renew(&mut self) -> bool {
        let renewed = async {
            self.keeper.keep_alive().await.ok()?;
            let answer = self.answers.message().await.ok()??;
            Some(answer.ttl() > 0)
        };
        matches!(
            tokio::time::timeout(CALL_TIMEOUT, renewed).await,
            Ok(Some(true))
        )
    }
}

/// The etcd store (see the module docs).
pub struct EtcdStore {
    client: Client,
    keys: Keys,
    node: String,
    lease: Mutex<Option<Lease>>,
    presence: Mutex<Option<Lease>>,
}

async fn call<T, F>(f: F) -> Result<T, StoreError>
where
    F: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(backend),
        Err(_) => Err(StoreError::Timeout(CALL_TIMEOUT)),
    }
}

fn to_u64(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

fn to_i64(revision: u64) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

impl EtcdStore {
    /// Connects (lazily: an unreachable etcd fails the first call, not this).
    /// `node` names this replica in the singleton key.
    pub async fn connect(address: &EtcdAddress, node: &str) -> Result<Self, StoreError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            // A silently dead member breaks the watch within seconds.
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_keep_alive_while_idle(true);
        let client = call(Client::connect(&address.endpoints, Some(options))).await?;
        Ok(Self {
            client,
            keys: Keys {
                prefix: address.prefix.clone(),
            },
            node: node.to_string(),
            lease: Mutex::new(None),
            presence: Mutex::new(None),
        })
    }

    /// Renews the lease in `slot`, or grants a new one of `ttl`; true when
    /// the lease is new (everything attached to the old one is gone).
    async fn keep_lease(
        &self,
        slot: &mut Option<Lease>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        if let Some(lease) = slot.as_mut() {
            if lease.renew().await {
                return Ok(false);
            }
        }
        *slot = None;
        let mut client = self.client.clone();
        let granted =
            call(client.lease_grant(i64::try_from(ttl.as_secs()).unwrap_or(10), None)).await?;
        let (keeper, answers) = call(client.lease_keep_alive(granted.id())).await?;
        *slot = Some(Lease {
            id: granted.id(),
            keeper,
            answers,
        });
        Ok(true)
    }

    /// Waits until etcd answers (a control plane may start before its
    /// etcd does); gives up after `within` with the last error.
    pub async fn wait_ready(&self, within: Duration) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + within;
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.etcd_revision().await {
                Ok(_) => return Ok(()),
                Err(e) if tokio::time::Instant::now() + backoff >= deadline => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "etcd is not answering yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Follows changes from etcd revision `from` on (a fresh listing first
    /// if that revision has been compacted). [`Store::follow`] starts with
    /// a listing instead; this is for resuming, and for tests.
    pub fn follow_from(&self, from: i64) -> mpsc::Receiver<StoreChange> {
        self.spawn_follower(Some(from))
    }

    /// Starts a follower (see [`follow`]); it ends when the receiver goes.
    fn spawn_follower(&self, from: Option<i64>) -> mpsc::Receiver<StoreChange> {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(follow(self.client.clone(), self.keys.clone(), from, tx));
        rx
    }

    /// The current etcd revision (of the whole key space).
    pub async fn etcd_revision(&self) -> Result<i64, StoreError> {
        let mut client = self.client.clone();
        let resp =
            call(client.get(self.keys.state(), Some(GetOptions::new().with_count_only()))).await?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }
}

/// Reads everything under the prefix; returns it with the etcd revision it was read at.
async fn list(client: &Client, keys: &Keys) -> Result<(Contents, i64), StoreError> {
    let mut client = client.clone();
    let resp = call(client.get(keys.prefix.clone(), Some(GetOptions::new().with_prefix()))).await?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut contents = Contents::default();
    for kv in resp.kvs() {
        match decode(keys, kv) {
            Some(StoreEvent::State(s)) => contents.state = s,
            Some(StoreEvent::Policy(p)) => contents.history.push(p),
            Some(StoreEvent::PolicyRemoved(_)) | None => {}
        }
    }
    contents.history.sort_by_key(|p| p.version);
    Ok((contents, revision))
}

/// What a stored key means; `None` for keys that are not state or policy,
/// and for values that do not decode (logged, then skipped: a stray write
/// must not stop the control plane).
fn decode(keys: &Keys, kv: &KeyValue) -> Option<StoreEvent> {
    let key = kv.key_str().ok()?;
    if key == keys.state() {
        match serde_json::from_slice::<State>(kv.value()) {
            Ok(mut state) => {
                state.revision = to_u64(kv.mod_revision());
                Some(StoreEvent::State(state))
            }
            Err(e) => {
                tracing::error!(key, error = %e, "undecodable state in etcd; ignored");
                None
            }
        }
    } else if key.starts_with(&keys.policies()) {
        match serde_json::from_slice::<PolicyRecord>(kv.value()) {
            Ok(p) => Some(StoreEvent::Policy(p)),
            Err(e) => {
                tracing::error!(key, error = %e, "undecodable policy in etcd; ignored");
                None
            }
        }
    } else {
        None
    }
}

/// How a watch ended.
enum WatchEnd {
    /// The start revision is gone: list again.
    Compacted,
    /// The stream broke; resume from `next`. `progressed` if anything arrived.
    Broken {
        next: i64,
        progressed: bool,
        error: String,
    },
    /// Nobody is listening any more.
    Closed,
}

/// The follower: list (when `from` is `None`), watch, and on the way out
/// either resume from where it stopped or list again.
async fn follow(client: Client, keys: Keys, mut from: Option<i64>, tx: mpsc::Sender<StoreChange>) {
    let mut backoff = BACKOFF_MIN;
    loop {
        if tx.is_closed() {
            return;
        }
        let start = match from {
            Some(r) => r,
            None => match list(&client, &keys).await {
                Ok((contents, revision)) => {
                    if tx.send(StoreChange::Relisted(contents)).await.is_err() {
                        return;
                    }
                    revision + 1
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "etcd listing failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            },
        };
        match watch(&client, &keys, start, &tx).await {
            WatchEnd::Compacted => {
                tracing::info!(from = start, "etcd compacted past the watch; listing again");
                from = None;
            }
            WatchEnd::Broken {
                next,
                progressed,
                error,
            } => {
                if progressed {
                    backoff = BACKOFF_MIN;
                }
                tracing::warn!(error, resume_at = next, retry_in = ?backoff, "etcd watch broke; resuming");
                from = Some(next);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            WatchEnd::Closed => return,
        }
    }
}

async fn watch(
    client: &Client,
    keys: &Keys,
    start: i64,
    tx: &mpsc::Sender<StoreChange>,
) -> WatchEnd {
    let options = WatchOptions::new().with_prefix().with_start_revision(start);
    let mut client = client.clone();
    let mut stream = match call(client.watch(keys.prefix.clone(), Some(options))).await {
        Ok(s) => s,
        Err(e) => {
            return WatchEnd::Broken {
                next: start,
                progressed: false,
                error: e.to_string(),
            }
        }
    };
    let mut next = start;
    let mut progressed = false;
    loop {
        let resp = tokio::select! {
            r = stream.message() => r,
            () = tx.closed() => return WatchEnd::Closed,
        };
        let resp = match resp {
            Ok(Some(r)) => r,
            Ok(None) => {
                return WatchEnd::Broken {
                    next,
                    progressed,
                    error: "watch stream ended".into(),
                }
            }
            Err(e) => {
                return WatchEnd::Broken {
                    next,
                    progressed,
                    error: e.to_string(),
                }
            }
        };
        if resp.compact_revision() > 0 {
            return WatchEnd::Compacted;
        }
        if resp.canceled() {
            return WatchEnd::Broken {
                next,
                progressed,
                error: format!("watch cancelled: {}", resp.cancel_reason()),
            };
        }
        progressed = true;
        let mut events = Vec::new();
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            next = next.max(kv.mod_revision() + 1);
            match event.event_type() {
                EventType::Put => events.extend(decode(keys, kv)),
                EventType::Delete => {
                    let version = kv
                        .key_str()
                        .ok()
                        .and_then(|k| k.strip_prefix(&keys.policies()))
                        .and_then(|v| v.parse::<u64>().ok());
                    events.extend(version.map(StoreEvent::PolicyRemoved));
                }
            }
        }
        if !events.is_empty() && tx.send(StoreChange::Changed(events)).await.is_err() {
            return WatchEnd::Closed;
        }
    }
}

impl Store for EtcdStore {
    fn identity(&self) -> StoreFuture<'_, String> {
        Box::pin(async move {
            // Created only if absent: of replicas starting together, the
            // first one's id stands, and every one reads it back.
            let key = self.keys.store_id();
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    uuid::Uuid::now_v7().to_string(),
                    None,
                )])
                .or_else([TxnOp::get(key.clone(), None)]);
            let mut client = self.client.clone();
            call(client.txn(txn)).await?;
            let resp = call(client.get(key, None)).await?;
            resp.kvs()
                .first()
                .and_then(|kv| kv.value_str().ok())
                .map(str::to_string)
                .ok_or_else(|| backend("the store id key vanished"))
        })
    }

    fn load(&self) -> StoreFuture<'_, Contents> {
        Box::pin(async move { list(&self.client, &self.keys).await.map(|(c, _)| c) })
    }

    fn commit<'a>(
        &'a self,
        expected_revision: u64,
        state: &'a State,
        policy: Option<&'a PolicyRecord>,
    ) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let key = self.keys.state();
            let mut puts = vec![TxnOp::put(
                key.clone(),
                serde_json::to_vec(state).map_err(backend)?,
                None,
            )];
            if let Some(p) = policy {
                puts.push(TxnOp::put(
                    self.keys.policy(p.version),
                    serde_json::to_vec(p).map_err(backend)?,
                    None,
                ));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    to_i64(expected_revision),
                )])
                .and_then(puts)
                .or_else([TxnOp::get(key, None)]);
            let mut client = self.client.clone();
            let resp = call(client.txn(txn)).await?;
            if resp.succeeded() {
                return Ok(resp.header().map_or(0, |h| to_u64(h.revision())));
            }
            let actual = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(g) => {
                        Some(g.kvs().first().map_or(0, KeyValue::mod_revision))
                    }
                    _ => None,
                })
                .unwrap_or(0);
            Err(StoreError::Conflict {
                expected: expected_revision,
                actual: to_u64(actual),
            })
        })
    }

    fn remove_policies<'a>(&'a self, versions: &'a [u64]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if versions.is_empty() {
                return Ok(());
            }
            let deletes: Vec<TxnOp> = versions
                .iter()
                .map(|v| TxnOp::delete(self.keys.policy(*v), None))
                .collect();
            let mut client = self.client.clone();
            call(client.txn(Txn::new().and_then(deletes))).await?;
            Ok(())
        })
    }

    fn follow(&self) -> Option<mpsc::Receiver<StoreChange>> {
        Some(self.spawn_follower(None))
    }

    fn hold_singleton(&self) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let mut held = self.lease.lock().await;
            self.keep_lease(&mut held, SINGLETON_TTL).await?;
            let Some(lease) = held.as_ref() else {
                return Ok(false);
            };
            let key = self.keys.singleton();
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    self.node.clone(),
                    Some(PutOptions::new().with_lease(lease.id)),
                )])
                .or_else([TxnOp::get(key, None)]);
            let mut client = self.client.clone();
            let resp = call(client.txn(txn)).await?;
            if resp.succeeded() {
                tracing::info!(node = %self.node, "this replica now holds the singleton lease");
                return Ok(true);
            }
            Ok(resp.op_responses().into_iter().any(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().first().is_some_and(|kv| kv.lease() == lease.id),
                _ => false,
            }))
        })
    }

    fn replica(&self) -> &str {
        &self.node
    }

    fn publish_proxies<'a>(
        &'a self,
        all: &'a BTreeMap<String, ProxyRecord>,
        changed: &'a [String],
        removed: &'a [String],
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut presence = self.presence.lock().await;
            let fresh = self.keep_lease(&mut presence, PRESENCE_TTL).await?;
            let Some(lease) = presence.as_ref().map(|l| l.id) else {
                return Ok(());
            };
            // A new lease has nothing attached yet: publish everything.
            let nodes: Vec<&String> = if fresh {
                all.keys().collect()
            } else {
                changed.iter().filter(|n| all.contains_key(*n)).collect()
            };
            for chunk in nodes.chunks(TXN_OPS) {
                let mut puts = Vec::with_capacity(chunk.len());
                for node in chunk {
                    let Some(record) = all.get(*node) else {
                        continue;
                    };
                    let value = serde_json::to_vec(&PublishedProxy {
                        node: (*node).clone(),
                        record: record.clone(),
                    })
                    .map_err(backend)?;
                    puts.push(TxnOp::put(
                        self.keys.proxy(&self.node, node),
                        value,
                        Some(PutOptions::new().with_lease(lease)),
                    ));
                }
                let mut client = self.client.clone();
                call(client.txn(Txn::new().and_then(puts))).await?;
            }
            // Records dropped after the TTL (a fresh lease never had them).
            let gone: Vec<&String> = removed.iter().filter(|n| !all.contains_key(*n)).collect();
            for chunk in gone.chunks(TXN_OPS) {
                let deletes: Vec<TxnOp> = chunk
                    .iter()
                    .map(|node| TxnOp::delete(self.keys.proxy(&self.node, node), None))
                    .collect();
                let mut client = self.client.clone();
                call(client.txn(Txn::new().and_then(deletes))).await?;
            }
            Ok(())
        })
    }

    fn fleet_proxies(&self) -> StoreFuture<'_, Option<Vec<(String, ProxyRecord)>>> {
        Box::pin(async move {
            let mut client = self.client.clone();
            let resp = call(client.get(self.keys.proxies(), Some(GetOptions::new().with_prefix())))
                .await?;
            Ok(Some(
                resp.kvs()
                    .iter()
                    .filter_map(|kv| serde_json::from_slice::<PublishedProxy>(kv.value()).ok())
                    .map(|p| (p.node, p.record))
                    .collect(),
            ))
        })
    }

    fn release_leases(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            for slot in [&self.lease, &self.presence] {
                let Some(lease) = slot.lock().await.take() else {
                    continue;
                };
                let mut client = self.client.clone();
                call(client.lease_revoke(lease.id)).await?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_parse_with_every_member_and_a_prefix() {
        let a = EtcdAddress::parse("etcd://10.0.0.1:2379,etcd-1.etcd:2379/prod/router/").unwrap();
        assert_eq!(
            a.endpoints,
            vec!["http://10.0.0.1:2379", "http://etcd-1.etcd:2379"]
        );
        assert_eq!(a.prefix, "/prod/router/");
        assert_eq!(EtcdAddress::parse("etcd://h:1").unwrap().prefix, "/router/");
        for bad in [
            "http://h:1",
            "etcd://",
            "etcd://h",
            "etcd://h:x",
            "etcd://:1",
            "etcd://h:1/",
        ] {
            assert!(EtcdAddress::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
