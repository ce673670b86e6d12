//! Test kit for cross-program tests: a harness that starts the router
//! in-process, and the mock model endpoints (from `routerctl`, which ships
//! them for `routerctl mock` and `routerctl drill`), and a real etcd.
#![forbid(unsafe_code)]
pub mod control;
pub mod etcd;
pub mod harness;
pub mod otlp;
pub use router_mock as mock;
