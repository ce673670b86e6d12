//! Anthropic Messages (`POST /v1/messages`): requests and answers to and
//! from the neutral model.
//!
//! # Requests
//!
//! - `system` (a string or text blocks) is the system prompt, block by
//!   block with each block's `cache_control`.
//! - Content blocks: `text`, `image` (a `base64` or `url` source),
//!   `tool_use` (its `input` object kept as JSON text), `tool_result`
//!   (text and image content, `is_error`), `thinking` (with its
//!   `signature`) and `redacted_thinking` map to [`Part`]s; any other
//!   block (`document`, `search_result`, server tool blocks, a block with
//!   fields this module does not know) is kept as it came for Anthropic
//!   and reported as uncarried to another dialect.
//! - `cache_control` is kept on every block and tool that has it and
//!   written back to Anthropic; OpenAI and Gemini cache prompts by their
//!   own rules, so there it is dropped on purpose.
//! - `tool_choice` `auto`/`any`/`tool`/`none` are
//!   [`ToolChoice::Auto`]/`Required`/`Tool`/`None`;
//!   `disable_parallel_tool_use: true` is `parallel_tool_calls: false`.
//! - `thinking` `enabled` with `budget_tokens` is [`Reasoning::Budget`],
//!   `disabled` is `Off`, `adaptive` is `Adaptive`. An effort word (from
//!   OpenAI or Gemini) is dropped on purpose when written here: Anthropic
//!   thinking needs a token budget, and deriving one from a word would be
//!   an invented number.
//! - `metadata.user_id` is [`Request::user`].
//! - `max_tokens` is required by Anthropic: a request without one (an
//!   OpenAI request may omit it) takes [`WriteOptions::default_max_tokens`]
//!   or is refused naming `max_tokens`.
//! - `temperature` above 1 (OpenAI and Gemini go to 2) is refused, not
//!   clamped.
//! - Writing history, thinking that came from another dialect (unsigned,
//!   or signed by Gemini) is dropped on purpose: Anthropic verifies the
//!   signature of every thinking block it is sent.
//! - Consecutive messages of one role are merged into one message (so a
//!   run of OpenAI `tool` messages becomes one user message of
//!   `tool_result` blocks, as Anthropic requires).
//!
//! # Answers
//!
//! `stop_reason`: `end_turn`, `max_tokens`, `stop_sequence` (with
//! `stop_sequence`), `tool_use`, `pause_turn`, `refusal`,
//! `model_context_window_exceeded` map one to one to [`StopReason`].
//! A tool call's arguments must be a JSON object here: an answer whose
//! arguments are not is refused (the upstream's answer is malformed).

use serde_json::{json, Map, Value};

use crate::json::{
    as_array, as_obj, field, index, opt_bool, opt_f64, opt_str, opt_u64, parse_object, path,
    req_str, Obj,
};
use crate::{
    gemini, Answer, Dialect, DialectError, ImageSource, Message, Part, Reasoning, Request,
    ResponseFormat, Role, StopReason, TextBlock, Tool, ToolChoice, Uncarried, Usage, WriteOptions,
};

/// Anthropic request fields dropped on purpose when the request goes to
/// another dialect: none (every field this module does not map is
/// reported).
pub const DROPPED_ELSEWHERE: &[&str] = &[];

