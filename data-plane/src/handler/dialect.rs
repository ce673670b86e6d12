//! Clients of another dialect than the pools': Anthropic Messages clients
//! (Claude Code, the Anthropic SDKs) in front of OpenAI-compatible pools,
//! translated by `router-dialect` (pure; `docs/dialects.md` says what
//! happens to every field).
//!
//! The branch is taken once, at ingress, on the normalized path. `POST
//! /v1/messages` is parsed as an Anthropic request, written as an OpenAI
//! chat completions body (a streamed one with
//! `stream_options.include_usage`, so that its usage can be counted and
//! told), and from then on walks the chain exactly as a `POST
//! /v1/chat/completions` request does: routed by its model and that path,
//! with its tenant, deadline, chain walk, first-token failover, hedging
//! and `Idempotency-Key`. What differs rides on the request's
//! [`Translation`]:
//!
//! - a field no pool of the chain can carry (every pool speaks OpenAI's
//!   dialect) is a 400 naming the field, never dropped silently;
//! - the upstream request: the client's Anthropic headers (`x-api-key`,
//!   `anthropic-version`, `anthropic-beta`, ...) are not sent to a pool of
//!   another dialect, nor `Accept-Encoding` (the answer is read to be
//!   translated); the translated body has its own `Content-Length`; the
//!   client's query (Claude Code's `?beta=true`) stays with the client;
//! - a whole 2xx answer is translated back where the attempt reads it
//!   (`attempt.rs`), or written as a stream of events when the client
//!   asked for one and the pool answered with one JSON body; an answer
//!   that cannot be translated fails over like malformed JSON;
//! - an upstream's error answer (a 4xx passed on; a 429 or 5xx held in
//!   case no later pool answers, read whole for it) reaches the client in
//!   its dialect, with the upstream's status
//!   (`router_dialect::errors::from_upstream`);
//! - a stream is translated as it flows (`tracked_body`'s relay), and the
//!   router's cuts are error events in the client's dialect;
//! - the router's own errors: `ProxyError::to_response_in`.
//!
//! An OpenAI request pays one path compare at ingress and a few `None`
//! checks on the way.
//!
//! `POST /v1/messages/count_tokens` and `GET /v1/models` are answered by
//! the router itself ([`count_tokens`], [`models`]), from the request and
//! the policy, without a backend (and, like a parked task's view, without
//! a route record). With tenants, both need a valid key. A policy that
//! names no model (the sidecar's) passes `GET /v1/models` to its pool as
//! before.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use router_dialect::stream::{answer_stream, StreamOptions, StreamTranslator};
use router_dialect::{Dialect, DialectError, WriteOptions};
use serde_json::json;
use tokio::time::Instant;

use super::{full, ProxyBody};
use crate::config::Snapshot;
use crate::error::ProxyError;
use crate::Shared;

/// Anthropic Messages.
pub(super) const MESSAGES_PATH: &str = "/v1/messages";
/// Anthropic's token count.
pub(super) const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";
/// The models the router serves.
pub(super) const MODELS_PATH: &str = "/v1/models";
/// The path a translated request is routed by and sent to.
pub(super) const CHAT_PATH: &str = "/v1/chat/completions";

/// Anthropic's API key header (a tenant key may come in it).
pub(super) const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
const ANTHROPIC_VERSION: &str = "anthropic-version";

/// The router's endpoints of another dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Own {
    /// `POST /v1/messages`: translated, then routed.
    Messages,
    /// `POST /v1/messages/count_tokens`: answered by the router.
    CountTokens,
    /// `GET /v1/models`: answered by the router.
    Models,
}

/// Which of the router's endpoints of another dialect `path` is, if any.
pub(super) fn own_endpoint(method: &Method, path: &str) -> Option<Own> {
    match path {
        MESSAGES_PATH if method == Method::POST => Some(Own::Messages),
        COUNT_TOKENS_PATH if method == Method::POST => Some(Own::CountTokens),
        MODELS_PATH if method == Method::GET => Some(Own::Models),
        _ => None,
    }
}

/// A request translated at ingress from its client's dialect.
pub(super) struct Translation {
    /// The client's dialect.
    pub(super) client: Dialect,
    /// The client's body and path as it sent them (a parked task is run
    /// again from them, so that its answer is in the client's dialect).
    pub(super) client_body: Bytes,
    pub(super) client_path: http::uri::PathAndQuery,
    /// The client asked for a stream.
    pub(super) stream: bool,
}

