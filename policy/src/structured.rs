//! Structured output: is this answer what the request asked for?
//!
//! A request asks for structured output with `response_format`
//! `{"type": "json_object"}` or `{"type": "json_schema", "json_schema":
//! {"schema": {...}}}`. The answer's text (`choices[0].message.content` for
//! chat, `choices[0].text` for completions, the first `output_text` of the
//! responses API) must then parse as JSON and, for `json_schema`, match the
//! schema.
//!
//! The schema check covers the part of JSON Schema that structured-output
//! APIs accept: `type` (one or a list), `properties`, `required`,
//! `additionalProperties: false`, `items`, `enum`, `const`, `anyOf`. Other
//! keywords are ignored (the check never rejects for a keyword it does not
//! know).
//!
//! **When a pool is degraded for structured output** ([`DegradeWatch`]): a
//! malformed structured answer fails over, but it degrades the pool (no
//! structured request goes there for the policy's
//! `structured_output_degrade_s`) only on the backend's failure pattern:
//! [`DEGRADE_AFTER`] malformed answers within that period, and, where the
//! router serves tenants, from at least [`DEGRADE_CALLERS`] of them. One
//! request, or one tenant's many, cannot switch structured output off for
//! everyone. A failure the request's own parameters explain (its output
//! cap reached: [`explained_by_request`]) counts for nothing.

use std::collections::VecDeque;

use serde_json::Value;

/// Unexplained malformed structured answers, within the degrade period,
/// that degrade a pool.
pub const DEGRADE_AFTER: usize = 3;
/// Distinct tenants those answers must come from, where there are tenants.
pub const DEGRADE_CALLERS: usize = 2;
/// Failures a pool remembers at most.
const DEGRADE_MEMORY: usize = 32;
/// An output cap below this many tokens explains a malformed JSON answer
/// when the answer does not say how many it generated.
pub const MIN_STRUCTURED_TOKENS: u64 = 16;

/// Whether a malformed structured answer is explained by the request
/// itself: its output cap (`output_cap`, when it gave one) was reached by
/// the answer (`completion_tokens`), or, when the answer does not say, is
/// below [`MIN_STRUCTURED_TOKENS`].
pub fn explained_by_request(output_cap: Option<u64>, completion_tokens: Option<u64>) -> bool {
    match (output_cap, completion_tokens) {
        (Some(cap), Some(done)) => done >= cap,
        (Some(cap), None) => cap < MIN_STRUCTURED_TOKENS,
        (None, _) => false,
    }
}

/// A pool's recent malformed structured answers (see the module docs).
/// `T` is the caller's clock (an instant); callers are tenants' keys.
#[derive(Debug, Clone)]
pub struct DegradeWatch<T> {
    recent: VecDeque<(T, Option<u64>)>,
}

impl<T> Default for DegradeWatch<T> {
    fn default() -> Self {
        Self {
            recent: VecDeque::new(),
        }
    }
}

impl<T: Copy + Ord> DegradeWatch<T> {
    /// Notes a malformed structured answer at `now` for `caller` (`None`
    /// without tenancy); `since` is the start of the degrade period
    /// (`now` minus it); `tenancy`: whether the router serves tenants.
    /// True when the pool should be degraded now (the failures noted so
    /// far are then forgotten).
    pub fn failed(
        &mut self,
        now: T,
        since: T,
        caller: Option<u64>,
        explained: bool,
        tenancy: bool,
    ) -> bool {
        while self.recent.front().is_some_and(|(at, _)| *at < since) {
            self.recent.pop_front();
        }
        if explained {
            return false;
        }
        if self.recent.len() == DEGRADE_MEMORY {
            self.recent.pop_front();
        }
        self.recent.push_back((now, caller));
        let mut callers: Vec<Option<u64>> = self.recent.iter().map(|(_, c)| *c).collect();
        callers.sort_unstable();
        callers.dedup();
        let degrade =
            self.recent.len() >= DEGRADE_AFTER && (!tenancy || callers.len() >= DEGRADE_CALLERS);
        if degrade {
            self.recent.clear();
        }
        degrade
    }
}

/// What the request asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// Any JSON value (`json_object`).
    Json,
    /// JSON matching this schema (`json_schema`).
    Schema(Value),
}

/// Whether a `response_format.type` asks for structured output: the one
/// definition, used by the pools' `structured_output` gate and by the
/// answer's check alike (a type that is neither `json_object` nor
/// `json_schema`, `text` or unknown, is neither gated nor checked).
pub fn is_structured_type(kind: &str) -> bool {
    matches!(kind, "json_object" | "json_schema")
}

/// Reads `response_format` from a request body.
pub fn expected(request: &Value) -> Option<Expected> {
    let rf = request
        .get("response_format")
        .or_else(|| request.get("text").and_then(|t| t.get("format")))?;
    match rf.get("type").and_then(Value::as_str)? {
        "json_object" => Some(Expected::Json),
        "json_schema" => {
            let schema = rf
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .or_else(|| rf.get("schema"))
                .cloned()
                .unwrap_or(Value::Bool(true));
            Some(Expected::Schema(schema))
        }
        _ => None,
    }
}

