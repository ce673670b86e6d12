//! The running mock: [`MockModel`], the handle a test or `routerctl` holds,
//! the state it shares with every request ([`Shared`]), and the accept loop
//! that owns the connections, so that stopping the mock closes them all.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::header::HeaderValue;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use crate::answer::handle;
use crate::engine::EngineConfig;
use crate::engine_http::EngineDriver;
use crate::HealthMode;
use crate::{Behavior, Generation, MockConfig, MockStats, OverCap, ReceivedRequest};

/// A running mock model endpoint. Dropping it shuts the server down in the
/// background; [`MockModel::stop`] does so and waits until it is done.
pub struct MockModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Tells the server task to stop (dropping it: at once).
    shutdown: oneshot::Sender<Stop>,
    server: JoinHandle<bool>,
}

impl fmt::Debug for MockModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockModel")
            .field("name", &self.shared.name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MockModel {
    /// Starts a mock on `127.0.0.1` with a port picked by the system.
    pub async fn start(config: MockConfig) -> io::Result<MockModel> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), config).await
    }

    /// Starts a mock listening on `addr`.
    ///
    /// Fails if the address cannot be bound or if the name is not a valid
    /// header value.
    pub async fn start_on(addr: SocketAddr, config: MockConfig) -> io::Result<MockModel> {
        let name_header = HeaderValue::from_str(&config.name).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("mock name {:?} is not a valid header value", config.name),
            )
        })?;
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            slots: config
                .max_concurrency
                .map(|cap| Arc::new(Semaphore::new(cap))),
            over_cap: config.over_cap,
            live: Mutex::new(Live {
                behavior: config.behavior,
                latency: config.latency,
                health: HealthMode::Ok,
                request_id: None,
                quota: None,
            }),
            health_hits: AtomicU64::new(0),
            name: config.name,
            name_header,
            stats: Mutex::new(MockStats::default()),
            requests: Mutex::new(Vec::new()),
            generations: Mutex::new(Vec::new()),
            pages: Mutex::new(HashMap::new()),
            page_hits: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            engine: Mutex::new(None),
            prompt_cache: Mutex::default(),
            quota_book: Mutex::default(),
        });
        let (shutdown, shutdown_rx) = oneshot::channel();
        let server = tokio::spawn(serve(listener, Arc::clone(&shared), shutdown_rx));
        Ok(MockModel {
            addr,
            shared,
            shutdown,
            server,
        })
    }

    /// The address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `host:port`, e.g. `127.0.0.1:40123`.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// The configured name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Switches the behavior for requests received from now on (requests
    /// already received keep the behavior they arrived with).
    pub fn set_behavior(&self, behavior: Behavior) {
        lock(&self.shared.live).behavior = behavior;
    }

    /// Switches the latency for requests received from now on.
    pub fn set_latency(&self, latency: Duration) {
        lock(&self.shared.live).latency = latency;
    }

    /// From now on, each key has a rate limit and every answer says what is
    /// left of it (see [`crate::quota`]); `None`: no limit, no headers.
    pub fn set_quota(&self, quota: Option<crate::QuotaMock>) {
        lock(&self.shared.live).quota = quota;
    }

    /// What each key was given under [`Self::set_quota`].
    pub fn quota_counts(&self) -> crate::QuotaCounts {
        lock(&self.shared.quota_book).counts.clone()
    }

    /// Switches how the health pages (`GET /health`, `/api/tags`,
    /// `/v1/models`) answer from now on.
    pub fn set_health(&self, health: HealthMode) {
        lock(&self.shared.live).health = health;
    }

    /// Answers from now on carry `x-request-id: id`, as a provider's do
    /// (`None`: none, the default). Fails if `id` is not a valid header
    /// value.
    pub fn set_request_id(&self, id: Option<&str>) -> io::Result<()> {
        let value = id
            .map(HeaderValue::from_str)
            .transpose()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a header value"))?;
        lock(&self.shared.live).request_id = value;
        Ok(())
    }

    /// How many health page requests arrived (answered or not).
    pub fn health_hits(&self) -> u64 {
        self.shared
            .health_hits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> MockStats {
        *lock(&self.shared.stats)
    }

    /// Serves `body` with `status` for `GET path` (not recorded, and not
    /// counted in [`MockModel::stats`]; see [`MockModel::page_hits`]), e.g.
    /// Ollama's `/api/ps` or vLLM's `/metrics` for capacity probes.
    pub fn set_page(&self, path: &str, status: u16, body: &str) {
        lock(&self.shared.pages).insert(path.to_string(), (status, body.to_string()));
    }

    /// How many `GET path` requests were answered with a page set by
    /// [`MockModel::set_page`] (whatever its status), e.g. how many times a
    /// capacity probe has polled.
    pub fn page_hits(&self, path: &str) -> u64 {
        lock(&self.shared.page_hits).get(path).copied().unwrap_or(0)
    }

    /// Every answer produced in full so far, in order.
    pub fn generations(&self) -> Vec<Generation> {
        lock(&self.shared.generations).clone()
    }

    /// Every request received so far (health checks excluded), in order.
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Closes the listener and every live connection, then returns. Requests
    /// that were being answered count as cancelled.
    pub async fn stop(self) {
        let MockModel {
            shutdown, server, ..
        } = self;
        drop(shutdown);
        // The server task never panics; a JoinError could only mean the
        // runtime is shutting down, and then there is nothing left to wait for.
        let _ = server.await;
    }

    /// Stops as a server does on SIGTERM: closes the listener, lets every
    /// request being answered finish (idle keep-alive connections are
    /// closed, busy ones after their answer), waiting at most `timeout`,
    /// then closes what is left. Returns whether everything finished.
    pub async fn drain(self, timeout: Duration) -> bool {
        let MockModel {
            shutdown, server, ..
        } = self;
        let _ = shutdown.send(Stop::Drain(timeout));
        server.await.unwrap_or(false)
    }
}

