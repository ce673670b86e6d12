//! Test kit for cross-program tests: a harness that starts the router
//! in-process ([`harness`]), control planes and managed proxies
//! ([`control`]), one helper per kind of mock model endpoint ([`mocks`],
//! over the `router-mock` crate that `routerctl mock` and the drill use
//! too), a real etcd ([`etcd`]), a real Redis ([`redis`]), an OTLP collector ([`otlp`]) and a
//! network namespace to call from a non-loopback address ([`netns`]), and
//! the `router-proxy` binary as its own process ([`proxy_process`]).
#![forbid(unsafe_code)]
pub mod control;
pub mod etcd;
pub mod harness;
pub mod mocks;
pub mod netns;
pub mod otlp;
pub mod proxy_process;
pub mod redis;
pub mod server_process;
