//! The Kubernetes demo (run by `e2e/demo.sh` once the local control plane is
//! up): a Service `api` with three pods, one failing half its requests with
//! 503; a client pod `web-1` with its sidecar; the controller; a RetryPolicy
//! applied with kubectl. Sends traffic through the sidecar, prints what the
//! retries did, and draws one recovered request's trace from Jaeger.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use reprise_e2e::cluster::{free, get, Cluster};
use reprise_e2e::{jaeger, upstream_server};

const REQUESTS: usize = 300;
/// Linkerd's budget defaults (20% plus 10 retries a second): with the
/// percentage alone, a cold upstream has no budget for its first few requests,
/// and the flaky pod's first 503 may come right then.
const POLICY: &str = "apiVersion: reprise.dev/v1alpha1
kind: RetryPolicy
metadata: { name: reads }
spec:
  targetRef: { name: api }
  podSelector: { matchLabels: { app: web } }
  methods: [GET]
  statusPresets: [Gateway]
  acknowledgeDuplicateRisk: true
  retries: { attempts: 2, backoffBaseMs: 5, backoffCapMs: 50, budgetPercent: 20, budgetMinRetriesPerSecond: 10, totalDeadlineMs: 5000 }
";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let jaeger_query = std::env::var("JAEGER_QUERY").context("JAEGER_QUERY (run e2e/demo.sh)")?;
    let otlp = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .context("OTEL_EXPORTER_OTLP_ENDPOINT (run e2e/demo.sh)")?;
    let c = Cluster::new("demo");
    let o = c.octet;
    println!("== namespace {} on the local kube-apiserver", c.ns);

    let mut servers = Vec::new();
    for (i, fail) in [(0u8, 50u32), (1, 0), (2, 0)] {
        let addr: SocketAddr = format!("127.1.{o}.{}:8080", 21 + i).parse()?;
        let name: &'static str = ["api-0", "api-1", "api-2"][usize::from(i)];
        servers.push(upstream_server::start(addr, name, fail).await?);
        c.pod(name, "app: api", Some(&format!("10.244.{o}.{}", 21 + i)));
    }
    c.apply("apiVersion: v1\nkind: Service\nmetadata: { name: api }\nspec:\n  selector: { app: api }\n  ports: [{ name: http, port: 80, targetPort: 8080 }]\n")
        .map_err(anyhow::Error::msg)?;
    println!("   Service api: pods api-0 (503 to half its requests), api-1, api-2");

    c.pod("web-1", "app: web", None);
    let (push, metrics, listen, admin) = (free(), free(), free(), free());
    let _controller = c.controller(push, metrics);
    let _sidecar = c.sidecar_with(
        "web-1",
        push,
        listen,
        admin,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_SERVICE_NAME", "reprise-sidecar"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    println!("   client pod web-1 with its sidecar on {listen}; controller pushing on {push}");

    println!("\n== kubectl apply -f reads.yaml\n{POLICY}");
    let out = c.apply(POLICY).map_err(anyhow::Error::msg)?;
    print!("{out}");
    let start = Instant::now();
    while c.policy_field("reads", "{.status.inSync}") != "1/1"
        || c.policy_field("reads", "{.status.endpoints}") != "3"
    {
        if start.elapsed() > Duration::from_secs(60) {
            bail!("the policy never got In-Sync 1/1 with 3 endpoints");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "\n== kubectl get rp   (in sync {:.1} s after apply)\n{}",
        start.elapsed().as_secs_f64(),
        c.kubectl(&["-n", &c.ns, "get", "rp"])
            .map_err(anyhow::Error::msg)?
    );

    println!("== {REQUESTS} requests: GET http://api/ through the sidecar");
    let mut ok = 0;
    for _ in 0..REQUESTS {
        if get(listen, "api", "/").await.map(|r| r.0) == Some(200) {
            ok += 1;
        }
    }
    let (_, m) = get(admin, "localhost", "/metrics")
        .await
        .context("sidecar metrics")?;
    let sum = |prefix: &str, needle: &str| -> u64 {
        m.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(needle))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    };
    println!("   succeeded: {ok}/{REQUESTS}");
    println!("   retries:   {}", sum("reprise_retries_total", ""));
    println!(
        "   recovered: {}   exhausted: {}",
        sum("reprise_requests_total", "outcome=\"recovered\""),
        sum("reprise_requests_total", "outcome=\"exhausted\"")
    );
    println!(
        "   upstream requests: api-0 {}, api-1 {}, api-2 {}",
        servers[0].requests.load(Ordering::Relaxed),
        servers[1].requests.load(Ordering::Relaxed),
        servers[2].requests.load(Ordering::Relaxed)
    );
    println!(
        "   (api-0 answers 503 to half its requests: each 503 was retried on another pod,\n    \
         and after its first failures the sidecar sends it little traffic while the others\n    \
         have room, so few retries are needed; README: \"How a request is retried\")"
    );

    println!("\n== one recovered request, read back from Jaeger ({jaeger_query})");
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
                break;
            }
            Ok(_) | Err(_) if start.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(_) => bail!("Jaeger has no recovered trace after 20 s"),
            Err(e) => return Err(e),
        }
    }
    println!("\nOpen {jaeger_query}/search?service=reprise-sidecar for the rest.");
    Ok(())
}