/// [`expected`] read straight from a request body: only the
/// `response_format` and `text` members are materialized (the messages,
/// which are most of a large body, are skipped, not copied). `None` when
/// the body is not a JSON object or asks for no structured output.
pub fn expected_in_body(body: &[u8]) -> Option<Expected> {
    #[derive(serde::Deserialize)]
    struct Formats {
        #[serde(default)]
        response_format: Option<Value>,
        #[serde(default)]
        text: Option<Value>,
    }
    let f: Formats = serde_json::from_slice(body).ok()?;
    let mut request = serde_json::Map::new();
    if let Some(rf) = f.response_format {
        request.insert("response_format".into(), rf);
    }
    if let Some(text) = f.text {
        request.insert("text".into(), text);
    }
    expected(&Value::Object(request))
}

/// The answer's text, from a chat, completions or responses answer.
pub fn answer_text(answer: &Value) -> Option<&str> {
    if let Some(choice) = answer.get("choices").and_then(|c| c.get(0)) {
        return choice
            .get("message")
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .or_else(|| choice.get("text").and_then(Value::as_str));
    }
    answer
        .get("output")
        .and_then(Value::as_array)?
        .iter()
        .filter_map(|o| o.get("content").and_then(Value::as_array))
        .flatten()
        .find_map(|c| c.get("text").and_then(Value::as_str))
}

/// Why an answer is not the structured output asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StructuredError {
    /// The answer body is not JSON.
    #[error("answer is not JSON: {0}")]
    AnswerNotJson(String),
    /// The answer has no text content to check.
    #[error("answer has no text content")]
    NoText,
    /// The answer's text is not JSON.
    #[error("content is not JSON: {0}")]
    ContentNotJson(String),
    /// The content does not match the schema: where, and why.
    #[error("{at}: {why}")]
    Mismatch {
        /// A JSON path (`$.items[2].name`).
        at: String,
        /// What the schema wanted there.
        why: String,
    },
}

fn mismatch(at: &str, why: String) -> StructuredError {
    StructuredError::Mismatch {
        at: at.to_string(),
        why,
    }
}

/// Checks an answer body against what was asked; `Err` says why not.
pub fn check(answer_body: &[u8], expected: &Expected) -> Result<(), StructuredError> {
    let answer: Value = serde_json::from_slice(answer_body)
        .map_err(|e| StructuredError::AnswerNotJson(e.to_string()))?;
    let text = answer_text(&answer).ok_or(StructuredError::NoText)?;
    let value: Value =
        serde_json::from_str(text).map_err(|e| StructuredError::ContentNotJson(e.to_string()))?;
    match expected {
        Expected::Json => Ok(()),
        Expected::Schema(schema) => matches(&value, schema, "$"),
    }
}

fn type_ok(value: &Value, ty: &str) -> bool {
    match ty {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => true,
    }
}

