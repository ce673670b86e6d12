//! Process settings from the `CUSTOM_ROUTER_*` environment.
//!
//! The Hugging Face custom router is configured by six variables; we read
//! them with the same names and defaults, plus a few of our own. Every value
//! is checked: a bad one stops startup with an error that names the
//! variable, never a silent fallback to the default.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use router_policy::document::positive_duration;
use router_policy::guard::{ALLOW_BACKEND_HOSTS_VAR, API_KEY_ENV_ALLOW_VAR};
use router_policy::{ApprovalKey, EnvAllowList, Guards, HostAllowList, QueueSettings, Scoring};

/// A variable whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for {var}: {shown}: expected {expected}")]
pub struct SettingsError {
    /// The variable's name.
    pub var: &'static str,
    /// The value as given (quoted), or a placeholder for secrets.
    pub shown: String,
    /// What would have been accepted.
    pub expected: &'static str,
}

/// Everything the proxy process reads from its environment.
#[derive(Clone, PartialEq)]
pub struct Settings {
    /// Address to listen on (`CUSTOM_ROUTER_BIND`, default `0.0.0.0`).
    pub bind: IpAddr,
    /// Port (`CUSTOM_ROUTER_PORT`, default 3000).
    pub port: u16,
    /// Queue defaults for pools that do not set their own
    /// (`CUSTOM_ROUTER_QUEUE_MAX_SIZE`, `_QUEUE_TIMEOUT`,
    /// `_LATENCY_THRESHOLD`, `_EWMA_ALPHA`, `_SCORING`).
    pub queue: QueueSettings,
    /// Per-endpoint concurrency limit of the sidecar pool
    /// (`CUSTOM_ROUTER_MAX_CONCURRENCY`, default 0 = no limit, as Hugging Face).
    pub max_concurrency: Option<u32>,
    /// Interval of the backend-state log (`CUSTOM_ROUTER_STATE_LOG_INTERVAL`, 30 s).
    pub state_log_interval: Duration,
    /// Bearer token guarding the admin calls (`CUSTOM_ROUTER_ADMIN_TOKEN`).
    pub admin_token: Option<String>,
    /// Bearer token that opens `/metrics` to a scraper off loopback, and
    /// nothing else (`CUSTOM_ROUTER_METRICS_TOKEN`; sidecars serve metrics
    /// to anyone, as the Hugging Face contract does).
    pub metrics_token: Option<String>,
    /// The key signed approvals are checked with
    /// (`CUSTOM_ROUTER_APPROVAL_KEY`, at least 32 bytes): a route with
    /// `requires_approval` takes a request whose `X-Router-Approval` was
    /// minted with it (`routerctl approve`) for that route and request id.
    pub approval_key: Option<ApprovalKey>,
    /// Largest accepted request body (`CUSTOM_ROUTER_MAX_BODY_BYTES`, 32 MiB).
    pub max_body_bytes: usize,
    /// Time a client has to send its request headers
    /// (`CUSTOM_ROUTER_CLIENT_HEADER_TIMEOUT`, 30 s).
    pub client_header_timeout: Duration,
    /// Time a client has to send its request body
    /// (`CUSTOM_ROUTER_CLIENT_BODY_TIMEOUT`, 60 s).
    pub client_body_timeout: Duration,
    /// TCP connect timeout to backends (`CUSTOM_ROUTER_CONNECT_TIMEOUT`, 5 s).
    pub connect_timeout: Duration,
    /// Extra PEM roots trusted for HTTPS backends, beside the webpki roots
    /// (`CUSTOM_ROUTER_UPSTREAM_CA_FILE`).
    pub upstream_ca_file: Option<PathBuf>,
    /// How often the standalone policy file is checked for changes
    /// (`CUSTOM_ROUTER_POLICY_POLL_INTERVAL`, 1 s).
    pub policy_poll_interval: Duration,
    /// How long answers are kept for `Idempotency-Key` retries
    /// (`CUSTOM_ROUTER_IDEMPOTENCY_TTL`, 300 s).
    pub idempotency_ttl: Duration,
    /// Keys tracked at most (`CUSTOM_ROUTER_IDEMPOTENCY_MAX_KEYS`, 10000).
    pub idempotency_max_keys: usize,
    /// Largest answer (body, or a stream's frames) kept for replay
    /// (`CUSTOM_ROUTER_IDEMPOTENCY_MAX_ANSWER_BYTES`, 1 MiB); a retry of a
    /// larger one gets `409 not_replayable`.
    pub idempotency_max_answer_bytes: usize,
    /// Bytes the in-process store holds at most
    /// (`CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES`, 64 MiB): each entry counted
    /// as its key, its answer's own bytes and a constant of 320 bytes;
    /// past it the oldest finished entries go first. With the 256 MiB
    /// buffered-request cap it fits the shipped pod's 1 GiB limit.
    pub idempotency_max_bytes: usize,
    /// Bytes the in-process response cache holds at most
    /// (`CUSTOM_ROUTER_CACHE_MAX_BYTES`, 64 MiB), counted as the
    /// idempotency store counts its entries; past it the oldest entries go
    /// first. With a shared store, entries live there and this cache holds
    /// only those made while the store was down.
    pub cache_max_bytes: usize,
    /// The fleet's shared store (`CUSTOM_ROUTER_SHARED_STORE`,
    /// `redis://host:port/db` or `rediss://`; the password from the URL or
    /// `CUSTOM_ROUTER_SHARED_STORE_PASSWORD`). `None`: in-process keys.
    pub shared_store: Option<SharedStore>,
    /// How often a proxy with a shared store checks that the store still
    /// holds its data (one `SET NX GET` of the epoch marker; see
    /// `router_policy::store_epoch`): 5 s, and at once when the first
    /// connection is made. Not a variable: tests shorten it.
    pub shared_store_check: Duration,
    /// Without a shared store: the file where parked tasks
    /// (`on_all_down: park`) are kept (`CUSTOM_ROUTER_TASKS_FILE`); `None`:
    /// in memory only (lost when the proxy stops).
    pub tasks_file: Option<std::path::PathBuf>,
    /// How long a proxy's claim on a parked task holds without renewal
    /// (`CUSTOM_ROUTER_TASK_LEASE_MS`, 10000): a proxy that dies while
    /// running a task gives it up this long after its last renewal.
    pub task_lease: Duration,
    /// Bytes the parked tasks (`on_all_down: park`) hold at most, all
    /// routes together, in the store they are kept in: this process's
    /// memory (or `CUSTOM_ROUTER_TASKS_FILE`), or the shared store
    /// (`CUSTOM_ROUTER_PARK_MAX_BYTES`, 256 MiB). Past it, a request that
    /// would park gets `503 no_backend`.
    pub park_max_bytes: u64,
    /// Route records a managed proxy keeps in memory for the control
    /// plane's console (`CUSTOM_ROUTER_DECISION_RING`, 256; 0: none): the
    /// last N lines its route log wrote, each at most
    /// `router_route_log::ring::LINE_MAX` bytes.
    pub decision_ring: usize,
    /// Connection-serving threads (`CUSTOM_ROUTER_WORKERS`, 0 = one per core).
    pub workers: usize,
    /// How new connections are placed on those threads
    /// (`CUSTOM_ROUTER_CONNECTION_BALANCE`, `pack` or `spread`; `pack`).
    pub connection_balance: crate::balance_workers::ConnectionBalance,
    /// The attempt timeout of pools and routes that set none
    /// (`CUSTOM_ROUTER_ATTEMPT_TIMEOUT`, 1800 s): the queue wait and the
    /// wait for the answer's head (a JSON answer: the whole answer). Longer
    /// than the default queue timeout (1200 s), so it never cuts a wait the
    /// Hugging Face contract allows; short enough that a silent backend
    /// gives its request back and its circuit learns of it.
    pub attempt_timeout: Duration,
    /// Request bytes held at once by all requests together
    /// (`CUSTOM_ROUTER_MAX_BUFFERED_BYTES`, 256 MiB).
    pub max_buffered_bytes: usize,
    /// Client connections open at once (`CUSTOM_ROUTER_MAX_CONNECTIONS`, 4096).
    pub max_connections: usize,
    /// Client connections one peer may hold open at once
    /// (`CUSTOM_ROUTER_MAX_CONNECTIONS_PER_PEER`); `None`: half of
    /// `max_connections` ([`Settings::connections_per_peer`]), so that one
    /// peer never holds every slot. A peer is an IPv4 address or an IPv6
    /// /64.
    pub max_connections_per_peer: Option<usize>,
    /// Largest request head (request line and headers) a client may send
    /// (`CUSTOM_ROUTER_MAX_HEADER_BYTES`, 64 KiB, at least 8192): past it,
    /// `431 Request Header Fields Too Large` and the connection is closed.
    /// Also the most a connection's read buffer holds.
    pub max_header_bytes: usize,
    /// The listener's certificate and key (`CUSTOM_ROUTER_TLS_CERT_FILE`
    /// and `CUSTOM_ROUTER_TLS_KEY_FILE`, PEM, both or neither): with them
    /// the listener speaks TLS only (ALPN `h2` and `http/1.1`); without,
    /// plaintext HTTP/1.1 and h2c with prior knowledge.
    pub tls: Option<TlsFiles>,
    /// How often the certificate and key files are checked for changes
    /// (`CUSTOM_ROUTER_TLS_POLL_INTERVAL`, 2 s).
    pub tls_poll_interval: Duration,
    /// Requests one HTTP/2 connection may have open at once
    /// (`CUSTOM_ROUTER_H2_MAX_CONCURRENT_STREAMS`, 100: the least RFC 9113
    /// recommends); the client waits for a stream to end before it opens
    /// another.
    pub h2_max_concurrent_streams: u32,
    /// What a policy may ask of this proxy: the variables a pool's
    /// `api_key_env` may name (`*_API_KEY`, plus
    /// `CUSTOM_ROUTER_API_KEY_ENV_ALLOW`) and the link-local or metadata
    /// hosts allowed as backends (`CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS`).
    pub guards: Guards,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("bind", &self.bind)
            .field("port", &self.port)
            .field("queue", &self.queue)
            .field("max_concurrency", &self.max_concurrency)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "approval_key",
                &self.approval_key.as_ref().map(|_| "<redacted>"),
            )
            .field("max_body_bytes", &self.max_body_bytes)
            .field("shared_store", &self.shared_store)
            .finish_non_exhaustive()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            bind: IpAddr::from([0, 0, 0, 0]),
            port: 3000,
            queue: QueueSettings::default(),
            max_concurrency: None,
            state_log_interval: Duration::from_secs(30),
            admin_token: None,
            metrics_token: None,
            approval_key: None,
            max_body_bytes: 32 * 1024 * 1024,
            client_header_timeout: Duration::from_secs(30),
            client_body_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            upstream_ca_file: None,
            policy_poll_interval: Duration::from_secs(1),
            idempotency_ttl: Duration::from_secs(300),
            idempotency_max_keys: 10_000,
            idempotency_max_answer_bytes: 1024 * 1024,
            idempotency_max_bytes: 64 * 1024 * 1024,
            cache_max_bytes: 64 * 1024 * 1024,
            shared_store: None,
            shared_store_check: Duration::from_secs(5),
            tasks_file: None,
            task_lease: Duration::from_secs(10),
            park_max_bytes: 256 * 1024 * 1024,
            decision_ring: 256,
            workers: 0,
            connection_balance: crate::balance_workers::ConnectionBalance::Pack,
            attempt_timeout: Duration::from_secs(1800),
            max_buffered_bytes: 256 * 1024 * 1024,
            max_connections: 4096,
            max_connections_per_peer: None,
            max_header_bytes: 64 * 1024,
            tls: None,
            tls_poll_interval: Duration::from_secs(2),
            h2_max_concurrent_streams: 100,
            guards: Guards::default(),
        }
    }
}

