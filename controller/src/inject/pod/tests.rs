use k8s_openapi::api::core::v1::{PodSecurityContext, SecurityContext};
use reprise_crds::sidecar_env;

use super::*;
use crate::inject::{
    CPU_LIMIT, CPU_REQUEST, DEADLINE_ACCEPT_INCOMING, DEADLINE_PROPAGATE, DIAGNOSTICS_RETAINED,
    LOG_LEVEL, MEMORY_LIMIT,
};

/// Transparent mode: reprise-init, its rules and the checks around it.
mod transparent;

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

fn native() -> Context {
    Context {
        native: true,
        ..Context::default()
    }
}

/// Native sidecars, the API server at 10.96.0.1 and fd00:96::1.
fn cluster(transparent_by_default: bool) -> Context {
    Context {
        native: true,
        transparent_by_default,
        api_server: vec![
            "10.96.0.1".parse().expect("ip"),
            "fd00:96::1".parse().expect("ip"),
        ],
        ..Context::default()
    }
}

fn container<'a>(containers: &'a [Container], name: &str) -> &'a Container {
    containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
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
    let p = injected(decide(&pod(&[]), &config(), "CA", &native()));
    let spec = p.spec.expect("spec");
    let sidecar = &spec.init_containers.as_ref().expect("init")[0];
    assert_eq!(sidecar.name, SIDECAR_NAME);
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(env_of(sidecar, sidecar_env::CA_PEM).as_deref(), Some("CA"));
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
fn the_volumes_hold_the_files_the_sidecar_is_told_about() {
    let p = injected(decide(&pod(&[]), &config(), "CA", &native()));
    let spec = p.spec.expect("spec");
    let sidecar = &spec.init_containers.as_ref().expect("init")[0];
    let mount = |volume: &str| {
        sidecar
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume)
            .map(|m| m.mount_path.clone())
            .unwrap_or_else(|| panic!("no mount of {volume}"))
    };
    let token = spec.volumes.as_ref().expect("volumes")[0]
        .projected
        .as_ref()
        .and_then(|p| p.sources.as_ref())
        .and_then(|s| s[0].service_account_token.as_ref())
        .map(|t| t.path.clone())
        .expect("token projection");
    assert_eq!(
        env_of(sidecar, sidecar_env::TOKEN_PATH),
        Some(format!("{}/{token}", mount(TOKEN_VOLUME)))
    );
    assert_eq!(
        env_of(sidecar, sidecar_env::TOKEN_PATH).as_deref(),
        Some("/var/run/secrets/reprise/token")
    );
    let snapshot = env_of(sidecar, sidecar_env::SNAPSHOT_PATH).expect("snapshot path");
    assert_eq!(snapshot, "/var/lib/reprise/snapshot.json");
    assert!(snapshot.starts_with(&format!("{}/", mount(STATE_VOLUME))));
}

#[test]
fn without_native_sidecars_it_is_the_first_regular_container() {
    let p = injected(decide(&pod(&[]), &config(), "CA", &Context::default()));
    let spec = p.spec.expect("spec");
    assert!(spec.init_containers.is_none());
    assert_eq!(spec.containers[0].name, SIDECAR_NAME);
    assert!(spec.containers[0].restart_policy.is_none());
}

#[test]
fn injection_is_idempotent() {
    let once = injected(decide(&pod(&[]), &config(), "CA", &native()));
    assert!(matches!(
        decide(&once, &config(), "CA", &native()),
        Decision::Skip("already injected")
    ));
}

#[test]
fn opt_outs_are_honoured() {
    assert!(matches!(
        decide(&pod(&[(INJECT, "false")]), &config(), "CA", &native()),
        Decision::Skip(_)
    ));
    let p = injected(decide(
        &pod(&[(PROXY_ENV, "false")]),
        &config(),
        "CA",
        &native(),
    ));
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
    let p = injected(decide(&p, &config(), "CA", &native()));
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
        &native(),
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
    assert_eq!(env_of(&sidecar, sidecar_env::LOG).as_deref(), Some("debug"));
}

