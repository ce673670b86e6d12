//! `router-proxy`: the data plane of the LLM traffic router.
//!
//! An HTTP proxy that puts every model call through a route decision, a
//! bounded per-pool queue and an EWMA-ranked endpoint choice, then streams
//! the backend's answer back and writes one route decision log line.
//!
//! Modules (all private; the public surface is re-exported below), in the
//! order a request meets them:
//!
//! - `balance_workers`: which worker thread a new connection goes to;
//! - `listener_tls`: TLS at the listener (ALPN `h2` and `http/1.1`) and
//!   its certificate's reload; without it the listener serves HTTP/1.1
//!   and h2c with prior knowledge (`serve_connection`);
//! - `stop_signal`: how a drain reaches every open connection;
//! - `handler`: the request path, one file per step (ingress, chain,
//!   attempt, upstream_request, answer, finish, spans); the rules it
//!   carries out are `router_policy`'s (`decide`, `deadline`, `fallback`);
//! - `admin`: `/_custom_router/set-backends`, `explain`, `health`,
//!   `metrics`, and who may call them in each mode (the peer and the
//!   admin token);
//! - `idempotency`, `rate_limit`, `spend`, `store_epoch`, `prefix_share`:
//!   what is kept in this process or in the fleet's shared store
//!   (`CUSTOM_ROUTER_SHARED_STORE`), a crate of its own
//!   ([`router_shared_state`], the only one that links `redis`: keys in
//!   flight and stored answers, tenants' rates and spend, parked tasks'
//!   store, the store's epoch, pools' placements shared between the
//!   proxies of a fleet), re-exported here under the old module names;
//! - `config`: the immutable `Snapshot` and its atomic swaps ([`ConfigStore`]);
//! - `pool`, `clock`, `random`: pools and their endpoints, a crate of its
//!   own ([`router_endpoints`]: one pool's circuits, latency window,
//!   bounded FIFO and leases; with prefix affinity, per endpoint the
//!   prompt blocks it likely holds; capacity probes and active health
//!   checks, which its pools start), re-exported here under the old
//!   module names with the instant and random helpers it shares;
//! - `tracked_body`: a streamed answer on its way to the client, its
//!   completion run once, its deadline enforced even when the client stops
//!   reading;
//! - `forward`, `upstream`, `resolver`, `hop_by_hop`, `request_headers`:
//!   the upstream client, a crate of its own ([`router_upstream`]:
//!   connect, TLS, the per-worker pool, URIs, forwarded and hop-by-hop
//!   headers, body reads), re-exported here under its old module names;
//! - `route_log` (the request's record around `router_route_log`'s
//!   line), `metrics`, [`telemetry`]: what the proxy tells operators;
//! - `reload`: standalone mode's policy file watcher; `state_log`: the
//!   periodic backend-state log line;
//! - [`managed`]: managed mode's control-plane stream and its cache;
//! - `settings`, `error`: environment and typed errors;
//! - `fuzzing` (the non-default `fuzzing` feature): entry points for
//!   `fuzz/`; not an API.
//!
//! The request and answer fields read from JSON bodies come from the
//! `router-json-peek` crate ([`router_json_peek`]), the logging set-up and
//! signal wait from `router-process`.
//!
//! [`start`] runs a proxy in-process (what `main` and the tests do).

#![forbid(unsafe_code)]

// The upstream client's modules, under the names the proxy uses.
use router_upstream::client as upstream;
use router_upstream::{forward, hop_by_hop, request_headers};
// Pools and their endpoints, and the helpers the proxy shares with them.
use router_endpoints::{clock, pool, random};
// What is kept in this process or in the shared store.
use router_shared_state::{idempotency, prefix_share, rate_limit, spend, store_epoch};

