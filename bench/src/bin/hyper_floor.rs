//! `hyper-floor`: the least a hyper-based proxy can do per request, as a
//! yardstick for the router's overhead.
//!
//! One thread, one current-thread tokio runtime; each client connection
//! gets its own keep-alive upstream connection (hyper's http1 client) and
//! every request is forwarded as is, its answer streamed back. No routing,
//! no queue, no logs, no metrics, no header rewriting. It speaks just
//! enough of the router's sidecar contract for `proxy-bench` to drive it:
//! `CUSTOM_ROUTER_PORT` / `CUSTOM_ROUTER_BIND`, `GET
//! /_custom_router/health` and `POST /_custom_router/set-backends` (the
//! first backend is used). Run it with
//! `proxy-bench --targets router,nginx --router-bin target/release/hyper-floor`.

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Body = UnsyncBoxBody<Bytes, hyper::Error>;
/// A client connection's own upstream connection, opened on first use.
type Upstream = Arc<tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<Incoming>>>>;

fn text(status: StatusCode, s: &'static str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from_static(s.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("CUSTOM_ROUTER_PORT")
        .unwrap_or_else(|_| "3000".into())
        .parse()?;
    let bind = std::env::var("CUSTOM_ROUTER_BIND").unwrap_or_else(|_| "127.0.0.1".into());
    let addr: SocketAddr = format!("{bind}:{port}").parse()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(addr).await?;
        let backend: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve(stream, Arc::clone(&backend)));
        }
    })
}

async fn serve(stream: TcpStream, backend: Arc<Mutex<Option<String>>>) {
    let upstream: Upstream = Arc::new(tokio::sync::Mutex::new(None));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let backend = Arc::clone(&backend);
        let upstream = Arc::clone(&upstream);
        async move { Ok::<_, Infallible>(handle(req, backend, upstream).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(
    req: Request<Incoming>,
    backend: Arc<Mutex<Option<String>>>,
    upstream: Upstream,
) -> Response<Body> {
    match req.uri().path() {
        "/_custom_router/health" => return text(StatusCode::OK, "ok"),
        "/_custom_router/set-backends" => {
            let Ok(body) = req.into_body().collect().await else {
                return text(StatusCode::BAD_REQUEST, "unreadable body");
            };
            let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&body.to_bytes());
            let first = parsed.ok().and_then(|v| {
                v.get("backends")?
                    .get(0)?
                    .as_str()
                    .map(|s| s.trim_start_matches("http://").to_string())
            });
            let ok = first.is_some();
            if let Ok(mut b) = backend.lock() {
                *b = first;
            }
            return if ok {
                text(StatusCode::OK, "{\"ok\":true}")
            } else {
                text(StatusCode::BAD_REQUEST, "no backend")
            };
        }
        _ => {}
    }
    let Some(addr) = backend.lock().ok().and_then(|b| b.clone()) else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "no backend");
    };
    let mut slot = upstream.lock().await;
    if slot.as_ref().is_none_or(|tx| tx.is_closed()) {
        let Ok(io) = TcpStream::connect(&addr).await else {
            return text(StatusCode::BAD_GATEWAY, "connect failed");
        };
        let _ = io.set_nodelay(true);
        let Ok((tx, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await else {
            return text(StatusCode::BAD_GATEWAY, "handshake failed");
        };
        tokio::spawn(conn);
        *slot = Some(tx);
    }
    let Some(tx) = slot.as_mut() else {
        return text(StatusCode::BAD_GATEWAY, "no connection");
    };
    if tx.ready().await.is_err() {
        *slot = None;
        return text(StatusCode::BAD_GATEWAY, "connection closed");
    }
    let fut = tx.send_request(req);
    drop(slot);
    match fut.await {
        Ok(resp) => resp.map(|b| b.boxed_unsync()),
        Err(_) => text(StatusCode::BAD_GATEWAY, "upstream failed"),
    }
}
