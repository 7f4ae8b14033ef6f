use k8s_openapi::api::core::v1::{PodSecurityContext, SecurityContext};
use reprise_crds::sidecar_env;

use super::*;
use crate::inject::{CPU_LIMIT, CPU_REQUEST, LOG_LEVEL, MEMORY_LIMIT};

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
fn a_transparent_pod_gets_reprise_init_first_and_no_proxy_variables() {
    let mut p = pod(&[(TRANSPARENT, "true")]);
    let spec = p.spec.as_mut().expect("spec");
    spec.init_containers = Some(vec![Container {
        name: "migrate".into(),
        ..Default::default()
    }]);
    let p = injected(decide(&p, &config(), "CA", &cluster(false)));
    let spec = p.spec.expect("spec");
    let init = spec.init_containers.as_deref().expect("init");
    let names: Vec<_> = init.iter().map(|c| c.name.as_str()).collect();
    // The rules exist before the sidecar, and the sidecar runs before the app's own init containers.
    assert_eq!(names, [INIT_NAME, SIDECAR_NAME, "migrate"]);
    let rules = &init[0];
    assert_eq!(rules.image.as_deref(), Some("reprise-sidecar:test"));
    assert_eq!(rules.restart_policy, None, "runs once and exits");
    assert_eq!(
        rules.args.as_deref().expect("args"),
        [
            "iptables",
            "--redirect-port",
            "15006",
            "--proxy-uid",
            "65532",
            "--exclude-ports",
            "53",
            "--exclude-cidrs",
            "10.96.0.1/32,fd00:96::1/128",
        ]
    );
    let sc = rules.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.run_as_user, Some(0));
    assert_eq!(sc.run_as_non_root, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.privileged, Some(false));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(
        caps.add.as_deref(),
        Some(&["NET_ADMIN".to_string(), "NET_RAW".to_string()][..])
    );
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    // iptables-legacy's lock file needs a writable /run.
    let run = rules.volume_mounts.as_deref().expect("mounts");
    assert_eq!(run.len(), 1);
    assert_eq!(
        (run[0].name.as_str(), run[0].mount_path.as_str()),
        (XTABLES_VOLUME, "/run")
    );
    assert!(spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.name == XTABLES_VOLUME && v.empty_dir.is_some()));
    let memory = &rules
        .resources
        .as_ref()
        .expect("resources")
        .limits
        .as_ref()
        .expect("limits")["memory"];
    assert_eq!(memory.0, "64Mi");

    let sidecar = &init[1];
    let args = sidecar.args.as_deref().expect("args");
    let at = args
        .iter()
        .position(|a| a == "--transparent")
        .expect("--transparent");
    assert_eq!(args[at + 1], "127.0.0.1:15006");
    assert_eq!(
        sidecar
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_user),
        Some(65532),
        "the UID the rules exempt"
    );
    let app = container(&spec.containers, "app");
    for name in ["HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"] {
        assert_eq!(env_of(app, name), None, "{name} in a transparent pod");
    }
}

#[test]
fn a_plain_pod_has_no_init_container_and_the_proxy_variables() {
    let p = injected(decide(&pod(&[]), &config(), "CA", &cluster(false)));
    let spec = p.spec.expect("spec");
    let init = spec.init_containers.as_deref().expect("init");
    assert_eq!(init.len(), 1);
    assert_eq!(init[0].name, SIDECAR_NAME);
    assert!(!init[0].args.iter().flatten().any(|a| a == "--transparent"));
    assert!(!spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.name == XTABLES_VOLUME));
    assert!(env_of(&spec.containers[0], "HTTP_PROXY").is_some());
}

#[test]
fn a_transparent_namespace_captures_unless_the_pod_opts_out() {
    let p = injected(decide(&pod(&[]), &config(), "CA", &cluster(true)));
    let spec = p.spec.expect("spec");
    assert_eq!(spec.init_containers.expect("init")[0].name, INIT_NAME);
    assert_eq!(env_of(&spec.containers[0], "HTTP_PROXY"), None);

    let p = injected(decide(
        &pod(&[(TRANSPARENT, "false")]),
        &config(),
        "CA",
        &cluster(true),
    ));
    let spec = p.spec.expect("spec");
    assert_eq!(spec.init_containers.expect("init")[0].name, SIDECAR_NAME);
    assert!(env_of(&spec.containers[0], "HTTP_PROXY").is_some());
}

