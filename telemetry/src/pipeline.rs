//! Assembles the SDK pipeline: resource, OTLP exporter, batch processor and
//! tracer provider (whose sampler the SDK reads from `OTEL_TRACES_SAMPLER`),
//! and beside it the [`ForcedTracer`]'s provider on the same processor's
//! queue, unless the sampler is `always_off`. Shared by the sidecar and the
//! controller, which differ only in [`Service`].
//!
//! The exporter gets everything [`Settings`] decided explicitly (endpoint,
//! timeout, compression), so that the OTLP crate's own reading of the same
//! variables cannot disagree; it still reads the headers itself. Over TLS it gets the transport too: the
//! crate's TLS features are off (they bring tonic's TLS stack), so the gRPC
//! channel and the HTTP client dial through [`TlsConnector`] with the rustls
//! configuration of `tls`.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Key, KeyValue};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_semantic_conventions::resource::{SERVICE_NAME, SERVICE_VERSION};

use crate::batch::{BatchProcessor, SpanCounters, Stopper};
use crate::forced::ForcedTracer;
use crate::settings::{BatchSettings, Compression, Protocol, Settings};
use crate::tls::{self, TlsConnector};
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
    /// Spans recorded whatever the sampler says, and their provider; none
    /// while the sampler is `always_off`.
    forced: Option<(ForcedTracer, SdkTracerProvider)>,
    stopper: Stopper,
    counters: Arc<SpanCounters>,
    resource: Resource,
}

impl Pipeline {
    /// Starts the OTLP pipeline `settings` describe. Must run inside the Tokio
    /// runtime: the export task and the gRPC channel live on it.
    pub fn start(settings: &Settings, service: Service) -> Result<Pipeline, Error> {
        let exporter = match settings.protocol {
            Protocol::Grpc => grpc_exporter(settings)?,
            Protocol::HttpProtobuf => http_exporter(settings)?,
        };
        let mut pipeline = Self::with_exporter(exporter, settings.batch, service);
        if settings.sampler_off {
            // `always_off` means no span at all, retried requests' included.
            if let Some((_, provider)) = pipeline.forced.take() {
                let _ = provider.shutdown();
            }
        }
        tracing::info!(
            protocol = settings.protocol.name(),
            endpoint = %settings.endpoint.url,
            tls = settings.tls.is_some(),
            compression = settings.compression.name(),
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
        let forced = ForcedTracer::new(processor.shared(), resource.clone(), service.name);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.clone())
            .build();
        let tracer = provider.tracer(service.name);
        Pipeline {
            tracer,
            provider,
            forced: Some(forced),
            stopper,
            counters,
            resource,
        }
    }

    /// Creates the spans.
    pub fn tracer(&self) -> &SdkTracer {
        &self.tracer
    }

    /// Starts spans that are recorded whatever the sampler says; `None`
    /// while the sampler is `always_off`.
    pub fn forced(&self) -> Option<&ForcedTracer> {
        self.forced.as_ref().map(|(tracer, _)| tracer)
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
        // Marks the providers shut down: spans started from now on are not recorded.
        let _ = self.provider.shutdown();
        if let Some((_, provider)) = &self.forced {
            let _ = provider.shutdown();
        }
        flushed
    }
}

/// The OTLP/gRPC exporter: the crate's plain-text channel to the endpoint's
/// URL, or over TLS a lazy channel of our own through [`TlsConnector`]
/// (ALPN `h2`). Headers go in as metadata either way.
fn grpc_exporter(settings: &Settings) -> Result<opentelemetry_otlp::SpanExporter, Error> {
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_timeout(settings.timeout);
    if let Some(compression) = compression(settings.compression) {
        builder = builder.with_compression(compression);
    }
    let builder = match &settings.tls {
        None => builder.with_endpoint(settings.endpoint.url.clone()),
        Some(tls) => {
            let config = tls::client_config(tls, b"h2")?;
            let endpoint = tonic::transport::Endpoint::from_shared(settings.endpoint.url.clone())
                // Settings parsed the same URL with the same parser; kept as
                // an error rather than a panic all the same.
                .map_err(|_| Error::Env {
                    var: settings.endpoint.var,
                    value: settings.endpoint.url.clone(),
                    reason: "not a URL with a host: https://host[:port]",
                })?
                .timeout(settings.timeout);
            builder.with_channel(endpoint.connect_with_connector_lazy(TlsConnector::new(config)))
        }
    };
    builder.build().map_err(|source| Error::Exporter { source })
}

/// The OTLP/HTTP exporter, sending with the crate's hyper client, or over
/// TLS with one on [`TlsConnector`] (ALPN `http/1.1`).
fn http_exporter(settings: &Settings) -> Result<opentelemetry_otlp::SpanExporter, Error> {
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(settings.endpoint.url.clone())
        .with_timeout(settings.timeout);
    if let Some(compression) = compression(settings.compression) {
        builder = builder.with_compression(compression);
    }
    if let Some(tls) = &settings.tls {
        let config = tls::client_config(tls, b"http/1.1")?;
        builder = builder.with_http_client(HyperClient::new(
            TlsConnector::new(config),
            settings.timeout,
            None,
        ));
    }
    builder.build().map_err(|source| Error::Exporter { source })
}

/// The OTLP crate's compression, `None` for none.
fn compression(compression: Compression) -> Option<opentelemetry_otlp::Compression> {
    match compression {
        Compression::None => None,
        Compression::Gzip => Some(opentelemetry_otlp::Compression::Gzip),
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
