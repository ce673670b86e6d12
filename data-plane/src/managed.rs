//! Managed mode: config streamed from the control plane.
//!
//! One long-lived gRPC stream (`ProxyConfig.Stream`). The proxy says hello
//! (node id, last applied revision); every snapshot it receives is built
//! off to the side, validated and swapped in atomically, then ACKed; a
//! snapshot that cannot be applied is NACKed with the error and the last
//! good config keeps serving. Two rules keep one bad input from freezing
//! or rolling back the fleet:
//!
//! - **Only newer state.** A snapshot whose revision is older than the one
//!   applied, from the same store (`store_id`), is not applied: it can only
//!   come from a replica that lags, and applying it would roll the proxy
//!   back. It is NACKed ("older than the applied revision"), so the lagging
//!   replica's `proxies list` shows why, while the proxy's applied revision
//!   stays the newer one. A snapshot from another store (one that was reset
//!   or replaced) is not compared: its revisions count from elsewhere.
//! - **One bad circuit override is skipped, not fatal.** An override
//!   whose endpoint does not parse, whose pool the policy lacks, or whose
//!   endpoint is not in its pool is skipped (logged, and counted in
//!   `router_config_circuit_overrides_skipped`); the rest of the snapshot
//!   is applied and ACKed. Before, one typo NACKed the whole snapshot and
//!   froze the fleet's config for the override's lifetime.
//!
//! Messages are capped at [`router_proto::MAX_MESSAGE_BYTES`] each way, as
//! on the control plane. Every good snapshot is written to
//! `--cache-dir` (write, fsync, rename) and loaded at the next boot before
//! dialling, so a proxy restarted while the control plane is down serves
//! its last config at once. Local circuit transitions are reported on the
//! same stream; the control plane shares open circuits with every proxy.
//!
//! The connection is a small state machine: connect to the next address,
//! stream until it breaks, back off (jittered exponential, 100 ms doubling
//! to 10 s, reset after a stream that worked), move to the next address.
//! It never gives up: without a control plane the proxy keeps serving.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use router_policy::document::load_with;
use router_policy::guard::backend_refusal;
use router_policy::health::SuspectCause;
use router_policy::{Endpoint, Guards, Policy, QueueSettings};
use router_proto::v1 as pb;
use router_proto::v1::proxy_config_client::ProxyConfigClient;
use router_route_log::ring::DecisionRing;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;

use crate::config::ConfigStore;
use crate::pool::CircuitEvent;

mod cache;
mod decisions;
mod error;
mod load;
use cache::cache_in_background;
pub(crate) use cache::read_cache;
pub(crate) use decisions::decision_parts;
pub use error::AddressError;
pub(crate) use error::{DecodeError, OverrideError, StreamError};
pub(crate) use load::load_answer;

/// Managed mode's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedOptions {
    /// Control-plane addresses (`http://host:port`), tried in turn.
    pub addrs: Vec<String>,
    /// Bearer token (`ROUTER_TOKEN`), trimmed and checked at start
    /// (`router_proto::token`): one that cannot be sent stops the proxy.
    pub token: Option<String>,
    /// This proxy's name in `proxies list`.
    pub node_id: String,
    /// Where the last good snapshot is kept.
    pub cache_dir: Option<PathBuf>,
    /// Extra CA (PEM) for `https://` control planes, beside the webpki roots.
    pub ca_pem: Option<String>,
    /// How often the proxy says it is alive on its stream when it has
    /// nothing else to say ([`HEARTBEAT`] by default): `proxies list`'s
    /// LAST SEEN is then at most this old for a live proxy.
    pub heartbeat: Duration,
}

/// The default [`ManagedOptions::heartbeat`].
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// A gRPC endpoint for a control-plane address: plain for `http://`, TLS
/// (webpki roots plus `ca_pem`) for `https://`.
pub fn grpc_endpoint(
    addr: &str,
    ca_pem: Option<&str>,
) -> Result<tonic::transport::Endpoint, AddressError> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(addr.to_string())
        .map_err(|error| AddressError::Bad {
            addr: addr.to_string(),
            error,
        })?
        .connect_timeout(Duration::from_secs(2));
    if addr.starts_with("https://") {
        let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
        if let Some(pem) = ca_pem {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|error| AddressError::Tls {
                addr: addr.to_string(),
                error,
            })?;
    }
    Ok(endpoint)
}

/// Why a managed proxy has no config to serve yet. Until the first
/// snapshot with a policy is applied (from the control plane or the
/// cache), every request would get `503 no_backend`, so health answers 503
/// with this reason (while the snapshot is the boot one, see
/// `Snapshot::configured`), and load balancers and Kubernetes readiness
/// keep traffic away.
#[derive(Debug)]
pub(crate) struct Readiness {
    /// What the operator should fix.
    waiting_on: std::sync::Mutex<String>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            waiting_on: std::sync::Mutex::new(
                "no configuration from the control plane yet: connecting".into(),
            ),
        }
    }
}

impl Readiness {
    /// Not configured yet, because of `why`.
    fn waiting_on(&self, why: &str) {
        if let Ok(mut w) = self.waiting_on.lock() {
            format!("no configuration from the control plane yet: {why}").clone_into(&mut w);
        }
    }

