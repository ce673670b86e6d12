//! Backend endpoint addresses.
//!
//! An endpoint is a *base URL*: the client's request path continues from
//! the endpoint's own path, the way the OpenAI SDKs treat `base_url`
//! (`https://openrouter.ai/api/v1` + `/chat/completions`). The Hugging Face
//! sidecar contract sends bare `host:port` pairs, which mean `http://host:port`.
//!
//! An endpoint may also name the API key it is used with: a pool with
//! several keys (`api_keys_env: [A_API_KEY, B_API_KEY]`) balances each
//! (endpoint, key) pair as an endpoint of its own, written
//! `https://api.openai.com#A_API_KEY`. The part after `#` is the key's
//! environment variable *name*, never its value: it is what health,
//! metrics, the route log and the console show, and how an operator names
//! one key's circuit. It is not part of the URL (requests go to the base
//! URL; the key is chosen by its name).

use std::fmt;

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The address is empty or blank.
    #[error("empty address")]
    Empty,
    /// The scheme is neither `http` nor `https`.
    #[error("unsupported scheme {0:?} (use http or https)")]
    Scheme(String),
    /// The address does not parse as `host:port` or a URL.
    #[error("not a valid host:port or URL: {0}")]
    Invalid(String),
    /// A query string or fragment was given; a base URL cannot carry one.
    #[error("a base URL cannot have a query or fragment")]
    Query,
    /// What follows `#` is not an environment variable name (the key an
    /// endpoint is used with: `#A_API_KEY`).
    #[error("after `#` an endpoint names the environment variable of its API key (letters, digits, `_`), got {0:?}")]
    KeyName(String),
}

/// URL scheme of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP (local GPU backends, sidecar peers).
    Http,
    /// HTTPS (cloud APIs).
    Https,
}

/// A parsed, normalised backend address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    scheme: Scheme,
    authority: String,
    base_path: String,
    /// Length of the host in `authority` (IPv6 brackets included).
    host_len: usize,
    /// The port, the scheme's default when none is written.
    port: u16,
    /// The environment variable naming the API key this endpoint is used
    /// with, for a pool with several keys (`None`: the pool's one key, or
    /// none).
    key: Option<Box<str>>,
}

