//! Data-plane integration tests: a real `router-proxy` in-process on
//! 127.0.0.1, real HTTP, mock model endpoints on their own sockets.
//! One module per feature.

#![allow(clippy::unwrap_used)]

mod balance;
mod exactly_once;
mod queue;
mod reload;
mod sidecar;
mod tls;
mod transport;

use std::time::Duration;

use router_proxy::Settings;
use router_tests::mock::{Behavior, MockConfig, MockModel};

/// A mock with a name and a fixed latency.
pub async fn mock(name: &str, latency_ms: u64) -> MockModel {
    mock_with(name, latency_ms, Behavior::Json).await
}

/// A mock with a name, a latency and a behavior.
pub async fn mock_with(name: &str, latency_ms: u64, behavior: Behavior) -> MockModel {
    MockModel::start(MockConfig {
        name: name.into(),
        latency: Duration::from_millis(latency_ms),
        behavior,
        ..MockConfig::default()
    })
    .await
    .expect("mock starts")
}

/// Settings for a sidecar under test.
pub fn settings() -> Settings {
    Settings::default()
}