/// A request the dialect crate refused: 400, naming the field.
fn refused(e: DialectError) -> ProxyError {
    ProxyError::InvalidRequest(match e {
        DialectError::CannotCarry(_) => {
            format!("no pool of this route can take this request: {e}")
        }
        e => format!("invalid Anthropic Messages request: {e}"),
    })
}

impl Translation {
    /// An Anthropic Messages request (`body`, sent to `path`) as an OpenAI
    /// chat completions body, and what is kept of the client's.
    pub(super) fn messages(
        body: Bytes,
        path: Option<&http::uri::PathAndQuery>,
    ) -> Result<(Bytes, Self), ProxyError> {
        let (openai, stream) = to_openai(&body)?;
        let client_path = path
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static(MESSAGES_PATH));
        Ok((
            openai,
            Self {
                client: Dialect::Anthropic,
                client_body: body,
                client_path,
                stream,
            },
        ))
    }

    /// A 2xx answer of a pool (OpenAI chat completions JSON) as the client
    /// gets it: in its dialect, or as a stream of its events when it asked
    /// for one (the pool answered with one JSON body). `head` gets the
    /// new body's headers.
    pub(super) fn answer(
        &self,
        head: &mut http::response::Parts,
        body: &[u8],
    ) -> Result<Bytes, DialectError> {
        let answer = router_dialect::parse_answer(Dialect::OpenAi, body)?;
        let out = if self.stream {
            head.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            answer_stream(&answer, self.client, &StreamOptions::default())?
        } else {
            head.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            router_dialect::write_answer(&answer, self.client, 0)?
        };
        head.headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
        Ok(Bytes::from(out))
    }

    /// A pool's error answer (`head`, `body`) as the client gets it: in
    /// its dialect, the upstream's status kept. A 2xx answer here is one
    /// that could not be translated (held, passed on when no pool
    /// answered): a 502.
    pub(super) fn error(&self, head: &mut http::response::Parts, body: &[u8]) -> Bytes {
        let e = if head.status.is_success() {
            head.status = StatusCode::BAD_GATEWAY;
            router_dialect::errors::from_upstream(
                self.client,
                502,
                br#"{"error":{"message":"the backend's answer could not be read as a chat completion"}}"#,
            )
        } else {
            router_dialect::errors::from_upstream(self.client, head.status.as_u16(), body)
        };
        let out = Bytes::from(e.body.to_string());
        head.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        head.headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
        out
    }
}

/// The stream translator of a pool's 2xx stream to `client`'s dialect.
pub(super) fn stream_translator(client: Dialect) -> Option<Box<StreamTranslator>> {
    StreamTranslator::new(Dialect::OpenAi, client, StreamOptions::default())
        .ok()
        .map(Box::new)
}

/// An Anthropic Messages body as an OpenAI chat completions body (and
/// whether it asks for a stream); a 400 naming the field when it cannot
/// be.
fn to_openai(body: &[u8]) -> Result<(Bytes, bool), ProxyError> {
    let req = router_dialect::anthropic::parse_request(body).map_err(refused)?;
    let openai = router_dialect::write_request(&req, Dialect::OpenAi, &WriteOptions::default())
        .map_err(refused)?;
    Ok((Bytes::from(openai), req.stream))
}

/// The client's headers as a pool of another dialect gets them (see the
/// module docs); `body_len`: the translated body's length.
pub(super) fn upstream_headers(headers: &mut HeaderMap, body_len: usize) {
    let anthropic: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with("anthropic-"))
        .cloned()
        .collect();
    for name in anthropic {
        headers.remove(name);
    }
    headers.remove(X_API_KEY);
    headers.remove(header::ACCEPT_ENCODING);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
}

/// The tenant a request's credentials name, when the policy has tenants
/// (`Authorization: Bearer` or `x-api-key`).
pub(super) fn tenant<'s>(
    snapshot: &'s Snapshot,
    headers: &HeaderMap,
) -> Result<Option<&'s router_policy::tenant::Tenant>, ProxyError> {
    let Some(tenants) = &snapshot.policy.tenants else {
        return Ok(None);
    };
    tenants
        .identify_credentials(
            headers
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes),
            headers.get(X_API_KEY).map(HeaderValue::as_bytes),
        )
        .map(Some)
        .map_err(ProxyError::Tenant)
}

