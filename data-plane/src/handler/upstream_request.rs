//! The request an attempt sends: the endpoint's URI, the body (with the
//! pool's `model` when the pool names one), the pool's own credential in
//! place of the client's, and the `Host` a client of the backend would send.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::Request;

use super::chain::Exchange;
use crate::forward;
use crate::pool::Lease;
use crate::upstream::OutBody;

impl Exchange {
    /// The upstream request for an attempt on `lease`'s endpoint of `pool`;
    /// an error (the URI cannot be made) says why.
    pub(super) fn upstream_request(
        &self,
        lease: &Lease,
        pool: &str,
        headers: HeaderMap,
    ) -> Result<Request<OutBody>, String> {
        let uri = match lease.target() {
            Some(t) => t.uri(lease.endpoint(), &self.path_and_query),
            None => forward::upstream_uri(lease.endpoint(), self.path_and_query.as_str()),
        }
        .map_err(|e| format!("bad upstream URI: {e}"))?;
        let pool_model = self
            .snapshot
            .policy
            .pool(pool)
            .and_then(|p| p.model.as_deref());
        let rewritten = match pool_model {
            Some(m) if self.json_call && self.model.as_deref() != Some(m) => {
                rewrite_model(&self.body, m)
            }
            _ => None,
        };
        let mut headers = headers;
        // The client's `Content-Length` is right for its own body (hyper
        // read the body by it); a rewritten body gets its own.
        let body = match rewritten {
            Some(b) => {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(b.len()));
                b
            }
            None => self.body.clone(),
        };
        let mut req = Request::new(OutBody::new(body));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        if let Some(key) = self.snapshot.secrets.api_keys.get(pool) {
            // The pool's own credential replaces whatever the client sent.
            req.headers_mut().insert(header::AUTHORIZATION, key.clone());
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

/// The JSON body with its top-level `model` set to `model`; `None` when the
/// body is not a JSON object.
fn rewrite_model(body: &[u8], model: &str) -> Option<Bytes> {
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    map.insert("model".into(), serde_json::Value::String(model.to_string()));
    serde_json::to_vec(&map).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_replaced_and_the_rest_kept() {
        let out = rewrite_model(br#"{"model":"a","messages":[{"role":"user"}]}"#, "b")
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(v["model"], "b");
        assert_eq!(v["messages"][0]["role"], "user");
    }

    #[test]
    fn a_body_that_is_not_an_object_is_left_alone() {
        assert_eq!(rewrite_model(b"[1,2]", "b"), None);
        assert_eq!(rewrite_model(b"{", "b"), None);
    }
}
