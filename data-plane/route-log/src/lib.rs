//! The route decision log: one JSON line per request on stdout.
//!
//! A request's finished record is queued (bounded); a writer thread
//! serialises and writes the queue out every 10 ms (see [`RouteLog`]), so a
//! slow stdout (a pipe nobody reads fast enough) never blocks request
//! handling, logging costs no thread wake-up per request, and the
//! formatting runs off the request path. The line's format is a contract
//! (docs/observability.md, "Route decision log").
//!
//! Module map:
//! - `record`: the typed records ([`RouteRecord`] and its parts), filled
//!   on the request path;
//! - `encode`: [`RouteRecord::write_json`], the hand-written JSON line
//!   encoder (byte for byte what `serde_json` writes from the records'
//!   `Serialize` derives) with its fast string escaper;
//! - `writer`: [`RouteLog`], the bounded queue and the writer thread;
//! - [`ring`]: [`ring::DecisionRing`], the last N lines the writer wrote,
//!   kept for the control plane's console.

#![forbid(unsafe_code)]

mod encode;
mod record;
pub mod ring;
mod writer;

pub use record::{
    AttemptRecord, HedgeRole, IdempotencyRole, PrefixRecord, RouteRecord, Stopped, StreamRecord,
    Timestamp, UsageRecord, WalkNote, UPSTREAM_REQUEST_ID_MAX,
};
pub use writer::{Line, RouteLog, FLUSH_INTERVAL, MAX_QUEUED};