/// `POST /v1/messages/count_tokens`: the router's estimate of the
/// request's prompt, `{"input_tokens": N}`. The estimate is the one the
/// router itself reserves against a tenant's token limit for the same
/// request: the translated chat body's bytes / 4, rounded up (not a
/// tokenizer's count). The body is read as ingress reads one (bounded,
/// with a timeout) and must be a request the pools can take (else 400
/// naming the field).
pub(super) async fn count_tokens(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let refuse = |e: ProxyError| full(e.to_response_in(Dialect::Anthropic, None));
    let t0 = Instant::now();
    let snapshot = shared.config.load();
    if let Err(e) = tenant(&snapshot, req.headers()) {
        return refuse(e);
    }
    let (parts, body) = req.into_parts();
    let length = parts.headers.get(header::CONTENT_LENGTH);
    let (body, _reserved) = match super::ingress::read_body(shared, t0, length, body).await {
        Ok(b) => b,
        Err(e) => return refuse(e),
    };
    let openai = match to_openai(&body) {
        Ok((b, _)) => b,
        Err(e) => return refuse(e),
    };
    let tokens = (openai.len() as u64).div_ceil(4);
    full(json_response(json!({ "input_tokens": tokens })))
}

/// `GET /v1/models`: the models the routes serve
/// (`router_policy::Policy::served_models` on the chat path; with
/// tenants, those of the routes the caller's tenant may use), in
/// Anthropic's shape when the request carries `anthropic-version`
/// (paged by `limit`, `after_id` and `before_id`), else OpenAI's.
///
/// `None` when the policy names no model at all (a sidecar's one pool
/// has none): the request is then passed to the pools as before, so that
/// a sidecar stays a drop-in for its backend's own list.
pub(super) fn models(shared: &Shared, req: &Request<Incoming>) -> Option<Response<Bytes>> {
    let snapshot = shared.config.load();
    if snapshot
        .policy
        .served_models(CHAT_PATH, |_| true)
        .is_empty()
    {
        return None;
    }
    Some(models_of(&snapshot, req))
}

fn models_of(snapshot: &Snapshot, req: &Request<Incoming>) -> Response<Bytes> {
    let anthropic = req.headers().contains_key(ANTHROPIC_VERSION);
    let dialect = if anthropic {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    let tenant = match tenant(snapshot, req.headers()) {
        Ok(t) => t,
        Err(e) => return e.to_response_in(dialect, None),
    };
    let risk = snapshot.policy.default_risk;
    let ids = snapshot.policy.served_models(CHAT_PATH, |r| {
        tenant.is_none_or(|t| t.admits(&r.name, risk).is_ok())
    });
    if !anthropic {
        let data: Vec<_> = ids
            .iter()
            .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "router"}))
            .collect();
        return json_response(json!({"object": "list", "data": data}));
    }
    let query = Paging::from_query(req.uri().query());
    let (page, has_more) = query.page(&ids);
    let data: Vec<_> = page
        .iter()
        .map(|id| {
            json!({
                "type": "model",
                "id": id,
                "display_name": id,
                // The router knows no release date: the Unix epoch.
                "created_at": "1970-01-01T00:00:00Z",
            })
        })
        .collect();
    json_response(json!({
        "data": data,
        "has_more": has_more,
        "first_id": page.first(),
        "last_id": page.last(),
    }))
}

fn json_response(body: serde_json::Value) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::from(body.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Anthropic's list paging: `limit` (1 to 1000, default 20), `after_id`,
/// `before_id`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Paging {
    limit: Option<usize>,
    after_id: Option<String>,
    before_id: Option<String>,
}

impl Paging {
    const DEFAULT_LIMIT: usize = 20;
    const MAX_LIMIT: usize = 1000;

