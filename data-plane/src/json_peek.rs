//! The proxy reads a handful of fields from every OpenAI-style request body
//! (`model`, `stream`, the token limits, `response_format.type`) and from
//! every buffered JSON answer (`model`, `usage`). It must also refuse a body
//! that is not valid JSON, so everything else in the body has to be checked,
//! though none of it is kept.
//!
//! [`peek_request`](crate::json_peek::peek_request) and [`peek_answer`](crate::json_peek::peek_answer) do that in one pass over the bytes
//! with a small byte cursor:
//!
//! - the fields we read are decoded, and only they: a string that needs no
//!   unescaping is borrowed from the body, not copied;
//! - everything else is *skipped*: its syntax is checked as it is walked
//!   over, but no value is built, no string is unescaped and no number is
//!   converted. Open arrays and objects are tracked one bit each, so skipping
//!   needs no recursion and no allocation below 64 levels of nesting. The
//!   skipper only tells a valid value from an invalid one; an invalid one
//!   (or one nested deeper) is walked again by a slower, exact skipper that
//!   finds serde_json's error and its position;
//! - string contents are scanned eight bytes at a time for the only bytes
//!   that matter there: `"`, `\` and control characters (and digits eight
//!   at a time too);
//! - compact JSON is tried first (`,"` between members, `:` right after a
//!   key, a value right after its colon), whitespace second;
//! - the hot code is inlined into the two functions so that the cursor stays
//!   in registers; errors, escapes and rare shapes are out of line.
//!
//! # Why not serde_json
//!
//! These functions replace `serde_json::from_slice` into small
//! `#[derive(Deserialize)]` structs. That was correct but cost about 8.4k
//! instructions per proxied call (about 12% of the proxy's user-space CPU),
//! most of it walking over the fields we ignore through serde's generic
//! visitor machinery. Here the same work is a tight loop over bytes: on the
//! benchmark's bodies, about 0.75k instructions for the request (serde_json:
//! 2.2k) and 2.3k for the answer (6.5k), about a third.
//!
//! # Contract
//!
//! The contract is serde_json's behaviour for those structs (fields all
//! `#[serde(default)]`, unknown fields ignored): a body is accepted exactly
//! when serde_json accepts it, the fields have the same values, and errors
//! carry serde_json's message and position (`expected value at line 1
//! column 7`). The tests check this against serde_json itself, by
//! hand-written cases and by property tests on random and mutated
//! documents. Some consequences worth knowing:
//!
//! - ignored values are fully checked (string escapes, control characters,
//!   number grammar, literals, nesting) but, as in serde_json, strings inside
//!   them are not checked for valid UTF-8 or paired surrogate escapes, and
//!   their nesting depth is not limited;
//! - keys of the objects we read (the top level, `response_format`, `usage`)
//!   are unescaped and checked like any decoded string before they are
//!   matched, so `"mod\u0065l"` is `model`; a known key given twice is an
//!   error (``duplicate field `model` ``), even when the first value was
//!   `null`;
//! - `null` is an absent field; a wrong type is an error (`"stream":"true"`,
//!   `"max_tokens":1.5`, `-0`, `1e2`, or numbers beyond `u64`);
//! - `response_format` and `usage` may also be given as arrays of their
//!   fields in declaration order (`"usage":[9,12]`), as serde's derived
//!   structs allow.
//!
//! # Differences
//!
//! - serde's derived structs also accept a *top-level* array of fields in
//!   order (`["gpt-4o",true]`); these functions refuse any top-level value
//!   that is not an object, and say "expected a JSON object" where serde
//!   said "expected struct BodyPeek";
//! - in ``invalid type: floating point `…`, expected u64``, the float is
//!   Rust's correctly rounded reading of the number, where serde_json's own
//!   parsing is off in the last digit now and then;
//! - [`RequestPeek::model`] is borrowed when the string has no escapes,
//!   where serde always made a copy.

use std::borrow::Cow;
use std::fmt;

/// The fields of an OpenAI-style request body the router reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestPeek<'a> {
    /// `model`, borrowed from the body unless it had escapes.
    pub model: Option<Cow<'a, str>>,
    /// `stream`.
    pub stream: Option<bool>,
    /// `max_tokens`.
    pub max_tokens: Option<u64>,
    /// `max_completion_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// `max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// `response_format`.
    pub response_format: Option<ResponseFormatPeek<'a>>,
}

/// The part of `response_format` the router reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResponseFormatPeek<'a> {
    /// `type` (`""` when absent).
    pub kind: Cow<'a, str>,
}

/// The fields of a JSON answer the router reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AnswerPeek {
    /// `model`.
    pub model: Option<String>,
    /// `usage`.
    pub usage: Option<Usage>,
}

/// Token counts, in the chat (`prompt_`/`completion_`) or responses
/// (`input_`/`output_`) spelling.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// `input_tokens`.
    pub input_tokens: Option<u64>,
    /// `output_tokens`.
    pub output_tokens: Option<u64>,
}

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

/// Reads the fields the router needs from a request body, checking that the
/// whole body is one valid JSON object.
pub fn peek_request(body: &[u8]) -> std::result::Result<RequestPeek<'_>, PeekError> {
    Parser { b: body, i: 0 }.request()
}

/// Reads `model` and `usage` from a JSON answer, checking that the whole
/// body is one valid JSON object.
pub fn peek_answer(body: &[u8]) -> std::result::Result<AnswerPeek, PeekError> {
    Parser { b: body, i: 0 }.answer()
}

type Result<T> = std::result::Result<T, PeekError>;

/// The request fields, in declaration order (the order of the array form).
const REQUEST_FIELDS: &[&str] = &[
    "model",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "response_format",
];
const RESPONSE_FORMAT_FIELDS: &[&str] = &["type"];
const ANSWER_FIELDS: &[&str] = &["model", "usage"];
const USAGE_FIELDS: &[&str] = &[
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
];

/// Where [`Parser::next_field`] is in an object.
struct Members {
    /// The fields read so far, one bit each.
    seen: u32,
    /// Before the first member.
    first: bool,
}

impl Default for Members {
    fn default() -> Self {
        Members {
            seen: 0,
            first: true,
        }
    }
}

/// A number as serde_json reads it before the field's type is checked.
enum Number {
    U64(u64),
    I64(i64),
    F64(f64),
}

/// Syntax errors, worded as serde_json words them.
#[derive(Clone, Copy)]
enum Code {
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

/// `None` for a `null` (an absent field), else `Some` of the value `read`
/// reads.
macro_rules! or_null {
    ($p:ident, $read:expr) => {
        if $p.null()? {
            None
        } else {
            Some($read)
        }
    };
}

/// A cursor over the body. Its methods mirror serde_json's deserializer
/// step for step (including which byte an error points at), minus the
/// generic plumbing.
///
/// The hot methods are inlined into [`peek_request`] and [`peek_answer`],
/// and the cold ones take the cursor by value, so that it never has an
/// address and stays in registers.
#[derive(Clone, Copy)]
struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    // ---- the structs ----

