//! Scale benchmark for the push stream (not a test): N simulated sidecars
//! (the real subscription code, in a second process) connected to one push
//! server (a first process) over loopback TLS. Each round changes the snapshot
//! and measures the time until every sidecar has ACKed it; the server's RSS
//! and CPU time are read from /proc.
//!
//! `cargo run --release -p reprise-controller --example push_scale -- 1000`

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reprise_controller::push::{AuthError, Identity, PushServer, SnapshotSource};
use reprise_controller::sidecars::SidecarRegistry;
use reprise_crds::retry_rule::RetryRule;
use reprise_crds::snapshot::{Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream};
use tokio::sync::watch;

/// Every token is good for the pod it claims.
fn any_pod(_token: &str, namespace: &str, pod: &str) -> Result<Identity, AuthError> {
    Ok(Identity {
        namespace: namespace.into(),
        pod: pod.into(),
        labels: BTreeMap::new(),
        capabilities: Default::default(),
    })
}

struct Source(Mutex<Snapshot>, watch::Sender<u64>);

impl SnapshotSource for Source {
    fn snapshot_for(&self, _: &Identity) -> Snapshot {
        self.0.lock().expect("lock").clone()
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.1.subscribe()
    }
}

fn snapshot(round: u16) -> Snapshot {
    let up = SnapshotUpstream {
        name: "api.bench".into(),
        hosts: vec!["api".into()],
        protocol: Default::default(),
        addresses: vec![],
        endpoints: (0..3)
            .map(|i| SnapshotEndpoint {
                address: format!("127.0.0.{}", 10 + i),
                port: 8000 + round,
                pod: Some(format!("api-{i}")),
                zone: None,
            })
            .collect(),
        ..Default::default()
    };
    let p = SnapshotPolicy {
        namespace: "bench".into(),
        name: "p".into(),
        generation: i64::from(round),
        upstream: "api.bench".into(),
        rule: RetryRule::default(),
        precedence: 0,
        route: None,
    };
    Snapshot::new(vec![up], vec![p])
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("server") => server(&args[2]),
        Some("clients") => clients(&args[2], &args[3], args[4].parse()?),
        n => driver(n.unwrap_or("100").parse()?),
    }
}

/// First process: the push server. Commands on stdin: `bump N` (new snapshot,
/// then report each ACK delay), `stats`.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn server(dir: &str) -> anyhow::Result<()> {
    let material = reprise_controller::tls::generate(&["localhost".into()])?;
    std::fs::write(format!("{dir}/ca.crt"), &material.ca_pem)?;
    let (tx, _) = watch::channel(0);
    let source = Arc::new(Source(Mutex::new(snapshot(0)), tx));
    let (sync_tx, mut sync_rx) = tokio::sync::mpsc::unbounded_channel();
    let registry = Arc::new(SidecarRegistry::default());
    let server = PushServer::new(
        Arc::new(any_pod),
        Arc::clone(&source) as Arc<dyn SnapshotSource>,
        Arc::clone(&registry),
        Arc::default(),
        Some(sync_tx),
        reprise_controller::telemetry::Tracing::off(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("addr {}", listener.local_addr()?);
    // Every modelled sidecar connects from loopback: no cap per source.
    let gate = reprise_controller::listen::Gate::new(
        "push",
        reprise_controller::listen::Limits {
            max_per_source: None,
            ..reprise_controller::push::PUSH_LIMITS
        },
    );
    tokio::spawn(server.serve_within(
        listener,
        reprise_controller::tls::server_config(&material)?,
        std::future::pending(),
        gate,
    ));
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    while let Some(line) = lines.next_line().await? {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["connected"] => println!("connected {}", registry.connected()),
            // Exit with the connections open, so a profiler reports them.
            ["exit"] => std::process::exit(0),
            ["bump", round, n] => {
                while sync_rx.try_recv().is_ok() {}
                let n: usize = n.parse()?;
                let t0 = Instant::now();
                *source.0.lock().expect("lock") = snapshot(round.parse()?);
                source.1.send_modify(|v| *v += 1);
                let mut delays = Vec::with_capacity(n);
                while delays.len() < n {
                    match tokio::time::timeout(Duration::from_secs(30), sync_rx.recv()).await {
                        Ok(Some(_)) => delays.push(t0.elapsed().as_secs_f64() * 1000.0),
                        _ => break,
                    }
                }
                println!(
                    "acks {} {}",
                    delays.len(),
                    delays
                        .iter()
                        .map(|d| format!("{d:.2}"))
                        .collect::<Vec<_>>()
                        .join(",")
                );
            }
            _ => println!("?"),
        }
    }
    Ok(())
}