/// Parses an Anthropic Messages request.
pub fn parse_request(body: &[u8]) -> Result<Request, DialectError> {
    let m = parse_object(body)?;
    let mut req = Request {
        origin: Dialect::Anthropic,
        ..Request::default()
    };
    for (k, v) in &m {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "model" => req.model = opt_str(&m, k, "")?.map(str::to_owned),
            "system" => match v {
                Value::String(s) => req.system.push(TextBlock {
                    text: s.clone(),
                    cache_control: None,
                }),
                Value::Array(a) => {
                    for (i, b) in a.iter().enumerate() {
                        let at = index("system", i);
                        match parse_block(b, &at)? {
                            Part::Text {
                                text,
                                cache_control,
                            } => req.system.push(TextBlock {
                                text,
                                cache_control,
                            }),
                            _ => return Err(DialectError::invalid(at, "expected a text block")),
                        }
                    }
                }
                _ => {
                    return Err(DialectError::invalid(
                        "system",
                        "expected a string or text blocks",
                    ))
                }
            },
            "messages" => {
                for (i, msg) in as_array(v, "messages")?.iter().enumerate() {
                    let at = index("messages", i);
                    let mut out = parse_message(msg, &at)?;
                    out.source_index = Some(i);
                    req.messages.push(out);
                }
            }
            "max_tokens" => req.max_tokens = opt_u64(&m, k, "")?,
            "metadata" => {
                let o = as_obj(v, k)?;
                if o.keys().all(|key| key == "user_id") {
                    req.user = opt_str(o, "user_id", k)?.map(str::to_owned);
                } else {
                    req.extra.insert(k.clone(), v.clone());
                }
            }
            "stop_sequences" => {
                for (i, s) in as_array(v, k)?.iter().enumerate() {
                    let s = s
                        .as_str()
                        .ok_or_else(|| DialectError::invalid(index(k, i), "expected a string"))?;
                    req.stop.push(s.to_owned());
                }
            }
            "stream" => req.stream = opt_bool(&m, k, "")?.unwrap_or(false),
            "temperature" => req.temperature = opt_f64(&m, k, "")?,
            "top_p" => req.top_p = opt_f64(&m, k, "")?,
            "top_k" => req.top_k = opt_u64(&m, k, "")?,
            "tools" => {
                for (i, t) in as_array(v, k)?.iter().enumerate() {
                    req.tools.push(parse_tool(t, &index(k, i))?);
                }
            }
            "tool_choice" => {
                let o = as_obj(v, k)?;
                let known = o.keys().all(|key| {
                    matches!(key.as_str(), "type" | "name" | "disable_parallel_tool_use")
                });
                let choice = match opt_str(o, "type", k)? {
                    Some("auto") => Some(ToolChoice::Auto),
                    Some("any") => Some(ToolChoice::Required),
                    Some("none") => Some(ToolChoice::None),
                    Some("tool") => Some(ToolChoice::Tool(req_str(o, "name", k)?.to_owned())),
                    _ => None,
                };
                match (choice, known) {
                    (Some(c), true) => {
                        req.tool_choice = Some(c);
                        if opt_bool(o, "disable_parallel_tool_use", k)? == Some(true) {
                            req.parallel_tool_calls = Some(false);
                        }
                    }
                    _ => {
                        req.extra.insert(k.clone(), v.clone());
                    }
                }
            }
            "thinking" => {
                let o = as_obj(v, k)?;
                req.reasoning = match req_str(o, "type", k)? {
                    "enabled" => Some(Reasoning::Budget(
                        opt_u64(o, "budget_tokens", k)?.ok_or_else(|| {
                            DialectError::invalid("thinking.budget_tokens", "required")
                        })?,
                    )),
                    "disabled" => Some(Reasoning::Off),
                    "adaptive" => Some(Reasoning::Adaptive),
                    _ => {
                        req.extra.insert(k.clone(), v.clone());
                        None
                    }
                };
            }
            _ => {
                req.extra.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(req)
}

fn parse_message(msg: &Value, at: &str) -> Result<Message, DialectError> {
    let m = as_obj(msg, at)?;
    let role = match req_str(m, "role", at)? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => {
            return Err(DialectError::invalid(
                path(at, "role"),
                format!("unknown role `{other}`"),
            ))
        }
    };
    let content = match m.get("content") {
        Some(Value::String(s)) => vec![Part::text(s.clone())],
        Some(Value::Array(a)) => {
            let cat = path(at, "content");
            let mut parts = Vec::with_capacity(a.len());
            for (j, b) in a.iter().enumerate() {
                parts.push(parse_block(b, &index(&cat, j))?);
            }
            parts
        }
        _ => {
            return Err(DialectError::invalid(
                path(at, "content"),
                "expected a string or an array of content blocks",
            ))
        }
    };
    let mut out = Message::new(role, content);
    for (k, v) in m {
        if !matches!(k.as_str(), "role" | "content") {
            out.extra.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

/// True when `o` has no key outside `known`.
fn only(o: &Obj, known: &[&str]) -> bool {
    o.iter()
        .all(|(k, v)| known.contains(&k.as_str()) || (k == "citations" && empty(v)))
}

fn empty(v: &Value) -> bool {
    v.is_null() || v.as_array().is_some_and(Vec::is_empty)
}

fn parse_block(b: &Value, at: &str) -> Result<Part, DialectError> {
    let o = as_obj(b, at)?;
    let other = || Part::Other {
        dialect: Dialect::Anthropic,
        value: b.clone(),
    };
    let cache_control = field(o, "cache_control").cloned();
    Ok(match req_str(o, "type", at)? {
        "text" if only(o, &["type", "text", "cache_control"]) => Part::Text {
            text: req_str(o, "text", at)?.to_owned(),
            cache_control,
        },
        "image" if only(o, &["type", "source", "cache_control"]) => {
            let sat = path(at, "source");
            let s = as_obj(o.get("source").unwrap_or(&Value::Null), &sat)?;
            let source = match req_str(s, "type", &sat)? {
                "base64" => ImageSource::Base64 {
                    media_type: req_str(s, "media_type", &sat)?.to_owned(),
                    data: req_str(s, "data", &sat)?.to_owned(),
                },
                "url" => ImageSource::Url(req_str(s, "url", &sat)?.to_owned()),
                _ => return Ok(other()),
            };
            Part::Image {
                source,
                detail: None,
                cache_control,
            }
        }
        "tool_use" if only(o, &["type", "id", "name", "input", "cache_control"]) => {
            let id = req_str(o, "id", at)?;
            Part::ToolUse {
                id: id.to_owned(),
                name: req_str(o, "name", at)?.to_owned(),
                input: o
                    .get("input")
                    .map(Value::to_string)
                    .unwrap_or_else(|| "{}".into()),
                signature: gemini::signature_of_tool_id(id),
                cache_control,
            }
        }
        "tool_result"
            if only(
                o,
                &[
                    "type",
                    "tool_use_id",
                    "content",
                    "is_error",
                    "cache_control",
                ],
            ) =>
        {
            let content = match field(o, "content") {
                None => Vec::new(),
                Some(Value::String(s)) => vec![Part::text(s.clone())],
                Some(Value::Array(a)) => {
                    let cat = path(at, "content");
                    let mut parts = Vec::with_capacity(a.len());
                    for (k, c) in a.iter().enumerate() {
                        parts.push(parse_block(c, &index(&cat, k))?);
                    }
                    parts
                }
                Some(_) => {
                    return Err(DialectError::invalid(
                        path(at, "content"),
                        "expected a string or an array of content blocks",
                    ))
                }
            };
            Part::ToolResult {
                tool_use_id: req_str(o, "tool_use_id", at)?.to_owned(),
                content,
                is_error: opt_bool(o, "is_error", at)?.unwrap_or(false),
                cache_control,
            }
        }
        "thinking" if only(o, &["type", "thinking", "signature"]) => Part::Thinking {
            text: req_str(o, "thinking", at)?.to_owned(),
            signature: opt_str(o, "signature", at)?.map(str::to_owned),
        },
        "redacted_thinking" if only(o, &["type", "data"]) => Part::RedactedThinking {
            data: req_str(o, "data", at)?.to_owned(),
        },
        _ => other(),
    })
}

fn parse_tool(t: &Value, at: &str) -> Result<Tool, DialectError> {
    let o = as_obj(t, at)?;
    let custom = matches!(opt_str(o, "type", at)?, None | Some("custom"))
        && only(
            o,
            &[
                "type",
                "name",
                "description",
                "input_schema",
                "cache_control",
                "strict",
            ],
        );
    if !custom {
        return Ok(Tool::Other {
            dialect: Dialect::Anthropic,
            value: t.clone(),
        });
    }
    Ok(Tool::Function {
        name: req_str(o, "name", at)?.to_owned(),
        description: opt_str(o, "description", at)?.map(str::to_owned),
        parameters: field(o, "input_schema").cloned().unwrap_or(Value::Null),
        strict: opt_bool(o, "strict", at)?,
        cache_control: field(o, "cache_control").cloned(),
    })
}

fn with_cache(mut v: Value, cache_control: &Option<Value>) -> Value {
    if let Some(c) = cache_control {
        v["cache_control"] = c.clone();
    }
    v
}

/// The tool call's arguments as the object Anthropic requires (empty
/// arguments are `{}`).
fn input_object(input: &str) -> Option<Value> {
    if input.trim().is_empty() {
        return Some(json!({}));
    }
    serde_json::from_str::<Value>(input)
        .ok()
        .filter(Value::is_object)
}

fn image(source: &ImageSource, cache_control: &Option<Value>) -> Value {
    let source = match source {
        ImageSource::Base64 { media_type, data } => {
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
        ImageSource::Url(u) => json!({"type": "url", "url": u}),
    };
    with_cache(json!({"type": "image", "source": source}), cache_control)
}

/// Writes `req` as an Anthropic request body; what cannot be carried is
/// pushed to `lost`.
pub(crate) fn write_request(
    req: &Request,
    opts: &WriteOptions,
    lost: &mut Vec<Uncarried>,
) -> Value {
    const TO: Dialect = Dialect::Anthropic;
    let same = req.origin == TO;
    let mut m = Map::new();
    if let Some(model) = opts.model.as_deref().or(req.model.as_deref()) {
        m.insert("model".into(), model.into());
    }
    let mut messages: Vec<(Role, Vec<Value>)> = Vec::new();
    for (i, msg) in req.messages.iter().enumerate() {
        let at = msg.path("messages", i);
        if msg.role == Role::System {
            lost.push(Uncarried::new(
                at,
                TO,
                "a system message inside the conversation (Anthropic has one system prompt, before it)",
            ));
            continue;
        }
        let mut blocks = Vec::with_capacity(msg.content.len());
        for (j, p) in msg.content.iter().enumerate() {
            if let Some(b) = write_block(p, &format!("{at}.content[{j}]"), same, lost) {
                blocks.push(b);
            }
        }
        // Anthropic refuses empty text blocks (an OpenAI assistant message
        // of tool calls often has `content: ""`); one is kept only when it
        // is all the message has.
        let non_empty: Vec<Value> = blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) != Some("text") || b["text"] != "")
            .cloned()
            .collect();
        if !non_empty.is_empty() {
            blocks = non_empty;
        }
        if msg.name.is_some() {
            lost.push(Uncarried::new(
                format!("{at}.name"),
                TO,
                "Anthropic messages have no participant name",
            ));
        }
        crate::carry_extra(req, &msg.extra, &at, TO, &mut Map::new(), lost);
        match messages.last_mut() {
            Some((role, prev)) if *role == msg.role => prev.extend(blocks),
            _ => messages.push((msg.role, blocks)),
        }
    }
    if !req.system.is_empty() {
        let system = if req.system.len() == 1 && req.system[0].cache_control.is_none() {
            Value::String(req.system[0].text.clone())
        } else {
            Value::Array(
                req.system
                    .iter()
                    .map(|b| with_cache(json!({"type": "text", "text": b.text}), &b.cache_control))
                    .collect(),
            )
        };
        m.insert("system".into(), system);
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, blocks)| {
            json!({
                "role": if role == Role::Assistant { "assistant" } else { "user" },
                "content": blocks,
            })
        })
        .collect();
    m.insert("messages".into(), Value::Array(messages));
    match req.max_tokens.or(opts.default_max_tokens) {
        Some(n) => {
            m.insert("max_tokens".into(), n.into());
        }
        None => lost.push(Uncarried::new(
            "max_tokens",
            TO,
            "Anthropic requires max_tokens and the pool sets no default",
        )),
    }
    if !req.tools.is_empty() {
        let mut tools = Vec::new();
        for (i, t) in req.tools.iter().enumerate() {
            match t {
                Tool::Function {
                    name,
                    description,
                    parameters,
                    strict,
                    cache_control,
                } => {
                    // Anthropic requires a schema: a function without
                    // parameters takes an object of none.
                    let schema = if parameters.is_null() {
                        json!({"type": "object", "properties": {}})
                    } else {
                        parameters.clone()
                    };
                    let mut tool = json!({"name": name, "input_schema": schema});
                    if let Some(d) = description {
                        tool["description"] = d.clone().into();
                    }
                    if let (true, Some(s)) = (same, strict) {
                        tool["strict"] = (*s).into();
                    }
                    tools.push(with_cache(tool, cache_control));
                }
                Tool::Other { dialect, value } if *dialect == TO => tools.push(value.clone()),
                Tool::Other { .. } => lost.push(Uncarried::new(
                    index("tools", i),
                    TO,
                    "a provider's own tool (not a function) has no Anthropic equivalent",
                )),
            }
        }
        m.insert("tools".into(), Value::Array(tools));
    }
    let mut choice = req.tool_choice.as_ref().map(|c| match c {
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::Tool(n) => json!({"type": "tool", "name": n}),
    });
    if req.parallel_tool_calls == Some(false) && req.tool_choice != Some(ToolChoice::None) {
        choice.get_or_insert_with(|| json!({"type": "auto"}))["disable_parallel_tool_use"] =
            true.into();
    }
    if let Some(c) = choice {
        m.insert("tool_choice".into(), c);
    }
    if !req.stop.is_empty() {
        m.insert("stop_sequences".into(), req.stop.clone().into());
    }
    if let Some(t) = req.temperature {
        if t > 1.0 {
            lost.push(Uncarried::new(
                "temperature",
                TO,
                "Anthropic's temperature is at most 1 (refused rather than clamped)",
            ));
        } else {
            m.insert("temperature".into(), crate::json::num(t));
        }
    }
    if let Some(p) = req.top_p {
        m.insert("top_p".into(), crate::json::num(p));
    }
    if let Some(k) = req.top_k {
        m.insert("top_k".into(), k.into());
    }
    if req.seed.is_some() {
        lost.push(Uncarried::new(
            crate::field_name(req.origin, "seed"),
            TO,
            "Anthropic has no sampling seed",
        ));
    }
    for (name, v) in [
        ("presence_penalty", req.presence_penalty),
        ("frequency_penalty", req.frequency_penalty),
    ] {
        if v.is_some_and(|v| v != 0.0) {
            lost.push(Uncarried::new(
                crate::field_name(req.origin, name),
                TO,
                "Anthropic has no repetition penalties",
            ));
        }
    }
    match &req.reasoning {
        Some(Reasoning::Budget(n)) => {
            m.insert(
                "thinking".into(),
                json!({"type": "enabled", "budget_tokens": n}),
            );
        }
        Some(Reasoning::Off) => {
            m.insert("thinking".into(), json!({"type": "disabled"}));
        }
        Some(Reasoning::Adaptive) => {
            m.insert("thinking".into(), json!({"type": "adaptive"}));
        }
        Some(Reasoning::Effort(_)) | None => {}
    }
    if let Some(u) = &req.user {
        m.insert("metadata".into(), json!({"user_id": u}));
    }
    if req.stream {
        m.insert("stream".into(), true.into());
    }
    match &req.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(_) => lost.push(Uncarried::new(
            crate::field_name(req.origin, "response_format"),
            TO,
            "Anthropic Messages has no JSON mode",
        )),
    }
    crate::carry_extra(req, &req.extra, "", TO, &mut m, lost);
    Value::Object(m)
}

/// One content block; `same` when the request came in Anthropic's
/// dialect (only then are its thinking blocks Anthropic's own).
fn write_block(p: &Part, at: &str, same: bool, lost: &mut Vec<Uncarried>) -> Option<Value> {
    const TO: Dialect = Dialect::Anthropic;
    Some(match p {
        Part::Text {
            text,
            cache_control,
        } => with_cache(json!({"type": "text", "text": text}), cache_control),
        Part::Image {
            source,
            cache_control,
            ..
        } => image(source, cache_control),
        Part::ToolUse {
            id,
            name,
            input,
            cache_control,
            ..
        } => {
            let Some(input) = input_object(input) else {
                lost.push(Uncarried::new(
                    at,
                    TO,
                    "the tool call's arguments are not a JSON object, which Anthropic requires",
                ));
                return None;
            };
            with_cache(
                json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                cache_control,
            )
        }
        Part::ToolResult {
            tool_use_id,
            content,
            is_error,
            cache_control,
        } => {
            let mut blocks = Vec::with_capacity(content.len());
            for (k, c) in content.iter().enumerate() {
                let cat = format!("{at}.content[{k}]");
                match c {
                    Part::Text { .. } | Part::Image { .. } => {
                        if let Some(b) = write_block(c, &cat, same, lost) {
                            blocks.push(b);
                        }
                    }
                    Part::Other {
                        dialect: Dialect::Anthropic,
                        value,
                    } => blocks.push(value.clone()),
                    _ => lost.push(Uncarried::new(
                        cat,
                        TO,
                        "a tool result carries text and images only",
                    )),
                }
            }
            let mut b =
                json!({"type": "tool_result", "tool_use_id": tool_use_id, "content": blocks});
            if *is_error {
                b["is_error"] = true.into();
            }
            with_cache(b, cache_control)
        }
        Part::Thinking { text, signature } => match signature.as_deref() {
            Some(s) if same && !s.is_empty() => {
                json!({"type": "thinking", "thinking": text, "signature": s})
            }
            // Reasoning another provider produced (unsigned, or signed by
            // Gemini): Anthropic cannot verify it, so it is left out of
            // the history on purpose.
            _ => return None,
        },
        Part::RedactedThinking { data } if same => {
            json!({"type": "redacted_thinking", "data": data})
        }
        Part::RedactedThinking { .. } => return None,
        Part::Other {
            dialect: Dialect::Anthropic,
            value,
        } => value.clone(),
        Part::Other { value, .. } => {
            lost.push(Uncarried::new(
                format!("{at} ({})", crate::openai::part_type(value)),
                TO,
                "this kind of content has no Anthropic equivalent",
            ));
            return None;
        }
    })
}

/// `stop_reason` to the neutral stop reason.
pub fn stop_from(reason: &str) -> StopReason {
    match reason {
        "end_turn" => StopReason::EndTurn,
        "max_tokens" => StopReason::MaxTokens,
        "stop_sequence" => StopReason::StopSequence,
        "tool_use" => StopReason::ToolUse,
        "pause_turn" => StopReason::PauseTurn,
        "refusal" => StopReason::Refusal,
        "model_context_window_exceeded" => StopReason::ContextWindow,
        _ => StopReason::Other,
    }
}

/// The neutral stop reason as a `stop_reason`.
pub fn stop_to(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn | StopReason::ToolError | StopReason::Other => "end_turn",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
        StopReason::ToolUse => "tool_use",
        StopReason::Refusal => "refusal",
        StopReason::PauseTurn => "pause_turn",
        StopReason::ContextWindow => "model_context_window_exceeded",
    }
}

