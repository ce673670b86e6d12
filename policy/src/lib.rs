//! The router's policy model and its pure decisions.
//!
//! Nothing in this crate does I/O, spawns tasks or reads the clock (except
//! [`wall_clock`], the workspace's one wall-clock reading, which no
//! decision here calls): every
//! function takes what it needs as arguments and returns a value, so the
//! rules that decide where a request goes can be unit-tested in
//! milliseconds and read without knowing anything about sockets.
//!
//! - [`affinity`]: prefix affinity by consistent hashing with bounded
//!   loads (where a request whose prompt prefix an engine holds should go).
//! - [`cache`]: the response cache's rules (which requests may be answered
//!   from it, which answers are kept, what an entry's key is made of).
//! - [`approval`]: signed approval tokens for `requires_approval` routes
//!   (one route, one request id, until a time).
//! - [`document`]: the policy document (YAML or JSON), parsed and validated
//!   into a [`Policy`]; every error at once, each with its field path.
//! - [`endpoint`]: backend addresses (`host:port`, `http://…`, `https://…/v1`).
//! - [`health`]: active health checks, fleet-shared suspicion and outlier
//!   ejection (when an endpoint stops taking traffic before a client pays).
//! - [`guard`]: what a policy may ask of the process that applies it (API
//!   key variables, link-local and metadata backend addresses).
//! - [`engine_aware`]: engine-aware balancing (engine metrics, saturation
//!   and late binding, token-normalised latency, prefix affinity).
//! - [`balance`]: EWMA bookkeeping and the choice of an endpoint inside a pool.
//! - [`decide`]: the per-request decision: route, gates, candidate pools, reason.
//! - [`deadline`]: how long an attempt may take; pools skipped for time.
//! - [`outcome`]: how a request or an attempt ended ([`Outcome`]), and the
//!   questions the chain asks of it.
//! - [`fallback`]: what follows an attempt ([`next_step`]): answer, next
//!   pool, or stop, and why.
//! - [`idempotency`]: what a keyed request does with the state a shared
//!   store holds for its key (lead, join, replay, refuse), how its key is
//!   settled when it ends, and what happens while the store is down.
//! - [`park`]: safe mode: a request parked as a task when every pool of
//!   its route is down (states, approval, TTL, claim, oldest first).
//! - [`ramp`]: a split's ramp: when its new side advances a step, holds,
//!   or is rolled back to 0 (against the old side), and the mergeable
//!   latency summary it reads.
//! - [`probe`]: capacity probes: when what a probe said of an endpoint
//!   lets it take requests (its own timeout; one failure marks nothing).
//! - [`quota`]: quota-aware admission: whether an (endpoint, key) may take
//!   a request from what its provider's rate-limit headers said is left.
//! - [`rollup`]: tenants' hourly rollups in the shared store (the key
//!   layout the proxies write and the console reads).
//! - [`split`]: weighted splits in a route's chain (which side a request
//!   takes, stable across a fleet and a ramp; the order it tries pools in).
//! - [`store_epoch`]: telling that the shared store lost its data (a marker
//!   key with a fresh id; a proxy that saw one epoch and finds another).
//! - [`structured`]: structured-output (JSON schema) checks of answers.
//! - [`tenant`]: who is calling (hashed keys) and what they may ask for.
//! - [`walk`]: the request's walk along its chain as a pure state machine
//!   (which pool, hedge, in-pool retry, retry budget, how it ends).
//! - [`wall_clock`]: the one place the workspace reads `SystemTime::now`.

#![forbid(unsafe_code)]

pub mod affinity;
pub mod approval;
pub mod balance;
pub mod cache;
pub mod deadline;
pub mod decide;
pub mod document;
pub mod endpoint;
pub mod engine_aware;
pub mod fallback;
pub mod guard;
pub mod health;
pub mod idempotency;
pub mod outcome;
pub mod park;
pub mod prefix_cache;
pub mod probe;
pub mod quota;
pub mod ramp;
pub mod request_path;
pub mod retry_budget;
pub mod rollup;
pub mod split;
pub mod store_epoch;
pub mod stream;
pub mod structured;
pub mod tenant;
pub mod usage;
pub mod walk;
pub mod wall_clock;

pub use approval::{ApprovalKey, Refusal};
pub use balance::{EndpointLoad, Scoring};
pub use document::{
    ChainStep, CircuitSettings, FieldError, Gates, Policy, PolicyError, Pool, Price, Probe,
    ProbeKind, Provider, QueueSettings, RetryOn, Risk, Route, RouteMatch,
};
pub use endpoint::{Endpoint, EndpointError, Scheme};
pub use fallback::{next_step, Step, StopReason};
pub use guard::{AllowListError, EnvAllowList, GuardError, Guards, HostAllowList, KeyEnvRefused};
pub use outcome::{AttemptEnding, Outcome, SampleKind};
