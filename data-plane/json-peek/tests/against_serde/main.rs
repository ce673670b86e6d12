//! `router-json-peek` against serde_json: the contract is serde_json's
//! behaviour for the structs the proxy used to deserialize, so every body
//! here goes through both and the answers are compared (fields, or error
//! message and position).
//!
//! - `cases`: hand-written bodies (fields and types, syntax, Unicode,
//!   positions, nesting, errors inside skipped values);
//! - `properties`: generated and mutated documents;
//! - `speed`: time and instruction counts against serde_json (ignored:
//!   run by hand, in release builds).

use std::borrow::Cow;

use router_json_peek::{peek_answer, peek_request, Usage};

mod cases;
mod oracle;
mod properties;
mod speed;

use oracle::{check, check_answer, check_request, reference, show};

const BENCH_REQUEST: &[u8] = br#"{"model":"bench","messages":[{"role":"user","content":"hi"}]}"#;

/// bench/src/backend.rs's RESPONSE_BODY.
const BENCH_ANSWER: &str = concat!(
    r#"{"id":"chatcmpl-bench-0001","object":"chat.completion","created":1700000000,"#,
    r#""model":"bench","choices":[{"index":0,"message":{"role":"assistant","#,
    r#""content":"Hello! This is a fixed answer from the benchmark backend."},"#,
    r#""logprobs":null,"finish_reason":"stop"}],"#,
    r#""usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#
);
