//! The request path, normalized once before anything matches on it.
//!
//! Every decision the router makes from the path (the route, a tenant's
//! allowed routes, whether the body is read for its `model`, the pool's
//! model rewrite and key, the usage read from the answer) must be made on
//! the path the backend will act on. Backends decode the path before they
//! route it, so a raw match is a way around the router: `POST
//! /v1/chat/completion%73` was not one of the router's JSON paths, but the
//! backend served it as `/v1/chat/completions`, with the client's own
//! `model` and the operator's key. So the path is normalized as RFC 3986
//! (section 6.2.2) says, and the normalized path is both matched and
//! forwarded:
//!
//! 1. **Percent-encodings**: an encoded unreserved character (`A-Z a-z
//!    0-9 - . _ ~`) is decoded; any other keeps its encoding, with its hex
//!    digits in upper case.
//! 2. **Dot segments** (`.`, `..`, also when they were encoded) are
//!    removed, and **empty segments** (`//`) and a **trailing slash**
//!    dropped, as the web frameworks that serve model APIs either do
//!    themselves or redirect to.
//!
//! What cannot be normalized without guessing how a backend reads it is
//! refused: an escape that is not `%` and two hex digits, an encoded path
//! separator (`%2F`, `%5C`: some servers split on them after decoding,
//! some do not), and an encoded control character.
//!
//! A path that needs none of this (the common case) is returned borrowed,
//! after one pass over its bytes.

use std::borrow::Cow;
use std::fmt;

/// Why a path cannot be normalized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathRefusal {
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// `%2F` or `%5C`: an encoded `/` or `\`.
    EncodedSeparator,
    /// An encoded control character (`%00`-`%1F`, `%7F`).
    EncodedControl,
}

impl fmt::Display for PathRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BadEscape => "the request path has a % that is not followed by two hex digits",
            Self::EncodedSeparator => {
                "the request path has an encoded / or \\ (%2F, %5C), which the router refuses"
            }
            Self::EncodedControl => "the request path has an encoded control character",
        })
    }
}

