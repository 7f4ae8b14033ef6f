//! The Helm chart installed on the real API server with the controller out
//! of cluster: CRD, RBAC (checked by impersonation, and by running the
//! controller as its own ServiceAccount), the injection webhook's decisions
//! (opt-outs, a refused override, transparent pods by annotation and by
//! namespace label, the controller down). `helm test` and the
//! chart's pods run for real on the node in `node.rs`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reprise_e2e::cluster::{free, helm_in, rand_suffix, Cluster, Proc};

const RELEASE: &str = "reprise";
const WEBHOOK: &str = "reprise-sidecar-injector";

/// Uninstalls the release and deletes its namespace, whatever the test did.
struct Release<'a> {
    c: &'a Cluster,
    ns: String,
}

impl Release<'_> {
    fn helm(&self, args: &[&str]) -> Result<String, String> {
        helm_in(&self.c.kubeconfig, &self.ns, args)
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = self.helm(&["uninstall", RELEASE, "--wait=false"]);
        let _ = self.c.kubectl(&[
            "-n",
            &self.ns,
            "delete",
            "pods",
            "--all",
            "--grace-period=0",
            "--force",
        ]);
        let _ = self
            .c
            .kubectl(&["delete", "namespace", &self.ns, "--wait=false"]);
    }
}

fn chart_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/reprise"))
}