/// Does `value` match `schema`? `Err` names the first place it does not.
pub fn matches(value: &Value, schema: &Value, at: &str) -> Result<(), StructuredError> {
    let Some(schema) = schema.as_object() else {
        return match schema {
            Value::Bool(false) => Err(mismatch(at, "no value is allowed".into())),
            _ => Ok(()),
        };
    };
    if let Some(ty) = schema.get("type") {
        let ok = match ty {
            Value::String(t) => type_ok(value, t),
            Value::Array(ts) => ts
                .iter()
                .filter_map(Value::as_str)
                .any(|t| type_ok(value, t)),
            _ => true,
        };
        if !ok {
            return Err(mismatch(at, format!("expected type {ty}")));
        }
    }
    if let Some(c) = schema.get("const") {
        if c != value {
            return Err(mismatch(at, format!("expected {c}")));
        }
    }
    if let Some(Value::Array(options)) = schema.get("enum") {
        if !options.contains(value) {
            return Err(mismatch(at, "not one of the allowed values".into()));
        }
    }
    if let Some(Value::Array(any)) = schema.get("anyOf") {
        if !any.iter().any(|s| matches(value, s, at).is_ok()) {
            return Err(mismatch(at, "matches none of anyOf".into()));
        }
    }
    if let Some(obj) = value.as_object() {
        if let Some(Value::Array(required)) = schema.get("required") {
            for r in required.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    return Err(mismatch(at, format!("missing required property {r:?}")));
                }
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, v) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => matches(v, s, &format!("{at}.{k}"))?,
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(mismatch(at, format!("unexpected property {k:?}")));
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            matches(v, items, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_definition_of_structured_output() {
        // What the gate counts as structured is exactly what is checked.
        for (kind, structured) in [
            ("json_object", true),
            ("json_schema", true),
            ("text", false),
            ("foo", false),
            ("", false),
        ] {
            assert_eq!(is_structured_type(kind), structured, "{kind}");
            let body = format!(r#"{{"response_format": {{"type": "{kind}"}}}}"#);
            assert_eq!(
                expected_in_body(body.as_bytes()).is_some(),
                structured,
                "{kind}"
            );
        }
    }

    #[test]
    fn one_tenant_cannot_degrade_a_pool_for_all() {
        let mut w = DegradeWatch::default();
        // One tenant, many failures: never.
        for t in 0..10u64 {
            assert!(!w.failed(t, 0, Some(1), false, true), "{t}");
        }
        // A second tenant's failure makes the pattern.
        assert!(w.failed(10, 0, Some(2), false, true));
        // Forgotten once degraded: it starts again.
        assert!(!w.failed(11, 0, Some(2), false, true));
    }

    #[test]
    fn without_tenants_three_failures_in_the_period_degrade() {
        let mut w = DegradeWatch::default();
        assert!(!w.failed(0u64, 0, None, false, false));
        assert!(!w.failed(1, 0, None, false, false));
        assert!(w.failed(2, 0, None, false, false));
        // Old failures leave the period.
        let mut w = DegradeWatch::default();
        assert!(!w.failed(0u64, 0, None, false, false));
        assert!(!w.failed(1, 0, None, false, false));
        assert!(!w.failed(100, 50, None, false, false));
        assert!(!w.failed(101, 50, None, false, false));
        assert!(w.failed(102, 50, None, false, false));
    }

    #[test]
    fn failures_the_request_explains_count_for_nothing() {
        let mut w = DegradeWatch::default();
        for t in 0..10u64 {
            assert!(!w.failed(t, 0, Some(t), true, true));
        }
        assert!(explained_by_request(Some(5), Some(5)));
        assert!(explained_by_request(Some(4), None));
        assert!(!explained_by_request(Some(400), Some(12)));
        assert!(!explained_by_request(Some(400), None));
        assert!(!explained_by_request(None, Some(12)));
    }
    use serde_json::json;

    fn chat(content: &str) -> Vec<u8> {
        json!({"choices": [{"message": {"content": content}}]})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn the_body_reader_agrees_with_the_value_reader() {
        for body in [
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "json_object"}}),
            json!({"response_format": {"type": "json_schema",
                   "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
            json!({"input": "hi", "text": {"format": {"type": "json_schema",
                   "schema": {"type": "array"}}}}),
            json!({"response_format": {"type": "text"}}),
            json!({"messages": []}),
        ] {
            let bytes = body.to_string().into_bytes();
            assert_eq!(expected_in_body(&bytes), expected(&body), "{body}");
        }
        assert_eq!(expected_in_body(b"[1]"), None);
        assert_eq!(expected_in_body(b"{"), None);
    }

    #[test]
    fn reads_what_the_request_asked() {
        assert_eq!(
            expected(&json!({"response_format": {"type": "json_object"}})),
            Some(Expected::Json)
        );
        assert_eq!(
            expected(&json!({"response_format": {"type": "text"}})),
            None
        );
        assert_eq!(expected(&json!({})), None);
        let e = expected(
            &json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
        );
        assert_eq!(e, Some(Expected::Schema(json!({"type": "object"}))));
    }

    #[test]
    fn json_object_needs_json_content() {
        assert!(check(&chat(r#"{"a": 1}"#), &Expected::Json).is_ok());
        assert!(check(&chat("Sure! Here is your JSON: {"), &Expected::Json).is_err());
        assert!(check(b"not json", &Expected::Json).is_err());
        let responses =
            json!({"output": [{"content": [{"type": "output_text", "text": "[1,2]"}]}]});
        assert!(check(responses.to_string().as_bytes(), &Expected::Json).is_ok());
    }

    #[test]
    fn schemas_are_checked() {
        let schema = Expected::Schema(json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "temp": {"type": ["number", "null"]},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}}
            },
            "required": ["city"],
            "additionalProperties": false
        }));
        assert!(check(
            &chat(r#"{"city": "Oslo", "temp": 3.5, "tags": ["a"]}"#),
            &schema
        )
        .is_ok());
        let err = check(&chat(r#"{"temp": 3}"#), &schema).unwrap_err();
        assert_eq!(
            err,
            StructuredError::Mismatch {
                at: "$".into(),
                why: "missing required property \"city\"".into()
            }
        );
        assert!(matches!(
            check(&chat(r#"{"city": 1}"#), &schema),
            Err(StructuredError::Mismatch { at, .. }) if at == "$.city"
        ));
        assert_eq!(
            check(b"not json", &Expected::Json)
                .map_err(|e| matches!(e, StructuredError::AnswerNotJson(_))),
            Err(true)
        );
        assert!(check(&chat(r#"{"city": "x", "extra": 1}"#), &schema).is_err());
        assert!(check(&chat(r#"{"city": "x", "tags": ["c"]}"#), &schema).is_err());
    }
}
