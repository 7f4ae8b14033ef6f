//! OpenTelemetry tracing: a SERVER span for each request the application
//! sends, a CLIENT span for each attempt, W3C trace context in and out, and
//! OTLP export (gRPC or HTTP/protobuf) in batches, off the proxy path.
//!
//! Configured by the standard `OTEL_*` environment variables and off unless an
//! OTLP endpoint is set. Off, [`Tracing`] and every span are empty `Option`s:
//! no span objects, no allocation, and the application's `traceparent` passes
//! through untouched.
//!
//! [`Pipeline`] (settings, OTLP exporter, batching, counters) is shared with
//! the controller, which names itself with its own [`Service`].

mod batch;
mod pipeline;
mod propagation;
mod settings;
mod spans;

use std::sync::Arc;
use std::time::Duration;

use http::Request;

pub use batch::SpanCounters;
pub use pipeline::{Pipeline, Service, DEFAULT_SERVICE_NAME};
pub use settings::{BatchSettings, Protocol, Settings};
pub use spans::{AttemptSpan, RequestSpan};

/// Process-wide tracing: off, or a running export pipeline. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Tracing(Option<Arc<Pipeline>>);

impl Tracing {
    /// Tracing off.
    pub fn off() -> Self {
        Tracing(None)
    }

    /// Tracing as the `OTEL_*` environment variables say. Must run inside the
    /// Tokio runtime that will serve requests.
    pub fn from_env() -> Result<Self, crate::Error> {
        match Settings::from_env()? {
            Some(settings) => Self::start(&settings),
            None => Ok(Self::off()),
        }
    }

    /// Starts the export pipeline with `settings`.
    pub fn start(settings: &Settings) -> Result<Self, crate::Error> {
        let pipeline = Pipeline::start(settings, Service::SIDECAR)?;
        Ok(Tracing(Some(Arc::new(pipeline))))
    }

    /// Tracing through an already built pipeline (tests: an exporter aimed
    /// at their own collector, where `start` would read the process environment).
    pub fn with_pipeline(pipeline: Pipeline) -> Self {
        Tracing(Some(Arc::new(pipeline)))
    }

    /// True when spans are recorded and exported.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Spans exported and dropped so far; `None` when off.
    pub fn counters(&self) -> Option<&SpanCounters> {
        self.0.as_ref().map(|p| p.counters())
    }

    /// Starts the SERVER span of `req`.
    pub fn request<B>(&self, req: &Request<B>) -> RequestSpan {
        match &self.0 {
            Some(p) => RequestSpan::start(p.tracer(), req),
            None => RequestSpan::off(),
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

    /// Exports the spans still queued and stops, waiting at most `timeout`
    /// (an unreachable collector must not hold up the exit). Returns false
    /// when the time ran out.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        match &self.0 {
            Some(p) => p.shutdown(timeout).await,
            None => true,
        }
    }
}
