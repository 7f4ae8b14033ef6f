//! Issue 54 on the real node: short-lived pods are counted.
//!
//! - A pod that makes its calls and exits within 5 s (the test app's
//!   one-shot mode: 100 GETs to `api` through its sidecar, after the
//!   sidecar's `/ready`) is counted in its policy's `status.traffic`
//!   (requests and recovered): its sidecar sends a final report when the
//!   kubelet stops it, within the pod's termination grace. Status is
//!   written at most once a minute, so this waits over 70 s.
//! - A rollout of the client Deployment right after it made its calls (the
//!   old pod's last seconds, within one report interval) loses none of
//!   them: the old pod's sidecar reports them as it stops.
//!
//! Run alone: `--test cluster -- --ignored node::short_lived:: --test-threads=1`.

use std::time::{Duration, Instant};

use reprise_e2e::cluster::{drive, node_app_yaml, node_name, Cluster, Release, NODE_POLICY};
use serde_json::Value;

use super::{ip, json, pods, ready, web_pod};

/// Pod `oneshot`: selected by the policy (`app: web`), it waits for its
/// sidecar, makes `n` GETs to `api` and exits.
fn oneshot_yaml(n: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{ name: oneshot, labels: {{ app: web, role: oneshot }} }}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 10
  containers:
    - name: app
      image: reprise.local/e2e-app:dev
      imagePullPolicy: Never
      env:
        - {{ name: DRIVE, value: "url=http%3A%2F%2Fapi%2F&n={n}" }}
        - {{ name: READY_ADDR, value: "127.0.0.1:15000" }}
      resources: {{ requests: {{ cpu: 10m, memory: 16Mi }}, limits: {{ memory: 64Mi }} }}
      securityContext: {{ runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{ drop: [ALL] }}, seccompProfile: {{ type: RuntimeDefault }} }}
"#
    )
}

/// Seconds from `from` to `to`, as the kubelet writes them
/// (`2026-12-07T16:00:01Z`).
fn seconds_between(from: &str, to: &str) -> f64 {
    let at = |t: &str| -> i64 {
        let n = |range: std::ops::Range<usize>| -> i64 {
            t.get(range)
                .and_then(|d| d.parse().ok())
                .expect("a timestamp")
        };
        let (y, m, d) = (n(0..4), n(5..7), n(8..10));
        // Days from the civil date (Howard Hinnant's algorithm).
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)
    };
    (at(to) - at(from)) as f64
}

/// `status.traffic.FIELD` of policy `reads`, as a number (0 when absent).
fn traffic(c: &Cluster, field: &str) -> u64 {
    c.policy_field("reads", &format!("{{.status.traffic.{field}}}"))
        .parse()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster with its node: run e2e/test.sh"]
async fn a_pod_that_lives_less_than_a_report_interval_is_counted() {
    node_name().expect(
        "REPRISE_E2E_NODE: this test needs the node (e2e/cluster.sh up without --api-only, then e2e/images.sh)",
    );
    let c = Cluster::bare("short");
    let release = Release::new(
        &c.kubeconfig,
        &format!("reprise-short-{}", std::process::id()),
        "reprise",
    );
    let t0 = Instant::now();
    let step = |what: &str| {
        eprintln!(
            "[short-lived test {:>6.1}s] {what}",
            t0.elapsed().as_secs_f64()
        )
    };

    step("1. helm install --wait (one controller replica), the app and its policy");
    let out = release
        .install_on_node(&["controller.replicas=1"], "240s")
        .unwrap_or_else(|e| panic!("helm install: {e}"));
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
    web_pod(&c);
    c.until("In-Sync 1/1", Duration::from_secs(60), || {
        c.policy_field("reads", "{.status.inSync}") == "1/1"
    });

    step("2. pod oneshot: 100 GETs through its sidecar, then it exits");
    c.apply(&oneshot_yaml(100)).expect("oneshot");
    let mut pod = Value::Null;
    c.until("oneshot Succeeded", Duration::from_secs(120), || {
        pod = json(&c, &c.ns, &["get", "pod", "oneshot"]);
        pod["status"]["phase"] == "Succeeded"
    });
    let app = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == "app")
        .cloned()
        .expect("the app container's status");
    let ran = &app["state"]["terminated"];
    let lived = seconds_between(
        ran["startedAt"].as_str().expect("started"),
        ran["finishedAt"].as_str().expect("finished"),
    );
    let summary = c
        .kubectl(&["-n", &c.ns, "logs", "oneshot", "-c", "app"])
        .expect("the app's log");
    step(&format!(
        "   the app lived {lived:.0} s (timestamps in whole seconds): {}",
        summary.trim()
    ));
    assert!(lived <= 5.0, "the app lived {lived} s");
    let drove: Value = serde_json::from_str(summary.trim().lines().last().unwrap_or("{}"))
        .expect("the drive's summary");
    assert_eq!(
        (drove["ok"].as_u64(), drove["failed"].as_u64()),
        (Some(100), Some(0)),
        "{drove}"
    );
    // What the pod's sidecar recovered, from its access log.
    let sidecar_log = c
        .kubectl(&["-n", &c.ns, "logs", "oneshot", "-c", "reprise-sidecar"])
        .expect("the sidecar's log");
    let recovered = sidecar_log
        .lines()
        .filter(|l| l.contains("\"outcome\":\"recovered\""))
        .count() as u64;
    assert!(
        sidecar_log.contains("final traffic report") && sidecar_log.contains("\"said\":true"),
        "the sidecar's final report went out: {sidecar_log}"
    );
    step(&format!("   its sidecar recovered {recovered} of them"));

    step("3. status.traffic counts them (written at most once a minute: up to 90 s)");
    c.until(
        "status.traffic.requests = 100",
        Duration::from_secs(150),
        || traffic(&c, "requests") == 100,
    );
    let status = json(&c, &c.ns, &["get", "rp", "reads"])["status"]["traffic"].clone();
    step(&format!("   status.traffic: {status}"));
    assert_eq!(traffic(&c, "recovered"), recovered, "{status}");
    assert!(
        recovered > 0,
        "the flaky pod failed some first tries: {status}"
    );

    step("4. web gets a 30 s termination grace (a rollout), makes 300 GETs, and is rolled right after");
    // The app drains 5 s on SIGTERM; its sidecar is stopped after it and
    // needs its own seconds within the pod's grace, which the test app's
    // 5 s leaves none of.
    c.kubectl(&[
        "-n",
        &c.ns,
        "patch",
        "deployment",
        "web",
        "-p",
        r#"{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":30}}}}"#,
    ])
    .expect("patch");
    c.kubectl(&[
        "-n",
        &c.ns,
        "rollout",
        "status",
        "deployment/web",
        "--timeout=120s",
    ])
    .expect("rollout");
    let web = web_pod(&c);
    let web_app = std::net::SocketAddr::new(ip(&web).parse().expect("pod IP"), 8080);
    let r = drive(web_app, "http://api/", 300, 0).await.expect("drive");
    assert_eq!(r["failed"], 0, "{r}");
    c.kubectl(&["-n", &c.ns, "rollout", "restart", "deployment/web"])
        .expect("rollout restart");
    c.kubectl(&[
        "-n",
        &c.ns,
        "rollout",
        "status",
        "deployment/web",
        "--timeout=120s",
    ])
    .expect("rollout");
    c.until(
        "status.traffic.requests = 400",
        Duration::from_secs(150),
        || traffic(&c, "requests") == 400,
    );
    step(&format!(
        "   status.traffic after the rollout: {}",
        json(&c, &c.ns, &["get", "rp", "reads"])["status"]["traffic"]
    ));
}
