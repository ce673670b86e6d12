//! Rough cost of a translation, for the numbers in reports: a Claude
//! Code-sized Anthropic request written as OpenAI, and a 200-event OpenAI
//! stream translated to Anthropic events. `cargo run --release -p
//! router-dialect --example speed [request|stream|both] [iterations]`;
//! under `valgrind --tool=callgrind`, the difference between two
//! iteration counts is the instructions per translation.

#![allow(clippy::unwrap_used, clippy::disallowed_types)]

use std::hint::black_box;
use std::time::Instant;

use router_dialect::stream::{StreamOptions, StreamTranslator};
use router_dialect::{parse_request, write_request, Dialect, WriteOptions};
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("both", String::as_str);
    let n: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let mut messages = Vec::new();
    for i in 0..20 {
        messages.push(json!({"role": "user", "content": [{"type": "text", "text": format!("question {i} ").repeat(20)}]}));
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": "answer ".repeat(40)},
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read", "input": {"path": "src/main.rs"}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": "fn main() {}\n".repeat(30)}]}));
    }
    let req = serde_json::to_vec(&json!({
        "model": "claude-sonnet-4-5", "max_tokens": 8000, "stream": true,
        "system": [{"type": "text", "text": "You are Claude Code. ".repeat(200), "cache_control": {"type": "ephemeral"}}],
        "tools": (0..15).map(|i| json!({"name": format!("tool{i}"), "description": "does things",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}})).collect::<Vec<_>>(),
        "messages": messages,
    }))
    .unwrap();
    let t0 = Instant::now();
    for _ in 0..if which == "stream" { 0 } else { n } {
        let r = parse_request(Dialect::Anthropic, black_box(&req)).unwrap();
        black_box(write_request(&r, Dialect::OpenAi, &WriteOptions::default()).unwrap());
    }
    let per = t0.elapsed() / n.max(1);
    println!(
        "request: {} bytes, Anthropic -> OpenAI in {per:?}",
        req.len()
    );

    let mut stream = String::new();
    for i in 0..200 {
        let c = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}, "finish_reason": null}]});
        stream += &format!("data: {c}\n\n");
    }
    stream += "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    let t0 = Instant::now();
    for _ in 0..if which == "request" { 0 } else { n } {
        let mut t = StreamTranslator::new(
            Dialect::OpenAi,
            Dialect::Anthropic,
            StreamOptions::default(),
        )
        .unwrap();
        let mut out = Vec::with_capacity(stream.len() * 2);
        for piece in black_box(stream.as_bytes()).chunks(512) {
            t.feed(piece, &mut out);
        }
        t.finish(&mut out);
        black_box(out);
    }
    let per = t0.elapsed() / n.max(1);
    println!(
        "stream: 202 OpenAI chunks ({} bytes) -> Anthropic events in {per:?} ({:?} per chunk)",
        stream.len(),
        per / 202
    );
}
