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
    /// Listener for transparently redirected connections (`--transparent`,
    /// on 127.0.0.1), in transparent pods.
    #[serde(default = "defaults::redirect_port")]
    pub redirect_port: u16,
    /// The UID the sidecar runs as; transparent pods' rules let its
    /// connections out uncaptured (`--proxy-uid`), so no app may share it.
    #[serde(default = "defaults::proxy_uid")]
    pub proxy_uid: i64,
    /// `REPRISE_LOG` of the sidecar.
    #[serde(default = "defaults::log_level")]
    pub log_level: String,
    /// `REPRISE_DIAGNOSTICS_RETAINED` of the sidecar: the retried or failed
    /// requests its admin `/diagnostics` keeps (0 turns it off).
    #[serde(default = "defaults::diagnostics_retained")]
    pub diagnostics_retained: usize,
    /// Requests and limits of the sidecar container.
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    /// Trace export.
    #[serde(default)]
    pub otel: OtelSettings,
    /// `REPRISE_ENDPOINT_ADDRESS_MAP`, for local clusters only.
    #[serde(default)]
    pub address_map: Option<String>,
    /// Defaults of transparent pods' capture.
    #[serde(default)]
    pub transparent: TransparentSettings,
}

/// What every transparent pod's `reprise-init` leaves uncaptured, besides
/// the API server (found by the controller) and the pod's annotations.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TransparentSettings {
    /// Destination ports never redirected (53: DNS over TCP).
    #[serde(default = "defaults::exclude_outbound_ports")]
    pub exclude_outbound_ports: Vec<u16>,
    /// Destination CIDRs never redirected.
    #[serde(default)]
    pub exclude_outbound_cidrs: Vec<String>,
    /// Requests and limits of `reprise-init`.
    #[serde(default = "defaults::init_resources")]
    pub init_resources: Option<ResourceRequirements>,
}

impl Default for TransparentSettings {
    fn default() -> Self {
        TransparentSettings {
            exclude_outbound_ports: defaults::exclude_outbound_ports(),
            exclude_outbound_cidrs: Vec::new(),
            init_resources: defaults::init_resources(),
        }
    }
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
    /// `OTEL_EXPORTER_OTLP_COMPRESSION`: `gzip` or `none`; empty leaves it
    /// unset (none).
    #[serde(default)]
    pub compression: String,
    /// TLS material for an `https://` endpoint, from Secrets in the pod's
    /// namespace.
    #[serde(default)]
    pub tls: OtelTls,
}

/// Secrets mounted into the sidecar for TLS to the collector. They live in
/// the injected pod's namespace (a pod can mount no other), so each
/// namespace with injected pods needs them; a missing one keeps the pod in
/// `ContainerCreating` with the kubelet's event saying which.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct OtelTls {
    /// Secret with the PEM bundle the collector's certificate is verified
    /// against (`OTEL_EXPORTER_OTLP_CERTIFICATE`); empty: Mozilla's roots.
    #[serde(default)]
    pub ca_secret: String,
    /// The bundle's key in that Secret.
    #[serde(default = "defaults::ca_key")]
    pub ca_key: String,
    /// `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) with the client
    /// certificate the collector requires (`OTEL_EXPORTER_OTLP_CLIENT_*`);
    /// empty: none.
    #[serde(default)]
    pub client_secret: String,
}

impl Default for OtelTls {
    fn default() -> Self {
        OtelTls {
            ca_secret: String::new(),
            ca_key: defaults::ca_key(),
            client_secret: String::new(),
        }
    }
}

