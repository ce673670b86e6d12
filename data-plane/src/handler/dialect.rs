//! Clients and pools of different dialects: Anthropic Messages clients
//! (Claude Code, the Anthropic SDKs) and pools of `provider: anthropic`
//! and `provider: gemini`, besides OpenAI chat completions, translated by
//! `router-dialect` (pure; `docs/dialects.md` says what happens to every
//! field). A pool's dialect is its provider's ([`pool_dialect`]);
//! `azure_openai` speaks OpenAI's, on its deployment's path.
//!
//! The branch is taken once, at ingress, on the normalized path. `POST
//! /v1/messages` is parsed as an Anthropic request and from then on walks
//! the chain exactly as a `POST /v1/chat/completions` request does: routed
//! by its model and that path, with its tenant, deadline, chain walk,
//! first-token failover, hedging and `Idempotency-Key`. Once the
//! candidate pools are known ([`prepare`]), the request is written once
//! for each dialect among them: an OpenAI chat body (streamed with
//! `stream_options.include_usage`, so that its usage can be counted and
//! told), an Anthropic one (the client's own when it is Anthropic's:
//! a pass-through) and a Gemini one. A pool whose dialect cannot carry a
//! field is passed over, saying why; none left is a 400 naming the field.
//! An OpenAI chat request pays this only when the policy has a pool of
//! another dialect. What differs then rides on the request's
//! [`Translation`]:
//!
//! - the upstream request (`upstream_request.rs`): an Anthropic pool gets
//!   `/v1/messages`, its key as `x-api-key`, `anthropic-version`; a
//!   Gemini pool `/v1beta/models/{model}:generateContent` (or
//!   `:streamGenerateContent?alt=sse`) and its key as `x-goog-api-key`;
//!   neither the client's `Authorization`; an OpenAI pool never gets an
//!   Anthropic client's `x-api-key` or `anthropic-*` headers (nor does a
//!   Gemini pool); no `Accept-Encoding` (the answer is read); the
//!   client's query (Claude Code's `?beta=true`) stays with the client;
//! - a whole 2xx answer from a pool of another dialect than the client's
//!   is translated where the attempt reads it (`attempt.rs`), or written
//!   as a stream of events when the client asked for one and the pool
//!   answered with one JSON body; an answer that cannot be translated
//!   fails over like malformed JSON;
//! - such a pool's error answer (a 4xx passed on; a 429 or 5xx held in
//!   case no later pool answers, read whole for it) reaches the client in
//!   its dialect, with the pool's status
//!   (`router_dialect::errors::from_upstream`);
//! - such a pool's stream is translated as it flows (`tracked_body`'s
//!   relay), and the router's cuts are error events in the client's
//!   dialect;
//! - the router's own errors: `ProxyError::to_response_in`.
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

/// The dialect a pool speaks (`azure_openai` speaks OpenAI's, on its own
/// paths: `upstream_request`).
pub(super) fn pool_dialect(pool: Option<&router_policy::document::Pool>) -> Dialect {
    pool.map_or(Dialect::OpenAi, |p| p.provider.dialect())
}

/// A request whose client or pools speak another dialect than OpenAI's
/// chat completions: what each attempt needs to write it for its pool
/// and to give its answer back in the client's dialect.
pub(super) struct Translation {
    /// The client's dialect.
    pub(super) client: Dialect,
    /// The client's body and path as it sent them (a parked task is run
    /// again from them, so that its answer is in the client's dialect).
    pub(super) client_body: Bytes,
    pub(super) client_path: http::uri::PathAndQuery,
    /// The client asked for a stream.
    pub(super) stream: bool,
    /// An OpenAI client asked for the usage chunk in its stream.
    pub(super) include_usage: bool,
    /// OpenAI's `created` for answers written in its dialect (the
    /// request's arrival, Unix seconds).
    pub(super) created: u64,
    /// The body for Anthropic pools (the client's own, or translated),
    /// parsed for the pool's model.
    pub(super) anthropic: Option<super::upstream_request::ParsedBody>,
    /// The body for Gemini pools (translated; the model goes in the path).
    pub(super) gemini: Option<Bytes>,
}

/// What [`prepare`] gives the walk.
pub(super) struct Prepared {
    /// The body for OpenAI-dialect pools (the client's own when none is
    /// left).
    pub(super) body: Bytes,
    pub(super) translation: Box<Translation>,
    /// The candidates whose dialect can carry the request, in order.
    pub(super) candidates: Vec<usize>,
    /// Why the others were passed over (one note each).
    pub(super) notes: Vec<String>,
}

