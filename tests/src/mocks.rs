//! One helper per kind of mock model endpoint the tests start, so that a
//! test says what kind of backend it needs and nothing else.
//!
//! Every helper starts a [`router_mock::MockModel`] on `127.0.0.1` with a
//! port picked by the system, and panics with the mock's name if it cannot
//! start (a test cannot go on without its backends). For anything else
//! (a concurrency cap, 429s past it) build a [`MockConfig`] and call
//! [`start`].

use std::time::Duration;

use router_mock::{Behavior, MockConfig, MockModel};

/// A mock started with `config`.
pub async fn start(config: MockConfig) -> MockModel {
    let name = config.name.clone();
    MockModel::start(config)
        .await
        .unwrap_or_else(|e| panic!("mock {name}: {e}"))
}

/// A mock named `name` that answers at once, as `behavior` says.
pub async fn mock(name: &str, behavior: Behavior) -> MockModel {
    start(MockConfig {
        name: name.into(),
        behavior,
        ..MockConfig::default()
    })
    .await
}

/// A simulated vLLM engine (`Behavior::Engine`) with quick decode steps
/// (5 ms, four tokens unless asked): prefill and prefix caching as
/// modelled, answers in tens of milliseconds.
pub async fn mock_engine(name: &str) -> MockModel {
    let engine = router_mock::engine::EngineConfig {
        decode_step_base: Duration::from_millis(5),
        decode_step_per_seq: Duration::ZERO,
        default_output_tokens: 4,
        ..router_mock::engine::EngineConfig::default()
    };
    mock(name, Behavior::Engine(engine)).await
}

/// A mock named `name` that answers chat-completion JSON after `latency_ms`.
pub async fn mock_latency(name: &str, latency_ms: u64) -> MockModel {
    start(MockConfig {
        name: name.into(),
        latency: Duration::from_millis(latency_ms),
        ..MockConfig::default()
    })
    .await
}

/// A mock named `name` that streams `chunks` SSE events, the first at once
/// and the others `interval_ms` apart, then `data: [DONE]`.
pub async fn mock_sse(name: &str, chunks: usize, interval_ms: u64) -> MockModel {
    mock(
        name,
        Behavior::Sse {
            chunks,
            interval: Duration::from_millis(interval_ms),
        },
    )
    .await
}

/// A mock named `name` that streams as `script` says (the first token's
/// delay, an error or stall after some chunks, usage or not).
pub async fn mock_stream(name: &str, script: router_mock::StreamScript) -> MockModel {
    mock(name, Behavior::Stream(script)).await
}
