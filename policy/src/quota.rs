//! Quota-aware admission: whether one (endpoint, key) may take a request,
//! from what its provider said is left of its rate limits.
//!
//! Cloud APIs tell the client, on every answer, how much is left of each
//! rate limit of the key that sent it and when that limit resets (OpenAI
//! and Azure OpenAI: `x-ratelimit-remaining-requests`, `…-tokens`,
//! `x-ratelimit-reset-requests`, `…-tokens`; Anthropic:
//! `anthropic-ratelimit-requests-remaining`, `…-tokens-remaining`,
//! `…-input-tokens-remaining`, `…-output-tokens-remaining` and their
//! `…-reset`; and `retry-after` on a 429). [`headers::read`] turns those
//! headers into a [`Reading`]; [`QuotaState::record`] keeps the latest
//! reading of each limit as a [`Window`]: what was left and when it resets.
//!
//! # The rule ([`admit`])
//!
//! A request with token estimate `e` (its prompt tokens plus its
//! `max_tokens`, [`Estimate`]) is admitted by a key unless, before that
//! limit's reset:
//!
//! 1. a 429's `retry-after` still holds;
//! 2. no request is left (`remaining requests − sent since = 0`): the key is
//!    *rested* until the reset, without waiting for the 429 the next request
//!    would get;
//! 3. the tokens left cannot cover `e` (the whole estimate against a
//!    combined token limit, the prompt against an input-token limit, the
//!    output against an output-token limit): the key is skipped for this
//!    request until that reset (a smaller request may still go).
//!
//! A skip names the instant it ends ([`Admission::Skip`]`{until}`), the
//! latest of the resets that hold it back: the balancer wakes its waiters
//! then. Once every reset has passed, the key admits again whatever it
//! last said: the window it counted in is over.
//!
//! # Why count what was sent since the reading
//!
//! A reading is as old as the answer that carried it. Requests sent on the
//! key after that answer are not in it, so each grant charges the windows
//! ([`QuotaState::charge`]: one request, the estimate's tokens) until the
//! next reading replaces them. Without this, a key that said "1 left"
//! would be given every request until one of them came back with a 429.
//! The count errs on the side of resting a key a little early: a reading
//! taken while requests were in flight may already count some of them.
//!
//! # Why a key is not rested for long on a guess
//!
//! A limit read without its reset (a header missing or malformed) is
//! believed for [`DEFAULT_RESET`] (a minute: the providers' limits are per
//! minute) and no longer; a reset is believed up to [`MAX_RESET`] (a day,
//! for daily limits); a malformed value is ignored, never a panic and
//! never a zero.

use std::time::Duration;

pub mod headers;

/// How long a limit read without a reset is believed.
pub const DEFAULT_RESET: Duration = Duration::from_secs(60);

/// The longest a reset (or a 429's `retry-after`) is believed.
pub const MAX_RESET: Duration = Duration::from_secs(24 * 3600);

/// What one answer said of its key's limits. Resets are durations from
/// when the answer was read (an absolute reset has been made relative by
/// [`headers::read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// Requests left, and when that limit resets.
    pub requests: Option<Limit>,
    /// Tokens left (combined), and when that limit resets.
    pub tokens: Option<Limit>,
    /// Input tokens left (Anthropic), and when that limit resets.
    pub input_tokens: Option<Limit>,
    /// Output tokens left (Anthropic), and when that limit resets.
    pub output_tokens: Option<Limit>,
    /// A 429's `retry-after`.
    pub retry_after: Option<Duration>,
}

impl Reading {
    /// Whether the answer said anything about its limits.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One limit as an answer reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// What is left.
    pub remaining: u64,
    /// How long until it resets, when the answer said.
    pub reset: Option<Duration>,
}