/// A request's client side, for [`prepare`].
pub(super) struct ClientRequest<'a> {
    pub(super) dialect: Dialect,
    /// Its body and path as sent.
    pub(super) body: Bytes,
    pub(super) path: Option<&'a http::uri::PathAndQuery>,
    pub(super) stream: bool,
    pub(super) created: u64,
}

/// Writes the request for each dialect among the `candidates`' pools
/// (`dialect_of` a candidate), keeping the candidates whose dialect can
/// carry it (an Anthropic client's own body goes to Anthropic pools as it
/// came; the others' is translated), and saying why the rest are passed
/// over. No candidate left: 400 naming every field that could not be
/// carried.
pub(super) fn prepare(
    client: ClientRequest<'_>,
    candidates: &[usize],
    dialect_of: impl Fn(usize) -> (String, Dialect),
) -> Result<Prepared, ProxyError> {
    let wants = |d: Dialect| candidates.iter().any(|k| dialect_of(*k).1 == d);
    let same = |d: Dialect| {
        if client.dialect == d {
            Some(Ok(client.body.clone()))
        } else {
            None
        }
    };
    let neutral = router_dialect::parse_request(client.dialect, &client.body);
    let written = |to: Dialect, opts: &WriteOptions| -> Result<Bytes, String> {
        let req = neutral.as_ref().map_err(|e| {
            format!(
                "the request cannot be read for dialect {}: {e}",
                to.as_str()
            )
        })?;
        router_dialect::write_request(req, to, opts)
            .map(Bytes::from)
            .map_err(|e| e.to_string())
    };
    // Only the dialects some candidate speaks are written (and the
    // Anthropic body parsed for its model).
    let openai = wants(Dialect::OpenAi).then(|| {
        same(Dialect::OpenAi).unwrap_or_else(|| written(Dialect::OpenAi, &WriteOptions::default()))
    });
    let anthropic = wants(Dialect::Anthropic).then(|| {
        same(Dialect::Anthropic)
            .unwrap_or_else(|| written(Dialect::Anthropic, &WriteOptions::default()))
    });
    let anthropic = anthropic.map(|r| {
        r.and_then(|b| super::upstream_request::ParsedBody::parse(&b).map_err(|e| e.to_string()))
    });
    let gemini = wants(Dialect::Gemini).then(|| {
        same(Dialect::Gemini).unwrap_or_else(|| written(Dialect::Gemini, &WriteOptions::default()))
    });
    let mut kept = Vec::with_capacity(candidates.len());
    let mut notes = Vec::new();
    let mut lost: Vec<String> = Vec::new();
    for &k in candidates {
        let (name, d) = dialect_of(k);
        let why = match d {
            Dialect::Anthropic => anthropic.as_ref().and_then(|r| r.as_ref().err()),
            Dialect::Gemini => gemini.as_ref().and_then(|r| r.as_ref().err()),
            Dialect::OpenAi => openai.as_ref().and_then(|r| r.as_ref().err()),
        };
        match why {
            None => kept.push(k),
            Some(why) => {
                notes.push(format!("{name}: skipped, {why}"));
                if !lost.contains(why) {
                    lost.push(why.clone());
                }
            }
        }
    }
    if kept.is_empty() {
        return Err(ProxyError::InvalidRequest(format!(
            "no pool of this route can take this request: {}",
            lost.join("; ")
        )));
    }
    let translation = Box::new(Translation {
        client: client.dialect,
        client_path: client
            .path
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static(MESSAGES_PATH)),
        stream: client.stream,
        // An OpenAI client's own `stream_options.include_usage`.
        include_usage: neutral.as_ref().is_ok_and(|r| r.stream_usage),
        created: client.created,
        anthropic: anthropic.and_then(Result::ok),
        gemini: gemini.and_then(Result::ok),
        client_body: client.body.clone(),
    });
    Ok(Prepared {
        body: openai.and_then(Result::ok).unwrap_or(client.body),
        translation,
        candidates: kept,
        notes,
    })
}

/// The usage of a Gemini answer (`usageMetadata`) as the router counts
/// tokens: the whole prompt as input (cached tokens inside it, as in
/// OpenAI's `prompt_tokens`), candidates and thoughts as output
/// (`router_dialect::Usage::from_gemini`). `None` without usage.
pub(super) fn gemini_usage(body: &[u8]) -> Option<router_json_peek::Usage> {
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(rename = "usageMetadata")]
        usage: Option<serde_json::Value>,
    }
    let a: Answer = serde_json::from_slice(body).ok()?;
    let u = router_dialect::Usage::from_gemini(&a.usage?);
    Some(router_json_peek::Usage {
        prompt_tokens: Some(u.prompt()),
        completion_tokens: Some(u.output),
        prompt_tokens_details: Some(router_json_peek::UsageDetails {
            cached_tokens: Some(u.cache_read),
        }),
        ..router_json_peek::Usage::default()
    })
}

