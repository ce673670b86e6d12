//! OpenAI chat completions (`POST /v1/chat/completions`): requests and
//! answers to and from the neutral model.
//!
//! # Requests
//!
//! - Leading `system` and `developer` messages are the system prompt
//!   (written back as one `system` message); a system message after the
//!   first user or assistant message stays in place ([`Role::System`]),
//!   which Anthropic and Gemini cannot carry.
//! - A `tool` message becomes a user message holding one
//!   [`Part::ToolResult`]; writing OpenAI, a user message's tool results
//!   become `tool` messages placed first (OpenAI requires them right after
//!   the assistant's `tool_calls`), its other parts a user message after
//!   them.
//! - An assistant's `tool_calls[].function.arguments` is JSON text and is
//!   kept as text ([`Part::ToolUse::input`]). `reasoning_content` (or
//!   `reasoning`), which vLLM, DeepSeek and others add, is
//!   [`Part::Thinking`]; written back to OpenAI (only when the request
//!   came from OpenAI) it is `reasoning_content`.
//! - `image_url` with a `data:MIME;base64,` URL is an inline image, any
//!   other URL a URL image; `detail` is kept for OpenAI only.
//! - `max_tokens` and `max_completion_tokens` are both the token limit
//!   (the latter wins when both are given); the field used is remembered
//!   for a write back to OpenAI, and [`WriteOptions`] chooses it otherwise.
//! - `reasoning_effort` is [`Reasoning::Effort`]. A token budget (from
//!   Anthropic or Gemini) has no OpenAI field and is dropped on purpose:
//!   the model reasons as it is set up to, and `max_tokens` still bounds
//!   the whole answer.
//! - A streamed request written to OpenAI always asks for
//!   `stream_options.include_usage`: usage is how budgets are kept exact.
//!   Whether the *client* asked is [`Request::stream_usage`].
//! - `n` equal to 1 and `logprobs: false` are the defaults and are read as
//!   absent; any other `n` or `logprobs` stays an OpenAI-only field.
//! - `store`, `metadata`, `prompt_cache_key` and `safety_identifier` are
//!   about OpenAI's own storage, caching and abuse tracking: dropped on
//!   purpose when written to another dialect. Every other field this module
//!   does not know is reported as uncarried to another dialect.
//!
//! # Answers
//!
//! One choice (`choices[0]`; the router refuses `n > 1` across dialects).
//! `finish_reason`: `stop` is [`StopReason::EndTurn`] (OpenAI does not say
//! whether a stop sequence matched), `length` is `MaxTokens`, `tool_calls`
//! (and the legacy `function_call`) `ToolUse`, `content_filter` `Refusal`.
//! A `refusal` message is text. Writing, `EndTurn` and `StopSequence` are
//! `stop`, `MaxTokens` and `ContextWindow` `length`, `Refusal`
//! `content_filter`, and the rest `stop`.

use serde_json::{json, Map, Value};

use crate::json::{
    as_array, as_obj, field, index, opt_bool, opt_f64, opt_i64, opt_str, opt_u64, parse_object,
    path, req_str, Obj,
};
use crate::{
    gemini, Answer, Dialect, DialectError, ImageSource, MaxTokensField, Message, Part, Reasoning,
    Request, ResponseFormat, Role, StopReason, TextBlock, Tool, ToolChoice, Uncarried, Usage,
    WriteOptions,
};

/// OpenAI request fields dropped on purpose when the request goes to
/// another dialect (they concern OpenAI's own storage, cache routing and
/// abuse tracking, not the answer).
pub const DROPPED_ELSEWHERE: &[&str] =
    &["store", "metadata", "prompt_cache_key", "safety_identifier"];