/// One limit as the balancer keeps it: what was left at the last reading,
/// what was sent since, and when it resets (`T`: the caller's instant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window<T> {
    /// Left at the last reading.
    pub remaining: u64,
    /// Charged since the last reading (requests, or estimated tokens).
    pub spent: u64,
    /// When the limit resets.
    pub reset_at: T,
}

impl<T: Copy + Ord> Window<T> {
    /// What is left now by the balancer's count, or `None` once the reset
    /// has passed (the limit no longer holds).
    pub fn left(&self, now: T) -> Option<u64> {
        (now < self.reset_at).then(|| self.remaining.saturating_sub(self.spent))
    }
}

/// What the balancer knows of one (endpoint, key)'s limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaState<T> {
    /// Requests.
    pub requests: Option<Window<T>>,
    /// Tokens (combined).
    pub tokens: Option<Window<T>>,
    /// Input tokens.
    pub input_tokens: Option<Window<T>>,
    /// Output tokens.
    pub output_tokens: Option<Window<T>>,
    /// A 429 said to wait until then.
    pub retry_until: Option<T>,
}

impl<T> Default for QuotaState<T> {
    fn default() -> Self {
        Self {
            requests: None,
            tokens: None,
            input_tokens: None,
            output_tokens: None,
            retry_until: None,
        }
    }
}

/// A request's token estimate: its prompt tokens and the output it may
/// ask for (`max_tokens`, else the decision's default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    /// Prompt tokens (estimated from its bytes).
    pub input: u64,
    /// Output tokens it may use.
    pub output: u64,
}

impl Estimate {
    /// Prompt and output together.
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// Which limit holds a request back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Why {
    /// A 429's `retry-after`.
    RetryAfter,
    /// No request left before the reset.
    Requests,
    /// Fewer tokens left than the request's estimate.
    Tokens,
    /// Fewer input tokens left than the request's prompt.
    InputTokens,
    /// Fewer output tokens left than the request may ask for.
    OutputTokens,
}

impl Why {
    /// A label for logs, the route log and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::RetryAfter => "retry_after",
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::InputTokens => "input_tokens",
            Self::OutputTokens => "output_tokens",
        }
    }

    /// Words for a reason text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RetryAfter => "rate limited (retry-after)",
            Self::Requests => "no requests left",
            Self::Tokens => "fewer tokens left than the request's estimate",
            Self::InputTokens => "fewer input tokens left than the request's prompt",
            Self::OutputTokens => "fewer output tokens left than the request's max_tokens",
        }
    }
}

/// Whether a key may take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission<T> {
    /// It may.
    Admit,
    /// Not before `until`, because of `why`.
    Skip {
        /// When the limit that holds it back resets.
        until: T,
        /// Which limit.
        why: Why,
    },
}

impl<T> Admission<T> {
    /// It may.
    pub fn admits(&self) -> bool {
        matches!(self, Self::Admit)
    }
}

/// Whether the key whose limits are `state` may take a request of
/// `estimate` at `now`. See the module docs for the rule.
pub fn admit<T: Copy + Ord>(state: &QuotaState<T>, estimate: Estimate, now: T) -> Admission<T> {
    let mut skip: Option<(T, Why)> = None;
    let mut hold = |until: T, why: Why| {
        // The latest reset of those that hold it: before then it would
        // still be refused.
        if skip.is_none_or(|(u, _)| until > u) {
            skip = Some((until, why));
        }
    };
    if let Some(u) = state.retry_until.filter(|u| now < *u) {
        hold(u, Why::RetryAfter);
    }
    let windows = [
        (state.requests, 1, Why::Requests),
        (state.tokens, estimate.total(), Why::Tokens),
        (state.input_tokens, estimate.input, Why::InputTokens),
        (state.output_tokens, estimate.output, Why::OutputTokens),
    ];
    for (w, need, why) in windows {
        let Some(w) = w else { continue };
        match w.left(now) {
            // A request needs one request left; tokens, the estimate (a
            // limit at zero holds back even a request of no tokens).
            Some(left) if left < need.max(1) => hold(w.reset_at, why),
            _ => {}
        }
    }
    match skip {
        Some((until, why)) => Admission::Skip { until, why },
        None => Admission::Admit,
    }
}