mod admin;
mod balance_workers;
mod config;
mod error;
/// Entry points for `fuzz/`; not an API (the `fuzzing` feature).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod handler;
mod key_use;
mod limits;
mod listener_tls;
pub mod managed;
mod metrics;
mod ramp_tally;
mod reload;
mod route_log;
mod settings;
mod state_log;
mod stop_signal;
mod tasks;
pub mod telemetry;
mod tracked_body;

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use hyper::service::service_fn;
use std::future::Future;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use router_policy::Policy;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub use crate::balance_workers::ConnectionBalance;
pub use crate::config::ConfigStore;
pub use crate::error::{Forbidden, ProxyError, Unauthorized};
use crate::forward::UpstreamClient;
use crate::metrics::Metrics;
use crate::route_log::RouteLog;
pub use crate::settings::{Settings, SettingsError, SharedStore, TlsFiles};

/// Where the proxy's policy comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// One pool named `default`, filled by `set-backends`.
    Sidecar,
    /// A policy file, watched and reloaded.
    Standalone {
        /// The file.
        policy: PathBuf,
    },
    /// A policy given in-process (embedders, `routerctl drill`); changed
    /// through [`RunningProxy::config`].
    Inline(Box<Policy>),
    /// Config streamed from the control plane.
    Managed(managed::ManagedOptions),
}

/// What [`start`] needs.
pub struct ProxyOptions {
    /// Environment settings.
    pub settings: Settings,
    /// Policy source.
    pub mode: Mode,
    /// Where route decision lines go (stdout in production).
    pub route_log: Box<dyn Write + Send>,
}

