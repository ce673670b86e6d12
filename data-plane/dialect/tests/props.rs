//! Property tests: any OpenAI chunk sequence, split at any point,
//! translates to a well-formed Anthropic event sequence and back; text,
//! tool arguments and usage survive; cached tokens are never counted
//! twice. And the same for Anthropic and Gemini upstreams.

#![allow(clippy::unwrap_used)]

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use router_dialect::check::{anthropic_stream, openai_stream, Said};
use router_dialect::stream::{StreamOptions, StreamTranslator};
use router_dialect::{Dialect, Usage};
use serde_json::{json, Value};

/// Any text, quotes, backslashes, newlines and non-ASCII included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof!["(?s).{1,12}", "[a-z \"\\\\\n{}:,\u{e9}\u{1F600}]{1,12}",]
}

#[derive(Debug, Clone)]
enum Item {
    Text(Vec<String>),
    Reasoning(Vec<String>),
    Tool { name: String, args: Vec<String> },
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        vec(text(), 1..4).prop_map(Item::Text),
        vec(text(), 1..4).prop_map(Item::Reasoning),
        ("[a-zA-Z_][a-zA-Z0-9_]{0,9}", vec(text(), 0..4))
            .prop_map(|(name, args)| Item::Tool { name, args }),
    ]
}

/// (prompt tokens, of which cached, completion tokens).
fn openai_usage() -> impl Strategy<Value = (u64, u64, u64)> {
    (0u64..2_000_000).prop_flat_map(|p| (Just(p), 0..=p, 0u64..200_000))
}

fn finish() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("stop"),
        Just("length"),
        Just("tool_calls"),
        Just("content_filter")
    ]
}

fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

/// An OpenAI stream of `items`, and what it says.
fn openai_stream_of(items: &[Item], finish: &str, (p, k, c): (u64, u64, u64)) -> (String, Said) {
    let mut s = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    let mut said = Said::default();
    let mut tool = 0u64;
    for it in items {
        match it {
            Item::Text(frags) => {
                for f in frags {
                    s += &chunk(json!({"content": f}), Value::Null);
                    said.text += f;
                }
            }
            Item::Reasoning(frags) => {
                for f in frags {
                    s += &chunk(json!({"reasoning_content": f}), Value::Null);
                    said.thinking += f;
                }
            }
            Item::Tool { name, args } => {
                let id = format!("call_{tool}");
                s += &chunk(
                    json!({"tool_calls": [{"index": tool, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""}}]}),
                    Value::Null,
                );
                for a in args {
                    s += &chunk(
                        json!({"tool_calls": [{"index": tool, "function": {"arguments": a}}]}),
                        Value::Null,
                    );
                }
                said.tools.push((id, name.clone(), args.concat()));
                tool += 1;
            }
        }
    }
    s += &chunk(json!({}), json!(finish));
    let usage = json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": k}});
    s += &format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": usage})
    );
    s += "data: [DONE]\n\n";
    said.stop_reason = Some(finish.to_owned());
    said.usage = Some(Usage::from_openai(&usage));
    (s, said)
}

/// Translates `bytes`, fed in pieces cut at `cuts`, then ends the stream.
fn run(from: Dialect, to: Dialect, bytes: &[u8], cuts: &[Index], include_usage: bool) -> Vec<u8> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    let mut t = StreamTranslator::new(
        from,
        to,
        StreamOptions {
            include_usage,
            ..StreamOptions::default()
        },
    )
    .unwrap();
    let mut out = Vec::new();
    for w in at.windows(2) {
        t.feed(&bytes[w[0]..w[1]], &mut out);
    }
    t.finish(&mut out);
    out
}

