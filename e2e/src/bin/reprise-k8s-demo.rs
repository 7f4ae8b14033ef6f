//! The Kubernetes demo (run by `e2e/demo.sh` once the local cluster and its
//! node are up and `e2e/images.sh` has loaded the images): `helm install` of
//! the chart with a Jaeger pod; a namespace opted into injection with a
//! StatefulSet `api` of three pods, `api-0` failing half its requests with
//! 503, and a Deployment `web` whose pod gets the sidecar; a RetryPolicy
//! applied with kubectl. `web` sends traffic to `http://api/` through its
//! sidecar; the demo prints what the retries did, a recovered request's log
//! line, and draws its trace read back from the Jaeger pod.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use reprise_e2e::cluster::{
    drive, get, metric_sum, node_app_yaml, node_name, Cluster, Release, NODE_POLICY,
};
use reprise_e2e::jaeger;
use serde_json::Value;

const REQUESTS: u32 = 300;

fn pod_json(c: &Cluster, ns: &str, selector: &str) -> anyhow::Result<Vec<Value>> {
    let out = c
        .kubectl(&["-n", ns, "get", "pods", "-l", selector, "-o", "json"])
        .map_err(anyhow::Error::msg)?;
    let v: Value = serde_json::from_str(&out)?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

fn is_ready(p: &Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn wait(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > limit {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let node =
        node_name().context("REPRISE_E2E_NODE: the demo needs the node (run e2e/demo.sh)")?;
    let c = Cluster::bare("demo");
    let release = Release::new(&c.kubeconfig, "reprise-system", "reprise");

    println!("== helm install reprise charts/reprise -n reprise-system --create-namespace \\");
    println!("     --set image.controller.tag=dev --set image.sidecar.tag=dev --set jaeger.enabled=true --wait");
    let start = Instant::now();
    let out = release
        .install_on_node(&["jaeger.enabled=true", "otel.sampler=always_on"], "240s")
        .map_err(anyhow::Error::msg)?;
    let status = out
        .lines()
        .find(|l| l.starts_with("STATUS:"))
        .unwrap_or("STATUS: ?");
    println!(
        "   {status} in {:.0} s (images built by e2e/images.sh, imported into the node's containerd)",
        start.elapsed().as_secs_f64()
    );
    println!(
        "\n== kubectl -n reprise-system get pods -o wide   (node {node})\n{}",
        release
            .kubectl(&["get", "pods", "-o", "wide"])
            .map_err(anyhow::Error::msg)?
    );

    println!(
        "== namespace {} labelled reprise.dev/inject=enabled: StatefulSet api (api-0 answers 503 to half its requests), Deployment web",
        c.ns
    );
    c.kubectl(&["label", "namespace", &c.ns, "reprise.dev/inject=enabled"])
        .map_err(anyhow::Error::msg)?;
    c.apply(&node_app_yaml("api-0", 50))
        .map_err(anyhow::Error::msg)?;
    let mut web = Value::Null;
    wait("the app's pods", Duration::from_secs(180), || {
        let api = pod_json(&c, &c.ns, "app=api").unwrap_or_default();
        let webs: Vec<_> = pod_json(&c, &c.ns, "app=web")
            .unwrap_or_default()
            .into_iter()
            .filter(is_ready)
            .collect();
        if let Some(w) = webs.first() {
            web = w.clone();
        }
        api.iter().filter(|p| is_ready(p)).count() == 3 && webs.len() == 1
    })?;
    println!(
        "\n== kubectl -n {} get pods -o wide   (web: its app and the injected native sidecar, READY 2/2)\n{}",
        c.ns,
        c.kubectl(&["-n", &c.ns, "get", "pods", "-o", "wide"])
            .map_err(anyhow::Error::msg)?
    );
    let web_name = web["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let web_ip = web["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let init = &web["spec"]["initContainers"][0];
    println!(
        "   {web_name}: init container {} with restartPolicy {} (starts before the app), image {}",
        init["name"], init["restartPolicy"], init["image"]
    );

    println!("\n== kubectl apply -f reads.yaml\n{NODE_POLICY}");
    print!("{}", c.apply(NODE_POLICY).map_err(anyhow::Error::msg)?);
    let start = Instant::now();
    wait("In-Sync 1/1", Duration::from_secs(60), || {
        c.policy_field("reads", "{.status.inSync}") == "1/1"
            && c.policy_field("reads", "{.status.endpoints}") == "3"
    })?;
    println!(
        "\n== kubectl get rp   (in sync {:.1} s after apply; EFFECTIVE and FIRST-TRY wait for status.traffic)\n{}",
        start.elapsed().as_secs_f64(),
        c.kubectl(&["-n", &c.ns, "get", "rp"])
            .map_err(anyhow::Error::msg)?
    );

    println!(
        "== {REQUESTS} requests from {web_name}: GET http://api/ through its sidecar (HTTP_PROXY)"
    );
    let app: SocketAddr = format!("{web_ip}:8080").parse()?;
    let r = drive(app, "http://api/", REQUESTS, 0).await?;
    let (_, m) = get(format!("{web_ip}:15021").parse()?, "metrics", "/metrics")
        .await
        .context("the sidecar's metrics")?;
    println!("   succeeded: {}/{REQUESTS}", r["ok"]);
    println!(
        "   retries:   {}",
        metric_sum(&m, "reprise_retries_total", &[])
    );
    println!(
        "   recovered: {}   exhausted: {}",
        metric_sum(&m, "reprise_requests_total", &["outcome=\"recovered\""]),
        metric_sum(&m, "reprise_requests_total", &["outcome=\"exhausted\""])
    );
    println!("   answered by: {}", r["bodies"]);
    println!(
        "   (api-0 answers 503 to half its requests: each 503 was retried on another pod,\n    \
         and after its first failures the sidecar sends it little traffic while the others\n    \
         have room, so few retries are needed; docs/src/concepts/retries.md)"
    );
    let log = c
        .kubectl(&["-n", &c.ns, "logs", &web_name, "-c", "reprise-sidecar"])
        .map_err(anyhow::Error::msg)?;
    if let Some(line) = log
        .lines()
        .find(|l| l.contains("\"outcome\":\"recovered\""))
    {
        println!("\n== one recovered request in the sidecar's log (kubectl logs {web_name} -c reprise-sidecar)\n{line}");
    }

    let jaeger_pod = pod_json(&c, &release.ns, "app.kubernetes.io/component=jaeger")?
        .into_iter()
        .find(is_ready)
        .context("no Ready Jaeger pod")?;
    let jaeger_query = format!(
        "http://{}:16686",
        jaeger_pod["status"]["podIP"].as_str().unwrap_or_default()
    );
    println!("\n== its trace, read back from the Jaeger pod ({jaeger_query})");
    let start = Instant::now();
    loop {
        match jaeger::find(
            &jaeger_query,
            "reprise-sidecar",
            &[("reprise.outcome", "recovered")],
            5,
        )
        .await
        {
            Ok(traces) if !traces.is_empty() => {
                print!("{}", jaeger::waterfall(&traces[0], 40));
                let pod = traces[0]
                    .spans
                    .iter()
                    .find_map(|s| s.tag("k8s.pod.name"))
                    .unwrap_or("?");
                println!("   (k8s.pod.name={pod})");
                break;
            }
            Ok(_) | Err(_) if start.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(_) => bail!("Jaeger has no recovered trace after 30 s"),
            Err(e) => return Err(e),
        }
    }

    // The leader writes status.traffic at most once a minute, from the
    // sidecars' reports: the columns apply left empty fill in then.
    println!("\n== waiting for the policy's status.traffic (written at most once a minute)");
    let start = Instant::now();
    wait("status.traffic", Duration::from_secs(90), || {
        !c.policy_field("reads", "{.status.traffic.requests}")
            .is_empty()
    })?;
    println!(
        "\n== kubectl get rp   ({:.0} s later)\n{}",
        start.elapsed().as_secs_f64(),
        c.kubectl(&["-n", &c.ns, "get", "rp"])
            .map_err(anyhow::Error::msg)?
    );
    let stat = std::process::Command::new(c.bin.join("kubectl-reprise"))
        .env("KUBECONFIG", &c.kubeconfig)
        .args(["stat", "-n", &c.ns])
        .output()
        .context("kubectl-reprise (cargo build --bin kubectl-reprise)")?;
    println!(
        "== kubectl reprise stat -n {}\n{}{}",
        c.ns,
        String::from_utf8_lossy(&stat.stdout),
        String::from_utf8_lossy(&stat.stderr)
    );
    Ok(())
}
