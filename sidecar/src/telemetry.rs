//! OpenTelemetry tracing of the proxy: a SERVER span for each request the
//! application sends and a CLIENT span for each attempt, on the shared
//! pipeline of `reprise-telemetry` (settings, OTLP export, W3C propagation).

mod spans;

pub use reprise_telemetry::{BatchSettings, Pipeline, Service, Settings, SpanCounters, Tracing};
pub use spans::{AttemptSpan, RequestSpan};

/// The sidecar's `service.name` and `service.version` unless `OTEL_*` name others.
pub const SERVICE: Service = Service {
    name: "reprise-sidecar",
    version: env!("CARGO_PKG_VERSION"),
};
