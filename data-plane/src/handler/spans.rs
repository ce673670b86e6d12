//! OpenTelemetry spans of the request path (tracing on only): the server
//! span (a child of the client's `traceparent`), started on arrival and
//! ended with the route record; and one client span per attempt, whose
//! context goes upstream as `traceparent`. Attribute names follow the
//! GenAI semantic conventions (`gen_ai.*`) plus the router's own
//! (`router.*`); outcomes are [`Outcome::as_str`], the same labels as the
//! route log and metrics.

use http::Request;
use hyper::body::Incoming;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::KeyValue;

use super::attempt::{Attempt, AttemptEnd};
use super::chain::Exchange;
use super::millis;
use crate::pool::CircuitState;
use crate::route_log::RouteRecord;
use crate::telemetry;

/// Starts the request's server span and keeps its context in `record`.
pub(super) fn start_server_span(req: &Request<Incoming>, record: &mut RouteRecord) {
    let parent = telemetry::extract(req.headers());
    let tracer = telemetry::tracer();
    let span = tracer
        .span_builder(format!("{} {}", req.method(), req.uri().path()))
        .with_kind(SpanKind::Server)
        .start_with_context(&tracer, &parent);
    let cx = parent.with_span(span);
    record.trace_id = telemetry::trace_id(&cx);
    record.otel = Some(cx);
}

/// An attempt inside a client span, annotated with how it ended.
pub(super) async fn traced_attempt(
    exchange: &Exchange,
    parent: &opentelemetry::Context,
    attempt: Attempt<'_>,
) -> AttemptEnd {
    let pool = attempt.pool;
    let timeout = attempt.timeout;
    let policy_pool = exchange.snapshot.policy.pool(pool.name());
    let model = policy_pool
        .and_then(|p| p.model.clone())
        .or_else(|| exchange.model.as_deref().map(str::to_string))
        .unwrap_or_default();
    let tracer = telemetry::tracer();
    let span = tracer
        .span_builder(format!("{} {model}", exchange.operation))
        .with_kind(SpanKind::Client)
        .start_with_context(&tracer, parent);
    let cx = parent.with_span(span);
    let end = exchange.attempt_untraced(attempt, Some(&cx)).await;
    let span = cx.span();
    span.set_attribute(KeyValue::new("gen_ai.operation.name", exchange.operation));
    span.set_attribute(KeyValue::new("gen_ai.request.model", model));
    if let Some(p) = policy_pool {
        span.set_attribute(KeyValue::new(
            "gen_ai.provider.name",
            provider_name(p.provider),
        ));
    }
    span.set_attribute(KeyValue::new("router.pool", pool.name().to_string()));
    if let Some(t) = timeout {
        span.set_attribute(KeyValue::new("router.attempt_timeout_ms", millis(t) as i64));
    }
    let record = match &end {
        AttemptEnd::Stream { record, .. }
        | AttemptEnd::Whole { record, .. }
        | AttemptEnd::Failed { record, .. } => Some(record),
        AttemptEnd::Shed(shed) => {
            span.set_attribute(KeyValue::new("router.outcome", shed.outcome().as_str()));
            None
        }
    };
    if let Some(r) = record {
        span.set_attribute(KeyValue::new("server.address", r.endpoint.clone()));
        span.set_attribute(KeyValue::new("router.outcome", r.outcome.as_str()));
        span.set_attribute(KeyValue::new("router.queue_wait_ms", r.queue_wait_ms));
        if let Some(s) = r.status {
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        if let Some(m) = &r.response_model {
            span.set_attribute(KeyValue::new("gen_ai.response.model", m.clone()));
        }
        if let Some(n) = r.tokens_in {
            span.set_attribute(KeyValue::new("gen_ai.usage.input_tokens", n as i64));
        }
        if let Some(n) = r.tokens_out {
            span.set_attribute(KeyValue::new("gen_ai.usage.output_tokens", n as i64));
        }
        for (key, n) in cache_attributes(r.cache_read_tokens, r.cache_write_tokens) {
            span.set_attribute(KeyValue::new(key, n));
        }
        if !r.outcome.is_success() {
            span.set_status(Status::error(r.outcome.as_str()));
            // The failure may have opened the endpoint's circuit.
            if pool.circuit_of(&r.endpoint) == Some(CircuitState::Open) {
                span.add_event(
                    "circuit_open",
                    vec![KeyValue::new("server.address", r.endpoint.clone())],
                );
            }
        }
    }
    span.end();
    end
}

/// Annotates and ends the request's server span.
pub(super) fn end_server_span(cx: &opentelemetry::Context, record: &RouteRecord, pool: &str) {
    let span = cx.span();
    let mut attrs = vec![
        KeyValue::new("http.request.method", record.method.to_string()),
        KeyValue::new("url.path", record.path.clone()),
        KeyValue::new("http.response.status_code", i64::from(record.status)),
        KeyValue::new("router.request_id", record.request_id.clone()),
        KeyValue::new("router.config_version", record.config_version.to_string()),
        KeyValue::new("router.outcome", record.outcome.as_str()),
        KeyValue::new("router.reason", record.reason.clone()),
        KeyValue::new("router.queue_wait_ms", record.queue_wait_ms),
        KeyValue::new("router.attempts", record.attempts.len() as i64),
        KeyValue::new("gen_ai.operation.name", operation_name(&record.path)),
    ];
    let optional = [
        ("router.route", record.route.clone()),
        ("router.pool", (!pool.is_empty()).then(|| pool.to_string())),
        ("router.risk", record.risk.map(|r| r.as_str().to_string())),
        (
            "gen_ai.request.model",
            record.model.as_deref().map(str::to_string),
        ),
        ("gen_ai.response.model", record.response_model.clone()),
        (
            "router.tenant",
            record.tenant.as_deref().map(str::to_string),
        ),
        ("router.dialect", record.dialect.map(str::to_string)),
        ("router.cache", record.cache.map(str::to_string)),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            attrs.push(KeyValue::new(k, v));
        }
    }
    if let Some(d) = record.deadline_ms {
        attrs.push(KeyValue::new("router.deadline_ms", d as i64));
    }
    if let Some(n) = record.tokens_in {
        attrs.push(KeyValue::new("gen_ai.usage.input_tokens", n as i64));
    }
    if let Some(n) = record.tokens_out {
        attrs.push(KeyValue::new("gen_ai.usage.output_tokens", n as i64));
    }
    for (key, n) in cache_attributes(record.cache_read_tokens, record.cache_write_tokens) {
        attrs.push(KeyValue::new(key, n));
    }
    span.set_attributes(attrs);
    if record.status >= 500 || !record.outcome.is_success() {
        span.set_status(Status::error(record.outcome.as_str()));
    }
    span.end();
}

