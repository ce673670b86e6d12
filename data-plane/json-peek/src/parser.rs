//! The byte cursor that [`peek_request`](crate::peek_request) and
//! [`peek_answer`](crate::peek_answer) walk a body with: objects and arrays
//! of fields, the values the router reads (decoded), the ones it does not
//! (handed to [`skip`](crate::skip)), and the errors, placed where
//! serde_json places them.

use std::borrow::Cow;

use crate::error::{error_at, invalid, message_at, Code, Invalid, PeekError, Result};
use crate::scan::{hex_value, string_stop, utf8};
use crate::skip::skip_value;

/// Where [`Parser::next_field`] is in an object.
pub(crate) struct Members {
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
pub(crate) use or_null;

/// A cursor over the body. Its methods mirror serde_json's deserializer
/// step for step (including which byte an error points at), minus the
/// generic plumbing.
///
/// The hot methods are inlined into [`peek_request`](crate::peek_request)
/// and [`peek_answer`](crate::peek_answer),
/// and the cold ones take the cursor by value, so that it never has an
/// address and stays in registers.
#[derive(Clone, Copy)]
pub(crate) struct Parser<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) i: usize,
}

impl<'a> Parser<'a> {
    // ---- objects and arrays of fields ----

    /// The opening `{` of the body.
    #[inline(always)]
    pub(crate) fn top_level_object(&mut self) -> Result<()> {
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
    pub(crate) fn nested(&mut self, expecting: &str) -> Result<bool> {
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
    pub(crate) fn next_field(
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
    pub(crate) fn array_fields(
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
    pub(crate) fn end(&mut self) -> Result<()> {
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
    pub(crate) fn null(&mut self) -> Result<bool> {
        if self.ws() == Some(b'n') {
            self.i += 1;
            self.ident(b"ull")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    #[inline(always)]
    pub(crate) fn string(&mut self) -> Result<Cow<'a, str>> {
        match self.eat_after_ws(b'"') {
            Ok(()) => self.string_body(),
            Err(None) => Err(self.peek_error(Code::EofWhileParsingValue)),
            Err(Some(_)) => Err(self.invalid_type("a string")),
        }
    }

    #[inline(always)]
    pub(crate) fn boolean(&mut self) -> Result<bool> {
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
    pub(crate) fn unsigned(&mut self) -> Result<u64> {
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
        self.error(Code::InvalidUnicodeCodePoint)
            .back(s.len() - valid)
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