    /// Why the proxy cannot serve yet.
    pub(crate) fn reason(&self) -> String {
        self.waiting_on
            .lock()
            .map_or_else(|_| "no configuration yet".into(), |w| w.clone())
    }
}

/// Why a connection to the control plane failed, as far as advice goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectTrouble {
    /// The server's certificate names another host.
    WrongHostName,
    /// The server's certificate is not signed by a trusted CA.
    UntrustedCertificate,
    /// Nothing listens at the address.
    Refused,
    /// Anything else.
    Other,
}

/// Classifies a connect error by the types in its chain of causes (a
/// `rustls::Error`, an `io::Error`'s kind), never by its words. An
/// `io::Error` hides the error it wraps from `source()`, so its inner
/// error is looked at too.
fn connect_trouble(e: &(dyn std::error::Error + 'static)) -> ConnectTrouble {
    use rustls::{CertificateError, Error as Tls};
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(tls) = err.downcast_ref::<Tls>() {
            match tls {
                Tls::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                ) => return ConnectTrouble::WrongHostName,
                Tls::InvalidCertificate(_) => return ConnectTrouble::UntrustedCertificate,
                _ => {}
            }
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return ConnectTrouble::Refused;
            }
            if let Some(inner) = io.get_ref() {
                let found = connect_trouble(inner);
                if found != ConnectTrouble::Other {
                    return found;
                }
            }
        }
        next = err.source();
    }
    ConnectTrouble::Other
}

