//! OpenTelemetry tracing for the controller: a `reconcile` span per reconcile
//! and a `push` span per snapshot sent to a sidecar, exported over OTLP by the
//! shared pipeline of `reprise-telemetry` (the sidecar's `OTEL_*` variables,
//! batching and counters).
//!
//! Off unless an OTLP endpoint is set. Off, [`Tracing`] and every span are
//! empty `Option`s, so callers record unconditionally at no cost.

mod push;
mod reconcile;

use std::time::Duration;

use reprise_telemetry::Service;
pub use reprise_telemetry::Tracing;

pub(crate) use push::PushSpan;
pub(crate) use reconcile::ReconcileSpan;

/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const SERVICE: Service = Service {
    name: "reprise-controller",
    version: env!("CARGO_PKG_VERSION"),
};

/// Longest the exit waits for queued spans to reach the collector.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