/// Errors that stop the proxy from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The policy file cannot be used.
    #[error(transparent)]
    Policy(#[from] reload::PolicyFileError),
    /// The listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The upstream client could not be built.
    #[error(transparent)]
    Client(#[from] forward::ClientError),
    /// The listener's certificate or key (`CUSTOM_ROUTER_TLS_CERT_FILE`,
    /// `CUSTOM_ROUTER_TLS_KEY_FILE`) cannot be used.
    #[error("{var}: {reason}")]
    Tls {
        /// The variable naming the file at fault.
        var: &'static str,
        /// Why.
        reason: String,
    },
    /// Another I/O failure at startup.
    #[error("startup: {0}")]
    Io(#[from] std::io::Error),
    /// The shared store (`CUSTOM_ROUTER_SHARED_STORE`) cannot be used.
    #[error("CUSTOM_ROUTER_SHARED_STORE: {0}")]
    SharedStore(String),
    /// The parked tasks' file (`CUSTOM_ROUTER_TASKS_FILE`) cannot be read.
    #[error("CUSTOM_ROUTER_TASKS_FILE: {0}")]
    Tasks(#[from] router_shared_state::tasks::OpenError),
    /// A token (`CUSTOM_ROUTER_ADMIN_TOKEN`, `ROUTER_TOKEN`) cannot be
    /// used; the error names it, never shows it.
    #[error(transparent)]
    Token(#[from] router_proto::token::TokenError),
}

/// State shared by every request.
pub(crate) struct Shared {
    /// Environment settings.
    pub(crate) settings: Settings,
    /// The current config.
    pub(crate) config: Arc<ConfigStore>,
    /// Metrics registry.
    pub(crate) metrics: Arc<Metrics>,
    /// Route decision log.
    pub(crate) route_log: RouteLog,
    /// Upstream HTTP client.
    pub(crate) client: UpstreamClient,
    /// `Idempotency-Key` requests in flight and recent answers: the
    /// shared store, or this process's own.
    pub(crate) idempotency: Arc<idempotency::Keys>,
    /// The response cache's entries (`router_policy::cache`).
    pub(crate) cache: Arc<idempotency::Keys>,
    /// Tenants' rate limits: the shared store's, or this process's own.
    pub(crate) rate_limits: Arc<rate_limit::RateLimits>,
    /// Tenants' spend counters: the shared store's, or this process's own.
    pub(crate) spend: Arc<spend::SpendBudgets>,
    /// Tenants' hourly rollups, written to the shared store as requests
    /// settle (none without a shared store).
    pub(crate) rollups: Option<router_shared_state::rollup::Rollups>,
    /// Parked tasks (`on_all_down: park`): the shared store's, or this
    /// process's own.
    pub(crate) tasks: Arc<tasks::Tasks>,
    /// Request bytes held by all requests together, under a cap.
    pub(crate) buffered: Arc<limits::ByteBudget>,
    /// Open client connections, under a cap in all and one per peer.
    pub(crate) connections: Arc<limits::ConnectionSlots>,
    /// Who may call the admin endpoints.
    pub(crate) admin: admin::AdminAccess,
    /// Managed mode: whether a config has been applied yet (health answers
    /// 503 until then). `None` in the other modes, which start configured.
    pub(crate) readiness: Option<Arc<managed::Readiness>>,
    /// Set when draining: health answers 503 so load balancers move on.
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// Stored tenant keys used since the last heartbeat (managed mode).
    pub(crate) key_use: Arc<key_use::KeyUse>,
    /// Asks every connection to finish gracefully.
    stops: stop_signal::StopSignals,
    /// The listener's TLS (`CUSTOM_ROUTER_TLS_CERT_FILE`); `None`:
    /// plaintext.
    pub(crate) tls: Option<listener_tls::ListenerTls>,
}

/// A proxy running in this process.
pub struct RunningProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    /// One per worker thread, closed when its last connection is done.
    workers_done: Vec<tokio::sync::oneshot::Receiver<()>>,
}

impl RunningProxy {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Who may call its admin endpoints, in a sentence for the startup
    /// log.
    pub fn admin_access(&self) -> String {
        self.shared.admin.describe()
    }

    /// Whether its shared store (`CUSTOM_ROUTER_SHARED_STORE`), if it has
    /// one, has been connected to (the first connection is made in the
    /// background; true without a shared store).
    pub fn shared_store_connected(&self) -> bool {
        self.shared.idempotency.connected()
    }

    /// Its config store (to inspect or change in tests and embedders).
    pub fn config(&self) -> &Arc<ConfigStore> {
        &self.shared.config
    }

    /// Stops accepting connections and background tasks.
    pub fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
    }

    /// Drains: health turns 503, no new connections are accepted, every
    /// open connection finishes the request it is serving (keep-alive is
    /// turned off), then the proxy stops. Waits at most `timeout`; returns
    /// true when everything finished in time.
    pub async fn drain(mut self, timeout: std::time::Duration) -> bool {
        self.shared
            .draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // The accept loop owns the hand-off channels: stopping it lets each
        // worker finish once its connections are done.
        if let Some(accept) = self.tasks.first() {
            accept.abort();
        }
        self.shared.stops.stop_all();
        let done = futures_util::future::join_all(std::mem::take(&mut self.workers_done));
        let finished = tokio::time::timeout(timeout, done).await.is_ok();
        for t in &self.tasks {
            t.abort();
        }
        finished
    }
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts a proxy: loads the policy, binds, and serves in background tasks.
pub async fn start(options: ProxyOptions) -> Result<RunningProxy, StartError> {
    let ProxyOptions {
        settings,
        mode,
        route_log,
    } = options;
    let metrics = Arc::new(Metrics::new());
    let (policy, origin, watched) = match &mode {
        Mode::Sidecar => (
            Policy::sidecar(settings.queue, settings.max_concurrency),
            "sidecar",
            None,
        ),
        Mode::Standalone { policy } => {
            let (p, bytes) = reload::load_policy_file(policy, &settings.queue, &settings.guards)?;
            (p, "file", Some((policy.clone(), bytes)))
        }
        Mode::Inline(policy) => ((**policy).clone(), "inline", None),
        // Until the control plane (or the cache) says otherwise: the
        // sidecar's empty default pool.
        Mode::Managed(_) => (
            Policy::sidecar(settings.queue, settings.max_concurrency),
            config::BOOT_ORIGIN,
            None,
        ),
    };
    let admin_mode = match &mode {
        Mode::Sidecar => admin::AdminMode::Sidecar,
        Mode::Standalone { .. } | Mode::Inline(_) => admin::AdminMode::Local,
        Mode::Managed(_) => admin::AdminMode::Managed,
    };
    let admin = admin::AdminAccess::new(
        admin_mode,
        settings.admin_token.as_deref(),
        settings.metrics_token.as_deref(),
    )?;
    // Built before anything runs: a token that cannot be presented stops
    // the start instead of leaving the proxy unauthenticated.
    let control_plane_token = match &mode {
        Mode::Managed(m) => router_proto::BearerToken::new(m.token.as_deref(), "ROUTER_TOKEN")?,
        _ => router_proto::BearerToken::default(),
    };
    let tls = match &settings.tls {
        None => None,
        Some(files) => {
            let (tls, stamp) =
                listener_tls::ListenerTls::load(files).map_err(|e| StartError::Tls {
                    var: e.var,
                    reason: e.reason,
                })?;
            Some((files.clone(), tls, stamp))
        }
    };
    let client = forward::build_client(&settings.client_config())?;
    let (events_tx, events_rx) = tokio::sync::mpsc::channel(256);
    let managed = matches!(mode, Mode::Managed(_));
    let config = Arc::new(ConfigStore::new(
        policy,
        origin,
        Arc::clone(&metrics),
        Some(client.clone()),
        managed.then_some(events_tx),
    ));
    let addr = SocketAddr::new(settings.bind, settings.port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let addr = listener.local_addr()?;
    let redis = match &settings.shared_store {
        None => None,
        Some(s) => {
            let client = s
                .client()
                .map_err(|e| StartError::SharedStore(e.to_string()))?;
            tracing::info!(
                store = s.shown(),
                "idempotency keys and tenants' rate limits in the shared store"
            );
            // Prefix-affinity placements reach the other proxies over the
            // same server's publish/subscribe.
            let target =
                Arc::downgrade(&config) as std::sync::Weak<dyn prefix_share::PlacementTarget>;
            if let Some(share) =
                prefix_share::PrefixShare::new(client.clone(), "router:prefix".into(), target)
            {
                config.share_prefixes(share);
            }
            Some(Arc::new(router_shared_state::RedisStore::connect(
                client,
                router_shared_state::PREFIX.into(),
            )))
        }
    };
    let rate_limits = Arc::new(match &redis {
        Some(r) => rate_limit::RateLimits::Shared(Arc::clone(r)),
        None => rate_limit::RateLimits::local(),
    });
    let spend = Arc::new(match &redis {
        Some(r) => spend::SpendBudgets::Shared(Arc::clone(r)),
        None => spend::SpendBudgets::local(),
    });
    let task_store: Arc<dyn tasks::TaskStore> = match &redis {
        Some(r) => Arc::new(router_shared_state::tasks::RedisTasks::new(Arc::clone(r))),
        None => Arc::new(router_shared_state::tasks::LocalTasks::open(
            settings.tasks_file.clone(),
        )?),
    };
    let parked = Arc::new(tasks::Tasks::new(
        task_store,
        Arc::clone(&metrics),
        settings.task_lease,
        settings.park_max_bytes,
    ));
    let rollups = redis.as_ref().map(|r| {
        router_shared_state::rollup::Rollups::spawn(
            Arc::clone(r),
            Arc::clone(&metrics) as Arc<dyn router_shared_state::StoreEvents>,
        )
    });
    // The response cache: the same store, its entries under `cache:`
    // (never a client's `Idempotency-Key`), and a local store of its own.
    let cache = Arc::new(idempotency::Keys::new(
        redis.as_ref().map(|r| {
            Arc::new(r.namespaced(router_shared_state::CACHE_NAMESPACE))
                as Arc<dyn idempotency::IdempotencyStore>
        }),
        router_policy::cache::CacheSettings::MAX_TTL,
        router_policy::cache::CacheSettings::MAX_ENTRY_BYTES,
        (1_000_000, settings.cache_max_bytes),
        Arc::new(metrics::CacheEvents(Arc::clone(&metrics)))
            as Arc<dyn router_shared_state::StoreEvents>,
    ));
    config.purges_cache_of(Arc::clone(&cache));
    // Watched for a loss of its data once the proxy is up (below).
    let epoch_store = redis.clone();
    let shared_store = redis.map(|r| r as Arc<dyn idempotency::IdempotencyStore>);
    let keys = Arc::new(idempotency::Keys::new(
        shared_store,
        settings.idempotency_ttl,
        settings.idempotency_max_answer_bytes,
        (
            settings.idempotency_max_keys,
            settings.idempotency_max_bytes,
        ),
        Arc::clone(&metrics) as Arc<dyn router_shared_state::StoreEvents>,
    ));
    let (settings_buffered, settings_connections, settings_per_peer) = (
        settings.max_buffered_bytes,
        settings.max_connections,
        settings.connections_per_peer(),
    );
    // The last route records, for the console: managed proxies only (the
    // control plane asks for them over the config stream).
    let decisions = (managed && settings.decision_ring > 0).then(|| {
        Arc::new(router_route_log::ring::DecisionRing::new(
            settings.decision_ring,
        ))
    });
    let shared = Arc::new(Shared {
        route_log: RouteLog::spawn_with_ring(
            route_log,
            {
                let metrics = Arc::clone(&metrics);
                move || metrics.route_log_dropped()
            },
            decisions.clone(),
        )?,
        settings,
        config: Arc::clone(&config),
        metrics,
        client,
        readiness: managed.then(|| Arc::new(managed::Readiness::default())),
        draining: std::sync::atomic::AtomicBool::new(false),
        stops: stop_signal::StopSignals::default(),
        key_use: Arc::default(),
        admin,
        idempotency: keys,
        cache,
        rate_limits,
        spend,
        rollups,
        tasks: Arc::clone(&parked),
        buffered: limits::ByteBudget::new(settings_buffered),
        connections: limits::ConnectionSlots::new(settings_connections, settings_per_peer),
        tls: tls.as_ref().map(|(_, t, _)| t.clone()),
    });

    let workers = match shared.settings.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let (handoffs, workers_done) = start_workers(&shared, workers)?;
    let mut tasks = vec![tokio::spawn(accept_loop(
        listener,
        Arc::clone(&shared),
        handoffs,
    ))];
    if let Some((path, bytes)) = watched {
        tasks.push(tokio::spawn(reload::watch_policy_file(
            path,
            Arc::clone(&config),
            shared.settings.queue,
            shared.settings.guards.clone(),
            shared.settings.policy_poll_interval,
            bytes,
        )));
    }
    if let Some((files, tls, stamp)) = tls {
        tasks.push(tokio::spawn(listener_tls::watch(
            files,
            tls,
            shared.settings.tls_poll_interval,
            stamp,
        )));
    }
    tasks.push(tokio::spawn(state_log::state_log(Arc::clone(&shared))));
    if let Some(store) = epoch_store {
        tasks.push(tokio::spawn(store_epoch::watch(
            store,
            Arc::clone(&shared.metrics) as Arc<dyn router_shared_state::StoreEvents>,
            shared.settings.shared_store_check,
        )));
    }
    // Parked tasks run through this proxy's own listener, over loopback
    // when it listens on every address.
    let own = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    };
    tasks.push(tokio::spawn(tasks::dispatch::run(
        Arc::clone(&shared),
        parked,
        own,
    )));
    if let Mode::Managed(options) = mode {
        let applied = options
            .cache_dir
            .as_deref()
            .and_then(|dir| {
                managed::apply_cache(
                    &config,
                    dir,
                    &shared.settings.queue,
                    &shared.settings.guards,
                )
            })
            .unwrap_or_default();
        let context = managed::StreamContext {
            options,
            token: control_plane_token,
            store: Arc::clone(&config),
            defaults: shared.settings.queue,
            guards: shared.settings.guards.clone(),
            readiness: shared.readiness.clone().unwrap_or_default(),
            key_use: Arc::clone(&shared.key_use),
            decisions,
        };
        tasks.push(tokio::spawn(managed::run(context, events_rx, applied)));
    }
    Ok(RunningProxy {
        addr,
        shared,
        tasks,
        workers_done,
    })
}

/// An accepted connection on its way to a worker: the socket, its peer,
/// and its place under the connection cap.
type Accepted = (std::net::TcpStream, SocketAddr, limits::ConnectionSlot);

/// A connection-serving worker thread, as the accept loop sees it.
struct Worker {
    /// Accepted connections handed to the worker.
    handoff: tokio::sync::mpsc::Sender<Accepted>,
    /// Its runtime's counters (busy time, for connection placement).
    metrics: tokio::runtime::RuntimeMetrics,
}

/// Starts the connection-serving workers: one thread each, each with its
/// own single-threaded runtime and upstream client. A connection (and every
/// request on it, and the upstream connections those use) lives on one
/// thread, so a request never wakes another thread: the multi-threaded
/// scheduler's cross-thread wake-ups were the proxy's largest cost beyond
/// nginx's (see docs/benchmarks.md). Returns the hand-off channels.
fn start_workers(
    shared: &Arc<Shared>,
    n: usize,
) -> Result<(Vec<Worker>, Vec<tokio::sync::oneshot::Receiver<()>>), StartError> {
    let mut workers = Vec::with_capacity(n);
    let mut dones = Vec::with_capacity(n);
    for i in 0..n {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        dones.push(done_rx);
        // Bounded: a worker that cannot keep up makes the accept loop
        // refuse connections instead of queueing them without limit.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Accepted>(1024);
        let shared = Arc::clone(shared);
        let client = forward::build_client(&shared.settings.client_config())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let metrics = runtime.metrics();
        std::thread::Builder::new()
            .name(format!("router-worker-{i}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let mut connections = tokio::task::JoinSet::new();
                    loop {
                        tokio::select! {
                            next = rx.recv() => match next {
                                Some((std_stream, remote, slot)) => match TcpStream::from_std(std_stream) {
                                    Ok(stream) => {
                                        connections.spawn(serve_connection(
                                            Arc::clone(&shared),
                                            client.clone(),
                                            stream,
                                            remote,
                                            slot,
                                        ));
                                    }
                                    Err(e) => tracing::debug!(%remote, error = %e, "cannot adopt a connection"),
                                },
                                None => break,
                            },
                            Some(_) = connections.join_next(), if !connections.is_empty() => {}
                        }
                    }
                    // No more connections will come: let these finish.
                    while connections.join_next().await.is_some() {}
                    let _ = done_tx.send(());
                });
            })?;
        workers.push(Worker {
            handoff: tx,
            metrics,
        });
    }
    Ok((workers, dones))
}

/// Serves one client connection; its requests' attempts use `client`, the
/// upstream connection pool of the thread it runs on. `_slot` holds its
/// place under the connection cap until it is done.
///
/// Plaintext: HTTP/1.1, or h2c when the client opens with the HTTP/2
/// preface (prior knowledge), told apart by the first bytes. TLS: the
/// version the client chose by ALPN (`h2`, else HTTP/1.1). Either way,
/// from the accept to the first request's head (the TLS handshake and the
/// HTTP/2 preface included) at most `CUSTOM_ROUTER_CLIENT_HEADER_TIMEOUT`:
/// a client that never finishes its handshake holds its slot, counted
/// against its peer's cap, no longer than one that never sends a head.
async fn serve_connection(
    shared: Arc<Shared>,
    client: UpstreamClient,
    stream: TcpStream,
    remote: SocketAddr,
    _slot: limits::ConnectionSlot,
) {
    let _ = stream.set_nodelay(true);
    let first_head_by = tokio::time::Instant::now() + shared.settings.client_header_timeout;
    let stop = shared.stops.register();
    let Some(tls) = shared.tls.clone() else {
        let version = limits::Version::Sniff;
        serve_http(shared, client, stream, remote, version, first_head_by, stop).await;
        return;
    };
    let handshake = tokio::time::timeout_at(first_head_by, tls.acceptor.accept(stream));
    tokio::pin!(handshake);
    // A drain does not wait for a handshake.
    let done = std::future::poll_fn(|cx| {
        if stop.poll_stopped(cx) {
            return std::task::Poll::Ready(None);
        }
        std::future::Future::poll(handshake.as_mut(), cx).map(Some)
    })
    .await;
    match done {
        Some(Ok(Ok(stream))) => {
            let version = match stream.get_ref().1.alpn_protocol() {
                Some(b"h2") => limits::Version::Http2,
                _ => limits::Version::Http1,
            };
            serve_http(shared, client, stream, remote, version, first_head_by, stop).await;
        }
        Some(Ok(Err(e))) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
        Some(Err(_)) => {
            tracing::debug!(%remote, "TLS handshake not finished within the header timeout")
        }
        None => {}
    }
}

/// Serves HTTP on a connection (after the TLS handshake, if any) until it
/// ends, `stop` asks it to finish (a drain: HTTP/1.1 closes after the
/// request in progress, HTTP/2 sends GOAWAY and finishes its open
/// streams), or no request head arrived by `first_head_by`.
async fn serve_http<S>(
    shared: Arc<Shared>,
    client: UpstreamClient,
    stream: S,
    remote: SocketAddr,
    version: limits::Version,
    first_head_by: tokio::time::Instant,
    stop: Arc<stop_signal::StopSignal>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // The head being read is counted in the buffered bytes (see `limits`).
    let meter = limits::HeadMeter::new(&shared.buffered, shared.settings.max_header_bytes);
    let stream = limits::Metered::new(stream, Arc::clone(&meter), version);
    let svc_shared = Arc::clone(&shared);
    let heads = Arc::clone(&meter);
    // The peer reaches the handler twice: as the X-Forwarded-For value
    // passed upstream, and as the address the admin doors check.
    let peer = remote.ip();
    let client_ip = forward::client_ip_header(peer);
    let service = service_fn(move |req| {
        let shared = Arc::clone(&svc_shared);
        let client_ip = client_ip.clone();
        let client = client.clone();
        meter.head_done();
        let meter = Arc::clone(&meter);
        // A combinator, not an `async` block: the block would keep its own
        // copies of the arguments beside the handler's future.
        futures_util::FutureExt::map(
            handler::handle(shared, client, peer, client_ip, req),
            move |answer| {
                meter.expect_head();
                Ok::<_, Infallible>(answer)
            },
        )
    });
    let head_cap = shared.settings.max_header_bytes;
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(shared.settings.client_header_timeout)
        // A head past the cap (the read buffer full without a complete
        // head) is answered 431 and the connection closed; the read
        // buffer never grows past it (hyper's default is about 400 KiB a
        // connection).
        .max_buf_size(head_cap.max(settings::MIN_HEADER_BYTES))
        .keep_alive(true)
        // Head and body copied into one buffer, one plain write: for the
        // small JSON answers that dominate, cheaper than queueing both for
        // a vectored write.
        .writev(false);
    builder
        .http2()
        .timer(TokioTimer::new())
        // One connection holds at most this many requests at once.
        .max_concurrent_streams(shared.settings.h2_max_concurrent_streams)
        // A header list past the cap: the stream is answered 431 (the
        // connection stays open for the others).
        .max_header_list_size(u32::try_from(head_cap).unwrap_or(u32::MAX))
        // HTTP/2's own default windows (64 KiB) instead of hyper's 1 MiB:
        // request bytes the proxy has not read yet (and so not counted
        // in the buffered bytes) stay within 64 KiB a connection, as an
        // HTTP/1.1 connection's read buffer.
        .initial_stream_window_size(H2_WINDOW)
        .initial_connection_window_size(H2_WINDOW)
        .adaptive_window(false)
        // Answer bytes queued for a client that reads slowly: a share per
        // stream of one connection's allowance.
        .max_send_buf_size(h2_send_buffer(shared.settings.h2_max_concurrent_streams));
    let builder = match version {
        limits::Version::Sniff => builder,
        limits::Version::Http1 => builder.http1_only(),
        limits::Version::Http2 => builder.http2_only(),
    };
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let no_head = tokio::time::sleep_until(first_head_by);
    tokio::pin!(no_head);
    let mut stopping = false;
    let result = std::future::poll_fn(|cx| {
        if !stopping && stop.poll_stopped(cx) {
            // Finish the requests in progress, then close.
            conn.as_mut().graceful_shutdown();
            stopping = true;
        }
        if !heads.any_head() && no_head.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Ok(()));
        }
        std::future::Future::poll(conn.as_mut(), cx)
    })
    .await;
    if let Err(e) = result {
        tracing::debug!(%remote, error = %e, "client connection ended with an error");
    }
}

