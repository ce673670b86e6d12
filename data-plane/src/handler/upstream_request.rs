//! The request an attempt sends: the endpoint's URI, the body (with the
//! pool's `model` when the pool names one), the pool's own credential in
//! place of the client's (only to the origins the policy lists for the
//! pool: `config::PoolKey`), and the `Host` a client of the backend would
//! send.
//!
//! A body whose model is rewritten is parsed once, at ingress
//! ([`ParsedBody`]), when any pool the request may go to rewrites it. A
//! body serde_json cannot take (nesting past its recursion limit, invalid
//! UTF-8 or a lone surrogate escape inside a string, a number out of
//! range: all of which the request scanner lets through, as serde_json
//! itself does when it skips a value) is refused there with 400
//! `invalid_request`. It is never sent with the client's own model
//! instead: the pool's model is the one its route promised.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::Request;
use router_dialect::Dialect;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use super::chain::Exchange;
use crate::forward;
use crate::pool::Lease;
use crate::upstream::OutBody;

/// The calls whose streams take `stream_options.include_usage`.
pub(super) const STREAM_USAGE_PATHS: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];

/// Why an attempt's request could not be made (it was not sent).
#[derive(Debug, thiserror::Error)]
pub(super) enum UpstreamRequestError {
    /// The endpoint and the path make no URI.
    #[error("bad upstream URI: {0}")]
    Uri(#[from] http::Error),
    /// The pool rewrites the model and the body cannot be re-encoded.
    #[error("the request body cannot be re-encoded with the pool's model: {0}")]
    Body(#[from] serde_json::Error),
    /// No body of the pool's dialect (never: such pools are passed over
    /// at ingress).
    #[error("no request body in the pool's dialect")]
    Dialect,
    /// A Gemini pool's model (the pool's, else the request's) is missing
    /// or cannot go in the path.
    #[error("no model to call on the Gemini pool: {0}")]
    Model(String),
}

/// A JSON object request body, parsed for its model to be rewritten.
pub(super) struct ParsedBody(Map<String, Value>);

impl ParsedBody {
    /// Parses `body`; the error is serde_json's.
    pub(super) fn parse(body: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(body).map(Self)
    }

    /// Whether the client asked for usage in its stream
    /// (`stream_options.include_usage: true`).
    pub(super) fn asks_stream_usage(&self) -> bool {
        self.0
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// The body with its top-level `model` set to `model` (in its place,
    /// or last when there was none) and its `stream_options` as `usage`
    /// says; the rest as it was parsed.
    fn rewritten(&self, model: Option<&str>, usage: Usage) -> Result<Bytes, serde_json::Error> {
        serde_json::to_vec(&Rewritten {
            map: &self.0,
            model,
            usage,
        })
        .map(Bytes::from)
    }
}

/// What a rewritten body's `stream_options` become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Usage {
    /// As they were.
    Keep,
    /// `include_usage: true`, the client's other options kept.
    Include,
    /// None: the pool takes no `stream_options` (`stream_usage: false`)
    /// and the request's were the router's own (a translated request).
    Drop,
}

/// Serialises a map with `model` and `stream_options` replaced, without
/// copying the map.
struct Rewritten<'a> {
    map: &'a Map<String, Value>,
    model: Option<&'a str>,
    usage: Usage,
}

impl Serialize for Rewritten<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let map = self.map;
        let add_model = self.model.is_some() && !map.contains_key("model");
        let has_options = map.contains_key("stream_options");
        let add_options = self.usage == Usage::Include && !has_options;
        let drop_options = self.usage == Usage::Drop && has_options;
        let len = map.len() + usize::from(add_model) + usize::from(add_options)
            - usize::from(drop_options);
        let mut out = s.serialize_map(Some(len))?;
        for (k, v) in map {
            match (k.as_str(), self.model) {
                ("model", Some(model)) => out.serialize_entry(k, model)?,
                ("stream_options", _) if self.usage == Usage::Drop => {}
                ("stream_options", _) if self.usage == Usage::Include => {
                    let mut options = match v {
                        Value::Object(o) => o.clone(),
                        _ => Map::new(),
                    };
                    options.insert("include_usage".into(), Value::Bool(true));
                    out.serialize_entry(k, &options)?;
                }
                _ => out.serialize_entry(k, v)?,
            }
        }
        if let (true, Some(model)) = (add_model, self.model) {
            out.serialize_entry("model", model)?;
        }
        if add_options {
            out.serialize_entry(
                "stream_options",
                &serde_json::json!({"include_usage": true}),
            )?;
        }
        out.end()
    }
}