/// The values of the fields above that the config file may leave out.
mod defaults {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    /// `imagePullPolicy`.
    pub(super) fn pull_policy() -> String {
        "IfNotPresent".into()
    }
    /// `proxyPort`.
    pub(super) fn proxy_port() -> u16 {
        15001
    }
    /// `adminPort`.
    pub(super) fn admin_port() -> u16 {
        15000
    }
    /// `healthPort`.
    pub(super) fn health_port() -> u16 {
        15021
    }
    /// `logLevel`.
    pub(super) fn log_level() -> String {
        "info".into()
    }
    /// `diagnosticsRetained`: the sidecar's own default.
    pub(super) fn diagnostics_retained() -> usize {
        reprise_crds::file::DEFAULT_DIAGNOSTICS_RETAINED
    }
    /// `redirectPort`.
    pub(super) fn redirect_port() -> u16 {
        15006
    }
    /// `proxyUid`: the user the sidecar image runs as (`nonroot`).
    pub(super) fn proxy_uid() -> i64 {
        65532
    }
    /// `otel.tls.caKey`: cert-manager's name for the CA in its Secrets.
    pub(super) fn ca_key() -> String {
        "ca.crt".into()
    }
    /// `transparent.excludeOutboundPorts`.
    pub(super) fn exclude_outbound_ports() -> Vec<u16> {
        vec![53]
    }
    /// `transparent.initResources`: `iptables-restore` of a handful of
    /// rules needs a few MiB for a moment.
    pub(super) fn init_resources() -> Option<ResourceRequirements> {
        let q = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        Some(ResourceRequirements {
            requests: q(&[("cpu", "10m"), ("memory", "16Mi")]),
            limits: q(&[("memory", "64Mi")]),
            ..Default::default()
        })
    }
}

