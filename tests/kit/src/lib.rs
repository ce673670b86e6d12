//! What the cross-program tests (`router-tests`) and the benchmarks
//! (`router-bench`) share, so that neither includes the other's files:
//!
//! - [`server_process`]: a free loopback port, a server's binary.
//! - [`wait`]: polling until a condition holds.
//! - [`redis`], [`etcd`]: real servers on loopback, stopped when dropped.
//! - [`child`]: a child process stopped (SIGTERM, then SIGKILL) when
//!   dropped, and every live one stopped on an interrupt.
//! - [`stats`]: percentiles and the load average.
//! - [`proxy`]: a proxy in-process on a Redis store.
//! - [`webdriver`]: a real headless Chromium, driven over WebDriver.
//!
//! Mock model endpoints are not here: they live in `router-mock`.
#![forbid(unsafe_code)]

pub mod child;
pub mod etcd;
pub mod proxy;
pub mod redis;
pub mod server_process;
pub mod stats;
pub mod wait;
pub mod webdriver;

/// The error the fallible helpers return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
