//! Issue 44 on the real node: `kubectl reprise` (the `kubectl-reprise`
//! binary, on PATH as kubectl finds plugins) against the release it checks.
//!
//! - `check` passes on the installed release: CRD, webhook configuration,
//!   caBundle, the webhook reached through the API server's service proxy
//!   and its certificate valid for the Service's name, the controller ready
//!   and leading, the sidecar in sync, no pod left uninjected.
//! - `diagnose` reads the web pod's sidecar `/diagnostics` through a
//!   port-forward: the recovered requests, first attempt a 503 on `api-0`.
//! - `sent` reads what the controller last sent the web pod (in sync, with
//!   its policy) through a port-forward to the controller's loopback debug
//!   page, which refuses the same request from the node.
//! - `stat` reads the policy's `status.traffic`: the recovered requests
//!   counted there once the leader has written the window.
//! - The controller scaled to 0: `check` fails with exit status 1, the
//!   probe's line naming the Service and the fix naming the scale command.
//!
//! Run alone: `--test cluster -- --ignored node::plugin:: --test-threads=1`.

use std::process::Command;
use std::time::{Duration, Instant};

use reprise_e2e::cluster::{drive, node_app_yaml, node_name, Cluster, Release, NODE_POLICY};
use serde_json::Value;

use super::{ip, name, pods, ready, web_pod};

