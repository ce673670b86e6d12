//! Small readers over `serde_json::Value` that name the field they
//! refuse (the router's 400 answer names it too).

use serde_json::{Map, Value};

use crate::DialectError;

pub(crate) type Obj = Map<String, Value>;

pub(crate) fn path(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_owned()
    } else {
        format!("{base}.{key}")
    }
}

pub(crate) fn index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
}

pub(crate) fn as_obj<'a>(v: &'a Value, at: &str) -> Result<&'a Obj, DialectError> {
    v.as_object()
        .ok_or_else(|| DialectError::invalid(at, "expected an object"))
}

pub(crate) fn as_array<'a>(v: &'a Value, at: &str) -> Result<&'a Vec<Value>, DialectError> {
    v.as_array()
        .ok_or_else(|| DialectError::invalid(at, "expected an array"))
}

/// A present, non-null field.
pub(crate) fn field<'a>(m: &'a Obj, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

pub(crate) fn opt_str<'a>(
    m: &'a Obj,
    key: &str,
    at: &str,
) -> Result<Option<&'a str>, DialectError> {
    match field(m, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(DialectError::invalid(path(at, key), "expected a string")),
    }
}

pub(crate) fn req_str<'a>(m: &'a Obj, key: &str, at: &str) -> Result<&'a str, DialectError> {
    opt_str(m, key, at)?.ok_or_else(|| DialectError::invalid(path(at, key), "required"))
}

pub(crate) fn opt_u64(m: &Obj, key: &str, at: &str) -> Result<Option<u64>, DialectError> {
    match field(m, key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| DialectError::invalid(path(at, key), "expected a non-negative integer")),
    }
}

pub(crate) fn opt_i64(m: &Obj, key: &str, at: &str) -> Result<Option<i64>, DialectError> {
    match field(m, key) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| DialectError::invalid(path(at, key), "expected an integer")),
    }
}

pub(crate) fn opt_f64(m: &Obj, key: &str, at: &str) -> Result<Option<f64>, DialectError> {
    match field(m, key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| DialectError::invalid(path(at, key), "expected a number")),
    }
}

pub(crate) fn opt_bool(m: &Obj, key: &str, at: &str) -> Result<Option<bool>, DialectError> {
    match field(m, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(DialectError::invalid(
            path(at, key),
            "expected true or false",
        )),
    }
}

/// A float as JSON (`null` for a NaN or an infinity, which JSON cannot
/// hold and no parser here produces).
pub(crate) fn num(f: f64) -> Value {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// Parses a body into a JSON object.
pub(crate) fn parse_object(body: &[u8]) -> Result<Obj, DialectError> {
    match serde_json::from_slice::<Value>(body)? {
        Value::Object(m) => Ok(m),
        _ => Err(DialectError::invalid("", "the body must be a JSON object")),
    }
}