/// The smallest `CUSTOM_ROUTER_MAX_HEADER_BYTES`: hyper's smallest read
/// buffer.
pub(crate) const MIN_HEADER_BYTES: usize = 8192;

impl Settings {
    /// Connections one peer may hold open at once:
    /// `CUSTOM_ROUTER_MAX_CONNECTIONS_PER_PEER`, or half of
    /// `CUSTOM_ROUTER_MAX_CONNECTIONS` (at least 1) when unset.
    pub fn connections_per_peer(&self) -> usize {
        self.max_connections_per_peer
            .unwrap_or(self.max_connections.div_ceil(2))
            .max(1)
    }

    /// Reads the process environment.
    ///
    /// A value that is not Unicode is read lossily, so that it fails its
    /// check with the variable's name instead of passing for unset (an
    /// admin token that silently vanished would open the admin calls).
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads settings through `lookup` (the environment, or a map in tests):
    /// every variable of [`VARS`] in its order, the first unusable value
    /// stopping with its name, then the rules that join two variables
    /// (the TLS pair, the shared store and its password).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let mut draft = Draft::default();
        for var in VARS {
            if let Some(value) = lookup(var.name) {
                (var.set)(&mut draft, &value).map_err(|expected| var.refused(&value, expected))?;
            }
        }
        draft.finish()
    }
}