    /// The whole body. (The fields are separate variables until the end,
    /// where the struct is built in place.)
    #[inline(always)]
    fn request(mut self) -> Result<RequestPeek<'a>> {
        self.top_level_object()?;
        let mut model = None;
        let mut stream = None;
        let mut max_tokens = None;
        let mut max_completion_tokens = None;
        let mut max_output_tokens = None;
        let mut response_format = None;
        let mut members = Members::default();
        while let Some(field) = self.next_field(&mut members, REQUEST_FIELDS)? {
            match field {
                0 => model = or_null!(self, self.string()?),
                1 => stream = or_null!(self, self.boolean()?),
                2 => max_tokens = or_null!(self, self.unsigned()?),
                3 => max_completion_tokens = or_null!(self, self.unsigned()?),
                4 => max_output_tokens = or_null!(self, self.unsigned()?),
                _ => response_format = or_null!(self, self.response_format()?),
            }
        }
        self.end()?;
        Ok(RequestPeek {
            model,
            stream,
            max_tokens,
            max_completion_tokens,
            max_output_tokens,
            response_format,
        })
    }

    #[inline(always)]
    fn response_format(&mut self) -> Result<ResponseFormatPeek<'a>> {
        let mut kind = None;
        if self.nested("struct ResponseFormatPeek")? {
            let mut members = Members::default();
            while self
                .next_field(&mut members, RESPONSE_FORMAT_FIELDS)?
                .is_some()
            {
                kind = Some(self.string()?);
            }
        } else {
            self.i = self.array_fields(RESPONSE_FORMAT_FIELDS.len(), |p, _| {
                kind = Some(p.string()?);
                Ok(())
            })?;
        }
        Ok(ResponseFormatPeek {
            kind: kind.unwrap_or_default(),
        })
    }

    /// The whole body (as [`Self::request`]).
    #[inline(always)]
    fn answer(mut self) -> Result<AnswerPeek> {
        self.top_level_object()?;
        let mut model = None;
        let mut usage = None;
        let mut members = Members::default();
        while let Some(field) = self.next_field(&mut members, ANSWER_FIELDS)? {
            match field {
                0 => model = or_null!(self, self.string()?.into_owned()),
                _ => usage = or_null!(self, self.usage()?),
            }
        }
        self.end()?;
        Ok(AnswerPeek { model, usage })
    }

    #[inline(always)]
    fn usage(&mut self) -> Result<Usage> {
        let mut out = Usage::default();
        if self.nested("struct Usage")? {
            let mut members = Members::default();
            while let Some(field) = self.next_field(&mut members, USAGE_FIELDS)? {
                self.usage_field(&mut out, field)?;
            }
        } else {
            self.i = self.array_fields(USAGE_FIELDS.len(), |p, field| {
                p.usage_field(&mut out, field)
            })?;
        }
        Ok(out)
    }

    /// The value of one field of [`Usage`].
    #[inline(always)]
    fn usage_field(&mut self, out: &mut Usage, field: usize) -> Result<()> {
        let n = or_null!(self, self.unsigned()?);
        match field {
            0 => out.prompt_tokens = n,
            1 => out.completion_tokens = n,
            2 => out.input_tokens = n,
            _ => out.output_tokens = n,
        }
        Ok(())
    }

    // ---- objects and arrays of fields ----

    /// The opening `{` of the body.
    #[inline(always)]
    fn top_level_object(&mut self) -> Result<()> {
        match self.eat_after_ws(b'{') {
            Ok(()) => Ok(()),
            Err(None) => Err(self.peek_error(Code::EofWhileParsingValue)),
            // Where serde's derived struct would take the fields in order.
            Err(Some(b'[')) => {
                Err(self
                    .peek_error_message("invalid type: sequence, expected a JSON object".into()))
            }
            Err(Some(_)) => Err(self.invalid_type("a JSON object")),
        }
    }

    /// The start of a nested struct (`null` is handled by [`Self::null`]):
    /// `true` for an object of fields (its `{` read, for
    /// [`Self::next_field`]), `false` for an array of them in order (its `[`
    /// read, for [`Self::array_fields`]).
    #[inline(always)]
    fn nested(&mut self, expecting: &str) -> Result<bool> {
        match self.eat_after_ws(b'{') {
            Ok(()) => Ok(true),
            Err(Some(b'[')) => {
                self.i += 1;
                Ok(false)
            }
            Err(None) => Err(self.peek_error(Code::EofWhileParsingValue)),
            Err(Some(_)) => Err(self.invalid_type(expecting)),
        }
    }

    /// In an object whose `{` was read, the next member whose key is one of
    /// `fields`: its index there, with the key and the colon read (the
    /// caller reads the value). The other members are skipped; `None` after
    /// the closing `}`.
    #[inline(always)]
    fn next_field(
        &mut self,
        members: &mut Members,
        fields: &[&'static str],
    ) -> Result<Option<usize>> {
        loop {
            // Compact JSON first: `,"` (`"` before the first key).
            if !members.first && self.eat(b',') {
                if !self.eat(b'"') {
                    match self.ws() {
                        Some(b'"') => self.i += 1,
                        Some(b'}') => return Err(self.peek_error(Code::TrailingComma)),
                        Some(_) => return Err(self.peek_error(Code::KeyMustBeAString)),
                        None => return Err(self.peek_error(Code::EofWhileParsingValue)),
                    }
                }
            } else if self.eat(b'}') {
                return Ok(None);
            } else if !(members.first && self.eat(b'"')) {
                match self.ws() {
                    Some(b'}') => {
                        self.i += 1;
                        return Ok(None);
                    }
                    Some(b'"') if members.first => self.i += 1,
                    Some(b',') if !members.first => {
                        self.i += 1;
                        match self.ws() {
                            Some(b'"') => self.i += 1,
                            Some(b'}') => return Err(self.peek_error(Code::TrailingComma)),
                            Some(_) => return Err(self.peek_error(Code::KeyMustBeAString)),
                            None => return Err(self.peek_error(Code::EofWhileParsingValue)),
                        }
                    }
                    Some(_) if members.first => return Err(self.peek_error(Code::KeyMustBeAString)),
                    Some(_) => return Err(self.peek_error(Code::ExpectedObjectCommaOrEnd)),
                    None => return Err(self.peek_error(Code::EofWhileParsingObject)),
                }
            }
            members.first = false;
            match self.key_field(fields)? {
                Some(field) => {
                    if members.seen & (1 << field) != 0 {
                        return Err(self.duplicate_field(fields[field]));
                    }
                    members.seen |= 1 << field;
                    self.colon()?;
                    return Ok(Some(field));
                }
                None => {
                    self.colon()?;
                    self.skip_value()?;
                }
            }
        }
    }

    /// The elements of an array whose `[` was just read, taken as the first
    /// `len` fields in order (missing ones stay absent, extra ones are an
    /// error). Rare: out of line, on a copy of the cursor; returns the index
    /// after the array.
    #[cold]
    #[inline(never)]
    fn array_fields(
        mut self,
        len: usize,
        mut value: impl FnMut(&mut Self, usize) -> Result<()>,
    ) -> Result<usize> {
        for field in 0..len {
            match self.ws() {
                Some(b']') => break,
                Some(_) if field == 0 => {}
                Some(b',') => {
                    self.i += 1;
                    match self.ws() {
                        Some(b']') => return Err(self.peek_error(Code::TrailingComma)),
                        Some(_) => {}
                        None => return Err(self.peek_error(Code::EofWhileParsingValue)),
                    }
                }
                Some(_) => return Err(self.peek_error(Code::ExpectedListCommaOrEnd)),
                None => return Err(self.peek_error(Code::EofWhileParsingList)),
            }
            value(&mut self, field)?;
        }
        match self.ws() {
            Some(b']') => Ok(self.i + 1),
            Some(b',') => {
                self.i += 1;
                match self.ws() {
                    Some(b']') => Err(self.peek_error(Code::TrailingComma)),
                    _ => Err(self.peek_error(Code::TrailingCharacters)),
                }
            }
            Some(_) => Err(self.peek_error(Code::TrailingCharacters)),
            None => Err(self.peek_error(Code::EofWhileParsingList)),
        }
    }

    #[inline(always)]
    fn colon(&mut self) -> Result<()> {
        match self.eat_after_ws(b':') {
            Ok(()) => Ok(()),
            Err(Some(_)) => Err(self.peek_error(Code::ExpectedColon)),
            Err(None) => Err(self.peek_error(Code::EofWhileParsingObject)),
        }
    }

    /// Only whitespace may follow the body.
    #[inline(always)]
    fn end(&mut self) -> Result<()> {
        if self.i == self.b.len() {
            return Ok(());
        }
        match self.ws() {
            Some(_) => Err(self.peek_error(Code::TrailingCharacters)),
            None => Ok(()),
        }
    }

    // ---- the values we read ----

    /// Reads a `null` (an absent field) if there is one; anything else is
    /// the field's value, for the caller to read.
    #[inline(always)]
    fn null(&mut self) -> Result<bool> {
        if self.ws() == Some(b'n') {
            self.i += 1;
            self.ident(b"ull")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    #[inline(always)]
    fn string(&mut self) -> Result<Cow<'a, str>> {
        match self.eat_after_ws(b'"') {
            Ok(()) => self.string_body(),
            Err(None) => Err(self.peek_error(Code::EofWhileParsingValue)),
            Err(Some(_)) => Err(self.invalid_type("a string")),
        }
    }

    #[inline(always)]
    fn boolean(&mut self) -> Result<bool> {
        match self.ws() {
            Some(b't') => {
                self.i += 1;
                self.ident(b"rue").map(|()| true)
            }
            Some(b'f') => {
                self.i += 1;
                self.ident(b"alse").map(|()| false)
            }
            None => Err(self.peek_error(Code::EofWhileParsingValue)),
            Some(_) => Err(self.invalid_type("a boolean")),
        }
    }

    #[inline(always)]
    fn unsigned(&mut self) -> Result<u64> {
        // (No whitespace first, as in compact JSON.)
        let c = match self.b.get(self.i) {
            Some(&c) if c > b' ' => Some(c),
            _ => self.ws(),
        };
        match c {
            // The common case, inline: up to 19 digits (below u64::MAX), then
            // not a fraction or an exponent.
            Some(c @ b'1'..=b'9') => {
                let mut n = u64::from(c - b'0');
                let mut i = self.i + 1;
                while let Some(&d @ b'0'..=b'9') = self.b.get(i) {
                    if i - self.i >= 19 {
                        return self.unsigned_slow();
                    }
                    n = n * 10 + u64::from(d - b'0');
                    i += 1;
                }
                if let Some(b'.' | b'e' | b'E') = self.b.get(i) {
                    return self.unsigned_slow();
                }
                self.i = i;
                Ok(n)
            }
            Some(b'-' | b'0') => self.unsigned_slow(),
            None => Err(self.peek_error(Code::EofWhileParsingValue)),
            Some(_) => Err(self.invalid_type("u64")),
        }
    }

    /// [`Self::unsigned`] for 20 digits and more, `0`, and what is not a
    /// `u64` at all.
    #[inline(always)]
    fn unsigned_slow(&mut self) -> Result<u64> {
        let (n, i) = self.unsigned_slow_from()?;
        self.i = i;
        Ok(n)
    }

    /// [`Self::unsigned_slow`] on a copy of the cursor: the number and the
    /// index after it.
    #[cold]
    #[inline(never)]
    fn unsigned_slow_from(mut self) -> Result<(u64, usize)> {
        match self.ws() {
            Some(b'-' | b'0'..=b'9') => match self.number()? {
                Number::U64(n) => Ok((n, self.i)),
                Number::I64(n) => Err(self.error_message(invalid(
                    Invalid::Value,
                    serde::de::Unexpected::Signed(n),
                    "u64",
                ))),
                Number::F64(f) => Err(self.error_message(invalid(
                    Invalid::Type,
                    serde::de::Unexpected::Float(f),
                    "u64",
                ))),
            },
            None => Err(self.peek_error(Code::EofWhileParsingValue)),
            Some(_) => Err(self.invalid_type("u64")),
        }
    }

    /// A number starting at `-` or a digit, as serde_json reads it for a
    /// typed field: an unsigned integer, a negative one, or a float.
    fn number(&mut self) -> Result<Number> {
        let start = self.i;
        let positive = self.b.get(self.i) != Some(&b'-');
        if !positive {
            self.i += 1;
        }
        let n = match self.next() {
            Some(b'0') => {
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.peek_error(Code::InvalidNumber));
                }
                0
            }
            Some(c @ b'1'..=b'9') => {
                let mut n = u64::from(c - b'0');
                while let Some(d @ b'0'..=b'9') = self.peek() {
                    match n
                        .checked_mul(10)
                        .and_then(|n| n.checked_add(u64::from(d - b'0')))
                    {
                        Some(m) => n = m,
                        None => return self.float(start),
                    }
                    self.i += 1;
                }
                n
            }
            Some(_) => return Err(self.error(Code::InvalidNumber)),
            None => return Err(self.error(Code::EofWhileParsingValue)),
        };
        if let Some(b'.' | b'e' | b'E') = self.peek() {
            return self.float(start);
        }
        Ok(match (positive, n) {
            (true, n) => Number::U64(n),
            // serde_json reads `-0` as a float.
            (false, 0) => Number::F64(-0.0),
            (false, n) if n <= 1 << 63 => Number::I64(0i64.wrapping_sub_unsigned(n)),
            (false, n) => Number::F64(-(n as f64)),
        })
    }

    /// The rest of a number that is not a `u64` or an `i64`, from its first
    /// byte at `start`. Cold: no field of ours takes a float.
    #[cold]
    fn float(&mut self, start: usize) -> Result<Number> {
        self.skip_digits();
        if self.peek() == Some(b'.') {
            self.i += 1;
            match self.peek() {
                Some(b'0'..=b'9') => self.skip_digits(),
                Some(_) => return Err(self.peek_error(Code::InvalidNumber)),
                None => return Err(self.peek_error(Code::EofWhileParsingValue)),
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            // serde_json refuses an exponent beyond i32 unless the number
            // is 0 or the exponent negative.
            let zero = self.b[start..self.i]
                .iter()
                .all(|c| matches!(c, b'-' | b'0' | b'.'));
            self.i += 1;
            let positive = match self.peek() {
                Some(b'-') => {
                    self.i += 1;
                    false
                }
                Some(b'+') => {
                    self.i += 1;
                    true
                }
                _ => true,
            };
            let mut exp: i32 = match self.next() {
                Some(d @ b'0'..=b'9') => (d - b'0').into(),
                Some(_) => return Err(self.error(Code::InvalidNumber)),
                None => return Err(self.error(Code::EofWhileParsingValue)),
            };
            while let Some(d @ b'0'..=b'9') = self.peek() {
                self.i += 1;
                match exp
                    .checked_mul(10)
                    .and_then(|e| e.checked_add((d - b'0').into()))
                {
                    Some(e) => exp = e,
                    // serde_json stops at the digit that overflows an i32.
                    None if positive && !zero => return Err(self.error(Code::NumberOutOfRange)),
                    None => self.skip_digits(),
                }
            }
        }
        let f = std::str::from_utf8(&self.b[start..self.i])
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(f64::NAN);
        if f.is_infinite() {
            return Err(self.error(Code::NumberOutOfRange));
        }
        Ok(Number::F64(f))
    }

    fn skip_digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    /// The rest of a literal whose first byte was read.
    #[inline(always)]
    fn ident(&mut self, rest: &[u8]) -> Result<()> {
        if self.b.get(self.i..self.i + rest.len()) == Some(rest) {
            self.i += rest.len();
            return Ok(());
        }
        for &expected in rest {
            match self.next() {
                Some(c) if c == expected => {}
                Some(_) => return Err(self.error(Code::ExpectedSomeIdent)),
                None => return Err(self.error(Code::EofWhileParsingValue)),
            }
        }
        Ok(())
    }

    /// The rest of a string whose `"` was just read, unescaped and checked
    /// as UTF-8: borrowed from the body when it has no escapes.
    #[inline(always)]
    fn string_body(&mut self) -> Result<Cow<'a, str>> {
        let start = self.i;
        self.i = string_stop::<false>(self.b, start);
        if self.peek() != Some(b'"') {
            return self.escaped_string(start).map(Cow::Owned);
        }
        let s = &self.b[start..self.i];
        self.i += 1;
        match utf8(s) {
            Some(s) => Ok(Cow::Borrowed(s)),
            None => Err(self.invalid_utf8(s)),
        }
    }

    /// A key (its `"` just read), unescaped and checked like any string we
    /// decode: its index in `fields`, if there. A key in plain ASCII is
    /// compared as it is.
    #[inline(always)]
    fn key_field(&mut self, fields: &[&'static str]) -> Result<Option<usize>> {
        let start = self.i;
        let end = string_stop::<true>(self.b, start);
        if self.b.get(end) == Some(&b'"') {
            self.i = end + 1;
            let key = &self.b[start..end];
            return Ok(fields.iter().position(|f| f.as_bytes() == key));
        }
        let key = self.escaped_string(start)?;
        Ok(fields.iter().position(|f| *f == key))
    }

    /// A string from its first byte at `start` that has escapes (or errors).
    #[inline(always)]
    fn escaped_string(&mut self, start: usize) -> Result<String> {
        let (s, i) = self.escaped_string_from(start)?;
        self.i = i;
        Ok(s)
    }

    /// [`Self::escaped_string`] on a copy of the cursor: the string and the
    /// index after it.
    #[cold]
    #[inline(never)]
    fn escaped_string_from(mut self, start: usize) -> Result<(String, usize)> {
        let mut out = Vec::new();
        self.i = start;
        loop {
            let run = self.i;
            self.i = string_stop::<false>(self.b, run);
            out.extend_from_slice(&self.b[run..self.i]);
            match self.next() {
                Some(b'"') => break,
                Some(b'\\') => self.escape(&mut out)?,
                Some(_) => return Err(self.error(Code::ControlCharacterWhileParsingString)),
                None => return Err(self.error(Code::EofWhileParsingString)),
            }
        }
        match String::from_utf8(out) {
            Ok(s) => Ok((s, self.i)),
            Err(e) => Err(self.invalid_utf8(e.as_bytes())),
        }
    }

    /// An escape whose `\` was just read, appended to `out`.
    fn escape(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let c = match self.next() {
            Some(c @ (b'"' | b'\\' | b'/')) => c,
            Some(b'b') => b'\x08',
            Some(b'f') => b'\x0c',
            Some(b'n') => b'\n',
            Some(b'r') => b'\r',
            Some(b't') => b'\t',
            Some(b'u') => return self.unicode_escape(out),
            Some(_) => return Err(self.error(Code::InvalidEscape)),
            None => return Err(self.error(Code::EofWhileParsingString)),
        };
        out.push(c);
        Ok(())
    }

    /// `\uXXXX` (its `\u` just read): a surrogate must be a leading one
    /// followed by an escaped trailing one.
    fn unicode_escape(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let n = self.hex4()?;
        let c = match n {
            0xDC00..=0xDFFF => return Err(self.error(Code::LoneLeadingSurrogateInHexEscape)),
            0xD800..=0xDBFF => {
                for expected in [b'\\', b'u'] {
                    match self.next() {
                        Some(c) if c == expected => {}
                        Some(_) => return Err(self.error(Code::UnexpectedEndOfHexEscape)),
                        None => return Err(self.error(Code::EofWhileParsingString)),
                    }
                }
                let n2 = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&n2) {
                    return Err(self.error(Code::LoneLeadingSurrogateInHexEscape));
                }
                0x1_0000 + ((u32::from(n - 0xD800) << 10) | u32::from(n2 - 0xDC00))
            }
            n => u32::from(n),
        };
        let c = char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER);
        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }

    /// Four hex digits.
    fn hex4(&mut self) -> Result<u16> {
        let Some(digits) = self.b.get(self.i..self.i + 4) else {
            self.i = self.b.len();
            return Err(self.error(Code::EofWhileParsingString));
        };
        self.i += 4;
        digits
            .iter()
            .try_fold(0u16, |n, &d| Some(n << 4 | u16::from(hex_value(d)?)))
            .ok_or_else(|| self.error(Code::InvalidEscape))
    }

    // ---- skipping ----

    /// Skips one value (see [`skip_value`]).
    #[inline(always)]
    fn skip_value(&mut self) -> Result<()> {
        match skip_value(self.b, self.i) {
            Ok(i) => {
                self.i = i;
                Ok(())
            }
            Err(fail) => Err(fail.error(self.b)),
        }
    }

    // ---- bytes ----

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    /// Reads `c` if it is the next byte (whitespace not skipped).
    #[inline(always)]
    fn eat(&mut self, c: u8) -> bool {
        let found = self.b.get(self.i) == Some(&c);
        if found {
            self.i += 1;
        }
        found
    }

    /// Reads `c` if it is next, at once (compact JSON) or after
    /// whitespace; else the byte found instead, unread (`None`: the end).
    #[inline(always)]
    fn eat_after_ws(&mut self, c: u8) -> std::result::Result<(), Option<u8>> {
        if self.eat(c) {
            return Ok(());
        }
        match self.ws() {
            Some(b) if b == c => {
                self.i += 1;
                Ok(())
            }
            other => Err(other),
        }
    }

    /// Skips whitespace; the next byte.
    #[inline(always)]
    fn ws(&mut self) -> Option<u8> {
        loop {
            match self.b.get(self.i) {
                Some(b' ' | b'\n' | b'\t' | b'\r') => self.i += 1,
                other => return other.copied(),
            }
        }
    }

    // ---- errors ----

    // (The cursor is passed by value to the cold functions that build
    // errors, so that it can stay in registers on the hot paths.)

    /// An error at the byte last read.
    #[inline(always)]
    fn error(&self, code: Code) -> PeekError {
        error_at(self.b, self.i, code)
    }

    /// An error at the byte about to be read.
    #[inline(always)]
    fn peek_error(&self, code: Code) -> PeekError {
        error_at(self.b, self.i + 1, code)
    }

    #[inline(always)]
    fn peek_error_message(&self, message: Box<str>) -> PeekError {
        message_at(self.b, self.i + 1, message)
    }

    #[inline(always)]
    fn error_message(&self, message: Box<str>) -> PeekError {
        message_at(self.b, self.i, message)
    }

    /// A decoded string `s` (just read) is not UTF-8: serde_json points
    /// back at its first invalid byte.
    #[cold]
    #[inline(never)]
    fn invalid_utf8(self, s: &[u8]) -> PeekError {
        let valid = std::str::from_utf8(s).map_or_else(|e| e.valid_up_to(), str::len);
        let mut e = self.error(Code::InvalidUnicodeCodePoint);
        e.0.column = e.0.column.saturating_sub(s.len() - valid);
        e
    }

    /// `key` given twice. serde_json points after the key and the
    /// whitespace that follows it (and a `}` there: it then reads the end of
    /// the object before placing the error).
    #[cold]
    #[inline(never)]
    fn duplicate_field(mut self, key: &str) -> PeekError {
        if self.ws() == Some(b'}') {
            self.i += 1;
        }
        self.error_message(format!("duplicate field `{key}`").into())
    }

    /// The value at the cursor is not what the field takes: reads it (its
    /// own syntax errors come first) and says what it is.
    #[cold]
    #[inline(never)]
    fn invalid_type(mut self, expecting: &str) -> PeekError {
        use serde::de::Unexpected;
        let message = match self.peek() {
            Some(b'n') => {
                self.i += 1;
                if let Err(e) = self.ident(b"ull") {
                    return e;
                }
                invalid(Invalid::Type, Unexpected::Unit, expecting)
            }
            Some(c @ (b't' | b'f')) => {
                self.i += 1;
                let (rest, value): (&[u8], _) = if c == b't' {
                    (b"rue", true)
                } else {
                    (b"alse", false)
                };
                if let Err(e) = self.ident(rest) {
                    return e;
                }
                invalid(Invalid::Type, Unexpected::Bool(value), expecting)
            }
            Some(b'-' | b'0'..=b'9') => {
                let unexpected = match self.number() {
                    Ok(Number::U64(n)) => Unexpected::Unsigned(n),
                    Ok(Number::I64(n)) => Unexpected::Signed(n),
                    Ok(Number::F64(f)) => Unexpected::Float(f),
                    Err(e) => return e,
                };
                invalid(Invalid::Type, unexpected, expecting)
            }
            Some(b'"') => {
                self.i += 1;
                match self.string_body() {
                    Ok(s) => invalid(Invalid::Type, Unexpected::Str(&s), expecting),
                    Err(e) => return e,
                }
            }
            Some(b'[') => invalid(Invalid::Type, Unexpected::Seq, expecting),
            Some(b'{') => invalid(Invalid::Type, Unexpected::Map, expecting),
            _ => return self.peek_error(Code::ExpectedSomeValue),
        };
        self.error_message(message)
    }
}

