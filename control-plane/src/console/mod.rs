//! The operator's console: server-rendered pages in the browser, served by
//! the control plane on its own listener (`--console-listen`, loopback
//! `127.0.0.1:50052` by default in the binary, `off` to disable).
//!
//! # Design
//!
//! - **No build step, nothing from outside.** Pages are HTML rendered here
//!   from compile-time templates (`askama`, `control-plane/templates/`),
//!   which escape every value by default: a tenant or route named
//!   `<script>` is shown as text. The stylesheet and the one small script
//!   (the live pages' refresh: it fetches the page again every few seconds
//!   and swaps its `<main>`, no reload, leaving alone a form being filled
//!   in) are compiled into the binary and served from `/static/`. It
//!   works air-gapped.
//! - **Same state, same code.** Pages read the [`Hub`] (the proxies'
//!   records, the policy) and the proxies' shared store (parked tasks)
//!   directly; what only the proxies know (their route records, their
//!   load) they are asked for over their config streams when a page needs
//!   it, with a bounded wait. Every change goes through the function the gRPC
//!   `Admin` service calls: approving a task here is
//!   [`crate::tasks::change`], exactly as `routerctl tasks approve`;
//!   applying, dry-running and rolling back the policy, draining and
//!   forcing circuits are the hub's `apply_policy_by`, `rollback_by`,
//!   `set_backends` and `set_circuit`.
//! - **People, not programs.** A person signs in with a token (operator,
//!   approver or viewer: [`crate::auth`]) or a one-time link the control
//!   plane minted ([`crate::RunningControlPlane::console_signin_link`]);
//!   the console then holds a cookie session with its own CSRF token
//!   ([`session`]). Proxy tokens never sign in. Roles are ordered viewer <
//!   approver < operator: a page shows only the buttons the role may use,
//!   and every POST checks the role again, so a forged one is refused
//!   (403) and changes nothing.
//! - **Headers on every answer.** `Content-Security-Policy: default-src
//!   'self'; frame-ancestors 'none'` (no inline script or style anywhere),
//!   `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`,
//!   `Cache-Control: no-store`.
//! - **Exposure.** Off loopback the console needs TLS (the control plane's
//!   `--tls-cert`/`--tls-key`) or `--insecure`, as the gRPC listener
//!   needs a token ([`crate::check_exposure`]). Under TLS the cookie is
//!   `Secure`.
//! - **Bounded.** Connections at most [`MAX_CONNECTIONS`] at once, a
//!   request's head within [`HEAD_TIMEOUT`], a form's body at most
//!   [`MAX_FORM_BYTES`], sessions and one-time links in bounded tables.
//!
//! Files by job: this one serves and dispatches; [`session`] signs in,
//! keeps sessions and checks CSRF tokens; `pages/` renders one page per
//! file (sign-in, fleet, tasks, pools, policy, explain).

mod pages;
pub(crate) mod session;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::auth::{Role, Tokens};
use crate::hub::Hub;
use session::{Session, Sessions};

/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a client has to send a request's head (and a TLS handshake).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest form body read.
pub const MAX_FORM_BYTES: usize = 64 * 1024;
/// Finished tasks remembered to list after they leave the live set.
const RECENT_TASKS: usize = 500;

/// The console's settings.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// Where to listen (`None`: no console).
    pub listen: Option<SocketAddr>,
    /// How long a session lasts (`--console-session-ttl`).
    pub session_ttl: Duration,
    /// Sessions held at most (`--console-max-sessions`).
    pub max_sessions: usize,
}

impl Default for ConsoleOptions {
    /// No console (the binary and `routerctl up` turn it on); 8 h
    /// sessions, 1,000 at most.
    fn default() -> Self {
        Self {
            listen: None,
            session_ttl: Duration::from_secs(8 * 3600),
            max_sessions: 1000,
        }
    }
}

/// The console's state.
pub(crate) struct Console {
    hub: Weak<Hub>,
    shared_store: Option<router_shared_state::SharedStoreClient>,
    tokens: Arc<Tokens>,
    sessions: Sessions,
    /// Served over TLS: cookies are `Secure`.
    secure: bool,
    /// Tasks seen live, to list them once they finished (newest last).
    recent_tasks: Mutex<VecDeque<String>>,
}

impl Console {
    /// A one-time sign-in link's path and query, as the operator who
    /// started this control plane (`Open` when it has no token).
    pub(crate) fn mint_link(&self) -> Option<String> {
        let role = if self.tokens.is_open() {
            Role::Open
        } else {
            Role::Operator { name: None }
        };
        match self.sessions.mint_link(role) {
            Ok(id) => Some(format!("/signin?once={id}")),
            Err(e) => {
                tracing::warn!(error = %e, "cannot mint a console sign-in link");
                None
            }
        }
    }

