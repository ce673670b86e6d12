//! Mock model endpoints: in-process HTTP/1.1 servers that stand in for an
//! OpenAI-compatible model server (Ollama, vLLM, TGI, a cloud API).
//!
//! A [`MockModel`] listens on a real TCP socket, so the router under test talks
//! to it exactly as it would talk to a real backend. What it simulates:
//!
//! - **Service time**: every request takes [`MockConfig::latency`] (measured
//!   with `tokio::time::sleep`, so tests may pause or scale time).
//! - **Saturation**: with [`MockConfig::max_concurrency`] set, requests past the
//!   cap either wait for a slot ([`OverCap::Queue`], like a saturated vLLM) or
//!   are answered `429` at once with `Retry-After: 1` ([`OverCap::Reject429`]).
//!   A slot is held for the whole answer, including a streamed one.
//! - **Answer shapes** ([`Behavior`]): chat-completion JSON, an SSE token
//!   stream with one flushed frame per chunk, a request that never gets an
//!   answer, an error status, a broken JSON body, or a redirect. The behavior
//!   and the latency can be switched while the server runs.
//! - **Clients going away**: when the client disconnects mid-answer, hyper
//!   drops the handler or the response body; a drop guard then counts the
//!   request as cancelled and releases its slot.
//!
//! Every request except `GET /health` is recorded ([`MockModel::requests`]) and
//! counted ([`MockModel::stats`]) before it is served. Every response carries
//! `x-mock-name: <name>` so a test can tell which backend answered.
//! `GET /health` always answers `200 {"ok":true}`, whatever the behavior, and
//! is neither recorded nor counted.
//!
//! [`MockModel::stop`] closes the listener and every live connection, so a
//! stopped mock refuses connections like a backend that went away.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, Sleep};

/// Header echoed on every response with the mock's [`MockConfig::name`].
pub const MOCK_NAME_HEADER: &str = "x-mock-name";

/// Completion tokens reported in the `usage` of every JSON answer.
const COMPLETION_TOKENS: u64 = 5;

/// How a mock answers a (non-health) request.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Behavior {
    /// OpenAI chat-completion JSON after `latency`.
    #[default]
    Json,
    /// Chat-completion JSON whose message content is this text (e.g. a
    /// JSON document, or not, for structured-output tests).
    Content(String),
    /// `text/event-stream`: `chunks` SSE `data: {...}` events, `interval`
    /// apart (the first after `latency`), then `data: [DONE]`.
    ///
    /// The response head is sent at once; each event is its own body frame.
    Sse {
        /// Number of `chat.completion.chunk` events before `[DONE]`.
        chunks: usize,
        /// Pause between two consecutive events.
        interval: Duration,
    },
    /// Accept the request and never answer (until the client goes away).
    Hang,
    /// Answer this status with an OpenAI-style JSON error body after
    /// `latency` (e.g. 500, 503). A 429 also carries `Retry-After: 1`.
    /// A code outside 100..=999 is answered as 500.
    Status(u16),
    /// 200 with content-type `application/json` but a body that is not valid
    /// JSON, after `latency`.
    MalformedJson,
    /// 302 redirect with `Location` set to the given URL, after `latency`.
    /// A URL that is not a valid header value is answered as 500.
    Redirect(String),
}

/// What happens to a request that arrives while `max_concurrency` requests
/// are being served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OverCap {
    /// Wait for a slot, like a saturated vLLM queueing requests.
    #[default]
    Queue,
    /// Answer `429` at once with `Retry-After: 1`.
    Reject429,
}