/// Why the control plane at `url` could not be reached, with what to do
/// about it: the chain of causes (tonic's own message is only "transport
/// error") and advice by the kind of failure ([`connect_trouble`]).
/// `ca_flag` names the option that gives a CA.
pub fn connect_failure(url: &str, e: &(dyn std::error::Error + 'static), ca_flag: &str) -> String {
    let mut chain = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Wrappers often repeat their cause's words.
        if !chain.ends_with(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = cause.source();
    }
    let advice = match connect_trouble(e) {
        ConnectTrouble::WrongHostName => {
            "its certificate does not name this host: use the host name it was issued for".into()
        }
        ConnectTrouble::UntrustedCertificate => {
            format!("its TLS certificate is not trusted: give {ca_flag} with the CA that signed it")
        }
        ConnectTrouble::Refused => {
            "nothing listens there: is the control plane running, and is the address right?".into()
        }
        // A TLS server cuts a cleartext HTTP/2 handshake short.
        ConnectTrouble::Other if url.starts_with("http://") => {
            format!("if it serves TLS, use an https:// address (with {ca_flag})")
        }
        ConnectTrouble::Other => "see the cause".into(),
    };
    format!("cannot reach the control plane at {url} ({chain}): {advice}")
}

/// What to tell the operator when the control plane refused the stream.
fn explain_refusal(status: tonic::Status, node_id: &str) -> StreamError {
    use tonic::Code;
    let detail = status.message().to_string();
    match status.code() {
        Code::Unauthenticated => StreamError::Unauthenticated { detail },
        Code::PermissionDenied => StreamError::NotThisNode {
            node_id: node_id.to_string(),
            detail,
        },
        Code::ResourceExhausted => StreamError::Full { detail },
        _ => StreamError::Status(Box::new(status)),
    }
}

/// A snapshot turned into what the proxy runs on.
pub(crate) struct Decoded {
    /// The policy (drained endpoints of the backend sets folded in).
    pub policy: Policy,
    /// Backend sets by pool.
    pub backends: BTreeMap<String, Vec<Endpoint>>,
    /// Circuits and suspicions.
    pub marks: Marks,
}

/// A snapshot's circuit overrides and suspicion marks, decoded.
pub(crate) struct Marks {
    /// Forced circuits by pool: (endpoint or whole pool, open, until).
    pub circuits: BTreeMap<String, Vec<(Option<Endpoint>, bool, Instant)>>,
    /// The fleet's suspicion marks by pool: (endpoint, cause, until).
    pub suspects: BTreeMap<String, Vec<(Endpoint, SuspectCause, Instant)>>,
    /// Circuit overrides that were skipped, each with why.
    pub skipped: Vec<String>,
}

/// What the proxy applied last: the revision, and the store it counts in.
#[derive(Debug, Clone, Default)]
pub(crate) struct Applied {
    /// The control plane's store (empty: a control plane that does not say).
    pub store_id: String,
    /// Its revision (0: nothing yet).
    pub revision: u64,
    /// The policy and backend sets it was built from (for the fast path of
    /// a snapshot that changes only circuits or suspicions).
    pub basis: Option<Arc<Basis>>,
    /// The response cache's purges applied (the ids of the last snapshot's
    /// marks, at most the control plane's 64).
    pub purged: std::collections::BTreeSet<String>,
}

/// A snapshot's policy and backend sets, as sent and as decoded.
#[derive(Debug)]
pub(crate) struct Basis {
    document: String,
    backends: Vec<pb::PoolBackends>,
    keys: Vec<pb::TenantKey>,
    policy: Policy,
    endpoints: BTreeMap<String, Vec<Endpoint>>,
}

impl Basis {
    /// Whether `snapshot` has this policy, these backend sets and keys.
    fn same(&self, snapshot: &pb::Snapshot) -> bool {
        self.document == snapshot.policy_document
            && self.backends == snapshot.backends
            && self.keys == snapshot.keys
    }
}

impl Applied {
    /// Why `msg` must not be applied after this: it is older, from the same
    /// store. `None` when it may be applied.
    fn refuses(&self, msg: &pb::ControlMessage) -> Option<String> {
        (self.revision > 0 && msg.store_id == self.store_id && msg.revision < self.revision).then(
            || {
                format!(
                    "revision {} is older than the applied revision {} (a lagging control plane?): ignored",
                    msg.revision, self.revision
                )
            },
        )
    }
}

use router_policy::wall_clock::unix_ms_i64;

/// The longest an override from the control plane is held without being
/// sent again: a far-off (or hostile) expiry must not overflow the clock.
/// Every snapshot sends the overrides again, so a longer one is renewed.
const MAX_OVERRIDE: Duration = crate::clock::A_YEAR;

/// The instant a wall-clock expiry (Unix ms) falls on, at most
/// [`MAX_OVERRIDE`] from now; a past one is now.
fn unix_ms_to_instant(ms: i64) -> Instant {
    let left = ms.saturating_sub(unix_ms_i64()).max(0);
    crate::clock::later(
        Instant::now(),
        Duration::from_millis(u64::try_from(left).unwrap_or(0)),
        MAX_OVERRIDE,
    )
}

/// Checks one circuit override against the decoded policy and backend
/// sets: the endpoint (when named) parses and belongs to the pool.
fn circuit_target(
    c: &pb::CircuitOverride,
    policy: &Policy,
    backends: &BTreeMap<String, Vec<Endpoint>>,
) -> Result<Option<Endpoint>, OverrideError> {
    let Some(pool) = policy.pool(&c.pool) else {
        return Err(OverrideError::NoPool {
            pool: c.pool.clone(),
        });
    };
    if c.endpoint.is_empty() {
        return Ok(None);
    }
    let ep = Endpoint::parse(&c.endpoint)?;
    let endpoints = backends.get(&c.pool).unwrap_or(&pool.endpoints);
    if !endpoints.contains(&ep) {
        return Err(OverrideError::NotInPool {
            endpoint: c.endpoint.clone(),
            pool: c.pool.clone(),
        });
    }
    Ok(Some(ep))
}

/// Validates a snapshot against this proxy's `guards` (its own API key
/// variables and backend hosts: the control plane cannot know them); `Err`
/// is the NACK's text. Circuit overrides that do not fit the snapshot's
/// own policy are skipped (listed in [`Decoded::skipped`]), not fatal.
pub(crate) fn decode(
    snapshot: &pb::Snapshot,
    defaults: &QueueSettings,
    guards: &Guards,
) -> Result<Decoded, DecodeError> {
    let mut policy = load_with(&snapshot.policy_document, defaults, guards)?;
    add_stored_keys(&mut policy, &snapshot.keys);
    let mut backends = BTreeMap::new();
    for b in &snapshot.backends {
        let Some(pool) = policy.pools.iter_mut().find(|p| p.name == b.pool) else {
            return Err(DecodeError::UnknownPool {
                pool: b.pool.clone(),
            });
        };
        let parse = |e: &String| {
            Endpoint::parse(e).map_err(|error| DecodeError::BadEndpoint {
                pool: b.pool.clone(),
                endpoint: e.clone(),
                error,
            })
        };
        let mut eps = Vec::new();
        for e in &b.endpoints {
            let ep = parse(e)?;
            if let Some(why) = backend_refusal(&ep, &guards.backend_hosts) {
                return Err(DecodeError::RefusedBackend {
                    pool: b.pool.clone(),
                    why,
                });
            }
            eps.push(ep);
        }
        for d in &b.drained {
            pool.drained.push(parse(d)?);
        }
        backends.insert(b.pool.clone(), eps);
    }
    let marks = decode_marks(snapshot, &policy, &backends);
    Ok(Decoded {
        policy,
        backends,
        marks,
    })
}

/// Adds the tenants' keys of the control plane's store to the policy's
/// tenants (a key with a malformed hash, or of a tenant the policy does
/// not name, is skipped and logged: the rest of the snapshot applies).
fn add_stored_keys(policy: &mut Policy, keys: &[pb::TenantKey]) {
    if keys.is_empty() {
        return;
    }
    let Some(tenants) = policy.tenants.as_mut() else {
        tracing::warn!(
            keys = keys.len(),
            "the control plane sent tenants' keys, but the policy has no tenants: not used"
        );
        return;
    };
    let mut stored = Vec::with_capacity(keys.len());
    for k in keys {
        match router_policy::tenant::parse_key_hash(&k.hash) {
            Some(hash) => stored.push(router_policy::tenant::StoredKey {
                id: k.id.clone(),
                tenant: k.tenant.clone(),
                hash,
                expires_at_unix_ms: k.expires_at_unix_ms,
            }),
            None => tracing::warn!(key = %k.id, "skipped a tenant key with a malformed hash"),
        }
    }
    for why in tenants.add_stored_keys(stored) {
        tracing::warn!(reason = %why, "skipped a tenant key; the rest of the snapshot applies");
    }
}

/// The circuit overrides and suspicion marks of a snapshot, checked
/// against its decoded `policy` and `backends`.
fn decode_marks(
    snapshot: &pb::Snapshot,
    policy: &Policy,
    backends: &BTreeMap<String, Vec<Endpoint>>,
) -> Marks {
    let mut circuits: BTreeMap<String, Vec<_>> = BTreeMap::new();
    let mut suspects: BTreeMap<String, Vec<_>> = BTreeMap::new();
    let mut skipped = Vec::new();
    for c in &snapshot.circuits {
        if !c.suspect.is_empty() {
            let cause = SuspectCause::parse(&c.suspect);
            match (cause, circuit_target(c, policy, backends)) {
                (Some(cause), Ok(Some(ep))) => suspects.entry(c.pool.clone()).or_default().push((
                    ep,
                    cause,
                    unix_ms_to_instant(c.until_unix_ms),
                )),
                (None, _) => skipped.push(format!(
                    "suspicion {}/{} (from {}): unknown cause {:?}",
                    c.pool, c.endpoint, c.source, c.suspect
                )),
                (_, Ok(None)) => skipped.push(format!(
                    "suspicion {}/{} (from {}): names no endpoint",
                    c.pool, c.endpoint, c.source
                )),
                (_, Err(why)) => skipped.push(format!(
                    "suspicion {}/{} (from {}): {why}",
                    c.pool, c.endpoint, c.source
                )),
            }
            continue;
        }
        let ep = match circuit_target(c, policy, backends) {
            Ok(ep) => ep,
            Err(why) => {
                skipped.push(format!(
                    "circuit override {}/{} (from {}): {why}",
                    c.pool, c.endpoint, c.source
                ));
                continue;
            }
        };
        circuits.entry(c.pool.clone()).or_default().push((
            ep,
            c.open,
            unix_ms_to_instant(c.until_unix_ms),
        ));
    }
    Marks {
        circuits,
        suspects,
        skipped,
    }
}

/// Applies a decoded snapshot: one atomic config swap, then the forced
/// circuits on the new pools. Skipped overrides are logged and counted.
pub(crate) fn apply(store: &ConfigStore, d: Decoded, msg: &pb::ControlMessage) -> Arc<str> {
    let version = store.apply_managed(d.policy, d.backends, config_revision(msg));
    apply_marks(store, &d.marks, msg.revision);
    store.set_revision(msg.revision);
    version
}

/// The revision a message's config is named by: its snapshot's
/// `config_revision` (the last change of policy, backend sets or keys), or
/// from a control plane that does not send one, the message's revision.
pub(crate) fn config_revision(msg: &pb::ControlMessage) -> u64 {
    msg.snapshot
        .as_ref()
        .map(|s| s.config_revision)
        .filter(|r| *r != 0)
        .unwrap_or(msg.revision)
}

/// Sets the forced circuits and the fleet's suspicions on the current
/// pools. Skipped overrides are logged and counted.
fn apply_marks(store: &ConfigStore, marks: &Marks, revision: u64) {
    for why in &marks.skipped {
        tracing::warn!(revision, reason = %why, "skipped a circuit override; the rest of the snapshot applies");
    }
    store.circuit_overrides_skipped(marks.skipped.len());
    let snapshot = store.load();
    for (name, pool) in &snapshot.pools {
        let forced = marks.circuits.get(name).map(Vec::as_slice).unwrap_or(&[]);
        pool.set_forced(forced);
        let suspects = marks.suspects.get(name).map(Vec::as_slice).unwrap_or(&[]);
        pool.set_suspects(suspects);
    }
}

/// Applies the cached snapshot at boot; returns what it applied.
pub(crate) fn apply_cache(
    store: &ConfigStore,
    dir: &Path,
    defaults: &QueueSettings,
    guards: &Guards,
) -> Option<Applied> {
    let msg = read_cache(dir)?;
    let snapshot = msg.snapshot.as_ref()?;
    match decode(snapshot, defaults, guards) {
        Ok(d) => {
            let version = apply(store, d, &msg);
            tracing::info!(
                version = &*version,
                "serving the cached snapshot until the control plane answers"
            );
            // No basis: the control plane's first snapshot is applied whole.
            Some(Applied {
                store_id: msg.store_id.clone(),
                revision: msg.revision,
                basis: None,
                purged: Default::default(),
            })
        }
        Err(e) => {
            tracing::warn!(error = %e, "the cached snapshot is unusable");
            None
        }
    }
}

/// Jittered exponential backoff.
struct Backoff {
    attempt: u32,
    seed: u64,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let base = Duration::from_millis(100).saturating_mul(1 << self.attempt.min(7));
        let base = base.min(Duration::from_secs(10));
        self.attempt += 1;
        // xorshift: jitter in [50%, 100%] of the base.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let frac = 0.5 + (self.seed % 1000) as f64 / 2000.0;
        base.mul_f64(frac)
    }

    fn reset(&mut self) {
        self.attempt = 0;
    }
}

