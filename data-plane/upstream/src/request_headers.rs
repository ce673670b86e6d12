//! The client's request headers the router reads, found in one pass.
//!
//! The router looks at about a dozen request headers (`Idempotency-Key`,
//! `X-Request-Id`, `X-Router-Deadline-Ms`, `X-Router-Risk`, the
//! `X-Forwarded-*` set, hop-by-hop names, ...) and a request usually sends
//! none of them. A `HeaderMap` lookup hashes the name it is given, present
//! or not: a dozen lookups cost more than one walk over the four or five
//! headers a request has, matching each name's text (a length switch, then
//! a short compare). [`RequestHeaders::scan`] is that walk. Its result also
//! says which headers must go before the request is sent upstream, so an
//! absent one is never looked up to be removed.
//!
//! `X-Router-*` headers are the router's own (the deadline, the risk
//! class, the approval token): none of them goes to a backend, where the
//! approval token could be logged or replayed. The scan notes whether any
//! was sent, so [`strip_router_headers`] runs only when one was: a request
//! without them pays one prefix compare per header it has, and nothing
//! more. `Idempotency-Key` and `X-Request-Id` are not `X-Router-*`
//! headers: they go upstream, as the contract says.
//!
//! A header sent more than once counts by its first value, as
//! `HeaderMap::get` would give.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// The prefix of the router's own request headers (lower case, as
/// `HeaderName`s are).
const ROUTER_PREFIX: &str = "x-router-";

/// What the client sent of the headers the router reads or rewrites.
#[derive(Debug, Default)]
pub struct RequestHeaders {
    /// `Idempotency-Key`.
    pub idempotency_key: Option<HeaderValue>,
    /// `X-Request-Id`.
    pub request_id: Option<HeaderValue>,
    /// `X-Router-Deadline-Ms`.
    pub deadline_ms: Option<HeaderValue>,
    /// `X-Router-Risk`.
    pub risk: Option<HeaderValue>,
    /// `X-Router-Approval`.
    pub approval: Option<HeaderValue>,
    /// `Content-Length`.
    pub content_length: Option<HeaderValue>,
    /// `Host`.
    pub host: Option<HeaderValue>,
    /// `X-Forwarded-For`.
    pub forwarded_for: Option<HeaderValue>,
    /// `X-Forwarded-Proto` was sent.
    pub forwarded_proto: bool,
    /// `X-Forwarded-Host` was sent.
    pub forwarded_host: bool,
    /// A hop-by-hop header (or `Transfer-Encoding`) was sent.
    pub hop_by_hop: bool,
    /// An `X-Router-*` header was sent (any: they are all stripped).
    pub router_headers: bool,
}

impl RequestHeaders {
    /// One pass over `headers`.
    pub fn scan(headers: &HeaderMap) -> Self {
        let mut seen = Self::default();
        for (name, value) in headers {
            let slot = match name.as_str() {
                "host" => &mut seen.host,
                "content-length" => &mut seen.content_length,
                "idempotency-key" => &mut seen.idempotency_key,
                "x-request-id" => &mut seen.request_id,
                "x-router-deadline-ms" => {
                    seen.router_headers = true;
                    &mut seen.deadline_ms
                }
                "x-router-risk" => {
                    seen.router_headers = true;
                    &mut seen.risk
                }
                "x-router-approval" => {
                    seen.router_headers = true;
                    &mut seen.approval
                }
                "x-forwarded-for" => &mut seen.forwarded_for,
                "x-forwarded-proto" => {
                    seen.forwarded_proto = true;
                    continue;
                }
                "x-forwarded-host" => {
                    seen.forwarded_host = true;
                    continue;
                }
                n => {
                    if n.starts_with(ROUTER_PREFIX) {
                        seen.router_headers = true;
                    } else if crate::hop_by_hop::is_hop_by_hop_name(n) {
                        seen.hop_by_hop = true;
                    }
                    continue;
                }
            };
            if slot.is_none() {
                *slot = Some(value.clone());
            }
        }
        seen
    }
}

/// Removes every `X-Router-*` header (call it when the scan saw one).
pub fn strip_router_headers(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with(ROUTER_PREFIX))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn finds_what_lookups_would_find() {
        let h = map(&[
            ("host", "router:3000"),
            ("content-type", "application/json"),
            ("content-length", "12"),
            ("idempotency-key", "k1"),
            ("x-request-id", "r1"),
            ("x-router-deadline-ms", "250"),
            ("x-router-risk", "SEND"),
            ("x-router-approval", "tok"),
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "api.example"),
        ]);
        let s = RequestHeaders::scan(&h);
        let get = |n: &str| h.get(n).cloned();
        assert_eq!(s.host, get("host"));
        assert_eq!(s.content_length, get("content-length"));
        assert_eq!(s.idempotency_key, get("idempotency-key"));
        assert_eq!(s.request_id, get("x-request-id"));
        assert_eq!(s.deadline_ms, get("x-router-deadline-ms"));
        assert_eq!(s.risk, get("x-router-risk"));
        assert_eq!(s.approval, get("x-router-approval"));
        assert_eq!(s.forwarded_for, get("x-forwarded-for"));
        assert!(s.forwarded_proto && s.forwarded_host);
        assert!(!s.hop_by_hop);
        assert!(s.router_headers);
    }

    #[test]
    fn router_headers_are_noticed_and_stripped_the_rest_kept() {
        for name in [
            "x-router-approval",
            "x-router-risk",
            "x-router-deadline-ms",
            "x-router-anything",
        ] {
            let mut h = map(&[
                ("content-type", "application/json"),
                (name, "v"),
                ("idempotency-key", "k"),
                ("x-request-id", "r"),
                ("x-routerless", "kept"),
            ]);
            assert!(RequestHeaders::scan(&h).router_headers, "{name}");
            strip_router_headers(&mut h);
            assert!(h.get(name).is_none(), "{name}");
            let mut kept: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
            kept.sort_unstable();
            assert_eq!(
                kept,
                [
                    "content-type",
                    "idempotency-key",
                    "x-request-id",
                    "x-routerless"
                ]
            );
        }
        let plain = map(&[("content-type", "application/json"), ("x-request-id", "r")]);
        assert!(!RequestHeaders::scan(&plain).router_headers);
    }

    #[test]
    fn absent_headers_stay_absent() {
        let s = RequestHeaders::scan(&map(&[("content-type", "application/json")]));
        assert!(s.host.is_none() && s.content_length.is_none());
        assert!(s.idempotency_key.is_none() && s.request_id.is_none());
        assert!(s.deadline_ms.is_none() && s.risk.is_none() && s.approval.is_none());
        assert!(s.forwarded_for.is_none() && !s.forwarded_proto && !s.forwarded_host);
        assert!(!s.hop_by_hop && !s.router_headers);
    }

    #[test]
    fn a_repeated_header_counts_by_its_first_value() {
        let h = map(&[("x-request-id", "first"), ("x-request-id", "second")]);
        let s = RequestHeaders::scan(&h);
        assert_eq!(s.request_id, h.get("x-request-id").cloned());
        assert_eq!(s.request_id.unwrap(), "first");
    }

    #[test]
    fn hop_by_hop_names_are_noticed() {
        for name in [
            "connection",
            "keep-alive",
            "proxy-authenticate",
            "proxy-authorization",
            "proxy-connection",
            "te",
            "trailer",
            "upgrade",
            "transfer-encoding",
        ] {
            let s = RequestHeaders::scan(&map(&[(name, "x")]));
            assert!(s.hop_by_hop, "{name}");
        }
    }
}
