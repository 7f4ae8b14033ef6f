//! Reads the standard `OTEL_*` environment variables that decide whether
//! tracing is on, how spans travel, and how they are batched. The sampler
//! (`OTEL_TRACES_SAMPLER[_ARG]`), the resource (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`) and the exporter's endpoint, headers and timeout
//! are read by the OpenTelemetry SDK and OTLP crates themselves.

use std::time::Duration;

use opentelemetry_sdk::trace::{
    OTEL_BSP_EXPORT_TIMEOUT, OTEL_BSP_EXPORT_TIMEOUT_DEFAULT, OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE_DEFAULT, OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT, OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_SCHEDULE_DELAY_DEFAULT,
};

use crate::Error;

/// How spans are sent to the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (`grpc`), usually port 4317.
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`, the default), usually port 4318.
    HttpProtobuf,
}

impl Protocol {
    /// The `OTEL_EXPORTER_OTLP_PROTOCOL` value.
    pub fn name(&self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// The batch span processor's limits (`OTEL_BSP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSettings {
    /// Longest a finished span waits before its batch is sent.
    pub schedule_delay: Duration,
    /// Longest one export may take; after it the batch is dropped.
    pub export_timeout: Duration,
    /// Finished spans held while waiting; more are dropped.
    pub max_queue_size: usize,
    /// Most spans in one export (at most `max_queue_size`).
    pub max_export_batch_size: usize,
}

/// Tracing settings, when tracing is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Transport to the collector.
    pub protocol: Protocol,
    /// Batching.
    pub batch: BatchSettings,
}