#[test]
fn diagnostics_retention_comes_from_the_annotation_else_the_config() {
    let retained = |annotations: &[(&str, &str)]| {
        let p = injected(decide(&pod(annotations), &config(), "CA", &native()));
        let sidecar = p
            .spec
            .expect("spec")
            .init_containers
            .expect("init")
            .remove(0);
        env_of(&sidecar, sidecar_env::DIAGNOSTICS_RETAINED)
    };
    assert_eq!(retained(&[]).as_deref(), Some("100"));
    assert_eq!(
        retained(&[(DIAGNOSTICS_RETAINED, "0")]).as_deref(),
        Some("0")
    );
    assert_eq!(
        retained(&[(DIAGNOSTICS_RETAINED, "1000")]).as_deref(),
        Some("1000")
    );
    for bad in ["1001", "-1", "many", ""] {
        match decide(
            &pod(&[(DIAGNOSTICS_RETAINED, bad)]),
            &config(),
            "CA",
            &native(),
        ) {
            Decision::Refuse(msg) => {
                assert!(msg.contains(DIAGNOSTICS_RETAINED), "{bad:?}: {msg}")
            }
            other => panic!("{bad:?}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn deadline_switches_come_from_the_pod_else_its_namespace_and_only_off_is_written() {
    let switches = |pod_annotations: &[(&str, &str)], namespace: &[(&str, &str)]| {
        let ctx = Context {
            namespace: (
                "shop".to_string(),
                namespace
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..native()
        };
        let d = decide(&pod(pod_annotations), &config(), "CA", &ctx);
        let sidecar = injected(d)
            .spec
            .expect("spec")
            .init_containers
            .expect("init")
            .remove(0);
        (
            env_of(&sidecar, sidecar_env::DEADLINE_PROPAGATE),
            env_of(&sidecar, sidecar_env::DEADLINE_ACCEPT_INCOMING),
        )
    };
    let off = Some("false".to_string());
    assert_eq!(switches(&[], &[]), (None, None), "on: nothing written");
    assert_eq!(
        switches(&[], &[(DEADLINE_PROPAGATE, "false")]),
        (off.clone(), None),
        "the namespace's"
    );
    assert_eq!(
        switches(
            &[(DEADLINE_PROPAGATE, "true")],
            &[
                (DEADLINE_PROPAGATE, "false"),
                (DEADLINE_ACCEPT_INCOMING, "false")
            ]
        ),
        (None, off.clone()),
        "the pod's own wins, key by key"
    );
    assert_eq!(
        switches(&[(DEADLINE_ACCEPT_INCOMING, "false")], &[]),
        (None, off)
    );
    let refused = |pod_annotations: &[(&str, &str)], namespace: &[(&str, &str)]| {
        let ctx = Context {
            namespace: (
                "shop".to_string(),
                namespace
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..native()
        };
        match decide(&pod(pod_annotations), &config(), "CA", &ctx) {
            Decision::Refuse(msg) => msg,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    let msg = refused(&[(DEADLINE_PROPAGATE, "off")], &[]);
    assert_eq!(
        msg,
        "annotation reprise.dev/deadline-propagate: \"off\" is not \"true\" or \"false\""
    );
    let msg = refused(&[], &[(DEADLINE_ACCEPT_INCOMING, "no")]);
    assert!(
        msg.starts_with("namespace shop's annotation reprise.dev/deadline-accept-incoming"),
        "{msg}"
    );
}

#[test]
fn a_bad_override_refuses_the_pod_naming_the_annotation() {
    match decide(&pod(&[(CPU_LIMIT, "lots")]), &config(), "CA", &native()) {
        Decision::Refuse(msg) => {
            assert!(msg.contains(CPU_LIMIT) && msg.contains("quantity"), "{msg}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(matches!(
        decide(&pod(&[(LOG_LEVEL, "loud")]), &config(), "CA", &native()),
        Decision::Refuse(_)
    ));
}

#[test]
fn otel_settings_become_standard_variables() {
    let mut c = config();
    c.otel.endpoint = "http://jaeger:4317".into();
    c.otel.protocol = "grpc".into();
    let p = injected(decide(&pod(&[]), &c, "CA", &Context::default()));
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
    assert_eq!(env_of(sidecar, "OTEL_EXPORTER_OTLP_COMPRESSION"), None);
    assert_eq!(env_of(sidecar, "OTEL_EXPORTER_OTLP_CERTIFICATE"), None);
}

#[test]
fn otel_tls_secrets_become_volumes_mounts_and_file_variables() {
    let mut c = config();
    c.otel.endpoint = "https://collector.observability:4317".into();
    c.otel.compression = "gzip".into();
    c.otel.tls.ca_secret = "otlp-ca".into();
    c.otel.tls.ca_key = "bundle.pem".into();
    c.otel.tls.client_secret = "otlp-client".into();
    let spec = injected(decide(&pod(&[]), &c, "CA", &Context::default()))
        .spec
        .expect("spec");
    let sidecar = &spec.containers[0];
    for (name, value) in [
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "/var/run/reprise/otlp-ca/ca.crt",
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "/var/run/reprise/otlp-client/tls.crt",
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            "/var/run/reprise/otlp-client/tls.key",
        ),
    ] {
        assert_eq!(env_of(sidecar, name).as_deref(), Some(value), "{name}");
    }
    let mounts: Vec<(&str, &str, Option<bool>)> = sidecar
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name.starts_with("reprise-otlp"))
        .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("reprise-otlp-ca", "/var/run/reprise/otlp-ca", Some(true)),
            (
                "reprise-otlp-client",
                "/var/run/reprise/otlp-client",
                Some(true)
            ),
        ]
    );
    let secrets: Vec<(String, Option<String>, Vec<String>)> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let s = v.secret.as_ref()?;
            Some((
                v.name.clone(),
                s.secret_name.clone(),
                s.items
                    .iter()
                    .flatten()
                    .map(|i| format!("{} -> {}", i.key, i.path))
                    .collect(),
            ))
        })
        .collect();
    assert_eq!(
        secrets,
        [
            (
                "reprise-otlp-ca".to_string(),
                Some("otlp-ca".to_string()),
                vec!["bundle.pem -> ca.crt".to_string()]
            ),
            (
                "reprise-otlp-client".to_string(),
                Some("otlp-client".to_string()),
                vec![
                    "tls.crt -> tls.crt".to_string(),
                    "tls.key -> tls.key".to_string()
                ]
            ),
        ]
    );
    // Tracing off: no Secret is mounted (a pod would wait for it).
    c.otel.endpoint.clear();
    let spec = injected(decide(&pod(&[]), &c, "CA", &Context::default()))
        .spec
        .expect("spec");
    assert!(spec.volumes.iter().flatten().all(|v| v.secret.is_none()));
    assert_eq!(
        env_of(&spec.containers[0], "OTEL_EXPORTER_OTLP_CERTIFICATE"),
        None
    );
}
