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

/// Where the etcd store lives, as `--store etcd://host:2379,host:2379/prefix`
/// (or `etcds://` for TLS) gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAddress {
    /// `http://host:port` (or `https://` with [`tls`](Self::tls)) for each member.
    pub endpoints: Vec<String>,
    /// Key prefix, ending with `/`.
    pub prefix: String,
    /// TLS to etcd (`etcds://`): the members' certificates are checked
    /// against [`EtcdAccess::ca_pem`], which is then required.
    pub tls: bool,
}

impl EtcdAddress {
    /// Parses `etcd://host:port[,host:port...][/prefix]`, or the same with
    /// `etcds://` for TLS.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (rest, tls) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
            (Some(rest), _) => (rest, false),
            (_, Some(rest)) => (rest, true),
            _ => {
                return Err(format!(
                    "{url:?}: an etcd store is etcd://host:port[,host:port...][/prefix] \
                     (etcds:// for TLS)"
                ))
            }
        };
        let scheme = if tls { "https" } else { "http" };
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
            endpoints.push(format!("{scheme}://{host}"));
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
            tls,
        })
    }
}

/// How the control plane proves who it is to etcd, and checks etcd: the
/// CA for `etcds://`, a client certificate (etcd's `--client-cert-auth`),
/// a user and password (etcd's `auth enable`). Read from files by
/// [`EtcdAccess::load`]; `Debug` never shows the key or the password.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    /// CA certificates (PEM) the members' certificates must chain to.
    pub ca_pem: Option<String>,
    /// Client certificate chain and private key (PEM).
    pub identity: Option<(String, String)>,
    /// etcd user name and password.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.identity.is_some())
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("password", &self.user.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The files [`EtcdAccess::load`] reads (the `--etcd-*` flags).
#[derive(Debug, Clone, Default)]
pub struct EtcdAccessFiles {
    /// `--etcd-ca-file`.
    pub ca: Option<PathBuf>,
    /// `--etcd-cert-file`.
    pub cert: Option<PathBuf>,
    /// `--etcd-key-file`.
    pub key: Option<PathBuf>,
    /// `--etcd-user`.
    pub user: Option<String>,
    /// `--etcd-password-file`.
    pub password: Option<PathBuf>,
}

impl EtcdAccessFiles {
    /// The first flag given, if any (they mean nothing without an etcd store).
    pub fn first_given(&self) -> Option<&'static str> {
        [
            (self.ca.is_some(), "--etcd-ca-file"),
            (self.cert.is_some(), "--etcd-cert-file"),
            (self.key.is_some(), "--etcd-key-file"),
            (self.user.is_some(), "--etcd-user"),
            (self.password.is_some(), "--etcd-password-file"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// Why the `--etcd-*` flags cannot be used. The password is never quoted.
#[derive(Debug, thiserror::Error)]
pub enum EtcdAccessError {
    /// A file could not be read.
    #[error("cannot read {flag} {path}: {error}")]
    Read {
        /// The flag that named it.
        flag: &'static str,
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// A certificate or key file holds no PEM block.
    #[error("{flag} {path} holds no PEM block (-----BEGIN ...)")]
    NotPem {
        /// The flag that named it.
        flag: &'static str,
        /// The file.
        path: String,
    },
    /// The password file is empty once trimmed.
    #[error("--etcd-password-file {0} is empty")]
    EmptyPassword(String),
    /// One of a pair without the other.
    #[error("{0} needs {1}")]
    Needs(&'static str, &'static str),
    /// TLS files for a plaintext store.
    #[error("{0} is for TLS to etcd: write the store as etcds://")]
    NotTls(&'static str),
    /// `etcds://` without a CA.
    #[error("an etcds:// store needs --etcd-ca-file (the CA that signed the etcd members' certificates)")]
    NoCa,
}

fn read_flag(flag: &'static str, path: &Path) -> Result<String, EtcdAccessError> {
    std::fs::read_to_string(path).map_err(|error| EtcdAccessError::Read {
        flag,
        path: path.display().to_string(),
        error,
    })
}

fn read_pem(flag: &'static str, path: &Path) -> Result<String, EtcdAccessError> {
    let text = read_flag(flag, path)?;
    if text.contains("-----BEGIN ") {
        Ok(text)
    } else {
        Err(EtcdAccessError::NotPem {
            flag,
            path: path.display().to_string(),
        })
    }
}

impl EtcdAccess {
    /// Reads and checks the files for a store at `address`: TLS files only
    /// with `etcds://`, which needs a CA; a certificate with its key; a
    /// user with a password (trimmed, as tokens are) and the other way round.
    pub fn load(address: &EtcdAddress, files: &EtcdAccessFiles) -> Result<Self, EtcdAccessError> {
        if !address.tls {
            for (given, flag) in [
                (files.ca.is_some(), "--etcd-ca-file"),
                (files.cert.is_some(), "--etcd-cert-file"),
                (files.key.is_some(), "--etcd-key-file"),
            ] {
                if given {
                    return Err(EtcdAccessError::NotTls(flag));
                }
            }
        }
        let ca_pem = match &files.ca {
            Some(path) => Some(read_pem("--etcd-ca-file", path)?),
            None if address.tls => return Err(EtcdAccessError::NoCa),
            None => None,
        };
        let identity = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => Some((
                read_pem("--etcd-cert-file", cert)?,
                read_pem("--etcd-key-file", key)?,
            )),
            (Some(_), None) => {
                return Err(EtcdAccessError::Needs(
                    "--etcd-cert-file",
                    "--etcd-key-file",
                ))
            }
            (None, Some(_)) => {
                return Err(EtcdAccessError::Needs(
                    "--etcd-key-file",
                    "--etcd-cert-file",
                ))
            }
            (None, None) => None,
        };
        let user = match (&files.user, &files.password) {
            (Some(name), Some(path)) => {
                let raw = read_flag("--etcd-password-file", path)?;
                let password = raw.trim();
                if password.is_empty() {
                    return Err(EtcdAccessError::EmptyPassword(path.display().to_string()));
                }
                Some((name.clone(), password.to_string()))
            }
            (Some(_), None) => {
                return Err(EtcdAccessError::Needs(
                    "--etcd-user",
                    "--etcd-password-file",
                ))
            }
            (None, Some(_)) => {
                return Err(EtcdAccessError::Needs(
                    "--etcd-password-file",
                    "--etcd-user",
                ))
            }
            (None, None) => None,
        };
        Ok(Self {
            ca_pem,
            identity,
            user,
        })
    }

    /// The client's options: TLS when the CA is given, the user when
    /// given (etcd's tokens expire, 5 min by default: the client gets a
    /// new one when etcd says so, instead of failing the call).
    fn connect_options(&self) -> Options {
        Options {
            tls: self.ca_pem.as_ref().map(|ca| Tls {
                ca_pem: ca.clone(),
                identity: self.identity.clone(),
            }),
            user: self.user.clone(),
            connect_timeout: Some(Duration::from_secs(3)),
            // A silently dead member breaks the watch within seconds.
            keep_alive: Some((Duration::from_secs(5), Duration::from_secs(3))),
        }
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

/// Reads everything under the prefix; returns it with the etcd revision it was read at.
async fn list(client: &Client, keys: &Keys) -> Result<(Contents, i64), StoreError> {
    let resp = call(client.range(RangeRequest::prefix(keys.prefix.clone()))).await?;
    let revision = resp.header.map_or(0, |h| h.revision);
    let mut contents = Contents::default();
    for kv in &resp.kvs {
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
    let key = kv.key_str()?;
    if key == keys.state() {
        match serde_json::from_slice::<State>(&kv.value) {
            Ok(mut state) => {
                state.revision = to_u64(kv.mod_revision);
                Some(StoreEvent::State(state))
            }
            Err(e) => {
                tracing::error!(key, error = %e, "undecodable state in etcd; ignored");
                None
            }
        }
    } else if key.starts_with(&keys.policies()) {
        match serde_json::from_slice::<PolicyRecord>(&kv.value) {
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
    let create = WatchCreateRequest {
        key: keys.prefix.clone().into_bytes(),
        range_end: prefix_end(keys.prefix.as_bytes()),
        start_revision: start,
        ..WatchCreateRequest::default()
    };
    let mut stream = match call(client.watch(create)).await {
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
        if resp.compact_revision > 0 {
            return WatchEnd::Compacted;
        }
        if resp.canceled {
            return WatchEnd::Broken {
                next,
                progressed,
                error: format!("watch cancelled: {}", resp.cancel_reason),
            };
        }
        progressed = true;
        let mut events = Vec::new();
        for event in &resp.events {
            let Some(kv) = event.kv.as_ref() else {
                continue;
            };
            next = next.max(kv.mod_revision + 1);
            match event.r#type() {
                EventType::Put => events.extend(decode(keys, kv)),
                EventType::Delete => {
                    let version = kv
                        .key_str()
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
                return Ok(true);
            }
            Ok(resp.responses.iter().any(|r| {
                r.as_range()
                    .and_then(|g| g.kvs.first())
                    .is_some_and(|kv| kv.lease == lease.id())
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
