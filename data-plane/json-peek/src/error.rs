//! Why a body was refused: [`PeekError`], worded and placed as serde_json
//! words and places its errors, so that a client sees the same message it
//! did when the proxy used serde_json.

use std::fmt;

/// Why a body was refused, with where: reads like serde_json's errors
/// (`trailing comma at line 3 column 5`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekError(Box<ErrorInner>);

/// Boxed: a one-word error keeps the parser's `Result`s in registers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ErrorInner {
    message: Box<str>,
    line: usize,
    column: usize,
}

impl PeekError {
    /// The same error placed `bytes` columns further left (not before
    /// column 0).
    pub(crate) fn back(mut self, bytes: usize) -> Self {
        self.0.column = self.0.column.saturating_sub(bytes);
        self
    }

    /// The line of the error, from 1.
    pub fn line(&self) -> usize {
        self.0.line
    }

    /// The column of the error on its line: the byte offset, from 1 (0 when
    /// the error is at the start of a line, e.g. an empty body).
    pub fn column(&self) -> usize {
        self.0.column
    }
}

impl fmt::Display for PeekError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.0;
        write!(f, "{} at line {} column {}", e.message, e.line, e.column)
    }
}

impl std::error::Error for PeekError {}

/// The crate's results.
pub(crate) type Result<T> = std::result::Result<T, PeekError>;

/// Syntax errors, worded as serde_json words them.
#[derive(Clone, Copy)]
pub(crate) enum Code {
    EofWhileParsingList,
    EofWhileParsingObject,
    EofWhileParsingString,
    EofWhileParsingValue,
    ExpectedColon,
    ExpectedListCommaOrEnd,
    ExpectedObjectCommaOrEnd,
    ExpectedSomeIdent,
    ExpectedSomeValue,
    InvalidEscape,
    InvalidNumber,
    NumberOutOfRange,
    InvalidUnicodeCodePoint,
    ControlCharacterWhileParsingString,
    KeyMustBeAString,
    LoneLeadingSurrogateInHexEscape,
    TrailingComma,
    TrailingCharacters,
    UnexpectedEndOfHexEscape,
}

impl Code {
    fn message(self) -> &'static str {
        match self {
            Code::EofWhileParsingList => "EOF while parsing a list",
            Code::EofWhileParsingObject => "EOF while parsing an object",
            Code::EofWhileParsingString => "EOF while parsing a string",
            Code::EofWhileParsingValue => "EOF while parsing a value",
            Code::ExpectedColon => "expected `:`",
            Code::ExpectedListCommaOrEnd => "expected `,` or `]`",
            Code::ExpectedObjectCommaOrEnd => "expected `,` or `}`",
            Code::ExpectedSomeIdent => "expected ident",
            Code::ExpectedSomeValue => "expected value",
            Code::InvalidEscape => "invalid escape",
            Code::InvalidNumber => "invalid number",
            Code::NumberOutOfRange => "number out of range",
            Code::InvalidUnicodeCodePoint => "invalid unicode code point",
            Code::ControlCharacterWhileParsingString => {
                "control character (\\u0000-\\u001F) found while parsing a string"
            }
            Code::KeyMustBeAString => "key must be a string",
            Code::LoneLeadingSurrogateInHexEscape => "lone leading surrogate in hex escape",
            Code::TrailingComma => "trailing comma",
            Code::TrailingCharacters => "trailing characters",
            Code::UnexpectedEndOfHexEscape => "unexpected end of hex escape",
        }
    }
}

#[cold]
#[inline(never)]
pub(crate) fn error_at(b: &[u8], i: usize, code: Code) -> PeekError {
    message_at(b, i, code.message().into())
}

/// The error `message` at byte `i`, placed as serde_json places it: the
/// line from 1 and the column, counted in bytes, from 1 too (0 when before
/// the line's first byte).
#[cold]
#[inline(never)]
pub(crate) fn message_at(b: &[u8], i: usize, message: Box<str>) -> PeekError {
    let before = &b[..i.min(b.len())];
    let line_start = before
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |newline| newline + 1);
    PeekError(Box::new(ErrorInner {
        message,
        line: 1 + before[..line_start].iter().filter(|&&c| c == b'\n').count(),
        column: before.len() - line_start,
    }))
}

/// Which of serde's two errors [`invalid`] words.
pub(crate) enum Invalid {
    Type,
    Value,
}

/// serde_json's wording for a value of the wrong type (or an out-of-range
/// one), e.g. "invalid type: string \"x\", expected a boolean".
#[cold]
pub(crate) fn invalid(
    kind: Invalid,
    unexpected: serde::de::Unexpected<'_>,
    expecting: &str,
) -> Box<str> {
    use serde::de::Error as _;
    let e = match kind {
        Invalid::Type => serde_json::Error::invalid_type(unexpected, &expecting),
        Invalid::Value => serde_json::Error::invalid_value(unexpected, &expecting),
    };
    e.to_string().into()
}
