//! What the proxy tells the world about its work: Prometheus metrics and the
//! stats snapshot behind them, one access-log line per logical request, the
//! log writer that keeps stdout off the request path, OpenTelemetry spans
//! (a SERVER span per request, a CLIENT span per attempt) on the shared
//! pipeline of `reprise-telemetry`, and the diagnostics ring of requests
//! that were retried or failed.

pub(crate) mod access_log;
pub(crate) mod diagnostics;
pub(crate) mod log_output;
pub(crate) mod metrics;
pub(crate) mod spans;
pub(crate) mod traffic;

pub use reprise_telemetry::{Service, Tracing};

/// The sidecar's `service.name` and `service.version` unless `OTEL_*` name others.
pub const SERVICE: Service = Service {
    name: "reprise-sidecar",
    version: env!("CARGO_PKG_VERSION"),
};