/// `n` if the sidecar accepts it as `REPRISE_DIAGNOSTICS_RETAINED`, else
/// the rule it breaks.
pub(super) fn diagnostics_retained(n: usize) -> Result<usize, String> {
    let max = reprise_crds::file::MAX_DIAGNOSTICS_RETAINED;
    if n > max {
        return Err(format!("{n} is more than {max}"));
    }
    Ok(n)
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
        if let Err(rule) = diagnostics_retained(config.diagnostics_retained) {
            return Err(format!("diagnosticsRetained: {rule}"));
        }
        // One listener per port in the pod's network namespace.
        let ports = [
            ("proxyPort", config.proxy_port),
            ("adminPort", config.admin_port),
            ("healthPort", config.health_port),
            ("redirectPort", config.redirect_port),
        ];
        for (i, (name, port)) in ports.iter().enumerate() {
            if *port == 0 {
                return Err(format!("{name}: must be a port number (1-65535)"));
            }
            if let Some((other, _)) = ports[..i].iter().find(|(_, p)| p == port) {
                return Err(format!("{name}: {port} is already {other}"));
            }
        }
        // Root's connections must stay capturable (and reprise-init runs as root).
        if config.proxy_uid <= 0 || config.proxy_uid > i64::from(u32::MAX) {
            return Err(format!(
                "proxyUid: {} must be a non-root UID (1-4294967295)",
                config.proxy_uid
            ));
        }
        // What the sidecar would refuse at start, refused here once, before
        // every injected pod's sidecar fails the same way.
        let otel = &config.otel;
        if !["", "gzip", "none"].contains(&otel.compression.as_str()) {
            return Err(format!(
                "otel.compression: {:?} is not gzip or none",
                otel.compression
            ));
        }
        let tls = &otel.tls;
        if (!tls.ca_secret.is_empty() || !tls.client_secret.is_empty())
            && !otel.endpoint.is_empty()
            && !otel.endpoint.to_ascii_lowercase().starts_with("https://")
        {
            return Err(format!(
                "otel.tls: the Secrets are for an https:// endpoint, and otel.endpoint is {:?}",
                otel.endpoint
            ));
        }
        if !tls.ca_secret.is_empty() && tls.ca_key.is_empty() {
            return Err("otel.tls.caKey: the CA bundle's key in otel.tls.caSecret is empty".into());
        }
        let t = &config.transparent;
        if let Some(p) = t.exclude_outbound_ports.iter().find(|p| **p == 0) {
            return Err(format!(
                "transparent.excludeOutboundPorts: {p} is not a port number (1-65535)"
            ));
        }
        if t.exclude_outbound_ports.contains(&config.redirect_port) {
            return Err(format!(
                "transparent.excludeOutboundPorts: {} is redirectPort; connections to it stay on loopback, which is never captured",
                config.redirect_port
            ));
        }
        for c in &t.exclude_outbound_cidrs {
            super::overrides::parse_cidr(c)
                .map_err(|e| format!("transparent.excludeOutboundCidrs: {e}"))?;
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

    #[test]
    fn diagnostics_retained_defaults_to_the_sidecars_and_is_bounded() {
        let base = "image: x\ncontrollerAddress: y\n";
        let c = InjectionConfig::from_yaml(base).expect("defaults");
        assert_eq!(c.diagnostics_retained, 100);
        let c = InjectionConfig::from_yaml(&format!("{base}diagnosticsRetained: 0\n")).expect("0");
        assert_eq!(c.diagnostics_retained, 0);
        let e = InjectionConfig::from_yaml(&format!("{base}diagnosticsRetained: 1001\n"))
            .expect_err("too many");
        assert!(
            e.contains("diagnosticsRetained: 1001 is more than 1000"),
            "{e}"
        );
    }

    #[test]
    fn otel_compression_and_tls_are_checked() {
        let base = "image: x\ncontrollerAddress: y\n";
        let c = InjectionConfig::from_yaml(base).expect("defaults");
        assert_eq!(c.otel.tls, OtelTls::default());
        assert_eq!(c.otel.tls.ca_key, "ca.crt");
        let c = InjectionConfig::from_yaml(&format!(
            "{base}otel: {{endpoint: https://c:4317, compression: gzip, tls: {{caSecret: otlp-ca, clientSecret: otlp-client}}}}\n"
        ))
        .expect("tls");
        assert_eq!(
            (c.otel.compression.as_str(), c.otel.tls.ca_secret.as_str()),
            ("gzip", "otlp-ca")
        );
        for (extra, field) in [
            ("otel: {compression: zstd}\n", "otel.compression"),
            (
                "otel: {endpoint: http://c:4317, tls: {caSecret: otlp-ca}}\n",
                "otel.tls",
            ),
            (
                "otel: {endpoint: http://c:4317, tls: {clientSecret: otlp-client}}\n",
                "otel.tls",
            ),
            (
                "otel: {endpoint: https://c:4317, tls: {caSecret: otlp-ca, caKey: \"\"}}\n",
                "otel.tls.caKey",
            ),
            ("otel: {tls: {caFile: x}}\n", "caFile"),
        ] {
            let e = InjectionConfig::from_yaml(&format!("{base}{extra}")).expect_err(extra);
            assert!(e.contains(field), "{extra}: {e}");
        }
    }

    #[test]
    fn transparent_settings_default_and_are_checked() {
        let base = "image: x\ncontrollerAddress: y\n";
        let c = InjectionConfig::from_yaml(base).expect("defaults");
        assert_eq!((c.redirect_port, c.proxy_uid), (15006, 65532));
        assert_eq!(c.transparent.exclude_outbound_ports, [53]);
        for (extra, field) in [
            (
                "redirectPort: 15001\n",
                "redirectPort: 15001 is already proxyPort",
            ),
            ("proxyUid: 0\n", "proxyUid"),
            (
                "transparent: {excludeOutboundPorts: [0]}\n",
                "transparent.excludeOutboundPorts",
            ),
            (
                "transparent: {excludeOutboundPorts: [53, 15006]}\n",
                "15006 is redirectPort",
            ),
            (
                "transparent: {excludeOutboundCidrs: [10.0.0.0/40]}\n",
                "transparent.excludeOutboundCidrs",
            ),
            (
                "transparent: {excludeOutboundCidr: []}\n",
                "excludeOutboundCidr",
            ),
        ] {
            let e = InjectionConfig::from_yaml(&format!("{base}{extra}")).expect_err(extra);
            assert!(e.contains(field), "{extra}: {e}");
        }
    }
}
