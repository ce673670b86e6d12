//! [`Behavior::Gemini`](crate::Behavior::Gemini): Google's Gemini API as
//! its public reference describes it, for the router's `provider: gemini`
//! pools.
//!
//! - `POST /v1beta/models/{model}:generateContent` answers one
//!   `GenerateContentResponse` (`candidates[0].content.parts`,
//!   `finishReason`, `usageMetadata`, `modelVersion`, `responseId`);
//!   `POST /v1beta/models/{model}:streamGenerateContent?alt=sse` streams
//!   one as server-sent events, `data: {chunk}` separated by `\r\n\r\n`
//!   as Google's servers do, with no end marker: the last chunk carries
//!   `finishReason` and the whole usage. Without `alt=sse` Gemini streams
//!   a JSON array, which the mock does not: 400.
//! - Replies as [`Behavior::Chat`](crate::Behavior::Chat) does: `echo:
//!   TEXT` (TEXT the last user content's text), a `functionCall` of the
//!   first declared function with `{"text": TEXT}` when the request
//!   declares functions, `tool said: OUTPUT` after a `functionResponse`.
//! - A function call carries a `thoughtSignature` (as Gemini 3 models'
//!   do), and a request whose earlier `model` turn has a `functionCall`
//!   without the signature the mock gave it is refused with 400
//!   `INVALID_ARGUMENT`, as Gemini 3 refuses it.
//! - Usage: the body's bytes / 4 as `promptTokenCount`, half of it as
//!   `cachedContentTokenCount` (inside the prompt count, as Gemini counts
//!   it), one `candidatesTokenCount` per piece; with
//!   `generationConfig.thinkingConfig.includeThoughts` a thought part
//!   first and [`THOUGHT_TOKENS`] `thoughtsTokenCount`.
//! - Errors in Gemini's shape: `{"error": {"code", "message", "status"}}`
//!   with Google's canonical status (`429 RESOURCE_EXHAUSTED`, `503
//!   UNAVAILABLE`, ...), also for [`Behavior::Status`](crate::Behavior::Status)
//!   and [`Behavior::RateLimited`](crate::Behavior::RateLimited) on a
//!   Gemini path; [`Behavior::Stream`](crate::Behavior::Stream) on a
//!   Gemini path streams Gemini chunks by its script, its error ending
//!   being such an error object in the stream.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::{StreamEnding, StreamScript};

/// The path prefix of Gemini's model calls.
const MODELS_PREFIX: &str = "/v1beta/models/";

/// Thought tokens reported when thoughts are asked for.
pub const THOUGHT_TOKENS: u64 = 4;

/// A Gemini model call: the model, and whether it streams (and asked for
/// SSE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) model: String,
    pub(crate) stream: bool,
    pub(crate) sse: bool,
}

/// The Gemini call `path` (with its query) names, if it is one.
pub(crate) fn call_of(path_and_query: &str) -> Option<Call> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let (model, method) = path.strip_prefix(MODELS_PREFIX)?.rsplit_once(':')?;
    let stream = match method {
        "generateContent" => false,
        "streamGenerateContent" => true,
        _ => return None,
    };
    Some(Call {
        model: model.to_owned(),
        stream,
        sse: query.split('&').any(|kv| kv == "alt=sse"),
    })
}

/// Google's canonical status name of an HTTP status.
fn status_name(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        500..=599 => "INTERNAL",
        _ => "INVALID_ARGUMENT",
    }
}

/// A Gemini error body.
pub(crate) fn error_body(status: u16, message: &str) -> Value {
    json!({"error": {"code": status, "message": message, "status": status_name(status)}})
}

/// The thought signature the mock gives a call of `name`: standard base64
/// (with `+` and `/`, padded), so that a carrier that mangles it is seen.
pub fn signature_for(name: &str) -> String {
    let mut s = String::from("Zm9v+/");
    for b in name.bytes() {
        s.push_str(&format!("{b:02x}"));
    }
    if s.len() % 4 == 2 {
        s.push_str("==");
    }
    s
}

/// What the mock answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Text, in pieces (a stream sends one per chunk).
    Text(Vec<String>),
    /// A call of this function with these arguments.
    Call { name: String, args: Value },
}

impl Reply {
    fn tokens(&self) -> u64 {
        match self {
            Self::Text(pieces) => pieces.len() as u64,
            Self::Call { .. } => 3,
        }
    }
}

fn parts_of(content: &Value) -> &[Value] {
    content
        .get("parts")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// What Gemini 3 refuses ([`check`]), in its words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// A `functionCall` of an earlier `model` turn without the
    /// `thoughtSignature` it came with (or with another one).
    #[error("Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call `{name}` , position {position}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details.")]
    MissingSignature {
        /// The function called.
        name: String,
        /// Where, as Gemini counts it (content * 100 + part).
        position: usize,
    },
}