/// Configuration of a [`MockModel`].
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Name echoed in `x-mock-name` and in the `served_by` answer field.
    /// Must be a valid HTTP header value.
    pub name: String,
    /// Service time of each request (see [`Behavior`] for where it applies).
    pub latency: Duration,
    /// How many requests are served at once; `None` means no limit.
    pub max_concurrency: Option<usize>,
    /// What happens to requests past `max_concurrency`.
    pub over_cap: OverCap,
    /// How requests are answered.
    pub behavior: Behavior,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            name: "mock".to_owned(),
            latency: Duration::ZERO,
            max_concurrency: None,
            over_cap: OverCap::Queue,
            behavior: Behavior::Json,
        }
    }
}

/// Counters of a [`MockModel`], as returned by [`MockModel::stats`].
///
/// Health checks are not counted. Once the mock is idle,
/// `received == completed + cancelled + rejected_429`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MockStats {
    /// Requests received (their body fully read).
    pub received: u64,
    /// Requests whose full answer was produced.
    pub completed: u64,
    /// Requests whose client went away before the answer finished, including
    /// requests dropped while queued or hanging.
    pub cancelled: u64,
    /// Requests currently holding a slot (being served, not queued).
    pub in_flight: u64,
    /// Highest `in_flight` seen.
    pub max_in_flight: u64,
    /// Requests answered 429 because the concurrency cap was reached with
    /// [`OverCap::Reject429`] (a 429 from [`Behavior::Status`] counts as
    /// completed instead).
    pub rejected_429: u64,
    /// TCP connections accepted (a keep-alive client reuses them).
    pub connections: u64,
}

/// A request as the mock received it.
#[derive(Clone, Debug)]
pub struct ReceivedRequest {
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// Path and query, e.g. `/v1/chat/completions?x=1`.
    pub path: String,
    /// Request headers.
    pub headers: HeaderMap,
    /// The full request body.
    pub body: Bytes,
    /// When it arrived.
    pub received_at: Instant,
}

/// A request whose answer the mock produced in full: a generation paid for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The request's `X-Request-Id`, if it had one.
    pub request_id: Option<String>,
    /// When the last byte of the answer was produced.
    pub at: Instant,
}

/// A running mock model endpoint. Dropping it shuts the server down in the
/// background; [`MockModel::stop`] does so and waits until it is done.
pub struct MockModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Dropping this sender tells the server task to shut down.
    shutdown: oneshot::Sender<()>,
    server: JoinHandle<()>,
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
            }),
            name: config.name,
            name_header,
            stats: Mutex::new(MockStats::default()),
            requests: Mutex::new(Vec::new()),
            generations: Mutex::new(Vec::new()),
            pages: Mutex::new(std::collections::HashMap::new()),
            next_id: AtomicU64::new(1),
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

    /// A snapshot of the counters.
    pub fn stats(&self) -> MockStats {
        *lock(&self.shared.stats)
    }

    /// Serves `body` with `status` for `GET path` (not recorded or counted),
    /// e.g. Ollama's `/api/ps` or vLLM's `/metrics` for capacity probes.
    pub fn set_page(&self, path: &str, status: u16, body: &str) {
        lock(&self.shared.pages).insert(path.to_string(), (status, body.to_string()));
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
}

/// State shared by the handle, the server task and every request.
struct Shared {
    name: String,
    name_header: HeaderValue,
    /// Concurrency slots, when capped.
    slots: Option<Arc<Semaphore>>,
    over_cap: OverCap,
    live: Mutex<Live>,
    stats: Mutex<MockStats>,
    requests: Mutex<Vec<ReceivedRequest>>,
    generations: Mutex<Vec<Generation>>,
    /// Fixed answers to `GET` paths (capacity probes: `/api/ps`, `/metrics`).
    pages: Mutex<std::collections::HashMap<String, (u16, String)>>,
    /// Numbers the `chatcmpl-<n>` ids.
    next_id: AtomicU64,
}

/// The settings that can change while the mock runs.
struct Live {
    behavior: Behavior,
    latency: Duration,
}

/// Waits `latency`; a zero latency does not wait for a timer tick.
async fn service_time(latency: Duration) {
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
}

