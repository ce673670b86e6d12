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
use router_policy::guard::ALLOW_BACKEND_HOSTS_VAR;
use router_policy::{ApprovalKey, Guards, QueueSettings, Scoring};

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
            shared_store: None,
            shared_store_check: Duration::from_secs(5),
            tasks_file: None,
            task_lease: Duration::from_secs(10),
            park_max_bytes: 256 * 1024 * 1024,
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

    /// Reads settings through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let mut s = Self::default();
        let get = |var: &'static str| lookup(var).map(|v| (var, v));

        if let Some((var, v)) = get("CUSTOM_ROUTER_BIND") {
            s.bind = v
                .trim()
                .parse()
                .map_err(|_| bad(var, &v, "an IP address"))?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_PORT") {
            s.port = v
                .trim()
                .parse()
                .map_err(|_| bad(var, &v, "a port number 0-65535"))?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_LATENCY_THRESHOLD") {
            s.queue.latency_threshold_s = seconds(var, &v)?.as_secs_f64();
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_QUEUE_MAX_SIZE") {
            s.queue.max_size = match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => return Err(bad(var, &v, "an integer of at least 1")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_QUEUE_TIMEOUT") {
            s.queue.timeout = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_EWMA_ALPHA") {
            s.queue.ewma_alpha = match v.trim().parse::<f64>() {
                Ok(a) if a > 0.0 && a <= 1.0 => a,
                _ => return Err(bad(var, &v, "a number in (0, 1]")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_SCORING") {
            s.queue.scoring = Scoring::parse(v.trim()).ok_or_else(|| {
                bad(
                    var,
                    &v,
                    "peak_ewma, lowest_ewma, least_requests, round_robin or engine_aware",
                )
            })?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_STATE_LOG_INTERVAL") {
            s.state_log_interval = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_MAX_CONCURRENCY") {
            s.max_concurrency = match v.trim().parse::<u32>() {
                Ok(0) => None,
                Ok(n) => Some(n),
                Err(_) => return Err(bad(var, &v, "a non-negative integer (0 = no limit)")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_ADMIN_TOKEN") {
            s.admin_token = Some(token(var, &v)?);
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_MAX_BODY_BYTES") {
            s.max_body_bytes = match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => return Err(bad(var, &v, "a positive number of bytes")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_CLIENT_HEADER_TIMEOUT") {
            s.client_header_timeout = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_CLIENT_BODY_TIMEOUT") {
            s.client_body_timeout = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_CONNECT_TIMEOUT") {
            s.connect_timeout = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_UPSTREAM_CA_FILE") {
            if v.trim().is_empty() {
                return Err(bad(var, &v, "a path to a PEM file"));
            }
            s.upstream_ca_file = Some(PathBuf::from(v.trim()));
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_POLICY_POLL_INTERVAL") {
            s.policy_poll_interval = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_IDEMPOTENCY_TTL") {
            s.idempotency_ttl = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_WORKERS") {
            s.workers = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= 1024)
                .ok_or_else(|| bad(var, &v, "a number of threads from 0 (one per core) to 1024"))?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_CONNECTION_BALANCE") {
            s.connection_balance = crate::balance_workers::ConnectionBalance::parse(&v)
                .ok_or_else(|| bad(var, &v, "pack or spread"))?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_IDEMPOTENCY_MAX_KEYS") {
            s.idempotency_max_keys = match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => return Err(bad(var, &v, "an integer of at least 1")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_IDEMPOTENCY_MAX_ANSWER_BYTES") {
            s.idempotency_max_answer_bytes = match v.trim().parse::<usize>() {
                Ok(n) => n,
                _ => return Err(bad(var, &v, "a number of bytes (0: keep no answer)")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_IDEMPOTENCY_MAX_BYTES") {
            s.idempotency_max_bytes = match v.trim().parse::<usize>() {
                Ok(n) if n >= 1024 * 1024 => n,
                _ => {
                    return Err(bad(
                        var,
                        &v,
                        "a number of bytes of at least 1048576 (1 MiB)",
                    ))
                }
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_TASK_LEASE_MS") {
            s.task_lease = match v.trim().parse::<u64>() {
                Ok(n) if n >= 100 => Duration::from_millis(n),
                _ => return Err(bad(var, &v, "a number of milliseconds of at least 100")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_PARK_MAX_BYTES") {
            s.park_max_bytes = match v.trim().parse::<u64>() {
                Ok(n) if n >= 1 => n,
                _ => return Err(bad(var, &v, "a positive number of bytes")),
            };
        }
        if let Some((_, v)) = get("CUSTOM_ROUTER_TASKS_FILE") {
            s.tasks_file = Some(std::path::PathBuf::from(v));
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_SHARED_STORE") {
            let password = get("CUSTOM_ROUTER_SHARED_STORE_PASSWORD").map(|(_, p)| p);
            s.shared_store = Some(SharedStore::parse(var, &v, password)?);
        } else if get("CUSTOM_ROUTER_SHARED_STORE_PASSWORD").is_some() {
            return Err(SettingsError {
                var: "CUSTOM_ROUTER_SHARED_STORE_PASSWORD",
                shown: "(hidden)".into(),
                expected: "to be set together with CUSTOM_ROUTER_SHARED_STORE",
            });
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_ATTEMPT_TIMEOUT") {
            s.attempt_timeout = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_METRICS_TOKEN") {
            s.metrics_token = Some(token(var, &v)?);
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_APPROVAL_KEY") {
            // The value is never shown.
            s.approval_key = Some(ApprovalKey::new(&v).map_err(|_| SettingsError {
                var,
                shown: "(hidden)".into(),
                expected: "a key of at least 32 bytes (e.g. `openssl rand -base64 32`)",
            })?);
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_MAX_BUFFERED_BYTES") {
            s.max_buffered_bytes = match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => return Err(bad(var, &v, "a positive number of bytes")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_MAX_CONNECTIONS") {
            s.max_connections = match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => return Err(bad(var, &v, "an integer of at least 1")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_MAX_CONNECTIONS_PER_PEER") {
            s.max_connections_per_peer = match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Some(n),
                _ => return Err(bad(var, &v, "an integer of at least 1")),
            };
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_MAX_HEADER_BYTES") {
            s.max_header_bytes = match v.trim().parse::<usize>() {
                Ok(n) if n >= MIN_HEADER_BYTES => n,
                _ => return Err(bad(var, &v, "a number of bytes of at least 8192")),
            };
        }
        match (
            get("CUSTOM_ROUTER_TLS_CERT_FILE"),
            get("CUSTOM_ROUTER_TLS_KEY_FILE"),
        ) {
            (None, None) => {}
            (Some((cert_var, cert)), Some((key_var, key))) => {
                s.tls = Some(TlsFiles {
                    cert: pem_path(cert_var, &cert)?,
                    key: pem_path(key_var, &key)?,
                });
            }
            (Some(_), None) => return Err(tls_pair("CUSTOM_ROUTER_TLS_KEY_FILE")),
            (None, Some(_)) => return Err(tls_pair("CUSTOM_ROUTER_TLS_CERT_FILE")),
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_TLS_POLL_INTERVAL") {
            s.tls_poll_interval = seconds(var, &v)?;
        }
        if let Some((var, v)) = get("CUSTOM_ROUTER_H2_MAX_CONCURRENT_STREAMS") {
            s.h2_max_concurrent_streams = match v.trim().parse::<u32>() {
                Ok(n) if n >= 1 => n,
                _ => return Err(bad(var, &v, "an integer of at least 1")),
            };
        }
        s.guards = Guards::from_lookup(&lookup).map_err(|e| {
            let expected = match e.var {
                ALLOW_BACKEND_HOSTS_VAR => "comma-separated host names or IP addresses",
                _ => "comma-separated variable names or PREFIX* patterns (a bare * is refused)",
            };
            bad(e.var, &e.value, expected)
        })?;
        Ok(s)
    }
}

/// The listener's PEM certificate chain and private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (`CUSTOM_ROUTER_TLS_CERT_FILE`).
    pub cert: PathBuf,
    /// Its private key (`CUSTOM_ROUTER_TLS_KEY_FILE`).
    pub key: PathBuf,
}

/// A path in `var`, trimmed; an empty one is refused.
fn pem_path(var: &'static str, value: &str) -> Result<PathBuf, SettingsError> {
    match value.trim() {
        "" => Err(bad(var, value, "a path to a PEM file")),
        path => Ok(PathBuf::from(path)),
    }
}

/// `missing`, unset while the other TLS variable is set.
fn tls_pair(missing: &'static str) -> SettingsError {
    SettingsError {
        var: missing,
        shown: "(unset)".into(),
        expected: "CUSTOM_ROUTER_TLS_CERT_FILE and CUSTOM_ROUTER_TLS_KEY_FILE set together",
    }
}

/// A token in `var`: trimmed and checked as every token is
/// (`router_proto::token`); the value is never shown.
fn token(var: &'static str, value: &str) -> Result<String, SettingsError> {
    router_proto::token::normalize(value, var).map_err(|e| SettingsError {
        var,
        shown: "(hidden)".into(),
        expected: e.problem,
    })
}

/// The shared store's address and credentials, checked at startup.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedStore {
    /// The URL as given (it may hold a password: never shown).
    url: String,
    /// `CUSTOM_ROUTER_SHARED_STORE_PASSWORD`, overriding the URL's.
    password: Option<String>,
    /// `host:port/db` as shown in logs.
    shown: String,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl SharedStore {
    /// A store at `url` (`redis://`, `rediss://`, `valkey://`, `valkeys://`).
    pub fn new(url: &str) -> Result<Self, SettingsError> {
        Self::parse("CUSTOM_ROUTER_SHARED_STORE", url, None)
    }

    fn parse(
        var: &'static str,
        value: &str,
        password: Option<String>,
    ) -> Result<Self, SettingsError> {
        const EXPECTED: &str = "redis://[user:password@]host:port[/db] (or rediss:// for TLS)";
        let url = value.trim().to_owned();
        let scheme_ok = ["redis://", "rediss://", "valkey://", "valkeys://"]
            .iter()
            .any(|s| url.starts_with(s));
        // The value may hold a password: shown with it removed.
        let shown = redact(&url);
        let quoted = format!("{shown:?}");
        let invalid = || SettingsError {
            var,
            shown: quoted.clone(),
            expected: EXPECTED,
        };
        if !scheme_ok {
            return Err(invalid());
        }
        let store = Self {
            url,
            password: password
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty()),
            shown,
        };
        store.client().map_err(|_| invalid())?;
        Ok(store)
    }

    /// A client for it (no connection yet).
    pub(crate) fn client(&self) -> redis::RedisResult<redis::Client> {
        use redis::IntoConnectionInfo;
        let mut info = self.url.as_str().into_connection_info()?;
        if let Some(p) = &self.password {
            info.redis.password = Some(p.clone());
        }
        redis::Client::open(info)
    }

    /// The address without credentials.
    pub fn shown(&self) -> &str {
        &self.shown
    }
}

/// `scheme://host:port/db` of a store URL, without user or password.
fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let rest = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
            format!("{scheme}://{rest}")
        }
        None => "(not a URL)".into(),
    }
}

fn bad(var: &'static str, value: &str, expected: &'static str) -> SettingsError {
    SettingsError {
        var,
        shown: format!("{value:?}"),
        expected,
    }
}

fn seconds(var: &'static str, value: &str) -> Result<Duration, SettingsError> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(positive_duration)
        .ok_or_else(|| bad(var, value, "a positive number of seconds"))
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
        let info = store.client().unwrap().get_connection_info().clone();
        assert_eq!(info.redis.db, 2);
        assert_eq!(info.redis.password.as_deref(), Some("hunter22"));
        // The password variable wins over the URL's.
        let s = with(&[
            ("CUSTOM_ROUTER_SHARED_STORE", "rediss://cache.internal:6380"),
            ("CUSTOM_ROUTER_SHARED_STORE_PASSWORD", "from-env\n"),
        ])
        .unwrap();
        let info = s
            .shared_store
            .unwrap()
            .client()
            .unwrap()
            .get_connection_info()
            .clone();
        assert_eq!(info.redis.password.as_deref(), Some("from-env"));
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
}
