//! What injection does to a Pod: skip it (opted out, already injected, host
//! network), refuse it (an invalid override annotation), or add the sidecar,
//! its volumes and either the app containers' proxy variables or, in
//! transparent pods, `reprise-init` and its capture rules.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, ProjectedVolumeSource,
    ServiceAccountTokenProjection, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::config::InjectionConfig;
use super::container::{
    env, init_container, sidecar_container, token_file, STATE_VOLUME, TOKEN_VOLUME, XTABLES_VOLUME,
};
use super::overrides::{Capture, Overrides};
use super::{INIT_NAME, INJECT, INJECTED, PROXY_ENV, SIDECAR_NAME, TRANSPARENT};

/// How long a projected push token is valid; the kubelet refreshes it before.
const TOKEN_EXPIRATION_SECS: i64 = 3600;

/// What to do with a Pod.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Leave it as it is, for this reason.
    Skip(&'static str),
    /// Admit this mutated Pod.
    Inject(Box<Pod>),
    /// Refuse the Pod: an override annotation is invalid.
    Refuse(String),
}

/// What the webhook knows besides the Pod and the injection config.
#[derive(Debug, Default, Clone)]
pub(crate) struct Context {
    /// The API server runs native sidecars (Kubernetes 1.29+).
    pub(crate) native: bool,
    /// The Pod's namespace opted into transparent mode (the request came
    /// through the webhook entry for namespaces labelled
    /// `reprise.dev/transparent=enabled`).
    pub(crate) transparent_by_default: bool,
    /// The API server's ClusterIPs, never captured.
    pub(crate) api_server: Vec<IpAddr>,
}

/// Decides what to do with `pod`. `ctx.native` adds the sidecar as an init
/// container with `restartPolicy: Always` (Kubernetes 1.29+), so it starts
/// before and stops after the app; otherwise as the first regular container.
/// A transparent pod also gets `reprise-init` as its very first init
/// container, so the rules exist before anything else in the pod runs.
/// `ca_pem` is the CA the sidecar trusts for the push stream.
pub(crate) fn decide(pod: &Pod, config: &InjectionConfig, ca_pem: &str, ctx: &Context) -> Decision {
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
        .any(|c| c.name == SIDECAR_NAME || c.name == INIT_NAME);
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
    let capture = match Capture::from_annotations(
        &annotations,
        config,
        ctx.transparent_by_default,
        &ctx.api_server,
    ) {
        Ok(c) => c,
        Err(e) => return Decision::Refuse(e),
    };
    if capture.is_some() {
        if let Some(why) = shares_proxy_uid(spec, config.proxy_uid) {
            return Decision::Refuse(why);
        }
    }

    let mut pod = pod.clone();
    let mut spec = pod.spec.take().unwrap_or_default();
    let mut sidecar = sidecar_container(config, &overrides, ca_pem, capture.is_some());
    if ctx.native {
        sidecar.restart_policy = Some("Always".into());
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, sidecar);
    } else {
        spec.containers.insert(0, sidecar);
    }
    if let Some(c) = &capture {
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, init_container(config, &overrides, c));
    }
    // A transparent pod's traffic reaches the sidecar without a proxy setting.
    if capture.is_none() && annotations.get(PROXY_ENV).map(String::as_str) != Some("false") {
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
        name: TOKEN_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    // The audience the controller's TokenReview asks for.
                    audience: Some(reprise_crds::protocol::AUDIENCE.into()),
                    expiration_seconds: Some(TOKEN_EXPIRATION_SECS),
                    path: token_file().into(),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    volumes.push(Volume {
        name: STATE_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    if capture.is_some() {
        volumes.push(Volume {
            name: XTABLES_VOLUME.into(),
            // Holds one empty lock file.
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity("1Mi".into())),
            }),
            ..Default::default()
        });
    }
    pod.spec = Some(spec);
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            INJECTED.into(),
            if ctx.native { "native" } else { "container" }.into(),
        );
    Decision::Inject(Box::new(pod))
}

/// Why a transparent pod cannot be captured when one of its containers runs
/// as the sidecar's UID: the rules let that UID's connections out
/// untouched, so its traffic would bypass the sidecar without a word. Only
/// an explicit `runAsUser` can be seen here, not an image's `USER`.
fn shares_proxy_uid(spec: &PodSpec, uid: i64) -> Option<String> {
    let pod_uid = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
                .or(pod_uid)
                == Some(uid)
        })
        .map(|c| {
            format!(
                "annotation {TRANSPARENT}: container {:?} runs as UID {uid}, the sidecar's (proxyUid), whose connections transparent capture lets through; run it as another UID or set {TRANSPARENT}: \"false\"",
                c.name
            )
        })
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

#[cfg(test)]
mod tests {
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
}