/// Refuses what Gemini 3 refuses: a `functionCall` of an earlier `model`
/// turn without the `thoughtSignature` it came with.
pub(crate) fn check(json: Option<&Value>) -> Result<(), Refusal> {
    let contents = json
        .and_then(|j| j.get("contents"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, c) in contents.iter().enumerate() {
        if c.get("role").and_then(Value::as_str) != Some("model") {
            continue;
        }
        for (j, p) in parts_of(c).iter().enumerate() {
            let Some(name) = p
                .get("functionCall")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            else {
                continue;
            };
            let sig = p.get("thoughtSignature").and_then(Value::as_str);
            if sig != Some(signature_for(name).as_str()) {
                return Err(Refusal::MissingSignature {
                    name: name.to_string(),
                    position: i * 100 + j,
                });
            }
        }
    }
    Ok(())
}

/// The reply to the request `json`.
pub(crate) fn reply(json: Option<&Value>) -> Reply {
    let contents = json
        .and_then(|j| j.get("contents"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let text_of = |c: &Value| -> String {
        parts_of(c)
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect()
    };
    if let Some(last) = contents.last() {
        let response = parts_of(last)
            .iter()
            .find_map(|p| p.get("functionResponse"))
            .and_then(|f| f.get("response"));
        if let Some(r) = response {
            let said = match r.get("output").and_then(Value::as_str) {
                Some(s) => s.to_owned(),
                None => r.to_string(),
            };
            return Reply::Text(vec!["tool said: ".into(), said]);
        }
    }
    let user_text = contents
        .iter()
        .rev()
        .find(|c| c.get("role").and_then(Value::as_str) != Some("model"))
        .map(text_of)
        .unwrap_or_default();
    let first_function = json
        .and_then(|j| j.get("tools"))
        .and_then(Value::as_array)
        .and_then(|t| t.iter().find_map(|t| t.get("functionDeclarations")))
        .and_then(Value::as_array)
        .and_then(|d| d.first())
        .and_then(|d| d.get("name"))
        .and_then(Value::as_str);
    if let Some(name) = first_function {
        return Reply::Call {
            name: name.to_owned(),
            args: json!({ "text": user_text }),
        };
    }
    Reply::Text(vec!["echo: ".into(), user_text])
}

/// Whether the request asks for thoughts.
pub(crate) fn wants_thoughts(json: Option<&Value>) -> bool {
    json.and_then(|j| j.get("generationConfig"))
        .and_then(|g| g.get("thinkingConfig"))
        .and_then(|t| t.get("includeThoughts"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `usageMetadata` for a prompt of `prompt` tokens and `output` candidate
/// tokens (half the prompt read from the cache, inside the prompt count).
fn usage(prompt: u64, output: u64, thoughts: bool) -> Value {
    let thoughts = if thoughts { THOUGHT_TOKENS } else { 0 };
    let mut u = json!({
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "cachedContentTokenCount": prompt / 2,
        "totalTokenCount": prompt + output + thoughts,
    });
    if thoughts > 0 {
        u["thoughtsTokenCount"] = json!(thoughts);
    }
    u
}

fn call_part(name: &str, args: &Value) -> Value {
    json!({"functionCall": {"name": name, "args": args}, "thoughtSignature": signature_for(name)})
}

fn thought_part() -> Value {
    json!({"text": "Thinking it over.", "thought": true})
}

/// The unstreamed answer.
pub(crate) fn answer(n: u64, model: &str, reply: &Reply, prompt: u64, thoughts: bool) -> Value {
    let mut parts = Vec::new();
    if thoughts {
        parts.push(thought_part());
    }
    match reply {
        Reply::Text(pieces) => parts.push(json!({"text": pieces.concat()})),
        Reply::Call { name, args } => parts.push(call_part(name, args)),
    }
    json!({
        "candidates": [{
            "content": {"parts": parts, "role": "model"},
            "finishReason": "STOP",
            "index": 0,
        }],
        "usageMetadata": usage(prompt, reply.tokens(), thoughts),
        "modelVersion": model,
        "responseId": format!("gemini-{n}"),
    })
}

fn frame(chunk: &Value) -> Bytes {
    Bytes::from(format!("data: {chunk}\r\n\r\n"))
}

fn chunk(n: u64, model: &str, parts: Vec<Value>, finish: Option<&str>, usage: Value) -> Value {
    let mut candidate = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
    if let Some(f) = finish {
        candidate["finishReason"] = json!(f);
    }
    json!({
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": format!("gemini-{n}"),
    })
}

/// The streamed answer: a thought chunk when asked, one chunk per piece
/// (a call whole, in one), the last with `finishReason: STOP`; each with
/// the usage so far (the prompt count from the first).
pub(crate) fn frames(
    n: u64,
    model: &str,
    reply: &Reply,
    prompt: u64,
    thoughts: bool,
) -> VecDeque<(Duration, Bytes)> {
    let mut frames = VecDeque::new();
    let mut done = 0;
    if thoughts {
        let u = json!({"promptTokenCount": prompt, "thoughtsTokenCount": THOUGHT_TOKENS,
            "totalTokenCount": prompt + THOUGHT_TOKENS});
        frames.push_back((
            Duration::ZERO,
            frame(&chunk(n, model, vec![thought_part()], None, u)),
        ));
    }
    let pieces: Vec<Value> = match reply {
        Reply::Text(pieces) => pieces.iter().map(|p| json!({ "text": p })).collect(),
        Reply::Call { name, args } => vec![call_part(name, args)],
    };
    let last = pieces.len().saturating_sub(1);
    for (i, part) in pieces.into_iter().enumerate() {
        let (finish, u) = if i == last {
            (Some("STOP"), usage(prompt, reply.tokens(), thoughts))
        } else {
            done += 1;
            (
                None,
                json!({"promptTokenCount": prompt, "candidatesTokenCount": done,
                    "totalTokenCount": prompt + done}),
            )
        };
        frames.push_back((
            Duration::ZERO,
            frame(&chunk(n, model, vec![part], finish, u)),
        ));
    }
    frames
}

/// [`Behavior::Stream`](crate::Behavior::Stream) on a Gemini path: the
/// script's content chunks (`tok{i} `) from `first_token` on, `interval`
/// apart, then its ending: a last chunk with `finishReason` and the usage,
/// an error object, a payload that is not JSON, or silence.
pub(crate) fn scripted_frames(
    n: u64,
    model: &str,
    script: &StreamScript,
    first_token: Duration,
    prompt: u64,
) -> VecDeque<(Duration, Bytes)> {
    let mut frames = VecDeque::with_capacity(script.chunks + 2);
    for i in 0..script.chunks {
        let delay = if i == 0 { first_token } else { script.interval };
        let u = json!({"promptTokenCount": prompt, "candidatesTokenCount": i + 1,
            "totalTokenCount": prompt + i as u64 + 1});
        let c = chunk(n, model, vec![json!({"text": format!("tok{i} ")})], None, u);
        frames.push_back((delay, frame(&c)));
    }
    let after = if script.chunks == 0 {
        first_token
    } else {
        script.interval
    };
    match script.ending {
        StreamEnding::Done => {
            let c = chunk(
                n,
                model,
                vec![json!({"text": ""})],
                Some("STOP"),
                usage(prompt, script.chunks as u64, false),
            );
            frames.push_back((after, frame(&c)));
        }
        StreamEnding::Error => frames.push_back((
            after,
            frame(&error_body(
                503,
                "The model is overloaded. Please try again later.",
            )),
        )),
        StreamEnding::Malformed => frames.push_back((
            after,
            Bytes::from_static(b"data: {\"candidates\":[{\r\n\r\n"),
        )),
        StreamEnding::Stall => frames.push_back((Duration::from_secs(365 * 86_400), Bytes::new())),
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemini_calls_are_told_by_their_path() {
        assert_eq!(
            call_of("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"),
            Some(Call {
                model: "gemini-2.5-flash".into(),
                stream: true,
                sse: true
            })
        );
        assert_eq!(
            call_of("/v1beta/models/gemini-2.5-flash:generateContent"),
            Some(Call {
                model: "gemini-2.5-flash".into(),
                stream: false,
                sse: false
            })
        );
        assert_eq!(call_of("/v1/chat/completions"), None);
        assert_eq!(call_of("/v1beta/models/x:countTokens"), None);
    }

    #[test]
    fn signatures_are_padded_base64_with_both_special_characters() {
        for name in ["f", "get_weather", "abc"] {
            let s = signature_for(name);
            assert_eq!(s.len() % 4, 0, "{s}");
            assert!(s.contains('+') && s.contains('/'), "{s}");
        }
    }

    #[test]
    fn a_function_call_without_its_signature_is_refused() {
        let call = |sig: Option<&str>| {
            let mut part = json!({"functionCall": {"name": "f", "args": {}}});
            if let Some(s) = sig {
                part["thoughtSignature"] = json!(s);
            }
            json!({"contents": [
                {"role": "user", "parts": [{"text": "x"}]},
                {"role": "model", "parts": [part]},
                {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "1"}}}]},
            ]})
        };
        let missing = Refusal::MissingSignature {
            name: "f".into(),
            position: 100,
        };
        assert_eq!(check(Some(&call(None))), Err(missing.clone()));
        assert_eq!(check(Some(&call(Some("other")))), Err(missing.clone()));
        assert!(
            missing
                .to_string()
                .contains("function call `f` , position 100."),
            "{missing}"
        );
        assert!(check(Some(&call(Some(&signature_for("f"))))).is_ok());
        assert_eq!(
            reply(Some(&call(None))),
            Reply::Text(vec!["tool said: ".into(), "1".into()])
        );
    }
}
