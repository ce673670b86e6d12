//! Token usage, normalized to four counts that never overlap.
//!
//! The dialects count prompt tokens served from a cache differently, and a
//! budget is exact only if each token is counted once:
//!
//! | dialect | prompt count | cache reads | cache writes |
//! |---|---|---|---|
//! | OpenAI | `prompt_tokens` **includes** `prompt_tokens_details.cached_tokens` | `cached_tokens` | not reported |
//! | Anthropic | `input_tokens` **excludes** both cache counts | `cache_read_input_tokens` | `cache_creation_input_tokens` |
//! | Gemini | `promptTokenCount` **includes** `cachedContentTokenCount` | `cachedContentTokenCount` | not reported |
//!
//! [`Usage`] takes Anthropic's shape, where the counts are disjoint:
//! `input` is the prompt tokens neither read from nor written to a cache,
//! so the whole prompt is `input + cache_read + cache_write` and a price
//! applies to each count once. Reading OpenAI's or Gemini's usage subtracts
//! the cached tokens from the prompt count (a cache count larger than the
//! prompt count, which no provider sends, is capped at it, so the total
//! never grows); writing them adds the cache counts back.
//!
//! Output: OpenAI's `completion_tokens` and Anthropic's `output_tokens`
//! include reasoning tokens; Gemini reports thoughts apart
//! (`thoughtsTokenCount`, billed as output), so [`Usage::output`] is
//! `candidatesTokenCount + thoughtsTokenCount`. Gemini's
//! `toolUsePromptTokenCount` (prompt tokens of its own tool calls, billed
//! as input) is added to `input`.
//!
//! Anthropic's stream reports usage twice: in `message_start` and, at the
//! end, in `message_delta`, whose counts are **cumulative** (totals so far,
//! not increments). [`Usage::overlay_anthropic`] therefore replaces the
//! counts a `message_delta` carries and never adds them.
//!
//! Writing OpenAI or Gemini usage has no place for cache writes: they are
//! folded into the prompt count (they are prompt tokens), so the total is
//! kept and only the split is lost.

use serde_json::{json, Map, Value};

/// Tokens of one answer. The four counts are disjoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens neither read from nor written to a cache.
    pub input: u64,
    /// Generated tokens (reasoning included).
    pub output: u64,
    /// Prompt tokens read from a cache.
    pub cache_read: u64,
    /// Prompt tokens written to a cache.
    pub cache_write: u64,
}

