//! OpenTelemetry tracing: a server span per request, a client span per
//! attempt, W3C trace context in and out.
//!
//! Configured by the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns export on (OTLP over gRPC),
//! `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER` / `_ARG`. `OTEL_SDK_DISABLED=true`
//! or `OTEL_TRACES_EXPORTER=none` keep it off.
//!
//! Off costs nothing measurable: the request path asks `enabled` (one
//! relaxed atomic load) before it builds a span, an attribute or a header.
//! On, spans are batched and exported from a task on the proxy's runtime.

use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// True when spans are being exported.
#[inline]
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether the environment asks for export.
pub fn wanted() -> bool {
    let set = |v: &str| std::env::var(v).is_ok_and(|x| !x.trim().is_empty());
    let off = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    !off && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Why OpenTelemetry export could not be set up ([`init`]).
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The OTLP exporter could not be built from the environment.
    #[error("OTLP exporter: {0}")]
    Exporter(opentelemetry_otlp::ExporterBuildError),
}

/// Builds the OTLP exporter and installs the global tracer provider and the
/// W3C propagator. Must run inside the tokio runtime. Returns the provider
/// (flush and shut it down before exit), or `None` when export is off.
pub fn init(default_service_name: &str) -> Result<Option<SdkTracerProvider>, InitError> {
    if !wanted() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(InitError::Exporter)?;
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(default_service_name.to_string());
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some(provider))
}

/// The tracing layer that turns `tracing` spans (config applies) into
/// OpenTelemetry spans.
pub fn layer<S>(
    provider: &SdkTracerProvider,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("router"))
}

/// The tracer for request and attempt spans.
pub(crate) fn tracer() -> opentelemetry::global::BoxedTracer {
    opentelemetry::global::tracer("router-proxy")
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// The trace context the client sent (`traceparent`), if any.
pub(crate) fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Writes `cx` as `traceparent` (and `tracestate`) into `headers`.
pub(crate) fn inject(cx: &Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// The trace id of a context's span, as 32 hex digits (none when invalid).
pub(crate) fn trace_id(cx: &Context) -> Option<String> {
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips() {
        let mut h = HeaderMap::new();
        h.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let cx = extract(&h);
        assert_eq!(
            trace_id(&cx).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        let mut out = HeaderMap::new();
        inject(&cx, &mut out);
        assert_eq!(
            out["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(trace_id(&extract(&HeaderMap::new())), None);
    }
}