/// HTTP/2 flow-control windows of the listener, the connection's and each
/// stream's: RFC 9113's initial 65,535 bytes.
const H2_WINDOW: u32 = 65_535;

/// Answer bytes hyper may queue for a slow reader on one HTTP/2
/// connection, all its streams together: each stream's send buffer is
/// this divided by the streams allowed at once, at least 4 KiB: 64 KiB a
/// connection up to 16 streams, 4 KiB a stream beyond (400 KiB at the
/// default cap of 100), instead of hyper's 400 KiB a stream.
const H2_SEND_BYTES_PER_CONNECTION: usize = 64 * 1024;

/// The per-stream send buffer for `streams` streams at once.
fn h2_send_buffer(streams: u32) -> usize {
    (H2_SEND_BYTES_PER_CONNECTION / usize::try_from(streams.max(1)).unwrap_or(1)).max(4096)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, workers: Vec<Worker>) {
    let mut chooser =
        balance_workers::WorkerChooser::new(shared.settings.connection_balance, workers.len());
    let mut totals = Vec::with_capacity(workers.len());
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: back off briefly
                // instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match shared.connections.try_open(remote.ip()) {
            Ok(slot) => slot,
            // Over TLS a plaintext answer would be garbage to the client:
            // the connection is closed unanswered.
            Err(_) if shared.tls.is_some() => continue,
            Err(refused) => {
                tokio::spawn(refuse_overloaded(stream, refused.answer()));
                continue;
            }
        };
        if workers.is_empty() {
            let client = shared.client.clone();
            tokio::spawn(serve_connection(
                Arc::clone(&shared),
                client,
                stream,
                remote,
                slot,
            ));
            continue;
        }
        // Placed per connection, not per request (see `balance_workers`).
        let now = tokio::time::Instant::now();
        if chooser.sample_due(now) {
            totals.clear();
            totals.extend(
                workers
                    .iter()
                    .map(|w| w.metrics.worker_total_busy_duration(0)),
            );
            chooser.sample(now, &totals);
        }
        let Some(worker) = workers.get(chooser.choose()) else {
            continue;
        };
        match stream.into_std() {
            Ok(s) => {
                if worker.handoff.try_send((s, remote, slot)).is_err() {
                    tracing::warn!(%remote, "worker saturated; connection refused");
                }
            }
            Err(e) => tracing::debug!(%remote, error = %e, "cannot hand off a connection"),
        }
    }
}

/// Answers a connection past the cap (or its peer's) with a canned
/// `503 overloaded` (`answer`) and closes it, reading (and dropping) what
/// the client sends for a moment first so that it sees the answer rather
/// than a reset. Bounded: 1 s and 64 KiB.
async fn refuse_overloaded(mut stream: TcpStream, answer: &'static [u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let wait = std::time::Duration::from_secs(1);
    let _ = tokio::time::timeout(wait, async {
        stream.write_all(answer).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut read = 0usize;
        while read < 64 * 1024 {
            match stream.read(&mut sink).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}