/// OpenTelemetry's cache counts (parts of `gen_ai.usage.input_tokens`),
/// when a prompt cache was used.
fn cache_attributes(
    read: Option<u64>,
    write: Option<u64>,
) -> impl Iterator<Item = (&'static str, i64)> {
    [
        ("gen_ai.usage.cache_read.input_tokens", read),
        ("gen_ai.usage.cache_creation.input_tokens", write),
    ]
    .into_iter()
    .filter_map(|(k, n)| {
        n.filter(|n| *n > 0)
            .map(|n| (k, i64::try_from(n).unwrap_or(i64::MAX)))
    })
}

/// `gen_ai.operation.name` for an OpenAI-style path.
pub(super) fn operation_name(path: &str) -> &'static str {
    match path {
        "/v1/completions" => "text_completion",
        "/v1/embeddings" => "embeddings",
        _ => "chat",
    }
}

fn provider_name(p: router_policy::Provider) -> &'static str {
    p.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_policy::Outcome;

    #[test]
    fn operation_names_follow_the_path() {
        assert_eq!(operation_name("/v1/chat/completions"), "chat");
        assert_eq!(operation_name("/v1/completions"), "text_completion");
        assert_eq!(operation_name("/v1/embeddings"), "embeddings");
    }

    #[test]
    fn span_outcomes_use_the_shared_labels() {
        // A shed attempt's span says `queue_full`, as metrics and the log
        // do (it once said `QueueFull`).
        assert_eq!(
            crate::pool::Shed::QueueFull.outcome().as_str(),
            Outcome::QueueFull.as_str()
        );
        assert_eq!(
            crate::pool::Shed::QueueFull.outcome().as_str(),
            "queue_full"
        );
        assert_eq!(
            crate::pool::Shed::AttemptTimeout.outcome(),
            Outcome::DeadlineExhausted
        );
    }
}