/// Parses an OpenAI chat completions request.
pub fn parse_request(body: &[u8]) -> Result<Request, DialectError> {
    let m = parse_object(body)?;
    let mut req = Request {
        origin: Dialect::OpenAi,
        ..Request::default()
    };
    let mut max_completion = None;
    for (k, v) in &m {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "model" => req.model = opt_str(&m, k, "")?.map(str::to_owned),
            "messages" => parse_messages(v, &mut req)?,
            "tools" => {
                for (i, t) in as_array(v, "tools")?.iter().enumerate() {
                    req.tools.push(parse_tool(t, &index("tools", i))?);
                }
            }
            "tool_choice" => match parse_tool_choice(v) {
                Some(c) => req.tool_choice = Some(c),
                None => {
                    req.extra.insert(k.clone(), v.clone());
                }
            },
            "parallel_tool_calls" => req.parallel_tool_calls = opt_bool(&m, k, "")?,
            "stop" => match v {
                Value::String(s) => req.stop = vec![s.clone()],
                Value::Array(a) => {
                    for (i, s) in a.iter().enumerate() {
                        let s = s.as_str().ok_or_else(|| {
                            DialectError::invalid(index("stop", i), "expected a string")
                        })?;
                        req.stop.push(s.to_owned());
                    }
                }
                _ => {
                    return Err(DialectError::invalid(
                        "stop",
                        "expected a string or an array of strings",
                    ))
                }
            },
            "max_tokens" => {
                req.max_tokens = opt_u64(&m, k, "")?;
                req.openai_max_tokens_field
                    .get_or_insert(MaxTokensField::MaxTokens);
            }
            "max_completion_tokens" => max_completion = opt_u64(&m, k, "")?,
            "temperature" => req.temperature = opt_f64(&m, k, "")?,
            "top_p" => req.top_p = opt_f64(&m, k, "")?,
            "seed" => req.seed = opt_i64(&m, k, "")?,
            "presence_penalty" => req.presence_penalty = opt_f64(&m, k, "")?,
            "frequency_penalty" => req.frequency_penalty = opt_f64(&m, k, "")?,
            "reasoning_effort" => {
                req.reasoning = opt_str(&m, k, "")?.map(|e| Reasoning::Effort(e.to_owned()));
            }
            "user" => req.user = opt_str(&m, k, "")?.map(str::to_owned),
            "stream" => req.stream = opt_bool(&m, k, "")?.unwrap_or(false),
            "stream_options" => {
                let o = as_obj(v, k)?;
                req.stream_usage = opt_bool(o, "include_usage", k)?.unwrap_or(false);
            }
            "response_format" => match parse_response_format(v) {
                Some(f) => req.response_format = Some(f),
                None => {
                    req.extra.insert(k.clone(), v.clone());
                }
            },
            "n" if v.as_u64() == Some(1) => {}
            "logprobs" if v.as_bool() == Some(false) => {}
            _ => {
                req.extra.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(n) = max_completion {
        req.max_tokens = Some(n);
        req.openai_max_tokens_field = Some(MaxTokensField::MaxCompletionTokens);
    }
    Ok(req)
}

fn parse_messages(v: &Value, req: &mut Request) -> Result<(), DialectError> {
    for (i, msg) in as_array(v, "messages")?.iter().enumerate() {
        let at = index("messages", i);
        let m = as_obj(msg, &at)?;
        let role = req_str(m, "role", &at)?;
        let mut out = match role {
            "system" | "developer" => {
                let parts = parse_content(m, &at, role)?;
                if req.messages.is_empty() {
                    for p in parts {
                        match p {
                            Part::Text {
                                text,
                                cache_control,
                            } => req.system.push(TextBlock {
                                text,
                                cache_control,
                            }),
                            _ => {
                                return Err(DialectError::invalid(
                                    path(&at, "content"),
                                    "a system message holds text only",
                                ))
                            }
                        }
                    }
                    continue;
                }
                Message::new(Role::System, parts)
            }
            "user" => Message::new(Role::User, parse_content(m, &at, role)?),
            "assistant" => parse_assistant(m, &at)?,
            "tool" => {
                let id = req_str(m, "tool_call_id", &at)?;
                let content = parse_content(m, &at, role)?;
                Message::new(
                    Role::User,
                    vec![Part::ToolResult {
                        tool_use_id: id.to_owned(),
                        content,
                        is_error: false,
                        cache_control: None,
                    }],
                )
            }
            other => {
                return Err(DialectError::invalid(
                    path(&at, "role"),
                    format!("unknown role `{other}`"),
                ))
            }
        };
        out.source_index = Some(i);
        for (k, v) in m {
            let known = matches!(
                (role, k.as_str()),
                (_, "role" | "content")
                    | (
                        "assistant",
                        "tool_calls" | "reasoning_content" | "reasoning" | "refusal"
                    )
                    | ("tool", "tool_call_id")
            );
            if known || v.is_null() {
                continue;
            }
            if k == "name" {
                out.name = opt_str(m, k, &at)?.map(str::to_owned);
            } else {
                out.extra.insert(k.clone(), v.clone());
            }
        }
        req.messages.push(out);
    }
    Ok(())
}

/// A message's `content`: a string, an array of parts, or absent.
fn parse_content(m: &Obj, at: &str, role: &str) -> Result<Vec<Part>, DialectError> {
    let Some(c) = field(m, "content") else {
        return Ok(Vec::new());
    };
    let at = path(at, "content");
    match c {
        Value::String(s) => Ok(vec![Part::text(s.clone())]),
        Value::Array(a) => {
            let mut parts = Vec::with_capacity(a.len());
            for (j, p) in a.iter().enumerate() {
                parts.push(parse_part(p, &index(&at, j), role)?);
            }
            Ok(parts)
        }
        _ => Err(DialectError::invalid(
            at,
            "expected a string or an array of parts",
        )),
    }
}

fn parse_part(p: &Value, at: &str, role: &str) -> Result<Part, DialectError> {
    let o = as_obj(p, at)?;
    match req_str(o, "type", at)? {
        "text" => Ok(Part::Text {
            text: req_str(o, "text", at)?.to_owned(),
            cache_control: field(o, "cache_control").cloned(),
        }),
        "refusal" if role == "assistant" => Ok(Part::text(req_str(o, "refusal", at)?)),
        "image_url" => {
            let at = path(at, "image_url");
            let img = as_obj(o.get("image_url").unwrap_or(&Value::Null), &at)?;
            let url = req_str(img, "url", &at)?;
            Ok(Part::Image {
                source: image_source(url, &path(&at, "url"))?,
                detail: opt_str(img, "detail", &at)?.map(str::to_owned),
                cache_control: field(o, "cache_control").cloned(),
            })
        }
        _ => Ok(Part::Other {
            dialect: Dialect::OpenAi,
            value: p.clone(),
        }),
    }
}

/// A `data:MIME;base64,DATA` URL is inline bytes; any other URL is fetched
/// by the provider.
pub(crate) fn image_source(url: &str, at: &str) -> Result<ImageSource, DialectError> {
    let Some(rest) = url.strip_prefix("data:") else {
        return Ok(ImageSource::Url(url.to_owned()));
    };
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| DialectError::invalid(at, "a data URL needs a comma before its data"))?;
    let media_type = meta
        .strip_suffix(";base64")
        .ok_or_else(|| DialectError::invalid(at, "only base64 data URLs are taken"))?;
    Ok(ImageSource::Base64 {
        media_type: media_type.to_owned(),
        data: data.to_owned(),
    })
}

pub(crate) fn data_url(media_type: &str, data: &str) -> String {
    format!("data:{media_type};base64,{data}")
}

fn parse_assistant(m: &Obj, at: &str) -> Result<Message, DialectError> {
    let mut parts = Vec::new();
    for key in ["reasoning_content", "reasoning"] {
        if let Some(r) = opt_str(m, key, at)? {
            if !r.is_empty() {
                parts.push(Part::Thinking {
                    text: r.to_owned(),
                    signature: None,
                });
            }
            break;
        }
    }
    let content = parse_content(m, at, "assistant")?;
    if content.is_empty() {
        if let Some(r) = opt_str(m, "refusal", at)? {
            parts.push(Part::text(r));
        }
    }
    parts.extend(content);
    if let Some(calls) = field(m, "tool_calls") {
        let at = path(at, "tool_calls");
        for (j, c) in as_array(calls, &at)?.iter().enumerate() {
            let at = index(&at, j);
            let o = as_obj(c, &at)?;
            let f = as_obj(
                o.get("function").unwrap_or(&Value::Null),
                &path(&at, "function"),
            )?;
            let id = req_str(o, "id", &at)?;
            parts.push(Part::ToolUse {
                id: id.to_owned(),
                name: req_str(f, "name", &path(&at, "function"))?.to_owned(),
                input: opt_str(f, "arguments", &path(&at, "function"))?
                    .unwrap_or("")
                    .to_owned(),
                signature: gemini::signature_of_tool_id(id),
                cache_control: None,
            });
        }
    }
    Ok(Message::new(Role::Assistant, parts))
}

fn parse_tool(t: &Value, at: &str) -> Result<Tool, DialectError> {
    let o = as_obj(t, at)?;
    if opt_str(o, "type", at)? != Some("function") {
        return Ok(Tool::Other {
            dialect: Dialect::OpenAi,
            value: t.clone(),
        });
    }
    let fat = path(at, "function");
    let f = as_obj(o.get("function").unwrap_or(&Value::Null), &fat)?;
    Ok(Tool::Function {
        name: req_str(f, "name", &fat)?.to_owned(),
        description: opt_str(f, "description", &fat)?.map(str::to_owned),
        parameters: field(f, "parameters").cloned().unwrap_or(Value::Null),
        strict: opt_bool(f, "strict", &fat)?,
        cache_control: field(o, "cache_control").cloned(),
    })
}

fn parse_tool_choice(v: &Value) -> Option<ToolChoice> {
    match v {
        Value::String(s) => match s.as_str() {
            "auto" => Some(ToolChoice::Auto),
            "none" => Some(ToolChoice::None),
            "required" => Some(ToolChoice::Required),
            _ => None,
        },
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Tool(n.to_owned())),
        _ => None,
    }
}

