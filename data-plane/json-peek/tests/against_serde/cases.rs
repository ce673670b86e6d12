//! Hand-written bodies, each checked against serde_json.

use router_json_peek::ResponseFormatPeek;

use super::*;

#[test]
fn bench_bodies() {
    let r = check_request(BENCH_REQUEST).expect("bench request");
    assert_eq!(r.model, Some(Cow::Borrowed("bench")));
    assert!(matches!(r.model, Some(Cow::Borrowed(_))));
    assert_eq!(r.stream, None);
    assert_eq!(r.response_format, None);
    let a = check_answer(BENCH_ANSWER.as_bytes()).expect("bench answer");
    assert_eq!(a.model.as_deref(), Some("bench"));
    assert_eq!(
        a.usage,
        Some(Usage {
            prompt_tokens: Some(9),
            completion_tokens: Some(12),
            ..Usage::default()
        })
    );
    check(BENCH_ANSWER.as_bytes());
    check(BENCH_REQUEST);
}

#[test]
fn fields_and_types() {
    let r = check_request(
        br#" { "model" : "gpt-4o" , "stream" : true, "max_tokens": 18446744073709551615,
                "max_completion_tokens":0, "max_output_tokens" :7,
                "response_format": {"type": "json_schema", "json_schema": {"x": [1, {}]}} } "#,
    )
    .expect("valid");
    assert_eq!(r.model.as_deref(), Some("gpt-4o"));
    assert_eq!(r.stream, Some(true));
    assert_eq!(r.max_tokens, Some(u64::MAX));
    assert_eq!(r.max_completion_tokens, Some(0));
    assert_eq!(r.max_output_tokens, Some(7));
    assert_eq!(
        r.response_format.map(|f| f.kind).as_deref(),
        Some("json_schema")
    );
    let a = check_answer(br#"{"usage":{"input_tokens":3,"output_tokens":4}}"#).expect("ok");
    assert_eq!(a.usage.and_then(|u| u.output_tokens), Some(4));
    // The cache counts: OpenAI's details (inside the prompt) and
    // Anthropic's own fields (outside its input).
    let a = check_answer(
        br#"{"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,
            "prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},
            "completion_tokens_details":{"reasoning_tokens":0}}}"#,
    )
    .expect("ok");
    let u = a.usage.expect("usage");
    assert_eq!(
        u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        Some(1920)
    );
    assert_eq!(u.input_tokens_details, None);
    let a = check_answer(
        br#"{"usage":{"input_tokens":21,"cache_creation_input_tokens":188086,
            "cache_read_input_tokens":0,"output_tokens":393,
            "cache_creation":{"ephemeral_5m_input_tokens":188086}}}"#,
    )
    .expect("ok");
    let u = a.usage.expect("usage");
    assert_eq!(u.cache_creation_input_tokens, Some(188086));
    assert_eq!(u.cache_read_input_tokens, Some(0));
    for body in [
        r#"{"usage":{"prompt_tokens_details":null,"input_tokens_details":{}}}"#,
        r#"{"usage":{"input_tokens_details":{"cached_tokens":null}}}"#,
        r#"{"usage":{"input_tokens_details":[5]}}"#,
        r#"{"usage":{"input_tokens_details":[5,6]}}"#,
        r#"{"usage":{"input_tokens_details":[]}}"#,
        r#"{"usage":{"input_tokens_details":"x"}}"#,
        r#"{"usage":{"input_tokens_details":{"cached_tokens":-1}}}"#,
        r#"{"usage":{"input_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}"#,
        r#"{"usage":{"prompt_tokens_details":{"cached_tokens":1},"prompt_tokens_details":{}}}"#,
        r#"{"usage":[1,2,3,4,[7],null,8,9]}"#,
        r#"{"usage":[1,2,3,4,{"cached_tokens":7},[8],8,9,10]}"#,
        r#"{"usage":{"cache_read_input_tokens":1.5}}"#,
    ] {
        check(body.as_bytes());
    }
    for body in [
        // null is absent; absent type is "".
        r#"{"model":null,"stream":null,"max_tokens":null,"response_format":null}"#,
        r#"{"response_format":{}}"#,
        r#"{"response_format":{"type":"text","type2":1}}"#,
        r#"{"usage":null}"#,
        r#"{"usage":{}}"#,
        // Nested structs as arrays of their fields in order.
        r#"{"response_format":[]}"#,
        r#"{"response_format":["json_object"]}"#,
        r#"{"response_format":["json_object",1]}"#,
        r#"{"response_format":[null]}"#,
        r#"{"response_format":[ "a" , ]}"#,
        r#"{"response_format":[,]}"#,
        r#"{"response_format":["a" 1]}"#,
        r#"{"usage":[1,2,3,4]}"#,
        r#"{"usage":[1,null,3]}"#,
        r#"{"usage":[1,2,3,4,5]}"#,
        r#"{"usage":[1,2,3,4,]}"#,
        r#"{"usage":[1,2,3,4"#,
        r#"{"usage":[1,2"#,
        r#"{"usage":["#,
        // Wrong types.
        r#"{"stream":"true"}"#,
        r#"{"stream":1}"#,
        r#"{"stream":[true]}"#,
        r#"{"stream":{}}"#,
        r#"{"model":5}"#,
        r#"{"model":-5}"#,
        r#"{"model":true}"#,
        r#"{"model":["x"]}"#,
        r#"{"model":{"x":1}}"#,
        r#"{"max_tokens":1.5}"#,
        r#"{"max_tokens":-1}"#,
        r#"{"max_tokens":-0}"#,
        r#"{"max_tokens":0}"#,
        r#"{"max_tokens":1e2}"#,
        r#"{"max_tokens":1E+2}"#,
        r#"{"max_tokens":1.0}"#,
        r#"{"max_tokens":18446744073709551616}"#,
        r#"{"max_tokens":184467440737095516150}"#,
        r#"{"max_tokens":-9223372036854775808}"#,
        r#"{"max_tokens":-9223372036854775809}"#,
        r#"{"max_tokens":1e400}"#,
        r#"{"max_tokens":"5"}"#,
        r#"{"max_tokens":true}"#,
        r#"{"max_tokens":null}"#,
        r#"{"max_tokens":01}"#,
        r#"{"max_tokens":1.}"#,
        r#"{"max_tokens":1.e5}"#,
        r#"{"max_tokens":1e}"#,
        r#"{"max_tokens":-}"#,
        r#"{"max_tokens":-a}"#,
        r#"{"max_tokens":+1}"#,
        r#"{"max_tokens":.5}"#,
        r#"{"response_format":5}"#,
        r#"{"response_format":"json_object"}"#,
        r#"{"response_format":{"type":null}}"#,
        r#"{"response_format":{"type":5}}"#,
        r#"{"usage":{"prompt_tokens":"9"}}"#,
        r#"{"usage":7}"#,
        r#"{"usage":true}"#,
        // Duplicates: known fields (even after null), unknown ones.
        r#"{"model":null,"model":"x"}"#,
        r#"{"model":"a", "model"  :"b"}"#,
        r#"{"response_format":{"type":"a","type":"b"}}"#,
        r#"{"usage":{"prompt_tokens":1,"prompt_tokens":1}}"#,
        r#"{"x":1,"x":2,"x":{"y":1,"y":2}}"#,
        r#"{"usage":{},"usage":{}}"#,
        // Escaped keys are matched after unescaping.
        r#"{"mod\u0065l":"q"}"#,
        r#"{"mod\u0065l":"q","model":"r"}"#,
        r#"{"\u006dodel":"q\u00e9\ud83d\ude00\n"}"#,
        r#"{"model":"\/\b\f\n\r\t\"\\"}"#,
    ] {
        check(body.as_bytes());
    }
}

