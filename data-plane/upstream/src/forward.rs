//! Sending a request to an endpoint and streaming its answer back.
//!
//! - A keep-alive connection pool per worker thread ([`crate::client`]),
//!   HTTP/1.1 over plain TCP or rustls (webpki roots, plus an optional
//!   extra CA file for private endpoints). Redirects are never followed: a
//!   3xx is the backend's answer and goes back to the client as is.
//! - Hop-by-hop headers (RFC 9110 §7.6.1), and every header the
//!   `Connection` header names, are removed in both directions; the
//!   client's address is appended to `X-Forwarded-For`.
//! - The answer's body is passed through frame by frame
//!   (the proxy's `TrackedBody`), so server-sent events reach the client
//!   as the backend produces them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body::Body;
use hyper_util::client::legacy::connect::HttpConnector;
use router_policy::Scheme;

use crate::client::PoolKey;
pub use crate::client::UpstreamClient;

/// Errors building the upstream client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The extra CA file could not be read or parsed.
    #[error("CUSTOM_ROUTER_UPSTREAM_CA_FILE {path}: {detail}")]
    CaFile {
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// rustls refused the configuration.
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// What an upstream client is built from (the proxy's settings).
#[derive(Debug, Clone, Default)]
pub struct ClientConfig {
    /// An extra CA file (PEM) for private endpoints.
    pub upstream_ca_file: Option<std::path::PathBuf>,
    /// Backend hosts allowed despite resolving to refused addresses.
    pub backend_hosts: router_policy::HostAllowList,
    /// Longest TCP connect.
    pub connect_timeout: Duration,
}

/// Builds an upstream client (keep-alive pool, TLS): one per worker thread.
pub fn build_client(settings: &ClientConfig) -> Result<UpstreamClient, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = &settings.upstream_ca_file {
        let ca_err = |detail: String| ClientError::CaFile {
            path: path.display().to_string(),
            detail,
        };
        let pem = std::fs::read(path).map_err(|e| ca_err(e.to_string()))?;
        let mut added = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| ca_err(e.to_string()))?;
            roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(ca_err("no PEM certificate found".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();

    // Names resolving to link-local or metadata addresses are refused
    // (`crate::resolver`).
    let mut http = HttpConnector::new_with_resolver(crate::resolver::GuardedResolver::new(
        settings.backend_hosts.clone(),
    ));
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(settings.connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(UpstreamClient::new(connector))
}

/// The URI of `path` at an endpoint's server root, whatever base path the
/// endpoint has (capacity probes and health checks: their pages live at
/// the root).
pub fn root_uri(endpoint: &router_policy::Endpoint, path: &str) -> Result<http::Uri, http::Error> {
    http::Uri::builder()
        .scheme(scheme_of(endpoint))
        .authority(endpoint.authority())
        .path_and_query(path)
        .build()
}

fn scheme_of(endpoint: &router_policy::Endpoint) -> &'static str {
    match endpoint.scheme() {
        Scheme::Http => "http",
        Scheme::Https => "https",
    }
}

/// The absolute upstream URI for a client path on an endpoint.
pub fn upstream_uri(
    endpoint: &router_policy::Endpoint,
    path_and_query: &str,
) -> Result<http::Uri, http::Error> {
    let uri = http::Uri::builder()
        .scheme(scheme_of(endpoint))
        .authority(endpoint.authority())
        .path_and_query(endpoint.join(path_and_query))
        .build()?;
    Ok(uri)
}

/// An endpoint's scheme, authority and `Host` header, parsed once (when
/// the endpoint is added to its pool) instead of for every request.
#[derive(Debug, Clone)]
pub struct UpstreamTarget {
    /// The connection pool's key of the endpoint.
    key: PoolKey,
    /// Whether the endpoint has a base path (then every path is joined).
    base_path: bool,
    /// The `Host` header: the host, with the port unless it is the
    /// scheme's default.
    host: HeaderValue,
}

impl UpstreamTarget {
    /// Parses an endpoint; `None` when its URI would not be valid (the
    /// request path then reports the error).
    pub fn new(endpoint: &router_policy::Endpoint) -> Option<Self> {
        let uri = upstream_uri(endpoint, "/").ok()?;
        Some(Self {
            key: PoolKey::of(&uri)?,
            base_path: !endpoint.base_path().is_empty(),
            host: crate::client::host_header(&uri)?,
        })
    }

    /// The `Host` header for requests to this endpoint.
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// The endpoint's key in the connection pool.
    pub fn key(&self) -> &PoolKey {
        &self.key
    }

    /// The upstream request's URI for a client path, in origin form (the
    /// path and query of [`upstream_uri`]).
    pub fn uri(
        &self,
        endpoint: &router_policy::Endpoint,
        path_and_query: &http::uri::PathAndQuery,
    ) -> Result<http::Uri, http::Error> {
        Ok(http::Uri::from(if self.base_path {
            http::uri::PathAndQuery::try_from(endpoint.join(path_and_query.as_str()))?
        } else {
            path_and_query.clone()
        }))
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// A client's IP address as a header value (made once per connection).
pub fn client_ip_header(ip: std::net::IpAddr) -> HeaderValue {
    // An IP address is always a valid header value.
    HeaderValue::try_from(ip.to_string()).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Adds `X-Forwarded-For` (appended), `-Proto` (`https` when the client
/// came over the listener's TLS) and `-Host` (kept if a proxy in front
/// already set them). `client_ip` is from
/// [`client_ip_header`]; `seen` is what the client sent of them (see
/// [`crate::request_headers`]), so nothing is looked up here.
pub fn add_forwarded(
    headers: &mut HeaderMap,
    client_ip: &HeaderValue,
    original_host: Option<HeaderValue>,
    seen: &crate::request_headers::RequestHeaders,
    tls: bool,
) {
    let value = match seen.forwarded_for.as_ref().and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.trim().is_empty() => {
            let ip = client_ip.to_str().unwrap_or("");
            HeaderValue::from_str(&format!("{prev}, {ip}")).ok()
        }
        _ => Some(client_ip.clone()),
    };
    if let Some(v) = value {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if !seen.forwarded_proto {
        let proto = if tls { "https" } else { "http" };
        headers.append(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if let (Some(host), false) = (original_host, seen.forwarded_host) {
        headers.append(X_FORWARDED_HOST, host);
    }
}

/// Error type of proxied bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why [`read_whole`] stopped.
#[derive(Debug)]
pub enum ReadWholeError {
    /// The body is longer than the limit.
    TooLarge,
    /// Holding the body would go past the proxy's buffered-bytes cap.
    OverBudget,
    /// The body broke off.
    Body(BoxError),
}

/// Reads a whole body of at most `limit` bytes.
///
/// What `Limited::new(body, limit).collect()` did, for less: the usual
/// body (a small JSON document) arrives as one data frame, which is
/// returned as it is, with no queue of frames allocated and no copy; only a
/// body of several frames is copied into one buffer. Trailers are dropped.
pub async fn read_whole<B>(body: B, limit: usize) -> Result<Bytes, ReadWholeError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    read_whole_admitting(body, limit, |_| true).await
}

/// [`read_whole`], asking `admit` before keeping each frame whether the
/// running total may be held ([`ReadWholeError::OverBudget`] when not).
/// A body of several frames whose length is known is copied into one
/// buffer of that length (no growth, no second copy).
pub async fn read_whole_admitting<B>(
    body: B,
    limit: usize,
    mut admit: impl FnMut(usize) -> bool,
) -> Result<Bytes, ReadWholeError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    use http_body_util::BodyExt;
    let known = body.size_hint().exact();
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|e| ReadWholeError::Body(e.into()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        len = len.saturating_add(data.len());
        if len > limit {
            return Err(ReadWholeError::TooLarge);
        }
        if !admit(len) {
            return Err(ReadWholeError::OverBudget);
        }
        match (&first, &mut joined) {
            (None, _) => first = Some(data),
            (Some(_), Some(buf)) => buf.extend_from_slice(&data),
            (Some(head), None) => {
                let whole = known
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| *n <= limit)
                    .unwrap_or(0);
                let mut buf = bytes::BytesMut::with_capacity(len.max(whole));
                buf.extend_from_slice(head);
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
        }
    }
    Ok(match joined {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use http_body::Frame;

    type Frames = http_body_util::StreamBody<
        futures_util::stream::Iter<
            std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>,
        >,
    >;

    fn frames(chunks: &[&'static str]) -> Frames {
        let v: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect();
        http_body_util::StreamBody::new(futures_util::stream::iter(v))
    }

    #[tokio::test]
    async fn read_whole_joins_frames_and_keeps_a_single_one_as_is() {
        let one = Bytes::from_static(b"{\"a\":1}");
        let got = read_whole(http_body_util::Full::new(one.clone()), 100)
            .await
            .ok();
        assert_eq!(
            got.as_ref().map(|b| b.as_ptr()),
            Some(one.as_ptr()),
            "no copy"
        );
        let got = read_whole(frames(&["ab", "", "cd", "e"]), 5).await.ok();
        assert_eq!(got.as_deref(), Some(&b"abcde"[..]));
        let got = read_whole(frames(&[]), 5).await.ok();
        assert_eq!(got.as_deref(), Some(&b""[..]));
    }

    #[tokio::test]
    async fn read_whole_refuses_a_body_over_the_limit_and_passes_errors_on() {
        assert!(matches!(
            read_whole(frames(&["abc", "def"]), 5).await,
            Err(ReadWholeError::TooLarge)
        ));
        assert!(read_whole(frames(&["abc", "de"]), 5).await.is_ok());
        let broken = http_body_util::StreamBody::new(futures_util::stream::iter(vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Err(std::io::Error::other("reset")),
        ]));
        assert!(matches!(
            read_whole(broken, 100).await,
            Err(ReadWholeError::Body(e)) if e.to_string() == "reset"
        ));
    }

    use super::*;

    #[test]
    fn forwarded_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        let ip = client_ip_header("127.0.0.1".parse().unwrap());
        h.insert("x-forwarded-host", HeaderValue::from_static("edge:443"));
        let seen = crate::request_headers::RequestHeaders::scan(&h);
        add_forwarded(
            &mut h,
            &ip,
            Some(HeaderValue::from_static("router:3000")),
            &seen,
            false,
        );
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        // A proxy in front set the host: kept, not doubled.
        assert_eq!(h["x-forwarded-host"], "edge:443");
        assert_eq!(h.get_all("x-forwarded-host").iter().count(), 1);
        let mut h = HeaderMap::new();
        let seen = crate::request_headers::RequestHeaders::scan(&h);
        add_forwarded(
            &mut h,
            &client_ip_header("::1".parse().unwrap()),
            None,
            &seen,
            true,
        );
        assert_eq!(h["x-forwarded-for"], "::1");
        assert!(!h.contains_key("x-forwarded-host"));
        // Over the listener's TLS.
        assert_eq!(h["x-forwarded-proto"], "https");
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let seen = crate::request_headers::RequestHeaders::scan(&h);
        let host = Some(HeaderValue::from_static("router:3000"));
        add_forwarded(
            &mut h,
            &client_ip_header("::1".parse().unwrap()),
            host,
            &seen,
            false,
        );
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h.get_all("x-forwarded-proto").iter().count(), 1);
        assert_eq!(h["x-forwarded-host"], "router:3000");
    }

    #[test]
    fn upstream_targets_make_the_same_uris_and_hosts_as_the_client_would() {
        let pq = |s: &str| http::uri::PathAndQuery::try_from(s).unwrap();
        for (endpoint, path, host) in [
            (
                "127.0.0.1:8000",
                "/v1/chat/completions?x=1",
                "127.0.0.1:8000",
            ),
            ("http://example.com:80", "/v1/models", "example.com"),
            (
                "https://api.example.com/api/v1",
                "/v1/chat/completions",
                "api.example.com",
            ),
            (
                "https://api.example.com:8443/v1",
                "/v1/x?y",
                "api.example.com:8443",
            ),
            ("http://[::1]:9000", "/", "[::1]:9000"),
        ] {
            let e = router_policy::Endpoint::parse(endpoint).unwrap();
            let t = UpstreamTarget::new(&e).unwrap();
            let absolute = upstream_uri(&e, path).unwrap();
            assert_eq!(
                t.uri(&e, &pq(path)).unwrap(),
                absolute.path_and_query().unwrap().as_str(),
                "{endpoint} {path}"
            );
            assert_eq!(t.key(), &PoolKey::of(&absolute).unwrap(), "{endpoint}");
            assert_eq!(t.host(), host, "{endpoint}");
        }
    }

    #[test]
    fn upstream_uri_joins_base_paths() {
        let e = router_policy::Endpoint::parse("https://api.example.com/api/v1").unwrap();
        let uri = upstream_uri(&e, "/v1/chat/completions?x=1").unwrap();
        assert_eq!(
            uri.to_string(),
            "https://api.example.com/api/v1/chat/completions?x=1"
        );
    }
}
