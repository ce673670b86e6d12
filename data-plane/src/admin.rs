//! The `/_custom_router/` admin endpoints (and `/metrics`), and who may
//! call them.
//!
//! `set-backends` decides where prompts (and the pools' API keys) go, and
//! `explain` and health's backend list show the routing, so they are
//! doors. What opens them depends on the mode ([`AdminAccess`]):
//!
//! | mode | `set-backends`, `explain` | `health` |
//! |---|---|---|
//! | sidecar, no token | loopback peers only (the Hugging Face contract: the platform calls from inside the pod) | the Hugging Face shape, to anyone |
//! | sidecar, token | anyone presenting it | the Hugging Face shape, to anyone |
//! | standalone, inline, managed, no token | nobody (401 naming `CUSTOM_ROUTER_ADMIN_TOKEN`) | ok, version and counts |
//! | standalone, inline, managed, token | whoever presents it | the backend list with the token |
//!
//! `tasks/{id}/approve` and `tasks/{id}/drop` (parked tasks) are behind
//! the same door as `explain`.
//!
//! A managed proxy refuses `set-backends` even with the token (403): its
//! backend sets belong to the control plane, where `routerctl backends
//! set` changes them for every proxy under the operator's own credential.
//! (It used to forward the call with its own `ROUTER_TOKEN`, so anyone who
//! could reach a proxy could repoint the whole fleet; forwarding the
//! caller's token instead would turn the data plane's port into a relay
//! for control-plane credentials, so the call is refused.)
//!
//! Metrics name every backend's address in their labels. A sidecar serves
//! them to anyone (the Hugging Face contract); the other modes serve them
//! to loopback peers and to callers presenting `CUSTOM_ROUTER_METRICS_TOKEN`
//! (the scraper's token: it opens nothing else) or the admin token.
//!
//! The peer is the TCP peer of the connection, never `X-Forwarded-For`:
//! behind a reverse proxy on the same host every caller is loopback, so
//! set a token there.
//! Tokens are checked by [`router_proto::token::Secret`] (SHA-256 digests
//! compared in constant time). Whoever calls, `set-backends` refuses
//! link-local and cloud metadata addresses the operator did not allow
//! (`router_policy::guard`).

use std::net::IpAddr;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use router_policy::guard::backend_refusal;
use router_policy::Endpoint;
use router_proto::token::{Secret, TokenError};
use serde::Deserialize;

use crate::error::{Forbidden, ProxyError, Unauthorized};
use crate::Shared;

/// Largest admin request body.
const ADMIN_BODY_LIMIT: usize = 1024 * 1024;

/// The mode, as far as the admin doors care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdminMode {
    /// The Hugging Face contract: loopback peers without a token.
    Sidecar,
    /// Standalone or inline: a token or nothing.
    Local,
    /// Managed: a token or nothing; backend sets are the control plane's.
    Managed,
}

/// Who may call the admin endpoints of one proxy.
#[derive(Debug, Clone)]
pub(crate) struct AdminAccess {
    mode: AdminMode,
    /// `CUSTOM_ROUTER_ADMIN_TOKEN`.
    token: Option<Secret>,
    /// `CUSTOM_ROUTER_METRICS_TOKEN`: metrics only.
    metrics_token: Option<Secret>,
}

impl AdminAccess {
    /// The doors of a proxy in `mode` with `token` (checked again here:
    /// settings can be built without `Settings::from_env`).
    pub(crate) fn new(
        mode: AdminMode,
        token: Option<&str>,
        metrics_token: Option<&str>,
    ) -> Result<Self, TokenError> {
        let token = token
            .map(|t| Secret::new(t, "CUSTOM_ROUTER_ADMIN_TOKEN"))
            .transpose()?;
        let metrics_token = metrics_token
            .map(|t| Secret::new(t, "CUSTOM_ROUTER_METRICS_TOKEN"))
            .transpose()?;
        Ok(Self {
            mode,
            token,
            metrics_token,
        })
    }

    /// May a scrape from `peer` carrying `authorization` read the metrics?
    /// Sidecar: anyone. Elsewhere: loopback peers, and the metrics or the
    /// admin token from anywhere.
    fn metrics(&self, peer: IpAddr, authorization: Option<&HeaderValue>) -> Result<(), ProxyError> {
        if self.mode == AdminMode::Sidecar || peer.to_canonical().is_loopback() {
            return Ok(());
        }
        let given = authorization.map(HeaderValue::as_bytes);
        let opens = |t: &Option<Secret>| t.as_ref().is_some_and(|s| s.authorizes(given));
        if opens(&self.metrics_token) || opens(&self.token) {
            Ok(())
        } else {
            Err(ProxyError::Unauthorized(Unauthorized::Metrics))
        }
    }