#[test]
fn annotations_shape_the_rules() {
    let p = injected(decide(
        &pod(&[
            (TRANSPARENT, "true"),
            (crate::inject::INCLUDE_OUTBOUND_PORTS, "80,8080"),
            (crate::inject::EXCLUDE_OUTBOUND_PORTS, "5432"),
            (crate::inject::EXCLUDE_OUTBOUND_CIDRS, "192.0.2.0/24"),
        ]),
        &config(),
        "CA",
        &native(),
    ));
    let init = p.spec.expect("spec").init_containers.expect("init");
    assert_eq!(
        init[0].args.as_deref().expect("args")[5..],
        [
            "--include-ports",
            "80,8080",
            "--exclude-ports",
            "53,5432",
            "--exclude-cidrs",
            "192.0.2.0/24",
        ]
    );
}

#[test]
fn config_values_reach_the_rules_and_the_sidecar() {
    let mut c = config();
    c.redirect_port = 15106;
    c.proxy_uid = 1337;
    c.transparent.exclude_outbound_ports = vec![];
    let p = injected(decide(&pod(&[(TRANSPARENT, "true")]), &c, "CA", &native()));
    let init = p.spec.expect("spec").init_containers.expect("init");
    assert_eq!(
        init[0].args.as_deref().expect("args"),
        [
            "iptables",
            "--redirect-port",
            "15106",
            "--proxy-uid",
            "1337"
        ],
        "no exclusion flags when nothing is excluded"
    );
    let sidecar = &init[1];
    assert!(sidecar
        .args
        .iter()
        .flatten()
        .any(|a| a == "127.0.0.1:15106"));
    assert_eq!(
        sidecar
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_user),
        Some(1337)
    );
}

#[test]
fn without_native_sidecars_reprise_init_is_the_only_init_container() {
    let p = injected(decide(
        &pod(&[(TRANSPARENT, "true")]),
        &config(),
        "CA",
        &Context::default(),
    ));
    let spec = p.spec.expect("spec");
    let init = spec.init_containers.expect("init");
    assert_eq!(init.len(), 1);
    assert_eq!(init[0].name, INIT_NAME);
    assert_eq!(spec.containers[0].name, SIDECAR_NAME);
}

#[test]
fn an_app_running_as_the_sidecars_uid_is_refused_in_transparent_mode() {
    let mut p = pod(&[(TRANSPARENT, "true")]);
    p.spec.as_mut().expect("spec").security_context = Some(PodSecurityContext {
        run_as_user: Some(65532),
        ..Default::default()
    });
    match decide(&p, &config(), "CA", &native()) {
        Decision::Refuse(msg) => assert!(
            msg.contains(TRANSPARENT) && msg.contains("\"app\"") && msg.contains("65532"),
            "{msg}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A container's own runAsUser wins over the pod's.
    p.spec.as_mut().expect("spec").containers[0].security_context = Some(SecurityContext {
        run_as_user: Some(1000),
        ..Default::default()
    });
    assert!(matches!(
        decide(&p, &config(), "CA", &native()),
        Decision::Inject(_)
    ));
    // Not transparent: no rules, no conflict.
    let mut p = pod(&[]);
    p.spec.as_mut().expect("spec").containers[0].security_context = Some(SecurityContext {
        run_as_user: Some(65532),
        ..Default::default()
    });
    assert!(matches!(
        decide(&p, &config(), "CA", &native()),
        Decision::Inject(_)
    ));
}

#[test]
fn a_bad_transparent_annotation_refuses_the_pod() {
    match decide(
        &pod(&[(crate::inject::EXCLUDE_OUTBOUND_PORTS, "db")]),
        &config(),
        "CA",
        &cluster(true),
    ) {
        Decision::Refuse(msg) => assert!(
            msg.contains("reprise.dev/exclude-outbound-ports") && msg.contains("port number"),
            "{msg}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_transparent_pod_is_injected_once() {
    let once = injected(decide(&pod(&[]), &config(), "CA", &cluster(true)));
    // Even stripped of the annotation and the sidecar, reprise-init marks it.
    let mut again = once.clone();
    again.metadata.annotations = None;
    if let Some(init) = again.spec.as_mut().and_then(|s| s.init_containers.as_mut()) {
        init.retain(|c| c.name != SIDECAR_NAME);
    }
    assert!(matches!(
        decide(&again, &config(), "CA", &cluster(true)),
        Decision::Skip("already injected")
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
}
