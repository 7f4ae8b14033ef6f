//! The span of one snapshot push: from sending a version to a sidecar until
//! it ACKs, NACKs, or the push is given up.

use std::time::Duration;

use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::Span;
use opentelemetry_semantic_conventions::attribute::{ERROR_TYPE, K8S_NAMESPACE_NAME, K8S_POD_NAME};
use reprise_telemetry::Tracing;

/// The span's name.
pub(crate) const NAME: &str = "push";
/// The snapshot version sent.
pub(crate) const VERSION: &str = "reprise.snapshot.version";
/// `acked`, `nacked` or `dropped` (never answered: the stream closed, or a
/// newer version replaced it).
pub(crate) const RESULT: &str = "reprise.push.result";
/// Time from sending to the ACK, in milliseconds, as the push server measured it.
pub(crate) const ACK_LATENCY_MS: &str = "reprise.push.ack_latency_ms";

/// Longest NACK message kept in the span status: it is the sidecar's text.
const MAX_NACK_LEN: usize = 1000;

/// The CLIENT span of one push. Ends with [`PushSpan::acked`],
/// [`PushSpan::nacked`] or [`PushSpan::dropped`]; dropped unfinished, it ends
/// as `dropped`.
#[derive(Debug)]
pub(crate) struct PushSpan(Option<Span>);

impl PushSpan {
    /// A span that records nothing.
    pub(crate) fn off() -> Self {
        PushSpan(None)
    }

    /// Starts the span of one snapshot push: `version` sent to the sidecar of
    /// pod `pod` in `namespace`; records nothing while `tracing` is off. End it
    /// with [`PushSpan::acked`], [`PushSpan::nacked`] or [`PushSpan::dropped`];
    /// dropped unfinished, it ends as `dropped`.
    pub(crate) fn start(tracing: &Tracing, namespace: &str, pod: &str, version: &str) -> Self {
        let Some(tracer) = tracing.tracer() else {
            return Self::off();
        };
        let span = tracer
            .span_builder(NAME)
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new(K8S_NAMESPACE_NAME, namespace.to_string()),
                KeyValue::new(K8S_POD_NAME, pod.to_string()),
                KeyValue::new(VERSION, version.to_string()),
            ])
            .start(tracer);
        PushSpan(Some(span))
    }

    /// The sidecar ACKed the version `latency` after it was sent.
    pub(crate) fn acked(mut self, latency: Duration) {
        if let Some(mut span) = self.0.take() {
            span.set_attributes([
                KeyValue::new(RESULT, "acked"),
                KeyValue::new(ACK_LATENCY_MS, latency.as_secs_f64() * 1000.0),
            ]);
            span.end();
        }
    }

    /// The sidecar refused the version with `error`.
    pub(crate) fn nacked(mut self, error: &str) {
        if let Some(mut span) = self.0.take() {
            span.set_attributes([
                KeyValue::new(RESULT, "nacked"),
                KeyValue::new(ERROR_TYPE, "nack"),
            ]);
            span.set_status(Status::error(
                error.chars().take(MAX_NACK_LEN).collect::<String>(),
            ));
            span.end();
        }
    }

    /// The version will never be answered: the stream closed, or a newer
    /// version replaced it. Not an error: the next push carries the state.
    pub(crate) fn dropped(mut self) {
        if let Some(span) = self.0.take() {
            end_dropped(span);
        }
    }
}

impl Drop for PushSpan {
    fn drop(&mut self) {
        if let Some(span) = self.0.take() {
            end_dropped(span);
        }
    }
}

fn end_dropped(mut span: Span) {
    span.set_attribute(KeyValue::new(RESULT, "dropped"));
    span.end();
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::Status;
    use opentelemetry::Value;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData};
    use reprise_telemetry::{BatchSettings, Pipeline};

    use super::*;
    use crate::telemetry::{Tracing, SERVICE};

    fn traced() -> (Tracing, InMemorySpanExporter) {
        let exporter = InMemorySpanExporter::default();
        let batch = BatchSettings {
            schedule_delay: Duration::from_secs(3600),
            export_timeout: Duration::from_secs(5),
            max_queue_size: 64,
            max_export_batch_size: 64,
        };
        let pipeline = Pipeline::with_exporter(exporter.clone(), batch, SERVICE);
        (Tracing::on(pipeline), exporter)
    }

    fn attr(span: &SpanData, key: &str) -> Option<Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    }

    #[tokio::test]
    async fn a_push_ends_acked_nacked_or_dropped() {
        let (tracing, exporter) = traced();
        PushSpan::start(&tracing, "shop", "web-1", "v7").acked(Duration::from_millis(12));
        PushSpan::start(&tracing, "shop", "web-2", "v7")
            .nacked("spec.retries.attempts: must be in 0..=10");
        PushSpan::start(&tracing, "shop", "web-3", "v7").dropped();
        drop(PushSpan::start(&tracing, "shop", "web-4", "v7"));
        assert!(tracing.flush(Duration::from_secs(5)).await);

        let spans = exporter.get_finished_spans().expect("spans");
        let by_pod = |pod: &str| {
            spans
                .iter()
                .find(|s| attr(s, K8S_POD_NAME) == Some(Value::from(pod.to_string())))
                .unwrap_or_else(|| panic!("no span for {pod}: {spans:#?}"))
        };
        let acked = by_pod("web-1");
        assert_eq!(acked.name, NAME);
        assert_eq!(acked.span_kind, SpanKind::Client);
        assert_eq!(attr(acked, K8S_NAMESPACE_NAME), Some("shop".into()));
        assert_eq!(attr(acked, VERSION), Some("v7".into()));
        assert_eq!(attr(acked, RESULT), Some("acked".into()));
        assert_eq!(attr(acked, ACK_LATENCY_MS), Some(12.0.into()));
        assert_eq!(acked.status, Status::Unset);

        let nacked = by_pod("web-2");
        assert_eq!(attr(nacked, RESULT), Some("nacked".into()));
        assert_eq!(attr(nacked, ERROR_TYPE), Some("nack".into()));
        assert_eq!(
            nacked.status,
            Status::error("spec.retries.attempts: must be in 0..=10")
        );

        for pod in ["web-3", "web-4"] {
            assert_eq!(attr(by_pod(pod), RESULT), Some("dropped".into()), "{pod}");
            assert_eq!(by_pod(pod).status, Status::Unset);
        }
        assert_eq!(spans.len(), 4);
        assert_eq!(tracing.counters().map(|c| c.exported()), Some(4));
    }

    #[test]
    fn off_records_nothing_and_the_span_can_cross_tasks() {
        fn send_sync<T: Send + Sync>(_: &T) {}
        let span = PushSpan::start(&Tracing::off(), "shop", "web-1", "v7");
        send_sync(&span);
        assert!(span.0.is_none());
        span.acked(Duration::ZERO);
    }
}
