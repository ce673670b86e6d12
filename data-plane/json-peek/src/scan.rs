//! Word-at-a-time scans over the body: where plain string content stops,
//! where a run of digits stops (eight bytes per step, with the usual
//! "has a zero byte" bit tricks), and the UTF-8 check of the short strings
//! the router decodes.

/// The index of the first `"`, `\` or control character (and, if
/// `NON_ASCII`, byte above 0x7F) in `b` at or after `i`, or `b.len()`:
/// where plain string content stops. Eight bytes at a time.
#[inline(always)]
pub(crate) fn string_stop<const NON_ASCII: bool>(b: &[u8], mut i: usize) -> usize {
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
pub(crate) fn string_stop_tail<const NON_ASCII: bool>(b: &[u8], i: usize) -> usize {
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
pub(crate) fn stops<const NON_ASCII: bool>(x: u64) -> u64 {
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
pub(crate) fn utf8(s: &[u8]) -> Option<&str> {
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

pub(crate) fn hex_value(d: u8) -> Option<u8> {
    match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    }
}

/// The digits from `i` on; eight at a time.
#[inline(always)]
pub(crate) fn skip_digits(b: &[u8], mut i: usize) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
