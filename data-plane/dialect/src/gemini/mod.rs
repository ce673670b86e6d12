//! Gemini `generateContent` (`POST /v1beta/models/{model}:generateContent`,
//! streamed by `:streamGenerateContent?alt=sse`): requests and answers to
//! and from the neutral model.
//!
//! # Requests
//!
//! - `contents` of role `user`/`model` are messages; `systemInstruction`
//!   is the system prompt. The model is in the URL ([`endpoint_path`]),
//!   never in the body.
//! - Parts: `text`, `text` with `thought: true` ([`Part::Thinking`]),
//!   `inlineData` of an image type ([`ImageSource::Base64`]),
//!   `functionCall` (its `args` object kept as JSON text) and
//!   `functionResponse`; other parts are kept for Gemini and reported as
//!   uncarried elsewhere.
//! - A `functionResponse` is matched to its call by name (Gemini's ids
//!   are optional): the latest earlier call of that name not yet answered.
//!   Written to Gemini, a tool result takes the name of the call it
//!   answers (found by id in the earlier messages; refused when none is
//!   found) and its text as `response`: `{"error": text}` when the tool
//!   failed, the object itself when the text is a JSON object, else
//!   `{"output": text}` (Gemini's documented keys).
//! - Tools: each function is a `functionDeclarations` entry whose schema
//!   goes in `parametersJsonSchema` (full JSON Schema, where `parameters`
//!   takes only an OpenAPI subset). Gemini's own tools (`googleSearch`,
//!   `codeExecution`, ...) are kept for Gemini only.
//! - `toolConfig.functionCallingConfig.mode` `AUTO`/`NONE`/`ANY` is
//!   [`ToolChoice::Auto`]/`None`/`Required`; `ANY` with one
//!   `allowedFunctionNames` entry is [`ToolChoice::Tool`]. Gemini cannot
//!   be asked for at most one call, so `parallel_tool_calls: false` is
//!   refused.
//! - `generationConfig`: `stopSequences`, `maxOutputTokens`,
//!   `temperature`, `topP`, `topK`, `seed`, `presencePenalty`,
//!   `frequencyPenalty`, `responseMimeType: application/json` with
//!   `responseJsonSchema` (or `responseSchema`) for JSON mode, and
//!   `thinkingConfig`: `thinkingBudget` n is [`Reasoning::Budget`] (0 is
//!   `Off`, -1 `Adaptive`), `thinkingLevel` is [`Reasoning::Effort`].
//!   Written, thoughts are asked for (`includeThoughts`) whenever thinking
//!   is; an effort word other than `minimal`, `low`, `medium`, `high` is
//!   refused, and `Off` is dropped on purpose (some Gemini models cannot
//!   turn thinking off, and 0 is refused by them).
//! - snake_case field names (`system_instruction`, `generation_config`,
//!   `function_call`, ...), which Gemini's JSON mapping also accepts, are
//!   read as their camelCase names.
//! - Images by URL are refused: Gemini's `fileData` takes files uploaded
//!   to it, and the router fetches nothing.
//! - `user` (OpenAI `user`, Anthropic `metadata.user_id`) has no Gemini
//!   field: dropped on purpose (it tags abuse reports, it does not change
//!   the answer).
//!
//! # Thought signatures
//!
//! A Gemini 3 model refuses a conversation whose function calls lack the
//! `thoughtSignature` it returned with them. Clients of the other dialects
//! have no field for it, so it rides in the tool call's id:
//! `{id}__thought__{signature}`, the signature in URL-safe base64 without
//! padding (Anthropic's tool ids allow `[A-Za-z0-9_-]` only). The client
//! returns the id with the call in the next turn, and
//! [`signature_of_tool_id`] takes it back out. A call without an id from
//! Gemini gets `call_{responseId}_{n}`. Signatures on text and thought
//! parts are dropped on purpose in translation: Gemini documents them as
//! recommended to return, not required.
//!
//! # Answers
//!
//! `finishReason`: `STOP` is [`StopReason::EndTurn`], or `ToolUse` when
//! the answer calls a function (Gemini says `STOP` then too); `MAX_TOKENS`
//! is `MaxTokens`; `SAFETY`, `RECITATION`, `LANGUAGE`, `BLOCKLIST`,
//! `PROHIBITED_CONTENT`, `SPII` and the `IMAGE_*` reasons are `Refusal`;
//! `MALFORMED_FUNCTION_CALL`, `UNEXPECTED_TOOL_CALL` and
//! `TOO_MANY_TOOL_CALLS` are `ToolError`. A prompt blocked before any
//! candidate (`promptFeedback.blockReason`) is an empty `Refusal`.
//!
//! # Files
//!
//! `request.rs` reads a request (its parts reader serves answers too),
//! `write.rs` writes one, `answer.rs` reads and writes answers and stop
//! reasons; this file holds what they share: the ids that carry thought
//! signatures, the endpoint path, snake_case keys read as camelCase.
//!
//! [`ImageSource::Base64`]: crate::ImageSource::Base64
//! [`Part::Thinking`]: crate::Part::Thinking
//! [`Reasoning::Budget`]: crate::Reasoning::Budget
//! [`Reasoning::Effort`]: crate::Reasoning::Effort
//! [`StopReason::EndTurn`]: crate::StopReason::EndTurn
//! [`ToolChoice::Auto`]: crate::ToolChoice::Auto
//! [`ToolChoice::Tool`]: crate::ToolChoice::Tool