/// Locks a mutex, ignoring poisoning (the data stays consistent: every
/// critical section is a few plain assignments).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Accepts connections until `shutdown` fires (or its sender is dropped), then
/// closes the listener and drops every connection.
async fn serve(listener: TcpListener, shared: Arc<Shared>, mut shutdown: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    lock(&shared.stats).connections += 1;
                    connections.spawn(serve_connection(stream, Arc::clone(&shared)));
                }
                // E.g. out of file descriptors: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reap finished connections so the set does not grow forever.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    // Aborts every connection and waits until each is dropped, which drops
    // the in-progress handlers and bodies (counted as cancelled).
    connections.shutdown().await;
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| handle(Arc::clone(&shared), request));
    // Connection errors (client gone, malformed request) only end this
    // connection.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// Answers one request. Dropping this future at any await point (client gone)
/// is accounted for by the [`Tracker`].
async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<MockBody>, Infallible> {
    if request.method() == Method::GET && request.uri().path() == "/health" {
        let body = MockBody::full(Bytes::from_static(br#"{"ok":true}"#), None);
        return Ok(shared.respond(StatusCode::OK, Some("application/json"), body));
    }
    if request.method() == Method::GET {
        let page = lock(&shared.pages).get(request.uri().path()).cloned();
        if let Some((status, text)) = page {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = MockBody::full(Bytes::from(text), None);
            return Ok(shared.respond(status, Some("application/json"), body));
        }
    }

    let (parts, body) = request.into_parts();
    let Ok(body) = body.collect().await.map(|collected| collected.to_bytes()) else {
        // The client went away while sending the body; nobody will read this.
        let body = MockBody::full(Bytes::new(), None);
        return Ok(shared.respond(StatusCode::BAD_REQUEST, None, body));
    };
    let request_id = parts
        .headers
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let prompt_len = body.len();
    let model = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|json| json.get("model").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "mock".to_owned());

    let (behavior, latency) = {
        let live = lock(&shared.live);
        (live.behavior.clone(), live.latency)
    };
    lock(&shared.requests).push(ReceivedRequest {
        received_at: Instant::now(),
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        headers: parts.headers,
        body,
    });
    lock(&shared.stats).received += 1;
    let mut tracker = Tracker::new(Arc::clone(&shared), request_id.clone());

    let permit = match (&shared.slots, shared.over_cap) {
        (None, _) => None,
        // `acquire_owned` only fails on a closed semaphore, which never happens.
        (Some(slots), OverCap::Queue) => Arc::clone(slots).acquire_owned().await.ok(),
        (Some(slots), OverCap::Reject429) => match Arc::clone(slots).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                tracker.reject();
                let message = "mock is at its concurrency limit";
                return Ok(shared.error_response(StatusCode::TOO_MANY_REQUESTS, message, None));
            }
        },
    };
    tracker.start_serving(permit);

    let id = format!(
        "chatcmpl-{}",
        shared.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let response = match behavior {
        Behavior::Json | Behavior::Content(_) => {
            let content = match &behavior {
                Behavior::Content(c) => c.clone(),
                _ => format!("hello from {}", shared.name),
            };
            service_time(latency).await;
            let prompt_tokens = prompt_len.div_ceil(4) as u64;
            let answer = json!({
                "id": id,
                "object": "chat.completion",
                "model": model,
                "served_by": shared.name,
                "request_id": request_id,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": COMPLETION_TOKENS,
                    "total_tokens": prompt_tokens + COMPLETION_TOKENS,
                },
            });
            let body = MockBody::full(Bytes::from(answer.to_string()), Some(tracker));
            shared.respond(StatusCode::OK, Some("application/json"), body)
        }
        Behavior::Sse { chunks, interval } => {
            let mut frames = VecDeque::with_capacity(chunks + 1);
            for i in 0..chunks {
                let event = json!({
                    "id": id,
                    "object": "chat.completion.chunk",
                    "model": model,
                    "served_by": shared.name,
                    "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}}],
                });
                let delay = if i == 0 { latency } else { interval };
                frames.push_back((delay, Bytes::from(format!("data: {event}\n\n"))));
            }
            let done_delay = if chunks == 0 { latency } else { Duration::ZERO };
            frames.push_back((done_delay, Bytes::from_static(b"data: [DONE]\n\n")));
            let body = MockBody::new(frames, false, Some(tracker));
            let mut response = shared.respond(StatusCode::OK, Some("text/event-stream"), body);
            response
                .headers_mut()
                .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
        Behavior::Hang => {
            // Never answers; the tracker counts the request as cancelled when
            // hyper drops this future.
            match std::future::pending::<Infallible>().await {}
        }
        Behavior::Status(code) => {
            service_time(latency).await;
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let message = format!("mock {} answered {}", shared.name, status.as_u16());
            shared.error_response(status, &message, Some(tracker))
        }
        Behavior::MalformedJson => {
            service_time(latency).await;
            let truncated = format!(
                r#"{{"id":"{id}","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assi"#
            );
            let body = MockBody::full(Bytes::from(truncated), Some(tracker));
            shared.respond(StatusCode::OK, Some("application/json"), body)
        }
        Behavior::Redirect(url) => {
            service_time(latency).await;
            match HeaderValue::from_str(&url) {
                Ok(location) => {
                    let body = MockBody::full(Bytes::new(), Some(tracker));
                    let mut response = shared.respond(StatusCode::FOUND, None, body);
                    response.headers_mut().insert(LOCATION, location);
                    response
                }
                Err(_) => {
                    let message = format!("redirect URL {url:?} is not a valid header value");
                    shared.error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &message,
                        Some(tracker),
                    )
                }
            }
        }
    };
    Ok(response)
}

