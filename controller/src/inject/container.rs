//! The injected `reprise-sidecar` container: its arguments, the environment
//! contract of [`reprise_crds::sidecar_env`], OTLP settings (with the
//! collector's TLS Secrets as volumes), probes, security context and mounts;
//! and transparent pods' `reprise-init`.

use std::path::Path;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath,
    ObjectFieldSelector, Probe, SeccompProfile, SecretVolumeSource, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use reprise_crds::sidecar_env;

use super::config::InjectionConfig;
use super::overrides::{Capture, Overrides};
use super::{INIT_NAME, SIDECAR_NAME};

/// The volume holding the projected push token.
pub(super) const TOKEN_VOLUME: &str = "reprise-token";
/// The volume holding the last good snapshot.
pub(super) const STATE_VOLUME: &str = "reprise-state";
/// `reprise-init`'s writable `/run`: iptables-legacy takes its lock at
/// `/run/xtables.lock`, and the root filesystem is read-only.
pub(super) const XTABLES_VOLUME: &str = "reprise-xtables";

/// The volume of the collector's CA bundle (`otel.tls.caSecret`).
const OTLP_CA_VOLUME: &str = "reprise-otlp-ca";
/// The volume of the client certificate for the collector (`otel.tls.clientSecret`).
const OTLP_CLIENT_VOLUME: &str = "reprise-otlp-client";
/// Where they are mounted; the chart mounts the controller's at the same paths.
const OTLP_CA_DIR: &str = "/var/run/reprise/otlp-ca";
const OTLP_CLIENT_DIR: &str = "/var/run/reprise/otlp-client";
/// The bundle's file name in its volume, whatever its key in the Secret.
const OTLP_CA_FILE: &str = "ca.crt";

/// The directory of `path`: the volumes are mounted where the sidecar's
/// default paths point (and the variables name those paths), so the two
/// always agree.
fn dir_of(path: &'static str) -> &'static str {
    Path::new(path)
        .parent()
        .and_then(Path::to_str)
        .unwrap_or(path)
}

/// The file name of the token within its volume.
pub(super) fn token_file() -> &'static str {
    Path::new(sidecar_env::DEFAULT_TOKEN_PATH)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("token")
}

