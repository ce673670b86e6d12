//! Hop-by-hop headers (RFC 9110 §7.6.1): meaningful for one connection
//! only, so never passed on in either direction, together with every
//! header the `Connection` header names. Used by the request scan
//! (`request_headers`) and on both sides of the proxy.

use http::header::{self, HeaderMap, HeaderName};

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// True for a hop-by-hop header name (or `Transfer-Encoding`).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    is_hop_by_hop_name(name.as_str())
}

/// [`is_hop_by_hop`] on a lower-case name's text.
pub fn is_hop_by_hop_name(name: &str) -> bool {
    name == "transfer-encoding" || HOP_BY_HOP.contains(&name)
}

/// Removes hop-by-hop headers, including those named in `Connection`.
/// (`Transfer-Encoding` is handled by hyper's framing on each side.)
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Usually there is none: one pass over the few names present instead
    // of a lookup (parse, hash, probe) per hop-by-hop name.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    if let Some(conn) = headers.get(header::CONNECTION) {
        let named: Vec<HeaderName> = conn
            .to_str()
            .unwrap_or("")
            .split(',')
            .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::TRANSFER_ENCODING);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert("authorization", HeaderValue::from_static("Bearer keep"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["authorization", "content-type"]);
    }

    #[test]
    fn transfer_encoding_is_hop_by_hop_and_credentials_are_not() {
        assert!(is_hop_by_hop_name("transfer-encoding"));
        assert!(!is_hop_by_hop_name("authorization"));
    }
}