/// What a parser says of a value it refuses: what would have been accepted.
type Expected = &'static str;

/// One variable: its name, its default as docs/data-plane.md's table shows
/// it, what it sets, whether its value may be shown, and its parser (which
/// stores the value in the settings being built).
struct Var {
    name: &'static str,
    // The default and the doc are read by the tests that hold the docs to
    // the table.
    #[cfg_attr(not(test), allow(dead_code))]
    default: &'static str,
    #[cfg_attr(not(test), allow(dead_code))]
    doc: &'static str,
    shown: Shown,
    set: fn(&mut Draft, &str) -> Result<(), Expected>,
}

/// Whether a refused value is quoted in the error, or hidden (secrets).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shown {
    Quoted,
    Hidden,
}
use Shown::{Hidden, Quoted};

impl Var {
    fn refused(&self, value: &str, expected: Expected) -> SettingsError {
        match self.shown {
            Quoted => bad(self.name, value, expected),
            Hidden => SettingsError {
                var: self.name,
                shown: "(hidden)".into(),
                expected,
            },
        }
    }
}

/// The settings being read, and the values of the variables that only
/// mean something together (checked in [`Draft::finish`]).
#[derive(Default)]
struct Draft {
    s: Settings,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    store: Option<String>,
    store_password: Option<String>,
}

