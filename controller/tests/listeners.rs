//! The controller binary's listeners as a pod in the cluster meets them
//! (issue 54's probes, run again): the metrics listener and the webhook,
//! with their timeouts set short by flags (a test of the real binary cannot
//! pause time). The binary runs against an API server that is not there:
//! the webhook and the metrics listener serve without one (the push
//! listener waits for its cache; `tests/push_hostile.rs` probes it in
//! process).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reprise_testkit::sidecar::free_addr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_reprise-controller");

/// The flags that hold the listeners to short limits.
const LIMITS: &[&str] = &[
    "--header-timeout=2s",
    "--idle-timeout=5s",
    "--metrics-max-connections=20",
    "--webhook-max-connections=10",
    "--webhook-max-pending-bodies=2",
    "--webhook-timeout=2s",
];

struct Controller {
    child: std::process::Child,
    metrics: SocketAddr,
    webhook: SocketAddr,
    dir: PathBuf,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The binary, its webhook and metrics listener on loopback, `flags` added.
async fn start(name: &str, flags: &[&str]) -> Controller {
    let dir = std::env::temp_dir().join(format!("reprise-listeners-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    // An API server that refuses every connection.
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .expect("kubeconfig");
    let injection = dir.join("injection.yaml");
    std::fs::write(
        &injection,
        "image: sidecar:test\ncontrollerAddress: https://c:15010\n",
    )
    .expect("injection config");
    let (push, metrics, webhook) = (free_addr(), free_addr(), free_addr());
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("run")
        .arg(format!("--push-addr={push}"))
        .arg(format!("--metrics-addr={metrics}"))
        .arg(format!("--webhook-addr={webhook}"))
        .arg(format!("--injection-config={}", injection.display()))
        .arg(format!("--tls-dir={}", dir.join("tls").display()))
        .args(flags)
        .env("KUBECONFIG", &kubeconfig)
        .env("REPRISE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = cmd.spawn().expect("the controller starts");
    let c = Controller {
        child,
        metrics,
        webhook,
        dir,
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let up = TcpStream::connect(c.metrics).await.is_ok()
            && TcpStream::connect(c.webhook).await.is_ok();
        if up {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the controller's listeners did not come up");
}

/// Whether `s` is closed by the other end within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// `GET path` on the metrics listener: the body.
async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await;
    out
}

/// The value of the metric line starting with `prefix`.
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn idle_metrics_connections_are_capped_and_closed() {
    let c = start("metrics", LIMITS).await;
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(TcpStream::connect(c.metrics).await.expect("connect"));
    }
    // Watched all at once: which of the 40 the listener took within its
    // cap depends on the order it accepted them in (and on the start's
    // probe connection, perhaps still held), not on the order they were
    // opened in; a busy machine delays both closings alike.
    let started = std::time::Instant::now();
    let closed: Vec<Option<Duration>> =
        futures_util::future::join_all(held.iter_mut().map(|s| async move {
            closed_within(s, Duration::from_secs(6))
                .await
                .then(|| started.elapsed())
        }))
        .await;
    // Over the cap: closed at once, well before the head's time (2 s).
    let refused = closed
        .iter()
        .filter(|t| t.is_some_and(|t| t < Duration::from_secs(1)))
        .count();
    // Within it: closed once they sent nothing for the head's time.
    let idle_closed = closed.iter().filter(|t| t.is_some()).count() - refused;
    println!("40 idle connections to the metrics listener with a cap of 20: {refused} closed at once, {idle_closed} after the head's time");
    assert!(
        (20..=21).contains(&refused),
        "connections over the cap are closed at once: {closed:?}"
    );
    assert_eq!(
        refused + idle_closed,
        40,
        "idle connections are closed: {closed:?}"
    );
    let text = get(c.metrics, "/metrics").await;
    // 20, and perhaps the start's probe connection, still held when they came.
    let over = metric(
        &text,
        "reprise_controller_listener_closed_total{listener=\"metrics\",reason=\"over_capacity\"} ",
    );
    assert!(over.is_some_and(|n| (20.0..=21.0).contains(&n)), "{text}");
}

/// A TLS client of the webhook's listener, trusting the controller's CA.
fn tls_client(dir: &Path) -> tokio_rustls::TlsConnector {
    use rustls_pki_types::pem::PemObject;
    let ca = std::fs::read(dir.join("tls/ca.crt")).expect("the generated CA");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
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
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[tokio::test]
async fn the_webhooks_unfinished_bodies_and_idle_connections_are_bounded() {
    let c = start("webhook", LIMITS).await;
    // Connections that never start TLS: closed after the head's time.
    let mut silent = TcpStream::connect(c.webhook).await.expect("connect");
    assert!(
        closed_within(&mut silent, Duration::from_secs(4)).await,
        "a connection without a TLS handshake is still open"
    );
    // Connections that complete TLS and send no request: closed too.
    let connector = tls_client(&c.dir);
    let mut quiet = Vec::new();
    for _ in 0..5 {
        let tcp = TcpStream::connect(c.webhook).await.expect("connect");
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
        quiet.push(connector.connect(name, tcp).await.expect("TLS"));
    }
    let mut quiet_closed = 0;
    for tls in &mut quiet {
        let mut buf = [0u8; 64];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_secs(4), tls.read(&mut buf)).await
        {
            quiet_closed += 1;
        }
    }
    println!(
        "5 TLS connections to the webhook sending no request: {quiet_closed} closed within 4 s"
    );
    assert_eq!(
        quiet_closed, 5,
        "TLS connections without a request stay open"
    );
    // Requests whose 3 MiB bodies never finish: answered or closed within
    // the webhook's timeout, each counted as an admission failed open.
    let mut unfinished = Vec::new();
    for _ in 0..6 {
        let tcp = TcpStream::connect(c.webhook).await.expect("connect");
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
        let mut tls = connector.connect(name, tcp).await.expect("TLS");
        tls.write_all(
            b"POST /inject HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3000000\r\n\r\n{\"apiVersion\":",
        )
        .await
        .expect("write");
        unfinished.push(tls);
    }
    let started = Instant::now();
    let mut answered = 0;
    for tls in &mut unfinished {
        let mut buf = [0u8; 512];
        let left = Duration::from_secs(6).saturating_sub(started.elapsed());
        if tokio::time::timeout(left, tls.read(&mut buf)).await.is_ok() {
            answered += 1;
        }
    }
    println!(
        "6 requests with unfinished 3 MiB bodies: {answered} answered or closed within {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(answered, 6, "unfinished bodies are held without end");
    let text = get(c.metrics, "/metrics").await;
    let failed_open = metric(
        &text,
        "reprise_controller_webhook_failed_open_total{reason=\"timeout\"} ",
    );
    assert_eq!(failed_open, Some(6.0), "{text}");
}
