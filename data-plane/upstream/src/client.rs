//! The upstream client: a small keep-alive connection pool over
//! `hyper::client::conn::http1`, one per worker thread.
//!
//! Each worker thread (see `lib.rs`) owns one [`UpstreamClient`]: its
//! connections are driven by tasks on that thread's runtime and its idle
//! list is only touched by that thread, so the pool's mutex is never
//! contended. (The client shared by the probes works the same way on the
//! main runtime.)
//!
//! # The pool
//!
//! - Connections are kept per upstream, keyed by scheme and authority
//!   ([`PoolKey`]). A request takes the most recently returned idle
//!   connection of its upstream that is still ready; connections found
//!   closed (the backend hung up while they were idle) are dropped, never
//!   handed out. Without one, a new connection is made: TCP (connect
//!   timeout, `TCP_NODELAY`, keep-alive probes) and, for `https`, rustls
//!   with ALPN `http/1.1` and SNI from the host; its driver task is spawned
//!   on the current runtime.
//! - A connection goes back to the idle list only once its answer's body
//!   was read to the end ([`UpstreamBody`] sees the end). An answer whose
//!   body or response future is dropped early takes its connection with
//!   it: the connection is closed, and the backend sees the cancellation
//!   (an abandoned attempt, a deadline cut, a client gone).
//! - At most `max_idle` (256) idle connections per upstream; one more is
//!   closed instead. An idle connection unused for `idle_timeout` (90 s)
//!   is closed, by the next checkout of its upstream or by a sweeper task
//!   that runs while anything is idle.
//!
//! # Retries
//!
//! A request is sent at most once to a backend, so that nothing is ever
//! generated twice. The one exception is the race every keep-alive client
//! has: an idle connection the backend closed just as it was taken out of
//! the pool. When hyper reports that such a *reused* connection closed
//! before the request was written (`TrySendError` gives the request back),
//! the request is sent again, once, on a fresh connection. An error without
//! the request (it may have been written), or any error on a fresh
//! connection, is returned as is.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::future::Future;

use fnv::FnvHashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{Either, FutureExt};
use http::header::{HeaderValue, HOST};
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;
use tower_service::Service;

/// Connections to plain and TLS upstreams.
pub type Connector = HttpsConnector<HttpConnector<crate::resolver::GuardedResolver>>;

type Sender = http1::SendRequest<OutBody>;

/// A request on its way on the rare paths (new connection, bad URI).
type Sending<'a> =
    Pin<Box<dyn Future<Output = Result<Response<UpstreamBody>, UpstreamError>> + Send + 'a>>;

/// Largest frame of a request body handed to hyper at once.
///
/// The connections write without vectored I/O (`writev(false)`: for the
/// small JSON requests that dominate, one copy into one buffer and one plain
/// write are cheaper), so hyper copies each body frame into its write
/// buffer. Handed over whole, a 30 MiB body would be copied whole, beside
/// the request's own copy; in 64 KiB slices (zero-copy views of the same
/// bytes) the buffer holds at most one slice beyond hyper's own limit.
const OUT_FRAME: usize = 64 * 1024;

/// A request body sent upstream: bytes already read, handed to hyper in
/// slices of at most [`OUT_FRAME`] (one frame for the usual small body).
#[derive(Debug, Default, Clone)]
pub struct OutBody {
    rest: Bytes,
}

impl OutBody {
    /// A body of `bytes`.
    pub fn new(bytes: Bytes) -> Self {
        Self { rest: bytes }
    }
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            return std::task::Poll::Ready(None);
        }
        let chunk = if this.rest.len() <= OUT_FRAME {
            std::mem::take(&mut this.rest)
        } else {
            this.rest.split_to(OUT_FRAME)
        };
        std::task::Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// Error type of the connector.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Idle connections kept per upstream.
const MAX_IDLE_PER_UPSTREAM: usize = 256;
/// How long a connection may stay idle before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// An upstream's identity in the pool: `scheme://authority`, lower case.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey(Arc<str>);