    /// May a call from `peer` carrying `authorization` change or see the
    /// routing?
    fn authorize(
        &self,
        peer: IpAddr,
        authorization: Option<&HeaderValue>,
    ) -> Result<(), ProxyError> {
        match (&self.token, self.mode) {
            (Some(secret), _) => {
                if secret.authorizes(authorization.map(HeaderValue::as_bytes)) {
                    Ok(())
                } else {
                    Err(ProxyError::Unauthorized(Unauthorized::Token))
                }
            }
            // An IPv4 peer of a dual-stack listener is `::ffff:a.b.c.d`.
            (None, AdminMode::Sidecar) if peer.to_canonical().is_loopback() => Ok(()),
            (None, AdminMode::Sidecar) => Err(ProxyError::Forbidden(Forbidden::NotLoopback)),
            (None, AdminMode::Local | AdminMode::Managed) => {
                Err(ProxyError::Unauthorized(Unauthorized::NoTokenConfigured))
            }
        }
    }

    /// Does health show the backend list? Always in sidecar mode (the
    /// Hugging Face shape); elsewhere only to a caller with the token.
    fn health_details(&self, authorization: Option<&HeaderValue>) -> bool {
        match (&self.token, self.mode) {
            (_, AdminMode::Sidecar) => true,
            (Some(secret), _) => secret.authorizes(authorization.map(HeaderValue::as_bytes)),
            (None, _) => false,
        }
    }

    /// What the startup log says about the doors.
    pub(crate) fn describe(&self) -> String {
        let doors = match (self.mode, self.token.is_some()) {
            (AdminMode::Sidecar, false) => "admin calls (set-backends, explain) are taken from loopback peers only, as CUSTOM_ROUTER_ADMIN_TOKEN is unset; set it to take them from any peer that presents it; health and metrics are open",
            (AdminMode::Sidecar, true) => "admin calls (set-backends, explain) need Authorization: Bearer <CUSTOM_ROUTER_ADMIN_TOKEN>, from any peer, loopback included; health and metrics are open",
            (AdminMode::Local, false) => "admin calls (set-backends, explain) are refused and health shows counts only, as CUSTOM_ROUTER_ADMIN_TOKEN is unset; set it to open them to callers that present it",
            (AdminMode::Local, true) => "admin calls (set-backends, explain) and health's backend list need Authorization: Bearer <CUSTOM_ROUTER_ADMIN_TOKEN>",
            (AdminMode::Managed, false) => "set-backends is refused (the control plane owns backend sets: routerctl backends set); explain is refused and health shows counts only, as CUSTOM_ROUTER_ADMIN_TOKEN is unset",
            (AdminMode::Managed, true) => "set-backends is refused (the control plane owns backend sets: routerctl backends set); explain and health's backend list need Authorization: Bearer <CUSTOM_ROUTER_ADMIN_TOKEN>",
        };
        let metrics = match (self.mode, self.metrics_token.is_some()) {
            (AdminMode::Sidecar, _) => "",
            (_, false) => "; metrics are served to loopback peers (and with the admin token), as CUSTOM_ROUTER_METRICS_TOKEN is unset",
            (_, true) => "; metrics are served to loopback peers and with Authorization: Bearer <CUSTOM_ROUTER_METRICS_TOKEN> (or the admin token)",
        };
        format!("{doors}{metrics}")
    }
}

/// Handles an admin path called from `peer` (the connection's TCP peer).
pub(crate) async fn handle(
    shared: &Shared,
    peer: IpAddr,
    req: Request<Incoming>,
) -> Response<Bytes> {
    let path = req.uri().path().to_string();
    let access = &shared.admin;
    let authorization = req.headers().get(header::AUTHORIZATION);
    let result = match path.as_str() {
        "/_custom_router/health" => {
            only(&req, Method::GET).map(|()| health(shared, access.health_details(authorization)))
        }
        "/_custom_router/metrics" | "/metrics" => only(&req, Method::GET)
            .and_then(|()| access.metrics(peer, authorization))
            .map(|()| metrics(shared)),
        "/_custom_router/set-backends" => {
            match only(&req, Method::POST).and_then(|()| access.authorize(peer, authorization)) {
                Ok(()) if access.mode == AdminMode::Managed => {
                    Err(ProxyError::Forbidden(Forbidden::Managed))
                }
                Ok(()) => set_backends(shared, req).await,
                Err(e) => Err(e),
            }
        }
        "/_custom_router/explain" => {
            match only(&req, Method::POST).and_then(|()| access.authorize(peer, authorization)) {
                Ok(()) => explain(shared, req).await,
                Err(e) => Err(e),
            }
        }
        p if p.starts_with("/_custom_router/tasks/") => {
            match only(&req, Method::POST).and_then(|()| access.authorize(peer, authorization)) {
                Ok(()) => task_action(shared, p).await,
                Err(e) => Err(e),
            }
        }
        _ => Err(ProxyError::NotFound),
    };
    result.unwrap_or_else(|e| {
        if matches!(e, ProxyError::Unauthorized(_) | ProxyError::Forbidden(_)) {
            // The peer and the path, never the header.
            tracing::warn!(%peer, path, refused = e.kind(), "admin call refused");
        }
        e.to_response(None)
    })
}