/// An Anthropic Messages request, parsed (400 when it is not one).
pub(super) fn parse_messages(body: &[u8]) -> Result<router_dialect::Request, ProxyError> {
    router_dialect::anthropic::parse_request(body)
        .map_err(|e| ProxyError::InvalidRequest(format!("invalid Anthropic Messages request: {e}")))
}

impl super::chain::Exchange {
    /// The translation of answers from `pool` and its dialect, when that
    /// is not the client's.
    pub(super) fn translated_from(&self, pool: &str) -> Option<(&Translation, Dialect)> {
        let t = self.translation.as_deref()?;
        let from = pool_dialect(self.snapshot.policy.pool(pool));
        t.translates_from(from).then_some((t, from))
    }
}

impl Translation {
    /// Whether an answer from a pool of dialect `pool` is translated for
    /// the client.
    pub(super) fn translates_from(&self, pool: Dialect) -> bool {
        pool != self.client
    }

    /// The stream options of the client's side.
    fn stream_options(&self) -> StreamOptions {
        StreamOptions {
            created: self.created,
            include_usage: self.include_usage,
            ..StreamOptions::default()
        }
    }

    /// The translator of a pool's 2xx stream (`from` its dialect) to the
    /// client's.
    pub(super) fn stream_translator(&self, from: Dialect) -> Option<Box<StreamTranslator>> {
        StreamTranslator::new(from, self.client, self.stream_options())
            .ok()
            .map(Box::new)
    }

    /// A 2xx answer of a pool of dialect `from` as the client gets it: in
    /// its dialect, or as a stream of its events when it asked for one
    /// (the pool answered with one JSON body). `head` gets the new body's
    /// headers.
    pub(super) fn answer(
        &self,
        from: Dialect,
        head: &mut http::response::Parts,
        body: &[u8],
    ) -> Result<Bytes, DialectError> {
        let answer = router_dialect::parse_answer(from, body)?;
        let out = if self.stream {
            head.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            answer_stream(&answer, self.client, &self.stream_options())?
        } else {
            head.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            router_dialect::write_answer(&answer, self.client, self.created)?
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

/// The headers of an attempt on a pool of dialect `to` for a translated
/// request (see the module docs): an Anthropic client's `x-api-key` and
/// `anthropic-*` headers go to Anthropic pools only, an OpenAI client's
/// `Authorization` to OpenAI pools only (an Anthropic pool gets its own
/// key, set after this, and `anthropic-version` when the client sent
/// none; a Gemini pool its own key as `x-goog-api-key`); no
/// `Accept-Encoding` (the answer is read); `body_len`: the body's length.
pub(super) fn upstream_headers(headers: &mut HeaderMap, to: Dialect, body_len: usize) {
    if to != Dialect::OpenAi {
        headers.remove(header::AUTHORIZATION);
    }
    if to == Dialect::Anthropic {
        if !headers.contains_key(ANTHROPIC_VERSION) {
            headers.insert(
                HeaderName::from_static(ANTHROPIC_VERSION),
                HeaderValue::from_static(DEFAULT_ANTHROPIC_VERSION),
            );
        }
    } else {
        let anthropic: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().starts_with("anthropic-"))
            .cloned()
            .collect();
        for name in anthropic {
            headers.remove(name);
        }
        headers.remove(X_API_KEY);
    }
    headers.remove(header::ACCEPT_ENCODING);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
}

/// The `anthropic-version` an Anthropic pool gets when the client sent
/// none.
pub(super) const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

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
            router_policy::wall_clock::unix_ms_i64(),
        )
        .map(|who| Some(who.tenant))
        .map_err(ProxyError::Tenant)
}

