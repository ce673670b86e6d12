//! The gRPC contract between `router-control-plane` and `router-proxy`
//! (`router.proto`), and the code generated from it.

#![forbid(unsafe_code)]

/// `router.v1`: generated messages, clients and servers.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("router.v1");
}

pub use v1::*;

pub mod token;

pub use token::BearerToken;
