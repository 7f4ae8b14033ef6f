//! How injected sidecars are configured: the chart renders it into the
//! injection ConfigMap, the controller reads it at start (`--injection-config`).

use std::path::Path;

use k8s_openapi::api::core::v1::ResourceRequirements;
use serde::{Deserialize, Serialize};

use crate::Error;

/// The log levels a sidecar accepts as `logLevel` or the
/// `reprise.dev/log-level` annotation.
pub(super) const LOG_LEVELS: [&str; 5] = ["trace", "debug", "info", "warn", "error"];

/// How injected sidecars are configured: the chart renders it into the
/// injection ConfigMap, the controller reads it at start.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct InjectionConfig {
    /// Sidecar image.
    pub image: String,
    /// Its pull policy.
    #[serde(default = "defaults::pull_policy")]
    pub image_pull_policy: String,
    /// Push stream address the sidecar dials, e.g. `https://reprise-controller.reprise-system.svc:15010`.
    pub controller_address: String,
    /// TLS name to verify when it differs from the address's host.
    #[serde(default)]
    pub server_name: Option<String>,
    /// Outbound proxy port, on 127.0.0.1.
    #[serde(default = "defaults::proxy_port")]
    pub proxy_port: u16,
    /// Admin port, on 127.0.0.1.
    #[serde(default = "defaults::admin_port")]
    pub admin_port: u16,
    /// Health port (`/live`, `/ready` only), on the pod IP for the kubelet's probes.
    #[serde(default = "defaults::health_port")]
    pub health_port: u16,
    /// `REPRISE_LOG` of the sidecar.
    #[serde(default = "defaults::log_level")]
    pub log_level: String,
    /// Requests and limits of the sidecar container.
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    /// Trace export.
    #[serde(default)]
    pub otel: OtelSettings,
    /// `REPRISE_ENDPOINT_ADDRESS_MAP`, for local clusters only.
    #[serde(default)]
    pub address_map: Option<String>,
}

/// OTLP export of the sidecar's spans, as standard `OTEL_*` variables.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct OtelSettings {
    /// Collector endpoint; empty disables tracing.
    #[serde(default)]
    pub endpoint: String,
    /// `grpc` or `http/protobuf`.
    #[serde(default)]
    pub protocol: String,
    /// `OTEL_TRACES_SAMPLER`.
    #[serde(default)]
    pub sampler: String,
    /// `OTEL_TRACES_SAMPLER_ARG`.
    #[serde(default)]
    pub sampler_arg: String,
}

mod defaults {
    pub fn pull_policy() -> String {
        "IfNotPresent".into()
    }
    pub fn proxy_port() -> u16 {
        15001
    }
    pub fn admin_port() -> u16 {
        15000
    }
    pub fn health_port() -> u16 {
        15021
    }
    pub fn log_level() -> String {
        "info".into()
    }
}

impl InjectionConfig {
    /// Reads and parses the injection config file at `path`.
    pub(crate) fn load(path: &Path) -> Result<InjectionConfig, Error> {
        let invalid = |reason: String| Error::InjectionConfig {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
        Self::from_yaml(&text).map_err(invalid)
    }

    /// Parses the injection ConfigMap's YAML.
    pub(crate) fn from_yaml(text: &str) -> Result<InjectionConfig, String> {
        let config: InjectionConfig = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        if !LOG_LEVELS.contains(&config.log_level.as_str()) {
            return Err(format!(
                "logLevel: {:?} is not one of {}",
                config.log_level,
                LOG_LEVELS.join(", ")
            ));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_refuses_unknown_fields_and_bad_log_levels() {
        let e =
            InjectionConfig::from_yaml("image: x\ncontrollerAddress: y\nimagePulPolicy: Always\n")
                .expect_err("typo");
        assert!(e.contains("imagePulPolicy"), "{e}");
        let e = InjectionConfig::from_yaml("image: x\ncontrollerAddress: y\nlogLevel: loud\n")
            .expect_err("level");
        assert!(e.contains("logLevel"), "{e}");
    }
}
