//! The push server as a hostile pod meets it: the real server over loopback
//! TLS, the pod a raw client speaking the upgraded protocol, with fixed
//! identities instead of TokenReview (any `token-POD` is pod `shop/POD`).
//! Each test is one of the probes of issue 54, run again: what a pod sends
//! costs the controller a bounded amount, and what it reports is checked.
//!
//! The file uses only what the push server offered before the fix, so the
//! same tests ran against it (the failures are quoted in
//! `e2e/bench/results/2026-12-07-issue54-hostile.md`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reprise_controller::metrics::{Counter, Metrics};
use reprise_controller::push::{AuthError, Identity, PushServer, SnapshotSource};
use reprise_controller::sidecars::SidecarRegistry;
use reprise_crds::retry_rule::{Retries, RetryRule};
use reprise_crds::snapshot::{Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};

type Io = hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>;

struct Source {
    snapshot: Mutex<Snapshot>,
    tx: watch::Sender<u64>,
}

impl SnapshotSource for Source {
    fn snapshot_for(&self, _id: &Identity) -> Snapshot {
        self.snapshot.lock().expect("lock").clone()
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

impl Source {
    fn set(&self, s: Snapshot) {
        *self.snapshot.lock().expect("lock") = s;
        self.tx.send_modify(|n| *n += 1);
    }
}

fn snapshot(ports: &[u16]) -> Snapshot {
    let upstream = SnapshotUpstream {
        name: "api.shop".into(),
        hosts: vec!["api".into()],
        endpoints: ports
            .iter()
            .map(|p| SnapshotEndpoint {
                address: "127.0.0.1".into(),
                port: *p,
                pod: None,
                zone: None,
            })
            .collect(),
        ..Default::default()
    };
    Snapshot::new(
        vec![upstream],
        vec![SnapshotPolicy {
            namespace: "shop".into(),
            name: "reads".into(),
            generation: 1,
            upstream: "api.shop".into(),
            rule: RetryRule {
                retries: Retries {
                    attempts: 1,
                    ..Default::default()
                },
                ..RetryRule::default()
            },
            precedence: 0,
            route: None,
        }],
    )
}

struct Server {
    source: Arc<Source>,
    registry: Arc<SidecarRegistry>,
    metrics: Arc<Metrics>,
    addr: std::net::SocketAddr,
    ca_pem: String,
    /// Policies the push server told the reconciler about.
    synced: mpsc::UnboundedReceiver<String>,
    /// Token checks the server asked for.
    checks: Arc<AtomicU64>,
}

async fn server() -> Server {
    let material = reprise_controller::tls::generate(&["localhost".to_string()]).expect("certs");
    let (tx, _) = watch::channel(0);
    let source = Arc::new(Source {
        snapshot: Mutex::new(snapshot(&[1001])),
        tx,
    });
    let registry = Arc::new(SidecarRegistry::default());
    let metrics = Arc::new(Metrics::default());
    let (sync_tx, synced) = mpsc::unbounded_channel();
    let checks = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&checks);
    let auth = move |token: &str, namespace: &str, pod: &str| {
        counted.fetch_add(1, Ordering::Relaxed);
        match token.strip_prefix("token-") {
            Some(p) if p == pod && namespace == "shop" => Ok(Identity {
                namespace: namespace.into(),
                pod: pod.into(),
                labels: BTreeMap::new(),
                capabilities: Default::default(),
            }),
            _ => Err(AuthError::Rejected("unknown token".into())),
        }
    };
    let server = PushServer::new(
        Arc::new(auth),
        Arc::clone(&source) as Arc<dyn SnapshotSource>,
        Arc::clone(&registry),
        Arc::clone(&metrics),
        Some(sync_tx),
        reprise_controller::telemetry::Tracing::off(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = reprise_controller::tls::server_config(&material).expect("tls config");
    tokio::spawn(server.serve(listener, tls, std::future::pending()));
    Server {
        source,
        registry,
        metrics,
        addr,
        ca_pem: material.ca_pem,
        synced,
        checks,
    }
}

async fn tls_connect(s: &Server) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(s.ca_pem.as_bytes()) {
        roots.add(cert.expect("CA pem")).expect("CA");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS")
}

/// A GET /v1/snapshots as pod `shop/POD` sends it with `token`.
fn request(
    pod: &str,
    token: &str,
    capabilities: &str,
) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    use reprise_crds::protocol::{self, CAPABILITIES_HEADER, NAMESPACE_HEADER, POD_HEADER};
    let mut r = http::Request::get(format!("https://localhost{}", protocol::SNAPSHOTS_PATH))
        .header("authorization", format!("Bearer {token}"))
        .header(NAMESPACE_HEADER, "shop")
        .header(POD_HEADER, pod)
        .header(CAPABILITIES_HEADER, capabilities)
        .body(http_body_util::Empty::new())
        .expect("request");
    protocol::insert_upgrade_headers(r.headers_mut());
    r
}

/// A hostile pod's upgraded stream: the lines it reads, where it writes.
struct Stream {
    lines: Lines<BufReader<ReadHalf<Io>>>,
    write: WriteHalf<Io>,
}

impl Stream {
    async fn line(&mut self) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(5), self.lines.next_line())
            .await
            .ok()?
            .ok()?
    }

