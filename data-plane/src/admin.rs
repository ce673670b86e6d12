//! The `/_custom_router/` admin endpoints (and `/metrics`).
//!
//! `health` and `metrics` are always open (probes and scrapers carry no
//! token). `set-backends` changes where traffic goes, so when
//! `CUSTOM_ROUTER_ADMIN_TOKEN` is set it requires `Authorization: Bearer
//! <token>`, compared in constant time. Unset, it stays open as in the
//! Hugging Face router, and the startup log says so. Whatever the token,
//! `set-backends` refuses link-local and cloud metadata addresses the
//! operator did not allow (`router_policy::guard`).

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use router_policy::guard::backend_refusal;
use router_policy::Endpoint;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::error::ProxyError;
use crate::Shared;

/// Largest admin request body.
const ADMIN_BODY_LIMIT: usize = 1024 * 1024;

/// Handles an admin path.
pub(crate) async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Bytes> {
    let path = req.uri().path().to_string();
    let result = match path.as_str() {
        "/_custom_router/health" => only(&req, Method::GET).map(|()| health(shared)),
        "/_custom_router/metrics" | "/metrics" => only(&req, Method::GET).map(|()| metrics(shared)),
        "/_custom_router/set-backends" => {
            match only(&req, Method::POST).and_then(|()| authorize(shared, &req)) {
                Ok(()) => set_backends(shared, req).await,
                Err(e) => Err(e),
            }
        }

        "/_custom_router/explain" => {
            match only(&req, Method::POST).and_then(|()| authorize(shared, &req)) {
                Ok(()) => explain(shared, req).await,
                Err(e) => Err(e),
            }
        }
        _ => Err(ProxyError::NotFound),
    };
    result.unwrap_or_else(|e| e.to_response(None))
}

fn only(req: &Request<Incoming>, method: Method) -> Result<(), ProxyError> {
    if req.method() == method {
        Ok(())
    } else {
        Err(ProxyError::MethodNotAllowed)
    }
}

fn authorize(shared: &Shared, req: &Request<Incoming>) -> Result<(), ProxyError> {
    let Some(expected) = shared.settings.admin_token.as_deref() else {
        return Ok(());
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(ProxyError::Unauthorized)
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

fn health(shared: &Shared) -> Response<Bytes> {
    if shared.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"ok": false, "draining": true}),
        );
    }
    let snapshot = shared.config.load();
    let pools = snapshot.pool_status();
    let queue_depth: usize = pools.iter().map(|p| p.queue_depth).sum();
    let backends: Vec<serde_json::Value> = pools
        .iter()
        .flat_map(|p| {
            p.endpoints.iter().map(move |e| {
                serde_json::json!({
                    "pool": &*p.name,
                    "addr": &*e.addr,
                    "in_flight": e.in_flight,
                    "ewma_latency": e.ewma_s,
                    "circuit": e.circuit.as_str(),
                    "draining": e.draining,
                })
            })
        })
        .collect();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "ok": true,
            "queue_depth": queue_depth,
            "config_version": &*snapshot.version,
            "backends": backends,
        }),
    )
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

/// `POST /_custom_router/explain`: where would this situation go?
async fn explain(shared: &Shared, req: Request<Incoming>) -> Result<Response<Bytes>, ProxyError> {
    let body = read_admin_body(shared, req).await?;
    let situation: router_policy::decide::Situation = serde_json::from_slice(&body)
        .map_err(|e| ProxyError::InvalidRequest(format!("not a situation: {e}")))?;
    let snapshot = shared.config.load();
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
    if let Some(cp) = &shared.control_plane {
        // Managed: the control plane owns backend sets, so every proxy
        // learns this one (and this proxy gets it back on its stream).
        let revision = crate::managed::forward_set_backends(cp, pool, &endpoints)
            .await
            .map_err(|e| match e {
                crate::managed::ForwardError::Refused(why) => ProxyError::InvalidRequest(why),
                crate::managed::ForwardError::Unreachable(why) => ProxyError::Upstream {
                    endpoint: "control plane".into(),
                    detail: why,
                },
            })?;
        tracing::info!(
            pool,
            backends = count,
            revision,
            "backends set through the control plane"
        );
        return Ok(json(
            StatusCode::OK,
            &serde_json::json!({"ok": true, "revision": revision}),
        ));
    }
    let version = shared
        .config
        .set_backends(pool, endpoints)
        .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
    tracing::info!(pool, backends = count, version = &*version, "backends set");
    Ok(json(StatusCode::OK, &serde_json::json!({"ok": true})))
}