/// `kubectl reprise ARGS` with the built `kubectl-reprise` first on PATH,
/// as a user who installed it runs it: whether it exited 0, and what it
/// printed (stdout, then stderr).
fn kubectl_reprise(c: &Cluster, args: &[&str]) -> (bool, String) {
    let path = format!(
        "{}:{}",
        c.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("kubectl")
        .env("KUBECONFIG", &c.kubeconfig)
        .env("PATH", path)
        .arg("reprise")
        .args(args)
        .output()
        .expect("kubectl");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster with its node: run e2e/test.sh"]
async fn kubectl_reprise_checks_diagnoses_and_stats_the_release() {
    node_name().expect(
        "REPRISE_E2E_NODE: this test needs the node (e2e/cluster.sh up without --api-only, then e2e/images.sh)",
    );
    let c = Cluster::bare("plugin");
    let release = Release::new(
        &c.kubeconfig,
        &format!("reprise-plugin-{}", std::process::id()),
        "reprise",
    );
    let plugin = c.bin.join("kubectl-reprise");
    assert!(
        plugin.exists(),
        "{} (cargo build --workspace --bins)",
        plugin.display()
    );
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("[plugin test {:>6.1}s] {what}", t0.elapsed().as_secs_f64());

    step("1. helm install --wait (one controller replica), an injected app and its policy");
    let out = release
        .install_on_node(&["controller.replicas=1"], "240s")
        .unwrap_or_else(|e| {
            let pods = release.kubectl(&["get", "pods", "-o", "wide"]);
            panic!("helm install: {e}\npods: {pods:?}")
        });
    assert!(out.contains("STATUS: deployed"), "{out}");
    c.kubectl(&["label", "namespace", &c.ns, "reprise.dev/inject=enabled"])
        .expect("label");
    c.until_injecting(Duration::from_secs(60));
    c.apply(&node_app_yaml("api-0", 50)).expect("app");
    c.apply(NODE_POLICY).expect("policy");
    c.until("three Ready api pods", Duration::from_secs(120), || {
        pods(&c, &c.ns, "app=api")
            .iter()
            .filter(|p| ready(p))
            .count()
            == 3
    });
    let web = web_pod(&c);
    let web_name = name(&web);
    c.until("In-Sync 1/1", Duration::from_secs(60), || {
        c.policy_field("reads", "{.status.inSync}") == "1/1"
    });

    step("2. kubectl reprise check on the installed release");
    // Other tests' namespaces may still be terminating: the first clean
    // report within a minute counts.
    let mut report = String::new();
    c.until(
        "kubectl reprise check passes",
        Duration::from_secs(60),
        || {
            let (ok, out) = kubectl_reprise(&c, &["check", "--reprise-namespace", &release.ns]);
            report = out;
            ok
        },
    );
    let svc = format!("{}/reprise-controller", release.ns);
    for line in [
        "✔ CRD retrypolicies.reprise.dev is installed and Established".to_string(),
        "✔ it serves reprise.dev/v1alpha1 with every field this plugin knows".into(),
        format!("✔ the API server reaches the webhook through Service {svc}"),
        format!(
            "✔ its serving certificate chains to the caBundle and is valid for reprise-controller.{}.svc",
            release.ns
        ),
        format!("✔ controller Deployment {svc}: 1/1 replicas ready"),
        "Status check results are ✔".into(),
    ] {
        assert!(report.contains(&line), "{line}\n{report}");
    }
    step(&format!("   kubectl reprise check:\n{report}"));
    // The binary itself, with kubectl's flags instead of the environment.
    let direct = Command::new(&plugin)
        .env_remove("KUBECONFIG")
        .args(["--kubeconfig", &c.kubeconfig, "check"])
        .args(["--reprise-namespace", &release.ns])
        .output()
        .expect("kubectl-reprise");
    assert!(
        direct.status.success(),
        "{}{}",
        String::from_utf8_lossy(&direct.stdout),
        String::from_utf8_lossy(&direct.stderr)
    );

    step("3. traffic through the sidecar, then kubectl reprise diagnose");
    let web_app = std::net::SocketAddr::new(ip(&web).parse().expect("pod IP"), 8080);
    let r = drive(web_app, "http://api/", 300, 0).await.expect("drive");
    assert_eq!(r["failed"], 0, "{r}");
    // By selector, as kubectl's verbs take pods: a List with the web pod's item.
    let (ok, out) = kubectl_reprise(
        &c,
        &["diagnose", "-l", "app=web", "-n", &c.ns, "-o", "json"],
    );
    assert!(ok, "kubectl reprise diagnose -l app=web -o json:\n{out}");
    let list: Value = serde_json::from_str(&out).expect("diagnose -o json is JSON");
    assert_eq!(list["kind"], "List", "{list}");
    let diagnostics = list["items"]
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .find(|i| i["metadata"]["name"] == web_name.as_str())
        })
        .cloned()
        .unwrap_or_else(|| panic!("an item for {web_name}: {list}"));
    assert_eq!(diagnostics["kind"], "SidecarDiagnostics", "{diagnostics}");
    let requests = diagnostics["requests"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let recovered: Vec<&Value> = requests
        .iter()
        .filter(|r| r["outcome"] == "recovered")
        .collect();
    assert!(!recovered.is_empty(), "recovered requests: {diagnostics}");
    for r in &recovered {
        let first = &r["attempts"][0];
        assert_eq!(first["error"], "upstream_status_503", "{r}");
        assert!(
            first["endpoint"]
                .as_str()
                .is_some_and(|e| e.contains("api-0")),
            "the flaky pod first: {r}"
        );
        let last = r["attempts"].as_array().and_then(|a| a.last()).cloned();
        assert!(
            last.is_some_and(|a| a["error"].is_null()),
            "the last attempt succeeded: {r}"
        );
    }
    let (ok, table) = kubectl_reprise(
        &c,
        &[
            "diagnose",
            &web_name,
            "-n",
            &c.ns,
            "--outcome",
            "recovered",
            "--limit",
            "3",
        ],
    );
    assert!(ok, "{table}");
    let rows = table
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == "recovered"))
        .count();
    assert!(
        (1..=3).contains(&rows),
        "--limit 3 --outcome recovered:\n{table}"
    );
    assert!(table.contains("upstream_status_503"), "{table}");
    step(&format!(
        "   kubectl reprise diagnose --outcome recovered --limit 3:\n{table}"
    ));

    step("3b. kubectl reprise sent: what the controller last sent the web pod");
    let web_ref = format!("pod/{web_name}");
    let sent_args = [
        "sent",
        web_ref.as_str(),
        "-n",
        c.ns.as_str(),
        "--reprise-namespace",
        release.ns.as_str(),
    ];
    let (ok, out) = kubectl_reprise(&c, &[&sent_args[..], &["-o", "json"]].concat());
    assert!(ok, "kubectl reprise sent -o json:\n{out}");
    let list: Value = serde_json::from_str(&out).expect("sent -o json is JSON");
    assert_eq!(list["kind"], "List", "{list}");
    let sent = list["items"][0].clone();
    assert_eq!(sent["kind"], "SidecarPush", "{sent}");
    assert_eq!(sent["inSync"], true, "{sent}");
    assert_eq!(sent["sent"]["version"], sent["acked"], "{sent}");
    let reads = format!("{}/reads", c.ns);
    assert!(
        sent["sent"]["policies"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["policy"] == reads.as_str())),
        "{sent}"
    );
    assert!(
        ["whole", "delta", "resumed"].contains(&sent["sent"]["kind"].as_str().unwrap_or("")),
        "{sent}"
    );
    // The controller's namespace found as check finds it, from the webhook
    // configuration: no --reprise-namespace.
    let (ok, text) = kubectl_reprise(&c, &sent_args[..4]);
    assert!(ok && text.contains(": in sync, through "), "{text}");
    let (ok, versions) = kubectl_reprise(&c, &["version", "-o", "json"]);
    assert!(ok, "{versions}");
    let versions: Value = serde_json::from_str(&versions).expect("version -o json is JSON");
    assert_eq!(
        versions["controller"]["namespace"],
        release.ns.as_str(),
        "{versions}"
    );
    assert_eq!(versions["controller"]["images"][0]["pods"], 1, "{versions}");
    // The web pod's sidecar (a native sidecar: an init container) is counted
    // under its image.
    let sidecar_image = web["spec"]["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "reprise-sidecar"))
        .map(|c| c["image"].clone())
        .unwrap_or_else(|| panic!("the web pod's sidecar: {web}"));
    assert!(
        versions["sidecars"]["images"].as_array().is_some_and(|i| i
            .iter()
            .any(|i| i["image"] == sidecar_image && i["pods"].as_u64().unwrap_or(0) >= 1)),
        "the web pod's sidecar image {sidecar_image}: {versions}"
    );
    // The page answers only on the controller's loopback: from the node, refused.
    let controller = pods(&c, &release.ns, "app.kubernetes.io/component=controller");
    let addr = std::net::SocketAddr::new(
        ip(controller.first().expect("a controller pod"))
            .parse()
            .expect("pod IP"),
        15020,
    );
    let status = {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .expect("the metrics port");
        conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
        conn.write_all(b"GET /debug/sidecars HTTP/1.0\r\n\r\n")
            .expect("request");
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        answer
    };
    assert_eq!(
        status.split_whitespace().nth(1),
        Some("403"),
        "from the node: {status}"
    );
    step(&format!("   kubectl reprise sent:\n{text}"));

    step("4. kubectl reprise stat, once the leader has written status.traffic");
    let mut traffic = Value::Null;
    c.until(
        "status.traffic with the recovered requests",
        Duration::from_secs(180),
        || {
            let (ok, out) = kubectl_reprise(&c, &["stat", "rp/reads", "-n", &c.ns, "-o", "json"]);
            traffic = serde_json::from_str::<Value>(&out)
                .map(|v| v["items"][0]["status"]["traffic"].clone())
                .unwrap_or(Value::Null);
            ok && traffic["recovered"].as_i64().unwrap_or(0) > 0
        },
    );
    assert!(
        traffic["requests"].as_i64().unwrap_or(0) >= 300,
        "{traffic}"
    );
    let (ok, table) = kubectl_reprise(&c, &["stat", "-n", &c.ns]);
    assert!(ok, "{table}");
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("reads "))
        .unwrap_or_else(|| panic!("a row for reads:\n{table}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[1], "api:80", "{table}");
    assert_eq!(
        row[6],
        traffic["recovered"].to_string(),
        "RECOVERED:\n{table}"
    );
    step(&format!("   kubectl reprise stat:\n{table}"));

    step("5. the controller scaled to 0: check fails and names the fix");
    release
        .kubectl(&["scale", "deployment", "reprise-controller", "--replicas=0"])
        .expect("scale to 0");
    c.until("no controller pod", Duration::from_secs(90), || {
        pods(&c, &release.ns, "app.kubernetes.io/component=controller").is_empty()
    });
    let (ok, report) = kubectl_reprise(&c, &["check", "--reprise-namespace", &release.ns]);
    assert!(!ok, "check must exit non-zero:\n{report}");
    let probe = format!("✘ the API server cannot reach the webhook through Service {svc}");
    let at = report
        .find(&probe)
        .unwrap_or_else(|| panic!("{probe}\n{report}"));
    let fix = report[at..].lines().nth(1).unwrap_or_default();
    assert!(
        fix.starts_with("    fix: ")
            && fix.contains(&format!(
                "kubectl -n {} scale deployment/reprise-controller --replicas=2",
                release.ns
            )),
        "the fix follows the probe's line:\n{report}"
    );
    assert!(
        report.contains(&format!("✘ controller Deployment {svc} is scaled to 0")),
        "{report}"
    );
    assert!(report.contains("Status check results are ✘"), "{report}");
    step(&format!(
        "   kubectl reprise check with no controller:\n{report}"
    ));
    step("done");
}
