//! Token usage as backends report it, and as the router counts it.
//!
//! Every dialect reports the tokens of an answer, but they do not add up
//! the same way, and a budget is exact only if the router knows which
//! way:
//!
//! - **OpenAI chat** (and every OpenAI-compatible server): `prompt_tokens`
//!   is the whole prompt; `prompt_tokens_details.cached_tokens` is the
//!   part of it read from a cache, *inside* that count. Proxies that put
//!   Anthropic models behind this shape (LiteLLM) also send
//!   `cache_read_input_tokens` and `cache_creation_input_tokens`, again
//!   inside `prompt_tokens`.
//! - **OpenAI responses**: `input_tokens` with
//!   `input_tokens_details.cached_tokens` inside it.
//! - **Anthropic Messages**: `input_tokens` is only the prompt tokens after
//!   the last cache breakpoint; `cache_read_input_tokens` and
//!   `cache_creation_input_tokens` are *outside* it. The whole prompt is
//!   the sum of the three. A stream's `message_delta` repeats the counts,
//!   cumulative: a later count replaces an earlier one, never adds to it.
//!
//! So the spelling decides: when `prompt_tokens` is given, the cache
//! counts are parts of it; otherwise the prompt is `input_tokens` plus
//! Anthropic's two cache counts (an OpenAI responses answer has neither,
//! and its details are inside `input_tokens`). No dialect sends both of
//! the pairs that would make this ambiguous.
//!
//! [`ReportedUsage`] holds the fields as reported (merged across a
//! stream's usage events); [`Tokens`] is the normalized result: the
//! whole prompt, the output, and the prompt's cache-read and cache-write
//! parts. The prompt *includes* the cached parts, as OpenTelemetry's
//! `gen_ai.usage.input_tokens` does; [`Tokens::uncached_input`] is the
//! rest. Prices ([`crate::document::Price::cost`]) charge each part at
//! its own rate. Counts are clamped so that the parts never exceed the
//! whole and nothing overflows: a cached token is counted once.
//!
//! Pure: no I/O.

/// The usage fields of one answer, as its backend spelled them (each
/// absent unless reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReportedUsage {
    /// OpenAI chat `prompt_tokens` (the whole prompt).
    pub prompt_tokens: Option<u64>,
    /// OpenAI chat `completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// Anthropic's or OpenAI responses' `input_tokens`.
    pub input_tokens: Option<u64>,
    /// Anthropic's or OpenAI responses' `output_tokens`.
    pub output_tokens: Option<u64>,
    /// OpenAI's `*_tokens_details.cached_tokens` (inside the prompt count).
    pub cached_tokens: Option<u64>,
    /// Anthropic's `cache_read_input_tokens`.
    pub cache_read_input_tokens: Option<u64>,
    /// Anthropic's `cache_creation_input_tokens`.
    pub cache_creation_input_tokens: Option<u64>,
}

/// The tokens of one answer, normalized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tokens {
    /// Every prompt token, cached or not.
    pub prompt: u64,
    /// Generated tokens (reasoning included).
    pub output: u64,
    /// The part of `prompt` read from a cache.
    pub cache_read: u64,
    /// The part of `prompt` written to a cache.
    pub cache_write: u64,
}

impl Tokens {
    /// Prompt tokens neither read from nor written to a cache.
    pub fn uncached_input(&self) -> u64 {
        self.prompt
            .saturating_sub(self.cache_read)
            .saturating_sub(self.cache_write)
    }

    /// Every token.
    pub fn total(&self) -> u64 {
        self.prompt.saturating_add(self.output)
    }
}

impl ReportedUsage {
    /// `self` after a later usage event of the same answer: each field it
    /// gives replaces this one's (counts are cumulative), the others are
    /// kept.
    pub fn merge(self, later: Self) -> Self {
        Self {
            prompt_tokens: later.prompt_tokens.or(self.prompt_tokens),
            completion_tokens: later.completion_tokens.or(self.completion_tokens),
            input_tokens: later.input_tokens.or(self.input_tokens),
            output_tokens: later.output_tokens.or(self.output_tokens),
            cached_tokens: later.cached_tokens.or(self.cached_tokens),
            cache_read_input_tokens: later
                .cache_read_input_tokens
                .or(self.cache_read_input_tokens),
            cache_creation_input_tokens: later
                .cache_creation_input_tokens
                .or(self.cache_creation_input_tokens),
        }
    }

    /// The whole prompt, when reported (see the module docs).
    pub fn prompt(&self) -> Option<u64> {
        match self.prompt_tokens {
            Some(p) => Some(p),
            None => self.input_tokens.map(|i| {
                i.saturating_add(self.cache_read_input_tokens.unwrap_or(0))
                    .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
            }),
        }
    }

    /// The output, when reported.
    pub fn output(&self) -> Option<u64> {
        self.completion_tokens.or(self.output_tokens)
    }

    /// Whether any count at all was reported.
    pub fn reported(&self) -> bool {
        self.prompt().is_some() || self.output().is_some()
    }

