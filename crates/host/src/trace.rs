//! The W3C trace context an enqueue carries to the handler's span (the `opentelemetry`
//! feature); without the feature, items keep whatever metadata they were given.

use workpump_coordinator::NewWork;

/// `work` with the current span's trace context in its metadata (`traceparent`,
/// `tracestate`), unless it already carries a `traceparent` or there is no sampled-or-not
/// valid span context to carry.
#[cfg(feature = "opentelemetry")]
pub(crate) fn with_trace_context(mut work: NewWork) -> NewWork {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    if work
        .metadata
        .as_ref()
        .is_some_and(|m| m.get("traceparent").is_some())
    {
        return work;
    }
    let context = tracing::Span::current().context();
    let mut carrier = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    if carrier.is_empty() {
        return work;
    }
    let metadata = work
        .metadata
        .get_or_insert_with(|| serde_json::Value::Object(Default::default()));
    if let Some(object) = metadata.as_object_mut() {
        for (key, value) in carrier {
            object.insert(key, serde_json::Value::String(value));
        }
    }
    work
}

/// Without the `opentelemetry` feature there is no trace context to capture.
#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn with_trace_context(work: NewWork) -> NewWork {
    work
}