fn unix_ms(at: Option<Instant>) -> i64 {
    let now = unix_ms_i64();
    match at {
        Some(t) => now.saturating_add(
            i64::try_from(t.saturating_duration_since(Instant::now()).as_millis())
                .unwrap_or(i64::MAX),
        ),
        None => now,
    }
}

/// What every connection of the config stream uses, owned by [`run`].
pub(crate) struct StreamContext {
    /// The mode's options (addresses, node id, cache, CA).
    pub(crate) options: ManagedOptions,
    /// `ROUTER_TOKEN`, ready to send.
    pub(crate) token: router_proto::BearerToken,
    /// Where snapshots are applied.
    pub(crate) store: Arc<ConfigStore>,
    /// Queue defaults for pools that set none.
    pub(crate) defaults: QueueSettings,
    /// What a snapshot may ask of this proxy.
    pub(crate) guards: Guards,
    /// Whether a config has been applied yet, and why not.
    pub(crate) readiness: Arc<Readiness>,
    /// Stored keys used since the last heartbeat, sent with it.
    pub(crate) key_use: Arc<crate::key_use::KeyUse>,
    /// The last route records (`CUSTOM_ROUTER_DECISION_RING`), sent when
    /// the control plane asks (`None`: a ring of 0).
    pub(crate) decisions: Option<Arc<DecisionRing>>,
}

