//! The chart, the webhook and the sidecar in real pods on the node
//! (`e2e/cluster.sh up`: kubelet, containerd, runc, CNI, kube-proxy,
//! kube-scheduler, CoreDNS), with the images `e2e/images.sh` built, a Jaeger
//! pod from the chart (`jaeger.enabled`) and Prometheus on the host scraping
//! the pods. One release and one app for all the steps, in order:
//!
//! 1. `helm install --wait`: controller pods Running and Ready by the
//!    kubelet's probes, a leader elected; `helm test` as a real pod.
//! 2. An injected app calling a Service with a flaky pod: the native sidecar
//!    starts before the app, its probes pass, every request succeeds, the
//!    sidecar's log shows the recovered ones, its metrics the real pod IPs,
//!    Jaeger the attempts with `k8s.pod.name`.
//! 7. Prometheus has scraped the controller and the sidecar:
//!    `reprise_retries_total` there equals what the sidecar counted.
//! 3. Rolling restart of the StatefulSet under steady traffic: 0 failed GETs.
//! 5. The controller pods deleted under traffic: a replacement takes the
//!    Lease, In-Sync 1/1 comes back, no request fails.
//! 4. The controller scaled to 0 and the sidecar process killed: the kubelet
//!    restarts it and it serves the retry policy from its saved snapshot.
//! 8. The chart's Grafana dashboard (`grafanaDashboard.enabled`): after
//!    traffic that succeeds and traffic that exhausts its retries, every
//!    panel's query, read from the installed ConfigMap, returns a series
//!    from Prometheus.
//!
//! `tls.rs` (BackendTLSPolicy), `plugin.rs` (`kubectl reprise`) and
//! `short_lived.rs` (short-lived pods counted) install releases of their own.

mod chain;
mod gateway;
mod plugin;
mod short_lived;
mod tls;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reprise_e2e::cluster::{
    drive, get, metric_sum, node_app_yaml, node_name, Cluster, Release, NODE_POLICY,
};
use serde_json::Value;

const RELEASE: &str = "reprise";

fn json(c: &Cluster, ns: &str, args: &[&str]) -> Value {
    let mut a = vec!["-n", ns];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json"]);
    let out = c
        .kubectl(&a)
        .unwrap_or_else(|e| panic!("kubectl {a:?}: {e}"));
    serde_json::from_str(&out).expect("kubectl json")
}

