//! [`Behavior::Engine`](crate::Behavior::Engine): the simulated engine
//! behind the mock's HTTP endpoints.
//!
//! One [`EngineDriver`] per mock runs the pure [`Engine`] in real time: a
//! task takes a step, sleeps for the step's simulated duration (tokio time),
//! then hands each request the tokens the step produced. Requests that
//! arrive while a step runs are queued in the engine at once (so `/metrics`
//! counts them as waiting) and join at the next step, as in vLLM. A request
//! whose client went away (its event receiver dropped) is aborted before the
//! next step, which frees its KV blocks.
//!
//! A request's prompt tokens are derived from its text: the messages'
//! roles and contents, concatenated, cut into 4-byte chunks (about one token
//! each, the usual rule of thumb for English), each hashed to a token id. So
//! two requests that start with the same system prompt start with the same
//! token ids and share prefix-cache blocks, as they would on vLLM.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::engine::{
    Engine, EngineConfig, EngineError, EngineMetrics, EngineRequest, FinishedRequest, RequestId,
};
use crate::server::lock;

/// What a request hears from the engine.
#[derive(Debug)]
pub(crate) enum EngineEvent {
    /// One more token was generated.
    Token,
    /// The last token was generated.
    Finished(FinishedRequest),
}

/// A request for the driver task.
struct Submission {
    request: EngineRequest,
    events: mpsc::UnboundedSender<EngineEvent>,
    accepted: oneshot::Sender<Result<(), EngineError>>,
}

/// The handle to a running simulated engine.
pub(crate) struct EngineDriver {
    pub(crate) config: EngineConfig,
    submissions: mpsc::UnboundedSender<Submission>,
    metrics: Arc<Mutex<EngineMetrics>>,
}

impl EngineDriver {
    /// Starts the engine's task; it ends once this handle is dropped and its
    /// last request is done.
    pub(crate) fn start(config: EngineConfig) -> EngineDriver {
        let (submissions, receiver) = mpsc::unbounded_channel();
        let metrics = Arc::new(Mutex::new(EngineMetrics::default()));
        tokio::spawn(drive(
            Engine::new(config.clone()),
            receiver,
            Arc::clone(&metrics),
        ));
        EngineDriver {
            config,
            submissions,
            metrics,
        }
    }

    /// Queues a request; its tokens come on the returned receiver.
    pub(crate) async fn submit(
        &self,
        request: EngineRequest,
    ) -> Result<mpsc::UnboundedReceiver<EngineEvent>, EngineError> {
        let (events, receiver) = mpsc::unbounded_channel();
        let (accepted, answer) = oneshot::channel();
        let submission = Submission {
            request,
            events,
            accepted,
        };
        // The task lives as long as this handle; if it is gone anyway, the
        // receiver closes at once and the request ends unanswered.
        let _ = self.submissions.send(submission);
        match answer.await {
            Ok(Err(error)) => Err(error),
            Ok(Ok(())) | Err(_) => Ok(receiver),
        }
    }

    /// The engine's counters as vLLM's `/metrics` page (Prometheus text).
    pub(crate) fn metrics_text(&self, model_name: &str) -> String {
        let metrics = *lock(&self.metrics);
        let label = model_name.replace('\\', "\\\\").replace('"', "\\\"");
        let mut text = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = write!(
                text,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{model_name=\"{label}\"}} {value}\n"
            );
        };
        metric(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            metrics.running.to_string(),
        );
        metric(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            metrics.waiting.to_string(),
        );
        metric(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            metrics.kv_cache_usage.to_string(),
        );
        metric(
            "vllm:gpu_cache_usage_perc",
            "gauge",
            "GPU KV-cache usage. 1 means 100 percent usage (older name).",
            metrics.kv_cache_usage.to_string(),
        );
        // Prometheus counters: the `_total` sample of a counter family.
        for (family, help, value) in [
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                metrics.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                metrics.prefix_cache_hits,
            ),
            (
                "vllm:num_preemptions",
                "Cumulative number of preemptions from the engine.",
                metrics.preemptions,
            ),
        ] {
            let _ = write!(
                text,
                "# HELP {family} {help}\n# TYPE {family} counter\n{family}_total{{model_name=\"{label}\"}} {value}\n"
            );
        }
        // vLLM's info gauge of its cache config (`log_metrics_info` in
        // vllm/v1/metrics/loggers.py): always 1, the config in its labels
        // (every CacheConfig field as text, plus `engine`; no `model_name`).
        // The fields the simulator has: the block size and the number of
        // KV blocks, which give the cache's size in tokens.
        let _ = write!(
            text,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{}\",enable_prefix_caching=\"True\",\
             engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0\n",
            self.config.block_size,
            self.config.total_blocks(),
        );
        text
    }
}