/// Second process: N sidecars running the real subscription code.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn clients(addr: &str, dir: &str, n: usize) -> anyhow::Result<()> {
    std::fs::write(format!("{dir}/token"), "t")?;
    for i in 0..n {
        let sub = reprise_sidecar::config::Subscription {
            controller: format!("https://{addr}").parse()?,
            server_name: Some("localhost".into()),
            pod: format!("client-{i}"),
            namespace: "bench".into(),
            token_path: format!("{dir}/token").into(),
            ca: reprise_sidecar::config::TrustedCa::File(format!("{dir}/ca.crt").into()),
            snapshot_path: format!("{dir}/snap/{i}.json").into(),
            address_map: None,
            report_every: Duration::from_secs(10),
            diagnostics_retained: None,
            deadlines: reprise_crds::policy::DeadlinePolicy::ON,
        };
        let proxy = reprise_sidecar::Proxy::new(
            Snapshot::new(vec![], vec![])
                .resolve()
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        tokio::spawn(sub.run(proxy, None));
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    std::future::pending::<()>().await;
    Ok(())
}

fn driver(n: usize) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("reprise-push-scale-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("snap"))?;
    let exe = std::env::current_exe()?;
    // PUSH_SCALE_SERVER_WRAPPER runs the server under a profiler, e.g.
    // "valgrind --tool=massif --massif-out-file=/tmp/massif.out".
    let wrapper = std::env::var("PUSH_SCALE_SERVER_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut server = match words.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(words).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let mut server = server
        .args(["server", &dir.display().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(server.stdout.take().expect("stdout"));
    let mut input = server.stdin.take().expect("stdin");
    let mut line = String::new();
    out.read_line(&mut line)?;
    let addr = line.trim().strip_prefix("addr ").unwrap_or("").to_string();
    let mut clients = Command::new(&exe)
        .args(["clients", &addr, &dir.display().to_string(), &n.to_string()])
        .stdout(Stdio::null())
        .spawn()?;
    let started = Instant::now();
    loop {
        writeln!(input, "connected")?;
        line.clear();
        out.read_line(&mut line)?;
        let c: usize = line
            .trim()
            .strip_prefix("connected ")
            .unwrap_or("0")
            .parse()?;
        if c >= n || started.elapsed() > Duration::from_secs(120) {
            println!("{c}/{n} sidecars connected in {:.1?}", started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(2));
    let cpu0 = cpu_secs(server.id());
    let mut all = Vec::new();
    for round in 1..=5u16 {
        writeln!(input, "bump {round} {n}")?;
        line.clear();
        out.read_line(&mut line)?;
        let mut parts = line.split_whitespace().skip(1);
        let got: usize = parts.next().unwrap_or("0").parse()?;
        let mut delays: Vec<f64> = parts
            .next()
            .unwrap_or("")
            .split(',')
            .filter_map(|d| d.parse().ok())
            .collect();
        delays.sort_by(f64::total_cmp);
        println!(
            "round {round}: {got}/{n} ACKs, p50 {:.1} ms, p99 {:.1} ms, last {:.1} ms",
            pct(&delays, 0.5),
            pct(&delays, 0.99),
            delays.last().copied().unwrap_or(f64::NAN)
        );
        all.extend(delays);
        std::thread::sleep(Duration::from_millis(500));
    }
    all.sort_by(f64::total_cmp);
    let cpu = cpu_secs(server.id()) - cpu0;
    println!(
        "| {n} sidecars | p50 {:.1} ms | p99 {:.1} ms | server RSS {:.1} MB | server CPU {:.2} s over 5 rounds |",
        pct(&all, 0.5),
        pct(&all, 0.99),
        rss_mb(server.id()),
        cpu
    );
    let _ = writeln!(input, "exit");
    for _ in 0..600 {
        if server.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = clients.kill();
    let _ = server.kill();
    let _ = clients.wait();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
