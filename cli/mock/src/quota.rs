//! A provider's per-key rate limit, as the mock plays it
//! ([`crate::MockModel::set_quota`]).
//!
//! Each key (the request's `Authorization`, else its `x-api-key`, else
//! none) has `requests` requests per window of `reset`, the window
//! starting at the key's first request. Every answer says what is left of
//! the key's window in the style's headers (OpenAI's
//! `x-ratelimit-remaining-requests` counting down from `requests − 1`,
//! `x-ratelimit-reset-requests` as a Go duration; or Anthropic's
//! `anthropic-ratelimit-requests-remaining` and an RFC 3339 reset); a
//! request past the limit is answered `429` with `remaining 0` and a
//! `retry-after`, until the window ends. [`QuotaStyle::Malformed`] sends
//! values no reader can parse, and still answers 429 past the limit.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use tokio::time::Instant;

/// Which headers the mock's answers carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaStyle {
    /// OpenAI's (and Azure OpenAI's): `x-ratelimit-*`.
    OpenAi,
    /// Anthropic's: `anthropic-ratelimit-*`.
    Anthropic,
    /// Both names, with values that are not numbers, durations or dates.
    Malformed,
}

/// A per-key rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaMock {
    /// The headers.
    pub style: QuotaStyle,
    /// Requests per key per window.
    pub requests: u64,
    /// The window's length.
    pub reset: Duration,
}

/// What each key was given, by key (its header's value).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaCounts {
    /// Requests answered within the limit.
    pub served: HashMap<String, u64>,
    /// Requests answered 429.
    pub refused: HashMap<String, u64>,
}

/// The mock's windows, per key.
#[derive(Default)]
pub(crate) struct QuotaBook {
    windows: HashMap<String, (Instant, u64)>,
    pub(crate) counts: QuotaCounts,
}

/// What a request got.
pub(crate) struct Taken {
    /// Within the limit.
    pub(crate) served: bool,
    /// The headers to add to the answer.
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

/// The key a request presents.
fn key_of(headers: &HeaderMap) -> String {
    headers
        .get(http::header::AUTHORIZATION)
        .or_else(|| headers.get("x-api-key"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

impl QuotaBook {
    /// Counts a request presenting `headers` against its key's window.
    pub(crate) fn take(&mut self, q: &QuotaMock, headers: &HeaderMap) -> Taken {
        let key = key_of(headers);
        let now = Instant::now();
        let (start, used) = self.windows.entry(key.clone()).or_insert((now, 0));
        if now.duration_since(*start) >= q.reset {
            *start = now;
            *used = 0;
        }
        let served = *used < q.requests;
        if served {
            *used += 1;
        }
        let remaining = q.requests - *used;
        let reset_in = q.reset.saturating_sub(now.duration_since(*start));
        let counts = if served {
            &mut self.counts.served
        } else {
            &mut self.counts.refused
        };
        *counts.entry(key).or_insert(0) += 1;
        let mut out = style_headers(q, remaining, reset_in);
        if !served {
            let secs = reset_in.as_secs() + u64::from(reset_in.subsec_nanos() > 0);
            out.push((http::header::RETRY_AFTER, HeaderValue::from(secs.max(1))));
        }
        Taken {
            served,
            headers: out,
        }
    }
}

fn header(name: &'static str, value: String) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static(name),
        HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("0")),
    )
}

/// The rate-limit headers of `q`'s style for `remaining` requests left
/// and `reset_in` to the window's end (tokens: plenty, same reset).
fn style_headers(
    q: &QuotaMock,
    remaining: u64,
    reset_in: Duration,
) -> Vec<(HeaderName, HeaderValue)> {
    match q.style {
        QuotaStyle::OpenAi => vec![
            header("x-ratelimit-limit-requests", q.requests.to_string()),
            header("x-ratelimit-remaining-requests", remaining.to_string()),
            header("x-ratelimit-reset-requests", go_duration(reset_in)),
            header("x-ratelimit-limit-tokens", "1000000".into()),
            header("x-ratelimit-remaining-tokens", "999000".into()),
            header("x-ratelimit-reset-tokens", go_duration(reset_in)),
        ],
        QuotaStyle::Anthropic => {
            let at = rfc3339(router_policy::wall_clock::now() + reset_in);
            vec![
                header("anthropic-ratelimit-requests-limit", q.requests.to_string()),
                header(
                    "anthropic-ratelimit-requests-remaining",
                    remaining.to_string(),
                ),
                header("anthropic-ratelimit-requests-reset", at.clone()),
                header("anthropic-ratelimit-tokens-limit", "1000000".into()),
                header("anthropic-ratelimit-tokens-remaining", "999000".into()),
                header("anthropic-ratelimit-tokens-reset", at.clone()),
                header(
                    "anthropic-ratelimit-input-tokens-remaining",
                    "800000".into(),
                ),
                header("anthropic-ratelimit-input-tokens-reset", at.clone()),
                header(
                    "anthropic-ratelimit-output-tokens-remaining",
                    "200000".into(),
                ),
                header("anthropic-ratelimit-output-tokens-reset", at),
            ]
        }
        QuotaStyle::Malformed => vec![
            header("x-ratelimit-remaining-requests", "plenty".into()),
            header("x-ratelimit-reset-requests", "soon".into()),
            header("x-ratelimit-remaining-tokens", "-5".into()),
            header("anthropic-ratelimit-requests-remaining", "0.5".into()),
            header("anthropic-ratelimit-requests-reset", "tomorrow".into()),
            header("anthropic-ratelimit-tokens-remaining", "1e9".into()),
        ],
    }
}

/// `d` as a Go duration, as OpenAI writes its resets (`1.5s`, `20ms`).
fn go_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}.{:03}s", d.as_secs(), d.subsec_millis())
    }
}

/// `t` as RFC 3339 in UTC with milliseconds (`2025-01-15T14:24:00.500Z`).
fn rfc3339(t: SystemTime) -> String {
    let ms = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis()) as i64;
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_durations_are_written_as_providers_write_them() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_millis(1_736_950_980_500)),
            "2025-01-15T14:23:00.500Z"
        );
        assert_eq!(go_duration(Duration::from_millis(20)), "20ms");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.500s");
    }

    #[tokio::test]
    async fn each_key_counts_down_is_refused_at_zero_and_resets() {
        let q = QuotaMock {
            style: QuotaStyle::OpenAi,
            requests: 2,
            reset: Duration::from_millis(100),
        };
        let mut book = QuotaBook::default();
        let key = |k: &str| {
            let mut h = HeaderMap::new();
            h.insert("authorization", HeaderValue::from_str(k).unwrap());
            h
        };
        let remaining = |t: &Taken| {
            t.headers
                .iter()
                .find(|(n, _)| n == "x-ratelimit-remaining-requests")
                .map(|(_, v)| v.to_str().unwrap().to_string())
        };
        let a1 = book.take(&q, &key("Bearer a"));
        assert_eq!((a1.served, remaining(&a1).as_deref()), (true, Some("1")));
        let a2 = book.take(&q, &key("Bearer a"));
        assert_eq!((a2.served, remaining(&a2).as_deref()), (true, Some("0")));
        let a3 = book.take(&q, &key("Bearer a"));
        assert!(!a3.served);
        assert!(a3.headers.iter().any(|(n, _)| n == "retry-after"));
        assert!(book.take(&q, &key("Bearer b")).served);
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(book.take(&q, &key("Bearer a")).served);
        assert_eq!(book.counts.refused.get("Bearer a"), Some(&1));
        assert_eq!(book.counts.served.get("Bearer a"), Some(&3));
    }
}
