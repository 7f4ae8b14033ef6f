//! Reprise's sidecar proxy: the retry engine.
//!
//! An application sends its outbound HTTP requests here (as an HTTP proxy, or
//! by Host). The sidecar routes each to an upstream by name, picks the retry
//! policy (first matching rule, else the upstream's `retries` block), and runs
//! the retry loop: attempt cap, rolling budget, full-jitter backoff, total
//! deadline, body replay, alternate endpoints and optional hedging, all before
//! response headers reach the client.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod address_map;
pub mod admin;
pub mod budget;
pub mod clock;
pub mod endpoint;
pub mod endpoint_picker;
pub mod failure;
pub mod hop_by_hop;
pub mod log_output;
pub mod metrics;
pub mod outcome;
pub mod proxy;
pub mod reload;
pub mod replay_body;
pub mod response_body;
pub mod retry;
pub mod routes;
pub mod server;
pub mod subscription;
pub mod telemetry;
pub mod upstream;

pub use proxy::Proxy;
pub use server::{serve_proxy, DRAIN_IDLE_GRACE, HEADER_READ_TIMEOUT};

/// Errors the sidecar library reports to its binary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] reprise_crds::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An `OTEL_*` variable asks for something the sidecar cannot do. Refused
    /// at start: a typo must not leave tracing silently pointing nowhere.
    #[error("{var}={value:?}: {reason}")]
    TracingEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        reason: &'static str,
    },
    /// The OTLP trace exporter could not be set up (e.g. a malformed endpoint).
    #[error("cannot set up the OTLP trace exporter")]
    TracingExporter {
        /// The exporter's error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}