/// Every `CUSTOM_ROUTER_*` variable the proxy reads, one line each, in the
/// order they are checked: name, default (as documented), doc, shown or
/// hidden, parser. `settings::tests::every_variable_is_documented_with_its_default`
/// holds the docs to it.
#[rustfmt::skip]
static VARS: &[Var] = &[
    Var { name: "CUSTOM_ROUTER_BIND", default: "0.0.0.0", doc: "address to listen on", shown: Quoted, set: |d, v| { d.s.bind = ip(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_PORT", default: "3000", doc: "port to listen on", shown: Quoted, set: |d, v| { d.s.port = port(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_LATENCY_THRESHOLD", default: "3.0", doc: "s; a busy endpoint takes more work only under this EWMA", shown: Quoted, set: |d, v| { d.s.queue.latency_threshold_s = seconds(v)?.as_secs_f64(); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_QUEUE_MAX_SIZE", default: "1000", doc: "waiters per pool", shown: Quoted, set: |d, v| { d.s.queue.max_size = at_least(v, 1, "an integer of at least 1")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_QUEUE_TIMEOUT", default: "1200", doc: "s a request may wait in the queue", shown: Quoted, set: |d, v| { d.s.queue.timeout = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_EWMA_ALPHA", default: "0.3", doc: "smoothing factor, (0, 1]", shown: Quoted, set: |d, v| { d.s.queue.ewma_alpha = alpha(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_SCORING", default: "`peak_ewma`", doc: "how a pool picks an endpoint", shown: Quoted, set: |d, v| { d.s.queue.scoring = scoring(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_STATE_LOG_INTERVAL", default: "30", doc: "s between backend-state log lines", shown: Quoted, set: |d, v| { d.s.state_log_interval = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_MAX_CONCURRENCY", default: "0", doc: "requests in flight per endpoint in sidecar mode; 0 = no limit", shown: Quoted, set: |d, v| { d.s.max_concurrency = limit(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_ADMIN_TOKEN", default: "unset", doc: "bearer token for the admin calls", shown: Hidden, set: |d, v| { d.s.admin_token = Some(token(v)?); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_MAX_BODY_BYTES", default: "33554432", doc: "request body limit", shown: Quoted, set: |d, v| { d.s.max_body_bytes = at_least(v, 1, "a positive number of bytes")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_CLIENT_HEADER_TIMEOUT", default: "30", doc: "s a client has to send its headers", shown: Quoted, set: |d, v| { d.s.client_header_timeout = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_CLIENT_BODY_TIMEOUT", default: "60", doc: "s a client has to send its body", shown: Quoted, set: |d, v| { d.s.client_body_timeout = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_CONNECT_TIMEOUT", default: "5", doc: "s to connect to a backend", shown: Quoted, set: |d, v| { d.s.connect_timeout = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_UPSTREAM_CA_FILE", default: "unset", doc: "extra PEM roots for HTTPS backends", shown: Quoted, set: |d, v| { d.s.upstream_ca_file = Some(pem_path(v)?); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_POLICY_POLL_INTERVAL", default: "1", doc: "s between policy file checks", shown: Quoted, set: |d, v| { d.s.policy_poll_interval = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_IDEMPOTENCY_TTL", default: "300", doc: "s an answer is kept for Idempotency-Key retries", shown: Quoted, set: |d, v| { d.s.idempotency_ttl = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_WORKERS", default: "0", doc: "connection-serving threads; 0 = one per core", shown: Quoted, set: |d, v| { d.s.workers = workers(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_CONNECTION_BALANCE", default: "pack", doc: "how new connections are placed on the threads", shown: Quoted, set: |d, v| { d.s.connection_balance = balance(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_IDEMPOTENCY_MAX_KEYS", default: "10000", doc: "keys the in-process store tracks at most", shown: Quoted, set: |d, v| { d.s.idempotency_max_keys = at_least(v, 1, "an integer of at least 1")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_IDEMPOTENCY_MAX_ANSWER_BYTES", default: "1048576", doc: "largest answer kept for replay", shown: Quoted, set: |d, v| { d.s.idempotency_max_answer_bytes = at_least(v, 0, "a number of bytes (0: keep no answer)")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES", default: "67108864", doc: "bytes the in-process idempotency store holds at most", shown: Quoted, set: |d, v| { d.s.idempotency_max_bytes = at_least(v, 1024 * 1024, "a number of bytes of at least 1048576 (1 MiB)")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_CACHE_MAX_BYTES", default: "67108864", doc: "bytes the in-process response cache holds at most", shown: Quoted, set: |d, v| { d.s.cache_max_bytes = at_least(v, 1024 * 1024, "a number of bytes of at least 1048576 (1 MiB)")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_TASK_LEASE_MS", default: "10000", doc: "ms a claim on a parked task holds without renewal", shown: Quoted, set: |d, v| { d.s.task_lease = Duration::from_millis(at_least(v, 100, "a number of milliseconds of at least 100")?); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_PARK_MAX_BYTES", default: "268435456 (256 MiB)", doc: "bytes all live parked tasks hold at most", shown: Quoted, set: |d, v| { d.s.park_max_bytes = at_least(v, 1, "a positive number of bytes")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_DECISION_RING", default: "256", doc: "route records a managed proxy keeps for the console", shown: Quoted, set: |d, v| { d.s.decision_ring = decision_ring(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_TASKS_FILE", default: "unset", doc: "without a shared store: the file parked tasks are kept in", shown: Quoted, set: |d, v| { d.s.tasks_file = Some(PathBuf::from(v)); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_SHARED_STORE", default: "unset", doc: "the fleet's shared store, redis:// or rediss://", shown: Quoted, set: |d, v| { d.store = Some(v.to_owned()); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_SHARED_STORE_PASSWORD", default: "unset", doc: "the shared store's password", shown: Hidden, set: |d, v| { d.store_password = Some(v.to_owned()); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_ATTEMPT_TIMEOUT", default: "1800", doc: "s an attempt may take when nothing else bounds it", shown: Quoted, set: |d, v| { d.s.attempt_timeout = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_METRICS_TOKEN", default: "unset", doc: "bearer token that opens /metrics off loopback", shown: Hidden, set: |d, v| { d.s.metrics_token = Some(token(v)?); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_APPROVAL_KEY", default: "unset", doc: "key X-Router-Approval tokens are checked with", shown: Hidden, set: |d, v| { d.s.approval_key = Some(approval_key(v)?); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_MAX_BUFFERED_BYTES", default: "268435456", doc: "request bytes held at once by all requests", shown: Quoted, set: |d, v| { d.s.max_buffered_bytes = at_least(v, 1, "a positive number of bytes")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_MAX_CONNECTIONS", default: "4096", doc: "client connections open at once", shown: Quoted, set: |d, v| { d.s.max_connections = at_least(v, 1, "an integer of at least 1")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_MAX_CONNECTIONS_PER_PEER", default: "half of `CUSTOM_ROUTER_MAX_CONNECTIONS` (2048)", doc: "client connections one peer may hold open", shown: Quoted, set: |d, v| { d.s.max_connections_per_peer = Some(at_least(v, 1, "an integer of at least 1")?); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_MAX_HEADER_BYTES", default: "65536", doc: "largest request head", shown: Quoted, set: |d, v| { d.s.max_header_bytes = at_least(v, MIN_HEADER_BYTES, "a number of bytes of at least 8192")?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_TLS_CERT_FILE", default: "unset", doc: "the listener's PEM certificate chain", shown: Quoted, set: |d, v| { d.tls_cert = Some(pem_path(v)?); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_TLS_KEY_FILE", default: "unset", doc: "the listener's PEM private key", shown: Quoted, set: |d, v| { d.tls_key = Some(pem_path(v)?); Ok(()) } },
    Var { name: "CUSTOM_ROUTER_TLS_POLL_INTERVAL", default: "2", doc: "s between checks of the TLS files", shown: Quoted, set: |d, v| { d.s.tls_poll_interval = seconds(v)?; Ok(()) } },
    Var { name: "CUSTOM_ROUTER_H2_MAX_CONCURRENT_STREAMS", default: "100", doc: "requests one HTTP/2 connection may have open", shown: Quoted, set: |d, v| { d.s.h2_max_concurrent_streams = at_least(v, 1, "an integer of at least 1")?; Ok(()) } },
    Var { name: API_KEY_ENV_ALLOW_VAR, default: "unset", doc: "variables a pool's api_key_env may name beyond *_API_KEY", shown: Quoted, set: |d, v| { d.s.guards.api_key_env = env_allow(v)?; Ok(()) } },
    Var { name: ALLOW_BACKEND_HOSTS_VAR, default: "unset", doc: "link-local or metadata hosts allowed as backends", shown: Quoted, set: |d, v| { d.s.guards.backend_hosts = host_allow(v)?; Ok(()) } },
];

impl Draft {
    /// The rules that join two variables.
    fn finish(self) -> Result<Settings, SettingsError> {
        let mut s = self.s;
        s.tls = match (self.tls_cert, self.tls_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (Some(_), None) => return Err(tls_pair("CUSTOM_ROUTER_TLS_KEY_FILE")),
            (None, Some(_)) => return Err(tls_pair("CUSTOM_ROUTER_TLS_CERT_FILE")),
        };
        s.shared_store = match (self.store, self.store_password) {
            (Some(url), password) => Some(store_url(password, &url)?),
            (None, Some(_)) => {
                return Err(SettingsError {
                    var: "CUSTOM_ROUTER_SHARED_STORE_PASSWORD",
                    shown: "(hidden)".into(),
                    expected: "to be set together with CUSTOM_ROUTER_SHARED_STORE",
                })
            }
            (None, None) => None,
        };
        Ok(s)
    }
}

// The parsers: each trims what it reads and says what it expected.

fn ip(v: &str) -> Result<IpAddr, Expected> {
    v.trim().parse().map_err(|_| "an IP address")
}

fn port(v: &str) -> Result<u16, Expected> {
    v.trim().parse().map_err(|_| "a port number 0-65535")
}

/// A positive, finite number of seconds.
fn seconds(v: &str) -> Result<Duration, Expected> {
    v.trim()
        .parse::<f64>()
        .ok()
        .and_then(positive_duration)
        .ok_or("a positive number of seconds")
}

/// An integer of at least `min`.
/// The most route records a proxy's ring may keep.
const DECISION_RING_MAX: usize = 65_536;

fn decision_ring(v: &str) -> Result<usize, Expected> {
    match v.trim().parse::<usize>() {
        Ok(n) if n <= DECISION_RING_MAX => Ok(n),
        _ => Err("a number of records from 0 (none) to 65536"),
    }
}

fn at_least<T: std::str::FromStr + PartialOrd>(
    v: &str,
    min: T,
    expected: Expected,
) -> Result<T, Expected> {
    v.trim()
        .parse::<T>()
        .ok()
        .filter(|n| *n >= min)
        .ok_or(expected)
}

/// A limit where 0 means none.
fn limit(v: &str) -> Result<Option<u32>, Expected> {
    match v.trim().parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err("a non-negative integer (0 = no limit)"),
    }
}

fn alpha(v: &str) -> Result<f64, Expected> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|a| *a > 0.0 && *a <= 1.0)
        .ok_or("a number in (0, 1]")
}

fn scoring(v: &str) -> Result<Scoring, Expected> {
    Scoring::parse(v.trim())
        .ok_or("peak_ewma, lowest_ewma, least_requests, round_robin or engine_aware")
}

fn workers(v: &str) -> Result<usize, Expected> {
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n <= 1024)
        .ok_or("a number of threads from 0 (one per core) to 1024")
}

fn balance(v: &str) -> Result<crate::balance_workers::ConnectionBalance, Expected> {
    crate::balance_workers::ConnectionBalance::parse(v).ok_or("pack or spread")
}

/// A path, trimmed; an empty one is refused.
fn pem_path(v: &str) -> Result<PathBuf, Expected> {
    match v.trim() {
        "" => Err("a path to a PEM file"),
        path => Ok(PathBuf::from(path)),
    }
}

/// A token: trimmed and checked as every token is (`router_proto::token`).
fn token(v: &str) -> Result<String, Expected> {
    router_proto::token::normalize(v, "").map_err(|e| e.problem)
}

fn approval_key(v: &str) -> Result<ApprovalKey, Expected> {
    ApprovalKey::new(v).map_err(|_| "a key of at least 32 bytes (e.g. `openssl rand -base64 32`)")
}

fn env_allow(v: &str) -> Result<EnvAllowList, Expected> {
    EnvAllowList::parse(v)
        .map_err(|_| "comma-separated variable names or PREFIX* patterns (a bare * is refused)")
}

fn host_allow(v: &str) -> Result<HostAllowList, Expected> {
    HostAllowList::parse(v).map_err(|_| "comma-separated host names or IP addresses")
}

/// The listener's PEM certificate chain and private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (`CUSTOM_ROUTER_TLS_CERT_FILE`).
    pub cert: PathBuf,
    /// Its private key (`CUSTOM_ROUTER_TLS_KEY_FILE`).
    pub key: PathBuf,
}

/// `missing`, unset while the other TLS variable is set.
fn tls_pair(missing: &'static str) -> SettingsError {
    SettingsError {
        var: missing,
        shown: "(unset)".into(),
        expected: "CUSTOM_ROUTER_TLS_CERT_FILE and CUSTOM_ROUTER_TLS_KEY_FILE set together",
    }
}

/// The shared store's address and credentials, checked at startup: the
/// shared-state crate's type, named here as the variable that sets it.
pub use router_shared_state::SharedStore;

fn store_url(password: Option<String>, url: &str) -> Result<SharedStore, SettingsError> {
    SharedStore::parse(url, password).map_err(|e| SettingsError {
        var: "CUSTOM_ROUTER_SHARED_STORE",
        shown: e.shown,
        expected: router_shared_state::SharedStore::EXPECTED,
    })
}

fn bad(var: &'static str, value: &str, expected: &'static str) -> SettingsError {
    SettingsError {
        var,
        shown: format!("{value:?}"),
        expected,
    }
}

impl Settings {
    /// What the upstream client is built from.
    pub(crate) fn client_config(&self) -> router_upstream::forward::ClientConfig {
        router_upstream::forward::ClientConfig {
            upstream_ca_file: self.upstream_ca_file.clone(),
            backend_hosts: self.guards.backend_hosts.clone(),
            connect_timeout: self.connect_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn hugging_face_defaults() {
        let s = with(&[]).unwrap();
        assert_eq!(s.port, 3000);
        assert_eq!(s.queue.latency_threshold_s, 3.0);
        assert_eq!(s.queue.max_size, 1000);
        assert_eq!(s.queue.timeout, Duration::from_secs(1200));
        assert_eq!(s.queue.ewma_alpha, 0.3);
        assert_eq!(s.state_log_interval, Duration::from_secs(30));
        assert_eq!(s.admin_token, None);
        assert_eq!(s.max_buffered_bytes, 256 * 1024 * 1024);
        assert_eq!(s.attempt_timeout, Duration::from_secs(1800));
        assert_eq!(s.max_connections, 4096);
        assert_eq!(s.connections_per_peer(), 2048);
        assert_eq!(s.max_header_bytes, 65536);
        assert_eq!(s.tls, None);
        assert_eq!(s.tls_poll_interval, Duration::from_secs(2));
        assert_eq!(s.h2_max_concurrent_streams, 100);
        assert_eq!(
            s.connection_balance,
            crate::balance_workers::ConnectionBalance::Pack
        );
    }

    #[test]
    fn values_are_read() {
        let s = with(&[
            ("CUSTOM_ROUTER_PORT", "8080"),
            ("CUSTOM_ROUTER_LATENCY_THRESHOLD", "2.5"),
            ("CUSTOM_ROUTER_QUEUE_MAX_SIZE", "10"),
            ("CUSTOM_ROUTER_QUEUE_TIMEOUT", "0.5"),
            ("CUSTOM_ROUTER_EWMA_ALPHA", "1"),
            ("CUSTOM_ROUTER_SCORING", "lowest_ewma"),
            ("CUSTOM_ROUTER_MAX_CONCURRENCY", "4"),
            ("CUSTOM_ROUTER_CONNECTION_BALANCE", "spread"),
            ("CUSTOM_ROUTER_MAX_BUFFERED_BYTES", "1048576"),
            ("CUSTOM_ROUTER_MAX_CONNECTIONS", "16"),
            ("CUSTOM_ROUTER_ATTEMPT_TIMEOUT", "2.5"),
            ("CUSTOM_ROUTER_MAX_HEADER_BYTES", "8192"),
        ])
        .unwrap();
        assert_eq!(s.max_header_bytes, 8192);
        // Half of the connection cap unless set.
        assert_eq!(s.connections_per_peer(), 8);

        assert_eq!(s.attempt_timeout, Duration::from_millis(2500));
        assert_eq!(s.max_buffered_bytes, 1 << 20);
        assert_eq!(s.max_connections, 16);
        assert_eq!(
            s.connection_balance,
            crate::balance_workers::ConnectionBalance::Spread
        );
        assert_eq!(s.port, 8080);
        assert_eq!(s.queue.latency_threshold_s, 2.5);
        assert_eq!(s.queue.max_size, 10);
        assert_eq!(s.queue.timeout, Duration::from_millis(500));
        assert_eq!(s.queue.scoring, Scoring::LowestEwma);
        assert_eq!(s.max_concurrency, Some(4));
        let s = with(&[
            ("CUSTOM_ROUTER_MAX_CONNECTIONS", "1"),
            ("CUSTOM_ROUTER_MAX_CONNECTIONS_PER_PEER", " 5000\n"),
        ])
        .unwrap();
        assert_eq!(s.connections_per_peer(), 5000);
        assert_eq!(
            with(&[("CUSTOM_ROUTER_MAX_CONNECTIONS", "1")])
                .unwrap()
                .connections_per_peer(),
            1
        );
    }

    #[test]
    fn a_bad_value_names_its_variable() {
        for (var, value) in [
            ("CUSTOM_ROUTER_PORT", "http"),
            ("CUSTOM_ROUTER_PORT", "70000"),
            ("CUSTOM_ROUTER_LATENCY_THRESHOLD", "-1"),
            ("CUSTOM_ROUTER_QUEUE_MAX_SIZE", "0"),
            ("CUSTOM_ROUTER_QUEUE_TIMEOUT", "NaN"),
            ("CUSTOM_ROUTER_EWMA_ALPHA", "1.5"),
            ("CUSTOM_ROUTER_EWMA_ALPHA", "0"),
            ("CUSTOM_ROUTER_STATE_LOG_INTERVAL", "soon"),
            ("CUSTOM_ROUTER_SCORING", "random"),
            ("CUSTOM_ROUTER_WORKERS", "many"),
            ("CUSTOM_ROUTER_CONNECTION_BALANCE", "even"),
            ("CUSTOM_ROUTER_ATTEMPT_TIMEOUT", "0"),
            ("CUSTOM_ROUTER_ATTEMPT_TIMEOUT", "forever"),
            ("CUSTOM_ROUTER_MAX_BUFFERED_BYTES", "0"),
            ("CUSTOM_ROUTER_MAX_BUFFERED_BYTES", "1GiB"),
            ("CUSTOM_ROUTER_MAX_CONNECTIONS", "0"),
            ("CUSTOM_ROUTER_MAX_CONNECTIONS", "-5"),
            ("CUSTOM_ROUTER_MAX_CONNECTIONS_PER_PEER", "0"),
            ("CUSTOM_ROUTER_MAX_CONNECTIONS_PER_PEER", "many"),
            ("CUSTOM_ROUTER_MAX_HEADER_BYTES", "8191"),
            ("CUSTOM_ROUTER_MAX_HEADER_BYTES", "64KiB"),
            ("CUSTOM_ROUTER_H2_MAX_CONCURRENT_STREAMS", "0"),
            ("CUSTOM_ROUTER_H2_MAX_CONCURRENT_STREAMS", "lots"),
            ("CUSTOM_ROUTER_TLS_POLL_INTERVAL", "0"),
            ("CUSTOM_ROUTER_API_KEY_ENV_ALLOW", "*"),
            ("CUSTOM_ROUTER_API_KEY_ENV_ALLOW", "NOT-A-NAME"),
            (
                "CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS",
                "http://169.254.169.254/",
            ),
        ] {
            let err = with(&[(var, value)]).unwrap_err();
            assert_eq!(err.var, var);
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    /// Issue 30, item 11: the listener's certificate and key come
    /// together; either alone, or an empty path, stops startup naming the
    /// variable.
    #[test]
    fn the_tls_files_come_together() {
        let s = with(&[
            ("CUSTOM_ROUTER_TLS_CERT_FILE", " /etc/router/tls.crt\n"),
            ("CUSTOM_ROUTER_TLS_KEY_FILE", "/etc/router/tls.key"),
            ("CUSTOM_ROUTER_TLS_POLL_INTERVAL", "0.25"),
            ("CUSTOM_ROUTER_H2_MAX_CONCURRENT_STREAMS", "8"),
        ])
        .unwrap();
        assert_eq!(
            s.tls,
            Some(TlsFiles {
                cert: "/etc/router/tls.crt".into(),
                key: "/etc/router/tls.key".into(),
            })
        );
        assert_eq!(s.tls_poll_interval, Duration::from_millis(250));
        assert_eq!(s.h2_max_concurrent_streams, 8);
        let err = with(&[("CUSTOM_ROUTER_TLS_CERT_FILE", "/c.pem")]).unwrap_err();
        assert_eq!(err.var, "CUSTOM_ROUTER_TLS_KEY_FILE");
        assert!(err.to_string().contains("set together"), "{err}");
        let err = with(&[("CUSTOM_ROUTER_TLS_KEY_FILE", "/k.pem")]).unwrap_err();
        assert_eq!(err.var, "CUSTOM_ROUTER_TLS_CERT_FILE");
        let err = with(&[
            ("CUSTOM_ROUTER_TLS_CERT_FILE", "/c.pem"),
            ("CUSTOM_ROUTER_TLS_KEY_FILE", " "),
        ])
        .unwrap_err();
        assert_eq!(err.var, "CUSTOM_ROUTER_TLS_KEY_FILE");
    }

    #[test]
    fn the_shared_store_is_checked_and_its_password_never_shown() {
        assert_eq!(with(&[]).unwrap().shared_store, None);
        let s = with(&[(
            "CUSTOM_ROUTER_SHARED_STORE",
            "redis://:hunter22@10.0.0.5:6379/2",
        )])
        .unwrap();
        let store = s.shared_store.clone().unwrap();
        assert_eq!(store.shown(), "redis://10.0.0.5:6379/2");
        assert!(!format!("{s:?}").contains("hunter22"));
        // The password variable wins over the URL's (the client it
        // makes is the shared-state crate's test).
        let s = with(&[
            ("CUSTOM_ROUTER_SHARED_STORE", "rediss://cache.internal:6380"),
            ("CUSTOM_ROUTER_SHARED_STORE_PASSWORD", "from-env\n"),
        ])
        .unwrap();
        assert_eq!(
            s.shared_store,
            Some(
                SharedStore::parse("rediss://cache.internal:6380", Some("from-env".into()))
                    .unwrap()
            )
        );
        for bad in [
            "localhost:6379",
            "http://x:1",
            "redis://:pw@host:notaport",
            "",
        ] {
            let err = with(&[("CUSTOM_ROUTER_SHARED_STORE", bad)]).unwrap_err();
            assert_eq!(err.var, "CUSTOM_ROUTER_SHARED_STORE", "{bad}");
            assert!(!err.to_string().contains(":pw@"), "{err}");
        }
        let err = with(&[("CUSTOM_ROUTER_SHARED_STORE_PASSWORD", "x")]).unwrap_err();
        assert_eq!(err.var, "CUSTOM_ROUTER_SHARED_STORE_PASSWORD");
        let err = with(&[("CUSTOM_ROUTER_IDEMPOTENCY_MAX_ANSWER_BYTES", "lots")]).unwrap_err();
        assert_eq!(err.var, "CUSTOM_ROUTER_IDEMPOTENCY_MAX_ANSWER_BYTES");
    }

    #[test]
    fn the_idempotency_byte_budget_is_read_and_an_unusable_one_stops_startup() {
        assert_eq!(with(&[]).unwrap().idempotency_max_bytes, 64 * 1024 * 1024);
        let s = with(&[("CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES", " 2097152\n")]).unwrap();
        assert_eq!(s.idempotency_max_bytes, 2 * 1024 * 1024);
        for bad in ["lots", "-1", "", "64MiB", "1000"] {
            let err = with(&[("CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES", bad)]).unwrap_err();
            assert_eq!(err.var, "CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES", "{bad}");
            assert!(err
                .to_string()
                .contains("CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES"));
        }
    }

    #[test]
    fn the_cache_byte_budget_is_read_and_an_unusable_one_stops_startup() {
        assert_eq!(with(&[]).unwrap().cache_max_bytes, 64 * 1024 * 1024);
        let s = with(&[("CUSTOM_ROUTER_CACHE_MAX_BYTES", "2097152")]).unwrap();
        assert_eq!(s.cache_max_bytes, 2 * 1024 * 1024);
        for bad in ["lots", "-1", "1000"] {
            let err = with(&[("CUSTOM_ROUTER_CACHE_MAX_BYTES", bad)]).unwrap_err();
            assert_eq!(err.var, "CUSTOM_ROUTER_CACHE_MAX_BYTES", "{bad}");
        }
    }

    #[test]
    fn the_parked_bytes_cap_is_read_and_an_unusable_one_stops_startup() {
        assert_eq!(with(&[]).unwrap().park_max_bytes, 256 * 1024 * 1024);
        let s = with(&[("CUSTOM_ROUTER_PARK_MAX_BYTES", " 1048576\n")]).unwrap();
        assert_eq!(s.park_max_bytes, 1024 * 1024);
        for bad in ["lots", "-1", "", "0", "64MiB"] {
            let err = with(&[("CUSTOM_ROUTER_PARK_MAX_BYTES", bad)]).unwrap_err();
            assert_eq!(err.var, "CUSTOM_ROUTER_PARK_MAX_BYTES", "{bad}");
            assert!(err.to_string().contains("a positive number of bytes"));
        }
    }

    #[test]
    fn the_decision_ring_is_read_and_bounded() {
        assert_eq!(with(&[]).unwrap().decision_ring, 256);
        assert_eq!(
            with(&[("CUSTOM_ROUTER_DECISION_RING", "0")])
                .unwrap()
                .decision_ring,
            0
        );
        assert_eq!(
            with(&[("CUSTOM_ROUTER_DECISION_RING", " 1024\n")])
                .unwrap()
                .decision_ring,
            1024
        );
        for bad in ["lots", "-1", "", "65537"] {
            let err = with(&[("CUSTOM_ROUTER_DECISION_RING", bad)]).unwrap_err();
            assert_eq!(err.var, "CUSTOM_ROUTER_DECISION_RING", "{bad}");
            assert!(err.to_string().contains("from 0 (none) to 65536"), "{err}");
        }
    }

    #[test]
    fn the_guards_are_read() {
        let s = with(&[
            ("CUSTOM_ROUTER_API_KEY_ENV_ALLOW", "HF_TOKEN,VAULT_*"),
            ("CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS", "169.254.10.1"),
        ])
        .unwrap();
        assert!(s.guards.api_key_env.allows("HF_TOKEN"));
        assert!(s.guards.api_key_env.allows("VAULT_X"));
        assert!(!s.guards.api_key_env.allows("AWS_SECRET_ACCESS_KEY"));
        assert!(s.guards.backend_hosts.allows("169.254.10.1"));
        assert_eq!(with(&[]).unwrap().guards, Guards::default());
    }

    #[test]
    fn the_admin_token_is_never_shown() {
        let s = with(&[("CUSTOM_ROUTER_ADMIN_TOKEN", "s3cret")]).unwrap();
        assert_eq!(s.admin_token.as_deref(), Some("s3cret"));
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn the_admin_token_is_trimmed_and_must_be_a_header_value() {
        // A token file's newline is not part of the token.
        let s = with(&[("CUSTOM_ROUTER_ADMIN_TOKEN", " s3cret\n")]).unwrap();
        assert_eq!(s.admin_token.as_deref(), Some("s3cret"));
        // Unusable tokens stop startup, named, never shown; before, a
        // token with a non-ASCII character was accepted and could never
        // be presented, and one that was not Unicode passed for unset.
        for bad in ["", "  ", "s3crét", "two words", "\u{fffd}"] {
            let err = with(&[("CUSTOM_ROUTER_ADMIN_TOKEN", bad)]).unwrap_err();
            assert_eq!(err.var, "CUSTOM_ROUTER_ADMIN_TOKEN");
            if !bad.trim().is_empty() {
                assert!(!err.to_string().contains(bad), "{err}");
            }
        }
    }

    #[test]
    fn the_approval_key_must_be_long_enough_and_is_never_shown() {
        let key = "approval-key-for-the-settings-test-0123";
        let s = with(&[("CUSTOM_ROUTER_APPROVAL_KEY", key)]).unwrap();
        assert_eq!(s.approval_key, Some(ApprovalKey::new(key).unwrap()));
        assert!(!format!("{s:?}").contains(key));
        assert_eq!(with(&[]).unwrap().approval_key, None);
        let err = with(&[("CUSTOM_ROUTER_APPROVAL_KEY", "too-short-secret")]).unwrap_err();
        assert_eq!(err.var, "CUSTOM_ROUTER_APPROVAL_KEY");
        let text = err.to_string();
        assert!(
            text.contains("32 bytes") && !text.contains("too-short-secret"),
            "{text}"
        );
    }

    #[test]
    fn the_metrics_token_is_trimmed_checked_and_never_shown() {
        let s = with(&[("CUSTOM_ROUTER_METRICS_TOKEN", " scrape-me\n")]).unwrap();
        assert_eq!(s.metrics_token.as_deref(), Some("scrape-me"));
        assert!(!format!("{s:?}").contains("scrape-me"));
        let err = with(&[("CUSTOM_ROUTER_METRICS_TOKEN", "two words")]).unwrap_err();
        assert_eq!(err.var, "CUSTOM_ROUTER_METRICS_TOKEN");
        assert!(!err.to_string().contains("two words"), "{err}");
    }

    /// Every variable of the table is in docs/data-plane.md's table, its
    /// row showing the table's default; no name is listed twice.
    #[test]
    fn every_variable_is_documented_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/data-plane.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let mut names = std::collections::HashSet::new();
        for var in VARS {
            assert!(names.insert(var.name), "{} listed twice", var.name);
            assert!(var.name.starts_with("CUSTOM_ROUTER_"), "{}", var.name);
            assert!(!var.doc.is_empty(), "{}", var.name);
            let row = format!("| `{}` | {} |", var.name, var.default);
            assert!(doc.contains(&row), "docs/data-plane.md has no row {row:?}");
        }
        assert!(VARS.len() >= 38, "{}", VARS.len());
    }

    /// The table's defaults are `Settings::default()`: each default that is
    /// a value, read through its own parser, changes nothing.
    #[test]
    fn the_table_defaults_are_the_defaults() {
        let mut read = 0;
        for var in VARS {
            if var.default == "unset" || var.name == "CUSTOM_ROUTER_MAX_CONNECTIONS_PER_PEER" {
                continue;
            }
            // "`peak_ewma`" and "268435456 (256 MiB)": the value alone.
            let value = var.default.split(' ').next().unwrap().trim_matches('`');
            let s = with(&[(var.name, value)]).unwrap();
            assert!(s == Settings::default(), "{} = {value}", var.name);
            read += 1;
        }
        assert_eq!(read, 30);
        // The computed one: half of the connection cap.
        assert_eq!(Settings::default().connections_per_peer(), 2048);
    }

    /// Every parser refuses a bad value with its variable's name, and a
    /// secret's value is never shown; a path is any text, and the store's
    /// password is refused only without a store (the test above).
    #[test]
    fn every_parser_refuses_a_bad_value_naming_its_variable() {
        let accept_anything = [
            "CUSTOM_ROUTER_TASKS_FILE",
            "CUSTOM_ROUTER_SHARED_STORE_PASSWORD",
        ];
        let candidates = ["", "-1", "*", "http://169.254.169.254/", "two words"];
        for var in VARS.iter().filter(|v| !accept_anything.contains(&v.name)) {
            let refused: Vec<SettingsError> = candidates
                .iter()
                .filter_map(|bad| {
                    // The TLS files come in pairs: the other one is usable.
                    let mut vars = vec![(var.name, *bad)];
                    for (tls, path) in [
                        ("CUSTOM_ROUTER_TLS_CERT_FILE", "/c.pem"),
                        ("CUSTOM_ROUTER_TLS_KEY_FILE", "/k.pem"),
                    ] {
                        if tls != var.name {
                            vars.push((tls, path));
                        }
                    }
                    with(&vars).err()
                })
                .collect();
            assert!(!refused.is_empty(), "{} accepts every candidate", var.name);
            for err in refused {
                assert_eq!(err.var, var.name);
                let text = err.to_string();
                assert!(text.contains(var.name), "{text}");
                assert!(text.contains(err.expected), "{text}");
                if var.shown == Hidden {
                    assert_eq!(err.shown, "(hidden)", "{text}");
                }
            }
        }
    }
}