fn count(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

impl Usage {
    /// Every prompt token, cached or not.
    pub fn prompt(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }

    /// Every token.
    pub fn total(&self) -> u64 {
        self.prompt().saturating_add(self.output)
    }

    /// From OpenAI's `usage` object (`prompt_tokens` includes
    /// `prompt_tokens_details.cached_tokens`).
    pub fn from_openai(v: &Value) -> Self {
        let prompt = count(v, "prompt_tokens").unwrap_or(0);
        let cached = v
            .get("prompt_tokens_details")
            .and_then(|d| count(d, "cached_tokens"))
            .unwrap_or(0)
            .min(prompt);
        Self {
            input: prompt - cached,
            output: count(v, "completion_tokens").unwrap_or(0),
            cache_read: cached,
            cache_write: 0,
        }
    }

    /// OpenAI's `usage` object: cache writes are folded into
    /// `prompt_tokens`, cache reads are `cached_tokens` inside it.
    pub fn to_openai(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt(),
            "completion_tokens": self.output,
            "total_tokens": self.total(),
            "prompt_tokens_details": {"cached_tokens": self.cache_read},
        })
    }

    /// From Anthropic's `usage` object (`input_tokens` excludes both cache
    /// counts).
    pub fn from_anthropic(v: &Value) -> Self {
        Self {
            input: count(v, "input_tokens").unwrap_or(0),
            output: count(v, "output_tokens").unwrap_or(0),
            cache_read: count(v, "cache_read_input_tokens").unwrap_or(0),
            cache_write: count(v, "cache_creation_input_tokens").unwrap_or(0),
        }
    }

    /// Replaces the counts an Anthropic `message_delta` usage carries: they
    /// are cumulative totals, never increments.
    pub fn overlay_anthropic(&mut self, v: &Value) {
        if let Some(n) = count(v, "input_tokens") {
            self.input = n;
        }
        if let Some(n) = count(v, "output_tokens") {
            self.output = n;
        }
        if let Some(n) = count(v, "cache_read_input_tokens") {
            self.cache_read = n;
        }
        if let Some(n) = count(v, "cache_creation_input_tokens") {
            self.cache_write = n;
        }
    }

    /// Anthropic's `usage` object.
    pub fn to_anthropic(&self) -> Value {
        json!({
            "input_tokens": self.input,
            "output_tokens": self.output,
            "cache_creation_input_tokens": self.cache_write,
            "cache_read_input_tokens": self.cache_read,
        })
    }

    /// From Gemini's `usageMetadata` (`promptTokenCount` includes
    /// `cachedContentTokenCount`; thoughts are counted apart from
    /// candidates).
    pub fn from_gemini(v: &Value) -> Self {
        let prompt = count(v, "promptTokenCount").unwrap_or(0);
        let cached = count(v, "cachedContentTokenCount").unwrap_or(0).min(prompt);
        let tool_prompt = count(v, "toolUsePromptTokenCount").unwrap_or(0);
        let candidates = count(v, "candidatesTokenCount").unwrap_or(0);
        let thoughts = count(v, "thoughtsTokenCount").unwrap_or(0);
        Self {
            input: (prompt - cached).saturating_add(tool_prompt),
            output: candidates.saturating_add(thoughts),
            cache_read: cached,
            cache_write: 0,
        }
    }

    /// Gemini's `usageMetadata` (thoughts are inside
    /// `candidatesTokenCount`).
    pub fn to_gemini(&self) -> Value {
        let mut m = Map::new();
        m.insert("promptTokenCount".into(), self.prompt().into());
        m.insert("candidatesTokenCount".into(), self.output.into());
        m.insert("totalTokenCount".into(), self.total().into());
        if self.cache_read > 0 {
            m.insert("cachedContentTokenCount".into(), self.cache_read.into());
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_cached_tokens_are_inside_the_prompt_count_and_counted_once() {
        let u = Usage::from_openai(&json!({
            "prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 128}
        }));
        assert_eq!(
            u,
            Usage {
                input: 86,
                output: 300,
                cache_read: 1920,
                cache_write: 0
            }
        );
        assert_eq!(u.prompt(), 2006);
        assert_eq!(u.total(), 2306);
        assert_eq!(u.to_openai()["prompt_tokens"], 2006);
        assert_eq!(
            u.to_openai()["prompt_tokens_details"]["cached_tokens"],
            1920
        );
    }

    #[test]
    fn anthropic_cache_counts_are_outside_input_tokens() {
        let u = Usage::from_anthropic(&json!({
            "input_tokens": 12, "output_tokens": 40,
            "cache_creation_input_tokens": 300, "cache_read_input_tokens": 2000
        }));
        assert_eq!(u.prompt(), 2312);
        // Written to OpenAI: every prompt token once, reads as cached.
        let o = u.to_openai();
        assert_eq!(o["prompt_tokens"], 2312);
        assert_eq!(o["prompt_tokens_details"]["cached_tokens"], 2000);
        assert_eq!(o["total_tokens"], 2352);
        // And back: the split of writes is folded into input, the total kept.
        let back = Usage::from_openai(&o);
        assert_eq!(back.input, 312);
        assert_eq!(back.cache_read, 2000);
        assert_eq!(back.total(), u.total());
    }

    #[test]
    fn anthropic_message_delta_usage_replaces_and_never_adds() {
        let mut u = Usage::from_anthropic(&json!({
            "input_tokens": 25, "output_tokens": 1,
            "cache_read_input_tokens": 100, "cache_creation_input_tokens": 0
        }));
        u.overlay_anthropic(&json!({"output_tokens": 15}));
        u.overlay_anthropic(&json!({"output_tokens": 57, "input_tokens": 25,
            "cache_read_input_tokens": 100}));
        assert_eq!(
            u,
            Usage {
                input: 25,
                output: 57,
                cache_read: 100,
                cache_write: 0
            }
        );
    }

    #[test]
    fn gemini_cached_content_is_inside_the_prompt_and_thoughts_are_output() {
        let u = Usage::from_gemini(&json!({
            "promptTokenCount": 1200, "cachedContentTokenCount": 1000,
            "candidatesTokenCount": 50, "thoughtsTokenCount": 70,
            "totalTokenCount": 1320
        }));
        assert_eq!(
            u,
            Usage {
                input: 200,
                output: 120,
                cache_read: 1000,
                cache_write: 0
            }
        );
        assert_eq!(u.total(), 1320);
        let g = u.to_gemini();
        assert_eq!(g["promptTokenCount"], 1200);
        assert_eq!(g["cachedContentTokenCount"], 1000);
        assert_eq!(Usage::from_gemini(&g), u);
        // Prompt tokens of Gemini's own tool use are input.
        let t = Usage::from_gemini(&json!({"promptTokenCount": 10, "toolUsePromptTokenCount": 5}));
        assert_eq!(t.input, 15);
    }

    #[test]
    fn a_cache_count_above_the_prompt_count_never_grows_the_total() {
        let u = Usage::from_openai(&json!({"prompt_tokens": 10, "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 50}}));
        assert_eq!(u.prompt(), 10);
        let g = Usage::from_gemini(&json!({"promptTokenCount": 10, "cachedContentTokenCount": 50}));
        assert_eq!(g.prompt(), 10);
    }
}
