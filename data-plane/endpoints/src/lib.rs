//! The router's pools and their endpoints: where a request waits for an
//! endpoint, which endpoint it gets, and what the proxy learns of each
//! endpoint from answers, probes and checks. Nothing of HTTP serving, the
//! request's walk or the shared store is in it.
//!
//! Module map:
//!
//! - [`pool`]: one pool ([`pool::PoolRuntime`]): its endpoints' circuit
//!   breakers, EWMA and the latency window's p95, the bounded FIFO with
//!   event-driven dispatch, [`pool::Lease`]s, the engine-aware pick
//!   (prefix and session affinity), and the status the proxy reports.
//! - `probe` (private): capacity probes (vLLM, SGLang, TGI `/metrics`,
//!   Ollama `/api/ps`), one task per probed pool, started by the pool.
//! - `health_check` (private): active health checks, one task per pool
//!   that has them, started by the pool; the rules are
//!   `router_policy::health`'s.
//! - [`PoolKey`]: a pool's API key and the origins it may go to;
//!   [`PoolKeys`]: its one key or its several, by the endpoint.
//! - [`PlacementSink`]: where a pool reports the prompts it placed (the
//!   proxy shares them with its fleet); the crate itself links no store.
//! - [`clock`]: instants from outside input, capped and checked
//!   ([`clock::later`]); [`random`]: bytes from the system's source. The
//!   proxy uses both from here.
//!
//! The crate depends on the policy crate (the rules) and the upstream
//! client (probes and checks send requests); the proxy depends on it,
//! never the reverse.

#![forbid(unsafe_code)]

pub mod clock;
mod health_check;
pub mod pool;
mod pool_key;
mod probe;
pub mod random;

pub use pool::PlacementSink;
pub use pool_key::{PoolKey, PoolKeys};
