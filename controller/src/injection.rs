//! Sidecar injection: what the mutating webhook adds to a new Pod.
//!
//! Pure functions of the Pod and the [`InjectionConfig`], so every decision
//! (skip, inject, refuse a bad override) is unit-tested without an API server.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, Pod, Probe, ProjectedVolumeSource, ResourceRequirements,
    SeccompProfile, SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use reprise_crds::sidecar_env;
use serde::{Deserialize, Serialize};

/// Name of the injected container.
pub const SIDECAR_NAME: &str = "reprise-sidecar";
/// Set to `"false"` on a Pod to opt it out (the chart's object selector also
/// skips Pods labelled `reprise.dev/inject=disabled`).
pub const INJECT: &str = "reprise.dev/inject";
/// Written on injected Pods; its presence makes injection idempotent.
pub const INJECTED: &str = "reprise.dev/injected";
/// Set to `"false"` to keep `HTTP_PROXY`/`NO_PROXY` out of the app containers.
pub const PROXY_ENV: &str = "reprise.dev/proxy-env";
/// Per-pod overrides, each replacing one value of the injection config.
pub const CPU_REQUEST: &str = "reprise.dev/sidecar-cpu-request";
/// See [`CPU_REQUEST`].
pub const MEMORY_REQUEST: &str = "reprise.dev/sidecar-memory-request";
/// See [`CPU_REQUEST`].
pub const CPU_LIMIT: &str = "reprise.dev/sidecar-cpu-limit";
/// See [`CPU_REQUEST`].
pub const MEMORY_LIMIT: &str = "reprise.dev/sidecar-memory-limit";
/// See [`CPU_REQUEST`].
pub const LOG_LEVEL: &str = "reprise.dev/log-level";
/// See [`CPU_REQUEST`].
pub const IMAGE: &str = "reprise.dev/sidecar-image";

/// The push token's audience; the controller's TokenReview asks for it.
const TOKEN_AUDIENCE: &str = reprise_crds::protocol::AUDIENCE;
/// Where the projected token and the snapshot volume are mounted: the
/// directories of the sidecar's default paths, so the two always agree.
const TOKEN_DIR: &str = "/var/run/secrets/reprise";
const STATE_DIR: &str = "/var/lib/reprise";
const LOG_LEVELS: [&str; 5] = ["trace", "debug", "info", "warn", "error"];