fn anthropic_stop(finish: &str) -> &'static str {
    match finish {
        "stop" => "end_turn",
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ => "refusal",
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn openai_chunks_to_anthropic_events_and_back_keep_text_tools_and_usage(
        items in vec(item(), 0..8),
        finish in finish(),
        usage in openai_usage(),
        cuts in vec(any::<Index>(), 0..12),
        back_cuts in vec(any::<Index>(), 0..12),
    ) {
        let (stream, expect) = openai_stream_of(&items, finish, usage);
        let anth = run(Dialect::OpenAi, Dialect::Anthropic, stream.as_bytes(), &cuts, false);
        let said = anthropic_stream(&anth).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(said.error.is_none(), "{:?}", said.error);
        prop_assert_eq!(&said.text, &expect.text);
        prop_assert_eq!(&said.thinking, &expect.thinking);
        prop_assert_eq!(&said.tools, &expect.tools);
        prop_assert_eq!(said.stop_reason.as_deref(), Some(anthropic_stop(finish)));
        let (p, k, c) = usage;
        let u = said.usage.unwrap();
        // Anthropic's input excludes the cached tokens: each counted once.
        prop_assert_eq!(u, Usage { input: p - k, output: c, cache_read: k, cache_write: 0 });
        prop_assert_eq!(u.input + u.cache_read + u.cache_write, p);

        let back = run(Dialect::Anthropic, Dialect::OpenAi, &anth, &back_cuts, true);
        let again = openai_stream(&back).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(again.error.is_none());
        prop_assert_eq!(&again.text, &expect.text);
        prop_assert_eq!(&again.thinking, &expect.thinking);
        prop_assert_eq!(&again.tools, &expect.tools);
        prop_assert_eq!(again.stop_reason.as_deref(), Some(finish));
        // prompt_tokens includes cached_tokens again: the same numbers.
        prop_assert_eq!(again.usage, expect.usage);
    }
}

