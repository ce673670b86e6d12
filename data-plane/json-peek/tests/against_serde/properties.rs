//! Property tests: generated documents (mostly objects whose members
//! often have the keys we read) and mutations of them and of realistic
//! bodies, each checked against serde_json.

use proptest::prelude::*;

use super::*;

/// A JSON value to print, with room for invalid bits (the string and
/// number texts are raw).
#[derive(Debug, Clone)]
enum Json {
    Null,
    Bool(bool),
    Number(String),
    /// The bytes between the quotes.
    Str(Vec<u8>),
    Array(Vec<Json>),
    Object(Vec<(Vec<u8>, Json)>),
}

impl Json {
    /// Prints with whitespace chosen by `seed`.
    fn print(&self, seed: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rng = seed | 1;
        self.write(&mut out, &mut rng);
        out
    }

    fn write(&self, out: &mut Vec<u8>, rng: &mut u64) {
        fn ws(out: &mut Vec<u8>, rng: &mut u64) {
            // xorshift64
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            let pick = *rng % 16;
            out.extend_from_slice(match pick {
                0 => b" ",
                1 => b"\n  ",
                2 => b"\t",
                3 => b"\r\n",
                _ => b"",
            });
        }
        ws(out, rng);
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(true) => out.extend_from_slice(b"true"),
            Json::Bool(false) => out.extend_from_slice(b"false"),
            Json::Number(n) => out.extend_from_slice(n.as_bytes()),
            Json::Str(s) => {
                out.push(b'"');
                out.extend_from_slice(s);
                out.push(b'"');
            }
            Json::Array(items) => {
                out.push(b'[');
                for (k, item) in items.iter().enumerate() {
                    if k > 0 {
                        out.push(b',');
                    }
                    item.write(out, rng);
                }
                ws(out, rng);
                out.push(b']');
            }
            Json::Object(members) => {
                out.push(b'{');
                for (k, (key, value)) in members.iter().enumerate() {
                    if k > 0 {
                        out.push(b',');
                    }
                    ws(out, rng);
                    out.push(b'"');
                    out.extend_from_slice(key);
                    out.push(b'"');
                    ws(out, rng);
                    out.push(b':');
                    value.write(out, rng);
                }
                ws(out, rng);
                out.push(b'}');
            }
        }
        ws(out, rng);
    }
}

/// String contents: plain text, escapes of every kind, raw UTF-8 and,
/// now and then, invalid UTF-8 or lone surrogates.
fn string_content() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        8 => prop::collection::vec(
            prop::sample::select(b"abcxyzABCXYZ0189 _.-".to_vec()),
            1..7
        ),
        2 => prop::sample::select(vec![
            r#"\""#, r"\\", r"\/", r"\b", r"\f", r"\n", r"\r", r"\t",
            r"\u0041", r"\u00e9", r"\u20AC", r"\ud83d\ude00", r"\uD83D\uDE00",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::sample::select(vec!["\u{e9}", "\u{20ac}", "\u{1f600}", "\u{7f}"])
            .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::sample::select(vec![
            &b"\xff"[..], b"\xc3", b"\xed\xa0\x80", b"\\ud800", b"\\udc00",
            b"\\ud800\\u0041", b"\t", b"\\x", b"\\u12",
        ])
        .prop_map(<[u8]>::to_vec),
    ];
    prop::collection::vec(piece, 0..4).prop_map(|pieces| pieces.concat())
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u64..100_000).prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
        2 => (
            any::<bool>(),
            prop_oneof![Just(0u128), 1..u128::from(u64::MAX) * 1000],
            prop::option::of(0u16..10_000),
            prop::option::of((prop::sample::select(vec!["e", "E", "e+", "e-", "E-"]), 0u16..1000)),
        )
            .prop_map(|(minus, int, frac, exp)| {
                let mut n = format!("{}{int}", if minus { "-" } else { "" });
                if let Some(frac) = frac {
                    n += &format!(".{frac:04}");
                }
                if let Some((e, exp)) = exp {
                    n += &format!("{e}{exp}");
                }
                n
            }),
        1 => prop::sample::select(vec![
            "-0", "0.0", "1e2", "18446744073709551615", "18446744073709551616",
            "-9223372036854775808", "-9223372036854775809", "1e400", "01", "1.",
            "-", "+1", ".5", "1e", "0x10",
        ])
        .prop_map(String::from),
    ]
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    let known = prop::sample::select(vec![
        "model",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "response_format",
        "type",
        "usage",
        "prompt_tokens",
        "completion_tokens",
        "input_tokens",
        "output_tokens",
        "prompt_tokens_details",
        "input_tokens_details",
        "cached_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "messages",
        "id",
    ]);
    prop_oneof![
        3 => known.clone().prop_map(|k| k.as_bytes().to_vec()),
        // A known key with one letter escaped.
        1 => (known, any::<prop::sample::Index>()).prop_map(|(k, at)| {
            let at = at.index(k.len());
            format!("{}\\u{:04x}{}", &k[..at], k.as_bytes()[at], &k[at + 1..]).into_bytes()
        }),
        2 => string_content(),
    ]
}

