//! The router's upstream client, the part of the proxy that talks to
//! backends. One job: send a request to an endpoint and hand back its
//! answer, with nothing of routing in it.
//!
//! Module map:
//!
//! - [`forward`]: building a client (TLS roots, the extra CA file, the
//!   guarded resolver, connect timeout), an endpoint's URIs
//!   ([`forward::UpstreamTarget`], [`forward::root_uri`]), the forwarded
//!   request's headers (`X-Forwarded-For`, `Host`), whole-body reads.
//! - [`client`]: the keep-alive connection pool per worker thread
//!   ([`client::UpstreamClient`]) and the answer's body
//!   ([`client::UpstreamBody`]) that returns its connection at the end.
//! - [`resolver`]: DNS that refuses link-local and metadata addresses.
//! - [`hop_by_hop`]: hop-by-hop headers (RFC 9110 §7.6.1) removed in both
//!   directions.
//! - [`request_headers`]: one scan of a request's headers (what the router
//!   reads, what it strips before forwarding).
//!
//! The crate depends on the policy crate only (for endpoints and the
//! backend guards): the proxy depends on it, never the reverse.

#![forbid(unsafe_code)]

pub mod client;
pub mod forward;
pub mod hop_by_hop;
pub mod request_headers;
pub mod resolver;