fn parse_response_format(v: &Value) -> Option<ResponseFormat> {
    match v.get("type")?.as_str()? {
        "text" => Some(ResponseFormat::Text),
        "json_object" => Some(ResponseFormat::JsonObject),
        "json_schema" => {
            let s = v.get("json_schema")?.as_object()?;
            if s.keys()
                .any(|k| !matches!(k.as_str(), "name" | "schema" | "strict"))
            {
                return None;
            }
            Some(ResponseFormat::JsonSchema {
                name: s.get("name")?.as_str()?.to_owned(),
                schema: s.get("schema").cloned().unwrap_or(json!({})),
                strict: s.get("strict").and_then(Value::as_bool),
            })
        }
        _ => None,
    }
}

/// Writes `req` as an OpenAI request body; what cannot be carried is
/// pushed to `lost`.
pub(crate) fn write_request(
    req: &Request,
    opts: &WriteOptions,
    lost: &mut Vec<Uncarried>,
) -> Value {
    const TO: Dialect = Dialect::OpenAi;
    let same = req.origin == TO;
    let mut m = Map::new();
    if let Some(model) = opts.model.as_deref().or(req.model.as_deref()) {
        m.insert("model".into(), model.into());
    }
    let mut messages = Vec::new();
    if !req.system.is_empty() {
        let content = if req.system.len() == 1 && (req.system[0].cache_control.is_none() || !same) {
            Value::String(req.system[0].text.clone())
        } else {
            Value::Array(
                req.system
                    .iter()
                    .map(|b| text_part(&b.text, b.cache_control.as_ref().filter(|_| same)))
                    .collect(),
            )
        };
        messages.push(json!({"role": "system", "content": content}));
    }
    for (i, msg) in req.messages.iter().enumerate() {
        write_message(req, msg, &msg.path("messages", i), &mut messages, lost);
    }
    m.insert("messages".into(), Value::Array(messages));
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
                    let mut f = Map::new();
                    f.insert("name".into(), name.clone().into());
                    if let Some(d) = description {
                        f.insert("description".into(), d.clone().into());
                    }
                    if !parameters.is_null() {
                        f.insert("parameters".into(), parameters.clone());
                    }
                    if let Some(s) = strict {
                        f.insert("strict".into(), (*s).into());
                    }
                    let mut tool = json!({"type": "function", "function": f});
                    if let (true, Some(c)) = (same, cache_control) {
                        tool["cache_control"] = c.clone();
                    }
                    tools.push(tool);
                }
                Tool::Other { dialect, value } if *dialect == TO => tools.push(value.clone()),
                Tool::Other { .. } => lost.push(Uncarried::new(
                    index("tools", i),
                    TO,
                    "a provider's own tool (not a function) has no OpenAI equivalent",
                )),
            }
        }
        m.insert("tools".into(), Value::Array(tools));
    }
    if let Some(c) = &req.tool_choice {
        m.insert(
            "tool_choice".into(),
            match c {
                ToolChoice::Auto => "auto".into(),
                ToolChoice::None => "none".into(),
                ToolChoice::Required => "required".into(),
                ToolChoice::Tool(n) => json!({"type": "function", "function": {"name": n}}),
            },
        );
    }
    if let Some(p) = req.parallel_tool_calls {
        m.insert("parallel_tool_calls".into(), p.into());
    }
    if !req.stop.is_empty() {
        m.insert("stop".into(), req.stop.clone().into());
    }
    if let Some(n) = req.max_tokens {
        let field = opts
            .openai_max_tokens_field
            .or(req.openai_max_tokens_field.filter(|_| same))
            .unwrap_or_default();
        let key = match field {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        };
        m.insert(key.into(), n.into());
    }
    for (key, v) in [
        ("temperature", req.temperature),
        ("top_p", req.top_p),
        ("presence_penalty", req.presence_penalty),
        ("frequency_penalty", req.frequency_penalty),
    ] {
        if let Some(v) = v {
            m.insert(key.into(), crate::json::num(v));
        }
    }
    if req.top_k.is_some() {
        lost.push(Uncarried::new(
            top_k_field(req.origin),
            TO,
            "OpenAI chat has no top_k",
        ));
    }
    if let Some(s) = req.seed {
        m.insert("seed".into(), s.into());
    }
    if let Some(Reasoning::Effort(e)) = &req.reasoning {
        m.insert("reasoning_effort".into(), e.clone().into());
    }
    if let Some(u) = &req.user {
        m.insert("user".into(), u.clone().into());
    }
    if req.stream {
        m.insert("stream".into(), true.into());
        m.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(f) = &req.response_format {
        m.insert(
            "response_format".into(),
            match f {
                ResponseFormat::Text => json!({"type": "text"}),
                ResponseFormat::JsonObject => json!({"type": "json_object"}),
                ResponseFormat::JsonSchema {
                    name,
                    schema,
                    strict,
                } => {
                    let mut s = json!({"name": name, "schema": schema});
                    if let Some(st) = strict {
                        s["strict"] = (*st).into();
                    }
                    json!({"type": "json_schema", "json_schema": s})
                }
            },
        );
    }
    crate::carry_extra(req, &req.extra, "", TO, &mut m, lost);
    Value::Object(m)
}