/// Whether `name` can be an environment variable's name: letters, digits
/// and `_`, not starting with a digit.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Endpoint {
    /// Parses `host:port`, `http://host:port[/path]` or `https://host[:port][/path]`.
    pub fn parse(input: &str) -> Result<Self, EndpointError> {
        let input = input.trim();
        if input.is_empty() {
            return Err(EndpointError::Empty);
        }
        let (input, key) = match input.split_once('#') {
            Some((url, name)) if is_env_name(name) => (url, Some(Box::from(name))),
            Some((_, name)) if !name.contains(['?', '#', '/']) => {
                return Err(EndpointError::KeyName(name.to_string()))
            }
            Some(_) => return Err(EndpointError::Query),
            None => (input, None),
        };
        let (scheme, rest) = match input.split_once("://") {
            Some((s, rest)) => match s.to_ascii_lowercase().as_str() {
                "http" => (Scheme::Http, rest),
                "https" => (Scheme::Https, rest),
                _ => return Err(EndpointError::Scheme(s.to_string())),
            },
            None => (Scheme::Http, input),
        };
        if rest.contains('?') || rest.contains('#') {
            return Err(EndpointError::Query);
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let parsed: http::uri::Authority = authority
            .parse()
            .map_err(|_| EndpointError::Invalid(input.to_string()))?;
        if parsed.host().is_empty() || authority.contains('@') {
            return Err(EndpointError::Invalid(input.to_string()));
        }
        if scheme == Scheme::Http && parsed.port().is_none() && !input.contains("://") {
            // A bare "host" without a port is almost always a mistake in the
            // sidecar contract, which always sends host:port.
            return Err(EndpointError::Invalid(format!("{input} (missing port)")));
        }
        let base_path = path.trim_end_matches('/').to_string();
        // Validate the path as a URI path.
        if !base_path.is_empty() && base_path.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(EndpointError::Invalid(input.to_string()));
        }
        let port = parsed.port_u16().unwrap_or(match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        });
        let authority = parsed.as_str().to_ascii_lowercase();
        // `Authority::host` keeps IPv6 brackets; the host is the start of
        // the authority (no user info: refused above).
        let host_len = parsed.host().len();
        Ok(Self {
            scheme,
            authority,
            base_path,
            host_len,
            port,
            key,
        })
    }

    /// The same endpoint used with the key named `name` (an environment
    /// variable's name; `None`: no key of its own).
    pub fn with_key(&self, name: Option<&str>) -> Self {
        Self {
            key: name.map(Box::from),
            ..self.clone()
        }
    }

    /// The environment variable naming the key this endpoint is used with,
    /// for a pool with several keys.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// `host[:port]`, lower-cased.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The base path without a trailing slash (empty for none).
    pub fn base_path(&self) -> &str {
        &self.base_path
    }

    /// The host, lower-cased, as written (an IPv6 address in brackets).
    pub fn host(&self) -> &str {
        &self.authority[..self.host_len]
    }

    /// The port: as written, else the scheme's (80, 443).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Same scheme, host and port (the path does not count): the origin a
    /// credential may be sent to.
    pub fn same_origin(&self, other: &Endpoint) -> bool {
        self.scheme == other.scheme && self.port == other.port && self.host() == other.host()
    }

    /// Whether two written addresses name the same endpoint: the same
    /// origin, base path and key name, however written (`127.0.0.1:8001`
    /// and `http://127.0.0.1:8001/` are one endpoint). Addresses that do
    /// not parse are the same only as the same text.
    pub fn same_address(a: &str, b: &str) -> bool {
        match (Endpoint::parse(a), Endpoint::parse(b)) {
            (Ok(x), Ok(y)) => {
                x.same_origin(&y)
                    && x.base_path.trim_end_matches('/') == y.base_path.trim_end_matches('/')
                    && x.key == y.key
            }
            _ => a.trim() == b.trim(),
        }
    }

    /// The upstream path and query for a client path: the client's path
    /// continues from the base path. A client path that repeats the last
    /// segment of the base (`/v1` + `/v1/chat/completions`) is not doubled:
    /// OpenAI-style clients send `/v1/...` and endpoints are written as
    /// `https://host/api/v1`.
    pub fn join(&self, path_and_query: &str) -> String {
        if self.base_path.is_empty() {
            return path_and_query.to_string();
        }
        let last = self
            .base_path
            .rsplit('/')
            .next()
            .filter(|s| !s.is_empty())
            .map(|s| format!("/{s}"));
        if let Some(last) = last {
            if let Some(rest) = path_and_query.strip_prefix(last.as_str()) {
                if rest.is_empty() || rest.starts_with('/') || rest.starts_with('?') {
                    return format!("{}{}", self.base_path, rest);
                }
            }
        }
        format!("{}{}", self.base_path, path_and_query)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.authority, self.base_path)?;
        match &self.key {
            Some(k) => write!(f, "#{k}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_host_port_means_http() {
        let e = Endpoint::parse("10.0.0.5:8080").unwrap();
        assert_eq!(e.scheme(), Scheme::Http);
        assert_eq!(e.authority(), "10.0.0.5:8080");
        assert_eq!(e.to_string(), "http://10.0.0.5:8080");
        assert_eq!(e, Endpoint::parse("http://10.0.0.5:8080/").unwrap());
    }

    #[test]
    fn https_base_url_keeps_its_path() {
        let e = Endpoint::parse("https://openrouter.ai/api/v1").unwrap();
        assert_eq!(e.scheme(), Scheme::Https);
        assert_eq!(e.base_path(), "/api/v1");
        assert_eq!(e.join("/v1/chat/completions"), "/api/v1/chat/completions");
        assert_eq!(e.join("/chat/completions"), "/api/v1/chat/completions");
        assert_eq!(e.join("/v1?x=1"), "/api/v1?x=1");
        assert_eq!(e.join("/v12/x"), "/api/v1/v12/x");
    }

    #[test]
    fn no_base_path_passes_the_path_through() {
        let e = Endpoint::parse("http://127.0.0.1:11434").unwrap();
        assert_eq!(e.join("/api/ps"), "/api/ps");
    }

    #[test]
    fn host_port_and_origin() {
        let e = Endpoint::parse("https://API.example.com/v1").unwrap();
        assert_eq!((e.host(), e.port()), ("api.example.com", 443));
        let same = Endpoint::parse("https://api.example.com:443/other").unwrap();
        assert!(e.same_origin(&same));
        for other in [
            "http://api.example.com:443",
            "https://api.example.com:8443",
            "https://api.example.com.evil:443",
            "https://evil.example.com",
        ] {
            assert!(!e.same_origin(&Endpoint::parse(other).unwrap()), "{other}");
        }
        let v6 = Endpoint::parse("http://[FE80::1]:8080").unwrap();
        assert_eq!((v6.host(), v6.port()), ("[fe80::1]", 8080));
        let bare = Endpoint::parse("10.0.0.5:9000").unwrap();
        assert_eq!((bare.host(), bare.port()), ("10.0.0.5", 9000));
        assert_eq!(Endpoint::parse("http://h").unwrap().port(), 80);
    }

    #[test]
    fn rejects_bad_addresses() {
        assert_eq!(Endpoint::parse(" "), Err(EndpointError::Empty));
        assert!(matches!(
            Endpoint::parse("ftp://x:1"),
            Err(EndpointError::Scheme(_))
        ));
        assert!(matches!(
            Endpoint::parse("host"),
            Err(EndpointError::Invalid(_))
        ));
        assert!(matches!(
            Endpoint::parse("http://a b:1"),
            Err(EndpointError::Invalid(_))
        ));
        assert!(matches!(
            Endpoint::parse("http://u:p@h:1"),
            Err(EndpointError::Invalid(_))
        ));
        assert_eq!(Endpoint::parse("http://h:1/?a"), Err(EndpointError::Query));
        assert_eq!(
            Endpoint::parse("http://h:1/#a?b"),
            Err(EndpointError::Query)
        );
        assert_eq!(
            Endpoint::parse("http://h:1#sk-live key"),
            Err(EndpointError::KeyName("sk-live key".into()))
        );
        assert!(matches!(
            Endpoint::parse("http://h:1#"),
            Err(EndpointError::KeyName(_))
        ));
    }

    #[test]
    fn an_endpoint_may_name_its_key_and_shows_the_name_only() {
        let e = Endpoint::parse("https://api.openai.com/v1#A_API_KEY").unwrap();
        assert_eq!(e.key(), Some("A_API_KEY"));
        assert_eq!(e.to_string(), "https://api.openai.com/v1#A_API_KEY");
        assert_eq!(e.base_path(), "/v1");
        assert_eq!(e.join("/v1/chat/completions"), "/v1/chat/completions");
        // Another key is another endpoint, of the same origin.
        let b = e.with_key(Some("B_API_KEY"));
        assert_ne!(e, b);
        assert!(e.same_origin(&b));
        assert_eq!(
            e.with_key(None),
            Endpoint::parse("https://api.openai.com/v1").unwrap()
        );
        assert!(Endpoint::same_address(
            "https://api.openai.com/v1/#A_API_KEY",
            "https://API.openai.com:443/v1#A_API_KEY"
        ));
        assert!(!Endpoint::same_address(
            "https://api.openai.com#A_API_KEY",
            "https://api.openai.com#B_API_KEY"
        ));
        assert!(!Endpoint::same_address(
            "https://api.openai.com#A_API_KEY",
            "https://api.openai.com"
        ));
    }

    #[test]
    fn the_same_address_however_written() {
        assert!(Endpoint::same_address(
            "127.0.0.1:8001",
            "http://127.0.0.1:8001"
        ));
        assert!(Endpoint::same_address(
            "http://127.0.0.1:8001/",
            "127.0.0.1:8001"
        ));
        assert!(Endpoint::same_address(
            "https://api.example.com",
            "https://api.example.com:443/"
        ));
        assert!(Endpoint::same_address("https://h/v1", "https://h:443/v1/"));
        assert!(!Endpoint::same_address("https://h/v1", "https://h/v2"));
        assert!(!Endpoint::same_address("http://h:80", "https://h:80"));
        assert!(!Endpoint::same_address("127.0.0.1:8001", "127.0.0.1:8002"));
        assert!(Endpoint::same_address("not an address", " not an address "));
    }
}