/// Parses an Anthropic message (unstreamed answer).
pub fn parse_answer(body: &[u8]) -> Result<Answer, DialectError> {
    let m = parse_object(body)?;
    let mut content = Vec::new();
    if let Some(c) = field(&m, "content") {
        for (i, b) in as_array(c, "content")?.iter().enumerate() {
            content.push(parse_block(b, &index("content", i))?);
        }
    }
    Ok(Answer {
        id: opt_str(&m, "id", "")?.unwrap_or("").to_owned(),
        model: opt_str(&m, "model", "")?.unwrap_or("").to_owned(),
        content,
        stop_reason: stop_from(opt_str(&m, "stop_reason", "")?.unwrap_or("end_turn")),
        stop_sequence: opt_str(&m, "stop_sequence", "")?.map(str::to_owned),
        usage: field(&m, "usage")
            .map(Usage::from_anthropic)
            .unwrap_or_default(),
    })
}

/// Writes an answer as an Anthropic message. Fails when a tool call's
/// arguments are not a JSON object (Anthropic's `input` must be one).
pub fn write_answer(a: &Answer) -> Result<Value, DialectError> {
    let mut content = Vec::with_capacity(a.content.len());
    let mut lost = Vec::new();
    for (i, p) in a.content.iter().enumerate() {
        match p {
            Part::Text { text, .. } => content.push(json!({"type": "text", "text": text})),
            Part::ToolUse {
                id, name, input, ..
            } => {
                let input = input_object(input).ok_or_else(|| {
                    DialectError::invalid(
                        index("content", i),
                        "the tool call's arguments are not a JSON object",
                    )
                })?;
                content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
            }
            Part::Thinking { text, signature } => content.push(json!({
                "type": "thinking",
                "thinking": text,
                "signature": signature.clone().unwrap_or_default(),
            })),
            Part::RedactedThinking { data } => {
                content.push(json!({"type": "redacted_thinking", "data": data}))
            }
            Part::Other {
                dialect: Dialect::Anthropic,
                value,
            } => content.push(value.clone()),
            Part::Image { .. } | Part::ToolResult { .. } | Part::Other { .. } => {
                lost.push(Uncarried::new(
                    index("content", i),
                    Dialect::Anthropic,
                    "an Anthropic answer carries text, tool calls and thinking only",
                ))
            }
        }
    }
    if !lost.is_empty() {
        return Err(DialectError::CannotCarry(lost));
    }
    Ok(json!({
        "id": a.id,
        "type": "message",
        "role": "assistant",
        "model": a.model,
        "content": content,
        "stop_reason": stop_to(a.stop_reason),
        "stop_sequence": a.stop_sequence,
        "usage": a.usage.to_anthropic(),
    }))
}