/// How injected sidecars are configured: the chart renders it into the
/// injection ConfigMap, the controller reads it at start.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InjectionConfig {
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
pub struct OtelSettings {
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

/// What to do with a Pod.
#[derive(Debug)]
pub enum Decision {
    /// Leave it as it is, for this reason.
    Skip(&'static str),
    /// Admit this mutated Pod.
    Inject(Box<Pod>),
    /// Refuse the Pod: an override annotation is invalid.
    Refuse(String),
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
    /// Parses the injection ConfigMap's YAML.
    pub fn from_yaml(text: &str) -> Result<InjectionConfig, String> {
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

/// Decides what to do with `pod`. `native` adds the sidecar as an init
/// container with `restartPolicy: Always` (Kubernetes 1.29+), so it starts
/// before and stops after the app; otherwise as the first regular container.
/// `ca_pem` is the CA the sidecar trusts for the push stream.
pub fn decide(pod: &Pod, config: &InjectionConfig, ca_pem: &str, native: bool) -> Decision {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    if annotations.get(INJECT).map(String::as_str) == Some("false") {
        return Decision::Skip("opted out by annotation");
    }
    let spec = match &pod.spec {
        Some(spec) => spec,
        None => return Decision::Skip("pod has no spec"),
    };
    let already = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.name == SIDECAR_NAME);
    if already || annotations.contains_key(INJECTED) {
        return Decision::Skip("already injected");
    }
    if spec.host_network == Some(true) {
        // The sidecar's ports would collide across pods on the node.
        return Decision::Skip("host network pod");
    }
    let overrides = match Overrides::from_annotations(&annotations, config) {
        Ok(o) => o,
        Err(e) => return Decision::Refuse(e),
    };

    let mut pod = pod.clone();
    let mut spec = pod.spec.take().unwrap_or_default();
    let mut sidecar = sidecar_container(config, &overrides, ca_pem);
    if native {
        sidecar.restart_policy = Some("Always".into());
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, sidecar);
    } else {
        spec.containers.insert(0, sidecar);
    }
    if annotations.get(PROXY_ENV).map(String::as_str) != Some("false") {
        let proxy = format!("http://127.0.0.1:{}", config.proxy_port);
        for c in spec
            .containers
            .iter_mut()
            .filter(|c| c.name != SIDECAR_NAME)
        {
            add_proxy_env(c, &proxy);
        }
    }
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.push(Volume {
        name: "reprise-token".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    audience: Some(TOKEN_AUDIENCE.into()),
                    expiration_seconds: Some(3600),
                    path: "token".into(),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    volumes.push(Volume {
        name: "reprise-state".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    pod.spec = Some(spec);
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            INJECTED.into(),
            if native { "native" } else { "container" }.into(),
        );
    Decision::Inject(Box::new(pod))
}

/// Per-pod values that replace the injection config's.
#[derive(Debug)]
struct Overrides {
    image: String,
    log_level: String,
    resources: Option<ResourceRequirements>,
}

impl Overrides {
    fn from_annotations(
        annotations: &BTreeMap<String, String>,
        config: &InjectionConfig,
    ) -> Result<Overrides, String> {
        let mut resources = config.resources.clone();
        for (key, limit, resource) in [
            (CPU_REQUEST, false, "cpu"),
            (MEMORY_REQUEST, false, "memory"),
            (CPU_LIMIT, true, "cpu"),
            (MEMORY_LIMIT, true, "memory"),
        ] {
            let Some(value) = annotations.get(key) else {
                continue;
            };
            if !is_quantity(value) {
                return Err(format!(
                    "annotation {key}: {value:?} is not a Kubernetes quantity (e.g. 100m, 64Mi)"
                ));
            }
            let r = resources.get_or_insert_with(Default::default);
            let map = if limit {
                &mut r.limits
            } else {
                &mut r.requests
            };
            map.get_or_insert_with(BTreeMap::new)
                .insert(resource.into(), Quantity(value.clone()));
        }
        let log_level = match annotations.get(LOG_LEVEL) {
            Some(l) if LOG_LEVELS.contains(&l.as_str()) => l.clone(),
            Some(l) => {
                return Err(format!(
                    "annotation {LOG_LEVEL}: {l:?} is not one of {}",
                    LOG_LEVELS.join(", ")
                ))
            }
            None => config.log_level.clone(),
        };
        let image = match annotations.get(IMAGE) {
            Some(i) if !i.trim().is_empty() => i.clone(),
            Some(_) => return Err(format!("annotation {IMAGE}: must not be empty")),
            None => config.image.clone(),
        };
        Ok(Overrides {
            image,
            log_level,
            resources,
        })
    }
}

fn sidecar_container(config: &InjectionConfig, o: &Overrides, ca_pem: &str) -> Container {
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
        env(sidecar_env::TOKEN_PATH, &format!("{TOKEN_DIR}/token")),
        env(sidecar_env::CA_PEM, ca_pem),
        env(
            sidecar_env::SNAPSHOT_PATH,
            &format!("{STATE_DIR}/snapshot.json"),
        ),
        env(sidecar_env::LOG, &o.log_level),
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
        ] {
            if !value.is_empty() {
                env.push(self::env(name, value));
            }
        }
    }
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
        args: Some(vec![
            "--listen".into(),
            format!("127.0.0.1:{}", config.proxy_port),
            "--admin".into(),
            format!("127.0.0.1:{}", config.admin_port),
            "--health".into(),
            format!("0.0.0.0:{}", config.health_port),
        ]),
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
            run_as_user: Some(65532),
            run_as_group: Some(65532),
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
        volume_mounts: Some(vec![
            VolumeMount {
                name: "reprise-token".into(),
                mount_path: TOKEN_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: "reprise-state".into(),
                mount_path: STATE_DIR.into(),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// Sends the app's plain-HTTP traffic through the sidecar, unless the app
/// already chose a proxy. Loopback stays direct.
fn add_proxy_env(c: &mut Container, proxy: &str) {
    let env = c.env.get_or_insert_with(Vec::new);
    let has = |env: &Vec<EnvVar>, n: &str| env.iter().any(|e| e.name.eq_ignore_ascii_case(n));
    if has(env, "HTTP_PROXY") {
        return;
    }
    for name in ["HTTP_PROXY", "http_proxy"] {
        env.push(self::env(name, proxy));
    }
    if !has(env, "NO_PROXY") {
        for name in ["NO_PROXY", "no_proxy"] {
            env.push(self::env(name, "localhost,127.0.0.1,::1"));
        }
    }
}

/// A Kubernetes resource quantity: a decimal number with an optional suffix.
fn is_quantity(s: &str) -> bool {
    const SUFFIXES: [&str; 14] = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    !number.is_empty()
        && number.chars().filter(|&c| c == '.').count() <= 1
        && number != "."
        && SUFFIXES.contains(&suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> InjectionConfig {
        InjectionConfig::from_yaml(
            "image: reprise-sidecar:test\ncontrollerAddress: https://reprise-controller.reprise-system.svc:15010\n\
             resources: {requests: {cpu: 50m, memory: 32Mi}}\n",
        )
        .expect("config")
    }

    fn pod(annotations: &[(&str, &str)]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "app", "annotations": annotations.iter().cloned().collect::<BTreeMap<_, _>>()},
            "spec": {"containers": [{"name": "app", "image": "app:1"}]}
        }))
        .expect("pod")
    }

    fn injected(d: Decision) -> Pod {
        match d {
            Decision::Inject(p) => *p,
            other => panic!("expected injection, got {other:?}"),
        }
    }

    fn env_of(c: &Container, name: &str) -> Option<String> {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn native_sidecar_is_the_first_init_container_with_restart_always() {
        let p = injected(decide(&pod(&[]), &config(), "CA", true));
        let spec = p.spec.expect("spec");
        let sidecar = &spec.init_containers.as_ref().expect("init")[0];
        assert_eq!(sidecar.name, SIDECAR_NAME);
        assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
        assert_eq!(env_of(sidecar, "REPRISE_CA_PEM").as_deref(), Some("CA"));
        assert_eq!(spec.containers.len(), 1, "the app stays the only container");
        let app = &spec.containers[0];
        assert_eq!(
            env_of(app, "HTTP_PROXY").as_deref(),
            Some("http://127.0.0.1:15001")
        );
        let volumes: Vec<_> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(volumes, ["reprise-token", "reprise-state"]);
        let audience = spec.volumes.as_ref().expect("volumes")[0]
            .projected
            .as_ref()
            .and_then(|p| p.sources.as_ref())
            .and_then(|s| s[0].service_account_token.as_ref())
            .and_then(|t| t.audience.clone());
        assert_eq!(audience.as_deref(), Some("reprise"));
        assert_eq!(
            p.metadata
                .annotations
                .expect("annotations")
                .get(INJECTED)
                .map(String::as_str),
            Some("native")
        );
    }

    #[test]
    fn without_native_sidecars_it_is_the_first_regular_container() {
        let p = injected(decide(&pod(&[]), &config(), "CA", false));
        let spec = p.spec.expect("spec");
        assert!(spec.init_containers.is_none());
        assert_eq!(spec.containers[0].name, SIDECAR_NAME);
        assert!(spec.containers[0].restart_policy.is_none());
    }

    #[test]
    fn injection_is_idempotent() {
        let once = injected(decide(&pod(&[]), &config(), "CA", true));
        assert!(matches!(
            decide(&once, &config(), "CA", true),
            Decision::Skip("already injected")
        ));
    }

    #[test]
    fn opt_outs_are_honoured() {
        assert!(matches!(
            decide(&pod(&[(INJECT, "false")]), &config(), "CA", true),
            Decision::Skip(_)
        ));
        let p = injected(decide(&pod(&[(PROXY_ENV, "false")]), &config(), "CA", true));
        assert_eq!(
            env_of(&p.spec.expect("spec").containers[0], "HTTP_PROXY"),
            None
        );
    }

    #[test]
    fn an_app_that_set_its_own_proxy_keeps_it() {
        let mut p = pod(&[]);
        p.spec.as_mut().expect("spec").containers[0].env =
            Some(vec![env("http_proxy", "http://corp:3128")]);
        let p = injected(decide(&p, &config(), "CA", true));
        let app = &p.spec.expect("spec").containers[0];
        assert_eq!(env_of(app, "HTTP_PROXY"), None);
        assert_eq!(
            env_of(app, "http_proxy").as_deref(),
            Some("http://corp:3128")
        );
    }

    #[test]
    fn overrides_replace_resources_and_log_level() {
        let p = injected(decide(
            &pod(&[
                (MEMORY_LIMIT, "256Mi"),
                (CPU_REQUEST, "0.2"),
                (LOG_LEVEL, "debug"),
            ]),
            &config(),
            "CA",
            true,
        ));
        let sidecar = p
            .spec
            .expect("spec")
            .init_containers
            .expect("init")
            .remove(0);
        let r = sidecar.resources.clone().expect("resources");
        assert_eq!(r.limits.expect("limits")["memory"].0, "256Mi");
        let requests = r.requests.expect("requests");
        assert_eq!(requests["cpu"].0, "0.2");
        assert_eq!(requests["memory"].0, "32Mi", "unrelated defaults are kept");
        assert_eq!(env_of(&sidecar, "REPRISE_LOG").as_deref(), Some("debug"));
    }

    #[test]
    fn a_bad_override_refuses_the_pod_naming_the_annotation() {
        match decide(&pod(&[(CPU_LIMIT, "lots")]), &config(), "CA", true) {
            Decision::Refuse(msg) => {
                assert!(msg.contains(CPU_LIMIT) && msg.contains("quantity"), "{msg}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(matches!(
            decide(&pod(&[(LOG_LEVEL, "loud")]), &config(), "CA", true),
            Decision::Refuse(_)
        ));
    }

    #[test]
    fn quantities() {
        for ok in ["1", "100m", "0.5", "64Mi", "1Gi", "2k"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "m", "1.2.3", "lots", "64MB", "-1", "."] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn otel_settings_become_standard_variables() {
        let mut c = config();
        c.otel.endpoint = "http://jaeger:4317".into();
        c.otel.protocol = "grpc".into();
        let p = injected(decide(&pod(&[]), &c, "CA", false));
        let sidecar = &p.spec.expect("spec").containers[0];
        assert_eq!(
            env_of(sidecar, "OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
            Some("http://jaeger:4317")
        );
        assert_eq!(
            env_of(sidecar, "OTEL_EXPORTER_OTLP_PROTOCOL").as_deref(),
            Some("grpc")
        );
        assert_eq!(env_of(sidecar, "OTEL_TRACES_SAMPLER"), None);
    }

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
