//! `routerctl`: the router's command line.
//!
//! - [`drill`]: the fallback drill (`routerctl drill`);
//! - [`mock`]: mock OpenAI-compatible model endpoints (`routerctl mock`,
//!   and the drill's and the tests' backends);
//! - [`policy_cmd`]: `routerctl policy validate`, `routerctl route explain`.

#![forbid(unsafe_code)]

pub mod drill;
pub mod mock;
pub mod mock_cmd;
pub mod policy_cmd;
