//! `router-fuzz`: the properties the fuzzer checks, as plain functions.
//!
//! Each function takes arbitrary bytes and panics only when a property
//! fails; [`TARGETS`] lists them by target name. Two things call them:
//!
//! - the cargo-fuzz project in `fuzz/libfuzzer/` (nightly, libFuzzer), one
//!   `fuzz_targets/<name>.rs` per function;
//! - `tests/replay.rs`, which runs every committed input under
//!   `fuzz/seeds/<name>/` and `fuzz/corpus/<name>/` through its function
//!   as an ordinary test (stable, part of `cargo test --workspace`).
//!
//! The targets and their properties (`docs/fuzzing.md` has more):
//!
//! - [`json_peek`]: `router_json_peek::peek_request` and `peek_answer`
//!   against serde_json (the oracle the json-peek tests use, the same file);
//! - [`policy_document`]: policy YAML/JSON parse and validation never
//!   panic, and a document that validates round-trips through YAML and
//!   JSON to the same document and the same `Policy`;
//! - [`request_headers`], [`route_log`], [`snapshot`]: private parts of the
//!   proxy, through `router_proxy::fuzzing` (the proxy's non-default
//!   `fuzzing` feature).

#![forbid(unsafe_code)]

use router_policy::document::{load, PolicyDocument};
use router_policy::QueueSettings;

/// The serde_json oracle of the json-peek tests, included from there: one
/// copy for the tests and the fuzzer.
#[path = "../../data-plane/json-peek/tests/against_serde/oracle.rs"]
mod oracle;

/// A target's property: panics on the input that breaks it.
pub type Property = fn(&[u8]);

/// Every target: its name (the cargo-fuzz target and corpus folder) and
/// its property.
pub const TARGETS: [(&str, Property); 5] = [
    ("json_peek", json_peek),
    ("policy_document", policy_document),
    ("request_headers", request_headers),
    ("route_log", route_log),
    ("snapshot", snapshot),
];

/// The bytes as a request body and as an answer body: `peek_request` and
/// `peek_answer` accept exactly what serde_json accepts into the structs
/// the proxy used to deserialize, with the same field values, or fail with
/// serde_json's message and position (two documented differences aside:
/// a top-level array, and the digits of a float in a type error).
pub fn json_peek(data: &[u8]) {
    oracle::check(data);
}

/// The bytes as a policy document (skipped unless UTF-8): parsing and
/// validation never panic; `load` is `parse` then `validate` (on a shape
/// error, its answer begins with parse's errors); a refusal
/// names at least one field error. A document that validates, written
/// back as YAML and as JSON, parses to the same document and validates to
/// the same `Policy`, with one known exception: serde_json (without its
/// `float_roundtrip` feature) does not read every float correctly
/// rounded, not even its own output, so after the JSON round trip a
/// number may be one unit in the last place off (`docs/fuzzing.md`,
/// "Findings"); the document must then still validate.
pub fn policy_document(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let defaults = QueueSettings::default();
    let loaded = load(text, &defaults);
    let doc = match PolicyDocument::parse(text) {
        Ok(doc) => doc,
        Err(e) => {
            assert!(!e.errors.is_empty(), "a refusal says why");
            // `load` reports the parse's errors first, then (when they
            // were all misspelt fields) what validation finds in the rest.
            let loaded = loaded.expect_err("a document that does not parse does not load");
            assert!(
                loaded.errors.starts_with(&e.errors),
                "load begins with parse's errors: {loaded} / {e}"
            );
            return;
        }
    };
    let policy = match doc.validate(&defaults) {
        Ok(policy) => policy,
        Err(e) => {
            assert!(!e.errors.is_empty(), "a refusal says why");
            assert_eq!(loaded, Err(e), "load is parse then validate");
            return;
        }
    };
    assert_eq!(loaded.as_ref(), Ok(&policy), "load is parse then validate");
    let yaml = serde_yaml_ng::to_string(&doc).expect("a document writes as YAML");
    let json = serde_json::to_string(&doc).expect("a document writes as JSON");
    for (format, written) in [("YAML", yaml), ("JSON", json)] {
        let again = PolicyDocument::parse(&written)
            .unwrap_or_else(|e| panic!("{format} written back does not parse: {e}\n{written}"));
        let revalidated = again
            .validate(&defaults)
            .unwrap_or_else(|e| panic!("{format} written back does not validate: {e}\n{written}"));
        if format == "JSON" && again != doc {
            let value = |d: &PolicyDocument| serde_json::to_value(d).expect("a document is JSON");
            assert!(
                same_but_last_place(&value(&again), &value(&doc)),
                "JSON round trip changed the document beyond a float's last place\n{written}"
            );
            continue;
        }
        assert_eq!(
            again, doc,
            "{format} round trip changed the document\n{written}"
        );
        assert_eq!(
            revalidated, policy,
            "{format} round trip changed the policy"
        );
    }
}

/// Equal JSON values, except that two floats may be neighbours (one unit
/// in the last place apart): serde_json's float reading is not always
/// correctly rounded.
fn same_but_last_place(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() && y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            x == y || (x.signum() == y.signum() && x.to_bits().abs_diff(y.to_bits()) == 1)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_but_last_place(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_but_last_place(v, w)))
        }
        _ => a == b,
    }
}

/// The bytes as an HTTP/1.1 header block (`name: value` lines): the
/// proxy's one-pass request-header scan finds what `HeaderMap` lookups
/// find, header by header (`router_proxy::fuzzing::request_headers`).
pub fn request_headers(data: &[u8]) {
    router_proxy::fuzzing::request_headers(data);
}

/// The bytes as the fields of a route record: the hand-written line
/// writer writes serde_json's bytes for it (`router_proxy::fuzzing::route_log`).
pub fn route_log(data: &[u8]) {
    router_proxy::fuzzing::route_log(data);
}

/// The bytes as a control-plane message (protobuf): decoding, validating
/// and applying it to a config store never panics, refusals are values,
/// and what is served is what was decoded (`router_proxy::fuzzing::snapshot`).
pub fn snapshot(data: &[u8]) {
    router_proxy::fuzzing::snapshot(data);
}
