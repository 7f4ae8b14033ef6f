//! Assembles the SDK pipeline: resource, OTLP exporter, batch processor and
//! tracer provider (whose sampler the SDK reads from `OTEL_TRACES_SAMPLER`).
//! Shared by the sidecar and the controller, which differ only in [`Service`].

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Key, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_semantic_conventions::resource::{SERVICE_NAME, SERVICE_VERSION};

use crate::batch::{BatchProcessor, SpanCounters, Stopper};
use crate::settings::{BatchSettings, Protocol, Settings};
use crate::Error;

/// Which program the spans come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Service {
    /// `service.name` unless the environment names one; also the tracer's
    /// instrumentation scope.
    pub name: &'static str,
    /// `service.version` unless `OTEL_RESOURCE_ATTRIBUTES` sets one.
    pub version: &'static str,
}

/// A running pipeline: a tracer whose finished spans are batched and exported
/// from a Tokio task.
#[derive(Debug)]
pub struct Pipeline {
    tracer: SdkTracer,
    /// Owns the processor; shut down at exit.
    provider: SdkTracerProvider,
    stopper: Stopper,
    counters: Arc<SpanCounters>,
    resource: Resource,
}

impl Pipeline {
    /// Starts the OTLP pipeline `settings` describe. Must run inside the Tokio
    /// runtime: the export task and the gRPC channel live on it.
    pub fn start(settings: &Settings, service: Service) -> Result<Pipeline, Error> {
        let exporter = match settings.protocol {
            Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build(),
            Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .build(),
        }
        .map_err(|source| Error::Exporter { source })?;
        let pipeline = Self::with_exporter(exporter, settings.batch, service);
        tracing::info!(
            protocol = settings.protocol.name(),
            "OpenTelemetry tracing on: spans go to the OTLP collector"
        );
        Ok(pipeline)
    }

    /// Starts a pipeline that hands its batches to `exporter` (tests use an
    /// in-memory one). Must run inside the Tokio runtime.
    pub fn with_exporter<E>(mut exporter: E, batch: BatchSettings, service: Service) -> Pipeline
    where
        E: SpanExporter + 'static,
    {
        let resource = resource(service);
        // Our processor hands the exporter to its task at once, before the
        // provider would pass the resource along; so set it here.
        exporter.set_resource(&resource);
        let counters = Arc::new(SpanCounters::default());
        let (processor, stopper) = BatchProcessor::start(exporter, batch, Arc::clone(&counters));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.clone())
            .build();
        let tracer = provider.tracer(service.name);
        Pipeline {
            tracer,
            provider,
            stopper,
            counters,
            resource,
        }
    }

    /// Creates the spans.
    pub fn tracer(&self) -> &SdkTracer {
        &self.tracer
    }

    /// Spans exported and dropped so far.
    pub fn counters(&self) -> &SpanCounters {
        &self.counters
    }

    /// The resource every exported span carries.
    pub fn resource(&self) -> &Resource {
        &self.resource
    }

    /// Exports the spans queued now, waiting at most `timeout`. Returns false
    /// when the time ran out or the pipeline is stopped.
    pub async fn flush(&self, timeout: Duration) -> bool {
        self.stopper.flush(timeout).await
    }

    /// Exports the spans still queued and stops, waiting at most `timeout`
    /// (an unreachable collector must not hold up the exit). Returns false
    /// when the time ran out.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        let flushed = self.stopper.stop(timeout).await;
        // Marks the provider shut down: spans started from now on are not recorded.
        let _ = self.provider.shutdown();
        flushed
    }
}

/// The SDK's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
/// `telemetry.sdk.*`), with `service`'s name and version where the
/// environment names none.
fn resource(service: Service) -> Resource {
    let detected = Resource::builder().build();
    let unnamed = detected
        .get(&Key::from_static_str(SERVICE_NAME))
        .is_none_or(|name| name.as_str().starts_with("unknown_service"));
    let mut builder = Resource::builder();
    if unnamed {
        builder = builder.with_service_name(service.name);
    }
    if detected
        .get(&Key::from_static_str(SERVICE_VERSION))
        .is_none()
    {
        builder = builder.with_attribute(KeyValue::new(SERVICE_VERSION, service.version));
    }
    builder.build()
}