#[cold]
#[inline(never)]
fn error_at(b: &[u8], i: usize, code: Code) -> PeekError {
    message_at(b, i, code.message().into())
}

/// The error `message` at byte `i`, placed as serde_json places it: the
/// line from 1 and the column, counted in bytes, from 1 too (0 when before
/// the line's first byte).
#[cold]
#[inline(never)]
fn message_at(b: &[u8], i: usize, message: Box<str>) -> PeekError {
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

enum Invalid {
    Type,
    Value,
}

/// serde_json's wording for a value of the wrong type (or an out-of-range
/// one), e.g. "invalid type: string \"x\", expected a boolean".
#[cold]
fn invalid(kind: Invalid, unexpected: serde::de::Unexpected<'_>, expecting: &str) -> Box<str> {
    use serde::de::Error as _;
    let e = match kind {
        Invalid::Type => serde_json::Error::invalid_type(unexpected, &expecting),
        Invalid::Value => serde_json::Error::invalid_value(unexpected, &expecting),
    };
    e.to_string().into()
}

// ---- skipping ----
//
// The skipper works on `(bytes, index)` pairs, not on the `Parser`, so that
// its state stays in registers; it returns the index after what it skipped.

/// A syntax error found while skipping: `at` is the index serde_json
/// reports (the byte last read, or the one about to be read, per error).
struct Fail {
    at: usize,
    code: Code,
}

impl Fail {
    #[cold]
    fn error(self, b: &[u8]) -> PeekError {
        error_at(b, self.at, self.code)
    }
}

type Skip = std::result::Result<usize, Fail>;

/// Skips the value at `i` (after whitespace), checking its syntax as
/// serde_json's `ignore_value` does: strings are not unescaped (nor checked
/// as UTF-8), numbers not converted, and the open arrays and objects are
/// tracked one bit each, without recursion.
///
/// The fast skipper below only tells whether the value is valid: any error
/// (and nesting beyond 63 levels) sends the value to [`skip_exact`], which
/// walks it again to say which error, and where. Its parts return [`FAILED`]
/// rather than a `Result`, so that the happy path checks nothing: the next
/// read past the end of the body fails too.
#[inline(always)]
fn skip_value(b: &[u8], i: usize) -> Skip {
    let i = skip_ws(b, i);
    let end = match b.get(i) {
        Some(b'"') => skip_string(b, i + 1),
        Some(b'-' | b'0'..=b'9') => skip_number(b, i),
        _ => return skip_nested(b, i),
    };
    if end <= b.len() {
        Ok(end)
    } else {
        skip_exact(b, i)
    }
}

/// Where a fast skip failed: past any body, and far from overflowing.
const FAILED: usize = usize::MAX / 2;

/// [`skip_value`] for anything but a string or a number (at `i`, after
/// whitespace): the open levels are the bits of one word, above a sentinel
/// bit.
#[inline(never)]
fn skip_nested(b: &[u8], start: usize) -> Skip {
    // The open levels, innermost lowest (set for an object), above a 1.
    let mut open: u64 = 1;
    let mut i = start;
    loop {
        // A value (after whitespace).
        match b.get(i) {
            Some(b'"') => i = skip_string(b, i + 1),
            Some(b'-' | b'0'..=b'9') => i = skip_number(b, i),
            Some(b'{') => {
                if open >> 63 != 0 {
                    return skip_exact(b, start);
                }
                i = skip_ws(b, i + 1);
                match b.get(i) {
                    Some(b'"') => {
                        open = open << 1 | 1;
                        i = skip_member_key(b, i + 1);
                        continue;
                    }
                    Some(b'}') => i += 1,
                    _ => return skip_exact(b, start),
                }
            }
            Some(b'[') => {
                if open >> 63 != 0 {
                    return skip_exact(b, start);
                }
                i = skip_ws(b, i + 1);
                match b.get(i) {
                    Some(b']') => i += 1,
                    Some(_) => {
                        open <<= 1;
                        continue;
                    }
                    None => return skip_exact(b, start),
                }
            }
            Some(b'n') => i = skip_literal(b, i + 1, b"ull"),
            Some(b't') => i = skip_literal(b, i + 1, b"rue"),
            Some(b'f') => i = skip_literal(b, i + 1, b"alse"),
            // Whitespace before the value.
            Some(b' ' | b'\n' | b'\t' | b'\r') => {
                i = skip_ws(b, i + 1);
                continue;
            }
            _ => return skip_exact(b, start),
        }
        // After a value: a comma, or the ends of arrays and objects.
        loop {
            if open == 1 {
                if i <= b.len() {
                    return Ok(i);
                }
                return skip_exact(b, start);
            }
            let in_object = open & 1 == 1;
            // Compact JSON first: `,"` in an object.
            if in_object && b.get(i..i + 2) == Some(b",\"") {
                i = skip_member_key(b, i + 2);
                break;
            }
            i = skip_ws(b, i);
            match b.get(i) {
                Some(b',') => {
                    i = skip_ws(b, i + 1);
                    if in_object {
                        if b.get(i) != Some(&b'"') {
                            return skip_exact(b, start);
                        }
                        i = skip_member_key(b, i + 1);
                    }
                    break;
                }
                Some(b'}') if in_object => {}
                Some(b']') if !in_object => {}
                _ => return skip_exact(b, start),
            }
            i += 1;
            open >>= 1;
        }
    }
}

/// In a skipped object, the rest of a key whose `"` is before `i` and the
/// colon.
#[inline(always)]
fn skip_member_key(b: &[u8], i: usize) -> usize {
    let i = skip_string(b, i);
    if b.get(i) == Some(&b':') {
        return i + 1;
    }
    let i = skip_ws(b, i);
    if b.get(i) == Some(&b':') {
        i + 1
    } else {
        FAILED
    }
}

/// The rest of a string whose `"` is before `i`. Inline, the common case:
/// no escapes, and not in the last eight bytes of the body.
#[inline(always)]
fn skip_string(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let chunk = <[u8; 8]>::try_from(chunk).unwrap_or_default();
        let found = stops::<false>(u64::from_le_bytes(chunk));
        if found != 0 {
            let end = i + (found.trailing_zeros() / 8) as usize;
            if b.get(end) == Some(&b'"') {
                return end + 1;
            }
            return skip_string_long(b, i);
        }
        i += 8;
    }
    // The last bytes of the body.
    let end = string_stop_tail::<false>(b, i);
    if b.get(end) == Some(&b'"') {
        return end + 1;
    }
    skip_string_long(b, i)
}