impl PoolKey {
    /// The key of a scheme and authority.
    pub fn new(scheme: &Scheme, authority: &Authority) -> Self {
        Self(
            format!("{scheme}://{authority}")
                .to_ascii_lowercase()
                .into(),
        )
    }

    /// The key of an absolute URI; `None` without scheme or authority.
    pub fn of(uri: &Uri) -> Option<Self> {
        Some(Self::new(uri.scheme()?, uri.authority()?))
    }
}

/// The `Host` header for an absolute URI: the host, with the port unless
/// it is the scheme's default (what hyper-util's client sends).
pub fn host_header(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let default_port = if uri.scheme() == Some(&Scheme::HTTPS) {
        443
    } else {
        80
    };
    match uri.port_u16() {
        Some(port) if port != default_port => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
        _ => HeaderValue::from_str(host).ok(),
    }
}

/// Why an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, timed out, TLS).
    #[error("connect: {0}")]
    Connect(BoxError),
    /// The connection failed while sending or receiving.
    #[error("upstream: {0}")]
    Http(#[from] hyper::Error),
    /// The request's URI names no upstream.
    #[error("bad upstream URI: {0}")]
    Uri(String),
}

impl UpstreamError {
    /// True when no connection could be made.
    pub fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect(_))
    }
}

/// Something the idle list can hold (a connection's sender; a fake in
/// the tests).
trait Reusable {
    /// Can take a request now (false once the connection closed).
    fn is_ready(&self) -> bool;
}

impl Reusable for Sender {
    fn is_ready(&self) -> bool {
        http1::SendRequest::is_ready(self)
    }
}

/// The idle connections of every upstream, most recently returned last.
struct IdleLists<C> {
    /// FNV: two lookups per request on a short, trusted key (an
    /// endpoint's URI from the config).
    lists: FnvHashMap<PoolKey, VecDeque<(C, Instant)>>,
    max_idle: usize,
    idle_timeout: Duration,
    /// A sweeper task is running.
    sweeping: bool,
}

impl<C: Reusable> IdleLists<C> {
    fn new(max_idle: usize, idle_timeout: Duration) -> Self {
        Self {
            lists: FnvHashMap::default(),
            max_idle,
            idle_timeout,
            sweeping: false,
        }
    }

