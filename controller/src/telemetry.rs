//! OpenTelemetry tracing for the controller: a `reconcile` span per reconcile
//! and a `push` span per snapshot sent to a sidecar, exported over OTLP by the
//! sidecar's pipeline (same `OTEL_*` variables, same batching and counters).
//!
//! Off unless an OTLP endpoint is set. Off, [`Tracing`] and every span are
//! empty `Option`s, so callers record unconditionally at no cost.

mod push;
mod reconcile;

use std::sync::Arc;
use std::time::Duration;

use reprise_crds::resource::RetryPolicy;
use reprise_sidecar::telemetry::{Pipeline, Service, Settings, SpanCounters};

pub use push::PushSpan;
pub use reconcile::ReconcileSpan;

/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const SERVICE: Service = Service {
    name: "reprise-controller",
    version: env!("CARGO_PKG_VERSION"),
};

/// Longest the exit waits for queued spans to reach the collector.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Process-wide tracing: off, or a running export pipeline. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Tracing(Option<Arc<Pipeline>>);

impl Tracing {
    /// Tracing off.
    pub fn off() -> Self {
        Tracing(None)
    }

    /// Tracing as the `OTEL_*` environment variables say. Must run inside the
    /// Tokio runtime: the export task lives on it.
    pub fn from_env() -> Result<Self, reprise_sidecar::Error> {
        match Settings::from_env()? {
            Some(settings) => Ok(Self::on(Pipeline::start(&settings, SERVICE)?)),
            None => Ok(Self::off()),
        }
    }

    /// Tracing through `pipeline` (tests build one on an in-memory exporter).
    pub fn on(pipeline: Pipeline) -> Self {
        Tracing(Some(Arc::new(pipeline)))
    }

    /// True when spans are recorded and exported.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Spans exported and dropped so far; `None` when off.
    pub fn counters(&self) -> Option<&SpanCounters> {
        self.0.as_deref().map(Pipeline::counters)
    }

    /// Starts the span of one reconcile of `policy`.
    pub fn reconcile(&self, policy: &RetryPolicy) -> ReconcileSpan {
        match &self.0 {
            Some(p) => ReconcileSpan::start(p.tracer(), policy),
            None => ReconcileSpan::off(),
        }
    }

    /// Starts the span of one snapshot push: `version` sent to the sidecar of
    /// pod `pod` in `namespace`. End it with [`PushSpan::acked`],
    /// [`PushSpan::nacked`] or [`PushSpan::dropped`]; dropped unfinished, it
    /// ends as `dropped`.
    pub fn push_span(&self, namespace: &str, pod: &str, version: &str) -> PushSpan {
        match &self.0 {
            Some(p) => PushSpan::start(p.tracer(), namespace, pod, version),
            None => PushSpan::off(),
        }
    }

    /// Exports the spans queued now, waiting at most `timeout`. Returns false
    /// when the time ran out or tracing is stopped.
    pub async fn flush(&self, timeout: Duration) -> bool {
        match &self.0 {
            Some(p) => p.flush(timeout).await,
            None => true,
        }
    }

    /// Exports the spans still queued and stops, waiting at most `timeout`.
    /// Returns false when the time ran out.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        match &self.0 {
            Some(p) => p.shutdown(timeout).await,
            None => true,
        }
    }
}