/// [`skip_string`] from `i` on, for the last bytes of the body, escapes
/// and errors.
#[inline(never)]
fn skip_string_long(b: &[u8], i: usize) -> usize {
    exact_string(b, i).unwrap_or(FAILED)
}

/// A number at `i` (its `-` or first digit).
#[inline(always)]
fn skip_number(b: &[u8], i: usize) -> usize {
    exact_number(b, i).unwrap_or(FAILED)
}

/// The `rest` of a literal whose first byte is before `i`.
#[inline(always)]
fn skip_literal(b: &[u8], i: usize, rest: &[u8]) -> usize {
    if b.get(i..i + rest.len()) == Some(rest) {
        i + rest.len()
    } else {
        FAILED
    }
}

/// Skips the value at `i` (after whitespace) as [`skip_value`] does, at any
/// depth (the levels beyond 64 are kept in a vector), and with the error
/// serde_json would give.
#[cold]
#[inline(never)]
fn skip_exact(b: &[u8], mut i: usize) -> Skip {
    let mut frames = Frames::default();
    loop {
        // A value.
        let opened = match b.get(i) {
            Some(b'"') => {
                i = exact_string(b, i + 1)?;
                false
            }
            Some(b'-' | b'0'..=b'9') => {
                i = exact_number(b, i)?;
                false
            }
            Some(&c @ (b'{' | b'[')) => {
                frames.push(c == b'{');
                i += 1;
                true
            }
            Some(b'n') => {
                i = exact_literal(b, i + 1, b"ull")?;
                false
            }
            Some(b't') => {
                i = exact_literal(b, i + 1, b"rue")?;
                false
            }
            Some(b'f') => {
                i = exact_literal(b, i + 1, b"alse")?;
                false
            }
            Some(_) => return fail(i + 1, Code::ExpectedSomeValue),
            None => return fail(i + 1, Code::EofWhileParsingValue),
        };
        // What follows it: a comma, or the ends of arrays and objects
        // (right after an opening, the first element instead).
        let mut after_value = !opened;
        let in_object = loop {
            let Some(in_object) = frames.top() else {
                return Ok(i);
            };
            i = skip_ws(b, i);
            match b.get(i) {
                Some(b',') if after_value => {
                    i += 1;
                    break in_object;
                }
                Some(b'}') if in_object => {}
                Some(b']') if !in_object => {}
                Some(_) if !after_value => break in_object,
                Some(_) if in_object => return fail(i + 1, Code::ExpectedObjectCommaOrEnd),
                Some(_) => return fail(i + 1, Code::ExpectedListCommaOrEnd),
                None if in_object => return fail(i + 1, Code::EofWhileParsingObject),
                None => return fail(i + 1, Code::EofWhileParsingList),
            }
            i += 1;
            frames.pop();
            after_value = true;
        };
        if in_object {
            i = skip_ws(b, i);
            match b.get(i) {
                Some(b'"') => i = exact_string(b, i + 1)?,
                Some(_) => return fail(i + 1, Code::KeyMustBeAString),
                None => return fail(i + 1, Code::EofWhileParsingObject),
            }
            i = skip_ws(b, i);
            match b.get(i) {
                Some(b':') => i += 1,
                Some(_) => return fail(i + 1, Code::ExpectedColon),
                None => return fail(i + 1, Code::EofWhileParsingObject),
            }
        }
        i = skip_ws(b, i);
    }
}

#[cold]
fn fail(at: usize, code: Code) -> Skip {
    Err(Fail { at, code })
}

#[inline(always)]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// The rest of a string from `i` (after its `"`, maybe after some of its
/// content), with serde_json's error.
fn exact_string(b: &[u8], mut i: usize) -> Skip {
    loop {
        i = string_stop::<false>(b, i);
        match b.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => i = exact_escape(b, i + 1)?,
            Some(_) => return fail(i, Code::ControlCharacterWhileParsingString),
            None => return fail(i, Code::EofWhileParsingString),
        }
    }
}

/// The rest of an escape whose `\` is before `i`.
fn exact_escape(b: &[u8], i: usize) -> Skip {
    match b.get(i) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 1),
        Some(b'u') => match b.get(i + 1..i + 5) {
            Some(digits) if digits.iter().all(u8::is_ascii_hexdigit) => Ok(i + 5),
            Some(_) => fail(i + 5, Code::InvalidEscape),
            None => fail(b.len(), Code::EofWhileParsingString),
        },
        Some(_) => fail(i + 1, Code::InvalidEscape),
        None => fail(i, Code::EofWhileParsingString),
    }
}

/// A number at `i` (its `-` or first digit), with serde_json's error.
#[inline(always)]
fn exact_number(b: &[u8], mut i: usize) -> Skip {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => {
            i += 1;
            if let Some(b'0'..=b'9') = b.get(i) {
                return fail(i + 1, Code::InvalidNumber);
            }
        }
        Some(b'1'..=b'9') => i = skip_digits(b, i + 1),
        Some(_) => return fail(i + 1, Code::InvalidNumber),
        None => return fail(i, Code::InvalidNumber),
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        match b.get(i) {
            Some(b'0'..=b'9') => i = skip_digits(b, i + 1),
            _ => return fail(i + 1, Code::InvalidNumber),
        }
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        match b.get(i) {
            Some(b'0'..=b'9') => i = skip_digits(b, i + 1),
            Some(_) => return fail(i + 1, Code::InvalidNumber),
            None => return fail(i, Code::InvalidNumber),
        }
    }
    Ok(i)
}

