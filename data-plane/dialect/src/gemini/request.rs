//! Reading a Gemini `generateContent` request: its fields, contents and
//! parts (the parts reader serves answers too).

use serde_json::{json, Value};

use super::{camel, lower_schema_types, obj_camel, tool_id_with_signature};
use crate::json::{as_array, field, index, opt_str, parse_object, path, req_str};
use crate::{
    Dialect, DialectError, ImageSource, Message, Part, Reasoning, Request, ResponseFormat, Role,
    TextBlock, Tool, ToolChoice,
};

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

pub(super) fn parse_part(
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
