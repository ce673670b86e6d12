//! Anthropic's prompt caching, as its API reference describes it from
//! outside: a request marks cache breakpoints with `cache_control` on a
//! tool, a system block or a message's content block; the prompt up to
//! the last breakpoint (tools, then system, then messages, in that order)
//! is the cacheable prefix. The first request with a prefix writes it
//! (`cache_creation_input_tokens`), later ones with the same prefix read
//! it (`cache_read_input_tokens`); `input_tokens` is only what comes after
//! the breakpoint. The counts are the mock's (bytes / 4), the rules
//! Anthropic's; entries do not expire (the mock's runs are short), and at
//! most [`CAPACITY`] prefixes are kept, the oldest forgotten first.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

use serde_json::Value;

/// Prefixes kept.
const CAPACITY: usize = 256;

/// The mock's prompt cache: hashes of the prefixes written.
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    prefixes: VecDeque<u64>,
}

/// A request's prompt tokens, split as Anthropic reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheUsage {
    /// After the last breakpoint.
    pub(crate) input: u64,
    pub(crate) cache_read: u64,
    pub(crate) cache_write: u64,
}

impl PromptCache {
    /// The split of `prompt_tokens` for `request` (an Anthropic Messages
    /// body), writing its prefix when it is new.
    pub(crate) fn usage(&mut self, request: Option<&Value>, prompt_tokens: u64) -> CacheUsage {
        let Some((hash, prefix_bytes)) = request.and_then(cacheable_prefix) else {
            return CacheUsage {
                input: prompt_tokens,
                ..CacheUsage::default()
            };
        };
        let cached = (prefix_bytes as u64).div_ceil(4).min(prompt_tokens);
        let input = prompt_tokens - cached;
        if self.prefixes.contains(&hash) {
            return CacheUsage {
                input,
                cache_read: cached,
                cache_write: 0,
            };
        }
        if self.prefixes.len() == CAPACITY {
            self.prefixes.pop_front();
        }
        self.prefixes.push_back(hash);
        CacheUsage {
            input,
            cache_read: 0,
            cache_write: cached,
        }
    }
}

/// The hash and length (bytes, as JSON) of the prompt up to its last
/// `cache_control` breakpoint, if it has one.
fn cacheable_prefix(request: &Value) -> Option<(u64, usize)> {
    // The prompt's parts in cache order, each a list of blocks.
    let mut blocks: Vec<&Value> = Vec::new();
    if let Some(tools) = request.get("tools").and_then(Value::as_array) {
        blocks.extend(tools);
    }
    match request.get("system") {
        Some(Value::Array(system)) => blocks.extend(system),
        Some(s @ Value::String(_)) => blocks.push(s),
        _ => {}
    }
    for m in request
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match m.get("content") {
            Some(Value::Array(content)) => blocks.extend(content),
            Some(c) => blocks.push(c),
            None => {}
        }
    }
    let last = blocks
        .iter()
        .rposition(|b| b.get("cache_control").is_some())?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut bytes = 0;
    for b in &blocks[..=last] {
        let text = b.to_string();
        bytes += text.len();
        text.hash(&mut hasher);
    }
    Some((hasher.finish(), bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_prefix_is_written_once_then_read() {
        let mut cache = PromptCache::default();
        let turn = |n: usize| {
            let mut messages = vec![json!({"role": "user", "content": "first question"})];
            for i in 1..n {
                messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
                messages.push(json!({"role": "user", "content": format!("question {i}")}));
            }
            json!({
                "system": [{"type": "text", "text": "You are a coding agent. ".repeat(40),
                            "cache_control": {"type": "ephemeral"}}],
                "messages": messages,
            })
        };
        let first = cache.usage(Some(&turn(1)), 1000);
        assert!(first.cache_write > 200, "{first:?}");
        assert_eq!(first.cache_read, 0);
        assert_eq!(first.input + first.cache_write, 1000);
        let second = cache.usage(Some(&turn(2)), 1100);
        assert_eq!(second.cache_read, first.cache_write);
        assert_eq!(second.cache_write, 0);
        // No breakpoint: nothing cached.
        let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(
            cache.usage(Some(&plain), 5),
            CacheUsage {
                input: 5,
                ..CacheUsage::default()
            }
        );
    }
}
