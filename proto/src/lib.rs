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

/// Endpoints a proxy reports at most in its answer to a load request
/// (the console's Pools page), all pools together; its answer says when
/// it left some out.
pub const LOAD_ENDPOINTS_MAX: usize = 512;

pub use token::BearerToken;

/// A proxy's state as operators read it (`routerctl proxies list`, the
/// console's fleet page): `gone` (not connected), `NACK` (it refused the
/// latest revision it was sent), `waiting` (connected, no revision
/// applied yet: no policy exists, or none has reached it), `ACK`.
pub fn proxy_state(connected: bool, applied_revision: u64, nacked_revision: u64) -> &'static str {
    match (
        connected,
        nacked_revision > applied_revision,
        applied_revision,
    ) {
        (false, _, _) => "gone",
        (true, true, _) => "NACK",
        (true, false, 0) => "waiting",
        (true, false, _) => "ACK",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_proxy_is_gone_nack_waiting_or_ack() {
        use super::proxy_state;
        assert_eq!(proxy_state(false, 3, 0), "gone");
        assert_eq!(proxy_state(true, 2, 3), "NACK");
        assert_eq!(proxy_state(true, 0, 0), "waiting");
        assert_eq!(proxy_state(true, 3, 2), "ACK");
    }
}