impl<T: Copy + Ord> QuotaState<T> {
    /// Keeps what `reading` says, read at `now`; `later(d)` is `now + d`
    /// (capped by the caller's clock). Each limit the reading names
    /// replaces the one kept (and what was charged since); the others stay.
    pub fn record(&mut self, reading: &Reading, now: T, later: impl Fn(Duration) -> T) {
        let window = |l: Limit| Window {
            remaining: l.remaining,
            spent: 0,
            reset_at: later(l.reset.unwrap_or(DEFAULT_RESET).min(MAX_RESET)),
        };
        if let Some(l) = reading.requests {
            self.requests = Some(window(l));
        }
        if let Some(l) = reading.tokens {
            self.tokens = Some(window(l));
        }
        if let Some(l) = reading.input_tokens {
            self.input_tokens = Some(window(l));
        }
        if let Some(l) = reading.output_tokens {
            self.output_tokens = Some(window(l));
        }
        if let Some(d) = reading.retry_after {
            self.retry_until = Some(later(d.min(MAX_RESET)));
        }
        self.forget_past(now);
    }

    /// A request of `estimate` was sent: charged to every window that
    /// still holds.
    pub fn charge(&mut self, estimate: Estimate) {
        for (w, n) in [
            (&mut self.requests, 1),
            (&mut self.tokens, estimate.total()),
            (&mut self.input_tokens, estimate.input),
            (&mut self.output_tokens, estimate.output),
        ] {
            if let Some(w) = w {
                w.spent = w.spent.saturating_add(n);
            }
        }
    }

    /// Drops the windows whose reset has passed (so that what is shown is
    /// what holds).
    pub fn forget_past(&mut self, now: T) {
        for w in [
            &mut self.requests,
            &mut self.tokens,
            &mut self.input_tokens,
            &mut self.output_tokens,
        ] {
            if w.is_some_and(|w| w.reset_at <= now) {
                *w = None;
            }
        }
        if self.retry_until.is_some_and(|u| u <= now) {
            self.retry_until = None;
        }
    }

    /// Whether any limit is known.
    pub fn is_known(&self) -> bool {
        self.requests.is_some()
            || self.tokens.is_some()
            || self.input_tokens.is_some()
            || self.output_tokens.is_some()
            || self.retry_until.is_some()
    }