    /// The most recently returned connection of `key` that is ready and
    /// not expired; the closed and expired ones met are dropped.
    fn checkout(&mut self, key: &PoolKey, now: Instant) -> Option<C> {
        let list = self.lists.get_mut(key)?;
        while let Some((conn, since)) = list.pop_back() {
            if now.saturating_duration_since(since) >= self.idle_timeout {
                // The others are older still.
                list.clear();
                break;
            }
            if conn.is_ready() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` as idle; gives it back when the upstream already has
    /// `max_idle` (the caller drops it, which closes it).
    fn put(&mut self, key: &PoolKey, conn: C, now: Instant) -> Result<(), C> {
        let list = match self.lists.get_mut(key) {
            Some(l) => l,
            None => self.lists.entry(key.clone()).or_default(),
        };
        while list
            .front()
            .is_some_and(|(_, since)| now.saturating_duration_since(*since) >= self.idle_timeout)
        {
            list.pop_front();
        }
        if list.len() >= self.max_idle {
            return Err(conn);
        }
        list.push_back((conn, now));
        Ok(())
    }

    /// Drops every expired or closed idle connection; returns how many
    /// are left.
    fn prune(&mut self, now: Instant) -> usize {
        let timeout = self.idle_timeout;
        self.lists.retain(|_, list| {
            list.retain(|(c, since)| {
                now.saturating_duration_since(*since) < timeout && c.is_ready()
            });
            !list.is_empty()
        });
        self.lists.values().map(VecDeque::len).sum()
    }
}

struct Inner {
    connector: Connector,
    idle: Mutex<IdleLists<Sender>>,
}

impl Inner {
    fn idle(&self) -> std::sync::MutexGuard<'_, IdleLists<Sender>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The keep-alive HTTP/1.1 client of one worker thread (cheap to clone:
/// clones share the pool).
#[derive(Clone)]
pub struct UpstreamClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamClient").finish_non_exhaustive()
    }
}

impl UpstreamClient {
    /// A client making its connections with `connector`.
    pub fn new(connector: Connector) -> Self {
        Self::with_limits(connector, MAX_IDLE_PER_UPSTREAM, IDLE_TIMEOUT)
    }

    fn with_limits(connector: Connector, max_idle: usize, idle_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                connector,
                idle: Mutex::new(IdleLists::new(max_idle, idle_timeout)),
            }),
        }
    }

    /// Sends a request with an absolute URI (sets `Host` if absent).
    pub async fn request(
        &self,
        req: Request<OutBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.send(None, req).await
    }

    /// Sends a request to the upstream `key`. With a key, the request's
    /// URI is already in origin form (`/path?query`) and its `Host` set;
    /// without one, the URI is absolute and both are done here.
    ///
    /// Not an `async fn`: on the usual path the request is handed to a
    /// pooled connection before this returns, and the future only waits for
    /// the answer. An `async fn` would keep the request and the connect
    /// path's state in its future (about 900 bytes, copied at every move),
    /// whether a connection had to be made or not.
    pub fn send<'a>(
        &'a self,
        key: Option<&'a PoolKey>,
        mut req: Request<OutBody>,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, UpstreamError>> + Send + 'a {
        let key = match key {
            Some(k) => Cow::Borrowed(k),
            None => match into_origin_form(&mut req) {
                Ok(k) => Cow::Owned(k),
                Err(e) => return Either::Left(Box::pin(std::future::ready(Err(e))) as Sending<'a>),
            },
        };
        let pooled = self.inner.idle().checkout(&key, Instant::now());
        let Some(mut tx) = pooled else {
            return Either::Left(self.on_new_connection(key, req));
        };
        // A combinator rather than an `async` block: the block's future
        // would hold the hyper future twice over and its result beside it
        // (about 1.1 KB); this is the hyper future and three pointers.
        let answer = tx.try_send_request(req);
        Either::Right(answer.then(move |sent| match sent {
            Ok(resp) => Either::Left(std::future::ready(Ok(self.wrap(resp, tx, &key)))),
            Err(mut e) => match e.take_message() {
                // Closed before the request was written: the backend
                // never saw it, so it may go on a fresh connection.
                Some(unsent) => {
                    tracing::debug!(upstream = &*key.0, error = %e.error(), "pooled connection closed before the request was sent; retrying on a new one");
                    Either::Right(self.on_new_connection(key, unsent))
                }
                None => Either::Left(std::future::ready(Err(e.into_error().into()))),
            },
        }))
    }

    /// Sends `req` on a new connection to `key`. Boxed: connecting is the
    /// rare path, and its future (connector, TLS, handshake) would
    /// otherwise make every request's future larger by its size.
    fn on_new_connection<'a>(
        &'a self,
        key: Cow<'a, PoolKey>,
        req: Request<OutBody>,
    ) -> Sending<'a> {
        Box::pin(async move {
            let mut tx = self.connect(&key).await?;
            match tx.try_send_request(req).await {
                Ok(resp) => Ok(self.wrap(resp, tx, &key)),
                Err(e) => Err(e.into_error().into()),
            }
        })
    }

    /// A new connection to `key`, its driver spawned on this runtime.
    async fn connect(&self, key: &PoolKey) -> Result<Sender, UpstreamError> {
        let uri = Uri::try_from(&*key.0).map_err(|e| UpstreamError::Uri(e.to_string()))?;
        let mut connector = self.inner.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(UpstreamError::Connect)?;
        let io = connector.call(uri).await.map_err(UpstreamError::Connect)?;
        // One plain write per request (head and small body copied into one
        // buffer), as on the server side.
        let (tx, conn) = http1::Builder::new().writev(false).handshake(io).await?;
        let upstream = Arc::clone(&key.0);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(upstream = &*upstream, error = %e, "upstream connection ended with an error");
            }
        });
        Ok(tx)
    }

    fn wrap(&self, resp: Response<Incoming>, tx: Sender, key: &PoolKey) -> Response<UpstreamBody> {
        let giveback = GiveBack {
            tx,
            client: Arc::clone(&self.inner),
            key: key.clone(),
        };
        resp.map(|inner| {
            let mut body = UpstreamBody {
                inner,
                giveback: Some(giveback),
            };
            if body.inner.is_end_stream() {
                body.give_back();
            }
            body
        })
    }

    /// Idle connections held for `key` (tests).
    #[cfg(test)]
    fn idle_count(&self, key: &PoolKey) -> usize {
        self.inner.idle().lists.get(key).map_or(0, VecDeque::len)
    }
}

/// Turns an absolute URI into origin form, sets `Host`; the upstream's key.
fn into_origin_form(req: &mut Request<OutBody>) -> Result<PoolKey, UpstreamError> {
    let uri = req.uri();
    let key = PoolKey::of(uri).ok_or_else(|| UpstreamError::Uri(uri.to_string()))?;
    if !req.headers().contains_key(HOST) {
        let host = host_header(uri).ok_or_else(|| UpstreamError::Uri(uri.to_string()))?;
        req.headers_mut().insert(HOST, host);
    }
    let path = match req.uri().path_and_query() {
        Some(pq) if pq.as_str() != "/" => Uri::from(pq.clone()),
        _ => Uri::default(),
    };
    *req.uri_mut() = path;
    Ok(key)
}

/// A connection waiting for its answer's body to end.
struct GiveBack {
    tx: Sender,
    client: Arc<Inner>,
    key: PoolKey,
}

impl GiveBack {
    /// The answer was read to the end: back to the idle list once the
    /// connection can take the next request (closed ones are dropped).
    fn put(self) {
        let GiveBack {
            mut tx,
            client,
            key,
        } = self;
        if tx.is_ready() {
            idle_put(&client, &key, tx);
        } else if !tx.is_closed() {
            // The connection task has not yet taken the end in: wait for it
            // off the request path.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    if tx.ready().await.is_ok() {
                        idle_put(&client, &key, tx);
                    }
                });
            }
        }
    }
}

fn idle_put(client: &Arc<Inner>, key: &PoolKey, tx: Sender) {
    let mut idle = client.idle();
    let full = idle.put(key, tx, Instant::now()).err();
    let start_sweeper = full.is_none() && !idle.sweeping;
    if start_sweeper {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            idle.sweeping = true;
            let every = idle.idle_timeout;
            rt.spawn(sweep(Arc::downgrade(client), every));
        }
    }
    drop(idle);
    // `full`, if any, is dropped here: that connection closes.
}

/// Closes expired idle connections until none is left idle.
async fn sweep(client: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(client) = client.upgrade() else {
            return;
        };
        let mut idle = client.idle();
        if idle.prune(Instant::now()) == 0 {
            idle.sweeping = false;
            return;
        }
    }
}

/// An upstream answer's body. When it has been read to the end, its
/// connection goes back to the pool; dropped before that, it closes the
/// connection (the backend sees the cancellation).
pub struct UpstreamBody {
    inner: Incoming,
    giveback: Option<GiveBack>,
}

impl UpstreamBody {
    fn give_back(&mut self) {
        if let Some(g) = self.giveback.take() {
            g.put();
        }
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").finish_non_exhaustive()
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(_)) if this.inner.is_end_stream() => this.give_back(),
            Some(Ok(_)) => {}
            None => this.give_back(),
            // A broken connection is never reused.
            Some(Err(_)) => this.giveback = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // Read to the end (by the reader, or by the connection, which then
        // waits for the next request): reusable. Otherwise dropping the
        // sender with the body closes the connection.
        let done =
            self.inner.is_end_stream() || self.giveback.as_ref().is_some_and(|g| g.tx.is_ready());
        if done {
            self.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;

    /// A fake connection for the idle-list rules.
    struct Fake(u32, bool);

    impl Reusable for Fake {
        fn is_ready(&self) -> bool {
            self.1
        }
    }

    fn key(s: &str) -> PoolKey {
        PoolKey::of(&Uri::try_from(s).unwrap()).unwrap()
    }

    #[test]
    fn keys_ignore_case_and_differ_by_scheme_and_port() {
        assert_eq!(
            key("http://Example.com:80/a"),
            key("http://example.com:80/b")
        );
        assert_ne!(key("http://example.com"), key("https://example.com"));
        assert_ne!(
            key("http://example.com:8000"),
            key("http://example.com:8001")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_most_recent_ready_connection_is_reused_and_closed_ones_skipped() {
        let mut idle = IdleLists::new(8, IDLE_TIMEOUT);
        let a = key("http://a:1");
        let now = Instant::now();
        assert!(idle.put(&a, Fake(1, true), now).is_ok());
        assert!(idle.put(&a, Fake(2, true), now).is_ok());
        assert!(idle.put(&a, Fake(3, false), now).is_ok());
        assert!(idle.checkout(&key("http://b:1"), now).is_none());
        // 3 closed while idle: dropped, never handed out.
        assert_eq!(idle.checkout(&a, now).map(|c| c.0), Some(2));
        assert_eq!(idle.checkout(&a, now).map(|c| c.0), Some(1));
        assert!(idle.checkout(&a, now).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_max_idle_per_upstream() {
        let mut idle = IdleLists::new(2, IDLE_TIMEOUT);
        let (a, b) = (key("http://a:1"), key("http://b:1"));
        let now = Instant::now();
        assert!(idle.put(&a, Fake(1, true), now).is_ok());
        assert!(idle.put(&a, Fake(2, true), now).is_ok());
        assert_eq!(idle.put(&a, Fake(3, true), now).err().map(|c| c.0), Some(3));
        assert!(idle.put(&b, Fake(4, true), now).is_ok());
        assert_eq!(idle.prune(now), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_expire() {
        let mut idle = IdleLists::new(8, IDLE_TIMEOUT);
        let a = key("http://a:1");
        assert!(idle.put(&a, Fake(1, true), Instant::now()).is_ok());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(idle.put(&a, Fake(2, true), Instant::now()).is_ok());
        tokio::time::advance(Duration::from_secs(31)).await;
        // 1 is 91 s old, 2 is 31 s old.
        assert_eq!(idle.prune(Instant::now()), 1);
        assert_eq!(idle.checkout(&a, Instant::now()).map(|c| c.0), Some(2));
        assert!(idle.put(&a, Fake(3, true), Instant::now()).is_ok());
        tokio::time::advance(IDLE_TIMEOUT).await;
        assert!(idle.checkout(&a, Instant::now()).is_none());
    }

    /// What a scripted backend does with each request it reads.
    #[derive(Clone, Copy)]
    enum Script {
        /// Answer `ok` and keep the connection.
        Answer,
        /// Read the request, close without answering.
        Hang,
    }

    /// A plain-TCP HTTP/1.1 backend on a thread: each connection follows
    /// `script` one request at a time; counts connections and requests.
    struct Backend {
        addr: std::net::SocketAddr,
        connections: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
    }

    fn backend(script: fn(usize) -> Script) -> Backend {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (c, r) = (Arc::clone(&connections), Arc::clone(&requests));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                c.fetch_add(1, Ordering::SeqCst);
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.clear();
                        let n = r.fetch_add(1, Ordering::SeqCst);
                        match script(n) {
                            Script::Hang => return,
                            Script::Answer => {
                                let _ =
                                    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
                            }
                        }
                    }
                });
            }
        });
        Backend {
            addr,
            connections,
            requests,
        }
    }

    fn client() -> UpstreamClient {
        let mut http = HttpConnector::new_with_resolver(crate::resolver::GuardedResolver::new(
            router_policy::HostAllowList::default(),
        ));
        http.enforce_http(false);
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        UpstreamClient::with_limits(connector, 4, IDLE_TIMEOUT)
    }

    async fn get(client: &UpstreamClient, addr: std::net::SocketAddr) -> Result<Bytes, String> {
        let req = Request::get(format!("http://{addr}/x"))
            .body(OutBody::default())
            .unwrap();
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(body.to_bytes())
    }

    #[tokio::test]
    async fn connections_are_reused_after_their_body_ends() {
        let b = backend(|_| Script::Answer);
        let c = client();
        let k = key(&format!("http://{}", b.addr));
        for _ in 0..5 {
            assert_eq!(get(&c, b.addr).await.unwrap(), "ok");
            assert_eq!(c.idle_count(&k), 1);
        }
        assert_eq!(b.connections.load(Ordering::SeqCst), 1);
        assert_eq!(b.requests.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn a_body_dropped_early_closes_its_connection() {
        let b = backend(|_| Script::Answer);
        let c = client();
        let k = key(&format!("http://{}", b.addr));
        // Held before its end: not in the pool, so the next request
        // needs a second connection.
        let req = Request::get(format!("http://{}/x", b.addr))
            .body(OutBody::default())
            .unwrap();
        let resp = c.request(req).await.unwrap();
        assert_eq!(c.idle_count(&k), 0);
        assert_eq!(get(&c, b.addr).await.unwrap(), "ok");
        assert_eq!(b.connections.load(Ordering::SeqCst), 2);
        drop(resp);
    }

    #[tokio::test]
    async fn a_request_on_a_connection_closed_before_sending_is_retried_once_fresh() {
        let b = backend(|_| Script::Answer);
        let c = client();
        let k = key(&format!("http://{}", b.addr));
        // A pooled connection (over an in-memory pipe) that is ready...
        let (near, far) = tokio::io::duplex(4096);
        let (tx, conn) = http1::handshake(hyper_util::rt::TokioIo::new(near))
            .await
            .unwrap();
        let driver = tokio::spawn(conn);
        while !tx.is_ready() {
            tokio::task::yield_now().await;
        }
        idle_put(&c.inner, &k, tx);
        // ...whose peer hangs up just before the request goes out (the
        // connection task sees it only once the request is queued).
        drop(far);
        assert_eq!(get(&c, b.addr).await.unwrap(), "ok");
        assert!(driver.is_finished());
        // Sent once, on a new connection.
        assert_eq!(b.connections.load(Ordering::SeqCst), 1);
        assert_eq!(b.requests.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_request_the_backend_may_have_read_is_never_resent() {
        let b = backend(|n| if n == 0 { Script::Answer } else { Script::Hang });
        let c = client();
        assert_eq!(get(&c, b.addr).await.unwrap(), "ok");
        // Sent on the reused connection, read, then the backend hangs up.
        assert!(get(&c, b.addr).await.is_err());
        assert_eq!(b.connections.load(Ordering::SeqCst), 1);
        assert_eq!(b.requests.load(Ordering::SeqCst), 2);
        // And a fresh connection's failure is not retried either.
        assert!(get(&c, b.addr).await.is_err());
        assert_eq!(b.connections.load(Ordering::SeqCst), 2);
        assert_eq!(b.requests.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn connect_errors_are_told_apart() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let req = Request::get(format!("http://127.0.0.1:{port}/"))
            .body(OutBody::default())
            .unwrap();
        let err = client().request(req).await.unwrap_err();
        assert!(err.is_connect(), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_closes_idle_connections() {
        let b = backend(|_| Script::Answer);
        let c = client();
        let k = key(&format!("http://{}", b.addr));
        assert_eq!(get(&c, b.addr).await.unwrap(), "ok");
        assert_eq!(c.idle_count(&k), 1);
        tokio::time::sleep(IDLE_TIMEOUT * 2 + Duration::from_secs(1)).await;
        assert_eq!(c.idle_count(&k), 0);
    }
}