    fn remember_tasks<'a>(&self, ids: impl Iterator<Item = &'a str>) {
        let mut recent = self
            .recent_tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in ids {
            if !recent.iter().any(|r| r == id) {
                recent.push_back(id.to_string());
            }
        }
        while recent.len() > RECENT_TASKS {
            recent.pop_front();
        }
    }

    fn recent_tasks(&self) -> Vec<String> {
        self.recent_tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    fn session_of(&self, parts: &http::request::Parts) -> Option<(String, Session)> {
        let id = cookie(parts, session::COOKIE)?;
        let s = self.sessions.get(id)?;
        Some((id.to_string(), s))
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(parts: &'a http::request::Parts, name: &str) -> Option<&'a str> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|h| session::cookie_value(h, name))
}

/// The answer type of every page.
pub(crate) type Answer = Response<Full<Bytes>>;

const CSP: &str = "default-src 'self'; frame-ancestors 'none'";

/// An answer with the console's headers.
pub(crate) fn answer(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Answer {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An HTML page.
pub(crate) fn html(status: StatusCode, body: String) -> Answer {
    answer(status, "text/html; charset=utf-8", body)
}

/// A `303 See Other` to `to` (a path of the console).
pub(crate) fn redirect(to: &str) -> Answer {
    let mut r = answer(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", "");
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Adds a `Set-Cookie`.
pub(crate) fn with_cookie(mut r: Answer, cookie: &str) -> Answer {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

/// The fields of an `application/x-www-form-urlencoded` body.
pub(crate) type Form = HashMap<String, String>;

/// Reads a form body of at most [`MAX_FORM_BYTES`].
async fn read_form(body: Incoming) -> Result<Form, Answer> {
    let bytes = Limited::new(body, MAX_FORM_BYTES)
        .collect()
        .await
        .map_err(|_| pages::error_page(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large"))?
        .to_bytes();
    Ok(form_urlencoded::parse(&bytes).into_owned().collect())
}

/// Serves one request.
async fn handle(console: &Console, req: http::Request<Incoming>) -> Answer {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    match (&parts.method, path.as_str()) {
        (&Method::GET, "/static/console.css") => {
            return answer(StatusCode::OK, "text/css; charset=utf-8", pages::CSS)
        }
        (&Method::GET, "/static/console.js") => {
            return answer(StatusCode::OK, "text/javascript; charset=utf-8", pages::JS)
        }
        // Browsers ask for it on their own; it is not a page to sign in for.
        (&Method::GET, "/favicon.ico") => {
            return pages::error_page(StatusCode::NOT_FOUND, "no icon")
        }
        (&Method::GET, "/signin") => return pages::signin::get(console, &parts),
        (&Method::POST, "/signin") => {
            return match read_form(body).await {
                Ok(form) => pages::signin::post(console, &parts, &form),
                Err(r) => r,
            };
        }
        _ => {}
    }
    let session = console.session_of(&parts);
    match parts.method {
        Method::GET | Method::HEAD => match session {
            None => redirect("/signin"),
            Some((_, s)) => pages::get(console, &s, &path, parts.uri.query()).await,
        },
        Method::POST => {
            let Some((id, s)) = session else {
                return pages::error_page(StatusCode::FORBIDDEN, "sign in first");
            };
            let form = match read_form(body).await {
                Ok(f) => f,
                Err(r) => return r,
            };
            if !Sessions::check_csrf(&s, form.get("csrf").map(String::as_str)) {
                tracing::warn!(path = %path, role = s.role.as_str(), "console: a POST without its CSRF token refused");
                return pages::error_page(
                    StatusCode::FORBIDDEN,
                    "this form's CSRF token is missing or wrong: reload the page and try again",
                );
            }
            pages::post(console, &id, &s, &path, &form).await
        }
        _ => pages::error_page(StatusCode::METHOD_NOT_ALLOWED, "GET or POST only"),
    }
}

/// A TLS acceptor for the console from the control plane's PEM
/// certificate chain and key.
fn tls_acceptor(cert_pem: &str, key_pem: &str) -> Result<tokio_rustls::TlsAcceptor, String> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in --tls-cert".into());
    }
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .map_err(|e| format!("the key: {e}"))?
        .ok_or("no private key in --tls-key")?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// A console bound and serving.
pub(crate) struct Serving {
    /// Its address.
    pub(crate) addr: SocketAddr,
    /// Its state (to mint sign-in links).
    pub(crate) console: Arc<Console>,
    /// The accept loop.
    pub(crate) task: JoinHandle<()>,
}

/// Serves the console on `listener` in a background task.
pub(crate) async fn serve(
    listener: TcpListener,
    options: &ConsoleOptions,
    tls: Option<&(String, String)>,
    hub: Weak<Hub>,
    shared_store: Option<router_shared_state::SharedStoreClient>,
    tokens: Arc<Tokens>,
) -> Result<Serving, crate::StartError> {
    let acceptor = match tls {
        Some((cert, key)) => Some(tls_acceptor(cert, key).map_err(crate::StartError::Tls)?),
        None => None,
    };
    let addr = listener
        .local_addr()
        .map_err(|e| crate::StartError::Bind(SocketAddr::from(([127, 0, 0, 1], 0)), e))?;
    let console = Arc::new(Console {
        hub,
        shared_store,
        tokens,
        sessions: Sessions::new(options.session_ttl, options.max_sessions),
        secure: acceptor.is_some(),
        recent_tasks: Mutex::new(VecDeque::new()),
    });
    let task = tokio::spawn(accept_loop(listener, acceptor, Arc::clone(&console)));
    Ok(Serving {
        addr,
        console,
        task,
    })
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    console: Arc<Console>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (stream, _peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "console: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let console = Arc::clone(&console);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let console = Arc::clone(&console);
                async move { Ok::<_, Infallible>(handle(&console, req).await) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT);
            let served = match acceptor {
                None => http.serve_connection(TokioIo::new(stream), service).await,
                Some(acceptor) => {
                    match tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => http.serve_connection(TokioIo::new(tls), service).await,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "console: TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    }
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "console: connection ended");
            }
        });
    }
}