fn only(req: &Request<Incoming>, method: Method) -> Result<(), ProxyError> {
    if req.method() == method {
        Ok(())
    } else {
        Err(ProxyError::MethodNotAllowed)
    }
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::from(value.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `GET /_custom_router/health`: with `details`, the Hugging Face shape
/// (every backend's address, load and circuit); without, only that it is
/// up, its config version and counts.
fn health(shared: &Shared, details: bool) -> Response<Bytes> {
    if shared.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"ok": false, "draining": true}),
        );
    }
    let snapshot = shared.config.load();
    if let (Some(readiness), false) = (&shared.readiness, snapshot.configured) {
        let reason = readiness.reason();
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({
                "ok": false,
                "config_version": &*snapshot.version,
                "reason": reason,
            }),
        );
    }
    let pools = snapshot.pool_status();
    let queue_depth: usize = pools.iter().map(|p| p.queue_depth).sum();
    if !details {
        return json(
            StatusCode::OK,
            &serde_json::json!({
                "ok": true,
                "queue_depth": queue_depth,
                "config_version": &*snapshot.version,
                "revision": shared.readiness.is_some().then(|| shared.config.revision()),
                "pool_count": pools.len(),
                "backend_count": pools.iter().map(|p| p.endpoints.len()).sum::<usize>(),
            }),
        );
    }
    let backends: Vec<serde_json::Value> = pools
        .iter()
        .flat_map(|p| {
            p.endpoints.iter().map(move |e| {
                let mut b = serde_json::json!({
                    "pool": &*p.name,
                    "addr": &*e.addr,
                    "in_flight": e.in_flight,
                    "ewma_latency": e.ewma_s,
                    "tpot_s": e.tpot_s,
                    "circuit": e.circuit.as_str(),
                    "draining": e.draining,
                    "health": e.health.map(|h| h.as_str()),
                    "suspect": e.suspect.map(|c| c.as_str()),
                    "ejected": e.ejected,
                });
                // What its provider's rate-limit headers said is left, when
                // they said anything (docs/traffic.md).
                if let Some(q) = &e.quota {
                    b["quota"] = serde_json::json!({
                        "requests_remaining": q.requests_remaining,
                        "requests_reset_s": q.requests_reset_s,
                        "tokens_remaining": q.tokens_remaining,
                        "tokens_reset_s": q.tokens_reset_s,
                        "resting": q.resting,
                    });
                }
                b
            })
        })
        .collect();
    let mut body = serde_json::json!({
        "ok": true,
        "queue_depth": queue_depth,
        "config_version": &*snapshot.version,
        "backends": backends,
    });
    // Managed: the control plane's revision applied, runtime marks
    // (circuits, suspicions) included; `config_version` names the config.
    if shared.readiness.is_some() {
        body["revision"] = serde_json::json!(shared.config.revision());
    }
    // With a shared store: whether it is reachable (informational: the
    // proxy serves without it, so readiness does not depend on it).
    if let Some((connected, reachable)) = shared.idempotency.shared_status() {
        body["shared_store"] = serde_json::json!({
            "connected": connected,
            "reachable": reachable,
        });
    }
    json(StatusCode::OK, &body)
}

fn metrics(shared: &Shared) -> Response<Bytes> {
    let snapshot = shared.config.load();
    let text = shared.metrics.render(&snapshot.pool_status());
    let mut resp = Response::new(Bytes::from(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    resp
}

async fn read_admin_body(shared: &Shared, req: Request<Incoming>) -> Result<Bytes, ProxyError> {
    let timeout = shared.settings.client_body_timeout;
    match tokio::time::timeout(
        timeout,
        Limited::new(req.into_body(), ADMIN_BODY_LIMIT).collect(),
    )
    .await
    {
        Err(_) => Err(ProxyError::RequestTimeout(timeout)),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::PayloadTooLarge {
                limit: ADMIN_BODY_LIMIT,
            })
        }
        Ok(Err(e)) => Err(ProxyError::InvalidRequest(format!(
            "could not read the body: {e}"
        ))),
        Ok(Ok(b)) => Ok(b.to_bytes()),
    }
}