/// The sidecar container for `config` with the pod's `overrides`; it trusts
/// `ca_pem` for the push stream. `transparent` adds the listener for
/// redirected connections.
pub(super) fn sidecar_container(
    config: &InjectionConfig,
    o: &Overrides,
    ca_pem: &str,
    transparent: bool,
) -> Container {
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            field_path: path.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut env = vec![
        env(sidecar_env::CONTROLLER, &config.controller_address),
        EnvVar {
            name: sidecar_env::POD_NAME.into(),
            value_from: Some(field("metadata.name")),
            ..Default::default()
        },
        EnvVar {
            name: sidecar_env::POD_NAMESPACE.into(),
            value_from: Some(field("metadata.namespace")),
            ..Default::default()
        },
        env(sidecar_env::TOKEN_PATH, sidecar_env::DEFAULT_TOKEN_PATH),
        env(sidecar_env::CA_PEM, ca_pem),
        env(
            sidecar_env::SNAPSHOT_PATH,
            sidecar_env::DEFAULT_SNAPSHOT_PATH,
        ),
        env(sidecar_env::LOG, &o.log_level),
        env(
            sidecar_env::DIAGNOSTICS_RETAINED,
            &o.diagnostics_retained.to_string(),
        ),
    ];
    if let Some(name) = &config.server_name {
        env.push(self::env(sidecar_env::CONTROLLER_SERVER_NAME, name));
    }
    if let Some(map) = &config.address_map {
        env.push(self::env(sidecar_env::ENDPOINT_ADDRESS_MAP, map));
    }
    if !config.otel.endpoint.is_empty() {
        env.push(self::env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            &config.otel.endpoint,
        ));
        env.push(self::env("OTEL_SERVICE_NAME", "reprise-sidecar"));
        env.push(self::env(
            "OTEL_RESOURCE_ATTRIBUTES",
            &format!(
                "k8s.pod.name=$({}),k8s.namespace.name=$({})",
                sidecar_env::POD_NAME,
                sidecar_env::POD_NAMESPACE
            ),
        ));
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", &config.otel.protocol),
            ("OTEL_TRACES_SAMPLER", &config.otel.sampler),
            ("OTEL_TRACES_SAMPLER_ARG", &config.otel.sampler_arg),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", &config.otel.compression),
        ] {
            if !value.is_empty() {
                env.push(self::env(name, value));
            }
        }
        let tls = &config.otel.tls;
        if !tls.ca_secret.is_empty() {
            env.push(self::env(
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                &format!("{OTLP_CA_DIR}/{OTLP_CA_FILE}"),
            ));
        }
        if !tls.client_secret.is_empty() {
            env.push(self::env(
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                &format!("{OTLP_CLIENT_DIR}/tls.crt"),
            ));
            env.push(self::env(
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                &format!("{OTLP_CLIENT_DIR}/tls.key"),
            ));
        }
    }
    let mut mounts = vec![
        VolumeMount {
            name: TOKEN_VOLUME.into(),
            mount_path: dir_of(sidecar_env::DEFAULT_TOKEN_PATH).into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount {
            name: STATE_VOLUME.into(),
            mount_path: dir_of(sidecar_env::DEFAULT_SNAPSHOT_PATH).into(),
            ..Default::default()
        },
    ];
    mounts.extend(
        otlp_volumes(config)
            .into_iter()
            .map(|(volume, dir)| VolumeMount {
                name: volume.name,
                mount_path: dir.into(),
                read_only: Some(true),
                ..Default::default()
            }),
    );
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(config.health_port.into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    Container {
        name: SIDECAR_NAME.into(),
        image: Some(o.image.clone()),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        args: Some({
            let mut args = vec![
                "--listen".into(),
                format!("127.0.0.1:{}", config.proxy_port),
                "--admin".into(),
                format!("127.0.0.1:{}", config.admin_port),
                "--health".into(),
                format!("0.0.0.0:{}", config.health_port),
            ];
            if transparent {
                args.push("--transparent".into());
                args.push(format!("127.0.0.1:{}", config.redirect_port));
            }
            args
        }),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("reprise-health".into()),
            container_port: config.health_port.into(),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: o.resources.clone(),
        // The app starts once the proxy listens; readiness follows the snapshot.
        startup_probe: Some(probe("/live", 1, 30)),
        liveness_probe: Some(probe("/live", 10, 3)),
        readiness_probe: Some(probe("/ready", 5, 3)),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            // The UID transparent pods' rules exempt (loop prevention).
            run_as_user: Some(config.proxy_uid),
            run_as_group: Some(config.proxy_uid),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

/// The pod volumes of the collector's TLS Secrets (`otel.tls`), each with
/// the sidecar's mount point; none while tracing is off.
pub(super) fn otlp_volumes(config: &InjectionConfig) -> Vec<(Volume, &'static str)> {
    let otel = &config.otel;
    if otel.endpoint.is_empty() {
        return Vec::new();
    }
    let secret = |volume: &str, name: &str, items: &[(&str, &str)]| Volume {
        name: volume.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(name.into()),
            items: Some(
                items
                    .iter()
                    .map(|(key, path)| KeyToPath {
                        key: (*key).into(),
                        path: (*path).into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut volumes = Vec::new();
    if !otel.tls.ca_secret.is_empty() {
        volumes.push((
            secret(
                OTLP_CA_VOLUME,
                &otel.tls.ca_secret,
                &[(&otel.tls.ca_key, OTLP_CA_FILE)],
            ),
            OTLP_CA_DIR,
        ));
    }
    if !otel.tls.client_secret.is_empty() {
        volumes.push((
            secret(
                OTLP_CLIENT_VOLUME,
                &otel.tls.client_secret,
                &[("tls.crt", "tls.crt"), ("tls.key", "tls.key")],
            ),
            OTLP_CLIENT_DIR,
        ));
    }
    volumes
}

/// The init container of a transparent pod: installs the nat rules that
/// redirect the pod's outbound TCP to the sidecar (`reprise-sidecar
/// iptables`, same image) and exits. Root with `NET_ADMIN` (change netfilter
/// rules) and `NET_RAW` (iptables-legacy's raw socket) only: the least that
/// can change the pod's network namespace.
pub(super) fn init_container(config: &InjectionConfig, o: &Overrides, c: &Capture) -> Container {
    let join = |items: &[u16]| {
        items
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut args = vec![
        "iptables".to_string(),
        "--redirect-port".into(),
        config.redirect_port.to_string(),
        "--proxy-uid".into(),
        config.proxy_uid.to_string(),
    ];
    if !c.include_ports.is_empty() {
        args.extend(["--include-ports".into(), join(&c.include_ports)]);
    }
    if !c.exclude_ports.is_empty() {
        args.extend(["--exclude-ports".into(), join(&c.exclude_ports)]);
    }
    if !c.exclude_cidrs.is_empty() {
        args.extend(["--exclude-cidrs".into(), c.exclude_cidrs.join(",")]);
    }
    Container {
        name: INIT_NAME.into(),
        image: Some(o.image.clone()),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        args: Some(args),
        env: Some(vec![env(sidecar_env::LOG, &o.log_level)]),
        resources: config.transparent.init_resources.clone(),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(false),
            run_as_user: Some(0),
            run_as_group: Some(0),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: Some(vec!["NET_ADMIN".into(), "NET_RAW".into()]),
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: XTABLES_VOLUME.into(),
            mount_path: "/run".into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// `name=value`.
pub(super) fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}