impl Exchange {
    /// The body for an OpenAI-dialect pool: the request's own (its
    /// `Content-Length` kept), or rewritten with `model` and its
    /// `stream_options` as the pool takes them (with its own length).
    fn openai_body(
        &self,
        pool: &str,
        policy_pool: Option<&router_policy::document::Pool>,
        model: Option<&str>,
        headers: &mut HeaderMap,
    ) -> Result<Bytes, UpstreamRequestError> {
        // Usage asked for in the stream on the client's behalf (the pool
        // says its endpoints take `stream_options`); a translated
        // request's own `stream_options` (the router's) are not sent to a
        // pool that takes none.
        let usage = if self.router_asks_usage(pool) {
            Usage::Include
        } else if self.translation.is_some()
            && self.streaming
            && policy_pool.is_some_and(|p| !p.stream_usage)
        {
            Usage::Drop
        } else {
            Usage::Keep
        };
        if model.is_none() && usage == Usage::Keep {
            // The client's `Content-Length` is right for its own body
            // (hyper read the body by it).
            return Ok(self.body.clone());
        }
        // Parsed at ingress when any candidate rewrites; parsed here
        // otherwise (a translated stream to a pool that takes no
        // `stream_options`). Either way an error stops the attempt: the
        // original body never goes instead.
        let b = match &self.parsed {
            Some(p) => p.rewritten(model, usage)?,
            None => ParsedBody::parse(&self.body)?.rewritten(model, usage)?,
        };
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(b.len()));
        Ok(b)
    }

    /// Whether attempts on `pool` ask for usage in the stream for the
    /// client (which did not ask itself): its usage chunk is then not
    /// passed on.
    pub(super) fn router_asks_usage(&self, pool: &str) -> bool {
        self.streaming
            && self.json_call
            && self.parsed.is_some()
            && !self.client_asks_usage
            && STREAM_USAGE_PATHS.contains(&self.path_and_query.path())
            && self
                .snapshot
                .policy
                .pool(pool)
                .is_some_and(|p| p.stream_usage && p.provider.speaks_openai())
    }

    /// The upstream request for an attempt on `lease`'s endpoint of `pool`;
    /// an error (the URI cannot be made) says why.
    pub(super) fn upstream_request(
        &self,
        lease: &Lease,
        pool: &str,
        headers: HeaderMap,
    ) -> Result<Request<OutBody>, UpstreamRequestError> {
        let policy_pool = self.snapshot.policy.pool(pool);
        // A translated request (a client or pool of another dialect): the
        // body of the pool's dialect, its path and headers.
        let to = match &self.translation {
            Some(_) => super::dialect::pool_dialect(policy_pool),
            None => Dialect::OpenAi,
        };
        let pool_model = policy_pool.and_then(|p| p.model.as_deref());
        let model = pool_model.filter(|m| self.json_call && self.model.as_deref() != Some(*m));
        // The pool's own path: Anthropic's Messages, Gemini's model call,
        // an Azure deployment's; else the request's.
        let own_path;
        let path_and_query = match (to, policy_pool.and_then(|p| p.azure.as_ref())) {
            (Dialect::OpenAi, None) => &self.path_and_query,
            (Dialect::OpenAi, Some(azure)) => {
                own_path = azure_path(self.path_and_query.path(), azure)?;
                &own_path
            }
            (Dialect::Anthropic, _) => {
                own_path = http::uri::PathAndQuery::from_static(super::dialect::MESSAGES_PATH);
                &own_path
            }
            (Dialect::Gemini, _) => {
                let name = pool_model
                    .or(self.model.as_deref())
                    .ok_or_else(|| UpstreamRequestError::Model("the request names none".into()))?;
                let path = router_dialect::gemini::endpoint_path(name, self.streaming)
                    .map_err(|e| UpstreamRequestError::Model(e.to_string()))?;
                own_path = http::uri::PathAndQuery::try_from(path).map_err(http::Error::from)?;
                &own_path
            }
        };
        let uri = match lease.target() {
            Some(t) => t.uri(lease.endpoint(), path_and_query),
            None => forward::upstream_uri(lease.endpoint(), path_and_query.as_str()),
        }?;
        let mut headers = headers;
        let body = match to {
            Dialect::OpenAi => self.openai_body(pool, policy_pool, model, &mut headers)?,
            // The Anthropic body, its model the pool's (`prepare` kept only
            // the pools that can take it).
            Dialect::Anthropic => self
                .translation
                .as_ref()
                .and_then(|t| t.anthropic.as_ref())
                .ok_or(UpstreamRequestError::Dialect)?
                .rewritten(model, Usage::Keep)?,
            // Gemini's body names no model.
            Dialect::Gemini => self
                .translation
                .as_ref()
                .and_then(|t| t.gemini.clone())
                .ok_or(UpstreamRequestError::Dialect)?,
        };
        if let Some(t) = &self.translation {
            if t.client != Dialect::OpenAi || to != Dialect::OpenAi {
                super::dialect::upstream_headers(&mut headers, to, body.len());
            }
        }
        let mut req = Request::new(OutBody::new(body));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        let keys = self.snapshot.secrets.api_keys.get(pool);
        // The endpoint's own key (with several keys, the one it names).
        if let Some(key) = keys.and_then(|k| k.for_endpoint(lease.endpoint())) {
            if key.name != header::AUTHORIZATION {
                // A key of another header (Anthropic's, Azure's, Gemini's):
                // the client's credential does not go along either.
                req.headers_mut().remove(header::AUTHORIZATION);
            }
            if key.sent_to(lease.endpoint()) {
                // The pool's own credential replaces whatever the client sent.
                req.headers_mut()
                    .insert(key.name.clone(), key.header.clone());
            } else {
                // An endpoint the policy does not list (set-backends): no
                // key, and not the client's credential either.
                req.headers_mut().remove(&key.name);
            }
        }
        match lease.target() {
            // The value a client of the backend would send.
            Some(t) => {
                req.headers_mut().insert(header::HOST, t.host().clone());
            }
            // hyper's client adds none: the URI's authority is the host.
            None => {
                req.headers_mut().remove(header::HOST);
            }
        }
        Ok(req)
    }
}