    async fn send(&mut self, line: &str) -> bool {
        self.write.write_all(line.as_bytes()).await.is_ok()
            && self.write.write_all(b"\n").await.is_ok()
    }
}

/// Pod `shop/POD`'s stream, announcing `capabilities`.
async fn open(s: &Server, pod: &str, capabilities: &str) -> Stream {
    let tls = tls_connect(s).await;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("handshake");
    tokio::spawn(connection.with_upgrades());
    let response = sender
        .send_request(request(pod, &format!("token-{pod}"), capabilities))
        .await
        .expect("response");
    assert_eq!(response.status(), 101);
    let io = hyper::upgrade::on(response).await.expect("upgrade");
    let (read, write) = tokio::io::split(hyper_util::rt::TokioIo::new(io));
    Stream {
        lines: BufReader::new(read).lines(),
        write,
    }
}

/// The version of the first line (a whole snapshot).
fn version(line: &str) -> String {
    let s: serde_json::Value = serde_json::from_str(line).expect("json");
    s["version"].as_str().expect("a version").to_string()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

/// One report line for `shop/reads`, its counts as given (JSON).
fn report(counts: &str) -> String {
    format!(r#"{{"traffic":{{"shop/reads":{counts}}}}}"#)
}

#[tokio::test]
async fn a_flood_of_reports_is_checked_paced_and_bounded_in_the_book() {
    let s = server().await;
    let mut pod = open(&s, "client-a", "tls,dns,delta").await;
    let first = pod.line().await.expect("the snapshot");
    assert!(
        pod.send(&format!(r#"{{"version":"{}"}}"#, version(&first)))
            .await
    );
    // Three kinds of lines, as the probe sent them: made-up names and a
    // latency list of any length; counts that overflow and contradict each
    // other; and plausible counts, 300 lines in all.
    let junk_names: Vec<String> = (0..2_000).map(|i| format!(r#""made_up_{i}":1"#)).collect();
    let junk = report(&format!(
        r#"{{"requests":10,"success":10,"exhausted":{{{}}},"latency":[{}]}}"#,
        junk_names.join(","),
        vec!["1"; 4_000].join(",")
    ));
    let overflow = report(&format!(
        r#"{{"requests":{},"success":{},"firstTrySuccess":{}}}"#,
        u64::MAX / 2,
        u64::MAX,
        u64::MAX
    ));
    let plausible = report(r#"{"requests":1000,"success":990,"firstTrySuccess":900}"#);
    assert!(junk.len() < 64 * 1024, "{}", junk.len());
    let flood = tokio::spawn(async move {
        for i in 0..300 {
            let line = match i % 3 {
                0 => &junk,
                1 => &overflow,
                _ => &plausible,
            };
            if !pod.send(line).await {
                break;
            }
        }
        pod
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = s
        .registry
        .traffic()
        .window("shop/reads", now())
        .expect("something was recorded");
    let status = reprise_controller::traffic::status(&t, "now".into());
    println!(
        "after 2 s: {} exhausted keys, {} latency buckets, {} requests, effectiveSuccess {}",
        t.counts.exhausted.len(),
        t.counts.latency.len(),
        t.counts.requests,
        status.effective_success
    );
    assert!(
        // The five exhaustion reasons sidecars name.
        t.counts.exhausted.len() <= 5,
        "only the sidecars' names are kept: {} exhausted keys",
        t.counts.exhausted.len()
    );
    assert!(
        t.counts.latency.len() <= 16,
        "{} latency buckets",
        t.counts.latency.len()
    );
    assert!(
        t.counts.success <= t.counts.requests,
        "success {} of {}",
        t.counts.success,
        t.counts.requests
    );
    let percent: f64 = status
        .effective_success
        .trim_end_matches('%')
        .parse()
        .expect("a percentage");
    assert!(
        percent <= 100.0,
        "effectiveSuccess {}",
        status.effective_success
    );
    // One report an interval, after a burst of three: at most four
    // plausible reports' requests within the 2 s.
    assert!(
        t.counts.requests <= 4 * 1_000,
        "{} requests recorded",
        t.counts.requests
    );
    let text = s.metrics.render(&s.registry, None);
    let refused = |result: &str| {
        text.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "reprise_controller_traffic_reports_total{{result=\"{result}\"}} "
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        refused("invalid") > 0,
        "refused reports are counted: {text}"
    );
    drop(flood);
}

#[tokio::test]
async fn the_same_ack_ten_thousand_times_notifies_the_reconciler_once() {
    let mut s = server().await;
    let mut pod = open(&s, "client-a", "tls,dns,delta").await;
    let first = pod.line().await.expect("the snapshot");
    let ack = format!(r#"{{"version":"{}"}}"#, version(&first));
    let acks = tokio::spawn(async move {
        for _ in 0..10_000 {
            if !pod.send(&ack).await {
                break;
            }
        }
        pod
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut notified = 0;
    while s.synced.try_recv().is_ok() {
        notified += 1;
    }
    println!("10,000 ACKs of one version: {notified} reconcile notifications");
    assert_eq!(
        notified, 1,
        "one ACK changed what the pod runs; the others nothing"
    );
    drop(acks);
}

#[tokio::test]
async fn capabilities_a_controller_does_not_know_make_no_group_of_their_own() {
    let s = server().await;
    let mut pods = Vec::new();
    for i in 0..20 {
        let mut pod = open(&s, &format!("client-{i}"), &format!("tls,dns,delta,x{i}")).await;
        pod.line().await.expect("the snapshot");
        pods.push(pod);
    }
    let before = s.metrics.get(Counter::SnapshotComputations);
    s.source.set(snapshot(&[1001, 1002]));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let computed = s.metrics.get(Counter::SnapshotComputations) - before;
    println!("20 pods announcing x0..x19: {computed} group snapshots computed for one change");
    assert_eq!(
        computed, 1,
        "alike pods share one group whatever they announce"
    );
}

#[tokio::test]
async fn a_pods_new_stream_closes_its_older_one() {
    let s = server().await;
    let mut older = Vec::new();
    for _ in 0..5 {
        let mut pod = open(&s, "client-a", "tls,dns,delta").await;
        pod.line().await.expect("the snapshot");
        older.push(pod);
    }
    let newest = older.pop().expect("five");
    for (i, pod) in older.iter_mut().enumerate() {
        let ended = tokio::time::timeout(Duration::from_secs(3), async {
            while pod.lines.next_line().await.ok().flatten().is_some() {}
        })
        .await;
        assert!(
            ended.is_ok(),
            "stream {i} of the pod is still open after its reconnect"
        );
    }
    assert_eq!(s.registry.connected(), 1);
    drop(newest);
}

#[tokio::test]
async fn asking_for_the_whole_snapshot_again_and_again_gets_it_once_an_interval() {
    let s = server().await;
    let mut pod = open(&s, "client-a", "tls,dns,delta").await;
    let started = tokio::time::Instant::now();
    // Every line answered with a resync, for two seconds.
    while started.elapsed() < Duration::from_secs(2) {
        let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_millis(500), pod.lines.next_line())
                .await
                .map(|l| l.ok().flatten())
        else {
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        let resync = format!(
            r#"{{"resync":{{"version":"{}","reason":"lost"}}}}"#,
            version(&line)
        );
        if !pod.send(&resync).await {
            break;
        }
    }
    let pushes = s.metrics.get(Counter::Pushes);
    println!("resyncs for 2 s: {pushes} whole snapshots pushed");
    assert!(pushes <= 2, "{pushes} whole snapshots in 2 s");
}

#[tokio::test]
async fn a_nack_of_any_length_is_kept_cut() {
    let s = server().await;
    let mut pod = open(&s, "client-a", "tls,dns,delta").await;
    let first = pod.line().await.expect("the snapshot");
    let nack = format!(
        r#"{{"version":"{}","error":"\u001b[2J{}"}}"#,
        version(&first),
        "x".repeat(60_000)
    );
    assert!(pod.send(&nack).await);
    let mut kept = None;
    for _ in 0..100 {
        kept = s.registry.get("shop", "client-a").and_then(|p| p.nack);
        if kept.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kept = kept.expect("the NACK recorded");
    println!("a 60 KB NACK: {} bytes kept", kept.len());
    assert!(kept.len() <= 4_096 + 64, "{} bytes kept", kept.len());
    assert!(!kept.contains('\u{1b}'), "control characters escaped");
}

#[tokio::test]
async fn junk_tokens_cost_a_burst_of_token_checks_per_source_then_none() {
    let s = server().await;
    let tls = tls_connect(&s).await;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let mut statuses = BTreeMap::new();
    for i in 0..200 {
        let Ok(response) = sender
            .send_request(request("client-a", &format!("junk-{i}"), ""))
            .await
        else {
            break;
        };
        *statuses.entry(response.status().as_u16()).or_insert(0) += 1;
    }
    let checks = s.checks.load(Ordering::Relaxed);
    println!("200 junk tokens: {checks} token checks, answers {statuses:?}");
    assert!(
        checks <= 12,
        "{checks} token checks for 200 junk tokens from one address"
    );
    assert!(
        statuses.get(&429).copied().unwrap_or(0) > 150,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn a_push_connection_that_says_nothing_is_closed() {
    let s = server().await;
    let mut silent = tls_connect(&s).await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::io::AsyncReadExt::read(&mut silent, &mut buf),
    )
    .await;
    println!("a TLS connection that sends no request: {read:?}");
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "still open after 15 s without a request"
    );
}
