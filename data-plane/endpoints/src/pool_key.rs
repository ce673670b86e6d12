//! A pool's API key (`api_key_env`) and the origins it may be sent to:
//! read by the proxy's config, attached by the request path and by the
//! active health checks.

use http::HeaderValue;
use router_policy::Endpoint;

/// A pool's API key and where it may go.
///
/// The key goes only to the origins (scheme, host, port) the policy itself
/// lists for the pool. Endpoints installed by `set-backends` (or a backend
/// set from the control plane) replace the pool's endpoints but not this
/// list: whoever may move traffic cannot thereby collect the provider's key.
/// A request to any other endpoint of the pool goes without it (and
/// without the client's own `Authorization`, which the key would have
/// replaced).
#[derive(Clone)]
pub struct PoolKey {
    /// The header the key goes in: `Authorization` (`Bearer <key>`), or
    /// `x-api-key` (the key alone) for an Anthropic pool.
    pub name: http::header::HeaderName,
    /// Its value, marked sensitive.
    pub header: HeaderValue,
    /// The endpoints the policy lists for the pool.
    pub origins: Vec<Endpoint>,
}

impl PoolKey {
    /// The same key for the same origins.
    pub fn same_as(&self, other: &PoolKey) -> bool {
        self.name == other.name
            && self.header.as_bytes() == other.header.as_bytes()
            && self.origins == other.origins
    }

    /// Whether the key may be sent to `endpoint`.
    pub fn sent_to(&self, endpoint: &Endpoint) -> bool {
        self.origins.iter().any(|o| o.same_origin(endpoint))
    }
}

/// A pool's keys: its one key (`api_key_env`), or its several keys
/// (`api_keys_env`), each used by the endpoints that name it
/// ([`Endpoint::key`]: `https://api.openai.com#A_API_KEY`).
#[derive(Clone, Default)]
pub struct PoolKeys {
    /// The pool's one key, for endpoints that name none.
    pub one: Option<PoolKey>,
    /// The keys by their variable's name.
    pub named: Vec<(Box<str>, PoolKey)>,
}

impl PoolKeys {
    /// The key `endpoint` is used with: the one it names, else the pool's
    /// one key.
    pub fn for_endpoint(&self, endpoint: &Endpoint) -> Option<&PoolKey> {
        match endpoint.key() {
            None => self.one.as_ref(),
            Some(name) => self
                .named
                .iter()
                .find(|(n, _)| **n == *name)
                .map(|(_, k)| k),
        }
    }

    /// No key at all.
    pub fn is_empty(&self) -> bool {
        self.one.is_none() && self.named.is_empty()
    }

    /// The same keys for the same origins.
    pub fn same_as(&self, other: &PoolKeys) -> bool {
        let one = match (&self.one, &other.one) {
            (None, None) => true,
            (Some(a), Some(b)) => a.same_as(b),
            _ => false,
        };
        one && self.named.len() == other.named.len()
            && self
                .named
                .iter()
                .zip(&other.named)
                .all(|((n, a), (m, b))| n == m && a.same_as(b))
    }

    /// Every key (for the origins check of `set-backends` endpoints).
    pub fn all(&self) -> impl Iterator<Item = &PoolKey> {
        self.one.iter().chain(self.named.iter().map(|(_, k)| k))
    }
}