#[test]
fn syntax() {
    for body in [
        "",
        "   ",
        "{",
        "}",
        "{}",
        " {} \n\t\r",
        "{} x",
        "{}{}",
        "{},",
        "\u{feff}{}",
        "{}\u{0c}",
        "\u{0b}{}",
        "null",
        "nul",
        "true",
        "5",
        "-",
        "\"s\"",
        "\"s",
        "x",
        "{,}",
        "{\"a\"}",
        "{\"a\" 1}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":1 \"b\":2}",
        "{\"a\":1,,\"b\":2}",
        "{1:2}",
        "{\"a\":1",
        "{\"a\":1,",
        "{\"a\":",
        "{\"a\"",
        "{\"a",
        "{\"x\":[1,]}",
        "{\"x\":[,1]}",
        "{\"x\":[1 2]}",
        "{\"x\":[}",
        "{\"x\":{]}",
        "{\"x\":{\"a\":1,}}",
        "{\"x\":{,}}",
        "{\"x\":{\"a\" 1}}",
        "{\"x\":{1:1}}",
        "{\"x\":[[[]]]}",
        "{\"x\":[[[]]}",
        "{\"x\":[[[]]]]}",
        "{\"x\":[",
        "{\"x\":{",
        "{\"x\":{\"a\"",
        "{\"x\":{\"a\":",
        "{\"x\":tru}",
        "{\"x\":truex}",
        "{\"x\":nulL}",
        "{\"x\":f}",
        "{\"x\":01}",
        "{\"x\":-01}",
        "{\"x\":-0}",
        "{\"x\":-}",
        "{\"x\":--1}",
        "{\"x\":1.}",
        "{\"x\":1.e1}",
        "{\"x\":1e}",
        "{\"x\":1e+}",
        "{\"x\":1e+1}",
        "{\"x\":1E-01}",
        "{\"x\":1.5e308}",
        "{\"x\":1e99999}",
        "{\"x\":99999999999999999999999999}",
        "{\"x\":1",
        "{\"x\":1.",
        "{\"x\":1e",
        "{\"x\":-",
        "{\"x\":\"\\x\"}",
        "{\"x\":\"\\u12g4\"}",
        "{\"x\":\"\\u12\"}",
        "{\"x\":\"\\u12",
        "{\"x\":\"\\",
        "{\"x\":\"\t\"}",
        "{\"x\":\"\u{1f}\"}",
        "{\"x\":\"\u{7f}\"}",
        "{\"x\":\"abc",
        "{\"model\":\"abc",
        "{\"model\":\"a\tb\"}",
        "{\"model\":\"\\x\"}",
        "{\"model\":\"\\",
        "{\"model\":\"\\u00",
        "{\"model\":\"\\uZZZZ\"}",
        "{\"model\"\n:\n\"a\"\n,\n\"x\"\n:\n[\n1\n,\n]\n}",
        "{\n  \"a\": 1,\n  \"b\": [\n    2,\n    x\n  ]\n}",
        "{\"a\":1}\n\n  x",
    ] {
        check(body.as_bytes());
    }
}

