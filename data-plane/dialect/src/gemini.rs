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

use serde_json::{json, Map, Value};

use crate::json::{as_array, as_obj, field, index, opt_str, parse_object, path, req_str, Obj};
use crate::{
    Answer, Dialect, DialectError, ImageSource, Message, Part, Reasoning, Request, ResponseFormat,
    Role, StopReason, TextBlock, Tool, ToolChoice, Uncarried, Usage, WriteOptions,
};

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

/// Parses a Gemini `generateContent` request body.
pub fn parse_request(body: &[u8]) -> Result<Request, DialectError> {
    let m = camel(&parse_object(body)?);
    let mut req = Request {
        origin: Dialect::Gemini,
        ..Request::default()
    };
    for (k, v) in &m {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "contents" => parse_contents(v, &mut req)?,
            "systemInstruction" => {
                let s = obj_camel(v, k)?;
                for (i, p) in as_array(s.get("parts").unwrap_or(&Value::Null), &path(k, "parts"))?
                    .iter()
                    .enumerate()
                {
                    let at = index(&path(k, "parts"), i);
                    let p = obj_camel(p, &at)?;
                    req.system.push(TextBlock {
                        text: req_str(&p, "text", &at)?.to_owned(),
                        cache_control: None,
                    });
                }
            }
            "tools" => {
                for (i, t) in as_array(v, k)?.iter().enumerate() {
                    let at = index(k, i);
                    let o = obj_camel(t, &at)?;
                    match (o.len(), o.get("functionDeclarations")) {
                        (1, Some(decls)) => {
                            let dat = path(&at, "functionDeclarations");
                            for (j, d) in as_array(decls, &dat)?.iter().enumerate() {
                                let dat = index(&dat, j);
                                let d = obj_camel(d, &dat)?;
                                let params = field(&d, "parametersJsonSchema")
                                    .cloned()
                                    .or_else(|| field(&d, "parameters").map(lower_schema_types))
                                    .unwrap_or(Value::Null);
                                req.tools.push(Tool::Function {
                                    name: req_str(&d, "name", &dat)?.to_owned(),
                                    description: opt_str(&d, "description", &dat)?
                                        .map(str::to_owned),
                                    parameters: params,
                                    strict: None,
                                    cache_control: None,
                                });
                            }
                        }
                        _ => req.tools.push(Tool::Other {
                            dialect: Dialect::Gemini,
                            value: t.clone(),
                        }),
                    }
                }
            }
            "toolConfig" => {
                let c = obj_camel(v, k)?;
                let choice = match field(&c, "functionCallingConfig") {
                    Some(f) if c.len() == 1 => {
                        let f = obj_camel(f, &path(k, "functionCallingConfig"))?;
                        let names: Vec<&str> = f
                            .get("allowedFunctionNames")
                            .and_then(Value::as_array)
                            .map(|a| a.iter().filter_map(Value::as_str).collect())
                            .unwrap_or_default();
                        match (f.get("mode").and_then(Value::as_str), names.as_slice()) {
                            (Some("AUTO") | None, []) => Some(ToolChoice::Auto),
                            (Some("NONE"), []) => Some(ToolChoice::None),
                            (Some("ANY"), []) => Some(ToolChoice::Required),
                            (Some("ANY"), [one]) => Some(ToolChoice::Tool((*one).to_owned())),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                match choice {
                    Some(c) => req.tool_choice = Some(c),
                    None => {
                        req.extra.insert(k.clone(), v.clone());
                    }
                }
            }
            "generationConfig" => parse_generation_config(v, &mut req)?,
            _ => {
                req.extra.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(req)
}

fn parse_generation_config(v: &Value, req: &mut Request) -> Result<(), DialectError> {
    const AT: &str = "generationConfig";
    let g = obj_camel(v, AT)?;
    let mut mime = None;
    let mut schema = None;
    for (k, v) in &g {
        if v.is_null() {
            continue;
        }
        let at = path(AT, k);
        let bad = |why: &str| DialectError::invalid(at.clone(), why.to_owned());
        match k.as_str() {
            "stopSequences" => {
                for (i, s) in as_array(v, &at)?.iter().enumerate() {
                    req.stop.push(
                        s.as_str()
                            .ok_or_else(|| {
                                DialectError::invalid(index(&at, i), "expected a string")
                            })?
                            .to_owned(),
                    );
                }
            }
            "maxOutputTokens" => {
                req.max_tokens = Some(v.as_u64().ok_or_else(|| bad("expected a count"))?)
            }
            "temperature" => {
                req.temperature = Some(v.as_f64().ok_or_else(|| bad("expected a number"))?)
            }
            "topP" => req.top_p = Some(v.as_f64().ok_or_else(|| bad("expected a number"))?),
            "topK" => req.top_k = Some(v.as_u64().ok_or_else(|| bad("expected a count"))?),
            "seed" => req.seed = Some(v.as_i64().ok_or_else(|| bad("expected an integer"))?),
            "presencePenalty" => {
                req.presence_penalty = Some(v.as_f64().ok_or_else(|| bad("expected a number"))?)
            }
            "frequencyPenalty" => {
                req.frequency_penalty = Some(v.as_f64().ok_or_else(|| bad("expected a number"))?)
            }
            "responseMimeType" => mime = Some(v.as_str().ok_or_else(|| bad("expected a string"))?),
            "responseJsonSchema" => schema = Some(v.clone()),
            "responseSchema" => schema = Some(lower_schema_types(v)),
            "candidateCount" if v.as_u64() == Some(1) => {}
            "thinkingConfig" => {
                let t = obj_camel(v, &at)?;
                let budget = t.get("thinkingBudget").and_then(Value::as_i64);
                let level = t.get("thinkingLevel").and_then(Value::as_str);
                req.reasoning = match (budget, level) {
                    (Some(0), None) => Some(Reasoning::Off),
                    (Some(-1), None) => Some(Reasoning::Adaptive),
                    (Some(n), None) if n > 0 => Some(Reasoning::Budget(n.unsigned_abs())),
                    (None, Some(l)) => Some(Reasoning::Effort(l.to_ascii_lowercase())),
                    (None, None) => None,
                    _ => {
                        req.extra.insert(format!("{AT}.{k}"), v.clone());
                        None
                    }
                };
            }
            _ => {
                req.extra.insert(format!("{AT}.{k}"), v.clone());
            }
        }
    }
    match (mime, schema) {
        (None | Some("text/plain"), None) => {}
        (Some("application/json"), None) => req.response_format = Some(ResponseFormat::JsonObject),
        (Some("application/json"), Some(schema)) => {
            req.response_format = Some(ResponseFormat::JsonSchema {
                name: "response".to_owned(),
                schema,
                strict: None,
            })
        }
        (mime, schema) => {
            if let Some(m) = mime {
                req.extra.insert(format!("{AT}.responseMimeType"), m.into());
            }
            if let Some(s) = schema {
                req.extra.insert(format!("{AT}.responseJsonSchema"), s);
            }
        }
    }
    Ok(())
}

fn parse_contents(v: &Value, req: &mut Request) -> Result<(), DialectError> {
    // Calls not yet answered, by name: (name, id).
    let mut open_calls: Vec<(String, String)> = Vec::new();
    for (i, c) in as_array(v, "contents")?.iter().enumerate() {
        let at = index("contents", i);
        let c = obj_camel(c, &at)?;
        let role = match opt_str(&c, "role", &at)? {
            None | Some("user") | Some("function") => Role::User,
            Some("model") => Role::Assistant,
            Some(other) => {
                return Err(DialectError::invalid(
                    path(&at, "role"),
                    format!("unknown role `{other}`"),
                ))
            }
        };
        let pat = path(&at, "parts");
        let mut parts = Vec::new();
        for (j, p) in as_array(c.get("parts").unwrap_or(&Value::Null), &pat)?
            .iter()
            .enumerate()
        {
            let at = index(&pat, j);
            parts.push(parse_part(p, &at, &mut open_calls, || {
                format!("call_{i}_{j}")
            })?);
        }
        let mut msg = Message::new(role, parts);
        msg.source_index = Some(i);
        req.messages.push(msg);
    }
    Ok(())
}

fn parse_part(
    p: &Value,
    at: &str,
    open_calls: &mut Vec<(String, String)>,
    new_id: impl FnOnce() -> String,
) -> Result<Part, DialectError> {
    let o = obj_camel(p, at)?;
    let other = || Part::Other {
        dialect: Dialect::Gemini,
        value: p.clone(),
    };
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    let sig = opt_str(&o, "thoughtSignature", at)?.map(str::to_owned);
    let known = |extra: &[&str]| {
        keys.iter()
            .all(|k| extra.contains(k) || *k == "thoughtSignature")
    };
    if let Some(text) = field(&o, "text") {
        if !known(&["text", "thought"]) {
            return Ok(other());
        }
        let text = text
            .as_str()
            .ok_or_else(|| DialectError::invalid(path(at, "text"), "expected a string"))?
            .to_owned();
        return Ok(if o.get("thought").and_then(Value::as_bool) == Some(true) {
            Part::Thinking {
                text,
                signature: sig,
            }
        } else {
            Part::text(text)
        });
    }
    if let (Some(d), true) = (field(&o, "inlineData"), known(&["inlineData"])) {
        let dat = path(at, "inlineData");
        let d = obj_camel(d, &dat)?;
        let mime = req_str(&d, "mimeType", &dat)?;
        if !mime.starts_with("image/") {
            return Ok(other());
        }
        return Ok(Part::Image {
            source: ImageSource::Base64 {
                media_type: mime.to_owned(),
                data: req_str(&d, "data", &dat)?.to_owned(),
            },
            detail: None,
            cache_control: None,
        });
    }
    if let (Some(f), true) = (field(&o, "functionCall"), known(&["functionCall"])) {
        let fat = path(at, "functionCall");
        let f = obj_camel(f, &fat)?;
        let name = req_str(&f, "name", &fat)?.to_owned();
        let base = opt_str(&f, "id", &fat)?
            .map(str::to_owned)
            .unwrap_or_else(new_id);
        let id = tool_id_with_signature(&base, sig.as_deref());
        open_calls.push((name.clone(), id.clone()));
        return Ok(Part::ToolUse {
            id,
            name,
            input: f
                .get("args")
                .map(Value::to_string)
                .unwrap_or_else(|| "{}".into()),
            signature: sig,
            cache_control: None,
        });
    }
    if let (Some(f), true) = (field(&o, "functionResponse"), known(&["functionResponse"])) {
        let fat = path(at, "functionResponse");
        let f = obj_camel(f, &fat)?;
        let name = req_str(&f, "name", &fat)?;
        let id = match open_calls.iter().rposition(|(n, _)| n == name) {
            Some(k) => open_calls.remove(k).1,
            None => opt_str(&f, "id", &fat)?
                .map(str::to_owned)
                .unwrap_or_else(|| name.to_owned()),
        };
        let response = f.get("response").cloned().unwrap_or(json!({}));
        let only = |key: &str| {
            response
                .as_object()
                .filter(|r| r.len() == 1)
                .and_then(|r| r.get(key))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let (text, is_error) = match (only("output"), only("error")) {
            (Some(out), _) => (out, false),
            (None, Some(err)) => (err, true),
            (None, None) => (response.to_string(), false),
        };
        return Ok(Part::ToolResult {
            tool_use_id: id,
            content: vec![Part::text(text)],
            is_error,
            cache_control: None,
        });
    }
    Ok(other())
}

/// Writes `req` as a Gemini request body; what cannot be carried is
/// pushed to `lost`. The model goes in the URL ([`endpoint_path`]).
pub(crate) fn write_request(
    req: &Request,
    _opts: &WriteOptions,
    lost: &mut Vec<Uncarried>,
) -> Value {
    const TO: Dialect = Dialect::Gemini;
    let same = req.origin == TO;
    let mut m = Map::new();
    let mut contents: Vec<(Role, Vec<Value>)> = Vec::new();
    let mut calls: Vec<(&str, &str)> = Vec::new();
    for (i, msg) in req.messages.iter().enumerate() {
        let at = msg.path(if same { "contents" } else { "messages" }, i);
        if msg.role == Role::System {
            lost.push(Uncarried::new(
                at,
                TO,
                "a system message inside the conversation (Gemini has one system instruction, before it)",
            ));
            continue;
        }
        let mut parts = Vec::new();
        for (j, p) in msg.content.iter().enumerate() {
            let pat = format!("{at}.content[{j}]");
            match p {
                Part::Text { text, .. } => parts.push(json!({"text": text})),
                Part::Image { source, .. } => match source {
                    ImageSource::Base64 { media_type, data } => {
                        parts.push(json!({"inlineData": {"mimeType": media_type, "data": data}}))
                    }
                    ImageSource::Url(_) => lost.push(Uncarried::new(
                        pat,
                        TO,
                        "an image by URL (Gemini takes inline images or files uploaded to it, and the router fetches nothing)",
                    )),
                },
                Part::ToolUse {
                    id,
                    name,
                    input,
                    signature,
                    ..
                } => {
                    let args = if input.trim().is_empty() {
                        Some(json!({}))
                    } else {
                        serde_json::from_str::<Value>(input).ok().filter(Value::is_object)
                    };
                    let Some(args) = args else {
                        lost.push(Uncarried::new(
                            pat,
                            TO,
                            "the tool call's arguments are not a JSON object, which Gemini requires",
                        ));
                        continue;
                    };
                    calls.push((id, name));
                    let mut part = json!({"functionCall": {"name": name, "args": args}});
                    if let Some(s) = signature {
                        part["thoughtSignature"] = s.clone().into();
                    }
                    parts.push(part);
                }
                Part::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                    ..
                } => {
                    let Some(name) = calls
                        .iter()
                        .rev()
                        .find(|(id, _)| *id == tool_use_id)
                        .map(|(_, n)| *n)
                    else {
                        lost.push(Uncarried::new(
                            pat,
                            TO,
                            "a tool result for no earlier call (Gemini needs the function's name)",
                        ));
                        continue;
                    };
                    let mut text = String::new();
                    for (k, c) in content.iter().enumerate() {
                        match c {
                            Part::Text { text: t, .. } => text.push_str(t),
                            _ => lost.push(Uncarried::new(
                                format!("{pat}.content[{k}]"),
                                TO,
                                "a Gemini function response carries text only here",
                            )),
                        }
                    }
                    let response = if *is_error {
                        json!({"error": text})
                    } else {
                        serde_json::from_str::<Value>(&text)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| json!({"output": text}))
                    };
                    parts.push(json!({"functionResponse": {"name": name, "response": response}}));
                }
                Part::Thinking { text, signature } => {
                    // Only Gemini's own signed thoughts go back; others'
                    // reasoning is dropped on purpose.
                    if let (true, Some(s)) = (same, signature) {
                        parts.push(json!({"text": text, "thought": true, "thoughtSignature": s}));
                    }
                }
                Part::RedactedThinking { .. } => {}
                Part::Other {
                    dialect: Dialect::Gemini,
                    value,
                } => parts.push(value.clone()),
                Part::Other { value, .. } => lost.push(Uncarried::new(
                    format!("{pat} ({})", crate::openai::part_type(value)),
                    TO,
                    "this kind of content has no Gemini equivalent",
                )),
            }
        }
        if msg.name.is_some() {
            lost.push(Uncarried::new(
                format!("{at}.name"),
                TO,
                "Gemini contents have no participant name",
            ));
        }
        crate::carry_extra(req, &msg.extra, &at, TO, &mut Map::new(), lost);
        match contents.last_mut() {
            Some((role, prev)) if *role == msg.role => prev.extend(parts),
            _ => contents.push((msg.role, parts)),
        }
    }
    m.insert(
        "contents".into(),
        Value::Array(
            contents
                .into_iter()
                .map(|(role, parts)| {
                    json!({"role": if role == Role::Assistant { "model" } else { "user" }, "parts": parts})
                })
                .collect(),
        ),
    );
    if !req.system.is_empty() {
        let parts: Vec<Value> = req.system.iter().map(|b| json!({"text": b.text})).collect();
        m.insert("systemInstruction".into(), json!({"parts": parts}));
    }
    let mut tools = Vec::new();
    let mut decls = Vec::new();
    for (i, t) in req.tools.iter().enumerate() {
        match t {
            Tool::Function {
                name,
                description,
                parameters,
                ..
            } => {
                let mut d = json!({"name": name});
                if !parameters.is_null() {
                    d["parametersJsonSchema"] = parameters.clone();
                }
                if let Some(desc) = description {
                    d["description"] = desc.clone().into();
                }
                decls.push(d);
            }
            Tool::Other {
                dialect: Dialect::Gemini,
                value,
            } => tools.push(value.clone()),
            Tool::Other { .. } => lost.push(Uncarried::new(
                index("tools", i),
                TO,
                "a provider's own tool (not a function) has no Gemini equivalent",
            )),
        }
    }
    if !decls.is_empty() {
        tools.insert(0, json!({"functionDeclarations": decls}));
    }
    if !tools.is_empty() {
        m.insert("tools".into(), Value::Array(tools));
    }
    if let Some(c) = &req.tool_choice {
        let f = match c {
            ToolChoice::Auto => json!({"mode": "AUTO"}),
            ToolChoice::None => json!({"mode": "NONE"}),
            ToolChoice::Required => json!({"mode": "ANY"}),
            ToolChoice::Tool(n) => json!({"mode": "ANY", "allowedFunctionNames": [n]}),
        };
        m.insert("toolConfig".into(), json!({"functionCallingConfig": f}));
    }
    if req.parallel_tool_calls == Some(false) {
        lost.push(Uncarried::new(
            crate::field_name(req.origin, "parallel_tool_calls"),
            TO,
            "Gemini cannot be asked for at most one tool call",
        ));
    }
    let mut g = Map::new();
    if !req.stop.is_empty() {
        g.insert("stopSequences".into(), req.stop.clone().into());
    }
    if let Some(n) = req.max_tokens {
        g.insert("maxOutputTokens".into(), n.into());
    }
    for (key, v) in [
        ("temperature", req.temperature),
        ("topP", req.top_p),
        ("presencePenalty", req.presence_penalty),
        ("frequencyPenalty", req.frequency_penalty),
    ] {
        if let Some(v) = v {
            g.insert(key.into(), crate::json::num(v));
        }
    }
    if let Some(k) = req.top_k {
        g.insert("topK".into(), k.into());
    }
    if let Some(s) = req.seed {
        g.insert("seed".into(), s.into());
    }
    match &req.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => {
            g.insert("responseMimeType".into(), "application/json".into());
        }
        Some(ResponseFormat::JsonSchema { schema, .. }) => {
            g.insert("responseMimeType".into(), "application/json".into());
            g.insert("responseJsonSchema".into(), schema.clone());
        }
    }
    match &req.reasoning {
        Some(Reasoning::Budget(n)) => {
            g.insert(
                "thinkingConfig".into(),
                json!({"thinkingBudget": n, "includeThoughts": true}),
            );
        }
        Some(Reasoning::Adaptive) => {
            g.insert(
                "thinkingConfig".into(),
                json!({"thinkingBudget": -1, "includeThoughts": true}),
            );
        }
        Some(Reasoning::Effort(e)) => match e.as_str() {
            "minimal" | "low" | "medium" | "high" => {
                g.insert(
                    "thinkingConfig".into(),
                    json!({"thinkingLevel": e, "includeThoughts": true}),
                );
            }
            _ => lost.push(Uncarried::new(
                crate::field_name(req.origin, "reasoning_effort"),
                TO,
                "Gemini's thinking levels are minimal, low, medium and high",
            )),
        },
        Some(Reasoning::Off) | None => {}
    }
    // Gemini-only generationConfig fields come back into it.
    if same {
        for (k, v) in &req.extra {
            if let Some(sub) = k.strip_prefix("generationConfig.") {
                g.insert(sub.to_owned(), v.clone());
            }
        }
    }
    if !g.is_empty() {
        m.insert("generationConfig".into(), Value::Object(g));
    }
    let mut top = Map::new();
    crate::carry_extra(req, &req.extra, "", TO, &mut top, lost);
    for (k, v) in top {
        if !k.starts_with("generationConfig.") {
            m.insert(k, v);
        }
    }
    Value::Object(m)
}

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
