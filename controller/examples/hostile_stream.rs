//! The controller's memory under a hostile push stream (issue 54): the real
//! push server in this process, one pod (a fixed identity instead of
//! TokenReview) that sends report lines as fast as the server reads them,
//! each with thousands of made-up names and a latency list of any length.
//! Prints the process's RSS before, while and after, what the traffic book
//! then holds for the policy, and what this replica would publish of it
//! for the leader (the sync ConfigMap's traffic).
//!
//! ```text
//! cargo run -p reprise-controller --example hostile_stream -- [LINES] [SECONDS]
//! ```
//!
//! LINES (3,000) lines are sent, for at most SECONDS (20). Uses only what
//! the push server offered before issue 54, so the same example measures
//! both (`e2e/bench/results/2026-12-07-issue54-rss.md`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reprise_controller::metrics::Metrics;
use reprise_controller::push::{Identity, PushServer, SnapshotSource};
use reprise_controller::sidecars::SidecarRegistry;
use reprise_crds::retry_rule::RetryRule;
use reprise_crds::snapshot::{Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::watch;

struct Source(Mutex<Snapshot>, watch::Sender<u64>);

impl SnapshotSource for Source {
    fn snapshot_for(&self, _id: &Identity) -> Snapshot {
        self.0.lock().expect("lock").clone()
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.1.subscribe()
    }
}

/// VmRSS and VmHWM of this process, in MiB.
fn rss() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let lines: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3_000);
    let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);

    let material = reprise_controller::tls::generate(&["localhost".to_string()]).expect("certs");
    let upstream = SnapshotUpstream {
        name: "api.shop".into(),
        hosts: vec!["api".into()],
        endpoints: vec![SnapshotEndpoint {
            address: "127.0.0.1".into(),
            port: 1001,
            pod: None,
            zone: None,
        }],
        ..Default::default()
    };
    let policy = SnapshotPolicy {
        namespace: "shop".into(),
        name: "reads".into(),
        generation: 1,
        upstream: "api.shop".into(),
        rule: RetryRule::default(),
        precedence: 0,
        route: None,
    };
    let (tx, _) = watch::channel(0);
    let source = Arc::new(Source(
        Mutex::new(Snapshot::new(vec![upstream], vec![policy])),
        tx,
    ));
    let registry = Arc::new(SidecarRegistry::default());
    let auth = |_: &str, namespace: &str, pod: &str| {
        Ok(Identity {
            namespace: namespace.into(),
            pod: pod.into(),
            labels: BTreeMap::new(),
            capabilities: Default::default(),
        })
    };
    let server = PushServer::new(
        Arc::new(auth),
        source as Arc<dyn SnapshotSource>,
        Arc::clone(&registry),
        Arc::new(Metrics::default()),
        None,
        reprise_controller::telemetry::Tracing::off(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = reprise_controller::tls::server_config(&material).expect("tls");
    tokio::spawn(server.serve(listener, tls, std::future::pending()));

    // The pod: TLS, the upgrade, the first snapshot ACKed.
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(material.ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("CA");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("handshake");
    tokio::spawn(connection.with_upgrades());
    use reprise_crds::protocol::{self, CAPABILITIES_HEADER, NAMESPACE_HEADER, POD_HEADER};
    let mut request = http::Request::get(format!("https://localhost{}", protocol::SNAPSHOTS_PATH))
        .header("authorization", "Bearer hostile")
        .header(NAMESPACE_HEADER, "shop")
        .header(POD_HEADER, "hostile")
        .header(CAPABILITIES_HEADER, "tls,dns,delta")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    protocol::insert_upgrade_headers(request.headers_mut());
    let response = sender.send_request(request).await.expect("response");
    let io = hyper::upgrade::on(response).await.expect("upgrade");
    let (read, mut write) = tokio::io::split(hyper_util::rt::TokioIo::new(io));
    let mut reader = tokio::io::BufReader::new(read).lines();
    let first = reader.next_line().await.expect("read").expect("a line");
    let version = serde_json::from_str::<serde_json::Value>(&first).expect("json")["version"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    write
        .write_all(format!("{{\"version\":\"{version}\"}}\n").as_bytes())
        .await
        .expect("ack");
    tokio::spawn(async move { while let Ok(Some(_)) = reader.next_line().await {} });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Each line's names its own, as a pod making them up would send them.
    let line_of = |n: usize| {
        let names: Vec<String> = (0..2_500)
            .map(|i| format!("\"made_up_{n:05}_{i:04}\":1"))
            .collect();
        format!(
            "{{\"traffic\":{{\"shop/reads\":{{\"requests\":10,\"success\":10,\"exhausted\":{{{}}},\"latency\":[{}]}}}}}}\n",
            names.join(","),
            vec!["1"; 2_000].join(",")
        )
    };
    let (before, _) = rss();
    let size = line_of(0).len();
    println!(
        "{lines} lines of {size} bytes ({:.0} MiB), for at most {seconds} s",
        (lines * size) as f64 / 1048576.0
    );
    println!("RSS before: {before:.1} MiB");
    let started = Instant::now();
    let sending = tokio::spawn(async move {
        let mut sent = 0;
        for n in 0..lines {
            if write.write_all(line_of(n).as_bytes()).await.is_err() {
                break;
            }
            sent += 1;
        }
        (sent, started.elapsed())
    });
    let mut peak: f64 = 0.0;
    let deadline = started + Duration::from_secs(seconds);
    while !sending.is_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss().0);
    }
    let sent = if sending.is_finished() {
        let (sent, took) = sending.await.expect("sender");
        format!("all {sent} lines sent in {:.1} s", took.as_secs_f64())
    } else {
        sending.abort();
        format!(
            "still sending after {seconds} s (the server reads at its pace; TCP holds the pod back)"
        )
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let window = registry.traffic().window("shop/reads", now);
    let published = serde_json::to_string(&registry.traffic().all(now))
        .map(|s| s.len())
        .unwrap_or(0);
    let (after, hwm) = rss();
    println!("{sent}");
    println!("RSS while sending: peak {peak:.1} MiB; after: {after:.1} MiB (high-water mark {hwm:.1} MiB)");
    match window {
        Some(t) => println!(
            "the book for shop/reads: {} requests, {} exhausted names, {} latency buckets",
            t.counts.requests,
            t.counts.exhausted.len(),
            t.counts.latency.len()
        ),
        None => println!("the book for shop/reads: nothing"),
    }
    println!(
        "what this replica publishes of its traffic: {:.1} KiB",
        published as f64 / 1024.0
    );
}