impl Shared {
    /// A response with `x-mock-name` and, if given, a content type.
    fn respond(
        &self,
        status: StatusCode,
        content_type: Option<&'static str>,
        body: MockBody,
    ) -> Response<MockBody> {
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            HeaderName::from_static(MOCK_NAME_HEADER),
            self.name_header.clone(),
        );
        if let Some(content_type) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        }
        response
    }

    /// An OpenAI-style error answer; a 429 carries `Retry-After: 1`.
    fn error_response(
        &self,
        status: StatusCode,
        message: &str,
        tracker: Option<Tracker>,
    ) -> Response<MockBody> {
        let (kind, code) = match status.as_u16() {
            429 => ("rate_limit_error", json!("rate_limit_exceeded")),
            400..=499 => ("invalid_request_error", Value::Null),
            _ => ("server_error", Value::Null),
        };
        let error = json!({
            "error": {"message": message, "type": kind, "param": null, "code": code},
        });
        let body = MockBody::full(Bytes::from(error.to_string()), tracker);
        let mut response = self.respond(status, Some("application/json"), body);
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// How a tracked request ended, as far as known.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Not finished: counted as cancelled if dropped like this.
    Unfinished,
    /// The full answer was produced.
    Completed,
    /// Rejected over the cap (counted in `rejected_429`).
    Rejected,
}

/// Drop guard for one request: lives in the handler, then in the response
/// body, and settles the counters and the concurrency slot when dropped.
struct Tracker {
    shared: Arc<Shared>,
    request_id: Option<String>,
    /// Whether this request counts in `in_flight`.
    serving: bool,
    /// The concurrency slot, released after the counters are updated.
    permit: Option<OwnedSemaphorePermit>,
    outcome: Outcome,
}

impl Tracker {
    fn new(shared: Arc<Shared>, request_id: Option<String>) -> Tracker {
        Tracker {
            shared,
            request_id,
            serving: false,
            permit: None,
            outcome: Outcome::Unfinished,
        }
    }

