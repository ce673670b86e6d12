//! The rate-limit headers of an answer, read into a [`Reading`].
//!
//! | provider | header | value |
//! |---|---|---|
//! | OpenAI, Azure OpenAI | `x-ratelimit-remaining-requests` | requests left |
//! | | `x-ratelimit-remaining-tokens` | tokens left |
//! | | `x-ratelimit-reset-requests` | time to the reset, a Go duration: `1s`, `6m0s`, `20ms`, `1h2m3.5s` |
//! | | `x-ratelimit-reset-tokens` | the same, for tokens |
//! | Anthropic | `anthropic-ratelimit-requests-remaining` | requests left |
//! | | `anthropic-ratelimit-tokens-remaining` | tokens left (the most restrictive token limit) |
//! | | `anthropic-ratelimit-input-tokens-remaining` | input tokens left |
//! | | `anthropic-ratelimit-output-tokens-remaining` | output tokens left |
//! | | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset` | the reset instant, RFC 3339 (`2025-01-15T14:24:00Z`) |
//! | any, on a 429 | `retry-after` | seconds to wait (read beside the headers above only: alone it is the circuit breaker's) |
//!
//! A value that does not parse (not a whole number, a negative one, a
//! duration or date that is not one) is ignored as if absent: a reading
//! never fails and never panics. A remaining count without its reset is
//! kept (its reset is then [`super::DEFAULT_RESET`]); a reset without its
//! count says nothing. An RFC 3339 reset in the past is a reset now.
//! The `…-limit` headers are not read: what is left is what decides.

use std::time::Duration;

use http::HeaderMap;

use super::{Limit, Reading, MAX_RESET};

/// Longest header value read (a longer one is ignored).
const MAX_VALUE: usize = 64;

/// Whether `headers` has any provider rate-limit header: one pass over
/// the names (an answer has a dozen), so that an answer without them —
/// a local engine's, most answers — costs no lookup by name.
pub fn has_limits(headers: &HeaderMap) -> bool {
    headers.keys().any(|k| {
        let k = k.as_str();
        k.starts_with("x-ratelimit-") || k.starts_with("anthropic-ratelimit-")
    })
}

/// The limits `headers` report. `rate_limited`: the answer is a 429 (its
/// `retry-after` is read); `now_unix_ms`: the wall clock when it was read
/// (for Anthropic's absolute resets).
pub fn read(headers: &HeaderMap, rate_limited: bool, now_unix_ms: u64) -> Reading {
    if !has_limits(headers) {
        return Reading::default();
    }
    let openai = |count: &str, reset: &str| {
        limit(headers, count, |_| {
            headers.get(reset).and_then(|r| go_duration(text(r)?))
        })
        .map(|mut l| {
            l.reset = l.reset.map(|d| d.min(MAX_RESET));
            l
        })
    };
    let anthropic = |count: &str, reset: &str| {
        limit(headers, count, |_| {
            let at = rfc3339_unix_ms(text(headers.get(reset)?)?)?;
            Some(Duration::from_millis(at.saturating_sub(now_unix_ms)).min(MAX_RESET))
        })
    };
    let mut r = Reading {
        requests: openai(
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ),
        tokens: openai("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
        input_tokens: anthropic(
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
        ),
        output_tokens: anthropic(
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
        ),
        retry_after: None,
    };
    if r.requests.is_none() {
        r.requests = anthropic(
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        );
    }
    if r.tokens.is_none() {
        r.tokens = anthropic(
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
        );
    }
    // With the provider's limits only: a 429's `Retry-After` alone is the
    // circuit breaker's (it opens after `consecutive_errors` of them, for
    // at least that long), as it was before quotas were read.
    if rate_limited && !r.is_empty() {
        r.retry_after = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| text(v)?.parse::<u64>().ok())
            .map(|s| Duration::from_secs(s).min(MAX_RESET));
    }
    r
}

/// A header's value as trimmed text, if it is short and ASCII.
fn text(v: &http::HeaderValue) -> Option<&str> {
    let s = v.to_str().ok()?.trim();
    (s.len() <= MAX_VALUE && !s.is_empty()).then_some(s)
}

/// The count in `name` (a whole number), with the reset `reset` finds.
fn limit(
    headers: &HeaderMap,
    name: &str,
    reset: impl Fn(&http::HeaderValue) -> Option<Duration>,
) -> Option<Limit> {
    let v = headers.get(name)?;
    let remaining = text(v)?.parse::<u64>().ok()?;
    Some(Limit {
        remaining,
        reset: reset(v),
    })
}

