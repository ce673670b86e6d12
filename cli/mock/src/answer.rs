//! One request, from its head to its response: `GET /health` and the fixed
//! pages first, then recording and counting, the concurrency cap, and the
//! answer the current [`Behavior`] calls for (chat-completion JSON, SSE
//! events, silence, an error, a broken body or a redirect).
//!
//! Every answer is built the way a real server would send it: the status and
//! headers of an OpenAI-compatible endpoint, `x-mock-name` on each, and
//! OpenAI-style error bodies. The chat replies are written in `chat.rs`
//! (OpenAI's dialect) and `anthropic.rs` (Anthropic's); Gemini's in the
//! crate's `gemini` module.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::body::{FrameFormat, MockBody, Tracker};
use crate::engine::{EngineConfig, EngineRequest, FinishedRequest};
use crate::engine_http::{parse_request, EngineEvent, ParsedRequest};
use crate::prompt_cache::CacheUsage;
use crate::server::{lock, Shared};
use crate::{
    gemini, Behavior, OverCap, ReceivedRequest, StreamEnding, StreamScript, UsageMode,
    MOCK_NAME_HEADER,
};

mod anthropic;
mod chat;

use anthropic::*;
use chat::*;

/// Completion tokens reported in the `usage` of every JSON answer.
const COMPLETION_TOKENS: u64 = 5;

/// Waits `latency`; a zero latency does not wait for a timer tick.
async fn service_time(latency: Duration) {
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
}