fn leaf() -> BoxedStrategy<Json> {
    prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        number().prop_map(Json::Number),
        string_content().prop_map(Json::Str),
    ]
    .boxed()
}

fn tokens() -> impl Strategy<Value = Json> {
    prop_oneof![
        4 => (0u64..100_000).prop_map(|n| Json::Number(n.to_string())),
        1 => Just(Json::Null),
        1 => number().prop_map(Json::Number),
    ]
}

/// A known key with a value of (mostly) its type.
fn known_member() -> BoxedStrategy<(Vec<u8>, Json)> {
    let named = |name: &str, v: BoxedStrategy<Json>| (Just(name.as_bytes().to_vec()), v);
    let text = || string_content().prop_map(Json::Str).boxed();
    // `*_tokens_details`: `{"cached_tokens": N}` or its array form.
    let details = || {
        prop_oneof![
            4 => prop::collection::vec(
                (
                    prop::sample::select(vec!["cached_tokens", "audio_tokens"])
                        .prop_map(|k| k.as_bytes().to_vec()),
                    tokens(),
                ),
                0..3,
            )
            .prop_map(Json::Object),
            1 => prop::collection::vec(tokens(), 0..3).prop_map(Json::Array),
            1 => tokens(),
        ]
    };
    let usage = prop_oneof![
        prop::collection::vec(
            prop_oneof![
                4 => (
                    prop::sample::select(vec![
                        "prompt_tokens",
                        "completion_tokens",
                        "input_tokens",
                        "output_tokens",
                        "total_tokens",
                        "cache_read_input_tokens",
                        "cache_creation_input_tokens",
                    ])
                    .prop_map(|k| k.as_bytes().to_vec()),
                    tokens(),
                ),
                1 => (
                    prop::sample::select(vec!["prompt_tokens_details", "input_tokens_details"])
                        .prop_map(|k| k.as_bytes().to_vec()),
                    details(),
                ),
            ],
            0..6,
        )
        .prop_map(Json::Object),
        prop::collection::vec(prop_oneof![4 => tokens(), 1 => details()], 0..9)
            .prop_map(Json::Array),
    ];
    let format = prop_oneof![
        3 => prop::sample::select(vec!["json_object", "json_schema", "text"])
            .prop_map(|t| Json::Object(vec![(b"type".to_vec(), Json::Str(t.into()))])),
        1 => (text(), prop::collection::vec((key(), leaf()), 0..3)).prop_map(|(t, mut rest)| {
            rest.push((b"type".to_vec(), t));
            rest.rotate_right(1);
            Json::Object(rest)
        }),
        1 => prop::collection::vec(text(), 0..3).prop_map(Json::Array),
    ];
    prop_oneof![
        2 => named("model", prop_oneof![4 => text(), 1 => leaf()].boxed()),
        1 => named("stream", prop_oneof![any::<bool>().prop_map(Json::Bool), leaf()].boxed()),
        1 => named("max_tokens", tokens().boxed()),
        1 => named("max_completion_tokens", tokens().boxed()),
        1 => named("max_output_tokens", tokens().boxed()),
        1 => named("response_format", prop_oneof![4 => format, 1 => leaf()].boxed()),
        1 => named("usage", prop_oneof![4 => usage, 1 => leaf()].boxed()),
    ]
    .boxed()
}

