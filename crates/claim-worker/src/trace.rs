//! Tracing around every attempt: the span its handler runs in, and the logs of its outcome.

use serde_json::Value;
use tracing::field::Empty;
use workpump_coordinator::{ClaimedWork, InstanceId};

/// The name of the span every attempt's handler runs in.
pub const ATTEMPT_SPAN: &str = "workpump.job";

/// The span of one attempt: `workpump.job` with the queue, the kind (empty for an untyped
/// item), the item id, the attempt and the instance; `traceparent` when the enqueuer
/// attached a W3C trace context (`metadata.traceparent`), so a log line of the handler names
/// the trace it continues.
pub(crate) fn attempt_span(item: &ClaimedWork, instance: InstanceId) -> tracing::Span {
    let span = tracing::info_span!(
        "workpump.job",
        queue = %item.queue,
        kind = item.kind.as_deref().unwrap_or(""),
        id = item.fence.id,
        attempt = item.attempt,
        instance = %instance,
        traceparent = Empty,
    );
    if let Some(parent) = traceparent(item.metadata.as_ref()) {
        span.record("traceparent", parent);
        #[cfg(feature = "opentelemetry")]
        otel::continue_trace(&span, item.metadata.as_ref());
    }
    span
}

/// With the `opentelemetry` feature, the attempt's span continues the enqueuer's trace.
#[cfg(feature = "opentelemetry")]
mod otel {
    use std::collections::HashMap;

    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use serde_json::Value;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// Makes the trace context in `metadata` (`traceparent`, `tracestate`) the parent of
    /// `span`.
    pub(super) fn continue_trace(span: &tracing::Span, metadata: Option<&Value>) {
        let carrier: HashMap<String, String> = metadata
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        let parent = TraceContextPropagator::new().extract(&carrier);
        let _ = span.set_parent(parent);
    }
}

/// The W3C `traceparent` in an item's metadata, when it has a well-formed one
/// (`00-<32 hex>-<16 hex>-<2 hex>`).
pub(crate) fn traceparent(metadata: Option<&Value>) -> Option<&str> {
    let parent = metadata?.get("traceparent")?.as_str()?;
    let parts: Vec<&str> = parent.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (parts.len() == 4
        && hex(parts[0], 2)
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2))
    .then_some(parent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_traceparent_is_read_only_when_well_formed() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            traceparent(Some(&json!({ "traceparent": good }))),
            Some(good)
        );
        for bad in [
            json!({ "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7" }),
            json!({ "traceparent": "00-xyz-00f067aa0ba902b7-01" }),
            json!({ "traceparent": 7 }),
            json!({ "other": good }),
        ] {
            assert_eq!(traceparent(Some(&bad)), None, "{bad}");
        }
        assert_eq!(traceparent(None), None);
    }
}