/// The driver task: steps the engine in real time while it has work, waits
/// for submissions when idle, ends when the handle is gone and all is done.
async fn drive(
    mut engine: Engine,
    mut submissions: mpsc::UnboundedReceiver<Submission>,
    metrics: Arc<Mutex<EngineMetrics>>,
) {
    let mut clients: HashMap<RequestId, mpsc::UnboundedSender<EngineEvent>> = HashMap::new();
    let mut open = true;
    loop {
        while let Ok(submission) = submissions.try_recv() {
            accept(&mut engine, &mut clients, submission);
        }
        clients.retain(|&id, events| {
            let gone = events.is_closed();
            if gone {
                engine.abort(id);
            }
            !gone
        });
        *lock(&metrics) = engine.metrics();
        let Some(step) = engine.step() else {
            if !open {
                return;
            }
            match submissions.recv().await {
                Some(submission) => accept(&mut engine, &mut clients, submission),
                None => open = false,
            }
            continue;
        };
        *lock(&metrics) = engine.metrics();
        let step_done = tokio::time::sleep(step.duration);
        tokio::pin!(step_done);
        loop {
            tokio::select! {
                () = &mut step_done => break,
                submission = submissions.recv(), if open => match submission {
                    Some(submission) => {
                        accept(&mut engine, &mut clients, submission);
                        *lock(&metrics) = engine.metrics();
                    }
                    None => open = false,
                },
            }
        }
        for token in &step.tokens {
            if let Some(events) = clients.get(&token.request) {
                let _ = events.send(EngineEvent::Token);
            }
        }
        for finished in step.finished {
            if let Some(events) = clients.remove(&finished.request) {
                let _ = events.send(EngineEvent::Finished(finished));
            }
        }
    }
}

fn accept(
    engine: &mut Engine,
    clients: &mut HashMap<RequestId, mpsc::UnboundedSender<EngineEvent>>,
    submission: Submission,
) {
    let result = engine.submit(submission.request).map(|id| {
        clients.insert(id, submission.events);
    });
    let _ = submission.accepted.send(result);
}

/// What the engine needs from a chat-completion request body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ParsedRequest {
    pub(crate) prompt: Vec<u32>,
    /// `max_completion_tokens` or `max_tokens`, if set.
    pub(crate) max_tokens: Option<u32>,
    pub(crate) stream: bool,
    /// `stream_options.include_usage`.
    pub(crate) include_usage: bool,
}

/// Reads a request body: the messages (or a completion's `prompt`; or, for
/// a body that is not JSON, its bytes) become token ids.
pub(crate) fn parse_request(body: &[u8]) -> ParsedRequest {
    let json = serde_json::from_slice::<Value>(body).ok();
    let text = json
        .as_ref()
        .and_then(prompt_text)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let field = |name: &str| json.as_ref().and_then(|json| json.get(name));
    let max_tokens = field("max_completion_tokens")
        .or_else(|| field("max_tokens"))
        .and_then(Value::as_u64)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    ParsedRequest {
        prompt: token_ids(&text),
        max_tokens,
        stream: field("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: field("stream_options")
            .and_then(|options| options.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }
}

/// The prompt token ids the simulated engine gives a request body, by the
/// same rule as for the requests it serves: what a harness checks its
/// renderings of a workload against.
pub fn prompt_token_ids(body: &[u8]) -> Vec<u32> {
    parse_request(body).prompt
}

/// The text a model would see: each message's role and content on lines of
/// their own (text parts of a multi-part content joined), or a completion
/// request's `prompt`.
fn prompt_text(json: &Value) -> Option<String> {
    if let Some(messages) = json.get("messages").and_then(Value::as_array) {
        let mut text = String::new();
        for message in messages {
            let role = message.get("role").and_then(Value::as_str).unwrap_or("");
            text.push_str(role);
            text.push('\n');
            match message.get("content") {
                Some(Value::String(content)) => text.push_str(content),
                Some(Value::Array(parts)) => {
                    for part in parts {
                        if let Some(part) = part.get("text").and_then(Value::as_str) {
                            text.push_str(part);
                        }
                    }
                }
                _ => {}
            }
            text.push('\n');
        }
        return Some(text);
    }
    json.get("prompt")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Token ids of `text`: one per 4-byte chunk, its FNV-1a hash.
pub(crate) fn token_ids(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(4)
        .map(|chunk| {
            let mut hash = 0x811c_9dc5_u32;
            for byte in chunk {
                hash ^= u32::from(*byte);
                hash = hash.wrapping_mul(0x0100_0193);
            }
            hash
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_system_prompt_gives_a_shared_token_prefix() {
        let system = "You are a careful assistant. ".repeat(10);
        let body = |user: &str| {
            serde_json::json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": user},
                ],
                "max_tokens": 7,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
            .to_string()
        };
        let a = parse_request(body("hello").as_bytes());
        let b = parse_request(body("something else entirely").as_bytes());
        let shared = ("system\n".len() + system.len()) / 4;
        assert_eq!(a.prompt[..shared], b.prompt[..shared]);
        assert_ne!(a.prompt, b.prompt);
        assert_eq!(a.max_tokens, Some(7));
        assert!(a.stream && a.include_usage);
    }

    #[test]
    fn a_body_that_is_not_json_still_has_tokens() {
        let parsed = parse_request(b"not json at all");
        assert_eq!(parsed.prompt.len(), 4);
        assert_eq!(parsed.max_tokens, None);
        assert!(!parsed.stream);
    }
}
