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
