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
//! | `replicas/<kind>/<replica>` | a replica's value of a kind ([`Store::publish_replica_value`]: the ramp's totals and windows), on the same lease |
//! | `queries/<id>` | a replica's question to the others (the console's Decisions and Pools pages), a [`Query`] as JSON, on a lease of [`QUERY_TTL`](crate::store::exchange::QUERY_TTL) |
//! | `answers/<id>/<replica>` | a replica's answer to it (JSON, at most [`ANSWER_MAX_BYTES`](crate::store::exchange::ANSWER_MAX_BYTES)), on the query's lease |
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
//!
//! **Questions between replicas** (`exchange.rs`, the algorithm in
//! [`crate::store::exchange`]): a page that asks the proxies asks the
//! other replicas too, through `queries/` and `answers/`; both live on the
//! query's short lease. The follower reads only the keys from `policies/`
//! to `state` (`Keys::followed`), so answers (up to 512 KiB each) never
//! reach it.

use std::time::Duration;

use std::path::{Path, PathBuf};

use router_etcd::pb::etcdserverpb::{
    compare::CompareResult, Compare, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest,
};
use router_etcd::pb::mvccpb::{event::EventType, KeyValue};
use router_etcd::pb::prefix_end;
use router_etcd::{Client, LeaseKeeper, Options, Tls};
use tokio::sync::{mpsc, Mutex};

use std::collections::BTreeMap;

