//! `prefix-cost`: what longest-prefix affinity adds per request and per
//! endpoint (issue 31), for `bench/prefix-cost.sh`.
//!
//! `--part parse|chain|score|all --requests N --prompt-kib K` runs N
//! requests' worth of one part of the work on a chat prompt of about K KiB
//! (a system prompt shared by the conversations, then a growing history),
//! against 4 endpoints whose indexes are full (65,536 tokens each): `parse`
//! reads the prompt's text out of the JSON body
//! (`router_policy::prefix_cache::prompt_text`), `chain` hashes it into
//! blocks (`block_chain`), `score` matches the chain on every endpoint,
//! picks (`engine_aware::pick`) and records it where it went. The script
//! runs each under callgrind at two request counts and divides the
//! difference, so set-up is not counted.
//!
//! `--memory` prints the resident bytes one full index takes (64 indexes
//! filled, the process's RSS before and after).

use clap::Parser;
use router_policy::affinity::Ring;
use router_policy::balance::EndpointLoad;
use router_policy::engine_aware::{
    self, EngineAware, EngineLoad, EngineSignals, PrefixAffinity, PrefixMatch,
};
use router_policy::prefix_cache::{block_chain, prompt_text, BlockIndex};

#[derive(Parser)]
struct Args {
    /// parse, chain, score or all.
    #[arg(long, default_value = "all")]
    part: String,
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// The prompt's size, KiB.
    #[arg(long, default_value_t = 10)]
    prompt_kib: usize,
    /// Measure the memory of a full index instead.
    #[arg(long)]
    memory: bool,
}

/// A conversation's turn `turn` of conversation `conv`: a shared system
/// prompt of a quarter of the size, then the history.
fn body(conv: usize, turn: usize, kib: usize) -> Vec<u8> {
    let system = "You are a careful assistant. Answer briefly. ".repeat(kib * 1024 / 4 / 45 + 1);
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    let per_turn = (kib * 1024 * 3 / 4) / (turn + 1);
    for t in 0..=turn {
        let text = format!("conversation {conv} turn {t}: ").repeat(per_turn / 24 + 1);
        messages.push(serde_json::json!({"role": "user", "content": text}));
        if t < turn {
            messages
                .push(serde_json::json!({"role": "assistant", "content": "noted. ".repeat(40)}));
        }
    }
    serde_json::json!({"model": "m", "stream": true, "max_tokens": 200, "messages": messages})
        .to_string()
        .into_bytes()
}

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let args = Args::parse();
    let affinity = PrefixAffinity::default();
    let capacity = affinity.index_blocks(None);
    if args.memory {
        let before = rss_bytes();
        let mut indexes = Vec::new();
        for i in 0..64u64 {
            let mut index = BlockIndex::new(capacity);
            // Chains of 64 blocks until full, some shared.
            for c in 0..(capacity as u64 / 32) {
                let chain: Vec<u64> = (0..64u64)
                    .map(|b| (i << 40) ^ (c << 20) ^ b ^ 0x9e37_79b9_7f4a_7c15)
                    .collect();
                index.record(&chain);
            }
            assert_eq!(index.len(), capacity);
            indexes.push(index);
        }
        let after = rss_bytes();
        let per_index = (after - before) / indexes.len();
        println!(
            "index capacity {capacity} blocks ({} tokens): {per_index} bytes resident per endpoint, {:.1} per block",
            router_policy::engine_aware::DEFAULT_CACHE_TOKENS,
            per_index as f64 / capacity as f64
        );
        return;
    }
    let names = [
        "http://10.0.0.1:8000",
        "http://10.0.0.2:8000",
        "http://10.0.0.3:8000",
        "http://10.0.0.4:8000",
    ];
    let ring = Ring::new(&names);
    let settings = EngineAware {
        affinity: Some(affinity),
        ..EngineAware::default()
    };
    let loads: Vec<EngineLoad> = (0..4)
        .map(|i| EngineLoad {
            base: EndpointLoad {
                ewma: None,
                in_flight: i,
                max_concurrency: None,
                available: true,
                preferred: false,
            },
            signals: Some(EngineSignals {
                waiting: Some(0),
                running: Some(4),
                kv_usage: Some(0.4),
            }),
            in_flight_at_scrape: i,
            peer_sent: 0,
            unit: Some(0.00025),
            pending_prefill_tokens: 1000,
        })
        .collect();
    // Full indexes: 64 conversations' turns spread over the endpoints.
    let mut indexes: Vec<BlockIndex> = (0..4).map(|_| BlockIndex::new(capacity)).collect();
    let bodies: Vec<Vec<u8>> = (0..64)
        .map(|c| body(c, 1 + c % 4, args.prompt_kib))
        .collect();
    let chains: Vec<Vec<u64>> = bodies
        .iter()
        .map(|b| {
            let text = prompt_text(b).unwrap_or_default();
            block_chain(&text, affinity.block_bytes, affinity.max_blocks)
        })
        .collect();
    for round in 0..(capacity / 8).max(1) {
        let c = &chains[round % chains.len()];
        indexes[round % 4].record(c);
    }
    let mut matched = vec![0usize; 4];
    let mut sink = 0usize;
    for r in 0..args.requests {
        let body = &bodies[r % bodies.len()];
        match args.part.as_str() {
            "parse" => sink += prompt_text(body).map_or(0, |t| t.len()),
            "chain" => {
                let text = prompt_text(body).unwrap_or_default();
                sink += block_chain(&text, affinity.block_bytes, affinity.max_blocks).len();
            }
            "score" | "all" => {
                let owned;
                let chain = if args.part == "all" {
                    let text = prompt_text(body).unwrap_or_default();
                    owned = block_chain(&text, affinity.block_bytes, affinity.max_blocks);
                    &owned
                } else {
                    &chains[r % chains.len()]
                };
                for (m, index) in matched.iter_mut().zip(&indexes) {
                    *m = index.matched(chain);
                }
                let pm = PrefixMatch {
                    ring: &ring,
                    anchor: chain.first().copied().unwrap_or(0),
                    matched_blocks: &matched,
                    block_tokens: affinity.block_tokens(),
                    prompt_tokens: (body.len() / 4) as u64,
                };
                if let Some(p) = engine_aware::pick(&loads, &settings, Some(pm), r) {
                    indexes[p.endpoint].record(chain);
                    sink += p.endpoint;
                }
            }
            other => {
                eprintln!("unknown part {other:?}: parse, chain, score or all");
                std::process::exit(2);
            }
        }
    }
    println!("{} requests, {sink}", args.requests);
}