#[test]
#[ignore = "needs the e2e cluster: run e2e/test.sh"]
fn helm_install_gives_rbac_and_the_webhooks_injection_decisions() {
    let c = Cluster::bare("chart");
    let release = Release {
        c: &c,
        ns: format!("reprise-system-{}", std::process::id()),
    };
    let webhook_addr = free();

    // 1. helm install: CRDs, RBAC, webhook configuration.
    let out = release
        .helm(&[
            "install",
            RELEASE,
            chart_dir().to_str().expect("path"),
            "--create-namespace",
            "--set",
            &format!("webhook.url=https://{webhook_addr}/inject"),
            "--timeout",
            "60s",
        ])
        .expect("helm install");
    assert!(out.contains("STATUS: deployed"), "{out}");
    // This test runs the controller out of cluster (webhook.url); on a
    // cluster with a node, keep the chart's own replicas from starting.
    c.kubectl(&[
        "-n",
        &release.ns,
        "scale",
        "deployment",
        "reprise-controller",
        "--replicas=0",
    ])
    .expect("scale the in-cluster controller to 0");
    c.until("the CRD to be served", Duration::from_secs(30), || {
        c.kubectl(&["explain", "retrypolicy.spec.retries.attempts"])
            .is_ok_and(|doc| doc.contains("attempts"))
    });
    let explain = c
        .kubectl(&["explain", "retrypolicy.spec"])
        .expect("explain");
    assert!(explain.contains("targetRef"), "{explain}");

    // 2. Least privilege, asked of the API server by impersonation.
    // `kubectl auth can-i` finds a resource's group through discovery: on a
    // cluster without Gateway API's CRDs it asks about an unknown resource
    // and answers no. Installed as the docs test installs them (the
    // experimental channel holds every standard kind), so the order of the
    // tests does not matter.
    c.gateway_api("experimental");
    let sa = format!("system:serviceaccount:{}:reprise-controller", release.ns);
    let can = |args: &[&str]| {
        let mut a = vec!["auth", "can-i", "--as", &sa];
        a.extend_from_slice(args);
        // can-i exits 1 with "no" on stdout.
        match c.kubectl(&a) {
            Ok(out) => out.trim() == "yes",
            Err(_) => false,
        }
    };
    for allowed in [
        vec!["create", "tokenreviews.authentication.k8s.io"],
        vec!["watch", "endpointslices.discovery.k8s.io", "-A"],
        vec!["get", "pods", "-A"],
        vec!["watch", "namespaces"],
        vec!["watch", "httproutes.gateway.networking.k8s.io", "-A"],
        vec!["watch", "grpcroutes.gateway.networking.k8s.io", "-A"],
        vec![
            "patch",
            "httproutes.gateway.networking.k8s.io",
            "--subresource=status",
            "-A",
        ],
        vec![
            "watch",
            "xbackendtrafficpolicies.gateway.networking.x-k8s.io",
            "-A",
        ],
        vec![
            "patch",
            "retrypolicies.reprise.dev",
            "--subresource=status",
            "-A",
        ],
        vec!["patch", &format!("mutatingwebhookconfigurations/{WEBHOOK}")],
        vec!["update", "leases/reprise-controller", "-n", &release.ns],
        vec!["get", "secrets/reprise-tls", "-n", &release.ns],
    ] {
        assert!(
            can(&allowed),
            "the controller should be allowed to {allowed:?}"
        );
    }
    for refused in [
        vec!["list", "secrets", "-A"],
        vec!["get", "secrets/other", "-n", &release.ns],
        vec!["delete", "pods", "-A"],
        // Read one by one (a connecting sidecar's), never listed or watched.
        vec!["list", "pods", "-A"],
        vec!["watch", "pods", "-A"],
        vec!["patch", "retrypolicies.reprise.dev", "-A"],
        vec!["patch", "httproutes.gateway.networking.k8s.io", "-A"],
        vec!["patch", "namespaces"],
        vec!["patch", "mutatingwebhookconfigurations/someone-elses"],
        vec!["create", "clusterrolebindings"],
        vec!["update", "leases/other", "-n", &release.ns],
    ] {
        assert!(
            !can(&refused),
            "the controller must not be allowed to {refused:?}"
        );
    }

    // 3. The controller, run out of cluster as its own ServiceAccount, with
    //    the injection config the chart rendered.
    let injection = c
        .kubectl(&[
            "-n",
            &release.ns,
            "get",
            "configmap",
            "reprise-injection",
            "-o",
            "jsonpath={.data.injection\\.yaml}",
        ])
        .expect("injection ConfigMap");
    let injection_path = c.work.join("injection.yaml");
    std::fs::write(&injection_path, injection).expect("write");
    let start_controller = || {
        let log = std::fs::File::create(c.work.join(format!("controller-{}.log", rand_suffix())))
            .expect("log");
        Proc(
            Command::new(c.bin.join("reprise-controller"))
                .env("KUBECONFIG", c.kubeconfig_as(&sa))
                .args(["run", "--leader-election", "--identity", "e2e-controller"])
                .args(["--namespace", &release.ns])
                .args(["--push-addr", &free().to_string()])
                .args(["--metrics-addr", &free().to_string()])
                .args(["--webhook-addr", &webhook_addr.to_string()])
                .args(["--injection-config", injection_path.to_str().expect("path")])
                .args(["--tls-secret", "reprise-tls"])
                .args(["--webhook-configuration", WEBHOOK])
                .args(["--tls-san", "127.0.0.1", "--tls-san", "localhost"])
                .stdout(log)
                .stderr(Stdio::null())
                .spawn()
                .expect("start reprise-controller"),
        )
    };
    let controller = start_controller();
    c.until("the webhook's caBundle", Duration::from_secs(60), || {
        c.kubectl(&[
            "get",
            "mutatingwebhookconfiguration",
            WEBHOOK,
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ])
        .is_ok_and(|b| !b.trim().is_empty())
    });

    // 4. Injection in an opted-in namespace, through the API server's real
    //    admission chain over TLS.
    c.kubectl(&["label", "namespace", &c.ns, "reprise.dev/inject=enabled"])
        .expect("label");
    let pod_yaml = |name: &str, extra_meta: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}{extra_meta} }}\nspec:\n  nodeName: local\n  containers: [{{ name: app, image: app:1 }}]\n"
        )
    };
    let field = |pod: &str, path: &str| {
        c.kubectl(&[
            "-n",
            &c.ns,
            "get",
            "pod",
            pod,
            "-o",
            &format!("jsonpath={path}"),
        ])
        .unwrap_or_default()
    };
    c.apply(&pod_yaml("injected", "")).expect("pod");
    assert_eq!(
        field("injected", "{.spec.initContainers[0].name}"),
        "reprise-sidecar"
    );
    assert_eq!(
        field("injected", "{.spec.initContainers[0].restartPolicy}"),
        "Always",
        "a native sidecar on Kubernetes >= 1.29"
    );
    assert_eq!(
        field(
            "injected",
            "{.spec.containers[0].env[?(@.name==\"HTTP_PROXY\")].value}"
        ),
        "http://127.0.0.1:15001"
    );
    assert!(
        field(
            "injected",
            "{.spec.initContainers[0].env[?(@.name==\"REPRISE_CA_PEM\")].value}"
        )
        .contains("BEGIN CERTIFICATE"),
        "the sidecar trusts the controller's CA"
    );
    assert_eq!(
        field("injected", "{.spec.volumes[?(@.name==\"reprise-token\")].projected.sources[0].serviceAccountToken.audience}"),
        "reprise"
    );

    c.apply(&pod_yaml(
        "opted-out",
        ", annotations: { reprise.dev/inject: \"false\" }",
    ))
    .expect("pod");
    assert_eq!(field("opted-out", "{.spec.initContainers}"), "");
    c.apply(&pod_yaml(
        "label-opted-out",
        ", labels: { reprise.dev/inject: disabled }",
    ))
    .expect("pod");
    assert_eq!(field("label-opted-out", "{.spec.initContainers}"), "");

    let refused = c
        .apply(&pod_yaml(
            "bad-override",
            ", annotations: { reprise.dev/sidecar-memory-limit: lots }",
        ))
        .expect_err("a bad override annotation is refused");
    assert!(
        refused.contains("reprise.dev/sidecar-memory-limit") && refused.contains("quantity"),
        "{refused}"
    );

    // 4b. Transparent mode through the real admission chain: by annotation
    //     (entry /inject), and by the namespace label (entry
    //     /inject/transparent, chosen by the API server's selectors).
    let api_ip = c
        .kubectl(&[
            "-n",
            "default",
            "get",
            "service",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .expect("the kubernetes Service");
    let init_args = |pod: &str| field(pod, "{.spec.initContainers[0].args}");
    // The controller's Service cache may still be listing: the first pods
    // could miss the API server's address.
    let mut transparent = String::new();
    c.until(
        "a transparent pod excluding the API server's ClusterIP",
        Duration::from_secs(30),
        || {
            transparent = format!("transparent-{}", rand_suffix() % 100_000);
            c.apply(&pod_yaml(
                &transparent,
                ", annotations: { reprise.dev/transparent: \"true\", reprise.dev/exclude-outbound-ports: \"5432\" }",
            ))
            .is_ok()
                && init_args(&transparent).contains(&format!("{api_ip}/32"))
        },
    );
    assert_eq!(
        field(&transparent, "{.spec.initContainers[*].name}"),
        "reprise-init reprise-sidecar",
        "the rules before the sidecar"
    );
    let args: Vec<String> = serde_json::from_str(&init_args(&transparent)).expect("args");
    assert_eq!(
        args,
        [
            "iptables",
            "--redirect-port",
            "15006",
            "--proxy-uid",
            "65532",
            "--exclude-ports",
            "53,5432",
            "--exclude-cidrs",
            &format!("{api_ip}/32"),
        ]
    );
    assert_eq!(
        field(
            &transparent,
            "{.spec.initContainers[0].securityContext.capabilities}"
        ),
        r#"{"add":["NET_ADMIN","NET_RAW"],"drop":["ALL"]}"#
    );
    assert!(
        field(&transparent, "{.spec.initContainers[1].args}")
            .contains("\"--transparent\",\"127.0.0.1:15006\""),
        "the sidecar's transparent listener"
    );
    assert_eq!(
        field(&transparent, "{.spec.containers[0].env}"),
        "",
        "no HTTP_PROXY in a transparent pod"
    );
    c.kubectl(&[
        "label",
        "namespace",
        &c.ns,
        "reprise.dev/transparent=enabled",
    ])
    .expect("label transparent");
    c.apply(&pod_yaml("by-namespace", "")).expect("pod");
    assert_eq!(
        field("by-namespace", "{.spec.initContainers[*].name}"),
        "reprise-init reprise-sidecar",
        "transparent by the namespace label (the /inject/transparent entry)"
    );
    c.apply(&pod_yaml(
        "namespace-opt-out",
        ", annotations: { reprise.dev/transparent: \"false\" }",
    ))
    .expect("pod");
    assert_eq!(
        field("namespace-opt-out", "{.spec.initContainers[*].name}"),
        "reprise-sidecar"
    );
    assert_eq!(
        field(
            "namespace-opt-out",
            "{.spec.containers[0].env[?(@.name==\"HTTP_PROXY\")].value}"
        ),
        "http://127.0.0.1:15001"
    );
    let refused = c
        .apply(&pod_yaml(
            "bad-cidr",
            ", annotations: { reprise.dev/exclude-outbound-cidrs: \"10.0.0.0/33\" }",
        ))
        .expect_err("a bad CIDR is refused");
    assert!(
        refused.contains("reprise.dev/exclude-outbound-cidrs") && refused.contains("prefix length"),
        "{refused}"
    );
    c.kubectl(&["label", "namespace", &c.ns, "reprise.dev/transparent-"])
        .expect("unlabel transparent");

    // 5. The controller down: pods are still created promptly, without the
    //    sidecar (failurePolicy Ignore), never blocked.
    drop(controller);
    let start = Instant::now();
    c.apply(&pod_yaml("while-down", ""))
        .expect("pod created while the webhook is down");
    assert!(
        start.elapsed() < Duration::from_secs(7),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(field("while-down", "{.spec.initContainers}"), "");

    // And the namespace selector: no label, no injection.
    let _controller = start_controller();
    c.until(
        "the restarted webhook to inject",
        Duration::from_secs(30),
        || {
            let name = format!("after-restart-{}", rand_suffix() % 100_000);
            c.apply(&pod_yaml(&name, "")).is_ok()
                && field(&name, "{.spec.initContainers[0].name}") == "reprise-sidecar"
        },
    );
    c.kubectl(&["label", "namespace", &c.ns, "reprise.dev/inject-"])
        .expect("unlabel");
    c.apply(&pod_yaml("not-opted-in", "")).expect("pod");
    assert_eq!(field("not-opted-in", "{.spec.initContainers}"), "");
}
