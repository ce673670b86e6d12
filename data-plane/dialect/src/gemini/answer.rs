//! Gemini answers (`GenerateContentResponse`) to and from the neutral
//! answer, and the stop reasons.

use serde_json::{json, Value};

use super::request::parse_part;
use super::{camel, obj_camel};
use crate::json::{field, index, opt_str, parse_object};
use crate::{Answer, Dialect, DialectError, ImageSource, Part, StopReason, Uncarried, Usage};

/// `finishReason` to the neutral stop reason (`STOP` with a function call
/// is `ToolUse`).
pub fn stop_from(reason: &str, called: bool) -> StopReason {
    match reason {
        "STOP" if called => StopReason::ToolUse,
        "STOP" => StopReason::EndTurn,
        "MAX_TOKENS" => StopReason::MaxTokens,
        "SAFETY"
        | "RECITATION"
        | "LANGUAGE"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => StopReason::Refusal,
        "MALFORMED_FUNCTION_CALL" | "UNEXPECTED_TOOL_CALL" | "TOO_MANY_TOOL_CALLS" => {
            StopReason::ToolError
        }
        _ => StopReason::Other,
    }
}

/// The neutral stop reason as a `finishReason`.
pub fn stop_to(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn
        | StopReason::StopSequence
        | StopReason::ToolUse
        | StopReason::PauseTurn => "STOP",
        StopReason::MaxTokens | StopReason::ContextWindow => "MAX_TOKENS",
        StopReason::Refusal => "SAFETY",
        StopReason::ToolError => "MALFORMED_FUNCTION_CALL",
        StopReason::Other => "OTHER",
    }
}

/// The parts of one answer (or stream chunk) as neutral parts. `n` counts
/// the function calls seen so far in the answer (for ids Gemini did not
/// give).
pub(crate) fn answer_parts(
    parts: &[Value],
    response_id: &str,
    n: &mut usize,
) -> Result<Vec<Part>, DialectError> {
    let mut out = Vec::with_capacity(parts.len());
    let mut open = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        let at = index("candidates[0].content.parts", j);
        let mut part = parse_part(p, &at, &mut open, || format!("call_{response_id}_{n}"))?;
        match &mut part {
            Part::ToolUse { .. } => *n += 1,
            // Signatures on thought parts are dropped on purpose.
            Part::Thinking { signature, .. } => *signature = None,
            _ => {}
        }
        out.push(part);
    }
    Ok(out)
}

/// Parses a Gemini `GenerateContentResponse` (unstreamed answer).
pub fn parse_answer(body: &[u8]) -> Result<Answer, DialectError> {
    let m = camel(&parse_object(body)?);
    let id = opt_str(&m, "responseId", "")?.unwrap_or("").to_owned();
    let mut content = Vec::new();
    let mut stop = StopReason::EndTurn;
    let candidates = field(&m, "candidates").and_then(Value::as_array);
    match candidates.and_then(|c| c.first()) {
        Some(c) => {
            let c = obj_camel(c, "candidates[0]")?;
            if let Some(parts) = c
                .get("content")
                .and_then(|c| c.get("parts"))
                .and_then(Value::as_array)
            {
                content = answer_parts(parts, &id, &mut 0)?;
            }
            let called = content.iter().any(|p| matches!(p, Part::ToolUse { .. }));
            stop = stop_from(
                opt_str(&c, "finishReason", "candidates[0]")?.unwrap_or("STOP"),
                called,
            );
        }
        None => {
            let blocked = m
                .get("promptFeedback")
                .and_then(|f| f.get("blockReason"))
                .is_some();
            if blocked {
                stop = StopReason::Refusal;
            }
        }
    }
    Ok(Answer {
        id,
        model: opt_str(&m, "modelVersion", "")?.unwrap_or("").to_owned(),
        content,
        stop_reason: stop,
        stop_sequence: None,
        usage: field(&m, "usageMetadata")
            .map(Usage::from_gemini)
            .unwrap_or_default(),
    })
}

/// Writes an answer as a Gemini `GenerateContentResponse`.
pub fn write_answer(a: &Answer) -> Result<Value, DialectError> {
    let mut parts = Vec::with_capacity(a.content.len());
    let mut lost = Vec::new();
    for (i, p) in a.content.iter().enumerate() {
        match p {
            Part::Text { text, .. } => parts.push(json!({"text": text})),
            Part::Thinking { text, .. } => parts.push(json!({"text": text, "thought": true})),
            Part::ToolUse {
                name,
                input,
                signature,
                ..
            } => {
                let args = if input.trim().is_empty() {
                    json!({})
                } else {
                    serde_json::from_str::<Value>(input)
                        .ok()
                        .filter(Value::is_object)
                        .ok_or_else(|| {
                            DialectError::invalid(
                                index("content", i),
                                "the tool call's arguments are not a JSON object",
                            )
                        })?
                };
                let mut part = json!({"functionCall": {"name": name, "args": args}});
                if let Some(s) = signature {
                    part["thoughtSignature"] = s.clone().into();
                }
                parts.push(part);
            }
            Part::Image {
                source: ImageSource::Base64 { media_type, data },
                ..
            } => parts.push(json!({"inlineData": {"mimeType": media_type, "data": data}})),
            Part::RedactedThinking { .. } => {}
            Part::Other {
                dialect: Dialect::Gemini,
                value,
            } => parts.push(value.clone()),
            _ => lost.push(Uncarried::new(
                index("content", i),
                Dialect::Gemini,
                "this kind of content has no place in a Gemini answer",
            )),
        }
    }
    if !lost.is_empty() {
        return Err(DialectError::CannotCarry(lost));
    }
    Ok(json!({
        "candidates": [{
            "content": {"role": "model", "parts": parts},
            "finishReason": stop_to(a.stop_reason),
            "index": 0,
        }],
        "usageMetadata": a.usage.to_gemini(),
        "modelVersion": a.model,
        "responseId": a.id,
    }))
}
