//! The crate's one error type, and the typed report of fields a dialect
//! cannot carry.

use std::fmt;

use crate::Dialect;

/// Why a translation could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DialectError {
    /// The body is not JSON (serde_json's message and position).
    #[error("the body is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A field is missing or has the wrong shape for its dialect.
    #[error("invalid field `{field}`: {why}")]
    Invalid {
        /// Where, as a JSON path (`messages[2].content[0].type`).
        field: String,
        /// What was expected.
        why: String,
    },
    /// Fields of the request that the target dialect cannot carry: the
    /// router skips the pool, or answers 400 naming them.
    #[error("{}", Uncarried::list(.0))]
    CannotCarry(Vec<Uncarried>),
    /// A server-sent event larger than the parser's limit.
    #[error("a server-sent event is larger than the limit of {limit} bytes")]
    EventTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// A translation this crate does not make (e.g. a stream written in
    /// Gemini's dialect).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}

impl DialectError {
    pub(crate) fn invalid(field: impl Into<String>, why: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            why: why.into(),
        }
    }
}

/// One field of a request that cannot be carried to a dialect: "cannot
/// carry field X to dialect Y (why)".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncarried {
    /// The field, as a JSON path in the client's request
    /// (`messages[1].content[0]` or `logit_bias`).
    pub field: String,
    /// The dialect it cannot be carried to.
    pub to: Dialect,
    /// Why (one short phrase).
    pub why: &'static str,
}

impl Uncarried {
    pub(crate) fn new(field: impl Into<String>, to: Dialect, why: &'static str) -> Self {
        Self {
            field: field.into(),
            to,
            why,
        }
    }

    /// The list as one sentence, for a 400 answer or an explain line.
    pub fn list(items: &[Uncarried]) -> String {
        let mut s = String::new();
        for (i, u) in items.iter().enumerate() {
            if i > 0 {
                s.push_str("; ");
            }
            s.push_str(&u.to_string());
        }
        s
    }
}

impl fmt::Display for Uncarried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot carry field `{}` to dialect {}: {}",
            self.field,
            self.to.as_str(),
            self.why
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncarried_field_names_the_field_the_dialect_and_why() {
        let e = DialectError::CannotCarry(vec![
            Uncarried::new("logit_bias", Dialect::Anthropic, "no equivalent"),
            Uncarried::new("n", Dialect::Gemini, "one choice only"),
        ]);
        assert_eq!(
            e.to_string(),
            "cannot carry field `logit_bias` to dialect anthropic: no equivalent; cannot carry field `n` to dialect gemini: one choice only"
        );
    }
}