mod answer;
mod request;
mod write;

pub(crate) use answer::answer_parts;
pub use answer::{parse_answer, stop_from, stop_to, write_answer};
pub use request::parse_request;
pub(crate) use write::write_request;

use serde_json::Value;

use crate::json::{as_obj, Obj};
use crate::DialectError;

/// Gemini request fields dropped on purpose when the request goes to
/// another dialect: none.
pub const DROPPED_ELSEWHERE: &[&str] = &[];

const SIGNATURE_MARK: &str = "__thought__";

/// The id a client sees for a Gemini function call: `base`, with the
/// call's thought signature when it has one.
pub fn tool_id_with_signature(base: &str, signature: Option<&str>) -> String {
    match signature {
        None => base.to_owned(),
        Some(sig) => {
            let mut id = String::with_capacity(base.len() + SIGNATURE_MARK.len() + sig.len());
            id.push_str(base);
            id.push_str(SIGNATURE_MARK);
            id.extend(sig.chars().filter_map(|c| match c {
                '+' => Some('-'),
                '/' => Some('_'),
                '=' => None,
                c => Some(c),
            }));
            id
        }
    }
}

/// The thought signature a tool call's id carries (see the module docs),
/// back in standard base64.
pub fn signature_of_tool_id(id: &str) -> Option<String> {
    let (_, sig) = id.split_once(SIGNATURE_MARK)?;
    if sig.is_empty() {
        return None;
    }
    let mut s: String = sig
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    let pad = (4 - s.len() % 4) % 4;
    s.extend(std::iter::repeat_n('=', pad));
    Some(s)
}

/// The path of a Gemini call for `model`: `generateContent`, or
/// `streamGenerateContent?alt=sse` for a stream. A model name with a
/// character outside `[A-Za-z0-9._-]` is refused (it would change the
/// path).
pub fn endpoint_path(model: &str, stream: bool) -> Result<String, DialectError> {
    let model = model.strip_prefix("models/").unwrap_or(model);
    if model.is_empty()
        || !model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(DialectError::invalid(
            "model",
            "a Gemini model name takes letters, digits, `.`, `_` and `-` only",
        ));
    }
    Ok(if stream {
        format!("/v1beta/models/{model}:streamGenerateContent?alt=sse")
    } else {
        format!("/v1beta/models/{model}:generateContent")
    })
}

/// snake_case keys as camelCase (one level: field names of Gemini's own
/// objects, never of user data such as function arguments or schemas).
fn camel(o: &Obj) -> Obj {
    o.iter()
        .map(|(k, v)| {
            if !k.contains('_') {
                return (k.clone(), v.clone());
            }
            let mut out = String::with_capacity(k.len());
            let mut up = false;
            for c in k.chars() {
                if c == '_' {
                    up = true;
                } else if up {
                    out.extend(c.to_uppercase());
                    up = false;
                } else {
                    out.push(c);
                }
            }
            (out, v.clone())
        })
        .collect()
}

fn obj_camel(v: &Value, at: &str) -> Result<Obj, DialectError> {
    as_obj(v, at).map(camel)
}

/// Gemini's OpenAPI-style schema types are upper case (`OBJECT`); JSON
/// Schema's are lower case.
fn lower_schema_types(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("type", Value::String(t)) => Value::String(t.to_ascii_lowercase()),
                        // Property names are user data: only their schemas.
                        ("properties", Value::Object(p)) => Value::Object(
                            p.iter()
                                .map(|(n, s)| (n.clone(), lower_schema_types(s)))
                                .collect(),
                        ),
                        (_, v) => lower_schema_types(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(lower_schema_types).collect()),
        v => v.clone(),
    }
}