    /// The instant the state next changes by time alone: the earliest
    /// reset after `now` (for the balancer's wake timer).
    pub fn next_change(&self, now: T) -> Option<T> {
        [
            self.requests.map(|w| w.reset_at),
            self.tokens.map(|w| w.reset_at),
            self.input_tokens.map(|w| w.reset_at),
            self.output_tokens.map(|w| w.reset_at),
            self.retry_until,
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .min()
    }

    /// Requests left now by the balancer's count (`None`: no limit holds).
    pub fn requests_left(&self, now: T) -> Option<u64> {
        self.requests.and_then(|w| w.left(now))
    }

    /// Tokens left now by the balancer's count: the smallest of the token
    /// limits that hold (`None`: none holds).
    pub fn tokens_left(&self, now: T) -> Option<u64> {
        [self.tokens, self.input_tokens, self.output_tokens]
            .into_iter()
            .flatten()
            .filter_map(|w| w.left(now))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Milliseconds on a test clock.
    type Ms = u64;

    fn later(now: Ms) -> impl Fn(Duration) -> Ms {
        move |d| now + d.as_millis() as u64
    }

    fn limit(remaining: u64, reset_ms: u64) -> Option<Limit> {
        Some(Limit {
            remaining,
            reset: Some(Duration::from_millis(reset_ms)),
        })
    }

    const SMALL: Estimate = Estimate {
        input: 10,
        output: 10,
    };

    #[test]
    fn a_key_at_zero_requests_is_rested_until_its_reset_then_admits() {
        let mut q = QuotaState::default();
        q.record(
            &Reading {
                requests: limit(0, 1500),
                ..Reading::default()
            },
            1000,
            later(1000),
        );
        assert_eq!(
            admit(&q, SMALL, 1000),
            Admission::Skip {
                until: 2500,
                why: Why::Requests
            }
        );
        assert!(!admit(&q, SMALL, 2499).admits());
        assert!(admit(&q, SMALL, 2500).admits());
    }

    #[test]
    fn requests_sent_since_the_reading_count_against_it() {
        let mut q = QuotaState::default();
        q.record(
            &Reading {
                requests: limit(2, 60_000),
                ..Reading::default()
            },
            0,
            later(0),
        );
        assert!(admit(&q, SMALL, 1).admits());
        q.charge(SMALL);
        assert!(admit(&q, SMALL, 1).admits());
        q.charge(SMALL);
        assert_eq!(
            admit(&q, SMALL, 1),
            Admission::Skip {
                until: 60_000,
                why: Why::Requests
            }
        );
        // The next reading replaces the count.
        q.record(
            &Reading {
                requests: limit(5, 60_000),
                ..Reading::default()
            },
            2,
            later(2),
        );
        assert_eq!(q.requests_left(3), Some(5));
    }

    #[test]
    fn a_request_larger_than_the_tokens_left_is_skipped_a_smaller_one_goes() {
        let mut q = QuotaState::default();
        q.record(
            &Reading {
                requests: limit(100, 1000),
                tokens: limit(500, 6000),
                ..Reading::default()
            },
            0,
            later(0),
        );
        let big = Estimate {
            input: 400,
            output: 200,
        };
        assert_eq!(
            admit(&q, big, 10),
            Admission::Skip {
                until: 6000,
                why: Why::Tokens
            }
        );
        assert!(admit(&q, SMALL, 10).admits());
        assert!(admit(&q, big, 6000).admits());
    }

    #[test]
    fn anthropic_input_and_output_limits_hold_their_own_part() {
        let mut q = QuotaState::default();
        q.record(
            &Reading {
                input_tokens: limit(1000, 1000),
                output_tokens: limit(100, 2000),
                ..Reading::default()
            },
            0,
            later(0),
        );
        let long_answer = Estimate {
            input: 10,
            output: 200,
        };
        assert_eq!(
            admit(&q, long_answer, 0),
            Admission::Skip {
                until: 2000,
                why: Why::OutputTokens
            }
        );
        let long_prompt = Estimate {
            input: 2000,
            output: 10,
        };
        assert_eq!(
            admit(&q, long_prompt, 0),
            Admission::Skip {
                until: 1000,
                why: Why::InputTokens
            }
        );
        assert!(admit(&q, SMALL, 0).admits());
        assert_eq!(q.tokens_left(0), Some(100));
    }

    #[test]
    fn a_skip_lasts_until_the_latest_reset_that_holds_it() {
        let mut q = QuotaState::default();
        q.record(
            &Reading {
                requests: limit(0, 1000),
                tokens: limit(0, 5000),
                retry_after: Some(Duration::from_secs(2)),
                ..Reading::default()
            },
            0,
            later(0),
        );
        assert_eq!(
            admit(&q, SMALL, 0),
            Admission::Skip {
                until: 5000,
                why: Why::Tokens
            }
        );
        assert_eq!(q.next_change(0), Some(1000));
        q.forget_past(2000);
        assert!(q.requests.is_none() && q.retry_until.is_none());
        assert!(q.tokens.is_some());
    }

    #[test]
    fn a_limit_without_a_reset_is_believed_a_minute_and_no_reset_past_a_day() {
        let mut q = QuotaState::default();
        q.record(
            &Reading {
                requests: Some(Limit {
                    remaining: 0,
                    reset: None,
                }),
                tokens: limit(0, u64::MAX),
                ..Reading::default()
            },
            0,
            |d| d.as_millis() as u64,
        );
        assert_eq!(q.requests.map(|w| w.reset_at), Some(60_000));
        assert_eq!(
            q.tokens.map(|w| w.reset_at),
            Some(MAX_RESET.as_millis() as u64)
        );
    }

    fn window() -> impl Strategy<Value = Option<Window<Ms>>> {
        proptest::option::of((0u64..50, 0u64..50, 0u64..10_000).prop_map(
            |(remaining, spent, reset_at)| Window {
                remaining,
                spent,
                reset_at,
            },
        ))
    }

    fn state() -> impl Strategy<Value = QuotaState<Ms>> {
        (
            window(),
            window(),
            window(),
            window(),
            proptest::option::of(0u64..10_000),
        )
            .prop_map(|(requests, tokens, input_tokens, output_tokens, retry)| {
                QuotaState {
                    requests,
                    tokens,
                    input_tokens,
                    output_tokens,
                    retry_until: retry,
                }
            })
    }

    fn estimate() -> impl Strategy<Value = Estimate> {
        (0u64..60, 0u64..60).prop_map(|(input, output)| Estimate { input, output })
    }

    proptest! {
        /// A key with no request left is never given one before its
        /// reset, whatever else it says.
        #[test]
        fn never_admits_at_zero_requests_before_the_reset(
            mut q in state(),
            e in estimate(),
            reset in 1u64..10_000,
            now in 0u64..10_000,
            remaining in 0u64..5,
        ) {
            q.requests = Some(Window { remaining, spent: remaining, reset_at: reset });
            let a = admit(&q, e, now);
            if now < reset {
                prop_assert!(!a.admits());
                match a {
                    Admission::Skip { until, .. } => prop_assert!(until >= reset && until > now),
                    Admission::Admit => unreachable!(),
                }
            }
        }

        /// Once every reset has passed, any request is admitted.
        #[test]
        fn always_admits_after_every_reset(q in state(), e in estimate(), extra in 0u64..1000) {
            let last = q.next_change(0).map_or(0, |_| 10_000);
            prop_assert!(admit(&q, e, last + extra).admits());
        }

        /// More left never refuses what less left admitted, and a smaller
        /// request is admitted wherever a larger one is.
        #[test]
        fn admission_is_monotone_in_what_is_left(
            q in state(),
            e in estimate(),
            now in 0u64..10_000,
            more in 0u64..100,
            which in 0usize..4,
            smaller in 0u64..60,
        ) {
            let mut richer = q;
            let w = match which {
                0 => &mut richer.requests,
                1 => &mut richer.tokens,
                2 => &mut richer.input_tokens,
                _ => &mut richer.output_tokens,
            };
            if let Some(w) = w {
                w.remaining += more;
            }
            if admit(&q, e, now).admits() {
                prop_assert!(admit(&richer, e, now).admits());
                let less = Estimate { input: e.input.min(smaller), output: e.output.min(smaller) };
                prop_assert!(admit(&q, less, now).admits());
            }
        }

        /// A skip always ends after `now`, at a reset the state holds.
        #[test]
        fn a_skip_ends_at_a_reset_after_now(q in state(), e in estimate(), now in 0u64..10_000) {
            if let Admission::Skip { until, .. } = admit(&q, e, now) {
                prop_assert!(until > now);
                let resets = [
                    q.requests.map(|w| w.reset_at),
                    q.tokens.map(|w| w.reset_at),
                    q.input_tokens.map(|w| w.reset_at),
                    q.output_tokens.map(|w| w.reset_at),
                    q.retry_until,
                ];
                prop_assert!(resets.contains(&Some(until)));
            }
        }
    }
}
