//! Data-plane integration tests: a real `router-proxy` in-process on
//! 127.0.0.1, real HTTP, mock model endpoints on their own sockets.
//! One module per feature.

#![allow(clippy::unwrap_used)]

mod agent_session;
mod anthropic;
mod balance;
mod doors;
mod egress;
mod embeddings;
mod exactly_once;
mod keys;
mod limits;
mod prefix_fleet;
mod queue;
mod reload;
mod sessions;
mod sidecar;
mod tls;
mod transport;

use router_proxy::Settings;

/// Settings for a sidecar under test.
pub fn settings() -> Settings {
    Settings::default()
}