/// An Azure OpenAI pool's path for the OpenAI call `path`: its
/// deployment's (`/v1/chat/completions` is
/// `/openai/deployments/{deployment}/chat/completions`), with the pool's
/// `api-version` as the only query (the client's query stays with it).
fn azure_path(
    path: &str,
    azure: &router_policy::document::AzureDeployment,
) -> Result<http::uri::PathAndQuery, http::Error> {
    let call = path
        .strip_prefix("/v1")
        .filter(|rest| rest.starts_with('/'))
        .unwrap_or(path);
    let p = format!(
        "/openai/deployments/{}{call}?api-version={}",
        azure.deployment, azure.api_version
    );
    Ok(http::uri::PathAndQuery::try_from(p)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_azure_deployment_has_its_own_paths_and_api_version() {
        let azure = router_policy::document::AzureDeployment {
            deployment: "gpt-4o-prod".into(),
            api_version: "2024-10-21".into(),
        };
        let p = |path: &str| azure_path(path, &azure).unwrap().to_string();
        assert_eq!(
            p("/v1/chat/completions"),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(
            p("/v1/embeddings"),
            "/openai/deployments/gpt-4o-prod/embeddings?api-version=2024-10-21"
        );
        assert_eq!(
            p("/chat/completions"),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
        );
    }

    fn rewrite(body: &[u8], model: &str) -> Result<Value, serde_json::Error> {
        let out = ParsedBody::parse(body)?.rewritten(Some(model), Usage::Keep)?;
        serde_json::from_slice(&out)
    }

    #[test]
    fn usage_is_asked_for_in_place_keeping_the_clients_other_options() {
        let usage = |body: &[u8], model: Option<&str>| -> Value {
            let parsed = ParsedBody::parse(body).unwrap();
            serde_json::from_slice(&parsed.rewritten(model, Usage::Include).unwrap()).unwrap()
        };
        let v = usage(br#"{"model":"a","stream":true}"#, None);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "a");
        let v = usage(
            br#"{"model":"a","stream_options":{"continuous_usage_stats":false,"include_usage":false}}"#,
            Some("b"),
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["stream_options"]["continuous_usage_stats"], false);
        assert_eq!(v["model"], "b");
        assert!(
            !ParsedBody::parse(br#"{"stream_options":{"include_usage":false}}"#)
                .unwrap()
                .asks_stream_usage()
        );
        assert!(
            ParsedBody::parse(br#"{"stream_options":{"include_usage":true}}"#)
                .unwrap()
                .asks_stream_usage()
        );
    }

    #[test]
    fn the_routers_own_stream_options_can_be_dropped_for_a_pool_that_takes_none() {
        let parsed = ParsedBody::parse(
            br#"{"model":"a","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#,
        )
        .unwrap();
        let v: Value =
            serde_json::from_slice(&parsed.rewritten(Some("b"), Usage::Drop).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"model": "b", "stream": true, "messages": []})
        );
        let v: Value =
            serde_json::from_slice(&parsed.rewritten(None, Usage::Keep).unwrap()).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn the_model_is_replaced_and_the_rest_kept() {
        let v = rewrite(br#"{"model":"a","messages":[{"role":"user"}]}"#, "b").unwrap();
        assert_eq!(v["model"], "b");
        assert_eq!(v["messages"][0]["role"], "user");
        let v = rewrite(br#"{"messages":[]}"#, "b").unwrap();
        assert_eq!(v["model"], "b");
        assert_eq!(v.as_object().map(Map::len), Some(2));
    }

    #[test]
    fn a_body_that_cannot_be_re_encoded_is_an_error_never_passed_on() {
        let deep = format!(
            "{{\"model\":\"a\",\"x\":{}1{}}}",
            "[".repeat(200),
            "]".repeat(200)
        );
        let mut bad_utf8 = br#"{"model":"a","x":""#.to_vec();
        bad_utf8.extend_from_slice(&[0xff, 0xfe]);
        bad_utf8.extend_from_slice(br#""}"#);
        for body in [
            b"[1,2]".to_vec(),
            b"{".to_vec(),
            deep.into_bytes(),
            bad_utf8,
            br#"{"model":"a","x":"\ud800"}"#.to_vec(),
            br#"{"model":"a","x":1e400}"#.to_vec(),
        ] {
            assert!(
                rewrite(&body, "b").is_err(),
                "{}",
                String::from_utf8_lossy(&body)
            );
        }
    }
}
