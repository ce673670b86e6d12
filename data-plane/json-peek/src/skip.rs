//! Skipping the values the router does not read: their syntax is checked
//! as serde_json's `ignore_value` checks it, but nothing is built.
//!
//! The skipper works on `(bytes, index)` pairs, not on the `Parser`, so that
//! its state stays in registers; it returns the index after what it skipped.

use crate::error::{error_at, Code, PeekError};
use crate::scan::{skip_digits, stops, string_stop, string_stop_tail};

/// A syntax error found while skipping: `at` is the index serde_json
/// reports (the byte last read, or the one about to be read, per error).
pub(crate) struct Fail {
    at: usize,
    code: Code,
}

impl Fail {
    #[cold]
    pub(crate) fn error(self, b: &[u8]) -> PeekError {
        error_at(b, self.at, self.code)
    }
}

pub(crate) type Skip = std::result::Result<usize, Fail>;

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
pub(crate) fn skip_value(b: &[u8], i: usize) -> Skip {
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
