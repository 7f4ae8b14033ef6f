//! Transparent mode: reprise-init first, the rules its arguments carry, and
//! the pods refused for it.

use super::*;

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