/// The digits from `i` on; eight at a time.
#[inline(always)]
fn skip_digits(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = u64::MAX / 255;
    while let Some(chunk) = b.get(i..i + 8) {
        let x = u64::from_le_bytes(<[u8; 8]>::try_from(chunk).unwrap_or_default());
        // A digit is `0x30 | d` with `d` below 10: the high bit of each
        // byte that is not.
        let t = x ^ (ONES * 0x30);
        let other = (((t & (ONES * 0x7f)) + ONES * 0x76) | t) & (ONES << 7);
        if other != 0 {
            return i + (other.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(b'0'..=b'9') = b.get(i) {
        i += 1;
    }
    i
}

/// The `rest` of a literal whose first byte is before `i`, with serde_json's
/// error.
fn exact_literal(b: &[u8], i: usize, rest: &[u8]) -> Skip {
    for (k, &expected) in rest.iter().enumerate() {
        match b.get(i + k) {
            Some(&c) if c == expected => {}
            Some(_) => return fail(i + k + 1, Code::ExpectedSomeIdent),
            None => return fail(i + k, Code::EofWhileParsingValue),
        }
    }
    Ok(i + rest.len())
}

/// The open arrays and objects around a skipped value, one bit each (set
/// for an object): no allocation below 64 levels, no limit above.
#[derive(Default)]
struct Frames {
    /// The innermost levels, the innermost in the lowest bit.
    bits: u64,
    /// How many levels `bits` holds (0 only when there are none at all).
    len: u32,
    /// Outer levels, 64 to a word.
    outer: Vec<u64>,
}

impl Frames {
    #[inline(always)]
    fn push(&mut self, object: bool) {
        if self.len == 64 {
            self.outer.push(self.bits);
            self.bits = 0;
            self.len = 0;
        }
        self.bits = self.bits << 1 | u64::from(object);
        self.len += 1;
    }

    #[inline(always)]
    fn pop(&mut self) {
        self.bits >>= 1;
        self.len -= 1;
        if self.len == 0 {
            if let Some(word) = self.outer.pop() {
                self.bits = word;
                self.len = 64;
            }
        }
    }

    /// Whether the innermost level is an object; `None` at the top.
    #[inline(always)]
    fn top(&self) -> Option<bool> {
        (self.len > 0).then_some(self.bits & 1 == 1)
    }
}

/// The index of the first `"`, `\` or control character (and, if
/// `NON_ASCII`, byte above 0x7F) in `b` at or after `i`, or `b.len()`:
/// where plain string content stops. Eight bytes at a time.
#[inline(always)]
fn string_stop<const NON_ASCII: bool>(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let chunk = <[u8; 8]>::try_from(chunk).unwrap_or_default();
        match stops::<NON_ASCII>(u64::from_le_bytes(chunk)) {
            0 => i += 8,
            found => return i + (found.trailing_zeros() / 8) as usize,
        }
    }
    string_stop_tail::<NON_ASCII>(b, i)
}

/// [`string_stop`] in the last seven bytes of `b` (`i` at most `b.len()`):
/// they are read as the end of the last eight, shifted so that zeros
/// (control characters, so stops) come in past the end.
#[inline(never)]
fn string_stop_tail<const NON_ASCII: bool>(b: &[u8], i: usize) -> usize {
    let Some(last) = b.last_chunk::<8>() else {
        return string_stop_short::<NON_ASCII>(b, i);
    };
    // The bytes of `last` before `i`, shifted out (all of them when `i` is
    // at the end).
    let skipped = (i + 8 - b.len()).min(8) as u32 * 8;
    match u64::from_le_bytes(*last).checked_shr(skipped) {
        Some(x) => i + (stops::<NON_ASCII>(x).trailing_zeros() / 8) as usize,
        None => i,
    }
}

/// [`string_stop`] in a body shorter than eight bytes.
#[cold]
#[inline(never)]
fn string_stop_short<const NON_ASCII: bool>(b: &[u8], mut i: usize) -> usize {
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 || (NON_ASCII && c > 0x7f) {
            break;
        }
        i += 1;
    }
    i
}

/// The high bit of each byte of `x` (little-endian) that may be a stop of
/// [`string_stop`]: the usual "has a zero byte" bit trick, applied to each
/// condition. Its false positives only ever follow a true one, so the
/// lowest set bit is exact.
#[inline(always)]
fn stops<const NON_ASCII: bool>(x: u64) -> u64 {
    const ONES: u64 = u64::MAX / 255;
    // `c ^ 2 < 0x21` is exactly `c < 0x20 || c == b'"'`.
    let y = x ^ (ONES * 2);
    let control_or_quote = y.wrapping_sub(ONES * 0x21) & !y;
    let z = x ^ (ONES * u64::from(b'\\'));
    let backslash = z.wrapping_sub(ONES) & !z;
    let non_ascii = if NON_ASCII { x } else { 0 };
    (control_or_quote | backslash | non_ascii) & (ONES << 7)
}

/// `s` as a `str` if it is UTF-8 (`std::str::from_utf8`, with less
/// overhead on the short strings we read).
#[inline(always)]
fn utf8(s: &[u8]) -> Option<&str> {
    if s.len() >= 32 {
        return std::str::from_utf8(s).ok();
    }
    // The first chunk is all of `s` when it is valid.
    match s.utf8_chunks().next() {
        Some(chunk) if chunk.invalid().is_empty() => Some(chunk.valid()),
        Some(_) => None,
        // Empty: still borrowed from the body.
        None => std::str::from_utf8(s).ok(),
    }
}

fn hex_value(d: u8) -> Option<u8> {
    match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    /// The structs handler.rs gave serde_json (copied, names included, as
    /// they show in messages): the reference.
    mod reference {
        use serde::Deserialize;
        use std::borrow::Cow;

        #[derive(Deserialize, Debug)]
        pub(super) struct BodyPeek<'a> {
            #[serde(borrow, default)]
            pub(super) model: Option<Cow<'a, str>>,
            #[serde(default)]
            pub(super) stream: Option<bool>,
            #[serde(default)]
            pub(super) max_tokens: Option<u64>,
            #[serde(default)]
            pub(super) max_completion_tokens: Option<u64>,
            #[serde(default)]
            pub(super) max_output_tokens: Option<u64>,
            #[serde(default)]
            pub(super) response_format: Option<ResponseFormatPeek>,
        }

        #[derive(Deserialize, Debug)]
        pub(super) struct ResponseFormatPeek {
            #[serde(rename = "type", default)]
            pub(super) kind: String,
        }

        #[derive(Deserialize, Debug)]
        pub(super) struct AnswerPeek {
            #[serde(default)]
            pub(super) model: Option<String>,
            #[serde(default)]
            pub(super) usage: Option<Usage>,
        }

        #[derive(Deserialize, Debug)]
        pub(super) struct Usage {
            #[serde(default)]
            pub(super) prompt_tokens: Option<u64>,
            #[serde(default)]
            pub(super) completion_tokens: Option<u64>,
            #[serde(default)]
            pub(super) input_tokens: Option<u64>,
            #[serde(default)]
            pub(super) output_tokens: Option<u64>,
        }
    }

    /// The one case left out of the comparison: serde's derived struct
    /// takes a top-level array of fields; we refuse it.
    fn top_level_array(b: &[u8]) -> bool {
        b.iter()
            .find(|c| !matches!(c, b' ' | b'\n' | b'\t' | b'\r'))
            == Some(&b'[')
    }

    fn show(b: &[u8]) -> String {
        format!("{:?}", String::from_utf8_lossy(b))
    }

    /// Both failed: the messages should be serde_json's, except for the
    /// value of a float given where an integer was expected (serde_json's
    /// own float parsing is not correctly rounded; we show Rust's), and
    /// what a top-level value should have been.
    fn same_error(ours: &PeekError, theirs: &serde_json::Error, b: &[u8]) {
        fn float_elided(message: String) -> String {
            let message = message
                .replace("expected struct BodyPeek", "expected a JSON object")
                .replace("expected struct AnswerPeek", "expected a JSON object");
            match message.split_once("floating point `") {
                Some((head, tail)) => match tail.split_once('`') {
                    Some((_, rest)) => format!("{head}floating point `_`{rest}"),
                    None => message,
                },
                None => message,
            }
        }
        assert_eq!(
            float_elided(ours.to_string()),
            float_elided(theirs.to_string()),
            "body {}",
            show(b)
        );
    }

    /// `peek_request` against serde_json; returns ours.
    fn check_request(b: &[u8]) -> std::result::Result<RequestPeek<'_>, PeekError> {
        let ours = peek_request(b);
        if top_level_array(b) {
            assert!(ours.is_err(), "top-level array accepted: {}", show(b));
            return ours;
        }
        match (&ours, serde_json::from_slice::<reference::BodyPeek<'_>>(b)) {
            (Ok(o), Ok(t)) => {
                assert_eq!(o.model.as_deref(), t.model.as_deref(), "{}", show(b));
                assert_eq!(o.stream, t.stream, "{}", show(b));
                assert_eq!(o.max_tokens, t.max_tokens, "{}", show(b));
                assert_eq!(o.max_completion_tokens, t.max_completion_tokens);
                assert_eq!(o.max_output_tokens, t.max_output_tokens);
                assert_eq!(
                    o.response_format.as_ref().map(|r| &*r.kind),
                    t.response_format.as_ref().map(|r| &*r.kind),
                    "{}",
                    show(b)
                );
                if let Some(Cow::Borrowed(m)) = &o.model {
                    // Borrowed means: the very bytes of the body.
                    let body = b.as_ptr_range();
                    assert!(body.contains(&m.as_ptr()), "{}", show(b));
                }
            }
            (Err(o), Err(t)) => same_error(o, &t, b),
            (o, t) => panic!("body {}: ours {o:?}, serde_json {t:?}", show(b)),
        }
        ours
    }

    /// `peek_answer` against serde_json; returns ours.
    fn check_answer(b: &[u8]) -> std::result::Result<AnswerPeek, PeekError> {
        let ours = peek_answer(b);
        if top_level_array(b) {
            assert!(ours.is_err(), "top-level array accepted: {}", show(b));
            return ours;
        }
        match (&ours, serde_json::from_slice::<reference::AnswerPeek>(b)) {
            (Ok(o), Ok(t)) => {
                assert_eq!(o.model, t.model, "{}", show(b));
                let t_usage = t.usage.map(|u| Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                });
                assert_eq!(o.usage, t_usage, "{}", show(b));
            }
            (Err(o), Err(t)) => same_error(o, &t, b),
            (o, t) => panic!("body {}: ours {o:?}, serde_json {t:?}", show(b)),
        }
        ours
    }

    fn check(b: &[u8]) {
        let _ = check_request(b);
        let _ = check_answer(b);
    }

    const BENCH_REQUEST: &[u8] =
        br#"{"model":"bench","messages":[{"role":"user","content":"hi"}]}"#;

    /// bench/src/backend.rs's RESPONSE_BODY.
    const BENCH_ANSWER: &str = concat!(
        r#"{"id":"chatcmpl-bench-0001","object":"chat.completion","created":1700000000,"#,
        r#""model":"bench","choices":[{"index":0,"message":{"role":"assistant","#,
        r#""content":"Hello! This is a fixed answer from the benchmark backend."},"#,
        r#""logprobs":null,"finish_reason":"stop"}],"#,
        r#""usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#
    );

    #[test]
    fn bench_bodies() {
        let r = check_request(BENCH_REQUEST).expect("bench request");
        assert_eq!(r.model, Some(Cow::Borrowed("bench")));
        assert!(matches!(r.model, Some(Cow::Borrowed(_))));
        assert_eq!(r.stream, None);
        assert_eq!(r.response_format, None);
        let a = check_answer(BENCH_ANSWER.as_bytes()).expect("bench answer");
        assert_eq!(a.model.as_deref(), Some("bench"));
        assert_eq!(
            a.usage,
            Some(Usage {
                prompt_tokens: Some(9),
                completion_tokens: Some(12),
                input_tokens: None,
                output_tokens: None,
            })
        );
        check(BENCH_ANSWER.as_bytes());
        check(BENCH_REQUEST);
    }

    #[test]
    fn fields_and_types() {
        let r = check_request(
            br#" { "model" : "gpt-4o" , "stream" : true, "max_tokens": 18446744073709551615,
                "max_completion_tokens":0, "max_output_tokens" :7,
                "response_format": {"type": "json_schema", "json_schema": {"x": [1, {}]}} } "#,
        )
        .expect("valid");
        assert_eq!(r.model.as_deref(), Some("gpt-4o"));
        assert_eq!(r.stream, Some(true));
        assert_eq!(r.max_tokens, Some(u64::MAX));
        assert_eq!(r.max_completion_tokens, Some(0));
        assert_eq!(r.max_output_tokens, Some(7));
        assert_eq!(
            r.response_format.map(|f| f.kind).as_deref(),
            Some("json_schema")
        );
        let a = check_answer(br#"{"usage":{"input_tokens":3,"output_tokens":4}}"#).expect("ok");
        assert_eq!(a.usage.and_then(|u| u.output_tokens), Some(4));
        for body in [
            // null is absent; absent type is "".
            r#"{"model":null,"stream":null,"max_tokens":null,"response_format":null}"#,
            r#"{"response_format":{}}"#,
            r#"{"response_format":{"type":"text","type2":1}}"#,
            r#"{"usage":null}"#,
            r#"{"usage":{}}"#,
            // Nested structs as arrays of their fields in order.
            r#"{"response_format":[]}"#,
            r#"{"response_format":["json_object"]}"#,
            r#"{"response_format":["json_object",1]}"#,
            r#"{"response_format":[null]}"#,
            r#"{"response_format":[ "a" , ]}"#,
            r#"{"response_format":[,]}"#,
            r#"{"response_format":["a" 1]}"#,
            r#"{"usage":[1,2,3,4]}"#,
            r#"{"usage":[1,null,3]}"#,
            r#"{"usage":[1,2,3,4,5]}"#,
            r#"{"usage":[1,2,3,4,]}"#,
            r#"{"usage":[1,2,3,4"#,
            r#"{"usage":[1,2"#,
            r#"{"usage":["#,
            // Wrong types.
            r#"{"stream":"true"}"#,
            r#"{"stream":1}"#,
            r#"{"stream":[true]}"#,
            r#"{"stream":{}}"#,
            r#"{"model":5}"#,
            r#"{"model":-5}"#,
            r#"{"model":true}"#,
            r#"{"model":["x"]}"#,
            r#"{"model":{"x":1}}"#,
            r#"{"max_tokens":1.5}"#,
            r#"{"max_tokens":-1}"#,
            r#"{"max_tokens":-0}"#,
            r#"{"max_tokens":0}"#,
            r#"{"max_tokens":1e2}"#,
            r#"{"max_tokens":1E+2}"#,
            r#"{"max_tokens":1.0}"#,
            r#"{"max_tokens":18446744073709551616}"#,
            r#"{"max_tokens":184467440737095516150}"#,
            r#"{"max_tokens":-9223372036854775808}"#,
            r#"{"max_tokens":-9223372036854775809}"#,
            r#"{"max_tokens":1e400}"#,
            r#"{"max_tokens":"5"}"#,
            r#"{"max_tokens":true}"#,
            r#"{"max_tokens":null}"#,
            r#"{"max_tokens":01}"#,
            r#"{"max_tokens":1.}"#,
            r#"{"max_tokens":1.e5}"#,
            r#"{"max_tokens":1e}"#,
            r#"{"max_tokens":-}"#,
            r#"{"max_tokens":-a}"#,
            r#"{"max_tokens":+1}"#,
            r#"{"max_tokens":.5}"#,
            r#"{"response_format":5}"#,
            r#"{"response_format":"json_object"}"#,
            r#"{"response_format":{"type":null}}"#,
            r#"{"response_format":{"type":5}}"#,
            r#"{"usage":{"prompt_tokens":"9"}}"#,
            r#"{"usage":7}"#,
            r#"{"usage":true}"#,
            // Duplicates: known fields (even after null), unknown ones.
            r#"{"model":null,"model":"x"}"#,
            r#"{"model":"a", "model"  :"b"}"#,
            r#"{"response_format":{"type":"a","type":"b"}}"#,
            r#"{"usage":{"prompt_tokens":1,"prompt_tokens":1}}"#,
            r#"{"x":1,"x":2,"x":{"y":1,"y":2}}"#,
            r#"{"usage":{},"usage":{}}"#,
            // Escaped keys are matched after unescaping.
            r#"{"mod\u0065l":"q"}"#,
            r#"{"mod\u0065l":"q","model":"r"}"#,
            r#"{"\u006dodel":"q\u00e9\ud83d\ude00\n"}"#,
            r#"{"model":"\/\b\f\n\r\t\"\\"}"#,
        ] {
            check(body.as_bytes());
        }
    }

    #[test]
    fn syntax() {
        for body in [
            "",
            "   ",
            "{",
            "}",
            "{}",
            " {} \n\t\r",
            "{} x",
            "{}{}",
            "{},",
            "\u{feff}{}",
            "{}\u{0c}",
            "\u{0b}{}",
            "null",
            "nul",
            "true",
            "5",
            "-",
            "\"s\"",
            "\"s",
            "x",
            "{,}",
            "{\"a\"}",
            "{\"a\" 1}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":1,,\"b\":2}",
            "{1:2}",
            "{\"a\":1",
            "{\"a\":1,",
            "{\"a\":",
            "{\"a\"",
            "{\"a",
            "{\"x\":[1,]}",
            "{\"x\":[,1]}",
            "{\"x\":[1 2]}",
            "{\"x\":[}",
            "{\"x\":{]}",
            "{\"x\":{\"a\":1,}}",
            "{\"x\":{,}}",
            "{\"x\":{\"a\" 1}}",
            "{\"x\":{1:1}}",
            "{\"x\":[[[]]]}",
            "{\"x\":[[[]]}",
            "{\"x\":[[[]]]]}",
            "{\"x\":[",
            "{\"x\":{",
            "{\"x\":{\"a\"",
            "{\"x\":{\"a\":",
            "{\"x\":tru}",
            "{\"x\":truex}",
            "{\"x\":nulL}",
            "{\"x\":f}",
            "{\"x\":01}",
            "{\"x\":-01}",
            "{\"x\":-0}",
            "{\"x\":-}",
            "{\"x\":--1}",
            "{\"x\":1.}",
            "{\"x\":1.e1}",
            "{\"x\":1e}",
            "{\"x\":1e+}",
            "{\"x\":1e+1}",
            "{\"x\":1E-01}",
            "{\"x\":1.5e308}",
            "{\"x\":1e99999}",
            "{\"x\":99999999999999999999999999}",
            "{\"x\":1",
            "{\"x\":1.",
            "{\"x\":1e",
            "{\"x\":-",
            "{\"x\":\"\\x\"}",
            "{\"x\":\"\\u12g4\"}",
            "{\"x\":\"\\u12\"}",
            "{\"x\":\"\\u12",
            "{\"x\":\"\\",
            "{\"x\":\"\t\"}",
            "{\"x\":\"\u{1f}\"}",
            "{\"x\":\"\u{7f}\"}",
            "{\"x\":\"abc",
            "{\"model\":\"abc",
            "{\"model\":\"a\tb\"}",
            "{\"model\":\"\\x\"}",
            "{\"model\":\"\\",
            "{\"model\":\"\\u00",
            "{\"model\":\"\\uZZZZ\"}",
            "{\"model\"\n:\n\"a\"\n,\n\"x\"\n:\n[\n1\n,\n]\n}",
            "{\n  \"a\": 1,\n  \"b\": [\n    2,\n    x\n  ]\n}",
            "{\"a\":1}\n\n  x",
        ] {
            check(body.as_bytes());
        }
    }

    #[test]
    fn unicode() {
        for body in [
            // Invalid UTF-8: fine in ignored strings and keys of ignored
            // objects, an error in read strings and in keys we match.
            &b"{\"x\":\"\xff\"}"[..],
            b"{\"x\":{\"\xff\":1}}",
            b"{\"x\":[\"\xc3\"]}",
            b"{\"\xff\":1}",
            b"{\"model\":\"\xff\"}",
            b"{\"model\":\"ab\xc3\"}",
            b"{\"model\":\"\\n\xc3\xa9\xc3\"}",
            b"{\"model\":\"\xc3\\n\xa9\"}",
            b"{\"model\":\"\xed\xa0\x80\"}",
            b"{\"model\":\"\xf4\x90\x80\x80\"}",
            b"{\"response_format\":{\"type\":\"\xff\"}}",
            b"{\"response_format\":{\"\xff\":1}}",
            b"{\"usage\":{\"\xff\":1}}",
            b"{\"x\":1}\xff",
            b"\xff{}",
            // Raw UTF-8 is fine everywhere.
            "{\"model\":\"h\u{e9}llo \u{1f600}\",\"\u{e9}\":\"\u{e9}\"}".as_bytes(),
            // Lone and broken surrogate escapes: fine when ignored.
            b"{\"x\":\"\\ud800\"}",
            b"{\"x\":\"\\udc00\"}",
            b"{\"x\":{\"\\ud800\":1}}",
            b"{\"\\ud800\":1}",
            b"{\"\\udc00\":1}",
            b"{\"model\":\"\\ud800\"}",
            b"{\"model\":\"\\ud800x\"}",
            b"{\"model\":\"\\ud800\\n\"}",
            b"{\"model\":\"\\ud800\\u0041\"}",
            b"{\"model\":\"\\ud800\\ud800\"}",
            b"{\"model\":\"\\udc00\"}",
            b"{\"model\":\"\\ud83d\\ude00\"}",
            b"{\"model\":\"\\uD83D\\uDE00\"}",
            b"{\"model\":\"\\ud800",
            b"{\"model\":\"\\ud800\\",
            b"{\"model\":\"\\ud800\\u",
            b"{\"model\":\"\\ud800\\udc0",
            b"{\"model\":\"\\u0000\"}",
            b"{\"model\":\"\\uffff\"}",
        ] {
            check(body);
        }
    }

    #[test]
    fn multiline_positions() {
        for body in [
            "{\n\"a\":1,\n\"model\":5\n}",
            "{\n\"a\":1,\n\"model\":\"x\",\r\n\"model\" \n:1}",
            "{\n\n\"x\":[1,\n2,\n]\n}",
            "\n\n",
            "{\"model\":\"a\"\n}\n\nx",
        ] {
            check(body.as_bytes());
        }
    }

    #[test]
    fn deep_nesting_in_ignored_values() {
        // serde_json skips ignored values without a depth limit.
        for depth in [63, 64, 65, 127, 128, 129, 200, 100_000] {
            let arrays = format!("{{\"x\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
            check(arrays.as_bytes());
            let objects = format!(
                "{{\"x\":{}1{}}}",
                "{\"a\":".repeat(depth),
                "}".repeat(depth)
            );
            check(objects.as_bytes());
            let mixed = format!(
                "{{\"x\":{}{}, \"model\":\"m\"}}",
                "[{\"a\":".repeat(depth),
                "null}]".repeat(depth)
            );
            check(mixed.as_bytes());
            // Unbalanced at depth.
            check(format!("{{\"x\":{}{}}}", "[".repeat(depth), "]".repeat(depth - 1)).as_bytes());
            check(format!("{{\"x\":{}", "[{\"a\":".repeat(depth)).as_bytes());
            check(format!("{{\"x\":{}}}]", "[".repeat(depth)).as_bytes());
        }
    }

    #[test]
    fn top_level_array_is_refused() {
        for body in ["[]", " [\"m\", true]", "[1,2]"] {
            let e = peek_request(body.as_bytes()).expect_err("an array");
            assert!(e.to_string().contains("expected a JSON object"), "{e}");
            let e = peek_answer(body.as_bytes()).expect_err("an array");
            assert!(e.to_string().contains("expected a JSON object"), "{e}");
        }
        // serde_json would take it (this is the one documented difference).
        assert!(serde_json::from_slice::<reference::BodyPeek<'_>>(b"[\"m\",true]").is_ok());
        let e = peek_request(b"\"s\"").expect_err("a string");
        assert_eq!(
            e.to_string(),
            "invalid type: string \"s\", expected a JSON object at line 1 column 3"
        );
    }

    #[test]
    fn model_is_borrowed_without_escapes() {
        let r = peek_request(br#"{"model":"plain"}"#).expect("ok");
        assert!(matches!(r.model, Some(Cow::Borrowed("plain"))));
        let r = peek_request(br#"{"model":"a\u0062"}"#).expect("ok");
        assert!(matches!(r.model, Some(Cow::Owned(ref m)) if m == "ab"));
        let r = peek_request(br#"{"response_format":{"type":"json_object"}}"#).expect("ok");
        assert!(matches!(
            r.response_format,
            Some(ResponseFormatPeek {
                kind: Cow::Borrowed("json_object")
            })
        ));
    }

    #[test]
    fn string_stop_finds_the_first_stop_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        for len in 0..40 {
            for stop in [b'"', b'\\', 0x00, 0x1f, b' '] {
                for at in 0..len {
                    let mut b: Vec<u8> = (0..len).map(|k| b'a' + (k % 26) as u8).collect();
                    b[at] = stop;
                    let expected = if stop == b' ' { len } else { at };
                    assert_eq!(string_stop::<false>(&b, 0), expected, "{b:?}");
                    // With stop bytes after it too.
                    b.push(b'"');
                    b.extend_from_slice(&bytes);
                    let expected = if stop == b' ' { len } else { at };
                    assert_eq!(string_stop::<false>(&b, 0), expected, "{b:?}");
                }
            }
        }
        // High bytes are content, not stops, unless asked for.
        let b: Vec<u8> = (0x80..=0xff).chain([b'"']).collect();
        assert_eq!(string_stop::<false>(&b, 0), 128);
        for at in 0..40 {
            let mut b = vec![b'a'; 40];
            b[at] = 0xc3;
            assert_eq!(string_stop::<true>(&b, 0), at);
            assert_eq!(string_stop::<false>(&b, 0), 40);
        }
    }

    #[test]
    fn string_stop_from_any_start_and_near_the_end() {
        fn naive(b: &[u8], mut i: usize, non_ascii: bool) -> usize {
            while let Some(&c) = b.get(i) {
                if c == b'"' || c == b'\\' || c < 0x20 || (non_ascii && c > 0x7f) {
                    break;
                }
                i += 1;
            }
            i
        }
        // Bodies of every length up to 24 with a stop (or none) anywhere,
        // scanned from every start: the last seven bytes are read shifted
        // out of the last eight, bodies under eight bytes a byte at a time.
        for len in 0..24 {
            for stop in [None, Some(b'"'), Some(b'\\'), Some(0x1f), Some(0xe9)] {
                for at in 0..len.max(1) {
                    let mut b: Vec<u8> = (0..len).map(|k| b'a' + (k % 26) as u8).collect();
                    if let (Some(stop), true) = (stop, at < len) {
                        b[at] = stop;
                    }
                    for i in 0..=len {
                        assert_eq!(
                            string_stop::<false>(&b, i),
                            naive(&b, i, false),
                            "{b:?} {i}"
                        );
                        assert_eq!(string_stop::<true>(&b, i), naive(&b, i, true), "{b:?} {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn skip_digits_stops_at_the_first_non_digit() {
        fn naive(b: &[u8], mut i: usize) -> usize {
            while let Some(b'0'..=b'9') = b.get(i) {
                i += 1;
            }
            i
        }
        // Every byte value after runs of digits of every length, with more
        // digits after it.
        for digits in 0..20 {
            for other in 0..=255u8 {
                let mut b: Vec<u8> = (0..digits).map(|k| b'0' + (k % 10) as u8).collect();
                b.push(other);
                b.extend_from_slice(b"123456789");
                for i in 0..b.len() {
                    assert_eq!(skip_digits(&b, i), naive(&b, i), "{b:?} {i}");
                }
            }
        }
    }

    #[test]
    fn utf8_agrees_with_the_standard_library() {
        let pieces: [&[u8]; 8] = [
            b"abc",
            "\u{e9}".as_bytes(),
            "\u{20ac}".as_bytes(),
            "\u{1f600}".as_bytes(),
            b"\xff",
            b"\xc3",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
        ];
        for len in 0..40 {
            for (k, piece) in pieces.iter().enumerate() {
                for at in [0, len / 2, len] {
                    let mut s = vec![b'x'; len];
                    s.splice(at..at, piece.iter().copied());
                    assert_eq!(utf8(&s), std::str::from_utf8(&s).ok(), "{k} {s:?}");
                }
            }
        }
        // Borrowed, even when empty.
        let body = b"x";
        assert_eq!(utf8(&body[1..]).map(str::as_ptr), Some(body[1..].as_ptr()));
    }

    /// Errors in skipped values at every kind of place: the fast skipper
    /// gives up on them and the exact one must find serde_json's error,
    /// whatever the fast one read after it gave up.
    #[test]
    fn errors_inside_skipped_values() {
        let values = [
            // Strings: escapes and control characters before, across and
            // after the eight-byte steps, and in the body's last bytes.
            r#""a\nb""#,
            r#""abcdefg\"h""#,
            r#""abcdefgh\u0041""#,
            r#""abcdefghijklmno\/p""#,
            "\"abc\u{1}def\"",
            "\"abcdefghij\u{1f}\"",
            r#""abc\x""#,
            r#""abcdefghijk\u12G4""#,
            r#""abc\u12""#,
            r#""abc"#,
            r#""abcdefghijklmnopq"#,
            // Numbers: long digit runs, then whatever follows.
            "12345678901234567890123",
            "1234567890123456789.5e-7",
            "123456789012.",
            "12345678901234e",
            "12345678901234e+",
            "-",
            "-0123",
            "0.1234567890123456789E+123456789012",
            // Literals.
            "nul",
            "nulx",
            "tru",
            "fals",
            "falsey",
            // Nesting: keys, colons and commas, compact and not.
            r#"{"a":1,"b":[1,2,{"c":"d"}],"e":{}}"#,
            r#"{"a" : 1 , "b" : [ 1 , 2 , { "c" : "d" } ] }"#,
            r#"{"a":1,"b"}"#,
            r#"{"a":1,"b" 2}"#,
            r#"{"a":1,}"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a\"b":1,"c\u0041":"d\n"}"#,
            r#"{"a":"b\x"}"#,
            r#"[1,2,]"#,
            r#"[1 2]"#,
            r#"[{"a":[{"b":[{"c":tru}]}]}]"#,
            r#"[{"a":[{"b":[{"c":"\u00"}]}]}]"#,
            r#"[[[[[[[[[[]]]]]]]]]]"#,
            r#"[[[[[[[[[[]]]]]]]]]"#,
            r#"{"a":{"b":{"c":{}}}}}"#,
            r#"{"a":[}"#,
            r#"{"a":{]}"#,
            "[\n1,\n\"x\u{0}\"\n]",
        ];
        for value in values {
            for body in [
                format!(r#"{{"x":{value}}}"#),
                format!(r#"{{"x":{value},"model":"m"}}"#),
                format!(r#"{{"model":"m", "x" : {value} , "usage":{{"y":{value}}}}}"#),
                format!(r#"{{"usage":{{"prompt_tokens":1,"x":{value}}},"id":"abcdefghijklmnop"}}"#),
            ] {
                check(body.as_bytes());
            }
        }
    }

    /// Time per call on the bench bodies, against serde_json. Meaningful in
    /// release builds only:
    /// `cargo test --release -p router-proxy json_peek -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn speed_against_serde() {
        use std::hint::black_box;
        fn ns_per_call<T>(f: impl Fn() -> T) -> f64 {
            const CALLS: u32 = 200_000;
            (0..3)
                .map(|_| {
                    #[allow(clippy::disallowed_types)] // a wall-clock micro-benchmark
                    let start = std::time::Instant::now();
                    for _ in 0..CALLS {
                        black_box(f());
                    }
                    start.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS)
                })
                .fold(f64::INFINITY, f64::min)
        }
        let answer = BENCH_ANSWER.as_bytes();
        let rows = [
            (
                "request",
                ns_per_call(|| {
                    serde_json::from_slice::<reference::BodyPeek<'_>>(black_box(BENCH_REQUEST))
                }),
                ns_per_call(|| peek_request(black_box(BENCH_REQUEST))),
            ),
            (
                "answer",
                ns_per_call(|| serde_json::from_slice::<reference::AnswerPeek>(black_box(answer))),
                ns_per_call(|| peek_answer(black_box(answer))),
            ),
        ];
        for (body, serde, ours) in rows {
            println!(
                "{body}: serde_json {serde:.0} ns, json_peek {ours:.0} ns ({:.1}x)",
                serde / ours
            );
        }
    }

    /// Calls for [`callgrind_loop`]: instructions per call are the
    /// profile's total over this many.
    const CALLGRIND_CALLS: u32 = 10_000;

    /// A loop for callgrind, to count instructions per call on the bench
    /// bodies (`JSON_PEEK_BODY=request` for the request, else the answer):
    /// `cargo test --release -p router-proxy --lib --no-run`, then
    /// `JSON_PEEK_BODY=request valgrind --tool=callgrind
    /// --toggle-collect=router_proxy::json_peek::peek_request <test binary>
    /// --ignored --exact json_peek::tests::callgrind_loop` (or `peek_answer`
    /// and no `JSON_PEEK_BODY`), and divide the total by
    /// [`CALLGRIND_CALLS`]: the counts of the functions alone, as a profile
    /// of the proxy has them.
    #[test]
    #[ignore]
    fn callgrind_loop() {
        use std::hint::black_box;
        #[inline(never)]
        fn answer_calls(b: &[u8]) {
            for _ in 0..CALLGRIND_CALLS {
                drop(black_box(peek_answer(black_box(b))));
            }
        }
        #[inline(never)]
        fn request_calls(b: &[u8]) {
            for _ in 0..CALLGRIND_CALLS {
                drop(black_box(peek_request(black_box(b))));
            }
        }
        if std::env::var("JSON_PEEK_BODY").as_deref() == Ok("request") {
            request_calls(BENCH_REQUEST);
        } else {
            answer_calls(BENCH_ANSWER.as_bytes());
        }
    }

    // ---- property tests ----

    /// A JSON value to print, with room for invalid bits (the string and
    /// number texts are raw).
    #[derive(Debug, Clone)]
    enum Json {
        Null,
        Bool(bool),
        Number(String),
        /// The bytes between the quotes.
        Str(Vec<u8>),
        Array(Vec<Json>),
        Object(Vec<(Vec<u8>, Json)>),
    }

    impl Json {
        /// Prints with whitespace chosen by `seed`.
        fn print(&self, seed: u64) -> Vec<u8> {
            let mut out = Vec::new();
            let mut rng = seed | 1;
            self.write(&mut out, &mut rng);
            out
        }

        fn write(&self, out: &mut Vec<u8>, rng: &mut u64) {
            fn ws(out: &mut Vec<u8>, rng: &mut u64) {
                // xorshift64
                *rng ^= *rng << 13;
                *rng ^= *rng >> 7;
                *rng ^= *rng << 17;
                let pick = *rng % 16;
                out.extend_from_slice(match pick {
                    0 => b" ",
                    1 => b"\n  ",
                    2 => b"\t",
                    3 => b"\r\n",
                    _ => b"",
                });
            }
            ws(out, rng);
            match self {
                Json::Null => out.extend_from_slice(b"null"),
                Json::Bool(true) => out.extend_from_slice(b"true"),
                Json::Bool(false) => out.extend_from_slice(b"false"),
                Json::Number(n) => out.extend_from_slice(n.as_bytes()),
                Json::Str(s) => {
                    out.push(b'"');
                    out.extend_from_slice(s);
                    out.push(b'"');
                }
                Json::Array(items) => {
                    out.push(b'[');
                    for (k, item) in items.iter().enumerate() {
                        if k > 0 {
                            out.push(b',');
                        }
                        item.write(out, rng);
                    }
                    ws(out, rng);
                    out.push(b']');
                }
                Json::Object(members) => {
                    out.push(b'{');
                    for (k, (key, value)) in members.iter().enumerate() {
                        if k > 0 {
                            out.push(b',');
                        }
                        ws(out, rng);
                        out.push(b'"');
                        out.extend_from_slice(key);
                        out.push(b'"');
                        ws(out, rng);
                        out.push(b':');
                        value.write(out, rng);
                    }
                    ws(out, rng);
                    out.push(b'}');
                }
            }
            ws(out, rng);
        }
    }

    /// String contents: plain text, escapes of every kind, raw UTF-8 and,
    /// now and then, invalid UTF-8 or lone surrogates.
    fn string_content() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            8 => prop::collection::vec(
                prop::sample::select(b"abcxyzABCXYZ0189 _.-".to_vec()),
                1..7
            ),
            2 => prop::sample::select(vec![
                r#"\""#, r"\\", r"\/", r"\b", r"\f", r"\n", r"\r", r"\t",
                r"\u0041", r"\u00e9", r"\u20AC", r"\ud83d\ude00", r"\uD83D\uDE00",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            1 => prop::sample::select(vec!["\u{e9}", "\u{20ac}", "\u{1f600}", "\u{7f}"])
                .prop_map(|s| s.as_bytes().to_vec()),
            1 => prop::sample::select(vec![
                &b"\xff"[..], b"\xc3", b"\xed\xa0\x80", b"\\ud800", b"\\udc00",
                b"\\ud800\\u0041", b"\t", b"\\x", b"\\u12",
            ])
            .prop_map(<[u8]>::to_vec),
        ];
        prop::collection::vec(piece, 0..4).prop_map(|pieces| pieces.concat())
    }

    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => (0u64..100_000).prop_map(|n| n.to_string()),
            1 => any::<u64>().prop_map(|n| n.to_string()),
            1 => any::<i64>().prop_map(|n| n.to_string()),
            // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
            2 => (
                any::<bool>(),
                prop_oneof![Just(0u128), 1..u128::from(u64::MAX) * 1000],
                prop::option::of(0u16..10_000),
                prop::option::of((prop::sample::select(vec!["e", "E", "e+", "e-", "E-"]), 0u16..1000)),
            )
                .prop_map(|(minus, int, frac, exp)| {
                    let mut n = format!("{}{int}", if minus { "-" } else { "" });
                    if let Some(frac) = frac {
                        n += &format!(".{frac:04}");
                    }
                    if let Some((e, exp)) = exp {
                        n += &format!("{e}{exp}");
                    }
                    n
                }),
            1 => prop::sample::select(vec![
                "-0", "0.0", "1e2", "18446744073709551615", "18446744073709551616",
                "-9223372036854775808", "-9223372036854775809", "1e400", "01", "1.",
                "-", "+1", ".5", "1e", "0x10",
            ])
            .prop_map(String::from),
        ]
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        let known = prop::sample::select(vec![
            "model",
            "stream",
            "max_tokens",
            "max_completion_tokens",
            "max_output_tokens",
            "response_format",
            "type",
            "usage",
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "messages",
            "id",
        ]);
        prop_oneof![
            3 => known.clone().prop_map(|k| k.as_bytes().to_vec()),
            // A known key with one letter escaped.
            1 => (known, any::<prop::sample::Index>()).prop_map(|(k, at)| {
                let at = at.index(k.len());
                format!("{}\\u{:04x}{}", &k[..at], k.as_bytes()[at], &k[at + 1..]).into_bytes()
            }),
            2 => string_content(),
        ]
    }

    fn leaf() -> BoxedStrategy<Json> {
        prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            number().prop_map(Json::Number),
            string_content().prop_map(Json::Str),
        ]
        .boxed()
    }

    fn tokens() -> impl Strategy<Value = Json> {
        prop_oneof![
            4 => (0u64..100_000).prop_map(|n| Json::Number(n.to_string())),
            1 => Just(Json::Null),
            1 => number().prop_map(Json::Number),
        ]
    }

    /// A known key with a value of (mostly) its type.
    fn known_member() -> BoxedStrategy<(Vec<u8>, Json)> {
        let named = |name: &str, v: BoxedStrategy<Json>| (Just(name.as_bytes().to_vec()), v);
        let text = || string_content().prop_map(Json::Str).boxed();
        let usage = prop_oneof![
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "prompt_tokens",
                        "completion_tokens",
                        "input_tokens",
                        "output_tokens",
                        "total_tokens",
                    ])
                    .prop_map(|k| k.as_bytes().to_vec()),
                    tokens(),
                ),
                0..5,
            )
            .prop_map(Json::Object),
            prop::collection::vec(tokens(), 0..6).prop_map(Json::Array),
        ];
        let format = prop_oneof![
            3 => prop::sample::select(vec!["json_object", "json_schema", "text"])
                .prop_map(|t| Json::Object(vec![(b"type".to_vec(), Json::Str(t.into()))])),
            1 => (text(), prop::collection::vec((key(), leaf()), 0..3)).prop_map(|(t, mut rest)| {
                rest.push((b"type".to_vec(), t));
                rest.rotate_right(1);
                Json::Object(rest)
            }),
            1 => prop::collection::vec(text(), 0..3).prop_map(Json::Array),
        ];
        prop_oneof![
            2 => named("model", prop_oneof![4 => text(), 1 => leaf()].boxed()),
            1 => named("stream", prop_oneof![any::<bool>().prop_map(Json::Bool), leaf()].boxed()),
            1 => named("max_tokens", tokens().boxed()),
            1 => named("max_completion_tokens", tokens().boxed()),
            1 => named("max_output_tokens", tokens().boxed()),
            1 => named("response_format", prop_oneof![4 => format, 1 => leaf()].boxed()),
            1 => named("usage", prop_oneof![4 => usage, 1 => leaf()].boxed()),
        ]
        .boxed()
    }

    /// Documents: mostly objects whose members (at every level) often have
    /// known keys. The strategies are built once: proptest rebuilds the
    /// recursive part for every case.
    fn document() -> impl Strategy<Value = Json> {
        let known = known_member();
        let key = key().boxed();
        let member = move |inner: BoxedStrategy<Json>| prop_oneof![7 => known.clone(), 5 => (key.clone(), inner)];
        let value = {
            let member = member.clone();
            leaf().prop_recursive(4, 40, 5, move |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
                    prop::collection::vec(member(inner), 0..5).prop_map(Json::Object),
                ]
            })
        }
        .boxed();
        prop_oneof![
            12 => prop::collection::vec(member(value.clone()), 0..7).prop_map(Json::Object),
            1 => value,
        ]
    }

    /// Realistic bodies to mutate besides generated ones.
    fn seed_body() -> impl Strategy<Value = Vec<u8>> {
        prop::sample::select(vec![
            BENCH_REQUEST.to_vec(),
            BENCH_ANSWER.as_bytes().to_vec(),
            br#"{
  "model": "gpt-4o-mini",
  "stream": false,
  "max_completion_tokens": 256,
  "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "number", "minimum": -1.5e3}}}}},
  "messages": [{"role": "system", "content": "Be \"brief\".\n\u00e9\ud83d\ude00"}, {"role": "user", "content": "hi"}],
  "temperature": 0.2, "tools": [], "user": null
}"#
            .to_vec(),
            br#"{"id":"resp_1","model":"m","output":[{"type":"message","content":[{"type":"output_text","text":"ok"}]}],"usage":{"input_tokens":5,"output_tokens":7,"total_tokens":12}}"#.to_vec(),
        ])
    }

    #[derive(Debug, Clone)]
    enum Mutation {
        Insert(prop::sample::Index, u8),
        Delete(prop::sample::Index),
        Replace(prop::sample::Index, u8),
        Truncate(prop::sample::Index),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        let byte = prop_oneof![
            4 => prop::sample::select(b"{}[]\":,\\ 0123456789-+.eEtrufalsn\n\t/u".to_vec()),
            1 => any::<u8>(),
        ];
        let at = any::<prop::sample::Index>;
        prop_oneof![
            3 => (at(), byte.clone()).prop_map(|(a, b)| Mutation::Insert(a, b)),
            3 => at().prop_map(Mutation::Delete),
            3 => (at(), byte).prop_map(|(a, b)| Mutation::Replace(a, b)),
            1 => at().prop_map(Mutation::Truncate),
        ]
    }

    fn mutate(mut b: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
        for m in mutations {
            match m {
                Mutation::Insert(at, c) => b.insert(at.index(b.len() + 1), *c),
                Mutation::Delete(at) if !b.is_empty() => {
                    b.remove(at.index(b.len()));
                }
                Mutation::Replace(at, c) if !b.is_empty() => {
                    let at = at.index(b.len());
                    b[at] = *c;
                }
                Mutation::Truncate(at) => b.truncate(at.index(b.len() + 1)),
                _ => {}
            }
        }
        b
    }

    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            failure_persistence: None,
            // ChaCha, the default, is most of the time in debug builds.
            rng_algorithm: prop::test_runner::RngAlgorithm::XorShift,
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(config(20_000))]

        #[test]
        fn generated_documents_match_serde(doc in document(), seed in any::<u64>()) {
            check(&doc.print(seed));
        }
    }

    proptest! {
        #![proptest_config(config(20_000))]

        #[test]
        fn mutated_documents_match_serde(
            doc in prop_oneof![1 => seed_body(), 2 => (document(), any::<u64>()).prop_map(|(d, s)| d.print(s))],
            mutations in prop::collection::vec(mutation(), 1..4),
        ) {
            check(&mutate(doc, &mutations));
        }
    }
}