    /// The request got its slot (if capped) and is now being served.
    fn start_serving(&mut self, permit: Option<OwnedSemaphorePermit>) {
        self.permit = permit;
        self.serving = true;
        let mut stats = lock(&self.shared.stats);
        stats.in_flight += 1;
        stats.max_in_flight = stats.max_in_flight.max(stats.in_flight);
    }

    fn reject(&mut self) {
        self.outcome = Outcome::Rejected;
        lock(&self.shared.stats).rejected_429 += 1;
    }

    fn complete(&mut self) {
        self.outcome = Outcome::Completed;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let mut stats = lock(&self.shared.stats);
        if self.serving {
            stats.in_flight -= 1;
        }
        match self.outcome {
            Outcome::Unfinished => stats.cancelled += 1,
            Outcome::Completed => {
                stats.completed += 1;
                lock(&self.shared.generations).push(Generation {
                    request_id: self.request_id.take(),
                    at: Instant::now(),
                });
            }
            Outcome::Rejected => {}
        }
        drop(stats);
        // Release the slot only now, so that the next request's `in_flight`
        // increment never overlaps this one.
        drop(self.permit.take());
    }
}

/// A response body made of frames, each produced after its own delay, one
/// frame per data chunk (so each is flushed on its own). The request's
/// [`Tracker`] rides along and is marked completed when the last frame is
/// produced; if hyper drops the body earlier (client gone) it counts as
/// cancelled.
struct MockBody {
    /// Remaining frames with the delay before each.
    frames: VecDeque<(Duration, Bytes)>,
    /// Whether the length is known up front (sent as `content-length`);
    /// otherwise the body is chunked.
    fixed_length: bool,
    /// The running delay before the first remaining frame.
    delay: Option<Pin<Box<Sleep>>>,
    tracker: Option<Tracker>,
}

impl MockBody {
    fn new(
        frames: VecDeque<(Duration, Bytes)>,
        fixed_length: bool,
        mut tracker: Option<Tracker>,
    ) -> MockBody {
        if frames.is_empty() {
            if let Some(tracker) = &mut tracker {
                tracker.complete();
            }
        }
        MockBody {
            frames,
            fixed_length,
            delay: None,
            tracker,
        }
    }