/// Answers one request. Dropping this future at any await point (client gone)
/// is accounted for by the [`Tracker`].
pub(crate) async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<MockBody>, Infallible> {
    if request.method() == Method::GET {
        let path = request.uri().path();
        let page = lock(&shared.pages).get(path).cloned();
        if page.is_none() && crate::HEALTH_PATHS.contains(&path) {
            shared
                .health_hits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mode = lock(&shared.live).health.clone();
            let status = match mode {
                crate::HealthMode::Ok => StatusCode::OK,
                crate::HealthMode::RequiresKey(key) => {
                    let want = format!("Bearer {key}");
                    let given = request.headers().get(http::header::AUTHORIZATION);
                    if given.is_some_and(|v| v.as_bytes() == want.as_bytes()) {
                        StatusCode::OK
                    } else {
                        StatusCode::UNAUTHORIZED
                    }
                }
                crate::HealthMode::Status(code) => {
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                }
                crate::HealthMode::Hang => std::future::pending().await,
            };
            let body = MockBody::full(Bytes::from_static(br#"{"ok":true}"#), None);
            return Ok(shared.respond(status, Some("application/json"), body));
        }
        if let Some((status, text)) = page {
            *lock(&shared.page_hits).entry(path.to_owned()).or_insert(0) += 1;
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = MockBody::full(Bytes::from(text), None);
            return Ok(shared.respond(status, Some("application/json"), body));
        }
        if path == "/metrics" {
            let behavior = lock(&shared.live).behavior.clone();
            if let Behavior::Engine(config) = behavior {
                let text = shared.engine(&config).metrics_text(&shared.name);
                let body = MockBody::full(Bytes::from(text), None);
                let content_type = "text/plain; version=0.0.4; charset=utf-8";
                return Ok(shared.respond(StatusCode::OK, Some(content_type), body));
            }
        }
    }

    let (parts, body) = request.into_parts();
    let Ok(body) = body.collect().await.map(|collected| collected.to_bytes()) else {
        // The client went away while sending the body; nobody will read this.
        let body = MockBody::full(Bytes::new(), None);
        return Ok(shared.respond(StatusCode::BAD_REQUEST, None, body));
    };
    let request_id = parts
        .headers
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let prompt_len = body.len();
    // Anthropic's Messages path: errors in Anthropic's shape.
    let anthropic_path = parts.uri.path() == "/v1/messages";
    // Embeddings (OpenAI's `/v1/embeddings`, Azure's deployment path): the
    // answering behaviors answer them too; failures fail them alike.
    let embeddings = parts.method == Method::POST && parts.uri.path().ends_with("/embeddings");
    // A Gemini model call (the model in its path): errors in Gemini's shape.
    let gemini_call = parts
        .uri
        .path_and_query()
        .and_then(|pq| gemini::call_of(pq.as_str()));
    let json = serde_json::from_slice::<Value>(&body).ok();
    let model = match &gemini_call {
        Some(c) => c.model.clone(),
        None => json
            .as_ref()
            .and_then(|json| json.get("model").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| "mock".to_owned()),
    };
    let asks_usage = json
        .as_ref()
        .and_then(|j| j.get("stream_options"))
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);

    let (behavior, latency, quota) = {
        let live = lock(&shared.live);
        (live.behavior.clone(), live.latency, live.quota)
    };
    // The key's window, counted as the request arrives (as a provider's).
    let quota = quota.map(|q| lock(&shared.quota_book).take(&q, &parts.headers));
    let engine_request = matches!(behavior, Behavior::Engine(_)).then(|| parse_request(&body));
    lock(&shared.requests).push(ReceivedRequest {
        received_at: Instant::now(),
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        headers: parts.headers,
        body,
    });
    lock(&shared.stats).received += 1;
    let mut tracker = Tracker::new(Arc::clone(&shared), request_id.clone());
    let quota_headers = match quota {
        Some(t) if !t.served => {
            tracker.reject();
            let message = format!("mock {}: this key is over its rate limit", shared.name);
            let mut response = if anthropic_path {
                shared.anthropic_error_response(StatusCode::TOO_MANY_REQUESTS, &message, tracker)
            } else {
                shared.error_response(StatusCode::TOO_MANY_REQUESTS, &message, None)
            };
            for (name, value) in t.headers {
                response.headers_mut().insert(name, value);
            }
            return Ok(response);
        }
        Some(t) => t.headers,
        None => Vec::new(),
    };

    let permit = match (&shared.slots, shared.over_cap) {
        (None, _) => None,
        // `acquire_owned` only fails on a closed semaphore, which never happens.
        (Some(slots), OverCap::Queue) => Arc::clone(slots).acquire_owned().await.ok(),
        (Some(slots), OverCap::Reject429) => match Arc::clone(slots).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                tracker.reject();
                let message = "mock is at its concurrency limit";
                return Ok(shared.error_response(StatusCode::TOO_MANY_REQUESTS, message, None));
            }
        },
    };
    tracker.start_serving(permit);

    let n = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let id = format!("chatcmpl-{n}");
    let response = match behavior {
        Behavior::Json | Behavior::Chat | Behavior::Content(_) if embeddings => {
            service_time(latency).await;
            match embeddings_answer(json.as_ref(), &model) {
                Ok(answer) => {
                    let body = MockBody::full(Bytes::from(answer.to_string()), Some(tracker));
                    shared.respond(StatusCode::OK, Some("application/json"), body)
                }
                Err(message) => {
                    shared.error_response(StatusCode::BAD_REQUEST, message, Some(tracker))
                }
            }
        }
        Behavior::JsonUsage(usage) => {
            service_time(latency).await;
            let answer = json!({
                "id": id,
                "object": "chat.completion",
                "model": model,
                "served_by": shared.name,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": format!("hello from {}", shared.name)},
                    "finish_reason": "stop",
                }],
                "usage": "USAGE",
            })
            .to_string()
            .replace("\"USAGE\"", &usage);
            let body = MockBody::full(Bytes::from(answer), Some(tracker));
            shared.respond(StatusCode::OK, Some("application/json"), body)
        }
        Behavior::Json | Behavior::Content(_) => {
            let content = match &behavior {
                Behavior::Content(c) => c.clone(),
                _ => format!("hello from {}", shared.name),
            };
            service_time(latency).await;
            let prompt_tokens = prompt_len.div_ceil(4) as u64;
            let answer = json!({
                "id": id,
                "object": "chat.completion",
                "model": model,
                "served_by": shared.name,
                "request_id": request_id,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": COMPLETION_TOKENS,
                    "total_tokens": prompt_tokens + COMPLETION_TOKENS,
                },
            });
            let body = MockBody::full(Bytes::from(answer.to_string()), Some(tracker));
            shared.respond(StatusCode::OK, Some("application/json"), body)
        }
        Behavior::Chat => {
            service_time(latency).await;
            let reply = chat_reply(json.as_ref(), n);
            let prompt_tokens = prompt_len.div_ceil(4) as u64;
            let stream = json
                .as_ref()
                .and_then(|j| j.get("stream"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if stream {
                let frames = chat_frames(&id, &model, &reply, asks_usage, prompt_tokens);
                shared.event_stream(MockBody::new(frames, false, Some(tracker)))
            } else {
                let answer = chat_answer(&id, &model, &shared.name, &reply, prompt_tokens);
                let body = MockBody::full(Bytes::from(answer.to_string()), Some(tracker));
                shared.respond(StatusCode::OK, Some("application/json"), body)
            }
        }
        Behavior::Anthropic => {
            service_time(latency).await;
            let reply = anthropic_reply(json.as_ref(), n);
            let prompt_tokens = prompt_len.div_ceil(4) as u64;
            let input_tokens = lock(&shared.prompt_cache).usage(json.as_ref(), prompt_tokens);
            let stream = json
                .as_ref()
                .and_then(|j| j.get("stream"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if stream {
                let frames = anthropic_frames(n, &model, &reply, input_tokens);
                shared.event_stream(MockBody::new(frames, false, Some(tracker)))
            } else {
                let answer = anthropic_answer(n, &model, &reply, input_tokens);
                let body = MockBody::full(Bytes::from(answer.to_string()), Some(tracker));
                shared.respond(StatusCode::OK, Some("application/json"), body)
            }
        }
        Behavior::Gemini => {
            service_time(latency).await;
            let call = gemini_call.clone().unwrap_or(gemini::Call {
                model: model.clone(),
                stream: false,
                sse: false,
            });
            let prompt = prompt_len.div_ceil(4) as u64;
            let thoughts = gemini::wants_thoughts(json.as_ref());
            if let Err(message) = gemini::check(json.as_ref()) {
                let message = message.to_string();
                shared.gemini_error_response(StatusCode::BAD_REQUEST, &message, tracker)
            } else if call.stream && !call.sse {
                let message = "the mock streams with alt=sse only";
                shared.gemini_error_response(StatusCode::BAD_REQUEST, message, tracker)
            } else {
                let reply = gemini::reply(json.as_ref());
                if call.stream {
                    let frames = gemini::frames(n, &call.model, &reply, prompt, thoughts);
                    shared.event_stream(MockBody::new(frames, false, Some(tracker)))
                } else {
                    let answer = gemini::answer(n, &call.model, &reply, prompt, thoughts);
                    let body = MockBody::full(Bytes::from(answer.to_string()), Some(tracker));
                    shared.respond(StatusCode::OK, Some("application/json"), body)
                }
            }
        }
        Behavior::Stream(script) if gemini_call.is_some() => {
            let prompt = prompt_len.div_ceil(4) as u64;
            let first_token = match script.tail {
                Some((one_in, slow)) if one_in > 0 && n.is_multiple_of(u64::from(one_in)) => slow,
                _ => script.first_token,
            };
            let frames = gemini::scripted_frames(n, &model, &script, first_token, prompt);
            shared.event_stream(MockBody::new(frames, false, Some(tracker)))
        }
        Behavior::Sse { chunks, interval } => {
            let frames = sse_frames(&id, &model, &shared.name, chunks, latency, interval);
            shared.event_stream(MockBody::new(frames, false, Some(tracker)))
        }
        Behavior::Stream(script) => {
            let prompt_tokens = prompt_len.div_ceil(4) as u64;
            let frames = scripted_frames(&id, &model, &script, n, asks_usage, prompt_tokens);
            shared.event_stream(MockBody::new(frames, false, Some(tracker)))
        }
        Behavior::Engine(config) => {
            let parsed = engine_request.unwrap_or_else(|| parse_request(&[]));
            let answer = EngineAnswer {
                id,
                model,
                request_id,
            };
            shared.engine_answer(&config, parsed, answer, tracker).await
        }
        Behavior::Hang => {
            // Never answers; the tracker counts the request as cancelled when
            // hyper drops this future.
            match std::future::pending::<Infallible>().await {}
        }
        Behavior::Status(code) => {
            service_time(latency).await;
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let message = format!("mock {} answered {}", shared.name, status.as_u16());
            if anthropic_path {
                shared.anthropic_error_response(status, &message, tracker)
            } else if gemini_call.is_some() {
                shared.gemini_error_response(status, &message, tracker)
            } else {
                shared.error_response(status, &message, Some(tracker))
            }
        }
        Behavior::RateLimited(retry_after) => {
            service_time(latency).await;
            let message = format!("mock {} is rate limited", shared.name);
            match HeaderValue::from_str(&retry_after) {
                Ok(value) => {
                    let mut response = if gemini_call.is_some() {
                        shared.gemini_error_response(
                            StatusCode::TOO_MANY_REQUESTS,
                            &message,
                            tracker,
                        )
                    } else {
                        shared.error_response(
                            StatusCode::TOO_MANY_REQUESTS,
                            &message,
                            Some(tracker),
                        )
                    };
                    response.headers_mut().insert(RETRY_AFTER, value);
                    response
                }
                Err(_) => {
                    let message =
                        format!("Retry-After {retry_after:?} is not a valid header value");
                    shared.error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &message,
                        Some(tracker),
                    )
                }
            }
        }
        Behavior::MalformedJson => {
            service_time(latency).await;
            let truncated = format!(
                r#"{{"id":"{id}","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assi"#
            );
            let body = MockBody::full(Bytes::from(truncated), Some(tracker));
            shared.respond(StatusCode::OK, Some("application/json"), body)
        }
        Behavior::Redirect(url) => {
            service_time(latency).await;
            match HeaderValue::from_str(&url) {
                Ok(location) => {
                    let body = MockBody::full(Bytes::new(), Some(tracker));
                    let mut response = shared.respond(StatusCode::FOUND, None, body);
                    response.headers_mut().insert(LOCATION, location);
                    response
                }
                Err(_) => {
                    let message = format!("redirect URL {url:?} is not a valid header value");
                    shared.error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &message,
                        Some(tracker),
                    )
                }
            }
        }
    };
    let mut response = response;
    for (name, value) in quota_headers {
        response.headers_mut().insert(name, value);
    }
    Ok(response)
}

