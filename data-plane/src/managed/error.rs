//! Managed mode's errors: an unusable control-plane address, a snapshot
//! that cannot be applied (the NACK's text), a circuit override that does
//! not fit its snapshot, and why a stream to the control plane ended.

use router_policy::{EndpointError, PolicyError};

/// A control-plane address [`grpc_endpoint`](super::grpc_endpoint) cannot use.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// Not a URI tonic can dial.
    #[error("bad address {addr}: {error}")]
    Bad {
        /// The address as given.
        addr: String,
        /// What tonic said.
        error: tonic::transport::Error,
    },
    /// An `https://` address whose TLS settings tonic refused.
    #[error("TLS for {addr}: {error}")]
    Tls {
        /// The address as given.
        addr: String,
        /// What tonic said.
        error: tonic::transport::Error,
    },
}

/// Why a snapshot cannot be applied; its text is the NACK's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    /// The policy document does not load with this proxy's guards.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// Backends for a pool the policy does not name.
    #[error("backends for unknown pool {pool:?}")]
    UnknownPool {
        /// The pool named.
        pool: String,
    },
    /// A backend (or drained) endpoint that does not parse.
    #[error("pool {pool}: {endpoint}: {error}")]
    BadEndpoint {
        /// The pool.
        pool: String,
        /// The endpoint as sent.
        endpoint: String,
        /// Why it does not parse.
        error: EndpointError,
    },
    /// A backend this proxy's guards refuse (a link-local or metadata
    /// address).
    #[error("pool {pool}: {why}")]
    RefusedBackend {
        /// The pool.
        pool: String,
        /// Why ([`router_policy::guard::backend_refusal`]).
        why: String,
    },
}

/// Why a circuit override or suspicion is skipped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OverrideError {
    /// Its pool is not in the policy.
    #[error("no pool {pool:?} in the policy")]
    NoPool {
        /// The pool named.
        pool: String,
    },
    /// Its endpoint does not parse.
    #[error(transparent)]
    BadEndpoint(#[from] EndpointError),
    /// Its endpoint is not one of the pool's.
    #[error("{endpoint} is not an endpoint of pool {pool}")]
    NotInPool {
        /// The endpoint named.
        endpoint: String,
        /// The pool.
        pool: String,
    },
}

/// Why one stream to the control plane ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    /// The address cannot be dialled.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// The connection failed; the text has the causes and advice
    /// ([`connect_failure`](super::connect_failure)).
    #[error("{0}")]
    Unreachable(String),
    /// The stream closed before the hello was sent.
    #[error("stream closed")]
    Closed,
    /// The control plane refused the token.
    #[error(
        "the control plane refused the token: set ROUTER_TOKEN to a token in its --token-file or --proxy-token-file ({detail})"
    )]
    Unauthenticated {
        /// The control plane's words.
        detail: String,
    },
    /// The token may not speak for this node.
    #[error(
        "the control plane does not let this token speak for node {node_id}: use the token pinned to it, or set --node-id to the node the token names ({detail})"
    )]
    NotThisNode {
        /// This proxy's node id.
        node_id: String,
        /// The control plane's words.
        detail: String,
    },
    /// The control plane holds no more proxies.
    #[error("the control plane holds no more proxies ({detail})")]
    Full {
        /// The control plane's words.
        detail: String,
    },
    /// Any other gRPC status, when opening the stream or on it.
    #[error("stream: {0}")]
    Status(Box<tonic::Status>),
}
