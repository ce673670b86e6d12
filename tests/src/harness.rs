//! Starting a router in-process and talking to it over real sockets.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_proxy::{Mode, ProxyOptions, RunningProxy, Settings};
use serde_json::Value;

/// Route decision lines written by a proxy under test.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Every complete line so far, parsed as JSON.
    pub fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("route log line is JSON"))
            .collect()
    }

    /// Waits (up to 5 s) until at least `n` lines were written.
    pub async fn wait_for(&self, n: usize) -> Vec<Value> {
        for _ in 0..500 {
            let lines = self.lines();
            if lines.len() >= n {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("expected {n} route log lines, got {}", self.lines().len());
    }
}

/// The admin token [`TestProxy::start`] gives proxies in standalone,
/// inline and managed mode when the test sets none (their admin calls and
/// health details need one); the harness's own admin calls present it.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A proxy under test, listening on 127.0.0.1.
pub struct TestProxy {
    /// The running proxy.
    pub proxy: RunningProxy,
    /// Its route decision log.
    pub log: LogCapture,
    /// A client for it.
    pub client: TestClient,
    /// The admin token it was started with, presented by the helpers.
    pub admin_token: Option<String>,
}

impl TestProxy {
    /// Starts a sidecar-mode proxy with `settings` (bind and port are set
    /// to 127.0.0.1:0).
    pub async fn sidecar(settings: Settings) -> Self {
        Self::start(settings, Mode::Sidecar).await
    }

    /// Starts a proxy in `mode` on 127.0.0.1. Outside sidecar mode, a
    /// proxy without an admin token gets [`ADMIN_TOKEN`] (see
    /// [`TestProxy::start_as_given`] for one without).
    pub async fn start(mut settings: Settings, mode: Mode) -> Self {
        settings.bind = [127, 0, 0, 1].into();
        if mode != Mode::Sidecar && settings.admin_token.is_none() {
            settings.admin_token = Some(ADMIN_TOKEN.into());
        }
        Self::start_as_given(settings, mode).await
    }

    /// Starts a proxy in `mode` with `settings` as they are (bind address
    /// and admin token included), on a free port.
    pub async fn start_as_given(mut settings: Settings, mode: Mode) -> Self {
        settings.port = 0;
        let admin_token = settings.admin_token.clone();
        let log = LogCapture::default();
        let proxy = router_proxy::start(ProxyOptions {
            settings,
            mode,
            route_log: Box::new(log.clone()),
        })
        .await
        .expect("proxy starts");
        Self {
            proxy,
            log,
            client: TestClient::new(),
            admin_token,
        }
    }

    /// `Authorization: Bearer <its admin token>`, when it has one.
    pub fn admin_header(&self) -> Vec<(&'static str, String)> {
        self.admin_token
            .iter()
            .map(|t| ("authorization", format!("Bearer {t}")))
            .collect()
    }

    /// An admin call presenting its admin token (if any).
    pub async fn admin_call(&self, method: Method, path: &str, body: String) -> TestResponse {
        let auth = self.admin_header();
        let headers: Vec<(&str, &str)> = auth.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.client
            .send(method, &self.url(path), &headers, body)
            .await
    }

    /// [`TestProxy::with_policy`] with `redis` as its shared store,
    /// returned once connected to it.
    pub async fn on_store(
        redis: &crate::redis::RedisServer,
        settings: Settings,
        yaml: &str,
    ) -> Self {
        let settings = Settings {
            shared_store: Some(router_proxy::SharedStore::new(&redis.url()).expect("a store URL")),
            ..settings
        };
        let proxy = Self::with_policy(settings, yaml).await;
        eventually(Duration::from_secs(5), "store connected", || {
            proxy.proxy.shared_store_connected()
        })
        .await;
        proxy
    }

    /// Starts a proxy routing by the policy `yaml` (given in-process,
    /// validated against `settings.guards` as the proxy would).
    pub async fn with_policy(settings: Settings, yaml: &str) -> Self {
        let policy = router_policy::document::load_with(yaml, &settings.queue, &settings.guards)
            .expect("valid test policy");
        Self::start(settings, Mode::Inline(Box::new(policy))).await
    }

    /// Applies a new policy, as a reload would.
    pub fn apply(&self, yaml: &str) {
        let policy = router_policy::document::load(yaml, &router_policy::QueueSettings::default())
            .expect("valid test policy");
        self.proxy.config().apply_policy(policy, "test");
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.proxy.local_addr()
    }

    /// `http://127.0.0.1:PORT` + `path` (loopback also when it listens on
    /// every address).
    pub fn url(&self, path: &str) -> String {
        let mut addr = self.addr();
        if addr.ip().is_unspecified() {
            addr.set_ip([127, 0, 0, 1].into());
        }
        format!("http://{addr}{path}")
    }

    /// `POST /_custom_router/set-backends` from 127.0.0.1 with its admin
    /// token (if any); panics unless it answers 200.
    pub async fn set_backends(&self, backends: &[String]) {
        let body = serde_json::json!({ "backends": backends }).to_string();
        let r = self
            .admin_call(Method::POST, "/_custom_router/set-backends", body)
            .await;
        assert_eq!(r.status, StatusCode::OK, "set-backends: {}", r.text());
    }

    /// `POST /_custom_router/set-backends` for a named pool.
    pub async fn set_backends_pool(&self, pool: &str, backends: &[String]) {
        let body = serde_json::json!({ "backends": backends, "pool": pool }).to_string();
        let r = self
            .admin_call(Method::POST, "/_custom_router/set-backends", body)
            .await;
        assert_eq!(r.status, StatusCode::OK, "set-backends: {}", r.text());
    }

    /// `GET /_custom_router/health` as JSON, with its admin token (if
    /// any), so with the backend list.
    pub async fn health(&self) -> Value {
        let r = self
            .admin_call(Method::GET, "/_custom_router/health", String::new())
            .await;
        // 503: draining, or a managed proxy with no config yet (the body
        // says which).
        assert!(
            matches!(r.status, StatusCode::OK | StatusCode::SERVICE_UNAVAILABLE),
            "health answered {}: {}",
            r.status,
            r.text()
        );
        r.json()
    }

    /// Polls `GET /_custom_router/health` every 10 ms until `cond` holds of
    /// the answer, which it returns; panics after 10 s, naming `what`.
    pub async fn wait_health(&self, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT_AT_MOST;
        loop {
            let health = self.health().await;
            if cond(&health) {
                return health;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for: {what}; health: {health}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `GET /metrics` text.
    pub async fn metrics(&self) -> String {
        self.client
            .send(Method::GET, &self.url("/metrics"), &[], "")
            .await
            .text()
    }

    /// A chat completion with extra headers.
    pub async fn chat_with(&self, headers: &[(&str, &str)], body: &str) -> TestResponse {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.client
            .send(
                Method::POST,
                &self.url("/v1/chat/completions"),
                &all,
                body.to_string(),
            )
            .await
    }

    /// A chat completion for `model`.
    pub async fn chat(&self, model: &str) -> TestResponse {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
        })
        .to_string();
        self.client
            .send(
                Method::POST,
                &self.url("/v1/chat/completions"),
                &[("content-type", "application/json")],
                body,
            )
            .await
    }
}

/// A keep-alive HTTP/1.1 client.
#[derive(Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for TestClient {
    fn default() -> Self {
        Self::new()
    }
}

impl TestClient {
    /// A new client with its own connection pool.
    pub fn new() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        }
    }

    /// Sends a request and reads the whole answer.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> TestResponse {
        let mut req = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(body.into()))
            .expect("valid test request");
        let resp = self.client.request(req).await.expect("request sent");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body read").to_bytes();
        TestResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// Sends a request and returns the streaming response.
    pub async fn stream(
        &self,
        method: Method,
        url: &str,
        body: impl Into<Bytes>,
    ) -> http::Response<hyper::body::Incoming> {
        let req = Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(body.into()))
            .expect("valid test request");
        self.client.request(req).await.expect("request sent")
    }
}