/// The frames of an SSE answer: `chunks` `chat.completion.chunk` events, the
/// first after `latency` and the others `interval` apart, then
/// `data: [DONE]` (after `latency` when there are no chunks), each with the
/// delay before it.
fn sse_frames(
    id: &str,
    model: &str,
    served_by: &str,
    chunks: usize,
    latency: Duration,
    interval: Duration,
) -> VecDeque<(Duration, Bytes)> {
    let mut frames = VecDeque::with_capacity(chunks + 1);
    // One event written by serde_json around a marker, then only the
    // token's number per chunk: a stream of 200,000 chunks is made before
    // its first byte, and a JSON value per chunk took seconds in a debug
    // build under load (a test's deadline ran out before the first byte).
    const MARK: &str = "@@TOKEN@@";
    let template = json!({
        "id": id,
        "object": "chat.completion.chunk",
        "model": model,
        "served_by": served_by,
        "choices": [{"index": 0, "delta": {"content": MARK}}],
    })
    .to_string();
    let (before, after) = template.split_once(MARK).unwrap_or((&template, ""));
    for i in 0..chunks {
        let delay = if i == 0 { latency } else { interval };
        frames.push_back((
            delay,
            Bytes::from(format!("data: {before}tok{i} {after}\n\n")),
        ));
    }
    let done_delay = if chunks == 0 { latency } else { Duration::ZERO };
    frames.push_back((done_delay, Bytes::from_static(b"data: [DONE]\n\n")));
    frames
}