#[test]
fn unicode() {
    for body in [
        // Invalid UTF-8: fine in ignored strings and keys of ignored
        // objects, an error in read strings and in keys we match.
        &b"{\"x\":\"\xff\"}"[..],
        b"{\"x\":{\"\xff\":1}}",
        b"{\"x\":[\"\xc3\"]}",
        b"{\"\xff\":1}",
        b"{\"model\":\"\xff\"}",
        b"{\"model\":\"ab\xc3\"}",
        b"{\"model\":\"\\n\xc3\xa9\xc3\"}",
        b"{\"model\":\"\xc3\\n\xa9\"}",
        b"{\"model\":\"\xed\xa0\x80\"}",
        b"{\"model\":\"\xf4\x90\x80\x80\"}",
        b"{\"response_format\":{\"type\":\"\xff\"}}",
        b"{\"response_format\":{\"\xff\":1}}",
        b"{\"usage\":{\"\xff\":1}}",
        b"{\"x\":1}\xff",
        b"\xff{}",
        // Raw UTF-8 is fine everywhere.
        "{\"model\":\"h\u{e9}llo \u{1f600}\",\"\u{e9}\":\"\u{e9}\"}".as_bytes(),
        // Lone and broken surrogate escapes: fine when ignored.
        b"{\"x\":\"\\ud800\"}",
        b"{\"x\":\"\\udc00\"}",
        b"{\"x\":{\"\\ud800\":1}}",
        b"{\"\\ud800\":1}",
        b"{\"\\udc00\":1}",
        b"{\"model\":\"\\ud800\"}",
        b"{\"model\":\"\\ud800x\"}",
        b"{\"model\":\"\\ud800\\n\"}",
        b"{\"model\":\"\\ud800\\u0041\"}",
        b"{\"model\":\"\\ud800\\ud800\"}",
        b"{\"model\":\"\\udc00\"}",
        b"{\"model\":\"\\ud83d\\ude00\"}",
        b"{\"model\":\"\\uD83D\\uDE00\"}",
        b"{\"model\":\"\\ud800",
        b"{\"model\":\"\\ud800\\",
        b"{\"model\":\"\\ud800\\u",
        b"{\"model\":\"\\ud800\\udc0",
        b"{\"model\":\"\\u0000\"}",
        b"{\"model\":\"\\uffff\"}",
    ] {
        check(body);
    }
}

