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

use router_json_peek::{peek_answer, peek_request, AnswerPeek, PeekError, RequestPeek, Usage};

mod cases;
mod properties;
mod speed;

/// The structs handler.rs gave serde_json (copied, names included, as
/// they show in messages): the reference.
mod reference {
    use serde::Deserialize;
    use std::borrow::Cow;

    #[derive(Deserialize, Debug)]
    pub(super) struct BodyPeek<'a> {
        #[serde(borrow, default)]
        pub(super) model: Option<Cow<'a, str>>,
        #[serde(default)]
        pub(super) stream: Option<bool>,
        #[serde(default)]
        pub(super) max_tokens: Option<u64>,
        #[serde(default)]
        pub(super) max_completion_tokens: Option<u64>,
        #[serde(default)]
        pub(super) max_output_tokens: Option<u64>,
        #[serde(default)]
        pub(super) response_format: Option<ResponseFormatPeek>,
    }

    #[derive(Deserialize, Debug)]
    pub(super) struct ResponseFormatPeek {
        #[serde(rename = "type", default)]
        pub(super) kind: String,
    }

    #[derive(Deserialize, Debug)]
    pub(super) struct AnswerPeek {
        #[serde(default)]
        pub(super) model: Option<String>,
        #[serde(default)]
        pub(super) usage: Option<Usage>,
    }

    #[derive(Deserialize, Debug)]
    pub(super) struct Usage {
        #[serde(default)]
        pub(super) prompt_tokens: Option<u64>,
        #[serde(default)]
        pub(super) completion_tokens: Option<u64>,
        #[serde(default)]
        pub(super) input_tokens: Option<u64>,
        #[serde(default)]
        pub(super) output_tokens: Option<u64>,
    }
}

/// The one case left out of the comparison: serde's derived struct
/// takes a top-level array of fields; we refuse it.
fn top_level_array(b: &[u8]) -> bool {
    b.iter()
        .find(|c| !matches!(c, b' ' | b'\n' | b'\t' | b'\r'))
        == Some(&b'[')
}

fn show(b: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(b))
}

/// Both failed: the messages should be serde_json's, except for the
/// value of a float given where an integer was expected (serde_json's
/// own float parsing is not correctly rounded; we show Rust's), and
/// what a top-level value should have been.
fn same_error(ours: &PeekError, theirs: &serde_json::Error, b: &[u8]) {
    fn float_elided(message: String) -> String {
        let message = message
            .replace("expected struct BodyPeek", "expected a JSON object")
            .replace("expected struct AnswerPeek", "expected a JSON object");
        match message.split_once("floating point `") {
            Some((head, tail)) => match tail.split_once('`') {
                Some((_, rest)) => format!("{head}floating point `_`{rest}"),
                None => message,
            },
            None => message,
        }
    }
    assert_eq!(
        float_elided(ours.to_string()),
        float_elided(theirs.to_string()),
        "body {}",
        show(b)
    );
}

/// `peek_request` against serde_json; returns ours.
fn check_request(b: &[u8]) -> std::result::Result<RequestPeek<'_>, PeekError> {
    let ours = peek_request(b);
    if top_level_array(b) {
        assert!(ours.is_err(), "top-level array accepted: {}", show(b));
        return ours;
    }
    match (&ours, serde_json::from_slice::<reference::BodyPeek<'_>>(b)) {
        (Ok(o), Ok(t)) => {
            assert_eq!(o.model.as_deref(), t.model.as_deref(), "{}", show(b));
            assert_eq!(o.stream, t.stream, "{}", show(b));
            assert_eq!(o.max_tokens, t.max_tokens, "{}", show(b));
            assert_eq!(o.max_completion_tokens, t.max_completion_tokens);
            assert_eq!(o.max_output_tokens, t.max_output_tokens);
            assert_eq!(
                o.response_format.as_ref().map(|r| &*r.kind),
                t.response_format.as_ref().map(|r| &*r.kind),
                "{}",
                show(b)
            );
            if let Some(Cow::Borrowed(m)) = &o.model {
                // Borrowed means: the very bytes of the body.
                let body = b.as_ptr_range();
                assert!(body.contains(&m.as_ptr()), "{}", show(b));
            }
        }
        (Err(o), Err(t)) => same_error(o, &t, b),
        (o, t) => panic!("body {}: ours {o:?}, serde_json {t:?}", show(b)),
    }
    ours
}

/// `peek_answer` against serde_json; returns ours.
fn check_answer(b: &[u8]) -> std::result::Result<AnswerPeek, PeekError> {
    let ours = peek_answer(b);
    if top_level_array(b) {
        assert!(ours.is_err(), "top-level array accepted: {}", show(b));
        return ours;
    }
    match (&ours, serde_json::from_slice::<reference::AnswerPeek>(b)) {
        (Ok(o), Ok(t)) => {
            assert_eq!(o.model, t.model, "{}", show(b));
            let t_usage = t.usage.map(|u| Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
            });
            assert_eq!(o.usage, t_usage, "{}", show(b));
        }
        (Err(o), Err(t)) => same_error(o, &t, b),
        (o, t) => panic!("body {}: ours {o:?}, serde_json {t:?}", show(b)),
    }
    ours
}

fn check(b: &[u8]) {
    let _ = check_request(b);
    let _ = check_answer(b);
}

const BENCH_REQUEST: &[u8] = br#"{"model":"bench","messages":[{"role":"user","content":"hi"}]}"#;

/// bench/src/backend.rs's RESPONSE_BODY.
const BENCH_ANSWER: &str = concat!(
    r#"{"id":"chatcmpl-bench-0001","object":"chat.completion","created":1700000000,"#,
    r#""model":"bench","choices":[{"index":0,"message":{"role":"assistant","#,
    r#""content":"Hello! This is a fixed answer from the benchmark backend."},"#,
    r#""logprobs":null,"finish_reason":"stop"}],"#,
    r#""usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#
);