/// The frames of a [`Behavior::Stream`] answer for the `n`-th request.
fn scripted_frames(
    id: &str,
    model: &str,
    script: &StreamScript,
    n: u64,
    asks_usage: bool,
    prompt_tokens: u64,
) -> VecDeque<(Duration, Bytes)> {
    let chunk = |delta: Value| {
        let event = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": null}],
        });
        Bytes::from(format!("data: {event}\n\n"))
    };
    let first_token = match script.tail {
        Some((one_in, slow)) if one_in > 0 && n.is_multiple_of(u64::from(one_in)) => slow,
        _ => script.first_token,
    };
    let mut frames = VecDeque::with_capacity(script.chunks + 4);
    frames.push_back((
        Duration::ZERO,
        chunk(json!({"role": "assistant", "content": ""})),
    ));
    for i in 0..script.chunks {
        let delay = if i == 0 { first_token } else { script.interval };
        frames.push_back((delay, chunk(json!({"content": format!("tok{i} ")}))));
    }
    let after = if script.chunks == 0 {
        first_token
    } else {
        script.interval
    };
    match script.ending {
        StreamEnding::Done => {
            let usage = match script.usage {
                UsageMode::Never => false,
                UsageMode::WhenAsked => asks_usage,
                UsageMode::Always => true,
            };
            if usage {
                let completion = script.chunks as u64;
                let event = json!({
                    "id": id,
                    "object": "chat.completion.chunk",
                    "model": model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion,
                        "total_tokens": prompt_tokens + completion,
                    },
                });
                let event = match &script.usage_text {
                    None => event.to_string(),
                    Some(text) => {
                        let mut event = event;
                        event["usage"] = json!("USAGE");
                        event.to_string().replace("\"USAGE\"", text)
                    }
                };
                frames.push_back((after, Bytes::from(format!("data: {event}\n\n"))));
            }
            frames.push_back((Duration::ZERO, Bytes::from_static(b"data: [DONE]\n\n")));
        }
        StreamEnding::Error => frames.push_back((
            after,
            Bytes::from_static(
                b"event: error\ndata: {\"error\":{\"message\":\"CUDA error: an illegal memory access was encountered\",\"type\":\"InternalServerError\",\"code\":500}}\n\n",
            ),
        )),
        StreamEnding::Malformed => {
            frames.push_back((after, Bytes::from_static(b"data: {\"choices\":[{\"delta\n\n")))
        }
        // A frame that never comes: the body hangs until the client leaves.
        StreamEnding::Stall => frames.push_back((Duration::from_secs(365 * 86_400), Bytes::new())),
    }
    frames
}

