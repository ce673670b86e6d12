//! Writing a neutral request as a Gemini `generateContent` request.

use serde_json::{json, Map, Value};

use crate::json::index;
use crate::{
    Dialect, ImageSource, Part, Reasoning, Request, ResponseFormat, Role, Tool, ToolChoice,
    Uncarried, WriteOptions,
};

/// Writes `req` as a Gemini request body; what cannot be carried is
/// pushed to `lost`. The model goes in the URL
/// ([`endpoint_path`](super::endpoint_path)).
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