fn top_k_field(origin: Dialect) -> &'static str {
    match origin {
        Dialect::Gemini => "generationConfig.topK",
        _ => "top_k",
    }
}

fn text_part(text: &str, cache_control: Option<&Value>) -> Value {
    let mut p = json!({"type": "text", "text": text});
    if let Some(c) = cache_control {
        p["cache_control"] = c.clone();
    }
    p
}

fn write_message(
    req: &Request,
    msg: &Message,
    at: &str,
    out: &mut Vec<Value>,
    lost: &mut Vec<Uncarried>,
) {
    const TO: Dialect = Dialect::OpenAi;
    let same = req.origin == TO;
    let role = match msg.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::System => "system",
    };
    let mut content = Vec::new();
    let mut thinking = String::new();
    let mut calls = Vec::new();
    for (j, p) in msg.content.iter().enumerate() {
        let pat = format!("{at}.content[{j}]");
        match p {
            Part::Text {
                text,
                cache_control,
            } => content.push(text_part(text, cache_control.as_ref().filter(|_| same))),
            Part::Image {
                source,
                detail,
                cache_control,
            } => {
                if msg.role != Role::User {
                    lost.push(Uncarried::new(
                        pat,
                        TO,
                        "OpenAI takes images in user messages only",
                    ));
                    continue;
                }
                let url = match source {
                    ImageSource::Base64 { media_type, data } => data_url(media_type, data),
                    ImageSource::Url(u) => u.clone(),
                };
                let mut img = json!({"url": url});
                if let (true, Some(d)) = (same, detail) {
                    img["detail"] = d.clone().into();
                }
                let mut part = json!({"type": "image_url", "image_url": img});
                if let (true, Some(c)) = (same, cache_control) {
                    part["cache_control"] = c.clone();
                }
                content.push(part);
            }
            Part::ToolUse {
                id, name, input, ..
            } => calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": input},
            })),
            Part::ToolResult {
                tool_use_id,
                content: result,
                ..
            } => {
                let mut text = Vec::new();
                for (k, r) in result.iter().enumerate() {
                    match r {
                        Part::Text { text: t, .. } => text.push(t.as_str()),
                        _ => lost.push(Uncarried::new(
                            format!("{pat}.content[{k}]"),
                            TO,
                            "an OpenAI tool message carries text only",
                        )),
                    }
                }
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": tool_use_id,
                    "content": text.concat(),
                }));
            }
            Part::Thinking { text, .. } => thinking.push_str(text),
            Part::RedactedThinking { .. } => {}
            Part::Other { dialect, value } if *dialect == TO => content.push(value.clone()),
            Part::Other { value, .. } => lost.push(Uncarried::new(
                format!("{pat} ({})", part_type(value)),
                TO,
                "this kind of content has no OpenAI equivalent",
            )),
        }
    }
    if content.is_empty() && calls.is_empty() && thinking.is_empty() {
        // A user message of tool results only: the tool messages are it.
        if msg.role != Role::User || msg.content.is_empty() {
            out.push(json!({"role": role, "content": ""}));
        }
        return;
    }
    let mut m = Map::new();
    m.insert("role".into(), role.into());
    let all_plain_text = content.iter().all(|p| {
        p.get("type").and_then(Value::as_str) == Some("text") && p.get("cache_control").is_none()
    });
    let content = if content.is_empty() {
        Value::Null
    } else if content.len() == 1 && all_plain_text {
        content[0]["text"].clone()
    } else {
        Value::Array(content)
    };
    if !content.is_null() {
        m.insert("content".into(), content);
    } else if calls.is_empty() {
        m.insert("content".into(), "".into());
    } else {
        m.insert("content".into(), Value::Null);
    }
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    // Reasoning in history goes back only to OpenAI-compatible servers
    // that sent it; other dialects' reasoning is dropped on purpose.
    if same && !thinking.is_empty() {
        m.insert("reasoning_content".into(), thinking.into());
    }
    if let Some(n) = &msg.name {
        m.insert("name".into(), n.clone().into());
    }
    crate::carry_extra(req, &msg.extra, at, TO, &mut m, lost);
    out.push(Value::Object(m));
}

