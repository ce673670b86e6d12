//! How a store call failed: the crate's one error type. Callers decide
//! from the variant alone whether to go on with the local store (READ and
//! DRAFT), refuse (SEND and DESTRUCTIVE) or count and ignore. The last
//! four variants are the control plane's ([`crate::admin`]): what an
//! operator's read or change found.

pub use crate::idempotency::Corrupt;
use router_policy::park::Illegal;

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No connection, or the server refused the call.
    #[error("shared store unavailable: {0}")]
    Unavailable(String),
    /// No answer within the call's time limit.
    #[error("shared store call timed out")]
    Timeout,
    /// The stored bytes are not an entry.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
    /// No such entry (a task the store does not hold).
    #[error("no {0}")]
    NotFound(String),
    /// The change does not apply to the entry as it is now (the task's
    /// transitions, `router_policy::park`).
    #[error(transparent)]
    Illegal(#[from] Illegal),
    /// A compare-and-set lost: the entry changed since it was read (by a
    /// proxy, or by another change).
    #[error("{0} changed since it was read")]
    Conflict(String),
    /// A stored record is not one of its kind (a task's `doc` that is not
    /// a task record): what and why.
    #[error("{0}")]
    Malformed(String),
}
