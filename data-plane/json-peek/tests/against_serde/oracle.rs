//! The oracle: `peek_request` and `peek_answer` against serde_json on the
//! same bytes (fields, or error message and position).
//!
//! One copy, used by two crates: this test (`mod oracle` in `main.rs`) and
//! the fuzz targets' library `router-fuzz` (`fuzz/src/lib.rs` includes
//! this file by path), so the fuzzer checks exactly what the tests check.
//! It only needs `router_json_peek`, `serde` (derive) and `serde_json`.

use std::borrow::Cow;

use router_json_peek::{
    peek_answer, peek_request, AnswerPeek, PeekError, RequestPeek, Usage, UsageDetails,
};

/// The structs handler.rs gave serde_json (copied, names included, as
/// they show in messages): the reference.
pub(crate) mod reference {
    use serde::Deserialize;
    use std::borrow::Cow;

    #[derive(Deserialize, Debug)]
    pub(crate) struct BodyPeek<'a> {
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
    pub(crate) struct AnswerPeek {
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
        #[serde(default)]
        pub(super) prompt_tokens_details: Option<UsageDetails>,
        #[serde(default)]
        pub(super) input_tokens_details: Option<UsageDetails>,
        #[serde(default)]
        pub(super) cache_read_input_tokens: Option<u64>,
        #[serde(default)]
        pub(super) cache_creation_input_tokens: Option<u64>,
    }

    #[derive(Deserialize, Debug)]
    pub(super) struct UsageDetails {
        #[serde(default)]
        pub(super) cached_tokens: Option<u64>,
    }
}

/// The one case left out of the comparison: serde's derived struct
/// takes a top-level array of fields; we refuse it.
fn top_level_array(b: &[u8]) -> bool {
    b.iter()
        .find(|c| !matches!(c, b' ' | b'\n' | b'\t' | b'\r'))
        == Some(&b'[')
}

pub(crate) fn show(b: &[u8]) -> String {
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
pub(crate) fn check_request(b: &[u8]) -> std::result::Result<RequestPeek<'_>, PeekError> {
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
pub(crate) fn check_answer(b: &[u8]) -> std::result::Result<AnswerPeek, PeekError> {
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
                prompt_tokens_details: u.prompt_tokens_details.map(|d| UsageDetails {
                    cached_tokens: d.cached_tokens,
                }),
                input_tokens_details: u.input_tokens_details.map(|d| UsageDetails {
                    cached_tokens: d.cached_tokens,
                }),
                cache_read_input_tokens: u.cache_read_input_tokens,
                cache_creation_input_tokens: u.cache_creation_input_tokens,
            });
            assert_eq!(o.usage, t_usage, "{}", show(b));
        }
        (Err(o), Err(t)) => same_error(o, &t, b),
        (o, t) => panic!("body {}: ours {o:?}, serde_json {t:?}", show(b)),
    }
    ours
}

/// Both readers on `b`, each against serde_json.
pub(crate) fn check(b: &[u8]) {
    let _ = check_request(b);
    let _ = check_answer(b);
}
