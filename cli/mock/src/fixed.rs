//! The benchmarks' fixed backend: one canned chat completion, served by a
//! hyper http1 server on its own single-threaded tokio runtime (its own OS
//! thread), so that a load generator's runtime cannot starve it. Nothing
//! is simulated: it measures the router, not a model.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

/// The error [`Backend::start`] returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The fixed OpenAI-style answer (about 300 bytes).
pub const RESPONSE_BODY: &str = concat!(
    r#"{"id":"chatcmpl-bench-0001","object":"chat.completion","created":1700000000,"#,
    r#""model":"bench","choices":[{"index":0,"message":{"role":"assistant","#,
    r#""content":"Hello! This is a fixed answer from the benchmark backend."},"#,
    r#""logprobs":null,"finish_reason":"stop"}],"#,
    r#""usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#
);

/// The backend thread's name (its CPU time is read by this name).
pub const THREAD_NAME: &str = "bench-backend";

/// A running backend; stops its runtime when dropped.
pub struct Backend {
    /// Where it listens.
    pub addr: SocketAddr,
    hits: Arc<AtomicU64>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Backend {
    /// Binds 127.0.0.1:0 and starts serving on a new thread.
    pub fn start() -> Result<Self, BoxError> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let hits = Arc::new(AtomicU64::new(0));
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread_hits = Arc::clone(&hits);
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            eprintln!("backend: cannot register listener: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        () = accept_loop(listener, thread_hits) => {}
                        _ = stop_rx => {}
                    }
                });
            })?;
        Ok(Self {
            addr,
            hits,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// How many chat-completion requests it has answered so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, hits: Arc<AtomicU64>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Usually EMFILE; back off briefly rather than spin.
                eprintln!("backend: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let hits = Arc::clone(&hits);
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, Arc::clone(&hits)));
            // Errors here are clients going away; nothing to do about them.
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    hits: Arc<AtomicU64>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let is_chat = req.method() == Method::POST && req.uri().path() == "/v1/chat/completions";
    // Read the whole request body so the connection stays reusable.
    if req.into_body().collect().await.is_err() {
        return Ok(status_only(StatusCode::BAD_REQUEST));
    }
    if !is_chat {
        return Ok(status_only(StatusCode::NOT_FOUND));
    }
    hits.fetch_add(1, Ordering::Relaxed);
    let mut resp = Response::new(Full::new(Bytes::from_static(RESPONSE_BODY.as_bytes())));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

fn status_only(status: StatusCode) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = status;
    resp
}