/// Key uses per `KeysUsed` message: a key id is at most a few dozen bytes,
/// so a message stays far below `router_proto::MAX_PROXY_MESSAGE_BYTES`.
const KEYS_USED_PER_MESSAGE: usize = 500;

/// Streams config from the control plane forever.
pub(crate) async fn run(
    context: StreamContext,
    mut events: mpsc::Receiver<CircuitEvent>,
    mut applied: Applied,
) {
    // Jitter differs between proxies started together.
    let seed = router_policy::wall_clock::since_epoch().as_nanos() as u64 | 1;
    let mut backoff = Backoff { attempt: 0, seed };
    let mut index = 0usize;
    loop {
        let addrs = &context.options.addrs;
        let addr = addrs[index % addrs.len().max(1)].clone();
        index += 1;
        match stream_once(&context, &addr, &mut events, &mut applied).await {
            Ok(()) => backoff.reset(),
            Err(e) if context.store.load().configured => {
                tracing::warn!(control_plane = %addr, error = %e, "control plane stream failed; serving the last good config")
            }
            Err(e) => {
                context.readiness.waiting_on(&e.to_string());
                tracing::warn!(control_plane = %addr, error = %e, "control plane stream failed; no configuration yet: health answers 503 and requests get 503 no_backend until one is applied")
            }
        }
        tokio::time::sleep(backoff.next()).await;
    }
}