pub(crate) fn part_type(v: &Value) -> String {
    v.get("type")
        .and_then(Value::as_str)
        .map(|t| format!("type {t}"))
        .unwrap_or_else(|| "unknown part".to_owned())
}

/// `finish_reason` to the neutral stop reason.
pub fn stop_from(reason: &str) -> StopReason {
    match reason {
        "stop" => StopReason::EndTurn,
        "length" => StopReason::MaxTokens,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "content_filter" => StopReason::Refusal,
        _ => StopReason::Other,
    }
}

/// The neutral stop reason as a `finish_reason`.
pub fn stop_to(reason: StopReason) -> &'static str {
    match reason {
        StopReason::MaxTokens | StopReason::ContextWindow => "length",
        StopReason::ToolUse => "tool_calls",
        StopReason::Refusal => "content_filter",
        StopReason::EndTurn
        | StopReason::StopSequence
        | StopReason::PauseTurn
        | StopReason::ToolError
        | StopReason::Other => "stop",
    }
}

/// Parses an OpenAI chat completion (unstreamed).
pub fn parse_answer(body: &[u8]) -> Result<Answer, DialectError> {
    let m = parse_object(body)?;
    let choices = as_array(m.get("choices").unwrap_or(&Value::Null), "choices")?;
    let choice = choices
        .first()
        .ok_or_else(|| DialectError::invalid("choices", "no choice"))?;
    let c = as_obj(choice, "choices[0]")?;
    let msg = as_obj(
        c.get("message").unwrap_or(&Value::Null),
        "choices[0].message",
    )?;
    let message = parse_assistant(msg, "choices[0].message")?;
    Ok(Answer {
        id: opt_str(&m, "id", "")?.unwrap_or("").to_owned(),
        model: opt_str(&m, "model", "")?.unwrap_or("").to_owned(),
        content: message.content,
        stop_reason: stop_from(opt_str(c, "finish_reason", "choices[0]")?.unwrap_or("stop")),
        stop_sequence: None,
        usage: field(&m, "usage")
            .map(Usage::from_openai)
            .unwrap_or_default(),
    })
}