/// One arbitrary upstream event, well-formed or not.
fn wild_event() -> impl Strategy<Value = String> {
    let idx = 0u64..3;
    prop_oneof![
        Just(chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null
        )),
        text().prop_map(|t| chunk(json!({"content": t}), Value::Null)),
        text().prop_map(|t| chunk(json!({"reasoning_content": t}), Value::Null)),
        text().prop_map(|t| chunk(json!({"refusal": t}), Value::Null)),
        (
            idx.clone(),
            proptest::option::of("[a-z]{1,4}"),
            proptest::option::of("[a-z]{1,4}"),
            text()
        )
            .prop_map(|(i, id, name, args)| {
                let mut tc = json!({"index": i, "function": {"arguments": args}});
                if let Some(id) = id {
                    tc["id"] = id.into();
                    tc["type"] = "function".into();
                }
                if let Some(n) = name {
                    tc["function"]["name"] = n.into();
                }
                chunk(json!({"tool_calls": [tc]}), Value::Null)
            }),
        prop_oneof![
            Just("stop"),
            Just("length"),
            Just("tool_calls"),
            Just("weird")
        ]
        .prop_map(|f| chunk(json!({}), json!(f))),
        (0u64..1000, 0u64..2000).prop_map(|(p, k)| format!(
            "data: {}\n\n",
            json!({"object": "chat.completion.chunk",
            "choices": [], "usage": {"prompt_tokens": p, "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": k}}})
        )),
        Just("data: {\"error\":{\"message\":\"boom\"}}\n\n".to_owned()),
        Just("event: error\ndata: {\"message\":\"x\"}\n\n".to_owned()),
        Just("data: {oops\n\n".to_owned()),
        Just(": keep-alive\n\n".to_owned()),
        Just("data: [DONE]\n\n".to_owned()),
        Just(chunk(json!({"content": "x"}), Value::Null).replace("\"index\":0", "\"index\":1")),
        Just("data: {\"choices\":null}\n\n".to_owned()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever the upstream sends, however cut, the client gets a
    /// well-formed stream: complete, or ended by one error event.
    #[test]
    fn any_openai_chunk_sequence_gives_a_well_formed_stream(
        events in vec(wild_event(), 0..16),
        truncate in any::<Index>(),
        cut_short in any::<bool>(),
        cuts in vec(any::<Index>(), 0..8),
    ) {
        let all = events.concat();
        let bytes = if cut_short { &all.as_bytes()[..truncate.index(all.len() + 1)] } else { all.as_bytes() };
        let a = run(Dialect::OpenAi, Dialect::Anthropic, bytes, &cuts, false);
        anthropic_stream(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let o = run(Dialect::OpenAi, Dialect::OpenAi, bytes, &cuts, true);
        openai_stream(&o).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // And the Anthropic stream read back as OpenAI is well-formed too.
        let back = run(Dialect::Anthropic, Dialect::OpenAi, &a, &cuts, true);
        openai_stream(&back).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

#[derive(Debug, Clone)]
enum Block {
    Text(Vec<String>),
    Thinking(Vec<String>, String),
    Tool(String, Vec<String>),
}

fn block() -> impl Strategy<Value = Block> {
    prop_oneof![
        vec(text(), 1..4).prop_map(Block::Text),
        (vec(text(), 0..3), "[A-Za-z0-9+/]{4,16}").prop_map(|(t, s)| Block::Thinking(t, s)),
        ("[a-z_]{1,8}", vec(text(), 0..4)).prop_map(|(n, a)| Block::Tool(n, a)),
    ]
}

fn event(name: &str, v: Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// An Anthropic stream (usage in message_start, cumulative usage in
    /// message_delta) to OpenAI and back keeps content and usage.
    #[test]
    fn anthropic_events_to_openai_chunks_and_back_keep_text_tools_and_usage(
        blocks in vec(block(), 0..6),
        (input, read, write) in (0u64..100_000, 0u64..100_000, 0u64..100_000),
        outputs in vec(0u64..50_000, 1..3),
        cuts in vec(any::<Index>(), 0..10),
    ) {
        let start_usage = json!({"input_tokens": input, "cache_read_input_tokens": read,
            "cache_creation_input_tokens": write, "output_tokens": 1});
        let mut s = event("message_start", json!({"type": "message_start", "message": {"id": "msg_p",
            "type": "message", "role": "assistant", "model": "claude", "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": start_usage}}));
        let (mut text, mut thinking, mut tools) = (String::new(), String::new(), Vec::new());
        for (i, b) in blocks.iter().enumerate() {
            let (start, deltas): (Value, Vec<Value>) = match b {
                Block::Text(t) => {
                    text += &t.concat();
                    (json!({"type": "text", "text": ""}),
                     t.iter().map(|f| json!({"type": "text_delta", "text": f})).collect())
                }
                Block::Thinking(t, sig) => {
                    thinking += &t.concat();
                    let mut d: Vec<Value> = t.iter().map(|f| json!({"type": "thinking_delta", "thinking": f})).collect();
                    d.push(json!({"type": "signature_delta", "signature": sig}));
                    (json!({"type": "thinking", "thinking": "", "signature": ""}), d)
                }
                Block::Tool(n, a) => {
                    let id = format!("toolu_{i}");
                    tools.push((id.clone(), n.clone(), a.concat()));
                    (json!({"type": "tool_use", "id": id, "name": n, "input": {}}),
                     a.iter().map(|f| json!({"type": "input_json_delta", "partial_json": f})).collect())
                }
            };
            s += &event("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": start}));
            for d in deltas {
                s += &event("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": d}));
            }
            s += &event("content_block_stop", json!({"type": "content_block_stop", "index": i}));
        }
        // Cumulative: each message_delta restates the total so far.
        for (j, o) in outputs.iter().enumerate() {
            let stop = if j + 1 == outputs.len() { json!("end_turn") } else { Value::Null };
            s += &event("message_delta", json!({"type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": o}}));
        }
        s += &event("message_stop", json!({"type": "message_stop"}));
        let last = *outputs.last().unwrap();

        let o = run(Dialect::Anthropic, Dialect::OpenAi, s.as_bytes(), &cuts, true);
        let said = openai_stream(&o).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(said.error.is_none());
        prop_assert_eq!(&said.text, &text);
        prop_assert_eq!(&said.thinking, &thinking);
        prop_assert_eq!(&said.tools, &tools);
        let u = said.usage.unwrap();
        // Every prompt token once; the output is the last cumulative count.
        prop_assert_eq!(u.prompt(), input + read + write);
        prop_assert_eq!(u.cache_read, read);
        prop_assert_eq!(u.output, last);

        let a = run(Dialect::Anthropic, Dialect::Anthropic, s.as_bytes(), &cuts, false);
        let same = anthropic_stream(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(same.usage, Some(Usage { input, output: last, cache_read: read, cache_write: write }));
        prop_assert_eq!(&same.tools, &tools);
        prop_assert_eq!(&same.text, &text);
    }

    /// Gemini chunks, split anywhere, give well-formed streams to both
    /// client dialects with the same content.
    #[test]
    fn gemini_chunks_give_well_formed_streams(
        parts in vec(prop_oneof![
            text().prop_map(|t| json!({"text": t})),
            text().prop_map(|t| json!({"text": t, "thought": true})),
            ("[a-z]{1,6}", proptest::option::of("[A-Za-z0-9+/]{4,12}={0,2}"), 0u64..1000).prop_map(|(n, sig, x)| {
                let mut p = json!({"functionCall": {"name": n, "args": {"x": x}}});
                if let Some(s) = sig { p["thoughtSignature"] = s.into(); }
                p
            }),
        ], 0..8),
        (prompt, cached, out) in (0u64..10_000).prop_flat_map(|p| (Just(p), 0..=p, 0u64..10_000)),
        finish in prop_oneof![Just("STOP"), Just("MAX_TOKENS"), Just("SAFETY")],
        cuts in vec(any::<Index>(), 0..10),
    ) {
        let mut s = String::new();
        let n = parts.len();
        for (i, p) in parts.iter().enumerate() {
            let mut c = json!({"candidates": [{"content": {"role": "model", "parts": [p]}, "index": 0}],
                "responseId": "r", "modelVersion": "g"});
            if i + 1 == n {
                c["candidates"][0]["finishReason"] = finish.into();
                c["usageMetadata"] = json!({"promptTokenCount": prompt, "cachedContentTokenCount": cached,
                    "candidatesTokenCount": out, "totalTokenCount": prompt + out});
            }
            s += &format!("data: {c}\n\n");
        }
        let a = run(Dialect::Gemini, Dialect::Anthropic, s.as_bytes(), &cuts, false);
        let said_a = anthropic_stream(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let o = run(Dialect::Gemini, Dialect::OpenAi, s.as_bytes(), &cuts, true);
        let said_o = openai_stream(&o).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if n == 0 {
            // Nothing at all: a cut, for both.
            prop_assert!(said_a.error.is_some() && said_o.error.is_some());
        } else {
            prop_assert!(said_a.error.is_none(), "{:?}", said_a.error);
            prop_assert_eq!(&said_a.text, &said_o.text);
            prop_assert_eq!(&said_a.tools, &said_o.tools);
            let u = said_a.usage.unwrap();
            prop_assert_eq!(u.input + u.cache_read + u.cache_write, prompt);
            prop_assert_eq!(said_o.usage.unwrap().prompt(), prompt);
        }
    }

    /// Usage through every pair of dialects: the prompt and the total are
    /// never grown, cached tokens never counted twice.
    #[test]
    fn cached_tokens_are_never_counted_twice(
        input in 0u64..1_000_000, output in 0u64..1_000_000,
        read in 0u64..1_000_000, write in 0u64..1_000_000,
    ) {
        let u = Usage { input, output, cache_read: read, cache_write: write };
        let via_openai = Usage::from_openai(&u.to_openai());
        let via_gemini = Usage::from_gemini(&u.to_gemini());
        let via_anthropic = Usage::from_anthropic(&u.to_anthropic());
        prop_assert_eq!(via_anthropic, u);
        for v in [via_openai, via_gemini] {
            prop_assert_eq!(v.prompt(), u.prompt());
            prop_assert_eq!(v.total(), u.total());
            prop_assert_eq!(v.cache_read, read);
        }
        // OpenAI's and Gemini's own numbers survive exactly.
        prop_assert_eq!(Usage::from_openai(&via_openai.to_openai()), via_openai);
        prop_assert_eq!(Usage::from_gemini(&via_gemini.to_gemini()), via_gemini);
    }
}
