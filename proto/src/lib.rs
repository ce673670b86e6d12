//! The gRPC contract between `router-control-plane` and `router-proxy`
//! (`router.proto`), and the code generated from it.

#![forbid(unsafe_code)]

/// `router.v1`: generated messages, clients and servers.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("router.v1");
}

pub use v1::*;

/// The largest gRPC message either side of the config stream sends or
/// accepts (4 MiB, gRPC's usual default, set explicitly on the control
/// plane's server and the proxy's client so the two cannot drift). The
/// control plane refuses a change whose snapshot would not fit, rather
/// than store one that no proxy can receive.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The largest message a proxy sends on the config stream (hello, ACK,
/// NACK, reports): the control plane refuses bigger ones, so a client
/// with a proxy token cannot make it buffer megabytes.
pub const MAX_PROXY_MESSAGE_BYTES: usize = 64 * 1024;

/// Adds `authorization: Bearer <token>` to every call of a client (nothing
/// when the token is `None`): what proxies and `routerctl` present to the
/// control plane.
#[derive(Clone, Default)]
pub struct BearerToken(pub Option<String>);

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            if let Ok(v) = format!("Bearer {t}").parse() {
                req.metadata_mut().insert("authorization", v);
            }
        }
        Ok(req)
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "BearerToken(<redacted>)"
        } else {
            "BearerToken(None)"
        })
    }
}
