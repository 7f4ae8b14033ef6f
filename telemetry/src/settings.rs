//! Reads the standard `OTEL_*` environment variables that decide whether
//! tracing is on, where and how spans travel, and how they are batched. The
//! sampler (`OTEL_TRACES_SAMPLER[_ARG]`; only whether it is `always_off` is
//! read here, for the forced tracer), the resource (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`) and the headers are read by the OpenTelemetry
//! SDK and OTLP crates themselves; everything else is decided here and handed
//! to the exporter explicitly, so that the two readings cannot disagree.
//!
//! The contract, following the OTLP exporter specification: each option's
//! `OTEL_EXPORTER_OTLP_TRACES_*` variable wins over the generic one; an
//! `https://` endpoint means TLS, verified against Mozilla's roots or the
//! `…_CERTIFICATE` bundle, with a client certificate when `…_CLIENT_CERTIFICATE`
//! and `…_CLIENT_KEY` are both set; compression is `gzip` or `none`. Whatever
//! cannot be honoured is refused, naming the variable: a collector that needs
//! TLS must never get plain text because a value was mistyped. Only variables
//! are read here; the files they name are read by `tls` when the pipeline
//! starts.

use std::path::PathBuf;
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

/// Whether export bodies are compressed (`OTEL_EXPORTER_OTLP_COMPRESSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// `none`, the default.
    None,
    /// `gzip`: gRPC message compression, or `Content-Encoding: gzip` over HTTP.
    Gzip,
}

impl Compression {
    /// The `OTEL_EXPORTER_OTLP_COMPRESSION` value.
    pub fn name(&self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
        }
    }
}

/// Where spans go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The variable it came from (for messages).
    pub var: &'static str,
    /// The URL spans are sent to, always with its scheme: for OTLP/HTTP a
    /// base `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended; for a
    /// gRPC target set without a scheme, `https://` (`http://` when
    /// `…_INSECURE` is `true`).
    pub url: String,
}

/// A file an `OTEL_*` variable names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileVar {
    /// The variable (the signal-specific one when both are set).
    pub var: &'static str,
    /// Its value.
    pub path: PathBuf,
}

/// TLS to the collector, for an `https://` endpoint. Verification is always
/// on: there is no setting that skips it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// The PEM bundle the collector's certificate is verified against
    /// (`…_CERTIFICATE`), instead of Mozilla's roots.
    pub ca: Option<FileVar>,
    /// The client certificate chain and its key (`…_CLIENT_CERTIFICATE`,
    /// `…_CLIENT_KEY`), for a collector that requires one.
    pub client: Option<ClientFiles>,
}

/// A client certificate chain (leaf first) and the private key of its leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientFiles {
    /// The chain's PEM file.
    pub cert: FileVar,
    /// The key's PEM file.
    pub key: FileVar,
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Transport to the collector.
    pub protocol: Protocol,
    /// The collector.
    pub endpoint: Endpoint,
    /// TLS, exactly when the endpoint is `https://`.
    pub tls: Option<TlsSettings>,
    /// Export bodies compressed or not.
    pub compression: Compression,
    /// Longest one export request may take (`OTEL_EXPORTER_OTLP_TIMEOUT`).
    pub timeout: Duration,
    /// Batching.
    pub batch: BatchSettings,
    /// `OTEL_TRACES_SAMPLER=always_off`: no span is exported, not even one
    /// a caller would force.
    pub sampler_off: bool,
}