#[test]
fn multiline_positions() {
    for body in [
        "{\n\"a\":1,\n\"model\":5\n}",
        "{\n\"a\":1,\n\"model\":\"x\",\r\n\"model\" \n:1}",
        "{\n\n\"x\":[1,\n2,\n]\n}",
        "\n\n",
        "{\"model\":\"a\"\n}\n\nx",
    ] {
        check(body.as_bytes());
    }
}

#[test]
fn deep_nesting_in_ignored_values() {
    // serde_json skips ignored values without a depth limit.
    for depth in [63, 64, 65, 127, 128, 129, 200, 100_000] {
        let arrays = format!("{{\"x\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        check(arrays.as_bytes());
        let objects = format!(
            "{{\"x\":{}1{}}}",
            "{\"a\":".repeat(depth),
            "}".repeat(depth)
        );
        check(objects.as_bytes());
        let mixed = format!(
            "{{\"x\":{}{}, \"model\":\"m\"}}",
            "[{\"a\":".repeat(depth),
            "null}]".repeat(depth)
        );
        check(mixed.as_bytes());
        // Unbalanced at depth.
        check(format!("{{\"x\":{}{}}}", "[".repeat(depth), "]".repeat(depth - 1)).as_bytes());
        check(format!("{{\"x\":{}", "[{\"a\":".repeat(depth)).as_bytes());
        check(format!("{{\"x\":{}}}]", "[".repeat(depth)).as_bytes());
    }
}

/// The request bodies of the proxy's model-rewrite refusal (issue 14,
/// item 10): serde_json *skips* these values without complaint, so the
/// reference structs accept them and so does the peek (nothing accepted
/// here that serde_json refuses); but serde_json cannot *read* them as a
/// `Value`, so a body that must be re-encoded with a pool's model is
/// refused by the proxy (`handler::upstream_request`), never passed on as
/// it came.
#[test]
fn bodies_the_model_rewrite_cannot_re_encode() {
    let chat = |content: &[u8]| {
        let mut b = br#"{"model":"client","messages":[{"role":"user","content":"#.to_vec();
        b.extend_from_slice(content);
        b.extend_from_slice(b"}]}");
        b
    };
    let deep = |depth: usize| {
        format!(
            r#"{{"model":"client","messages":[],"x":{}1{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
        .into_bytes()
    };
    for body in [
        // Nesting past serde_json's recursion limit (128 levels, the
        // top-level object included).
        deep(127),
        deep(300),
        // Invalid UTF-8 inside a string: a stray byte, a truncated and an
        // overlong sequence, an encoded surrogate.
        chat(b"\"\xff\""),
        chat(b"\"\xc3\""),
        chat(b"\"\xc0\x80\""),
        chat(b"\"\xed\xa0\x80\""),
        // Lone surrogate escapes.
        chat(br#""\ud800""#),
        chat(br#""\udc00x""#),
        chat(br#""\ud800\u0041""#),
        // A number out of f64's range.
        chat(b"1e400"),
    ] {
        let peek = check_request(&body);
        assert!(peek.is_ok(), "{}: {peek:?}", show(&body));
        assert!(
            serde_json::from_slice::<serde_json::Value>(&body).is_err(),
            "{}",
            show(&body)
        );
        check(&body);
    }
    // Within the limit, both read it.
    let ok = deep(126);
    assert!(check_request(&ok).is_ok());
    assert!(serde_json::from_slice::<serde_json::Value>(&ok).is_ok());
}

#[test]
fn top_level_array_is_refused() {
    for body in ["[]", " [\"m\", true]", "[1,2]"] {
        let e = peek_request(body.as_bytes()).expect_err("an array");
        assert!(e.to_string().contains("expected a JSON object"), "{e}");
        let e = peek_answer(body.as_bytes()).expect_err("an array");
        assert!(e.to_string().contains("expected a JSON object"), "{e}");
    }
    // serde_json would take it (this is the one documented difference).
    assert!(serde_json::from_slice::<reference::BodyPeek<'_>>(b"[\"m\",true]").is_ok());
    let e = peek_request(b"\"s\"").expect_err("a string");
    assert_eq!(
        e.to_string(),
        "invalid type: string \"s\", expected a JSON object at line 1 column 3"
    );
}

#[test]
fn model_is_borrowed_without_escapes() {
    let r = peek_request(br#"{"model":"plain"}"#).expect("ok");
    assert!(matches!(r.model, Some(Cow::Borrowed("plain"))));
    let r = peek_request(br#"{"model":"a\u0062"}"#).expect("ok");
    assert!(matches!(r.model, Some(Cow::Owned(ref m)) if m == "ab"));
    let r = peek_request(br#"{"response_format":{"type":"json_object"}}"#).expect("ok");
    assert!(matches!(
        r.response_format,
        Some(ResponseFormatPeek {
            kind: Cow::Borrowed("json_object")
        })
    ));
}

/// Errors in skipped values at every kind of place: the fast skipper
/// gives up on them and the exact one must find serde_json's error,
/// whatever the fast one read after it gave up.
#[test]
fn errors_inside_skipped_values() {
    let values = [
        // Strings: escapes and control characters before, across and
        // after the eight-byte steps, and in the body's last bytes.
        r#""a\nb""#,
        r#""abcdefg\"h""#,
        r#""abcdefgh\u0041""#,
        r#""abcdefghijklmno\/p""#,
        "\"abc\u{1}def\"",
        "\"abcdefghij\u{1f}\"",
        r#""abc\x""#,
        r#""abcdefghijk\u12G4""#,
        r#""abc\u12""#,
        r#""abc"#,
        r#""abcdefghijklmnopq"#,
        // Numbers: long digit runs, then whatever follows.
        "12345678901234567890123",
        "1234567890123456789.5e-7",
        "123456789012.",
        "12345678901234e",
        "12345678901234e+",
        "-",
        "-0123",
        "0.1234567890123456789E+123456789012",
        // Literals.
        "nul",
        "nulx",
        "tru",
        "fals",
        "falsey",
        // Nesting: keys, colons and commas, compact and not.
        r#"{"a":1,"b":[1,2,{"c":"d"}],"e":{}}"#,
        r#"{"a" : 1 , "b" : [ 1 , 2 , { "c" : "d" } ] }"#,
        r#"{"a":1,"b"}"#,
        r#"{"a":1,"b" 2}"#,
        r#"{"a":1,}"#,
        r#"{"a":1 "b":2}"#,
        r#"{"a\"b":1,"c\u0041":"d\n"}"#,
        r#"{"a":"b\x"}"#,
        r#"[1,2,]"#,
        r#"[1 2]"#,
        r#"[{"a":[{"b":[{"c":tru}]}]}]"#,
        r#"[{"a":[{"b":[{"c":"\u00"}]}]}]"#,
        r#"[[[[[[[[[[]]]]]]]]]]"#,
        r#"[[[[[[[[[[]]]]]]]]]"#,
        r#"{"a":{"b":{"c":{}}}}}"#,
        r#"{"a":[}"#,
        r#"{"a":{]}"#,
        "[\n1,\n\"x\u{0}\"\n]",
    ];
    for value in values {
        for body in [
            format!(r#"{{"x":{value}}}"#),
            format!(r#"{{"x":{value},"model":"m"}}"#),
            format!(r#"{{"model":"m", "x" : {value} , "usage":{{"y":{value}}}}}"#),
            format!(r#"{{"usage":{{"prompt_tokens":1,"x":{value}}},"id":"abcdefghijklmnop"}}"#),
        ] {
            check(body.as_bytes());
        }
    }
}