use super::{
    backend, Asked, Contents, PolicyRecord, ProxyRecord, Query, Question, ReplicaValues, State,
    Store, StoreChange, StoreError, StoreEvent, StoreFuture,
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

mod access;
mod exchange;
mod follow;

pub use access::{EtcdAccess, EtcdAccessError, EtcdAccessFiles, EtcdAddress, EtcdAddressError};
use follow::{follow, list};

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
    fn replica_values(&self, kind: &str) -> String {
        format!("{}replicas/{kind}/", self.prefix)
    }
    fn queries(&self) -> String {
        format!("{}queries/", self.prefix)
    }
    fn query(&self, id: &str) -> String {
        format!("{}queries/{id}", self.prefix)
    }
    fn answers(&self, id: &str) -> String {
        format!("{}answers/{id}/", self.prefix)
    }
    fn answer(&self, id: &str, replica: &str) -> String {
        format!("{}answers/{id}/{replica}", self.prefix)
    }
    /// The range the follower lists and watches, `[start, end)`: from
    /// `policies/` to `state` inclusive. It holds the state and the
    /// policies (and the small `proxies/`, `queries/`, `replicas/` and `singleton`
    /// keys, which the follower skips), and leaves out `answers/`, whose
    /// values are large and meant for one replica only.
    fn followed(&self) -> (Vec<u8>, Vec<u8>) {
        (
            self.policies().into_bytes(),
            prefix_end(self.state().as_bytes()),
        )
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

/// A held lease, with its renewal stream.
struct Lease {
    keeper: LeaseKeeper,
}

impl Lease {
    fn id(&self) -> i64 {
        self.keeper.id()
    }

    /// Renews; false when the lease is gone (expired, or etcd unreachable).
    async fn renew(&mut self) -> bool {
        matches!(
            tokio::time::timeout(CALL_TIMEOUT, self.keeper.keep_alive()).await,
            Ok(Ok(ttl)) if ttl > 0
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
    /// The replica that held the singleton lease when last asked.
    holder: std::sync::Mutex<Option<String>>,
}

async fn call<T, F>(f: F) -> Result<T, StoreError>
where
    F: std::future::Future<Output = Result<T, router_etcd::Error>>,
{
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(classify),
        Err(_) => Err(StoreError::Timeout(CALL_TIMEOUT)),
    }
}

/// What etcd refused (credentials, permissions, a bad request) apart from
/// what may pass (unreachable, no leader, a broken connection); each with
/// its causes, so a TLS failure says which (unknown issuer, no certificate).
fn classify(e: router_etcd::Error) -> StoreError {
    use tonic::Code;
    if let Some(status) = e.status() {
        if matches!(
            status.code(),
            Code::InvalidArgument
                | Code::Unauthenticated
                | Code::PermissionDenied
                | Code::FailedPrecondition
        ) {
            return StoreError::Refused(status.message().to_string());
        }
    }
    // The client's error names the code, etcd's message and every cause.
    StoreError::Backend(e.to_string())
}

fn to_u64(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

fn to_i64(revision: u64) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

impl EtcdStore {
    fn set_holder(&self, holder: Option<String>) {
        *self
            .holder
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = holder;
    }

    /// Connects once. Without a user nothing is sent yet (an unreachable
    /// etcd fails the first call, not this); with one, this signs in.
    /// `node` names this replica in the singleton key.
    pub async fn connect(
        address: &EtcdAddress,
        access: &EtcdAccess,
        node: &str,
    ) -> Result<Self, StoreError> {
        let client = call(Client::connect(
            &address.endpoints,
            access.connect_options(),
        ))
        .await?;
        Ok(Self {
            client,
            keys: Keys {
                prefix: address.prefix.clone(),
            },
            node: node.to_string(),
            lease: Mutex::new(None),
            presence: Mutex::new(None),
            holder: std::sync::Mutex::new(None),
        })
    }

    /// Connects and waits until etcd answers (a control plane may start
    /// before its etcd does); gives up after `within` with the last error.
    /// What etcd refuses (a wrong password, a role without this prefix)
    /// fails at once, naming the user and prefix.
    pub async fn open(
        address: &EtcdAddress,
        access: &EtcdAccess,
        node: &str,
        within: Duration,
    ) -> Result<Self, StoreError> {
        let deadline = tokio::time::Instant::now() + within;
        let mut backoff = BACKOFF_MIN;
        loop {
            let attempt = async {
                let store = Self::connect(address, access, node).await?;
                store.etcd_revision().await?;
                Ok(store)
            };
            match attempt.await {
                Ok(store) => return Ok(store),
                Err(StoreError::Refused(why)) => {
                    let who = match &access.user {
                        Some((name, _)) => format!(
                            "user {name:?} (--etcd-user, --etcd-password-file; its role needs \
                             readwrite on the prefix)"
                        ),
                        None if access.identity.is_some() => "the user its client \
                            certificate's common name names (etcd's --client-cert-auth), or \
                            none; its role needs readwrite on the prefix"
                            .to_string(),
                        None => "no user (--etcd-user, --etcd-password-file)".to_string(),
                    };
                    return Err(StoreError::Refused(format!(
                        "etcd refused the control plane on prefix {}: {why}; it connected as {who}",
                        address.prefix
                    )));
                }
                Err(e) if tokio::time::Instant::now() + backoff >= deadline => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "etcd is not answering yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
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
        let granted = call(
            self.client
                .lease_grant(i64::try_from(ttl.as_secs()).unwrap_or(10)),
        )
        .await?;
        let (keeper, _ttl) = call(self.client.lease_keep_alive(granted.id)).await?;
        *slot = Some(Lease { keeper });
        Ok(true)
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
        let request = RangeRequest {
            count_only: true,
            ..RangeRequest::key(self.keys.state())
        };
        let resp = call(self.client.range(request)).await?;
        Ok(resp.header.map_or(0, |h| h.revision))
    }
}

impl Store for EtcdStore {
    fn identity(&self) -> StoreFuture<'_, String> {
        Box::pin(async move {
            // Created only if absent: of replicas starting together, the
            // first one's id stands, and every one reads it back.
            let key = self.keys.store_id();
            let txn = TxnRequest {
                compare: vec![Compare::create_revision(
                    key.clone(),
                    CompareResult::Equal,
                    0,
                )],
                success: vec![RequestOp::put(
                    key.clone(),
                    uuid::Uuid::now_v7().to_string(),
                    0,
                )],
                failure: vec![RequestOp::get(key.clone())],
            };
            call(self.client.txn(txn)).await?;
            let resp = call(self.client.range(RangeRequest::key(key))).await?;
            resp.kvs
                .first()
                .and_then(KeyValue::value_str)
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
            let mut puts = vec![RequestOp::put(
                key.clone(),
                serde_json::to_vec(state).map_err(backend)?,
                0,
            )];
            if let Some(p) = policy {
                puts.push(RequestOp::put(
                    self.keys.policy(p.version),
                    serde_json::to_vec(p).map_err(backend)?,
                    0,
                ));
            }
            let txn = TxnRequest {
                compare: vec![Compare::mod_revision(
                    key.clone(),
                    CompareResult::Equal,
                    to_i64(expected_revision),
                )],
                success: puts,
                failure: vec![RequestOp::get(key)],
            };
            let resp = call(self.client.txn(txn)).await?;
            if resp.succeeded {
                return Ok(resp.header.map_or(0, |h| to_u64(h.revision)));
            }
            let actual = resp
                .responses
                .iter()
                .find_map(|r| r.as_range())
                .map_or(0, |g| g.kvs.first().map_or(0, |kv| kv.mod_revision));
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
            let deletes: Vec<RequestOp> = versions
                .iter()
                .map(|v| RequestOp::delete(self.keys.policy(*v)))
                .collect();
            call(self.client.txn(TxnRequest {
                success: deletes,
                ..TxnRequest::default()
            }))
            .await?;
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
            let txn = TxnRequest {
                compare: vec![Compare::create_revision(
                    key.clone(),
                    CompareResult::Equal,
                    0,
                )],
                success: vec![RequestOp::put(key.clone(), self.node.clone(), lease.id())],
                failure: vec![RequestOp::get(key)],
            };
            let resp = call(self.client.txn(txn)).await?;
            if resp.succeeded {
                tracing::info!(node = %self.node, "this replica now holds the singleton lease");
                self.set_holder(Some(self.node.clone()));
                return Ok(true);
            }
            let kv = resp
                .responses
                .iter()
                .find_map(|r| r.as_range().and_then(|g| g.kvs.first()));
            self.set_holder(kv.map(|kv| String::from_utf8_lossy(&kv.value).into_owned()));
            Ok(kv.is_some_and(|kv| kv.lease == lease.id()))
        })
    }

    fn replica(&self) -> &str {
        &self.node
    }

    fn singleton_holder(&self) -> Option<String> {
        self.holder
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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
            let Some(lease) = presence.as_ref().map(Lease::id) else {
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
                    puts.push(RequestOp::put(
                        self.keys.proxy(&self.node, node),
                        value,
                        lease,
                    ));
                }
                call(self.client.txn(TxnRequest {
                    success: puts,
                    ..TxnRequest::default()
                }))
                .await?;
            }
            // Records dropped after the TTL (a fresh lease never had them).
            let gone: Vec<&String> = removed.iter().filter(|n| !all.contains_key(*n)).collect();
            for chunk in gone.chunks(TXN_OPS) {
                let deletes: Vec<RequestOp> = chunk
                    .iter()
                    .map(|node| RequestOp::delete(self.keys.proxy(&self.node, node)))
                    .collect();
                call(self.client.txn(TxnRequest {
                    success: deletes,
                    ..TxnRequest::default()
                }))
                .await?;
            }
            Ok(())
        })
    }

    fn fleet_proxies(&self) -> StoreFuture<'_, Option<Vec<(String, ProxyRecord)>>> {
        Box::pin(async move {
            let resp = call(self.client.range(RangeRequest::prefix(self.keys.proxies()))).await?;
            Ok(Some(
                resp.kvs
                    .iter()
                    .filter_map(|kv| serde_json::from_slice::<PublishedProxy>(&kv.value).ok())
                    .map(|p| (p.node, p.record))
                    .collect(),
            ))
        })
    }

    fn publish_replica_value<'a>(
        &'a self,
        kind: &'a str,
        value: Option<Vec<u8>>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let key = format!("{}{}", self.keys.replica_values(kind), self.node);
            let Some(value) = value else {
                call(self.client.txn(TxnRequest {
                    success: vec![RequestOp::delete(key)],
                    ..TxnRequest::default()
                }))
                .await?;
                return Ok(());
            };
            // The presence lease, which `publish_proxies` renews each
            // second; granted here only if there is none yet. A value on a
            // lease that expired is put again by the next call.
            let mut presence = self.presence.lock().await;
            if presence.is_none() {
                self.keep_lease(&mut presence, PRESENCE_TTL).await?;
            }
            let Some(lease) = presence.as_ref().map(Lease::id) else {
                return Ok(());
            };
            call(self.client.txn(TxnRequest {
                success: vec![RequestOp::put(key, value, lease)],
                ..TxnRequest::default()
            }))
            .await?;
            Ok(())
        })
    }

    fn replica_values<'a>(&'a self, kind: &'a str) -> StoreFuture<'a, Option<ReplicaValues>> {
        Box::pin(async move {
            let prefix = self.keys.replica_values(kind);
            let resp = call(self.client.range(RangeRequest::prefix(prefix.clone()))).await?;
            Ok(Some(
                resp.kvs
                    .into_iter()
                    .filter_map(|kv| {
                        let replica = kv.key_str()?.strip_prefix(&prefix)?.to_string();
                        Some((replica, kv.value))
                    })
                    .collect(),
            ))
        })
    }

    fn ask_replicas<'a>(
        &'a self,
        question: &'a Question,
        wait: Duration,
    ) -> StoreFuture<'a, Option<Asked>> {
        Box::pin(async move { self.ask(question, wait).await.map(Some) })
    }

    fn questions(&self) -> Option<mpsc::Receiver<Query>> {
        Some(self.spawn_questions())
    }

    fn answer<'a>(&'a self, query: &'a Query, answer: Vec<u8>) -> StoreFuture<'a, ()> {
        Box::pin(self.put_answer(query, answer))
    }

    fn release_leases(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            for slot in [&self.lease, &self.presence] {
                let Some(lease) = slot.lock().await.take() else {
                    continue;
                };
                call(self.client.lease_revoke(lease.id())).await?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_follower_reads_the_state_and_the_policies_and_never_the_answers() {
        let keys = Keys {
            prefix: "/router/".into(),
        };
        let (start, end) = keys.followed();
        let inside = |key: String| key.as_bytes() >= &start[..] && key.as_bytes() < &end[..];
        assert!(inside(keys.state()));
        assert!(inside(keys.policy(1)) && inside(keys.policy(u64::MAX)));
        assert!(!inside(keys.answer("0190-ab", "cp-b")));
        assert!(!inside(keys.answers("0190-ab")));
        assert!(!inside(keys.store_id()));
        assert!(!inside("/router0".into()) && !inside("/routea/state".into()));
    }

    #[test]
    fn store_urls_parse_with_every_member_and_a_prefix() {
        let a = EtcdAddress::parse("etcd://10.0.0.1:2379,etcd-1.etcd:2379/prod/router/").unwrap();
        assert_eq!(
            a.endpoints,
            vec!["http://10.0.0.1:2379", "http://etcd-1.etcd:2379"]
        );
        assert_eq!(a.prefix, "/prod/router/");
        assert_eq!(EtcdAddress::parse("etcd://h:1").unwrap().prefix, "/router/");
        let secure = EtcdAddress::parse("etcds://etcd-0.etcd:2379,etcd-1.etcd:2379").unwrap();
        assert_eq!(
            secure.endpoints,
            vec!["https://etcd-0.etcd:2379", "https://etcd-1.etcd:2379"]
        );
        assert!(secure.tls && !a.tls);
        for bad in [
            "http://h:1",
            "https://h:1",
            "etcd://",
            "etcd://h",
            "etcd://h:x",
            "etcd://:1",
            "etcd://h:1/",
        ] {
            assert!(EtcdAddress::parse(bad).is_err(), "{bad} accepted");
        }
    }

    /// A file in a fresh temporary directory.
    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn etcd_access_flags_come_in_pairs_and_tls_needs_etcds_and_a_ca() {
        let dir = std::env::temp_dir().join(format!("etcd-access-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let ca = file(&dir, "ca.pem", pem);
        let cert = file(&dir, "cert.pem", pem);
        let key = file(&dir, "key.pem", pem);
        let password = file(&dir, "password", "  s3cret-pass\n");
        let plain = EtcdAddress::parse("etcd://h:1").unwrap();
        let secure = EtcdAddress::parse("etcds://h:1").unwrap();
        let err = |address: &EtcdAddress, files: EtcdAccessFiles| {
            EtcdAccess::load(address, &files).unwrap_err().to_string()
        };

        // Everything given: read, and the password trimmed.
        let all = EtcdAccessFiles {
            ca: Some(ca.clone()),
            cert: Some(cert.clone()),
            key: Some(key.clone()),
            user: Some("router".into()),
            password: Some(password.clone()),
        };
        let access = EtcdAccess::load(&secure, &all).unwrap();
        assert_eq!(access.ca_pem.as_deref(), Some(pem));
        assert!(access.identity.is_some());
        assert_eq!(
            access.user,
            Some(("router".to_string(), "s3cret-pass".to_string()))
        );
        // Debug names the user, never the password.
        let shown = format!("{access:?}");
        assert!(
            shown.contains("router") && !shown.contains("s3cret"),
            "{shown}"
        );

        // TLS files need etcds://, and etcds:// needs a CA.
        assert!(err(&plain, all.clone()).contains("--etcd-ca-file is for TLS to etcd"));
        assert!(err(&secure, EtcdAccessFiles::default()).contains("needs --etcd-ca-file"));
        // Pairs.
        let with_ca = || EtcdAccessFiles {
            ca: Some(ca.clone()),
            ..EtcdAccessFiles::default()
        };
        for (files, text) in [
            (
                EtcdAccessFiles {
                    cert: Some(cert.clone()),
                    ..with_ca()
                },
                "--etcd-cert-file needs --etcd-key-file",
            ),
            (
                EtcdAccessFiles {
                    user: Some("router".into()),
                    ..with_ca()
                },
                "--etcd-user needs --etcd-password-file",
            ),
            (
                EtcdAccessFiles {
                    password: Some(password.clone()),
                    ..with_ca()
                },
                "--etcd-password-file needs --etcd-user",
            ),
            // Missing and unusable files are named by their flag.
            (
                EtcdAccessFiles {
                    ca: Some(dir.join("missing.pem")),
                    ..EtcdAccessFiles::default()
                },
                "cannot read --etcd-ca-file",
            ),
            (
                EtcdAccessFiles {
                    cert: Some(password.clone()),
                    key: Some(key.clone()),
                    ..with_ca()
                },
                "--etcd-cert-file",
            ),
            (
                EtcdAccessFiles {
                    user: Some("router".into()),
                    password: Some(file(&dir, "empty", " \n")),
                    ..with_ca()
                },
                "--etcd-password-file",
            ),
        ] {
            let text_got = err(&secure, files);
            assert!(text_got.contains(text), "{text_got}");
            assert!(!text_got.contains("s3cret"), "{text_got}");
        }
        // A user with a password on a plaintext store is allowed.
        let on_plain = EtcdAccessFiles {
            user: Some("router".into()),
            password: Some(password),
            ..EtcdAccessFiles::default()
        };
        assert!(EtcdAccess::load(&plain, &on_plain).is_ok());
        assert_eq!(on_plain.first_given(), Some("--etcd-user"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
