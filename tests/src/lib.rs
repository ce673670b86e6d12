//! Test kit for cross-program tests: mock model endpoints and helpers.
#![forbid(unsafe_code)]
pub mod harness;
pub mod mock;