/// The names an engine answer carries.
struct EngineAnswer {
    id: String,
    model: String,
    request_id: Option<String>,
}

/// The `usage` object of a finished engine request.
fn engine_usage(done: &FinishedRequest) -> Value {
    json!({
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_prompt_tokens},
    })
}

impl Shared {
    /// A `200 text/event-stream` answer (not cached) with `body`.
    fn event_stream(&self, body: MockBody) -> Response<MockBody> {
        let mut response = self.respond(StatusCode::OK, Some("text/event-stream"), body);
        response
            .headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    }

    /// The answer of [`Behavior::Engine`]: the request goes through the
    /// simulated engine; a streamed answer gets one SSE event per token as
    /// the engine produces it, a plain one the whole JSON at the end.
    async fn engine_answer(
        &self,
        config: &EngineConfig,
        parsed: ParsedRequest,
        answer: EngineAnswer,
        tracker: Tracker,
    ) -> Response<MockBody> {
        let output_tokens = parsed.max_tokens.unwrap_or(config.default_output_tokens);
        let finish_reason = if parsed.max_tokens.is_some() {
            "length"
        } else {
            "stop"
        };
        let request = EngineRequest {
            prompt: parsed.prompt,
            output_tokens,
        };
        let mut events = match self.engine(config).submit(request).await {
            Ok(events) => events,
            Err(error) => {
                return self.error_response(
                    StatusCode::BAD_REQUEST,
                    &error.to_string(),
                    Some(tracker),
                )
            }
        };
        // `created` is a wall-clock Unix time in OpenAI's answer shape.
        let created = router_policy::wall_clock::since_epoch().as_secs();
        let EngineAnswer {
            id,
            model,
            request_id,
        } = answer;
        if parsed.stream {
            let served_by = self.name.clone();
            let include_usage = parsed.include_usage;
            let mut index = 0_u32;
            let chunk = move |choices: Value, usage: Option<Value>| {
                let mut event = json!({
                    "id": id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "served_by": served_by,
                    "choices": choices,
                });
                if let Some(usage) = usage {
                    event["usage"] = usage;
                }
                format!("data: {event}\n\n")
            };
            let format: FrameFormat = Box::new(move |event| match event {
                EngineEvent::Token => {
                    let content = format!("tok{index} ");
                    let delta = if index == 0 {
                        json!({"role": "assistant", "content": content})
                    } else {
                        json!({"content": content})
                    };
                    index += 1;
                    let choice = json!([{"index": 0, "delta": delta, "finish_reason": null}]);
                    Bytes::from(chunk(choice, None))
                }
                EngineEvent::Finished(done) => {
                    let choice = json!([{"index": 0, "delta": {}, "finish_reason": finish_reason}]);
                    let mut frames = chunk(choice, None);
                    if include_usage {
                        frames.push_str(&chunk(json!([]), Some(engine_usage(&done))));
                    }
                    frames.push_str("data: [DONE]\n\n");
                    Bytes::from(frames)
                }
            });
            let body = MockBody::live(events, format, Some(tracker));
            let mut response = self.respond(StatusCode::OK, Some("text/event-stream"), body);
            response
                .headers_mut()
                .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            return response;
        }
        let mut content = String::new();
        let mut tokens = 0_u32;
        let mut finished = None;
        while let Some(event) = events.recv().await {
            match event {
                EngineEvent::Token => {
                    content.push_str(&format!("tok{tokens} "));
                    tokens += 1;
                }
                EngineEvent::Finished(done) => {
                    finished = Some(done);
                    break;
                }
            }
        }
        let Some(done) = finished else {
            let message = format!("mock {} engine stopped", self.name);
            return self.error_response(StatusCode::SERVICE_UNAVAILABLE, &message, Some(tracker));
        };
        let answer = json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "served_by": self.name,
            "request_id": request_id,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }],
            "usage": engine_usage(&done),
        });
        let body = MockBody::full(Bytes::from(answer.to_string()), Some(tracker));
        self.respond(StatusCode::OK, Some("application/json"), body)
    }

    /// A response with `x-mock-name`, `x-request-id` if set
    /// ([`crate::MockModel::set_request_id`]) and, if given, a content type.
    fn respond(
        &self,
        status: StatusCode,
        content_type: Option<&'static str>,
        body: MockBody,
    ) -> Response<MockBody> {
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            HeaderName::from_static(MOCK_NAME_HEADER),
            self.name_header.clone(),
        );
        if let Some(content_type) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        }
        if let Some(id) = &lock(&self.live).request_id {
            headers.insert(HeaderName::from_static("x-request-id"), id.clone());
        }
        response
    }

    /// An Anthropic-style error answer (`{"type": "error", "error":
    /// {"type", "message"}}`, the type of the status: `529`
    /// `overloaded_error`, `429` `rate_limit_error`, ...); a 429 carries
    /// `Retry-After: 1`.
    fn anthropic_error_response(
        &self,
        status: StatusCode,
        message: &str,
        tracker: Tracker,
    ) -> Response<MockBody> {
        let kind = match status.as_u16() {
            529 | 503 => "overloaded_error",
            429 => "rate_limit_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        };
        let error = json!({"type": "error", "error": {"type": kind, "message": message}});
        let body = MockBody::full(Bytes::from(error.to_string()), Some(tracker));
        let mut response = self.respond(status, Some("application/json"), body);
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }

    /// A Gemini-style error answer (`{"error": {"code", "message",
    /// "status"}}`); a 429 carries `Retry-After: 1`.
    fn gemini_error_response(
        &self,
        status: StatusCode,
        message: &str,
        tracker: Tracker,
    ) -> Response<MockBody> {
        let error = gemini::error_body(status.as_u16(), message);
        let body = MockBody::full(Bytes::from(error.to_string()), Some(tracker));
        let mut response = self.respond(status, Some("application/json"), body);
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }

    /// An OpenAI-style error answer; a 429 carries `Retry-After: 1`.
    fn error_response(
        &self,
        status: StatusCode,
        message: &str,
        tracker: Option<Tracker>,
    ) -> Response<MockBody> {
        let (kind, code) = match status.as_u16() {
            429 => ("rate_limit_error", Some("rate_limit_exceeded")),
            400..=499 => ("invalid_request_error", None),
            _ => ("server_error", None),
        };
        let mut error = router_dialect::errors::openai_envelope(message, kind, code);
        error["error"]["param"] = Value::Null;
        let body = MockBody::full(Bytes::from(error.to_string()), tracker);
        let mut response = self.respond(status, Some("application/json"), body);
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// An OpenAI embeddings answer for `request` (`input`: a string or a list
/// of strings; `dimensions`, default 8): one unit vector per input, the
/// same for the same text, and `usage.prompt_tokens` as the inputs' bytes
/// / 4 (rounded up), as the chat answers count theirs.
fn embeddings_answer(request: Option<&Value>, model: &str) -> Result<Value, &'static str> {
    let request = request.ok_or("the body is not JSON")?;
    let inputs: Vec<&str> = match request.get("input") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|v| v.as_str().ok_or("input items must be strings"))
            .collect::<Result<_, _>>()?,
        _ => return Err("input must be a string or a list of strings"),
    };
    let dimensions = request
        .get("dimensions")
        .and_then(Value::as_u64)
        .unwrap_or(8)
        .clamp(1, 4096) as usize;
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| {
            // A deterministic vector from the text's bytes, normalized.
            let mut v = vec![0f64; dimensions];
            for (i, b) in text.bytes().enumerate() {
                v[i % dimensions] += f64::from(b) / 255.0 + 0.01;
            }
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-9);
            let v: Vec<f64> = v.iter().map(|x| x / norm).collect();
            json!({"object": "embedding", "index": index, "embedding": v})
        })
        .collect();
    let tokens: u64 = inputs.iter().map(|t| (t.len() as u64).div_ceil(4)).sum();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

