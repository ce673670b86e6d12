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
//! A header sent more than once counts by its first value, as
//! `HeaderMap::get` would give.

use http::header::{HeaderMap, HeaderValue};

/// What the client sent of the headers the router reads or rewrites.
#[derive(Debug, Default)]
pub(crate) struct RequestHeaders {
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
}

impl RequestHeaders {
    /// One pass over `headers`.
    pub(crate) fn scan(headers: &HeaderMap) -> Self {
        let mut seen = Self::default();
        for (name, value) in headers {
            let slot = match name.as_str() {
                "host" => &mut seen.host,
                "content-length" => &mut seen.content_length,
                "idempotency-key" => &mut seen.idempotency_key,
                "x-request-id" => &mut seen.request_id,
                "x-router-deadline-ms" => &mut seen.deadline_ms,
                "x-router-risk" => &mut seen.risk,
                "x-router-approval" => &mut seen.approval,
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
                    if crate::hop_by_hop::is_hop_by_hop_name(n) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderName;

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
    }

    #[test]
    fn absent_headers_stay_absent() {
        let s = RequestHeaders::scan(&map(&[("content-type", "application/json")]));
        assert!(s.host.is_none() && s.content_length.is_none());
        assert!(s.idempotency_key.is_none() && s.request_id.is_none());
        assert!(s.deadline_ms.is_none() && s.risk.is_none() && s.approval.is_none());
        assert!(s.forwarded_for.is_none() && !s.forwarded_proto && !s.forwarded_host);
        assert!(!s.hop_by_hop);
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