/// Writes an answer as an OpenAI chat completion; `created` is the Unix
/// time in seconds (the caller's clock: this crate has none).
pub fn write_answer(a: &Answer, created: u64) -> Result<Value, DialectError> {
    let mut text = String::new();
    let mut thinking = String::new();
    let mut calls = Vec::new();
    let mut lost = Vec::new();
    for (i, p) in a.content.iter().enumerate() {
        match p {
            Part::Text { text: t, .. } => text.push_str(t),
            Part::Thinking { text: t, .. } => thinking.push_str(t),
            Part::ToolUse {
                id, name, input, ..
            } => calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": input},
            })),
            // Anthropic's encrypted reasoning has no OpenAI field and
            // no reader there: dropped on purpose.
            Part::RedactedThinking { .. } => {}
            Part::Image { .. } | Part::ToolResult { .. } | Part::Other { .. } => {
                lost.push(Uncarried::new(
                    index("content", i),
                    Dialect::OpenAi,
                    "an OpenAI answer carries text, tool calls and reasoning only",
                ))
            }
        }
    }
    if !lost.is_empty() {
        return Err(DialectError::CannotCarry(lost));
    }
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { text.into() },
    });
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    if !thinking.is_empty() {
        message["reasoning_content"] = thinking.into();
    }
    Ok(json!({
        "id": a.id,
        "object": "chat.completion",
        "created": created,
        "model": a.model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": stop_to(a.stop_reason),
            "logprobs": null,
        }],
        "usage": a.usage.to_openai(),
    }))
}