    fn from_query(query: Option<&str>) -> Self {
        let mut p = Self::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*k {
                "limit" => p.limit = v.trim().parse().ok(),
                "after_id" => p.after_id = Some(v.into_owned()),
                "before_id" => p.before_id = Some(v.into_owned()),
                _ => {}
            }
        }
        p
    }

    /// The page of `ids` asked for, and whether more are on the side it
    /// pages towards. An unknown `after_id` or `before_id` gives an
    /// empty page.
    fn page<'a, 'b>(&self, ids: &'b [&'a str]) -> (&'b [&'a str], bool) {
        let limit = self
            .limit
            .unwrap_or(Self::DEFAULT_LIMIT)
            .clamp(1, Self::MAX_LIMIT);
        let position = |id: &str| ids.iter().position(|m| *m == id);
        let start = match &self.after_id {
            None => 0,
            Some(a) => position(a).map_or(ids.len(), |i| i + 1),
        };
        let end = match &self.before_id {
            None => ids.len(),
            Some(b) => position(b).unwrap_or(0),
        };
        if start >= end {
            return (&[], false);
        }
        if self.before_id.is_some() && self.after_id.is_none() {
            // Paging backwards: the last `limit` before it.
            let from = end.saturating_sub(limit).max(start);
            return (&ids[from..end], from > start);
        }
        let to = end.min(start.saturating_add(limit));
        (&ids[start..to], to < end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_routers_own_endpoints_of_another_dialect_branch() {
        assert_eq!(
            own_endpoint(&Method::POST, "/v1/messages"),
            Some(Own::Messages)
        );
        assert_eq!(
            own_endpoint(&Method::POST, "/v1/messages/count_tokens"),
            Some(Own::CountTokens)
        );
        assert_eq!(own_endpoint(&Method::GET, "/v1/models"), Some(Own::Models));
        for (m, p) in [
            (Method::GET, "/v1/messages"),
            (Method::POST, "/v1/models"),
            (Method::POST, "/v1/chat/completions"),
            (Method::POST, "/v1/messages/batches"),
            (Method::GET, "/v1/models/claude"),
        ] {
            assert_eq!(own_endpoint(&m, p), None, "{m} {p}");
        }
    }

    #[test]
    fn an_anthropic_request_becomes_an_openai_one_or_a_400_naming_the_field() {
        let body = Bytes::from_static(
            br#"{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,
            "system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"hi"}]}"#,
        );
        let pq = http::uri::PathAndQuery::from_static("/v1/messages?beta=true");
        let (openai, t) = Translation::messages(body.clone(), Some(&pq)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&openai).unwrap();
        assert_eq!(v["model"], "claude-sonnet-4-5");
        assert_eq!(
            v["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(t.stream);
        assert_eq!(t.client_body, body);
        assert_eq!(t.client_path.as_str(), "/v1/messages?beta=true");
        // A field no OpenAI pool can carry: named in the 400.
        let e = Translation::messages(
            Bytes::from_static(
                br#"{"model":"m","max_tokens":1,"top_k":5,"messages":[{"role":"user","content":"hi"}]}"#,
            ),
            None,
        )
        .err()
        .unwrap();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert!(e.to_string().contains("`top_k`"), "{e}");
        let e = Translation::messages(Bytes::from_static(b"{\"messages\": 3}"), None)
            .err()
            .unwrap();
        assert!(e.to_string().contains("messages"), "{e}");
    }

    #[test]
    fn the_clients_anthropic_headers_do_not_reach_an_openai_pool() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-api-key", "sk-ant-secret"),
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "prompt-caching-2024-07-31"),
            ("accept-encoding", "gzip"),
            ("content-length", "999"),
            ("x-stainless-lang", "python"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        upstream_headers(&mut h, 42);
        assert!(h.get("x-api-key").is_none());
        assert!(h.get("anthropic-version").is_none());
        assert!(h.get("anthropic-beta").is_none());
        assert!(h.get("accept-encoding").is_none());
        assert_eq!(h["content-length"], "42");
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["x-stainless-lang"], "python");
    }

    #[test]
    fn models_are_paged_as_anthropic_pages_lists() {
        let ids = ["a", "b", "c", "d", "e"];
        let p = |q: &str| Paging::from_query(Some(q)).page(&ids);
        assert_eq!(p(""), (&ids[..], false));
        assert_eq!(p("limit=2"), (&ids[0..2], true));
        assert_eq!(p("limit=2&after_id=b"), (&ids[2..4], true));
        assert_eq!(p("limit=2&after_id=d"), (&ids[4..5], false));
        assert_eq!(p("limit=2&before_id=d"), (&ids[1..3], true));
        assert_eq!(p("limit=5&before_id=c"), (&ids[0..2], false));
        assert_eq!(p("after_id=b&before_id=e"), (&ids[2..4], false));
        assert_eq!(p("after_id=nope"), (&ids[0..0], false));
        // A limit out of range is clamped; one that is not a number is the default.
        assert_eq!(p("limit=0"), (&ids[0..1], true));
        assert_eq!(p("limit=x"), (&ids[..], false));
        // Ids are URL-decoded.
        let ids = ["org/model:1", "b"];
        let page = Paging::from_query(Some("after_id=org%2Fmodel%3A1")).page(&ids);
        assert_eq!(page, (&ids[1..], false));
    }
}
