//! The router's policy model and its pure decisions.
//!
//! Nothing in this crate does I/O, spawns tasks or reads the clock: every
//! function takes what it needs as arguments and returns a value, so the
//! rules that decide where a request goes can be unit-tested in
//! milliseconds and read without knowing anything about sockets.
//!
//! - [`document`]: the policy document (YAML or JSON), parsed and validated
//!   into a [`Policy`]; every error at once, each with its field path.
//! - [`endpoint`]: backend addresses (`host:port`, `http://…`, `https://…/v1`).
//! - [`balance`]: EWMA bookkeeping and the choice of an endpoint inside a pool.

#![forbid(unsafe_code)]

pub mod balance;
pub mod deadline;
pub mod decide;
pub mod document;
pub mod endpoint;
pub mod structured;

pub use balance::{EndpointLoad, Scoring};
pub use document::{
    CircuitSettings, FieldError, Gates, Policy, PolicyError, Pool, Price, Probe, ProbeKind,
    Provider, QueueSettings, RetryOn, Risk, Route, RouteMatch,
};
pub use endpoint::{Endpoint, EndpointError, Scheme};
