//! Shape errors, every one at once: unknown fields (with a "did you mean"),
//! wrong types, missing fields.
//!
//! serde stops at the first error. A document with three misspelt keys
//! would take three rounds of edit and apply, so when the text does not
//! deserialize, [`all_shape_errors`] goes on from there:
//!
//! 1. The text is read into a generic YAML value (JSON is YAML's subset
//!    for this purpose; a syntax error is the one error there is).
//! 2. The value is deserialized into the document. On an error at a
//!    mapping key (an unknown field, a wrong type or value) the error is
//!    kept, the key is removed from the value, and the deserialization runs
//!    again. An error that is not at a key (a missing field, a bad list
//!    item) is kept and ends the walk, and so does a "missing field" for a
//!    key removed before (a consequence, not a new problem).
//!    An unknown field gets the closest known name when one is close (edit
//!    distance, a swap of two neighbours counting as one edit, at most a
//!    third of the name and at most 3).
//! 3. The first error keeps the message of the text's own parse, which
//!    has the line and column; the others name their path only.
//!
//! At most [`MAX_SHAPE_ERRORS`] are collected. Each field path appears
//! once, at the start of its error, never again inside the reason (some
//! deserializers prefix their messages with the path of the enclosing
//! mapping).

use super::{FieldError, PolicyDocument, PolicyError};
use serde_path_to_error::Segment;
use serde_yaml_ng::Value;

/// The most shape errors reported for one document.
pub(crate) const MAX_SHAPE_ERRORS: usize = 32;

/// Every shape error of `text`, whose own parse failed with `first`; and,
/// when every error was an unknown field, the document without them (so
/// that validation can report the rest of the problems in the same
/// answer).
pub(crate) fn all_shape_errors(
    text: &str,
    first: FieldError,
) -> (PolicyError, Option<Box<PolicyDocument>>) {
    let mut value: Value = match serde_yaml_ng::from_str(text) {
        Ok(v) => v,
        // Not even YAML: the text's own error is all there is.
        Err(_) => {
            return (
                PolicyError {
                    errors: vec![first],
                },
                None,
            )
        }
    };
    let mut repaired = None;
    let mut only_unknown_fields = true;
    let mut errors: Vec<FieldError> = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    while errors.len() < MAX_SHAPE_ERRORS {
        let err = match serde_path_to_error::deserialize::<_, PolicyDocument>(value.clone()) {
            // Nothing more to say (or the text and the value disagreed:
            // the text's error stays).
            Ok(doc) => {
                if !errors.is_empty() && only_unknown_fields {
                    repaired = Some(Box::new(doc));
                }
                break;
            }
            Err(e) => e,
        };
        let segments: Vec<Segment> = err.path().iter().cloned().collect();
        let error = field_error(&err.path().to_string(), &err.inner().to_string());
        // A field removed below, now missing: a consequence, not news.
        if let Some(missing) = missing_field(&error.reason) {
            let path = if error.field == "(document)" {
                missing.to_string()
            } else {
                format!("{}.{missing}", error.field)
            };
            if removed.contains(&path) {
                break;
            }
        }
        let field = error.field.clone();
        only_unknown_fields &= unknown_field(&error.reason).is_some();
        errors.push(error);
        if !remove(&mut value, &segments) {
            break;
        }
        removed.push(field);
    }
    // The first keeps the text's message (its line and column).
    match errors.first_mut() {
        Some(e) if e.field == first.field => *e = first,
        Some(_) => errors.insert(0, first),
        None => errors.push(first),
    }
    for e in &mut errors {
        suggest(e);
    }
    (PolicyError { errors }, repaired)
}

/// A serde error as a field error: the path (or `(document)`), and the
/// message without any leading path of its own.
pub(crate) fn field_error(path: &str, message: &str) -> FieldError {
    let field = if path == "." || path.is_empty() {
        "(document)".to_string()
    } else {
        path.to_string()
    };
    // "spec.pools[0]: unknown field ..." for field spec.pools[0].x: the
    // prefix is a path the field starts with.
    let reason = match message.split_once(": ") {
        Some((prefix, rest)) if !prefix.contains(' ') && field.starts_with(prefix) => rest,
        _ => message,
    };
    FieldError {
        field,
        reason: reason.to_string(),
    }
}

/// The name in an "unknown field `name`, expected ..." message.
fn unknown_field(reason: &str) -> Option<&str> {
    let rest = reason.strip_prefix("unknown field `")?;
    rest.split('`').next()
}

/// The name in a "missing field `name`" message.
fn missing_field(reason: &str) -> Option<&str> {
    let rest = reason.strip_prefix("missing field `")?;
    rest.split('`').next()
}

/// The names an unknown-field message lists as expected.
fn expected_fields(reason: &str) -> Vec<&str> {
    let Some((_, expected)) = reason.split_once("expected ") else {
        return Vec::new();
    };
    // Up to " at line" if the message has a location.
    let expected = expected.split(" at line ").next().unwrap_or(expected);
    expected.split('`').skip(1).step_by(2).collect()
}

/// Rewrites an unknown-field error that has a close known name into
/// "unknown field `x`; did you mean `y`?" (keeping the location).
fn suggest(error: &mut FieldError) {
    let Some(unknown) = unknown_field(&error.reason) else {
        return;
    };
    let Some(best) = closest(unknown, &expected_fields(&error.reason)) else {
        return;
    };
    let location = error
        .reason
        .split_once(" at line ")
        .map(|(_, at)| format!(" at line {at}"))
        .unwrap_or_default();
    error.reason = format!("unknown field `{unknown}`; did you mean `{best}`?{location}");
}

/// The known name closest to `unknown`, if it is close enough to be a typo.
fn closest<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = (unknown.chars().count() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| (edit_distance(unknown, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Edit distance with adjacent swaps (optimal string alignment):
/// insertions, deletions, substitutions and swaps of neighbours each cost 1.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// Removes the key at `path` from `value`; false when the path does not
/// lead to a mapping key (nothing to remove, so the walk must stop).
fn remove(value: &mut Value, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = value;
    for segment in parents {
        at = match (segment, at) {
            (Segment::Map { key }, Value::Mapping(m)) => match m.get_mut(key.as_str()) {
                Some(v) => v,
                None => return false,
            },
            (Segment::Seq { index }, Value::Sequence(s)) => match s.get_mut(*index) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, at) {
        (Segment::Map { key }, Value::Mapping(m)) => m.remove(key.as_str()).is_some(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("max_concurency", "max_concurrency"), 1);
        assert_eq!(edit_distance("modle", "model"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn only_close_names_are_suggested() {
        let known = ["name", "model", "endpoints", "max_concurrency"];
        assert_eq!(closest("max_concurency", &known), Some("max_concurrency"));
        assert_eq!(closest("modle", &known), Some("model"));
        assert_eq!(closest("colour", &known), None);
        assert_eq!(closest("x", &known), None);
    }

    #[test]
    fn the_path_is_not_repeated_in_the_reason() {
        let e = field_error(
            "spec.pools[0].max_concurency",
            "spec.pools[0]: unknown field `max_concurency`, expected `name`",
        );
        assert_eq!(e.reason, "unknown field `max_concurency`, expected `name`");
        // A message that merely contains ": " keeps its text.
        let e = field_error(
            "spec.queue.timeout_s",
            "invalid type: string \"x\", expected f64",
        );
        assert_eq!(e.reason, "invalid type: string \"x\", expected f64");
        assert_eq!(field_error(".", "bad").field, "(document)");
    }
}
