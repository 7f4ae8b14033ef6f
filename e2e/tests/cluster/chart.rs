//! The Helm chart installed on the real API server: CRD, RBAC (checked by
//! impersonation, and by running the controller as its own ServiceAccount),
//! the injection webhook, and `helm test` with this test as the kubelet.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reprise_e2e::cluster::{free, rand_suffix, Cluster, Proc};

const RELEASE: &str = "reprise";
const WEBHOOK: &str = "reprise-sidecar-injector";

fn helm() -> String {
    std::env::var("HELM").unwrap_or_else(|_| "helm".into())
}

/// Uninstalls the release and deletes its namespace, whatever the test did.
struct Release<'a> {
    c: &'a Cluster,
    ns: String,
}

impl Release<'_> {
    fn helm(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(helm())
            .env("KUBECONFIG", &self.c.kubeconfig)
            .args(args)
            .args(["-n", &self.ns])
            .output()
            .map_err(|e| format!("cannot run helm ({}): {e}", helm()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(text)
        }
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
fn helm_install_gives_rbac_the_webhook_injection_and_a_passing_helm_test() {
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
    c.until("the CRD to be served", Duration::from_secs(30), || {
        c.kubectl(&["explain", "retrypolicy.spec.retries.attempts"])
            .is_ok_and(|doc| doc.contains("attempts"))
    });
    let explain = c
        .kubectl(&["explain", "retrypolicy.spec"])
        .expect("explain");
    assert!(explain.contains("targetRef"), "{explain}");

    // 2. Least privilege, asked of the API server by impersonation.
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
        vec!["list", "pods", "-A"],
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
        vec!["patch", "retrypolicies.reprise.dev", "-A"],
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

    // 5. helm test, with this test acting as the kubelet for the test pod:
    //    its command runs here as its own ServiceAccount.
    let helm_test = {
        let kubeconfig = c.kubeconfig.clone();
        let ns = release.ns.clone();
        std::thread::spawn(move || {
            Command::new(helm())
                .env("KUBECONFIG", kubeconfig)
                .args(["test", RELEASE, "-n", &ns, "--timeout", "90s"])
                .output()
                .expect("helm test")
        })
    };
    let mut test_pod = String::new();
    c.until("the helm test pod", Duration::from_secs(30), || {
        test_pod = c
            .kubectl(&[
                "-n",
                &release.ns,
                "get",
                "pods",
                "-o",
                "jsonpath={.items[?(@.metadata.annotations.helm\\.sh/hook==\"test\")].metadata.name}",
            ])
            .unwrap_or_default()
            .trim()
            .to_string();
        !test_pod.is_empty()
    });
    let spec: serde_json::Value = serde_json::from_str(
        &c.kubectl(&["-n", &release.ns, "get", "pod", &test_pod, "-o", "json"])
            .expect("test pod"),
    )
    .expect("json");
    let container = &spec["spec"]["containers"][0];
    let argv: Vec<String> = container["command"]
        .as_array()
        .into_iter()
        .chain(container["args"].as_array())
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    assert!(argv[0].ends_with("reprise-controller"), "{argv:?}");
    let test_sa = format!(
        "system:serviceaccount:{}:{}",
        release.ns,
        spec["spec"]["serviceAccountName"]
            .as_str()
            .expect("serviceAccountName")
    );
    let run = Command::new(c.bin.join("reprise-controller"))
        .env("KUBECONFIG", c.kubeconfig_as(&test_sa))
        .env("POD_NAMESPACE", &release.ns)
        .args(&argv[1..])
        .output()
        .expect("run the test pod's command");
    let phase = if run.status.success() {
        "Succeeded"
    } else {
        "Failed"
    };
    c.kubectl(&[
        "-n",
        &release.ns,
        "patch",
        "pod",
        &test_pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"phase":"{phase}"}}}}"#),
    ])
    .expect("test pod status");
    let helm_out = helm_test.join().expect("helm test thread");
    assert!(
        run.status.success() && helm_out.status.success(),
        "selftest: {}\nhelm test: {}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&helm_out.stdout),
        String::from_utf8_lossy(&helm_out.stderr)
    );

    // 6. The controller down: pods are still created promptly, without the
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