/// `POST /v1/messages/count_tokens`: the router's estimate of the
/// request's prompt, `{"input_tokens": N}`. The estimate is the one the
/// router itself reserves against a tenant's token limit for the same
/// request: its body's bytes / 4, rounded up (not a tokenizer's count).
/// The body is read as ingress reads one (bounded, with a timeout) and
/// must be an Anthropic Messages request (else 400).
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
    let (body, _reserved) = match super::arrival::read_body(shared, t0, length, body).await {
        Ok(b) => b,
        Err(e) => return refuse(e),
    };
    if let Err(e) = parse_messages(&body) {
        return refuse(e);
    }
    let tokens = (body.len() as u64).div_ceil(4);
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

    fn client(dialect: Dialect, body: &'static [u8]) -> ClientRequest<'static> {
        ClientRequest {
            dialect,
            body: Bytes::from_static(body),
            path: None,
            stream: true,
            created: 0,
        }
    }

    /// Candidates 0 and 2 are OpenAI pools, 1 an Anthropic one.
    fn dialect_of(k: usize) -> (String, Dialect) {
        let d = if k == 1 {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        };
        (format!("p{k}"), d)
    }

    #[test]
    fn each_pool_gets_the_request_in_its_dialect_or_is_passed_over_saying_why() {
        const ANTHROPIC: &[u8] = br#"{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,
            "system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"hi"}]}"#;
        // An Anthropic client: OpenAI pools get the chat body, Anthropic
        // ones the client's own.
        let p = prepare(
            client(Dialect::Anthropic, ANTHROPIC),
            &[0, 1, 2],
            dialect_of,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(
            v["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(p.candidates, vec![0, 1, 2]);
        assert!(p.notes.is_empty());
        assert_eq!(&p.translation.client_body[..], ANTHROPIC);
        assert!(p.translation.anthropic.is_some());
        // A field OpenAI cannot carry: its pools are passed over, saying why.
        const TOP_K: &[u8] = br#"{"model":"m","max_tokens":1,"top_k":5,"messages":[{"role":"user","content":"hi"}]}"#;
        let p = prepare(client(Dialect::Anthropic, TOP_K), &[0, 1, 2], dialect_of).unwrap();
        assert_eq!(p.candidates, vec![1]);
        assert_eq!(p.notes.len(), 2);
        assert!(
            p.notes[0].starts_with("p0: skipped, cannot carry field `top_k` to dialect openai"),
            "{:?}",
            p.notes
        );
        // ... and with none left, a 400 naming it.
        let e = prepare(client(Dialect::Anthropic, TOP_K), &[0, 2], dialect_of)
            .err()
            .unwrap();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert!(e.to_string().contains("`top_k`"), "{e}");
        // An OpenAI client without max_tokens: Anthropic requires one.
        const OPENAI: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let p = prepare(client(Dialect::OpenAi, OPENAI), &[1, 0], dialect_of).unwrap();
        assert_eq!(p.candidates, vec![0]);
        assert!(p.notes[0].contains("`max_tokens`"), "{:?}", p.notes);
        assert_eq!(&p.body[..], OPENAI);
        // With one, the Anthropic pool gets an Anthropic body.
        const WITH_MAX: &[u8] = br#"{"model":"m","max_tokens":9,"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}"#;
        let p = prepare(client(Dialect::OpenAi, WITH_MAX), &[1], dialect_of).unwrap();
        assert_eq!(p.candidates, vec![1]);
        assert!(p.translation.anthropic.is_some());
    }

    #[test]
    fn each_pool_gets_the_headers_of_its_dialect() {
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
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-openai-client"),
        );
        let mut to_anthropic = h.clone();
        upstream_headers(&mut h, Dialect::OpenAi, 42);
        assert!(h.get("x-api-key").is_none());
        assert!(h.get("anthropic-version").is_none());
        assert!(h.get("anthropic-beta").is_none());
        assert!(h.get("accept-encoding").is_none());
        assert_eq!(h["content-length"], "42");
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["x-stainless-lang"], "python");
        // To an Anthropic pool: its own headers kept, no Authorization.
        upstream_headers(&mut to_anthropic, Dialect::Anthropic, 7);
        assert!(to_anthropic.get("authorization").is_none());
        assert_eq!(to_anthropic["anthropic-beta"], "prompt-caching-2024-07-31");
        assert_eq!(to_anthropic["anthropic-version"], "2023-06-01");
        assert_eq!(to_anthropic["content-length"], "7");
        let mut bare = HeaderMap::new();
        upstream_headers(&mut bare, Dialect::Anthropic, 1);
        assert_eq!(bare["anthropic-version"], DEFAULT_ANTHROPIC_VERSION);
    }

    #[test]
    fn a_gemini_answers_usage_counts_its_whole_prompt_and_its_thoughts_once() {
        let u = gemini_usage(
            br#"{"candidates":[],"usageMetadata":{"promptTokenCount":100,"cachedContentTokenCount":60,"candidatesTokenCount":7,"thoughtsTokenCount":5,"totalTokenCount":112}}"#,
        )
        .unwrap();
        // The cached 60 are inside the prompt's 100, not added to it.
        assert_eq!(u.prompt_tokens, Some(100));
        assert_eq!(u.completion_tokens, Some(12));
        assert_eq!(
            u.prompt_tokens_details.and_then(|d| d.cached_tokens),
            Some(60)
        );
        assert_eq!(gemini_usage(br#"{"candidates":[]}"#), None);
        assert_eq!(gemini_usage(b"not json"), None);
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