/// A Go duration (`6m0s`, `1s`, `20ms`, `1h2m3.5s`, `0`), as OpenAI
/// writes its resets; `None` when it is not one.
pub fn go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let mut rest = s;
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = [
            ("ms", 1e-3),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("ns", 1e-9),
            ("h", 3600.0),
            ("m", 60.0),
            ("s", 1.0),
        ]
        .into_iter()
        .find(|(u, _)| rest.starts_with(u))
        .map(|(u, f)| (f, u.len()))?;
        rest = &rest[len..];
        total += n * unit;
    }
    (total.is_finite() && total >= 0.0)
        .then(|| Duration::from_secs_f64(total.min(MAX_RESET.as_secs_f64())))
}

/// An RFC 3339 date-time (`2025-01-15T14:24:00Z`, `…14:24:00.5+02:00`)
/// as Unix milliseconds; `None` when it is not one (or before 1970).
pub fn rfc3339_unix_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = s.get(from..from + len)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let sep = |at: usize, c: &[u8]| b.get(at).is_some_and(|x| c.contains(x));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut millis = 0i64;
    if b.get(at) == Some(&b'.') {
        let digits = b[at + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        let frac = &s[at + 1..at + 1 + digits.min(3)];
        millis = frac.parse::<i64>().ok()? * 10i64.pow(3 - frac.len() as u32);
        at += 1 + digits;
    }
    let offset_s = match &s[at..] {
        "Z" | "z" => 0,
        tz if tz.len() == 6
            && (tz.starts_with('+') || tz.starts_with('-'))
            && sep(at + 3, b":") =>
        {
            let h = num(at + 1, 2)?;
            let m = num(at + 4, 2)?;
            if h > 23 || m > 59 {
                return None;
            }
            let off = h * 3600 + m * 60;
            if tz.starts_with('-') {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    u64::try_from(secs.checked_mul(1000)?.checked_add(millis)?).ok()
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// 2025-01-15T14:23:00Z.
    const NOW: u64 = 1_736_950_980_000;

    #[test]
    fn openai_headers_as_its_rate_limit_guide_shows_them() {
        // The sample values of OpenAI's "Rate limits in headers" table.
        let h = headers(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        let r = read(&h, false, NOW);
        assert_eq!(
            r.requests,
            Some(Limit {
                remaining: 59,
                reset: Some(Duration::from_secs(1))
            })
        );
        assert_eq!(
            r.tokens,
            Some(Limit {
                remaining: 149_984,
                reset: Some(Duration::from_secs(360))
            })
        );
        assert_eq!(
            (r.input_tokens, r.output_tokens, r.retry_after),
            (None, None, None)
        );
    }

    #[test]
    fn azure_openai_sends_the_same_names_sometimes_without_resets() {
        let h = headers(&[
            ("x-ratelimit-remaining-requests", "7"),
            ("x-ratelimit-remaining-tokens", "7990"),
        ]);
        let r = read(&h, false, NOW);
        assert_eq!(r.requests.map(|l| (l.remaining, l.reset)), Some((7, None)));
        assert_eq!(r.tokens.map(|l| l.remaining), Some(7990));
    }

    #[test]
    fn anthropic_headers_as_its_rate_limit_page_shows_them() {
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "4000"),
            ("anthropic-ratelimit-requests-remaining", "3201"),
            ("anthropic-ratelimit-requests-reset", "2025-01-15T14:24:00Z"),
            ("anthropic-ratelimit-tokens-limit", "400000"),
            ("anthropic-ratelimit-tokens-remaining", "312000"),
            ("anthropic-ratelimit-tokens-reset", "2025-01-15T14:23:15Z"),
            ("anthropic-ratelimit-input-tokens-limit", "300000"),
            ("anthropic-ratelimit-input-tokens-remaining", "250000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2025-01-15T14:23:30.5Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "100000"),
            ("anthropic-ratelimit-output-tokens-remaining", "62000"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2025-01-15T16:23:45+02:00",
            ),
        ]);
        let r = read(&h, false, NOW);
        let at = |l: Option<Limit>| l.map(|l| (l.remaining, l.reset.map(|d| d.as_millis())));
        assert_eq!(at(r.requests), Some((3201, Some(60_000))));
        assert_eq!(at(r.tokens), Some((312_000, Some(15_000))));
        assert_eq!(at(r.input_tokens), Some((250_000, Some(30_500))));
        assert_eq!(at(r.output_tokens), Some((62_000, Some(45_000))));
    }

    #[test]
    fn retry_after_is_read_on_a_429_only() {
        let h = headers(&[
            ("retry-after", "2"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2025-01-15T14:22:00Z"),
        ]);
        let limited = read(&h, true, NOW);
        assert_eq!(limited.retry_after, Some(Duration::from_secs(2)));
        // A reset in the past is a reset now.
        assert_eq!(
            limited.requests,
            Some(Limit {
                remaining: 0,
                reset: Some(Duration::ZERO)
            })
        );
        assert_eq!(read(&h, false, NOW).retry_after, None);
        // Alone (no limits said), it is left to the circuit breaker.
        let alone = headers(&[("retry-after", "2")]);
        assert!(read(&alone, true, NOW).is_empty());
    }

    #[test]
    fn malformed_values_are_ignored() {
        for (name, value) in [
            ("x-ratelimit-remaining-requests", "-1"),
            ("x-ratelimit-remaining-requests", "many"),
            ("x-ratelimit-remaining-requests", "1.5"),
            ("x-ratelimit-remaining-requests", "99999999999999999999999"),
            ("anthropic-ratelimit-tokens-remaining", ""),
            ("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ] {
            let r = read(&headers(&[(name, value)]), true, NOW);
            assert!(r.is_empty(), "{name}: {value}: {r:?}");
        }
        // A malformed reset leaves the count, without its reset.
        for reset in ["soon", "6x", "1s2", "-1s", "s", "1..2s"] {
            let h = headers(&[
                ("x-ratelimit-remaining-requests", "3"),
                ("x-ratelimit-reset-requests", reset),
            ]);
            assert_eq!(
                read(&h, false, NOW).requests,
                Some(Limit {
                    remaining: 3,
                    reset: None
                }),
                "{reset}"
            );
        }
        for reset in [
            "2025-13-01T00:00:00Z",
            "2025-01-15 14:24",
            "yesterday",
            "2025-01-15T14:24:00+2",
        ] {
            let h = headers(&[
                ("anthropic-ratelimit-requests-remaining", "3"),
                ("anthropic-ratelimit-requests-reset", reset),
            ]);
            assert_eq!(
                read(&h, false, NOW).requests.and_then(|l| l.reset),
                None,
                "{reset}"
            );
        }
        assert!(read(&HeaderMap::new(), true, NOW).is_empty());
    }

    #[test]
    fn go_durations() {
        let ms = |s: &str| go_duration(s).map(|d| d.as_millis());
        assert_eq!(ms("6m0s"), Some(360_000));
        assert_eq!(ms("1s"), Some(1000));
        assert_eq!(ms("20ms"), Some(20));
        assert_eq!(ms("1h2m3.5s"), Some(3_723_500));
        assert_eq!(ms("0"), Some(0));
        assert_eq!(ms("59.123s"), Some(59_123));
        assert_eq!(ms("100000h"), Some(MAX_RESET.as_millis()));
        assert_eq!(ms(""), None);
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339_unix_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_unix_ms("2025-01-15T14:23:00Z"), Some(NOW));
        assert_eq!(
            rfc3339_unix_ms("2024-02-29T00:00:00.25Z"),
            Some(1_709_164_800_250)
        );
        assert_eq!(rfc3339_unix_ms("1969-12-31T23:59:59Z"), None);
    }

    proptest! {
        /// No header value makes the reader panic.
        #[test]
        fn any_values_read_without_panic(
            values in proptest::collection::vec("[ -~]{0,40}", 12),
            limited: bool,
            now: u64,
        ) {
            let names = [
                "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
                "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
                "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset",
                "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset",
                "anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset",
                "anthropic-ratelimit-output-tokens-reset", "retry-after",
            ];
            let mut h = HeaderMap::new();
            for (n, v) in names.iter().zip(&values) {
                if let Ok(v) = http::HeaderValue::from_str(v) {
                    h.insert(*n, v);
                }
            }
            let r = read(&h, limited, now);
            for l in [r.requests, r.tokens, r.input_tokens, r.output_tokens].into_iter().flatten() {
                prop_assert!(l.reset.is_none_or(|d| d <= MAX_RESET));
            }
        }
    }

    #[test]
    fn an_answer_without_rate_limit_headers_is_told_apart_by_its_names() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        h.insert("retry-after", "5".parse().unwrap());
        assert!(!has_limits(&h));
        assert!(
            read(&h, true, 0).is_empty(),
            "retry-after alone says nothing"
        );
        h.insert(
            "anthropic-ratelimit-requests-remaining",
            "3".parse().unwrap(),
        );
        assert!(has_limits(&h));
        let mut o = HeaderMap::new();
        o.insert("x-ratelimit-remaining-tokens", "10".parse().unwrap());
        assert!(has_limits(&o));
    }
}