/// Documents: mostly objects whose members (at every level) often have
/// known keys. The strategies are built once: proptest rebuilds the
/// recursive part for every case.
fn document() -> impl Strategy<Value = Json> {
    let known = known_member();
    let key = key().boxed();
    let member = move |inner: BoxedStrategy<Json>| prop_oneof![7 => known.clone(), 5 => (key.clone(), inner)];
    let value = {
        let member = member.clone();
        leaf().prop_recursive(4, 40, 5, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
                prop::collection::vec(member(inner), 0..5).prop_map(Json::Object),
            ]
        })
    }
    .boxed();
    prop_oneof![
        12 => prop::collection::vec(member(value.clone()), 0..7).prop_map(Json::Object),
        1 => value,
    ]
}

/// Realistic bodies to mutate besides generated ones.
fn seed_body() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec![
        BENCH_REQUEST.to_vec(),
        BENCH_ANSWER.as_bytes().to_vec(),
        br#"{
  "model": "gpt-4o-mini",
  "stream": false,
  "max_completion_tokens": 256,
  "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "number", "minimum": -1.5e3}}}}},
  "messages": [{"role": "system", "content": "Be \"brief\".\n\u00e9\ud83d\ude00"}, {"role": "user", "content": "hi"}],
  "temperature": 0.2, "tools": [], "user": null
}"#
        .to_vec(),
        br#"{"id":"resp_1","model":"m","output":[{"type":"message","content":[{"type":"output_text","text":"ok"}]}],"usage":{"input_tokens":5,"output_tokens":7,"total_tokens":12}}"#.to_vec(),
    ])
}

#[derive(Debug, Clone)]
enum Mutation {
    Insert(prop::sample::Index, u8),
    Delete(prop::sample::Index),
    Replace(prop::sample::Index, u8),
    Truncate(prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        4 => prop::sample::select(b"{}[]\":,\\ 0123456789-+.eEtrufalsn\n\t/u".to_vec()),
        1 => any::<u8>(),
    ];
    let at = any::<prop::sample::Index>;
    prop_oneof![
        3 => (at(), byte.clone()).prop_map(|(a, b)| Mutation::Insert(a, b)),
        3 => at().prop_map(Mutation::Delete),
        3 => (at(), byte).prop_map(|(a, b)| Mutation::Replace(a, b)),
        1 => at().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut b: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        match m {
            Mutation::Insert(at, c) => b.insert(at.index(b.len() + 1), *c),
            Mutation::Delete(at) if !b.is_empty() => {
                b.remove(at.index(b.len()));
            }
            Mutation::Replace(at, c) if !b.is_empty() => {
                let at = at.index(b.len());
                b[at] = *c;
            }
            Mutation::Truncate(at) => b.truncate(at.index(b.len() + 1)),
            _ => {}
        }
    }
    b
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        // ChaCha, the default, is most of the time in debug builds.
        rng_algorithm: prop::test_runner::RngAlgorithm::XorShift,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(20_000))]

    #[test]
    fn generated_documents_match_serde(doc in document(), seed in any::<u64>()) {
        check(&doc.print(seed));
    }
}

proptest! {
    #![proptest_config(config(20_000))]

    #[test]
    fn mutated_documents_match_serde(
        doc in prop_oneof![1 => seed_body(), 2 => (document(), any::<u64>()).prop_map(|(d, s)| d.print(s))],
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        check(&mutate(doc, &mutations));
    }
}
