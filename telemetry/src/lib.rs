//! Telemetry plumbing both Reprise binaries use, so that neither depends on
//! the other: the OpenTelemetry trace pipeline (settings from the standard
//! `OTEL_*` variables, OTLP export in batches from a Tokio task, span
//! counters), W3C trace-context propagation on HTTP headers, and the
//! Prometheus text format (families, one histogram type, RAII gauges).
//!
//! The contract: tracing is off unless an OTLP endpoint is set, and while off
//! [`Tracing`] is an empty `Option`, so callers record unconditionally at no
//! cost. Each binary defines its own span types on top of [`Tracing::tracer`]
//! (the head sampler decides) and [`Tracing::forced`] (recorded whatever it
//! decided: a caller that chooses to keep a trace the sampler dropped).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod batch;
mod forced;
mod pipeline;
pub mod prometheus;
pub mod propagation;
mod settings;
mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::trace::SdkTracer;

pub use batch::SpanCounters;
pub use forced::ForcedTracer;
pub use pipeline::{Pipeline, Service};
pub use settings::{
    BatchSettings, ClientFiles, Compression, Endpoint, FileVar, Protocol, Settings, TlsSettings,
};

/// Errors setting up telemetry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An `OTEL_*` variable asks for something Reprise cannot do. Refused at
    /// start: a typo must not leave tracing silently pointing nowhere.
    #[error("{var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        reason: &'static str,
    },
    /// A file an `OTEL_*` variable names (the collector's CA bundle, the
    /// client certificate or its key) cannot be read or used. Refused at
    /// start: TLS to the collector must never quietly become something else.
    #[error("{var}={}: {reason}", .path.display())]
    File {
        /// The variable.
        var: &'static str,
        /// The file it names.
        path: PathBuf,
        /// The rule the file breaks.
        reason: String,
        /// What the reader or rustls said, when it said something.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// rustls refused the TLS client settings (its crypto provider offers no
    /// safe protocol version; not expected with ring).
    #[error("cannot set up TLS to the OTLP collector")]
    Tls {
        /// rustls's error.
        #[source]
        source: rustls::Error,
    },
    /// The OTLP trace exporter could not be set up (e.g. a malformed endpoint).
    #[error("cannot set up the OTLP trace exporter")]
    Exporter {
        /// The exporter's error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Process-wide tracing: off, or a running export pipeline. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Tracing {
    pipeline: Option<Arc<Pipeline>>,
    /// [`Tracing::forced`] is withheld ([`Tracing::without_forcing`]).
    unforced: bool,
}

impl Tracing {
    /// Tracing off.
    pub fn off() -> Self {
        Tracing::default()
    }

    /// Tracing as the `OTEL_*` environment variables say, naming the spans'
    /// resource after `service`. Must run inside the Tokio runtime: the export
    /// task lives on it.
    pub fn from_env(service: Service) -> Result<Self, Error> {
        match Settings::from_env()? {
            Some(settings) => Ok(Self::on(Pipeline::start(&settings, service)?)),
            None => Ok(Self::off()),
        }
    }

    /// Tracing through `pipeline` (tests build one on their own exporter).
    pub fn on(pipeline: Pipeline) -> Self {
        Tracing {
            pipeline: Some(Arc::new(pipeline)),
            unforced: false,
        }
    }

    /// The same pipeline, with [`Tracing::forced`] always `None`: every
    /// span is the head sampler's to decide.
    pub fn without_forcing(self) -> Self {
        Tracing {
            unforced: true,
            ..self
        }
    }

    /// True when spans are recorded and exported.
    pub fn is_on(&self) -> bool {
        self.pipeline.is_some()
    }

    /// The tracer spans are started from; `None` while off.
    pub fn tracer(&self) -> Option<&SdkTracer> {
        self.pipeline.as_deref().map(Pipeline::tracer)
    }

    /// The tracer whose spans are recorded whatever the sampler says; `None`
    /// while off, while the sampler is `always_off`, and
    /// [`Tracing::without_forcing`].
    pub fn forced(&self) -> Option<&ForcedTracer> {
        if self.unforced {
            return None;
        }
        self.pipeline.as_deref().and_then(Pipeline::forced)
    }

    /// Spans exported and dropped so far; `None` while off.
    pub fn counters(&self) -> Option<&SpanCounters> {
        self.pipeline.as_deref().map(Pipeline::counters)
    }

    /// Exports the spans queued now, waiting at most `timeout`. Returns false
    /// when the time ran out or the pipeline is stopped.
    pub async fn flush(&self, timeout: Duration) -> bool {
        match &self.pipeline {
            Some(p) => p.flush(timeout).await,
            None => true,
        }
    }

    /// Exports the spans still queued and stops, waiting at most `timeout`
    /// (an unreachable collector must not hold up the exit). Returns false
    /// when the time ran out.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        match &self.pipeline {
            Some(p) => p.shutdown(timeout).await,
            None => true,
        }
    }
}