/// One connection to the control plane at `addr`: hello, then snapshots
/// applied and answered, and circuit events reported, until it ends.
async fn stream_once(
    context: &StreamContext,
    addr: &str,
    events: &mut mpsc::Receiver<CircuitEvent>,
    applied: &mut Applied,
) -> Result<(), StreamError> {
    let options = &context.options;
    let endpoint = grpc_endpoint(addr, options.ca_pem.as_deref())?
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| StreamError::Unreachable(connect_failure(addr, &e, "--control-plane-ca")))?;
    let mut client = ProxyConfigClient::with_interceptor(channel, context.token.clone())
        .max_decoding_message_size(router_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(router_proto::MAX_PROXY_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel::<pb::ProxyMessage>(16);
    let hello = pb::ProxyMessage {
        msg: Some(pb::proxy_message::Msg::Hello(pb::Hello {
            node_id: options.node_id.clone(),
            last_applied_revision: applied.revision,
        })),
    };
    tx.send(hello).await.map_err(|_| StreamError::Closed)?;
    let mut inbound = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|e| explain_refusal(e, &options.node_id))?
        .into_inner();
    tracing::info!(control_plane = %addr, "connected to the control plane");
    // A heartbeat (an empty load report): the control plane's LAST SEEN
    // for this proxy, whether or not anything changed.
    let mut heartbeat = tokio::time::interval(options.heartbeat.max(Duration::from_millis(10)));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heartbeat.tick().await;
    loop {
        tokio::select! {
            _ = heartbeat.tick() => {
                // With it, what each ramped split's sides did since the
                // last beat (empty without a ramp).
                let outcomes = crate::ramp_tally::take_all(&context.store.load().ramp_sides);
                let alive = pb::ProxyMessage {
                    msg: Some(pb::proxy_message::Msg::Load(pb::LoadReport {
                        outcomes,
                        ..pb::LoadReport::default()
                    })),
                };
                if tx.send(alive).await.is_err() {
                    return Ok(());
                }
                // Keys used since the last beat, in messages well under the
                // control plane's per-message limit.
                let used = context.key_use.take();
                for chunk in used.chunks(KEYS_USED_PER_MESSAGE) {
                    let keys = chunk
                        .iter()
                        .map(|(id, at)| pb::KeyUse {
                            id: id.to_string(),
                            last_used_unix_ms: *at,
                        })
                        .collect();
                    let report = pb::ProxyMessage {
                        msg: Some(pb::proxy_message::Msg::KeysUsed(pb::KeysUsed { keys })),
                    };
                    if tx.send(report).await.is_err() {
                        return Ok(());
                    }
                }
            }
            msg = inbound.next() => {
                let msg = match msg {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => return Err(StreamError::Status(Box::new(e))),
                    None => return Ok(()),
                };
                // The console asks for the latest route records: no
                // snapshot comes with it, nothing is applied.
                if let Some(q) = &msg.decisions {
                    for part in decision_parts(context.decisions.as_deref(), q) {
                        if tx.send(part).await.is_err() {
                            return Ok(());
                        }
                    }
                    continue;
                }
                // The console asks for this proxy's load: answered from the
                // pools' status, nothing applied.
                if let Some(q) = &msg.load {
                    let answer = load_answer(&q.id, &context.store.load().pool_status());
                    if tx.send(answer).await.is_err() {
                        return Ok(());
                    }
                    continue;
                }
                let reply = handle(
                    &msg,
                    &context.store,
                    &context.defaults,
                    &context.guards,
                    options.cache_dir.as_deref(),
                    applied,
                );
                if msg.snapshot.as_ref().is_some_and(|s| s.policy_version == 0) {
                    context
                        .readiness
                        .waiting_on("the control plane has no policy yet: routerctl policy apply -f FILE");
                }
                if tx.send(reply).await.is_err() {
                    return Ok(());
                }
            }
            Some(ev) = events.recv() => {
                let report = pb::ProxyMessage {
                    msg: Some(pb::proxy_message::Msg::Circuit(pb::CircuitReport {
                        pool: ev.pool,
                        endpoint: ev.endpoint,
                        open: ev.open,
                        until_unix_ms: unix_ms(ev.until),
                        suspect: ev.suspect.map(|c| c.as_str().to_string()).unwrap_or_default(),
                    })),
                };
                if tx.send(report).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// One control message: applied and ACKed, or NACKed (invalid, or older
/// than what is applied) with the last good config kept.
pub(crate) fn handle(
    msg: &pb::ControlMessage,
    store: &ConfigStore,
    defaults: &QueueSettings,
    guards: &Guards,
    cache_dir: Option<&Path>,
    applied: &mut Applied,
) -> pb::ProxyMessage {
    let nack = |error: String| {
        tracing::warn!(revision = msg.revision, %error, "NACK: keeping the last good config");
        pb::ProxyMessage {
            msg: Some(pb::proxy_message::Msg::Nack(pb::Nack {
                revision: msg.revision,
                nonce: msg.nonce.clone(),
                error,
            })),
        }
    };
    let Some(snapshot) = msg.snapshot.as_ref() else {
        return nack("a message without a snapshot".into());
    };
    if let Some(why) = applied.refuses(msg) {
        return nack(why);
    }
    if !applied.store_id.is_empty() && msg.store_id != applied.store_id {
        tracing::info!(
            revision = msg.revision,
            applied = applied.revision,
            "the control plane's store changed (reset or replaced): its revisions count afresh"
        );
    }
    if snapshot.policy_version == 0 {
        // The control plane has no policy yet: nothing to apply.
        return ack(msg);
    }
    // Only circuits or suspicions changed: the marks are set on the pools
    // as they are, without a policy parse (a suspicion reaches the fleet
    // sooner).
    if let Some(basis) = applied.basis.clone().filter(|b| b.same(snapshot)) {
        let marks = decode_marks(snapshot, &basis.policy, &basis.endpoints);
        let version = store.rename_managed(config_revision(msg));
        apply_marks(store, &marks, msg.revision);
        apply_purges(store, snapshot, &mut applied.purged);
        store.set_revision(msg.revision);
        applied.store_id = msg.store_id.clone();
        applied.revision = msg.revision;
        tracing::debug!(
            version = &*version,
            "applied the control plane's circuits and suspicions"
        );
        if let Some(dir) = cache_dir {
            cache_in_background(dir, msg);
        }
        return ack(msg);
    }
    match decode(snapshot, defaults, guards) {
        Ok(d) => {
            let basis = Arc::new(Basis {
                document: snapshot.policy_document.clone(),
                backends: snapshot.backends.clone(),
                keys: snapshot.keys.clone(),
                policy: d.policy.clone(),
                endpoints: d.backends.clone(),
            });
            let version = apply(store, d, msg);
            let mut purged = std::mem::take(&mut applied.purged);
            apply_purges(store, snapshot, &mut purged);
            *applied = Applied {
                store_id: msg.store_id.clone(),
                revision: msg.revision,
                basis: Some(basis),
                purged,
            };
            tracing::info!(version = &*version, "applied the control plane's snapshot");
            if let Some(dir) = cache_dir {
                cache_in_background(dir, msg);
            }
            ack(msg)
        }
        Err(e) => nack(e.to_string()),
    }
}

/// Carries out the response cache's purges of `snapshot` not applied yet
/// (by id, in `purged`, which then holds the snapshot's ids): each drops
/// the entries of this proxy's own store under its prefix. A prefix that
/// is not a cache key's (`cache:`) is skipped: a purge never reaches the
/// idempotency keys.
fn apply_purges(
    store: &ConfigStore,
    snapshot: &pb::Snapshot,
    purged: &mut std::collections::BTreeSet<String>,
) {
    for p in &snapshot.cache_purges {
        if !purged.contains(&p.id) && p.prefix.starts_with("cache:") {
            store.purge_cache(&p.prefix);
        }
    }
    *purged = snapshot.cache_purges.iter().map(|p| p.id.clone()).collect();
}

fn ack(msg: &pb::ControlMessage) -> pb::ProxyMessage {
    pb::ProxyMessage {
        msg: Some(pb::proxy_message::Msg::Ack(pb::Ack {
            revision: msg.revision,
            nonce: msg.nonce.clone(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn decisions_go_newest_first_in_parts_under_the_message_limit() {
        let ring = DecisionRing::new(300);
        let line = format!("{{\"request_id\":\"{}\"}}", "x".repeat(1000));
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        for i in 0..300 {
            let start = buf.len();
            buf.extend_from_slice(format!("{i:03}").as_bytes());
            buf.extend_from_slice(line.as_bytes());
            ends.push((start, buf.len()));
            buf.push(b'\n');
        }
        ring.push_lines(&buf, &ends);
        let ask = |max_records, max_bytes| pb::DecisionsRequest {
            id: "q1".into(),
            max_records,
            max_bytes,
        };
        let parts = decision_parts(Some(&ring), &ask(256, 1 << 20));
        let decisions: Vec<pb::Decisions> = parts
            .iter()
            .map(|p| {
                assert!(p.encoded_len() < router_proto::MAX_PROXY_MESSAGE_BYTES);
                match &p.msg {
                    Some(pb::proxy_message::Msg::Decisions(d)) => d.clone(),
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        assert!(decisions.len() > 1, "in parts");
        assert!(decisions.iter().all(|d| d.id == "q1" && d.capacity == 300));
        let last: Vec<bool> = decisions.iter().map(|d| d.last).collect();
        assert_eq!(last.iter().filter(|l| **l).count(), 1);
        assert_eq!(last.last(), Some(&true));
        let lines: Vec<&String> = decisions.iter().flat_map(|d| &d.lines).collect();
        assert_eq!(lines.len(), 256);
        assert!(lines[0].starts_with("299"), "the newest first");
        // Bytes asked bound it; no ring: one empty last part.
        let few = decision_parts(Some(&ring), &ask(256, 3000));
        assert_eq!(few.len(), 1);
        let none = decision_parts(None, &ask(10, 1000));
        assert!(matches!(
            &none[..],
            [pb::ProxyMessage { msg: Some(pb::proxy_message::Msg::Decisions(d)) }] if d.last && d.lines.is_empty() && d.capacity == 0
        ));
    }

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let mut b = Backoff {
            attempt: 0,
            seed: 42,
        };
        let first = b.next();
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        for _ in 0..20 {
            assert!(b.next() <= Duration::from_secs(10));
        }
        b.reset();
        assert!(b.next() <= Duration::from_millis(100));
    }

    #[test]
    fn a_bad_snapshot_is_refused_with_the_reason() {
        let s = pb::Snapshot {
            policy_version: 1,
            policy_document: "apiVersion: router/v1\nkind: RoutingPolicy\nspec: {pools: [{name: a}], routes: [{name: r, chain: [a]}]}\n".into(),
            backends: vec![pb::PoolBackends {
                pool: "nope".into(),
                endpoints: vec![],
                drained: vec![],
            }],
            circuits: vec![],
            ..Default::default()
        };
        let err = decode(&s, &QueueSettings::default(), &Guards::default())
            .err()
            .unwrap();
        assert!(
            matches!(&err, DecodeError::UnknownPool { pool } if pool == "nope"),
            "{err:?}"
        );
        assert!(err.to_string().contains("unknown pool"), "{err}");
    }

    #[test]
    fn a_snapshot_this_proxys_guards_refuse_is_nacked_with_the_reason() {
        let doc = |var: &str| {
            format!(
                "apiVersion: router/v1\nkind: RoutingPolicy\nspec: {{pools: [{{name: a, api_key_env: {var}}}], routes: [{{name: r, chain: [a]}}]}}\n"
            )
        };
        let s = |var: &str, backend: &str| pb::Snapshot {
            policy_version: 1,
            policy_document: doc(var),
            backends: vec![pb::PoolBackends {
                pool: "a".into(),
                endpoints: vec![backend.into()],
                drained: vec![],
            }],
            circuits: vec![],
            ..Default::default()
        };
        let q = QueueSettings::default();
        // The control plane may allow what this proxy does not.
        let err = decode(&s("HF_TOKEN", "127.0.0.1:9"), &q, &Guards::default())
            .err()
            .unwrap();
        let DecodeError::Policy(policy) = &err else {
            panic!("not a policy error: {err:?}");
        };
        assert_eq!(policy.errors.len(), 1, "{err}");
        assert_eq!(policy.errors[0].field, "spec.pools[0].api_key_env");
        assert!(err.to_string().contains("HF_TOKEN"), "{err}");
        let err = decode(
            &s("A_API_KEY", "169.254.169.254:80"),
            &q,
            &Guards::default(),
        )
        .err()
        .unwrap();
        assert!(
            matches!(&err, DecodeError::RefusedBackend { pool, .. } if pool == "a"),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("pool a") && text.contains("link-local"),
            "{text}"
        );
        let allowing = Guards::from_lookup(|k| match k {
            "CUSTOM_ROUTER_API_KEY_ENV_ALLOW" => Some("HF_TOKEN".into()),
            "CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS" => Some("169.254.169.254".into()),
            _ => None,
        })
        .unwrap();
        assert!(decode(&s("HF_TOKEN", "169.254.169.254:80"), &q, &allowing).is_ok());
    }

    #[test]
    fn a_control_plane_address_tonic_cannot_dial_is_a_bad_address() {
        let err = grpc_endpoint("not a uri", None).unwrap_err();
        assert!(
            matches!(&err, AddressError::Bad { addr, .. } if addr == "not a uri"),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with("bad address not a uri: "),
            "{err}"
        );
        assert!(grpc_endpoint("http://127.0.0.1:1", None).is_ok());
    }

    #[test]
    fn a_backend_that_does_not_parse_is_nacked_with_its_pool() {
        let s = pb::Snapshot {
            policy_version: 1,
            policy_document: "apiVersion: router/v1\nkind: RoutingPolicy\nspec: {pools: [{name: a}], routes: [{name: r, chain: [a]}]}\n".into(),
            backends: vec![pb::PoolBackends {
                pool: "a".into(),
                endpoints: vec!["127.0.0.1:9".into()],
                drained: vec!["ftp://x".into()],
            }],
            ..Default::default()
        };
        let err = decode(&s, &QueueSettings::default(), &Guards::default())
            .err()
            .unwrap();
        assert!(
            matches!(&err, DecodeError::BadEndpoint { pool, endpoint, .. } if pool == "a" && endpoint == "ftp://x"),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("pool a: ftp://x: "), "{err}");
    }

    #[test]
    fn an_override_that_does_not_fit_the_policy_says_why() {
        let policy = router_policy::document::load(
            "apiVersion: router/v1\nkind: RoutingPolicy\nspec: {pools: [{name: a, endpoints: [\"127.0.0.1:9\"]}], routes: [{name: r, chain: [a]}]}\n",
            &QueueSettings::default(),
        )
        .unwrap();
        let backends = BTreeMap::new();
        let over = |pool: &str, endpoint: &str| pb::CircuitOverride {
            pool: pool.into(),
            endpoint: endpoint.into(),
            ..Default::default()
        };
        let err = circuit_target(&over("b", ""), &policy, &backends).unwrap_err();
        assert!(
            matches!(&err, OverrideError::NoPool { pool } if pool == "b"),
            "{err:?}"
        );
        let err = circuit_target(&over("a", "ftp://x"), &policy, &backends).unwrap_err();
        assert!(matches!(err, OverrideError::BadEndpoint(_)), "{err:?}");
        let err = circuit_target(&over("a", "127.0.0.1:10"), &policy, &backends).unwrap_err();
        assert!(
            matches!(&err, OverrideError::NotInPool { endpoint, pool } if endpoint == "127.0.0.1:10" && pool == "a"),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "127.0.0.1:10 is not an endpoint of pool a");
        let ep = circuit_target(&over("a", "127.0.0.1:9"), &policy, &backends).unwrap();
        assert!(ep.is_some());
        assert_eq!(
            circuit_target(&over("a", ""), &policy, &backends).ok(),
            Some(None)
        );
    }

    #[test]
    fn a_refused_stream_is_explained_by_its_status() {
        use tonic::{Code, Status};
        let err = explain_refusal(Status::unauthenticated("no"), "n1");
        assert!(
            matches!(&err, StreamError::Unauthenticated { detail } if detail == "no"),
            "{err:?}"
        );
        let err = explain_refusal(Status::permission_denied("pinned"), "n1");
        assert!(
            matches!(&err, StreamError::NotThisNode { node_id, .. } if node_id == "n1"),
            "{err:?}"
        );
        let err = explain_refusal(Status::resource_exhausted("full"), "n1");
        assert!(matches!(err, StreamError::Full { .. }), "{err:?}");
        let err = explain_refusal(Status::unavailable("down"), "n1");
        assert!(
            matches!(&err, StreamError::Status(s) if s.code() == Code::Unavailable),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("stream: "), "{err}");
    }

    #[tokio::test]
    async fn a_stream_to_an_unusable_address_ends_with_why() {
        let defaults = QueueSettings::default();
        let context = StreamContext {
            options: ManagedOptions {
                addrs: vec![],
                token: None,
                node_id: "n1".into(),
                cache_dir: None,
                ca_pem: None,
                heartbeat: HEARTBEAT,
            },
            token: router_proto::BearerToken::new(None, "test").unwrap(),
            store: Arc::new(ConfigStore::new(
                Policy::sidecar(defaults, None),
                "boot",
                Arc::new(crate::metrics::Metrics::new()),
                None,
                None,
            )),
            defaults,
            guards: Guards::default(),
            readiness: Arc::default(),
            key_use: Arc::default(),
            decisions: None,
        };
        let (_tx, mut events) = mpsc::channel(1);
        let mut applied = Applied::default();
        let err = stream_once(&context, "not a uri", &mut events, &mut applied)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StreamError::Address(AddressError::Bad { .. })),
            "{err:?}"
        );
        // Nothing listens on a port just freed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let addr = format!("http://127.0.0.1:{port}");
        let err = stream_once(&context, &addr, &mut events, &mut applied)
            .await
            .unwrap_err();
        let StreamError::Unreachable(why) = &err else {
            panic!("not unreachable: {err:?}");
        };
        assert!(
            why.starts_with(&format!("cannot reach the control plane at {addr}")),
            "{why}"
        );
    }

    #[test]
    fn a_far_off_override_expiry_does_not_overflow_the_clock() {
        let now = Instant::now();
        let until = unix_ms_to_instant(i64::MAX);
        assert!(until > now && until <= Instant::now() + MAX_OVERRIDE);
        assert!(unix_ms_to_instant(i64::MIN) <= Instant::now());
        assert!(unix_ms(Some(until)) > 0);
    }
}