/// `path` normalized (see the module docs); borrowed when it already is.
/// A path that does not start with `/` (`*`) is left as it is.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathRefusal> {
    if !path.starts_with('/') || is_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path.as_bytes())?;
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// Whether `path` (starting with `/`) needs nothing done: no `%`, no empty
/// or dot segment, no trailing slash.
fn is_normal(path: &[u8]) -> bool {
    if path.len() > 1 && path.ends_with(b"/") {
        return false;
    }
    if path.contains(&b'%') {
        return false;
    }
    // Every segment (after its `/`) non-empty and not `.` or `..`.
    path.split(|b| *b == b'/')
        .skip(1)
        .all(|s| !matches!(s, b"." | b".."))
        && !path.windows(2).any(|w| w == b"//")
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes encoded unreserved characters, upper-cases the hex of the
/// encodings kept, refuses what [`PathRefusal`] lists.
fn decode_unreserved(path: &[u8]) -> Result<String, PathRefusal> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b != b'%' {
            // A URI's path is ASCII (hyper refuses anything else); a byte
            // that is not is kept encoded rather than trusted.
            if b.is_ascii() {
                out.push(char::from(b));
            } else {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 15)]));
            }
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            path.get(i + 1).copied().and_then(hex),
            path.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(PathRefusal::BadEscape);
        };
        let v = hi * 16 + lo;
        if v == b'/' || v == b'\\' {
            return Err(PathRefusal::EncodedSeparator);
        }
        if v < 0x20 || v == 0x7f {
            return Err(PathRefusal::EncodedControl);
        }
        if is_unreserved(v) {
            out.push(char::from(v));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(hi)]));
            out.push(char::from(HEX[usize::from(lo)]));
        }
        i += 3;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn n(p: &str) -> Result<String, PathRefusal> {
        normalize(p).map(Cow::into_owned)
    }

    #[test]
    fn encoded_unreserved_characters_are_decoded() {
        let chat = Ok("/v1/chat/completions".to_string());
        assert_eq!(n("/v1/chat/completion%73"), chat);
        assert_eq!(n("/v1/%63hat/completions"), chat);
        assert_eq!(n("/%76%31/%63%68%61%74/completions"), chat);
        assert_eq!(
            n("/v1/chat/completion%7E"),
            Ok("/v1/chat/completion~".into())
        );
        // Reserved ones keep their encoding, in upper case.
        assert_eq!(n("/a%3ab"), Ok("/a%3Ab".into()));
        assert_eq!(n("/a%20b"), Ok("/a%20b".into()));
        // Decoded once: `%25` is a `%`, kept encoded.
        assert_eq!(
            n("/v1/chat/completion%2573"),
            Ok("/v1/chat/completion%2573".into())
        );
    }

    #[test]
    fn dot_and_empty_segments_and_a_trailing_slash_go() {
        let chat = Ok("/v1/chat/completions".to_string());
        assert_eq!(n("/v1/x/../chat/completions"), chat);
        assert_eq!(n("/v1/./chat/completions"), chat);
        assert_eq!(n("//v1//chat///completions"), chat);
        assert_eq!(n("/v1/chat/completions/"), chat);
        assert_eq!(n("/v1/x/%2e%2E/chat/completions"), chat);
        assert_eq!(n("/v1/x/%2e/../chat/completions"), chat);
        assert_eq!(n("/../../v1/chat/completions"), chat);
        assert_eq!(n("/.."), Ok("/".into()));
        assert_eq!(n("//"), Ok("/".into()));
        // Dots inside a segment are a name, not a segment.
        assert_eq!(n("/v1/a..b"), Ok("/v1/a..b".into()));
    }

    #[test]
    fn a_normal_path_is_borrowed() {
        for p in [
            "/",
            "/v1/chat/completions",
            "/api/generate",
            "/v1/a..b",
            "*",
        ] {
            assert!(matches!(normalize(p), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn what_cannot_be_normalized_is_refused() {
        for (p, why) in [
            ("/v1/chat%2Fcompletions", PathRefusal::EncodedSeparator),
            ("/v1/chat%2fcompletions", PathRefusal::EncodedSeparator),
            ("/v1%5Cchat/completions", PathRefusal::EncodedSeparator),
            ("/v1/chat/completions%00", PathRefusal::EncodedControl),
            ("/v1/chat/completions%0a", PathRefusal::EncodedControl),
            ("/v1/chat/completions%", PathRefusal::BadEscape),
            ("/v1/chat/completions%7", PathRefusal::BadEscape),
            ("/v1/chat/completions%zz", PathRefusal::BadEscape),
        ] {
            assert_eq!(n(p), Err(why), "{p}");
        }
    }

    proptest! {
        /// Normalizing twice changes nothing; the result has no dot or
        /// empty segment, no encoded unreserved character, no lower-case
        /// hex, and starts with `/`.
        #[test]
        fn normalized_paths_are_normal(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("".to_string()), Just(".".to_string()), Just("..".to_string()),
                    Just("%2e".to_string()), Just("%2E%2e".to_string()),
                    "[a-z0-9._~-]{1,6}",
                    "(%[0-9a-fA-F]{2}|[a-z]){1,4}",
                ],
                0..8,
            ),
            trailing in any::<bool>(),
        ) {
            let mut path = String::new();
            for p in &parts {
                path.push('/');
                path.push_str(p);
            }
            if trailing || path.is_empty() {
                path.push('/');
            }
            match normalize(&path) {
                Err(_) => {}
                Ok(once) => {
                    let again = normalize(&once).map(Cow::into_owned);
                    prop_assert_eq!(again.as_deref(), Ok(&*once));
                    prop_assert!(once.starts_with('/'));
                    prop_assert!(is_normal(once.as_bytes()) || once.contains('%'));
                    let bytes = once.as_bytes();
                    for (i, b) in bytes.iter().enumerate() {
                        if *b == b'%' {
                            let h = &bytes[i + 1..i + 3];
                            prop_assert!(h.iter().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
                            let v = u8::from_str_radix(std::str::from_utf8(h).unwrap_or("00"), 16).unwrap_or(0);
                            prop_assert!(!is_unreserved(v), "{} kept encoded", once);
                        }
                    }
                    for s in once.split('/').skip(1) {
                        prop_assert!(!matches!(s, "." | ".."), "{}", once);
                        prop_assert!(!s.is_empty() || once == "/", "{}", once);
                    }
                }
            }
        }
    }
}
