//! What the router keeps either in this process or in the fleet's shared
//! store (Redis or Valkey), behind one interface per kind, so that the
//! proxy never asks which one it has. This is the only crate of the
//! workspace that links `redis`: the control plane reads and changes the
//! store through [`admin`].
//!
//! Module map:
//!
//! - [`idempotency`]: `Idempotency-Key` claims, joins, replays and
//!   settles ([`idempotency::Keys`]) over an
//!   [`idempotency::IdempotencyStore`] (this process's
//!   [`idempotency::LocalStore`], or the [`RedisStore`]);
//! - [`rate_limit`]: tenants' request and token rates (GCRA) and
//!   concurrency slots;
//! - [`spend`]: tenants' budgets, reserved before a call and settled
//!   after it;
//! - [`tasks`]: where parked tasks are kept ([`tasks::TaskStore`]: a
//!   local store written through to a file, or Redis);
//! - [`rollup`]: tenants' hourly rollups, written as requests settle
//!   (fire and forget, bounded; the key layout is
//!   `router_policy::rollup`'s);
//! - [`store_epoch`]: notices a shared store that lost its data;
//! - [`prefix_share`]: pools' prompt placements shared between the
//!   proxies of a fleet over the store's pub/sub;
//! - [`admin`]: the control plane's side ([`SharedStoreClient`]): parked
//!   tasks listed, read and changed (the proxies' compare-and-set),
//!   tenants' spend and hourly rollups read;
//! - [`RedisStore`]: the connection (one per worker thread) and the
//!   store's scripts; [`SharedStore`]: its URL, as configured;
//! - [`StoreError`]: how a store call failed; [`StoreEvents`]: what the
//!   crate counts, implemented by the proxy's metrics.
//!
//! The rules (what a claim found means, GCRA, may a task park, what an
//! epoch change means) are the policy crate's; this crate carries them
//! out against a store. It depends on the policy crate and on
//! `router-endpoints` (random bytes, capped instants, the placement
//! sink); the proxy depends on it, never the reverse.

#![forbid(unsafe_code)]

pub mod admin;
mod error;
mod events;
pub mod idempotency;
pub mod prefix_share;
pub mod rate_limit;
mod redis;
pub mod rollup;
pub mod spend;
pub mod store_epoch;
pub mod tasks;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod url;

pub use admin::SharedStoreClient;
pub use error::{Corrupt, StoreError};
#[cfg(test)]
pub(crate) use events::Counted;
pub use events::{NoEvents, StoreEvents};
pub use redis::{bounded, glob_escape, RedisStore, CACHE_NAMESPACE, OP_TIMEOUT, PURGE_LIMIT};
pub use url::{InvalidStoreUrl, SharedStore};

/// The prefix of every key the proxies of a fleet (and the control plane
/// reading after them) use in the shared store.
pub const PREFIX: &str = "router:";