impl Settings {
    /// Reads the process environment. `None` means tracing is off.
    pub fn from_env() -> Result<Option<Settings>, Error> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`Settings::from_env`], with variables looked up by `get` (tests
    /// must not touch the process environment other tests read).
    ///
    /// Off when `OTEL_SDK_DISABLED=true`, when `OTEL_TRACES_EXPORTER=none`, or
    /// when neither `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` nor
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is set: a sidecar must not try to reach a
    /// collector that nobody configured.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<Settings>, Error> {
        let get = |name: &str| {
            get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(exporters) = get("OTEL_TRACES_EXPORTER") {
            let names: Vec<&str> = exporters.split(',').map(str::trim).collect();
            if !names.contains(&"otlp") {
                if names.iter().all(|n| *n == "none") {
                    return Ok(None);
                }
                return Err(Error::Env {
                    var: "OTEL_TRACES_EXPORTER",
                    value: exporters,
                    reason: "supported values are otlp and none",
                });
            }
        }
        let endpoint = [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .into_iter()
        .find_map(|var| get(var).map(|v| (var, v)));
        let Some((var, endpoint)) = endpoint else {
            return Ok(None);
        };
        // Neither OTLP client here is built with TLS: refuse rather than fail every export.
        if endpoint.to_ascii_lowercase().starts_with("https://") {
            return Err(Error::Env {
                var,
                value: endpoint,
                reason: "TLS to the collector is not supported; use an http:// endpoint (a collector in the cluster or on the node)",
            });
        }
        // The signal-specific variable wins, as the OTLP exporter specification says.
        let (var, value) = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            Some(v) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(v)),
            None => (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                get("OTEL_EXPORTER_OTLP_PROTOCOL"),
            ),
        };
        let protocol = match value.as_deref() {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") => Protocol::Grpc,
            Some(other) => {
                return Err(Error::Env {
                    var,
                    value: other.to_string(),
                    reason: "supported values are grpc and http/protobuf",
                })
            }
        };
        let number = |name: &'static str, default: u64| -> u64 {
            match get(name) {
                None => default,
                Some(v) => v.parse().unwrap_or_else(|_| {
                    // The specification says: ignore an unusable value, keep the default.
                    tracing::warn!(variable = name, value = %v, default, "not a whole number; using the default");
                    default
                }),
            }
        };
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let max_queue_size = number(
            OTEL_BSP_MAX_QUEUE_SIZE,
            OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT as u64,
        )
        .clamp(1, 1 << 20) as usize;
        let max_export_batch_size = number(
            OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
            OTEL_BSP_MAX_EXPORT_BATCH_SIZE_DEFAULT as u64,
        )
        .clamp(1, max_queue_size as u64) as usize;
        Ok(Some(Settings {
            protocol,
            batch: BatchSettings {
                // Zero would make the timer spin; a millisecond is as good as "now".
                schedule_delay: Duration::from_millis(
                    number(
                        OTEL_BSP_SCHEDULE_DELAY,
                        millis(OTEL_BSP_SCHEDULE_DELAY_DEFAULT),
                    )
                    .max(1),
                ),
                export_timeout: Duration::from_millis(
                    number(
                        OTEL_BSP_EXPORT_TIMEOUT,
                        millis(OTEL_BSP_EXPORT_TIMEOUT_DEFAULT),
                    )
                    .max(1),
                ),
                max_queue_size,
                max_export_batch_size,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Settings>, Error> {
        Settings::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    const ENDPOINT: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");

    #[test]
    fn off_without_an_endpoint_or_when_disabled() {
        assert_eq!(settings(&[]).expect("ok"), None);
        assert_eq!(
            settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).expect("ok"),
            None
        );
        assert_eq!(
            settings(&[ENDPOINT, ("OTEL_SDK_DISABLED", "TRUE")]).expect("ok"),
            None
        );
        assert_eq!(
            settings(&[ENDPOINT, ("OTEL_TRACES_EXPORTER", "none")]).expect("ok"),
            None
        );
        assert!(settings(&[ENDPOINT, ("OTEL_SDK_DISABLED", "false")])
            .expect("ok")
            .is_some());
        assert!(settings(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces"
        )])
        .expect("ok")
        .is_some());
        assert!(settings(&[ENDPOINT, ("OTEL_TRACES_EXPORTER", "zipkin")]).is_err());
        assert!(settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "HTTPS://c:4317")]).is_err());
    }

    #[test]
    fn protocol_defaults_to_http_protobuf_and_the_traces_variable_wins() {
        let on = |vars: &[(&str, &str)]| settings(vars).expect("ok").expect("on").protocol;
        assert_eq!(on(&[ENDPOINT]), Protocol::HttpProtobuf);
        assert_eq!(
            on(&[ENDPOINT, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
            Protocol::Grpc
        );
        assert_eq!(
            on(&[
                ENDPOINT,
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ]),
            Protocol::HttpProtobuf
        );
        let err = settings(&[ENDPOINT, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])
            .expect_err("unsupported");
        assert!(
            err.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL"),
            "{err}"
        );
    }

    #[test]
    fn batch_limits_come_from_otel_bsp_variables() {
        let b = settings(&[ENDPOINT]).expect("ok").expect("on").batch;
        assert_eq!(b.schedule_delay, Duration::from_secs(5));
        assert_eq!(b.export_timeout, Duration::from_secs(30));
        assert_eq!((b.max_queue_size, b.max_export_batch_size), (2048, 512));
        let b = settings(&[
            ENDPOINT,
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_BSP_EXPORT_TIMEOUT", "250"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "64"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1000"),
        ])
        .expect("ok")
        .expect("on")
        .batch;
        assert_eq!(b.schedule_delay, Duration::from_millis(100));
        assert_eq!(b.export_timeout, Duration::from_millis(250));
        assert_eq!(
            (b.max_queue_size, b.max_export_batch_size),
            (64, 64),
            "a batch never exceeds the queue"
        );
        let b = settings(&[ENDPOINT, ("OTEL_BSP_SCHEDULE_DELAY", "soon")])
            .expect("ok")
            .expect("on")
            .batch;
        assert_eq!(
            b.schedule_delay,
            Duration::from_secs(5),
            "garbage keeps the default"
        );
    }
}