fn pods(c: &Cluster, ns: &str, selector: &str) -> Vec<Value> {
    json(c, ns, &["get", "pods", "-l", selector])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn ip(pod: &Value) -> String {
    pod["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn name(pod: &Value) -> String {
    pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn lease_holder(c: &Cluster, ns: &str) -> String {
    c.kubectl(&[
        "-n",
        ns,
        "get",
        "lease",
        "reprise-controller",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
    .unwrap_or_default()
}

/// The single Ready `web` pod (waits for it).
fn web_pod(c: &Cluster) -> Value {
    let mut found = None;
    c.until("one Ready web pod", Duration::from_secs(120), || {
        let ready_pods: Vec<_> = pods(c, &c.ns, "app=web")
            .into_iter()
            .filter(ready)
            .collect();
        found = (ready_pods.len() == 1).then(|| ready_pods[0].clone());
        found.is_some()
    });
    found.expect("web pod")
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().expect("pod address")
}

fn assert_all_ok(what: &str, r: &Value, n: u64) {
    assert_eq!(r["failed"], 0, "{what}: failed requests: {r}");
    assert_eq!(r["ok"], n, "{what}: {r}");
}

async fn prometheus_query(q: &str) -> Option<Value> {
    let base = std::env::var("PROMETHEUS_URL").expect("PROMETHEUS_URL (run e2e/test.sh)");
    let addr: SocketAddr = base.trim_start_matches("http://").parse().ok()?;
    let path = format!(
        "/api/v1/query?query={}",
        q.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    );
    let (status, body) = get(addr, "prometheus", &path).await?;
    (status == 200).then(|| serde_json::from_str(&body).ok())?
}

/// The values of a Prometheus vector result, by `label`.
fn samples(v: &Value, label: &str) -> Vec<(String, f64)> {
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let l = s["metric"][label].as_str().unwrap_or_default().to_string();
            let x = s["value"][1].as_str()?.parse().ok()?;
            Some((l, x))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster with its node: run e2e/test.sh"]
async fn the_chart_the_webhook_and_the_sidecar_in_real_pods() {
    let node = node_name().expect(
        "REPRISE_E2E_NODE: this test needs the node (e2e/cluster.sh up without --api-only, then e2e/images.sh)",
    );
    let c = Cluster::bare("node");
    let release = Release::new(
        &c.kubeconfig,
        &format!("reprise-node-{}", std::process::id()),
        RELEASE,
    );
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("[node test {:>6.1}s] {what}", t0.elapsed().as_secs_f64());

    // 1. helm install --wait: the Deployment's pods Ready by the kubelet's probes.
    step("1. helm install --wait");
    let out = release
        .install_on_node(
            &[
                "jaeger.enabled=true",
                "otel.sampler=always_on",
                "controller.logLevel=debug",
                "grafanaDashboard.enabled=true",
            ],
            "240s",
        )
        .unwrap_or_else(|e| {
            let pods = release.kubectl(&["get", "pods", "-o", "wide"]);
            let events = release.kubectl(&["get", "events", "--sort-by=.lastTimestamp"]);
            panic!("helm install: {e}\npods: {pods:?}\nevents: {events:?}")
        });
    assert!(out.contains("STATUS: deployed"), "{out}");
    let controllers = pods(&c, &release.ns, "app.kubernetes.io/component=controller");
    assert_eq!(controllers.len(), 2, "two controller replicas");
    for p in &controllers {
        assert_eq!(
            p["spec"]["nodeName"],
            node.as_str(),
            "scheduled on the node"
        );
        assert_eq!(p["status"]["phase"], "Running");
        assert!(ready(p), "Ready by its readiness probe: {}", p["status"]);
        let cs = &p["status"]["containerStatuses"][0];
        assert_eq!(cs["ready"], true);
        assert_eq!(cs["restartCount"], 0, "no restarts: {cs}");
        assert_eq!(
            cs["imageID"].as_str().map(|s| s.starts_with("sha256:")),
            Some(true),
            "the imported image: {cs}"
        );
    }
    let names: Vec<String> = controllers.iter().map(name).collect();
    c.until("a leader", Duration::from_secs(60), || {
        names.contains(&lease_holder(&c, &release.ns))
    });
    let leader = lease_holder(&c, &release.ns);
    step(&format!("   controllers {names:?}, leader {leader}"));

    // helm test: the selftest pod runs for real on the node.
    let test_out = release
        .helm(&["test", RELEASE, "--timeout", "120s"])
        .unwrap_or_else(|e| panic!("helm test: {e}"));
    assert!(test_out.contains("Succeeded"), "{test_out}");
    let test_pod = json(&c, &release.ns, &["get", "pod", "reprise-test"]);
    assert_eq!(test_pod["status"]["phase"], "Succeeded");
    assert_eq!(test_pod["spec"]["nodeName"], node.as_str());
    let test_log = release
        .kubectl(&["logs", "reprise-test"])
        .expect("helm test pod log (through the kubelet)");
    assert!(!test_log.trim().is_empty(), "the selftest printed nothing");
    // Its RBAC was a test hook too: deleted once the test was over.
    for kind in [
        "serviceaccount",
        "role",
        "rolebinding",
        "clusterrole",
        "clusterrolebinding",
    ] {
        let left = release.kubectl(&["get", kind, "reprise-test", "-o", "name"]);
        assert!(
            left.is_err(),
            "{kind} reprise-test left after helm test: {left:?}"
        );
    }
    step("   helm test passed in a real pod, its RBAC gone");

    // 2. The app in a namespace opted into injection.
    step("2. injected app, Service with a flaky pod");
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
    let init = &web["spec"]["initContainers"][0];
    assert_eq!(init["name"], "reprise-sidecar", "injected: {}", web["spec"]);
    assert_eq!(init["restartPolicy"], "Always", "a native sidecar");
    let sidecar = &web["status"]["initContainerStatuses"][0];
    assert_eq!(sidecar["name"], "reprise-sidecar");
    assert_eq!(sidecar["started"], true, "{sidecar}");
    assert_eq!(
        sidecar["ready"], true,
        "its readiness probe passes: {sidecar}"
    );
    let app = &web["status"]["containerStatuses"][0];
    assert_eq!(app["ready"], true, "{app}");
    let started = |s: &Value| {
        s["state"]["running"]["startedAt"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        started(sidecar) <= started(app),
        "the sidecar starts before the app: {sidecar} {app}"
    );
    // Finer than the seconds in startedAt: the first log line of each (CRI timestamps).
    let first_log_at = |container: &str| {
        c.kubectl(&[
            "-n",
            &c.ns,
            "logs",
            &web_name,
            "-c",
            container,
            "--timestamps",
        ])
        .expect("logs")
        .lines()
        .next()
        .and_then(|l| l.split(' ').next())
        .unwrap_or_default()
        .to_string()
    };
    let (sidecar_first, app_first) = (first_log_at("reprise-sidecar"), first_log_at("app"));
    assert!(
        !sidecar_first.is_empty() && sidecar_first < app_first,
        "the sidecar logs before the app starts: {sidecar_first} vs {app_first}"
    );
    c.until(
        "In-Sync 1/1 with 3 endpoints",
        Duration::from_secs(60),
        || {
            c.policy_field("reads", "{.status.inSync}") == "1/1"
                && c.policy_field("reads", "{.status.endpoints}") == "3"
        },
    );
    let web_app = addr(&ip(&web), 8080);
    let web_health = addr(&ip(&web), 15021);
    let r = drive(web_app, "http://api/", 300, 0).await.expect("drive");
    step(&format!("   300 GETs through the sidecar: {r}"));
    // A fresh sidecar, and the policy sets no budget floor: the default of
    // 10 retries a second lets its first failures be retried too.
    assert_all_ok("the flaky pool", &r, 300);
    assert_eq!(
        r["proxy"], "http://127.0.0.1:15001",
        "sent through the injected HTTP_PROXY"
    );
    let (_, m) = get(web_health, "metrics", "/metrics")
        .await
        .expect("sidecar metrics on the pod IP");
    let recovered = metric_sum(
        &m,
        "reprise_requests_total",
        &["outcome=\"recovered\"", "upstream=\"api."],
    );
    let retries = metric_sum(&m, "reprise_retries_total", &["upstream=\"api."]);
    assert!(
        recovered > 0.0 && retries >= recovered,
        "the flaky pod's 503s were recovered:\n{m}"
    );
    // The endpoints are the pods' real IPs, each named by its pod.
    let api_pods = pods(&c, &c.ns, "app=api");
    for p in &api_pods {
        let label = format!("endpoint=\"{}:8080\"", ip(p));
        let pod = format!("pod=\"{}\"", name(p));
        assert!(
            m.lines()
                .any(|l| l.starts_with("reprise_endpoint_in_flight")
                    && l.contains(&label)
                    && l.contains(&pod)),
            "endpoint {} ({label}) in the sidecar's metrics:\n{m}",
            name(p)
        );
    }
    let recovered_lines = recovered_lines(&c, &web_name);
    for l in &recovered_lines {
        assert_eq!(l["first_error"], "upstream_status_503", "{l}");
    }
    step(&format!(
        "   {recovered} recovered, {retries} retries; {} recovered lines in the sidecar's log",
        recovered_lines.len()
    ));

    // The policy's status says what it did: the sidecar's reports (every
    // 10 s) added up and written at most once a minute.
    c.until(
        "status.traffic with the sidecar's 300 requests",
        Duration::from_secs(150),
        || c.policy_field("reads", "{.status.traffic.requests}") == "300",
    );
    let traffic = json(&c, &c.ns, &["get", "rp", "reads"])["status"]["traffic"].clone();
    step(&format!("   status.traffic: {traffic}"));
    assert_eq!(
        traffic["recovered"].as_f64(),
        Some(recovered),
        "the recovered count the sidecar's metrics show: {traffic}"
    );
    assert_eq!(
        traffic["recovered"].as_u64(),
        Some(recovered_lines.len() as u64)
    );
    let pct = |f: &str| {
        traffic[f]
            .as_str()
            .and_then(|s| s.trim_end_matches('%').parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{f} in {traffic}"))
    };
    assert_eq!(pct("effectiveSuccess"), 100.0, "{traffic}");
    assert!(
        pct("firstTrySuccess") < 100.0,
        "the flaky pod failed first tries: {traffic}"
    );
    let columns = c
        .kubectl(&["-n", &c.ns, "get", "rp", "reads"])
        .expect("kubectl get rp");
    assert!(
        columns.contains("EFFECTIVE") && columns.contains("100.00%"),
        "the printer columns: {columns}"
    );

    // Jaeger (the chart's, in a pod): the attempts, with the pod's name.
    let jaeger_pod = pods(&c, &release.ns, "app.kubernetes.io/component=jaeger")
        .into_iter()
        .find(ready)
        .expect("a Ready Jaeger pod");
    let jaeger = format!("http://{}:16686", ip(&jaeger_pod));
    let mut trace = None;
    let start = Instant::now();
    while trace.is_none() && start.elapsed() < Duration::from_secs(60) {
        trace = reprise_e2e::jaeger::find(
            &jaeger,
            "reprise-sidecar",
            &[("reprise.outcome", "recovered")],
            5,
        )
        .await
        .ok()
        .and_then(|t| t.into_iter().next());
        if trace.is_none() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let trace = trace.expect("a recovered request's trace in the chart's Jaeger");
    let drawn = reprise_e2e::jaeger::waterfall(&trace, 40);
    let root = trace
        .spans
        .iter()
        .find(|s| s.parent.is_none())
        .expect("root span");
    assert_eq!(root.tag("span.kind"), Some("server"), "{drawn}");
    assert_eq!(
        root.tag("k8s.pod.name"),
        Some(web_name.as_str()),
        "the injected OTEL_RESOURCE_ATTRIBUTES:\n{drawn}\n{:?}",
        root.tags
    );
    let attempts: Vec<_> = trace
        .spans
        .iter()
        .filter(|s| s.parent.as_deref() == Some(root.id.as_str()))
        .collect();
    assert!(attempts.len() >= 2, "one span per attempt:\n{drawn}");
    let api_ips: Vec<String> = api_pods.iter().map(ip).collect();
    for a in &attempts {
        assert_eq!(a.tag("span.kind"), Some("client"), "{drawn}");
        assert!(
            a.tag("server.address")
                .is_some_and(|s| api_ips.iter().any(|ip| ip == s)),
            "an attempt to a real pod IP {api_ips:?}:\n{drawn}\n{:?}",
            a.tags
        );
    }
    assert_eq!(
        attempts[0].tag("error.type"),
        Some("upstream_status_503"),
        "{drawn}"
    );
    step(&format!("   Jaeger trace:\n{drawn}"));

    // 7. Prometheus scraped the sidecar and the controllers.
    step("7. Prometheus");
    let query = format!("sum(reprise_retries_total{{namespace=\"{}\"}})", c.ns);
    let mut seen = None;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        seen = prometheus_query(&query)
            .await
            .and_then(|v| samples(&v, "").first().map(|s| s.1));
        if seen == Some(retries) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        seen,
        Some(retries),
        "Prometheus: {query} equals the sidecar's count"
    );
    let up = prometheus_query(&format!(
        "up{{job=\"reprise-controller\",namespace=\"{}\"}}",
        release.ns
    ))
    .await
    .expect("query up");
    let up = samples(&up, "pod");
    assert_eq!(up.len(), 2, "both controller pods are targets: {up:?}");
    assert!(up.iter().all(|(_, v)| *v == 1.0), "{up:?}");
    let mut pushes = Vec::new();
    c.until(
        "the controllers' push counter in Prometheus",
        Duration::from_secs(30),
        || {
            pushes = futures_block(prometheus_query(&format!(
                "sum(reprise_controller_pushes_total{{namespace=\"{}\"}})",
                release.ns
            )))
            .map(|v| samples(&v, ""))
            .unwrap_or_default();
            pushes.first().is_some_and(|p| p.1 > 0.0)
        },
    );
    step(&format!(
        "   {query} = {retries}; controllers up {up:?}; pushes {pushes:?}"
    ));

    // 3. Rolling restart of the StatefulSet under steady traffic.
    step("3. rolling restart of StatefulSet api under traffic");
    let before: Vec<String> = pods(&c, &c.ns, "app=api").iter().map(ip).collect();
    c.kubectl(&["-n", &c.ns, "rollout", "restart", "statefulset/api"])
        .expect("rollout restart");
    let rollout = {
        let kubeconfig = c.kubeconfig.clone();
        let ns = c.ns.clone();
        std::thread::spawn(move || {
            std::process::Command::new("kubectl")
                .env("KUBECONFIG", kubeconfig)
                .args(["-n", &ns, "rollout", "status", "statefulset/api"])
                .args(["--timeout=240s"])
                .output()
        })
    };
    let (mut sent, mut failed, mut batches) = (0u64, 0u64, 0);
    let start = Instant::now();
    while !rollout.is_finished() && start.elapsed() < Duration::from_secs(260) {
        let r = drive(web_app, "http://api/", 50, 5).await.expect("drive");
        sent += r["sent"].as_u64().unwrap_or(0);
        failed += r["failed"].as_u64().unwrap_or(0);
        batches += 1;
        assert_eq!(r["failed"], 0, "a GET failed during the rollout: {r}");
    }
    let status = rollout.join().expect("rollout thread").expect("kubectl");
    assert!(
        status.status.success(),
        "rollout: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let after: Vec<String> = pods(&c, &c.ns, "app=api").iter().map(ip).collect();
    let r = drive(web_app, "http://api/", 100, 0).await.expect("drive");
    assert_all_ok("after the rollout", &r, 100);
    step(&format!(
        "   {sent} GETs in {batches} batches during the rollout, {failed} failed; pod IPs {before:?} -> {after:?}; after: {}",
        r["bodies"]
    ));
    assert!(
        batches >= 2,
        "traffic ran through the rollout ({batches} batches)"
    );

    // 5. The controller pods deleted under traffic.
    step("5. controller pods deleted under traffic");
    let old_leader = lease_holder(&c, &release.ns);
    let traffic = tokio::spawn(async move { drive(web_app, "http://api/", 400, 25).await });
    release
        .kubectl(&[
            "delete",
            "pods",
            "-l",
            "app.kubernetes.io/component=controller",
            "--wait=false",
        ])
        .expect("delete controller pods");
    let mut new_names = Vec::new();
    c.until(
        "two new Ready controller pods",
        Duration::from_secs(120),
        || {
            new_names = pods(&c, &release.ns, "app.kubernetes.io/component=controller")
                .into_iter()
                .filter(ready)
                .map(|p| name(&p))
                .filter(|n| !names.contains(n))
                .collect();
            new_names.len() == 2
        },
    );
    c.until("a new pod holds the lease", Duration::from_secs(90), || {
        new_names.contains(&lease_holder(&c, &release.ns))
    });
    // The sidecar resubscribed to one of the new replicas...
    c.until(
        "the sidecar connected to a new replica",
        Duration::from_secs(90),
        || {
            let connected: f64 = pods(&c, &release.ns, "app.kubernetes.io/component=controller")
                .iter()
                .filter(|p| ready(p))
                .filter_map(|p| futures_block(get(addr(&ip(p), 15020), "metrics", "/metrics")))
                .map(|(_, m)| metric_sum(&m, "reprise_controller_connected_sidecars", &[]))
                .sum();
            connected == 1.0
        },
    );
    // ... and the new leader reports it In-Sync.
    c.until("In-Sync 1/1 again", Duration::from_secs(90), || {
        c.policy_field("reads", "{.status.inSync}") == "1/1"
    });
    let r = traffic.await.expect("traffic task").expect("drive");
    assert_all_ok("while the controllers were replaced", &r, 400);
    step(&format!(
        "   leader {old_leader} -> {}; {} GETs during the replacement, 0 failed",
        lease_holder(&c, &release.ns),
        r["ok"]
    ));

    // 4. No controller at all, and the sidecar process killed: the kubelet
    //    restarts it and it serves from its saved snapshot.
    step("4. sidecar killed while no controller runs");
    release
        .kubectl(&["scale", "deployment", "reprise-controller", "--replicas=0"])
        .expect("scale to 0");
    c.until("no controller pod", Duration::from_secs(90), || {
        pods(&c, &release.ns, "app.kubernetes.io/component=controller").is_empty()
    });
    let web = web_pod(&c);
    let sidecar = &web["status"]["initContainerStatuses"][0];
    let restarts = sidecar["restartCount"].as_u64().unwrap_or(0);
    let container_id = sidecar["containerID"]
        .as_str()
        .and_then(|s| s.strip_prefix("containerd://"))
        .expect("containerd container id")
        .to_string();
    let ctr = std::env::var("CONTAINERD_ADDRESS").expect("CONTAINERD_ADDRESS (run e2e/test.sh)");
    let kill = std::process::Command::new("ctr")
        .args([
            "--address",
            &ctr,
            "-n",
            "k8s.io",
            "tasks",
            "kill",
            "-s",
            "SIGKILL",
        ])
        .arg(&container_id)
        .output()
        .expect("ctr");
    assert!(
        kill.status.success(),
        "ctr tasks kill: {}",
        String::from_utf8_lossy(&kill.stderr)
    );
    let mut restarted = Value::Null;
    c.until(
        "the kubelet restarts the sidecar, Ready again",
        Duration::from_secs(120),
        || {
            let p = json(&c, &c.ns, &["get", "pod", &web_name]);
            let s = &p["status"]["initContainerStatuses"][0];
            restarted = s.clone();
            s["restartCount"].as_u64().unwrap_or(0) > restarts
                && s["ready"] == true
                && s["containerID"].as_str() != Some(&format!("containerd://{container_id}"))
        },
    );
    assert!(
        pods(&c, &release.ns, "app.kubernetes.io/component=controller").is_empty(),
        "still no controller"
    );
    let log = c
        .kubectl(&["-n", &c.ns, "logs", &web_name, "-c", "reprise-sidecar"])
        .expect("restarted sidecar's log");
    assert!(
        log.contains("serving the saved snapshot until the controller answers"),
        "the restarted sidecar loaded its snapshot from the emptyDir:\n{log}"
    );
    let r = drive(web_app, "http://api/", 200, 0).await.expect("drive");
    assert_all_ok("from the saved snapshot", &r, 200);
    let (_, m) = get(web_health, "metrics", "/metrics")
        .await
        .expect("metrics");
    let recovered_now = metric_sum(
        &m,
        "reprise_requests_total",
        &["outcome=\"recovered\"", "upstream=\"api."],
    );
    assert!(
        recovered_now > 0.0,
        "the restarted sidecar retried by the saved policy (recovered {recovered_now}):\n{m}"
    );
    step(&format!(
        "   sidecar restarted (restartCount {}), served 200/200 with {recovered_now} recovered and no controller",
        restarted["restartCount"]
    ));
    release
        .kubectl(&["scale", "deployment", "reprise-controller", "--replicas=2"])
        .expect("scale back");
    c.until(
        "In-Sync 1/1 once the controller is back",
        Duration::from_secs(120),
        || c.policy_field("reads", "{.status.inSync}") == "1/1",
    );

    // 8. Last, as the failures below spend the retry budget.
    step("8. the dashboard's queries against Prometheus");
    let r = drive(web_app, "http://api/", 100, 20).await.expect("drive");
    assert_all_ok("before the dashboard's queries", &r, 100);
    // Spread over several scrapes, so that the exhausted series' rate is
    // not lost to its first sample.
    let r = drive(web_app, "http://api/unavailable", 30, 200)
        .await
        .expect("drive");
    assert_eq!(r["statuses"]["503"], 30, "every pod answers 503: {r}");
    let queries = dashboard_queries(&release);
    let mut unanswered = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        unanswered.clear();
        for (panel, query) in &queries {
            let answer = prometheus_query(query).await;
            if !answer.as_ref().is_some_and(has_a_value) {
                unanswered.push(format!("{panel}: {query} -> {answer:?}"));
            }
        }
        if unanswered.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        unanswered.is_empty(),
        "dashboard queries without a series:\n{}",
        unanswered.join("\n")
    );
    step(&format!(
        "   {} queries of the dashboard, each with a series",
        queries.len()
    ));
    step("done");
}

/// Every query of the chart's Grafana dashboard as the release installed it
/// (ConfigMap `reprise-dashboard`), with its panel's title. Grafana's
/// variables become what the dashboard means by them over a short test:
/// every upstream, a rate over 2 minutes.
fn dashboard_queries(release: &Release) -> Vec<(String, String)> {
    let cm = release
        .kubectl(&["get", "configmap", "reprise-dashboard", "-o", "json"])
        .expect("the dashboard's ConfigMap");
    let cm: Value = serde_json::from_str(&cm).expect("ConfigMap JSON");
    let dashboard: Value = serde_json::from_str(
        cm["data"]["reprise.json"]
            .as_str()
            .expect("data reprise.json"),
    )
    .expect("the dashboard's JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            let query = t["expr"]
                .as_str()
                .expect("expr")
                .replace("$__rate_interval", "2m")
                .replace("$upstream", ".*");
            assert!(
                !query.contains('$'),
                "{title}: a variable this test does not know: {query}"
            );
            queries.push((title.to_string(), query));
        }
    }
    assert!(!queries.is_empty(), "the dashboard has queries");
    queries
}

/// Whether a Prometheus query answer holds a series with a number (not NaN:
/// a ratio or quantile over no traffic).
fn has_a_value(answer: &Value) -> bool {
    answer["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["value"][1].as_str()?.parse::<f64>().ok())
        .any(f64::is_finite)
}

/// Runs a future to completion from synchronous code inside the test's runtime.
fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// The `recovered` access-log lines of `pod`'s sidecar, at least one, each
/// showing a first attempt on the flaky `api-0` and the retry on another pod.
fn recovered_lines(c: &Cluster, pod: &str) -> Vec<Value> {
    let log = c
        .kubectl(&["-n", &c.ns, "logs", pod, "-c", "reprise-sidecar"])
        .expect("sidecar log");
    let recovered: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["outcome"] == "recovered")
        .collect();
    assert!(!recovered.is_empty(), "recovered requests logged:\n{log}");
    for l in &recovered {
        let tried: Vec<&str> = l["endpoints"].as_str().unwrap_or("").split(',').collect();
        assert!(
            tried.len() >= 2 && tried[0] == "api-0" && tried[1] != "api-0",
            "a retry goes to another pod: {l}"
        );
    }
    recovered
}

/// The PID of a running container's task, from containerd (`ctr tasks ls`).
fn task_pid(container_id: &str) -> Option<String> {
    let ctr = std::env::var("CONTAINERD_ADDRESS").ok()?;
    let out = std::process::Command::new("ctr")
        .args(["--address", &ctr, "-n", "k8s.io", "tasks", "ls"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some(container_id)).then(|| f.next().map(String::from))?
    })
}

/// Issue 16 on the real node: a pod annotated `reprise.dev/transparent:
/// "true"` with no `HTTP_PROXY` calls a Service with a flaky pod by its name,
/// as an app that ignores proxy settings would; `reprise-init` (root,
/// NET_ADMIN and NET_RAW, the sidecar image's iptables) has redirected its
/// outbound TCP to the sidecar, which retries the 503s. Its own release, so
/// it runs alone (`--test cluster node::a_transparent`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster with its node: run e2e/test.sh"]
async fn a_transparent_pod_without_http_proxy_gets_its_requests_retried() {
    let node = node_name().expect(
        "REPRISE_E2E_NODE: this test needs the node (e2e/cluster.sh up without --api-only, then e2e/images.sh)",
    );
    let c = Cluster::bare("transparent");
    let release = Release::new(
        &c.kubeconfig,
        &format!("reprise-transparent-{}", std::process::id()),
        RELEASE,
    );
    let t0 = Instant::now();
    let step = |what: &str| {
        eprintln!(
            "[transparent test {:>6.1}s] {what}",
            t0.elapsed().as_secs_f64()
        )
    };

    step("1. helm install --wait (one controller replica)");
    let out = release
        .install_on_node(&["controller.replicas=1"], "240s")
        .unwrap_or_else(|e| {
            let pods = release.kubectl(&["get", "pods", "-o", "wide"]);
            panic!("helm install: {e}\npods: {pods:?}")
        });
    assert!(out.contains("STATUS: deployed"), "{out}");

    step("2. a transparent web pod, Service api with a flaky pod");
    c.kubectl(&["label", "namespace", &c.ns, "reprise.dev/inject=enabled"])
        .expect("label");
    c.until_injecting(Duration::from_secs(60));
    c.apply(&reprise_e2e::cluster::node_transparent_app_yaml(
        "api-0", 50,
    ))
    .expect("app");
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
    assert_eq!(web["spec"]["nodeName"], node.as_str());
    let spec = &web["spec"];
    let init_names: Vec<&str> = spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        init_names,
        ["reprise-init", "reprise-sidecar"],
        "the rules before the sidecar: {spec}"
    );
    let init = &spec["initContainers"][0];
    let sc = &init["securityContext"];
    assert_eq!(sc["runAsUser"], 0, "{sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(
        sc["capabilities"],
        serde_json::json!({"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]})
    );
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
        .expect("kubernetes Service");
    let args: Vec<&str> = init["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let excluded = format!("{api_ip}/32");
    assert_eq!(
        args,
        [
            "iptables",
            "--redirect-port",
            "15006",
            "--proxy-uid",
            "65532",
            "--exclude-ports",
            "53",
            "--exclude-cidrs",
            excluded.as_str(),
        ]
    );
    // reprise-init ran and exited 0 before the sidecar started.
    let statuses = &web["status"]["initContainerStatuses"];
    let init_status = &statuses[0];
    assert_eq!(init_status["name"], "reprise-init");
    let done = &init_status["state"]["terminated"];
    assert_eq!(done["exitCode"], 0, "{init_status}");
    assert_eq!(done["reason"], "Completed", "{init_status}");
    assert_eq!(init_status["restartCount"], 0, "{init_status}");
    assert_eq!(statuses[1]["name"], "reprise-sidecar");
    assert_eq!(statuses[1]["ready"], true, "{}", statuses[1]);
    // No proxy variable anywhere in the app container.
    let app = &spec["containers"][0];
    assert_eq!(app["name"], "app");
    let env_names: Vec<&str> = app["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        !env_names
            .iter()
            .any(|n| n.eq_ignore_ascii_case("http_proxy") || n.eq_ignore_ascii_case("no_proxy")),
        "no proxy variables in a transparent pod: {env_names:?}"
    );
    let init_log = c
        .kubectl(&["-n", &c.ns, "logs", &web_name, "-c", "reprise-init"])
        .expect("reprise-init's log");
    assert!(
        init_log.contains("REPRISE_OUTPUT") && init_log.contains("installed"),
        "reprise-init logs the rules it installed:\n{init_log}"
    );
    step(&format!("   reprise-init exited 0; its log:\n{init_log}"));

    // The rules, read from the host in the pod's network namespace.
    let app_status = &web["status"]["containerStatuses"][0];
    let app_id = app_status["containerID"]
        .as_str()
        .and_then(|s| s.strip_prefix("containerd://"))
        .expect("the app's container id");
    let pid = task_pid(app_id).expect("the app's PID (ctr tasks ls)");
    let save = std::process::Command::new("nsenter")
        .args(["-t", &pid, "-n", "iptables-save", "-t", "nat"])
        .output()
        .expect("nsenter iptables-save");
    let rules = String::from_utf8_lossy(&save.stdout);
    assert!(
        save.status.success(),
        "nsenter: {}",
        String::from_utf8_lossy(&save.stderr)
    );
    for want in [
        ":REPRISE_OUTPUT -",
        "-A OUTPUT -p tcp -j REPRISE_OUTPUT",
        "--uid-owner 65532 -j RETURN",
        &format!("-d {excluded} -j RETURN"),
        "--dport 53 -j RETURN",
        "-j REDIRECT --to-ports 15006",
    ] {
        assert!(
            rules.lines().any(|l| l.contains(want)),
            "{want:?} in the pod's nat table:\n{rules}"
        );
    }
    step(&format!("   the pod's nat table:\n{rules}"));

    c.until(
        "In-Sync 1/1 with 3 endpoints",
        Duration::from_secs(60),
        || {
            c.policy_field("reads", "{.status.inSync}") == "1/1"
                && c.policy_field("reads", "{.status.endpoints}") == "3"
        },
    );
    // 3. The app dials http://api/ itself (DNS, then the ClusterIP).
    step("3. 300 GETs to http://api/ with no proxy setting");
    let web_app = addr(&ip(&web), 8080);
    let web_health = addr(&ip(&web), 15021);
    let r = drive(web_app, "http://api/", 300, 0).await.expect("drive");
    step(&format!("   {r}"));
    assert_eq!(r["proxy"], Value::Null, "the app saw no HTTP_PROXY: {r}");
    assert_all_ok("captured and retried", &r, 300);
    let (_, m) = get(web_health, "metrics", "/metrics")
        .await
        .expect("sidecar metrics on the pod IP");
    let recovered = metric_sum(
        &m,
        "reprise_requests_total",
        &["outcome=\"recovered\"", "upstream=\"api."],
    );
    let captured = metric_sum(
        &m,
        "reprise_captured_connections_total",
        &["protocol=\"http1\""],
    );
    assert!(
        recovered > 0.0,
        "the flaky pod's 503s were recovered by the sidecar:\n{m}"
    );
    assert!(
        captured >= 300.0,
        "every connection (one per GET) was captured and sniffed as HTTP/1: {captured}\n{m}"
    );
    let recovered_lines = recovered_lines(&c, &web_name);
    step(&format!(
        "   {captured} captured connections, {recovered} recovered; {} recovered lines in the sidecar's log",
        recovered_lines.len()
    ));
    step("done");
}