    /// A single-frame body sent at once with a `content-length`.
    fn full(data: Bytes, tracker: Option<Tracker>) -> MockBody {
        let frames = if data.is_empty() {
            VecDeque::new()
        } else {
            VecDeque::from([(Duration::ZERO, data)])
        };
        MockBody::new(frames, true, tracker)
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let Some(&(wait, _)) = this.frames.front() else {
            return Poll::Ready(None);
        };
        if !wait.is_zero() {
            let delay = this
                .delay
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
            ready!(delay.as_mut().poll(cx));
            this.delay = None;
        }
        let Some((_, data)) = this.frames.pop_front() else {
            return Poll::Ready(None);
        };
        if this.frames.is_empty() {
            if let Some(tracker) = &mut this.tracker {
                tracker.complete();
            }
        }
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        if self.fixed_length {
            let len = self.frames.iter().map(|(_, data)| data.len() as u64).sum();
            SizeHint::with_exact(len)
        } else {
            SizeHint::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tokio::io::AsyncWriteExt;

    /// A one-shot HTTP/1.1 client on its own connection.
    async fn send(
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: &str,
    ) -> hyper::Result<Response<Incoming>> {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .header("x-request-id", "req-1")
            .body(http_body_util::Full::new(Bytes::from(body.to_owned())))
            .expect("request");
        sender.send_request(request).await
    }

    async fn post(addr: SocketAddr, body: &str) -> Response<Incoming> {
        send(addr, "POST", "/v1/chat/completions", body)
            .await
            .expect("response")
    }

    async fn body_bytes(response: Response<Incoming>) -> Bytes {
        response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
    }

    /// Polls `check` until it holds, failing after a few seconds.
    async fn eventually(mock: &MockModel, check: impl Fn(&MockStats) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let stats = mock.stats();
            if check(&stats) {
                return;
            }
            assert!(Instant::now() < deadline, "condition never held: {stats:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn config(behavior: Behavior) -> MockConfig {
        MockConfig {
            name: "m1".to_owned(),
            behavior,
            ..MockConfig::default()
        }
    }

    #[tokio::test]
    async fn json_answer_with_usage_and_recording() {
        let mock = MockModel::start(config(Behavior::Json))
            .await
            .expect("start");
        assert_eq!(mock.url(), format!("http://{}", mock.host_port()));
        let request_body = r#"{"model":"llama3","messages":[]}"#; // 32 bytes
        let response = send(
            mock.addr(),
            "POST",
            "/v1/chat/completions?a=1",
            request_body,
        )
        .await
        .expect("response");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[MOCK_NAME_HEADER], "m1");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let answer: Value = serde_json::from_slice(&body_bytes(response).await).expect("json");
        assert_eq!(answer["object"], "chat.completion");
        assert_eq!(answer["model"], "llama3");
        assert_eq!(answer["served_by"], "m1");
        assert_eq!(answer["request_id"], "req-1");
        assert_eq!(answer["choices"][0]["message"]["content"], "hello from m1");
        assert_eq!(answer["usage"]["prompt_tokens"], 8);
        assert_eq!(answer["usage"]["completion_tokens"], 5);
        assert_eq!(answer["usage"]["total_tokens"], 13);
        assert!(answer["id"].as_str().expect("id").starts_with("chatcmpl-"));

        let requests = mock.requests();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].method, "POST");
        assert_eq!(requests[0].path, "/v1/chat/completions?a=1");
        assert_eq!(requests[0].headers["x-request-id"], "req-1");
        assert_eq!(requests[0].body, request_body);
        eventually(&mock, |s| s.completed == 1).await;
        let stats = mock.stats();
        assert_eq!(
            (stats.received, stats.cancelled, stats.in_flight),
            (1, 0, 0)
        );

        // Without a JSON model field the answer names the model "mock".
        let answer: Value =
            serde_json::from_slice(&body_bytes(post(mock.addr(), "not json").await).await)
                .expect("json");
        assert_eq!(answer["model"], "mock");
        assert_eq!(answer["usage"]["prompt_tokens"], 2);
        mock.stop().await;
    }

    #[tokio::test]
    async fn health_is_always_ok_and_not_counted() {
        let mock = MockModel::start(config(Behavior::Hang))
            .await
            .expect("start");
        let response = send(mock.addr(), "GET", "/health", "")
            .await
            .expect("response");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[MOCK_NAME_HEADER], "m1");
        assert_eq!(body_bytes(response).await, r#"{"ok":true}"#);
        // Health checks are neither recorded nor counted (only the TCP
        // connection they came on is).
        assert_eq!(
            mock.stats(),
            MockStats {
                connections: 1,
                ..MockStats::default()
            }
        );
        assert!(mock.requests().is_empty());
        mock.stop().await;
    }

    #[tokio::test]
    async fn queue_serves_one_at_a_time() {
        let mock = MockModel::start(MockConfig {
            latency: Duration::from_millis(50),
            max_concurrency: Some(1),
            over_cap: OverCap::Queue,
            ..MockConfig::default()
        })
        .await
        .expect("start");
        let started = Instant::now();
        let answers = futures_util::future::join_all((0..3).map(|_| post(mock.addr(), "{}"))).await;
        for response in answers {
            assert_eq!(response.status(), StatusCode::OK);
            body_bytes(response).await;
        }
        assert!(started.elapsed() >= Duration::from_millis(150));
        eventually(&mock, |s| s.completed == 3).await;
        let stats = mock.stats();
        assert_eq!(stats.max_in_flight, 1);
        assert_eq!(
            (stats.received, stats.in_flight, stats.rejected_429),
            (3, 0, 0)
        );
        mock.stop().await;
    }

