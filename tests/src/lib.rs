//! Test kit for cross-program tests: a harness that starts the router
//! in-process ([`harness`]), control planes and managed proxies
//! ([`control`]), one helper per kind of mock model endpoint ([`mocks`],
//! over the `router-mock` crate that `routerctl mock` and the drill use
//! too), an OTLP collector ([`otlp`]) and a network namespace to call from
//! a non-loopback address ([`netns`]), and the `router-proxy` binary as its
//! own process ([`proxy_process`]), steady client traffic ([`steady`]). A real etcd ([`etcd`]), a real Redis
//! ([`redis`]) and free ports ([`server_process`]) come from
//! `router-test-kit`, which the benchmarks share.
#![forbid(unsafe_code)]
pub mod control;
pub mod harness;
pub mod mocks;
pub mod netns;
pub mod otlp;
pub mod proxy_process;
pub mod steady;

pub use router_test_kit::{etcd, redis, server_process, webdriver};
