//! `routerctl`: the router's command line.
//!
//! - [`approve_cmd`]: `routerctl approve`, a signed approval token for one
//!   request;
//! - [`connection_flags`]: `--server`, `--token`, `--ca-file` and `-o`
//!   before a command group's name (the earlier interface) moved after it;
//! - [`drill`]: the fallback drill (`routerctl drill`);
//! - [`mock_cmd`]: `routerctl mock`, one mock model endpoint from the
//!   `router-mock` crate (which also serves the drill's, `up`'s and the
//!   tests' backends);
//! - [`policy_cmd`]: `routerctl policy validate`, `routerctl route explain`;
//! - [`admin_cmd`]: the connection to the control plane, the printing all
//!   its commands share, and `policy apply|get|diff|history|rollback`;
//!   then one file per noun, as kubectl has: [`backends_cmd`],
//!   [`circuits_cmd`], [`proxies_cmd`], [`tenants_cmd`] (`list`, `usage`)
//!   and [`keys_cmd`] (`tenants keys create|list|revoke`);
//! - [`tasks_cmd`]: `routerctl tasks`, parked tasks through the control plane;
//! - [`up`]: `routerctl up`, control plane and proxy in one process;
//! - [`error`]: why a command failed ([`error::CliError`], one enum).

#![forbid(unsafe_code)]

pub mod admin_cmd;
pub mod approve_cmd;
pub mod backends_cmd;
pub mod cache_cmd;
pub mod circuits_cmd;
pub mod connection_flags;
pub mod drill;
pub mod error;
pub mod keys_cmd;
pub mod mock_cmd;
pub mod policy_cmd;
pub mod proxies_cmd;
pub mod rollout_cmd;
pub mod tasks_cmd;
pub mod tenants_cmd;
pub mod up;