    /// The normalized tokens; an unreported prompt is `estimated_prompt`
    /// (with no cached part), an unreported output 0.
    pub fn tokens(&self, estimated_prompt: u64) -> Tokens {
        let Some(prompt) = self.prompt() else {
            return Tokens {
                prompt: estimated_prompt,
                output: self.output().unwrap_or(0),
                cache_read: 0,
                cache_write: 0,
            };
        };
        let anthropic_read = self.cache_read_input_tokens.unwrap_or(0);
        let details = self.cached_tokens.unwrap_or(0);
        // Both spellings of a cache read never come together; if they
        // did, the larger is the read (never their sum).
        let cache_read = details.max(anthropic_read).min(prompt);
        let cache_write = self
            .cache_creation_input_tokens
            .unwrap_or(0)
            .min(prompt - cache_read);
        Tokens {
            prompt,
            output: self.output().unwrap_or(0),
            cache_read,
            cache_write,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn openai_cached_tokens_are_inside_the_prompt() {
        let u = ReportedUsage {
            prompt_tokens: Some(2006),
            completion_tokens: Some(300),
            cached_tokens: Some(1920),
            ..ReportedUsage::default()
        };
        let t = u.tokens(0);
        assert_eq!(
            t,
            Tokens {
                prompt: 2006,
                output: 300,
                cache_read: 1920,
                cache_write: 0
            }
        );
        assert_eq!(t.uncached_input(), 86);
        assert_eq!(t.total(), 2306);
    }

    #[test]
    fn anthropic_cache_counts_are_outside_its_input_tokens() {
        let u = ReportedUsage {
            input_tokens: Some(21),
            output_tokens: Some(393),
            cache_read_input_tokens: Some(1000),
            cache_creation_input_tokens: Some(188_086),
            ..ReportedUsage::default()
        };
        let t = u.tokens(0);
        assert_eq!(t.prompt, 21 + 1000 + 188_086);
        assert_eq!((t.cache_read, t.cache_write), (1000, 188_086));
        assert_eq!(t.uncached_input(), 21);
    }

    #[test]
    fn a_litellm_style_answer_counts_its_cache_inside_prompt_tokens() {
        // prompt_tokens already holds the cache counts it repeats.
        let u = ReportedUsage {
            prompt_tokens: Some(1200),
            completion_tokens: Some(5),
            cached_tokens: Some(1000),
            cache_read_input_tokens: Some(1000),
            cache_creation_input_tokens: Some(150),
            ..ReportedUsage::default()
        };
        let t = u.tokens(0);
        assert_eq!((t.prompt, t.cache_read, t.cache_write), (1200, 1000, 150));
        assert_eq!(t.uncached_input(), 50);
    }

    #[test]
    fn an_anthropic_stream_merges_its_events_without_adding() {
        // message_start: the prompt and a first output count; then two
        // message_delta events, cumulative.
        let start = ReportedUsage {
            input_tokens: Some(10),
            cache_read_input_tokens: Some(500),
            cache_creation_input_tokens: Some(0),
            output_tokens: Some(1),
            ..ReportedUsage::default()
        };
        let delta = |n| ReportedUsage {
            output_tokens: Some(n),
            ..ReportedUsage::default()
        };
        let u = start.merge(delta(20)).merge(delta(42));
        assert_eq!(
            u.tokens(0),
            Tokens {
                prompt: 510,
                output: 42,
                cache_read: 500,
                cache_write: 0
            }
        );
    }

    #[test]
    fn an_unreported_prompt_is_the_estimate() {
        let u = ReportedUsage {
            completion_tokens: Some(7),
            ..ReportedUsage::default()
        };
        assert!(u.reported());
        assert_eq!(u.tokens(99).prompt, 99);
        assert!(!ReportedUsage::default().reported());
    }

    proptest! {
        /// Whatever is reported, the parts never exceed the whole, a
        /// cached token is never counted twice (the total is the prompt
        /// as reported plus the output), and nothing overflows.
        #[test]
        fn parts_never_exceed_the_whole(
            prompt_tokens in proptest::option::of(any::<u64>()),
            input_tokens in proptest::option::of(any::<u64>()),
            output in proptest::option::of(any::<u64>()),
            cached in proptest::option::of(any::<u64>()),
            read in proptest::option::of(any::<u64>()),
            write in proptest::option::of(any::<u64>()),
            estimate in any::<u64>(),
        ) {
            let u = ReportedUsage {
                prompt_tokens,
                completion_tokens: output,
                input_tokens,
                output_tokens: None,
                cached_tokens: cached,
                cache_read_input_tokens: read,
                cache_creation_input_tokens: write,
            };
            let t = u.tokens(estimate);
            prop_assert!(t.cache_read.saturating_add(t.cache_write) <= t.prompt);
            prop_assert_eq!(
                t.uncached_input() + t.cache_read + t.cache_write,
                t.prompt
            );
            prop_assert_eq!(t.prompt, u.prompt().unwrap_or(estimate));
            if let Some(p) = prompt_tokens {
                // OpenAI's spelling: the cache is inside, never added.
                prop_assert_eq!(t.prompt, p);
            }
        }

        /// An OpenAI answer and the same answer in Anthropic's spelling
        /// normalize to the same tokens.
        #[test]
        fn the_same_usage_in_either_spelling_is_the_same_tokens(
            uncached in 0u64..1 << 40,
            read in 0u64..1 << 40,
            write in 0u64..1 << 40,
            output in 0u64..1 << 40,
        ) {
            let anthropic = ReportedUsage {
                input_tokens: Some(uncached),
                output_tokens: Some(output),
                cache_read_input_tokens: Some(read),
                cache_creation_input_tokens: Some(write),
                ..ReportedUsage::default()
            };
            let openai = ReportedUsage {
                prompt_tokens: Some(uncached + read + write),
                completion_tokens: Some(output),
                cached_tokens: Some(read),
                cache_creation_input_tokens: Some(write),
                ..ReportedUsage::default()
            };
            prop_assert_eq!(anthropic.tokens(0), openai.tokens(0));
        }
    }
}