/// The default of `OTEL_EXPORTER_OTLP_TIMEOUT`, as the OTLP crate has it.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

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
        let Some((endpoint_var, endpoint)) = endpoint else {
            return Ok(None);
        };
        // The signal-specific variable wins, as the OTLP exporter specification says.
        let signal = |name: &'static str, generic: &'static str| match get(name) {
            Some(v) => Some((name, v)),
            None => get(generic).map(|v| (generic, v)),
        };
        let protocol = match signal(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ) {
            None => Protocol::HttpProtobuf,
            Some((_, v)) if v == "http/protobuf" => Protocol::HttpProtobuf,
            Some((_, v)) if v == "grpc" => Protocol::Grpc,
            Some((var, value)) => {
                return Err(Error::Env {
                    var,
                    value,
                    reason: "supported values are grpc and http/protobuf",
                })
            }
        };
        let insecure = signal(
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
            "OTEL_EXPORTER_OTLP_INSECURE",
        )
        .is_some_and(|(var, v)| boolean(var, &v));
        let (url, tls) = endpoint_url(endpoint_var, endpoint, protocol, insecure)?;
        let file = |name: &'static str, generic: &'static str| {
            signal(name, generic).map(|(var, v)| FileVar {
                var,
                path: PathBuf::from(v),
            })
        };
        let ca = file(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        );
        let cert = file(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        );
        let key = file(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        );
        let client = match (cert, key) {
            (Some(cert), Some(key)) => Some(ClientFiles { cert, key }),
            (None, None) => None,
            // Half a client identity is a mistake, not a choice to go without one.
            (Some(FileVar { var, path }), None) => {
                return Err(Error::Env {
                    var,
                    value: path.display().to_string(),
                    reason: "a client certificate needs its key: set OTEL_EXPORTER_OTLP_CLIENT_KEY (or its _TRACES_ form) too",
                })
            }
            (None, Some(FileVar { var, path })) => {
                return Err(Error::Env {
                    var,
                    value: path.display().to_string(),
                    reason: "a client key needs its certificate: set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE (or its _TRACES_ form) too",
                })
            }
        };
        let tls = if tls {
            Some(TlsSettings { ca, client })
        } else {
            // Certificates for a plain-text endpoint: whoever set them expects
            // TLS, and the spans would travel without it.
            if let Some(FileVar { var, path }) = ca.or(client.map(|c| c.cert)) {
                return Err(Error::Env {
                    var,
                    value: path.display().to_string(),
                    reason: "certificates are for an https:// endpoint, and the OTLP endpoint is plain http://; use https://",
                });
            }
            None
        };
        let compression = match signal(
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ) {
            None => Compression::None,
            Some((_, v)) if v.eq_ignore_ascii_case("none") => Compression::None,
            Some((_, v)) if v.eq_ignore_ascii_case("gzip") => Compression::Gzip,
            Some((var, value)) => {
                return Err(Error::Env {
                    var,
                    value,
                    reason: "supported values are gzip and none",
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
        // As the OTLP crate reads it (milliseconds; garbage falls through to
        // the next variable, then the default), so the client's own deadline
        // and the exporter's agree.
        let timeout = [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]
        .into_iter()
        .find_map(|var| get(var)?.parse().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        Ok(Some(Settings {
            protocol,
            endpoint: Endpoint {
                var: endpoint_var,
                url,
            },
            tls,
            compression,
            timeout,
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
            // As the SDK reads it: the exact name.
            sampler_off: get("OTEL_TRACES_SAMPLER").is_some_and(|v| v == "always_off"),
        }))
    }
}

/// A boolean variable as the specification reads one: `true` (any case) is
/// true; anything else false, with a warning unless it is `false`.
fn boolean(var: &str, value: &str) -> bool {
    if value.eq_ignore_ascii_case("true") {
        return true;
    }
    if !value.eq_ignore_ascii_case("false") {
        tracing::warn!(variable = var, value, "not true or false; taken as false");
    }
    false
}

/// The endpoint `value` of `var` as a URL with its scheme, and whether it
/// is TLS. `https://` is TLS and `http://` plain text, whatever `…_INSECURE`
/// says; a gRPC target without a scheme is TLS unless `insecure` (the
/// specification's rule; `…_INSECURE` never turns verification off). OTLP/HTTP
/// needs the scheme.
fn endpoint_url(
    var: &'static str,
    value: String,
    protocol: Protocol,
    insecure: bool,
) -> Result<(String, bool), Error> {
    let refuse = |value: String, reason: &'static str| Error::Env { var, value, reason };
    let (url, tls) = match value.split_once("://") {
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => (value.clone(), true),
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("http") => (value.clone(), false),
        Some(_) => {
            return Err(refuse(
                value,
                "the scheme must be http:// (plain text) or https:// (TLS)",
            ))
        }
        None if protocol == Protocol::HttpProtobuf => {
            return Err(refuse(
                value,
                "an OTLP/HTTP endpoint is a URL: http://host:port or https://host:port",
            ))
        }
        None if insecure => (format!("http://{value}"), false),
        None => (format!("https://{value}"), true),
    };
    // Checked here rather than by the exporter, so that a typo is refused
    // with the variable's name, and TLS always has a host to verify.
    if !url
        .parse::<http::Uri>()
        .is_ok_and(|uri| uri.host().is_some_and(|h| !h.is_empty()))
    {
        return Err(refuse(
            value,
            "not a URL with a host: http(s)://host[:port][/path]",
        ));
    }
    // The specification's per-signal URL for OTLP/HTTP: the base endpoint
    // plus `v1/traces`; the traces variable is used as it is.
    let url = match protocol {
        Protocol::HttpProtobuf if var == "OTEL_EXPORTER_OTLP_ENDPOINT" => {
            format!("{}/v1/traces", url.trim_end_matches('/'))
        }
        _ => url,
    };
    Ok((url, tls))
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

    /// Variables and their values, for the tables.
    type Vars<'a> = &'a [(&'a str, &'a str)];

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
    }

    const GRPC: (&str, &str) = ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");

    #[test]
    fn the_scheme_decides_tls_and_insecure_only_picks_for_a_bare_grpc_target() {
        // (variables, URL spans go to, TLS)
        let table: &[(Vars, &str, bool)] = &[
            (&[ENDPOINT], "http://127.0.0.1:4318/v1/traces", false),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318/")],
                "https://c:4318/v1/traces",
                true,
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "HTTPS://c:4318/base")],
                "HTTPS://c:4318/base/v1/traces",
                true,
            ),
            // The traces variable is the whole URL, used as it is.
            (
                &[
                    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c/otlp"),
                    ENDPOINT,
                ],
                "https://c/otlp",
                true,
            ),
            // gRPC: no path appended.
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317"), GRPC],
                "https://c:4317",
                true,
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4317"), GRPC],
                "https://c:4317",
                true,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4317"),
                    GRPC,
                    ("OTEL_EXPORTER_OTLP_INSECURE", "TRUE"),
                ],
                "http://c:4317",
                false,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4317"),
                    GRPC,
                    ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
                    ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "false"),
                ],
                "https://c:4317",
                true,
            ),
            // An explicit scheme wins over INSECURE, as the specification says.
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317"),
                    GRPC,
                    ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
                ],
                "https://c:4317",
                true,
            ),
        ];
        for (vars, url, tls) in table {
            let s = settings(vars).expect("ok").expect("on");
            assert_eq!(
                (s.endpoint.url.as_str(), s.tls.is_some()),
                (*url, *tls),
                "{vars:?}"
            );
        }
    }

    #[test]
    fn tls_files_come_from_the_traces_variables_first() {
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/generic/ca.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces/ca.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/generic/cert.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/generic/key.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/traces/key.pem"),
        ])
        .expect("ok")
        .expect("on");
        let file = |var: &'static str, path: &str| FileVar {
            var,
            path: PathBuf::from(path),
        };
        assert_eq!(
            s.tls,
            Some(TlsSettings {
                ca: Some(file(
                    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                    "/traces/ca.pem"
                )),
                client: Some(ClientFiles {
                    cert: file("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/generic/cert.pem"),
                    key: file("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/traces/key.pem"),
                }),
            })
        );
        let s = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")])
            .expect("ok")
            .expect("on");
        assert_eq!(
            s.tls,
            Some(TlsSettings {
                ca: None,
                client: None
            }),
            "no bundle: the public roots"
        );
    }

    #[test]
    fn compression_and_timeout_with_the_traces_variable_first() {
        // (variables, compression, timeout)
        let table: &[(Vars, Compression, u64)] = &[
            (&[ENDPOINT], Compression::None, 10_000),
            (
                &[ENDPOINT, ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
                Compression::Gzip,
                10_000,
            ),
            (
                &[ENDPOINT, ("OTEL_EXPORTER_OTLP_COMPRESSION", "GZIP")],
                Compression::Gzip,
                10_000,
            ),
            (
                &[
                    ENDPOINT,
                    ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),
                ],
                Compression::None,
                10_000,
            ),
            (
                &[ENDPOINT, ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")],
                Compression::None,
                2_500,
            ),
            (
                &[
                    ENDPOINT,
                    ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "700"),
                ],
                Compression::None,
                700,
            ),
            // Garbage falls through, as the OTLP crate reads it.
            (
                &[
                    ENDPOINT,
                    ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon"),
                ],
                Compression::None,
                2_500,
            ),
        ];
        for (vars, compression, timeout) in table {
            let s = settings(vars).expect("ok").expect("on");
            assert_eq!(
                (s.compression, s.timeout),
                (*compression, Duration::from_millis(*timeout)),
                "{vars:?}"
            );
        }
    }

    #[test]
    fn refusals_name_the_variable_and_the_rule() {
        const HTTPS: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318");
        // (variables, the variable named, words of the rule)
        let table: &[(Vars, &str, &str)] = &[
            (
                &[ENDPOINT, ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")],
                "OTEL_EXPORTER_OTLP_COMPRESSION=\"zstd\"",
                "supported values are gzip and none",
            ),
            (
                &[
                    ENDPOINT,
                    ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "deflate"),
                ],
                "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
                "gzip and none",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "an OTLP/HTTP endpoint is a URL",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "the scheme must be http:// (plain text) or https:// (TLS)",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://")],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "not a URL with a host",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:43 17"), GRPC],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "not a URL with a host",
            ),
            (
                &[HTTPS, ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem")],
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE=\"/c.pem\"",
                "needs its key",
            ),
            (
                &[HTTPS, ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/k.pem")],
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                "needs its certificate",
            ),
            (
                &[ENDPOINT, ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem")],
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                "use https://",
            ),
            (
                &[
                    ENDPOINT,
                    ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "/c.pem"),
                    ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem"),
                ],
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                "use https://",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4317"),
                    GRPC,
                    ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
                    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem"),
                ],
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                "plain http://",
            ),
        ];
        for (vars, var, rule) in table {
            let err = settings(vars).expect_err("refused").to_string();
            assert!(err.contains(var) && err.contains(rule), "{vars:?}: {err}");
        }
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
    fn only_always_off_turns_the_sampler_off() {
        let off = |vars: &[(&str, &str)]| settings(vars).expect("ok").expect("on").sampler_off;
        assert!(!off(&[ENDPOINT]));
        assert!(off(&[ENDPOINT, ("OTEL_TRACES_SAMPLER", "always_off")]));
        assert!(!off(&[
            ENDPOINT,
            ("OTEL_TRACES_SAMPLER", "parentbased_always_off")
        ]));
        assert!(!off(&[ENDPOINT, ("OTEL_TRACES_SAMPLER", "traceidratio")]));
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
