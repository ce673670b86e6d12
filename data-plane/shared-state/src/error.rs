//! How a store call failed: the crate's one error type. Callers decide
//! from the variant alone whether to go on with the local store (READ and
//! DRAFT), refuse (SEND and DESTRUCTIVE) or count and ignore.

pub use crate::idempotency::Corrupt;

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
}