    #[tokio::test]
    async fn reject429_past_the_cap() {
        let mock = MockModel::start(MockConfig {
            latency: Duration::from_millis(300),
            max_concurrency: Some(1),
            over_cap: OverCap::Reject429,
            ..MockConfig::default()
        })
        .await
        .expect("start");
        let addr = mock.addr();
        let first = tokio::spawn(async move { post(addr, "{}").await.status() });
        eventually(&mock, |s| s.in_flight == 1).await;
        let rejected = post(addr, "{}").await;
        assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(rejected.headers()[RETRY_AFTER], "1");
        assert_eq!(rejected.headers()[MOCK_NAME_HEADER], "mock");
        let error: Value = serde_json::from_slice(&body_bytes(rejected).await).expect("json");
        assert_eq!(error["error"]["code"], "rate_limit_exceeded");
        assert_eq!(first.await.expect("first"), StatusCode::OK);
        eventually(&mock, |s| s.completed == 1).await;
        let stats = mock.stats();
        assert_eq!(
            (stats.received, stats.rejected_429, stats.max_in_flight),
            (2, 1, 1)
        );
        mock.stop().await;
    }

    #[tokio::test]
    async fn hang_then_client_drop_counts_cancelled_and_frees_the_slot() {
        let mock = MockModel::start(MockConfig {
            max_concurrency: Some(1),
            behavior: Behavior::Hang,
            ..MockConfig::default()
        })
        .await
        .expect("start");
        let mut stream = TcpStream::connect(mock.addr()).await.expect("connect");
        stream
            .write_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}",
            )
            .await
            .expect("write");
        eventually(&mock, |s| s.in_flight == 1).await;
        drop(stream);
        eventually(&mock, |s| s.cancelled == 1 && s.in_flight == 0).await;
        assert_eq!(mock.stats().completed, 0);

        // The slot is free again.
        mock.set_behavior(Behavior::Json);
        assert_eq!(post(mock.addr(), "{}").await.status(), StatusCode::OK);
        mock.stop().await;
    }

    #[tokio::test]
    async fn sse_streams_separate_chunks() {
        let interval = Duration::from_millis(100);
        let mock = MockModel::start(config(Behavior::Sse {
            chunks: 3,
            interval,
        }))
        .await
        .expect("start");
        let response = post(mock.addr(), r#"{"model":"m","stream":true}"#).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        assert_eq!(response.headers()[CACHE_CONTROL], "no-cache");
        let mut body = response.into_body();
        let mut chunks = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.expect("frame").into_data() {
                chunks.push((Instant::now(), data));
            }
        }
        let events: Vec<&str> = chunks
            .iter()
            .map(|(_, data)| std::str::from_utf8(data).expect("utf-8"))
            .collect();
        assert_eq!(events.len(), 4, "{events:?}");
        for (i, event) in events[..3].iter().enumerate() {
            let json = event
                .strip_prefix("data: ")
                .and_then(|e| e.strip_suffix("\n\n"))
                .expect("sse framing");
            let json: Value = serde_json::from_str(json).expect("json");
            assert_eq!(json["object"], "chat.completion.chunk");
            assert_eq!(json["served_by"], "m1");
            assert_eq!(json["choices"][0]["delta"]["content"], format!("tok{i} "));
        }
        assert_eq!(events[3], "data: [DONE]\n\n");
        // The first chunk arrived two intervals before the last one was sent.
        let spread = chunks[2].0 - chunks[0].0;
        assert!(
            spread >= interval * 2 - Duration::from_millis(20),
            "{spread:?}"
        );
        eventually(&mock, |s| s.completed == 1 && s.in_flight == 0).await;
        mock.stop().await;
    }

    #[tokio::test]
    async fn sse_client_drop_mid_stream_counts_cancelled() {
        let mock = MockModel::start(config(Behavior::Sse {
            chunks: 10,
            interval: Duration::from_secs(10),
        }))
        .await
        .expect("start");
        let mut body = post(mock.addr(), "{}").await.into_body();
        body.frame().await.expect("first chunk").expect("frame");
        drop(body);
        eventually(&mock, |s| s.cancelled == 1 && s.in_flight == 0).await;
        mock.stop().await;
    }

    #[tokio::test]
    async fn error_malformed_and_redirect_behaviors() {
        let mock = MockModel::start(config(Behavior::Status(503)))
            .await
            .expect("start");
        let response = post(mock.addr(), "{}").await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get(RETRY_AFTER).is_none());
        let error: Value = serde_json::from_slice(&body_bytes(response).await).expect("json");
        assert_eq!(error["error"]["type"], "server_error");

        mock.set_behavior(Behavior::Status(429));
        let response = post(mock.addr(), "{}").await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[RETRY_AFTER], "1");

        mock.set_behavior(Behavior::MalformedJson);
        let response = post(mock.addr(), "{}").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        assert!(serde_json::from_slice::<Value>(&body_bytes(response).await).is_err());

        mock.set_behavior(Behavior::Redirect("http://elsewhere/v1".to_owned()));
        let response = post(mock.addr(), "{}").await;
        assert_eq!(response.status(), StatusCode::FOUND);
        assert_eq!(response.headers()[LOCATION], "http://elsewhere/v1");
        assert_eq!(response.headers()[MOCK_NAME_HEADER], "m1");

        eventually(&mock, |s| s.completed == 4 && s.rejected_429 == 0).await;
        mock.stop().await;
    }

    #[tokio::test]
    async fn stop_refuses_new_connections_and_closes_live_ones() {
        let mock = MockModel::start(config(Behavior::Json))
            .await
            .expect("start");
        let addr = mock.addr();
        // A keep-alive connection, idle after one answer.
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut sender, connection) = hyper::client::conn::http1::handshake::<
            _,
            http_body_util::Empty<Bytes>,
        >(TokioIo::new(stream))
        .await
        .expect("handshake");
        let connection = tokio::spawn(connection);
        let request = Request::get("/v1/models").header("host", "x");
        let response = sender
            .send_request(request.body(http_body_util::Empty::new()).expect("request"))
            .await
            .expect("response");
        body_bytes(response).await;

        mock.stop().await;
        assert!(TcpStream::connect(addr).await.is_err());
        // The server closed the idle connection: the client side ends.
        tokio::time::timeout(Duration::from_secs(5), connection)
            .await
            .expect("connection closed")
            .expect("join")
            .expect("clean close");
    }

    #[tokio::test]
    async fn stop_drops_hanging_requests() {
        let mock = MockModel::start(config(Behavior::Hang))
            .await
            .expect("start");
        let addr = mock.addr();
        let pending = tokio::spawn(async move { send(addr, "POST", "/", "{}").await });
        eventually(&mock, |s| s.in_flight == 1).await;
        tokio::time::timeout(Duration::from_secs(5), mock.stop())
            .await
            .expect("stop returns");
        let outcome = tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .expect("client sees the close")
            .expect("join");
        assert!(outcome.is_err(), "no answer expected: {outcome:?}");
    }

    #[tokio::test]
    async fn set_latency_applies_to_new_requests() {
        let mock = MockModel::start(config(Behavior::Json))
            .await
            .expect("start");
        mock.set_latency(Duration::from_millis(100));
        let started = Instant::now();
        body_bytes(post(mock.addr(), "{}").await).await;
        assert!(started.elapsed() >= Duration::from_millis(100));
        mock.stop().await;
    }

    #[tokio::test]
    async fn invalid_name_is_rejected() {
        let config = MockConfig {
            name: "bad\nname".to_owned(),
            ..MockConfig::default()
        };
        let error = MockModel::start(config).await.expect_err("invalid name");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }
}