/// A complete answer.
#[derive(Debug, Clone)]
pub struct TestResponse {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl TestResponse {
    /// Body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The `error.type` of a router error.
    pub fn error_type(&self) -> String {
        self.json()["error"]["type"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub use router_test_kit::wait::{eventually, WAIT_AT_MOST};

/// Sum of the in-flight counts in a health answer.
pub fn health_in_flight(health: &Value) -> u64 {
    health["backends"]
        .as_array()
        .map(|b| b.iter().map(|e| e["in_flight"].as_u64().unwrap_or(0)).sum())
        .unwrap_or(0)
}

/// A TCP relay on 127.0.0.1 that pipes each connection it accepts to
/// `target`, byte for byte (TLS goes through untouched), and counts them:
/// a test sees a client's connection attempts, and when each ended, without
/// changing what either side sees. Dropping it drops every connection.
pub struct TcpRelay {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpRelay {
    /// Starts a relay to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("relay binds");
        let addr = listener.local_addr().expect("relay address");
        let accepted = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (accepted, closed) = (Arc::clone(&accepted), Arc::clone(&closed));
            async move {
                // Owned here, so that aborting the task drops every connection.
                let mut connections = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        accept = listener.accept() => {
                            let Ok((mut client, _)) = accept else {
                                // E.g. out of file descriptors: back off, not spin.
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            };
                            accepted.fetch_add(1, Ordering::SeqCst);
                            let closed = Arc::clone(&closed);
                            connections.spawn(async move {
                                if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                                    // Ends when both sides are done, or on an error.
                                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                                }
                                closed.fetch_add(1, Ordering::SeqCst);
                            });
                        }
                        Some(_) = connections.join_next(), if !connections.is_empty() => {}
                    }
                }
            }
        });
        Self {
            addr,
            accepted,
            closed,
            task,
        }
    }

    /// The address to give the client.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections that ended so far (either side closed them).
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::SeqCst)
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A tenant item of a policy's `spec.tenants`: `name`, the hash of `key`,
/// and `limits` (a YAML flow map's contents; empty for none).
pub fn tenant_item(name: &str, key: &str, limits: &str) -> String {
    let limits = if limits.is_empty() {
        String::new()
    } else {
        format!("      limits: {{{limits}}}\n")
    };
    format!(
        "    - name: {name}\n      keys: [\"{}\"]\n{limits}",
        router_policy::tenant::key_hash_text(key)
    )
}