/// State shared by the handle, the server task and every request.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) name_header: HeaderValue,
    /// Concurrency slots, when capped.
    pub(crate) slots: Option<Arc<Semaphore>>,
    pub(crate) over_cap: OverCap,
    pub(crate) live: Mutex<Live>,
    pub(crate) stats: Mutex<MockStats>,
    pub(crate) requests: Mutex<Vec<ReceivedRequest>>,
    pub(crate) generations: Mutex<Vec<Generation>>,
    /// Fixed answers to `GET` paths (capacity probes: `/api/ps`, `/metrics`).
    pub(crate) pages: Mutex<HashMap<String, (u16, String)>>,
    /// How many times each page was served.
    pub(crate) page_hits: Mutex<HashMap<String, u64>>,
    /// Health page requests.
    pub(crate) health_hits: AtomicU64,
    /// Numbers the `chatcmpl-<n>` ids.
    pub(crate) next_id: AtomicU64,
    /// The simulated engine, started by the first use of
    /// [`Behavior::Engine`].
    pub(crate) engine: Mutex<Option<Arc<EngineDriver>>>,
    /// [`Behavior::Anthropic`]'s prompt cache.
    pub(crate) prompt_cache: Mutex<crate::prompt_cache::PromptCache>,
    /// The per-key windows of [`MockModel::set_quota`].
    pub(crate) quota_book: Mutex<crate::quota::QuotaBook>,
}

impl Shared {
    /// The simulated engine with `config`: the running one, or a new one if
    /// none runs yet or it has another configuration (the old one finishes
    /// the requests it has).
    pub(crate) fn engine(&self, config: &EngineConfig) -> Arc<EngineDriver> {
        let mut engine = lock(&self.engine);
        match &*engine {
            Some(driver) if driver.config == *config => Arc::clone(driver),
            _ => {
                let driver = Arc::new(EngineDriver::start(config.clone()));
                *engine = Some(Arc::clone(&driver));
                driver
            }
        }
    }
}

/// The settings that can change while the mock runs.
pub(crate) struct Live {
    pub(crate) behavior: Behavior,
    pub(crate) latency: Duration,
    pub(crate) health: HealthMode,
    /// The `x-request-id` every answer carries, as a provider's does
    /// (OpenAI's `req_...`); `None`: no such header.
    pub(crate) request_id: Option<HeaderValue>,
    /// A per-key rate limit, and its headers on every answer.
    pub(crate) quota: Option<crate::quota::QuotaMock>,
}

/// Locks a mutex, ignoring poisoning (the data stays consistent: every
/// critical section is a few plain assignments).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How the server task is told to stop.
enum Stop {
    /// Finish the requests being answered, waiting at most this long.
    Drain(Duration),
}

/// Accepts connections until `shutdown` fires (or its sender is dropped),
/// then closes the listener and, for a drain, lets the connections finish
/// what they are answering; then drops every connection left. Returns
/// whether every connection finished by itself.
async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: oneshot::Receiver<Stop>,
) -> bool {
    let mut connections = JoinSet::new();
    let (draining, drain_rx) = tokio::sync::watch::channel(false);
    let stop = loop {
        tokio::select! {
            stop = &mut shutdown => break stop.ok(),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    lock(&shared.stats).connections += 1;
                    connections.spawn(serve_connection(stream, Arc::clone(&shared), drain_rx.clone()));
                }
                // E.g. out of file descriptors: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reap finished connections so the set does not grow forever.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    };
    drop(listener);
    let mut drained = connections.is_empty();
    if let Some(Stop::Drain(timeout)) = stop {
        let _ = draining.send(true);
        drained = tokio::time::timeout(timeout, async {
            while connections.join_next().await.is_some() {}
        })
        .await
        .is_ok();
    }
    // Aborts every connection left and waits until each is dropped, which
    // drops the in-progress handlers and bodies (counted as cancelled).
    connections.shutdown().await;
    drained
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    mut draining: tokio::sync::watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| handle(Arc::clone(&shared), request));
    // Connection errors (client gone, malformed request) only end this
    // connection.
    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = draining.wait_for(|d| *d) => {}
    }
    // Draining: finish the request being answered (an idle connection
    // closes at once), then close.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}