/// `POST /_custom_router/tasks/{id}/approve` or `.../drop`: an operator's
/// approval or drop of a parked task, for proxies without a control plane
/// (`routerctl tasks` does the same through one).
async fn task_action(shared: &Shared, path: &str) -> Result<Response<Bytes>, ProxyError> {
    use router_policy::park::Event;
    let rest = path.trim_start_matches("/_custom_router/tasks/");
    let (id, event) = match rest.split_once('/') {
        Some((id, "approve")) => (id, Event::Approve),
        Some((id, "drop")) => (id, Event::Drop),
        _ => return Err(ProxyError::NotFound),
    };
    // A proxy may claim or renew the task between the read and the write:
    // read again and retry.
    for _ in 0..8 {
        let mut v = match shared.tasks.store.get(id).await {
            Ok(Some(v)) => v,
            Ok(None) => return Err(ProxyError::NotFound),
            Err(_) => {
                return Err(ProxyError::SharedStoreUnavailable(
                    crate::error::StoreNeed::Task,
                ))
            }
        };
        let changed = shared
            .tasks
            .change(&mut v, event, |t| {
                // The admin token carries no name: its role says who.
                t.operator = Some("admin api".into());
                t.operator_role = Some("admin".into());
                t.operator_token = None;
            })
            .await;
        match changed {
            Ok(Some(_)) => {
                tracing::info!(
                    task = id,
                    event = event.as_str(),
                    state = v.task.state.as_str(),
                    "parked task changed through the admin API"
                );
                return Ok(json(
                    StatusCode::OK,
                    &v.task.summary(crate::tasks::unix_ms()),
                ));
            }
            Ok(None) => continue,
            Err(crate::tasks::ChangeError::Illegal(e)) => {
                return Err(ProxyError::InvalidRequest(format!("task {id}: {e}")))
            }
            Err(crate::tasks::ChangeError::Store(_)) => {
                return Err(ProxyError::SharedStoreUnavailable(
                    crate::error::StoreNeed::Task,
                ))
            }
        }
    }
    Err(ProxyError::InvalidRequest(format!(
        "task {id} kept changing; try again"
    )))
}

/// `POST /_custom_router/explain`: where would this situation go?
async fn explain(shared: &Shared, req: Request<Incoming>) -> Result<Response<Bytes>, ProxyError> {
    let body = read_admin_body(shared, req).await?;
    let mut situation: router_policy::decide::Situation = serde_json::from_slice(&body)
        .map_err(|e| ProxyError::InvalidRequest(format!("not a situation: {e}")))?;
    let snapshot = shared.config.load();
    // Engine-aware pools the situation does not describe: their live
    // signals, so the answer shows what this proxy would go by now.
    for (name, pool) in &snapshot.pools {
        if !situation.endpoints.contains_key(name) {
            if let Some(live) = pool.endpoint_situations(situation.prompt.as_deref()) {
                situation.endpoints.insert(name.clone(), live);
            }
        }
    }
    router_policy::decide::check_situation(&snapshot.policy, &situation)
        .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
    let answer = router_policy::decide::explain(&snapshot.policy, &situation);
    let value =
        serde_json::to_value(&answer).map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
    Ok(json(StatusCode::OK, &value))
}

#[derive(Deserialize)]
struct SetBackends {
    backends: Vec<String>,
    #[serde(default)]
    pool: Option<String>,
}

async fn set_backends(
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<Response<Bytes>, ProxyError> {
    let body = read_admin_body(shared, req).await?;
    let parsed: SetBackends = serde_json::from_slice(&body).map_err(|e| {
        ProxyError::InvalidRequest(format!(
            "expected {{\"backends\": [\"host:port\", ...], \"pool\": optional}}: {e}"
        ))
    })?;
    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(parsed.backends.len());
    let mut errors = Vec::new();
    for (i, b) in parsed.backends.iter().enumerate() {
        match Endpoint::parse(b) {
            Ok(ep) if endpoints.contains(&ep) => {}
            // Link-local and metadata addresses only when the operator
            // named them (CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS).
            Ok(ep) => match backend_refusal(&ep, &shared.settings.guards.backend_hosts) {
                Some(why) => errors.push(format!("backends[{i}] {b:?}: {why}")),
                None => endpoints.push(ep),
            },
            Err(e) => errors.push(format!("backends[{i}] {b:?}: {e}")),
        }
    }
    if !errors.is_empty() {
        return Err(ProxyError::InvalidRequest(errors.join("; ")));
    }
    let pool = parsed.pool.as_deref().unwrap_or("default");
    let count = endpoints.len();
    let version = shared
        .config
        .set_backends(pool, endpoints)
        .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
    tracing::info!(pool, backends = count, version = &*version, "backends set");
    Ok(json(StatusCode::OK, &serde_json::json!({"ok": true})))
}
