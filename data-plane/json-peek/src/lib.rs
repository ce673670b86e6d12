//! `router-json-peek`: the few fields the router reads from JSON bodies,
//! read in one pass that also checks the whole body.
//!
//! The proxy reads a handful of fields from every OpenAI-style request body
//! (`model`, `stream`, the token limits, `response_format.type`) and from
//! every buffered JSON answer (`model`, `usage`). It must also refuse a body
//! that is not valid JSON, so everything else in the body has to be checked,
//! though none of it is kept.
//!
//! [`peek_request`] and [`peek_answer`] do that in one pass over the bytes
//! with a small byte cursor:
//!
//! - the fields we read are decoded, and only they: a string that needs no
//!   unescaping is borrowed from the body, not copied;
//! - everything else is *skipped*: its syntax is checked as it is walked
//!   over, but no value is built, no string is unescaped and no number is
//!   converted. Open arrays and objects are tracked one bit each, so skipping
//!   needs no recursion and no allocation below 64 levels of nesting. The
//!   skipper only tells a valid value from an invalid one; an invalid one
//!   (or one nested deeper) is walked again by a slower, exact skipper that
//!   finds serde_json's error and its position;
//! - string contents are scanned eight bytes at a time for the only bytes
//!   that matter there: `"`, `\` and control characters (and digits eight
//!   at a time too);
//! - compact JSON is tried first (`,"` between members, `:` right after a
//!   key, a value right after its colon), whitespace second;
//! - the hot code is inlined into the two functions so that the cursor stays
//!   in registers; errors, escapes and rare shapes are out of line.
//!
//! # Why hand-written
//!
//! These functions replace `serde_json::from_slice` into small
//! `#[derive(Deserialize)]` structs. That was correct but cost about 8.4k
//! instructions per proxied call (about 12% of the proxy's user-space CPU),
//! most of it walking over the fields we ignore through serde's generic
//! visitor machinery. Here the same work is a tight loop over bytes: on the
//! benchmark's bodies, about 0.75k instructions for the request (serde_json:
//! 2.2k) and 2.3k for the answer (6.5k), about a third.
//!
//! Measured with callgrind on the benchmark's bodies and in the whole proxy
//! (`docs/benchmarks.md`, "Instructions per request" and the `json_peek`
//! rows): before this reader the JSON checks were 8.5k of the proxy's 78k
//! instructions per request. `tests/against_serde/speed.rs` measures the
//! two functions against serde_json again.
//!
//! It is a crate of its own because it has one job, a narrow interface
//! (two functions, their result types, one error type), nothing to do with
//! the rest of the router, and a test suite (against serde_json itself)
//! larger than the code.
//!
//! # Contract
//!
//! The contract is serde_json's behaviour for those structs (fields all
//! `#[serde(default)]`, unknown fields ignored): a body is accepted exactly
//! when serde_json accepts it, the fields have the same values, and errors
//! carry serde_json's message and position (`expected value at line 1
//! column 7`). The tests check this against serde_json itself, by
//! hand-written cases and by property tests on random and mutated
//! documents. Some consequences worth knowing:
//!
//! - ignored values are fully checked (string escapes, control characters,
//!   number grammar, literals, nesting) but, as in serde_json, strings inside
//!   them are not checked for valid UTF-8 or paired surrogate escapes,
//!   numbers are not checked for range, and their nesting depth is not
//!   limited. So an accepted body is not always one serde_json can read as
//!   a `Value`: a caller that re-encodes the body (the proxy rewriting
//!   `model`) parses it again and refuses it then (the test
//!   `bodies_the_model_rewrite_cannot_re_encode` lists such bodies);
//! - keys of the objects we read (the top level, `response_format`, `usage`)
//!   are unescaped and checked like any decoded string before they are
//!   matched, so `"mod\u0065l"` is `model`; a known key given twice is an
//!   error (``duplicate field `model` ``), even when the first value was
//!   `null`;
//! - `null` is an absent field; a wrong type is an error (`"stream":"true"`,
//!   `"max_tokens":1.5`, `-0`, `1e2`, or numbers beyond `u64`);
//! - `response_format` and `usage` may also be given as arrays of their
//!   fields in declaration order (`"usage":[9,12]`), as serde's derived
//!   structs allow.
//!
//! # Differences
//!
//! - serde's derived structs also accept a *top-level* array of fields in
//!   order (`["gpt-4o",true]`); these functions refuse any top-level value
//!   that is not an object, and say "expected a JSON object" where serde
//!   said "expected struct BodyPeek";
//! - in ``invalid type: floating point `…`, expected u64``, the float is
//!   Rust's correctly rounded reading of the number, where serde_json's own
//!   parsing is off in the last digit now and then;
//! - [`RequestPeek::model`] is borrowed when the string has no escapes,
//!   where serde always made a copy.
//!
//! # Modules
//!
//! - `request`: [`peek_request`] and [`RequestPeek`];
//! - `answer`: [`peek_answer`], [`AnswerPeek`] and [`Usage`];
//! - `parser`: the byte cursor both walk with, and the values they decode
//!   (strings, booleans, unsigned integers, nested structs);
//! - `skip`: the values they do not read, checked and walked over;
//! - `scan`: word-at-a-time scans (string content, digits) and the UTF-8
//!   check;
//! - `error`: [`PeekError`], with serde_json's wording and positions.

#![forbid(unsafe_code)]

mod answer;
mod error;
mod parser;
mod request;
mod scan;
mod skip;

pub use answer::{peek_answer, AnswerPeek, Usage, UsageDetails};
pub use error::PeekError;
pub use request::{peek_request, RequestPeek, ResponseFormatPeek};
