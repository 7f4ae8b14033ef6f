//! Assembles the SDK pipeline: resource, OTLP exporter, batch processor and
//! tracer provider (whose sampler the SDK reads from `OTEL_TRACES_SAMPLER`).

use std::sync::Arc;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Key, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter as _};
use opentelemetry_sdk::Resource;
use opentelemetry_semantic_conventions::resource::{SERVICE_NAME, SERVICE_VERSION};

use super::batch::{BatchProcessor, SpanCounters, Stopper};
use super::settings::{Protocol, Settings};
use crate::Error;

/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const DEFAULT_SERVICE_NAME: &str = "reprise-sidecar";

/// A running pipeline.
#[derive(Debug)]
pub struct Pipeline {
    /// Creates the spans.
    pub tracer: SdkTracer,
    /// Owns the processor; shut down at exit.
    pub provider: SdkTracerProvider,
    /// Flushes and stops the export task.
    pub stopper: Stopper,
    /// Spans exported and dropped.
    pub counters: Arc<SpanCounters>,
}

/// Builds the pipeline. Must run inside the Tokio runtime: the export task
/// and the gRPC channel live on it.
pub fn build(settings: &Settings) -> Result<Pipeline, Error> {
    let resource = resource();
    let mut exporter = match settings.protocol {
        Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build(),
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build(),
    }
    .map_err(|source| Error::TracingExporter { source })?;
    // Our processor hands the exporter to its task at once, before the
    // provider would pass the resource along; so set it here.
    exporter.set_resource(&resource);
    let counters = Arc::new(SpanCounters::default());
    let (processor, stopper) =
        BatchProcessor::start(exporter, settings.batch, Arc::clone(&counters));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("reprise-sidecar");
    Ok(Pipeline {
        tracer,
        provider,
        stopper,
        counters,
    })
}

/// The SDK's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
/// `telemetry.sdk.*`), with this sidecar's name and version where the
/// environment names none.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let unnamed = detected
        .get(&Key::from_static_str(SERVICE_NAME))
        .is_none_or(|name| name.as_str().starts_with("unknown_service"));
    let mut builder = Resource::builder();
    if unnamed {
        builder = builder.with_service_name(DEFAULT_SERVICE_NAME);
    }
    if detected
        .get(&Key::from_static_str(SERVICE_VERSION))
        .is_none()
    {
        builder = builder.with_attribute(KeyValue::new(SERVICE_VERSION, env!("CARGO_PKG_VERSION")));
    }
    builder.build()
}