/// A chat request's `messages` (OpenAI's and Anthropic's alike); none
/// when absent.
fn messages(json: Option<&Value>) -> &[Value] {
    json.and_then(|j| j.get("messages"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

#[cfg(test)]
mod sse_tests {
    use super::*;

    /// The frames written from one template are what serde_json writes
    /// for each chunk's event (the oracle), marker-like text in the model
    /// included.
    #[test]
    fn sse_frames_match_the_events_serde_json_writes() {
        let model = "m@@TOKEN@@\"quoted\"";
        let frames = sse_frames(
            "id-1",
            model,
            "mock",
            3,
            Duration::from_millis(5),
            Duration::from_millis(1),
        );
        assert_eq!(frames.len(), 4);
        for (i, (delay, bytes)) in frames.iter().take(3).enumerate() {
            let event = json!({
                "id": "id-1",
                "object": "chat.completion.chunk",
                "model": model,
                "served_by": "mock",
                "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}}],
            });
            assert_eq!(bytes, &Bytes::from(format!("data: {event}\n\n")));
            let want = if i == 0 { 5 } else { 1 };
            assert_eq!(*delay, Duration::from_millis(want));
        }
        assert_eq!(frames[3].1, Bytes::from_static(b"data: [DONE]\n\n"));
    }
}
