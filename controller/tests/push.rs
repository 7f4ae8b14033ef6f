//! The push protocol over loopback TLS: the real push server and the real
//! sidecar subscription, with fixed identities instead of TokenReview (the API
//! server's part is covered end to end).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reprise_controller::metrics::{Counter, Metrics};
use reprise_controller::push::{AuthError, Identity, PushServer, SnapshotSource};
use reprise_controller::sidecars::SidecarRegistry;
use reprise_crds::retry_rule::{Retries, RetryRule};
use reprise_crds::snapshot::{
    Entries, Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream,
};
use reprise_sidecar::config::{Subscription, TrustedCa};
use reprise_sidecar::Proxy;
use tokio::sync::watch;

/// The one token the tests know: `token-a`, for `shop/client-a`.
fn fixed_token(token: &str, namespace: &str, pod: &str) -> Result<Identity, AuthError> {
    match token {
        "token-a" if (namespace, pod) == ("shop", "client-a") => Ok(Identity {
            namespace: namespace.into(),
            pod: pod.into(),
            labels: BTreeMap::new(),
            capabilities: Default::default(),
        }),
        "token-a" => Err(AuthError::WrongPod(format!("{namespace}/{pod}"))),
        _ => Err(AuthError::Rejected("unknown token".into())),
    }
}

struct Source {
    snapshot: Mutex<Snapshot>,
    tx: watch::Sender<u64>,
}

impl Source {
    fn set(&self, s: Snapshot) {
        *self.snapshot.lock().expect("lock") = s;
        self.tx.send_modify(|n| *n += 1);
    }
}

impl SnapshotSource for Source {
    fn snapshot_for(&self, _id: &Identity) -> Snapshot {
        self.snapshot.lock().expect("lock").clone()
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

fn snapshot(ports: &[u16], attempts: i32) -> Snapshot {
    let upstream = SnapshotUpstream {
        name: "api.shop".into(),
        hosts: vec!["api".into()],
        protocol: Default::default(),
        addresses: vec![],
        endpoints: ports
            .iter()
            .map(|p| SnapshotEndpoint {
                address: "127.0.0.1".into(),
                port: *p,
                pod: Some(format!("api-{p}")),
                zone: None,
            })
            .collect(),
        ..Default::default()
    };
    let rule = RetryRule {
        retries: Retries {
            attempts,
            ..Default::default()
        },
        ..RetryRule::default()
    };
    Snapshot::new(
        vec![upstream],
        vec![SnapshotPolicy {
            namespace: "shop".into(),
            name: "reads".into(),
            generation: 1,
            upstream: "api.shop".into(),
            rule,
            precedence: 0,
            route: None,
        }],
    )
}

struct Harness {
    source: Arc<Source>,
    registry: Arc<SidecarRegistry>,
    metrics: Arc<Metrics>,
    subscription: Subscription,
    /// The push server's address.
    addr: std::net::SocketAddr,
    /// The CA its certificate is issued by.
    ca_pem: String,
}

async fn harness(name: &str) -> Harness {
    let dir = std::env::temp_dir().join(format!("reprise-push-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let material = reprise_controller::tls::generate(&["localhost".to_string()]).expect("certs");
    std::fs::write(dir.join("ca.crt"), &material.ca_pem).expect("ca");
    std::fs::write(dir.join("token"), "token-a\n").expect("token");
    let _ = std::fs::remove_file(dir.join("snapshot.json"));
    let (tx, _) = watch::channel(0);
    let source = Arc::new(Source {
        snapshot: Mutex::new(snapshot(&[1001], 1)),
        tx,
    });
    // The sidecar reports every 100 ms here: the controller paces reports so.
    let registry = Arc::new(SidecarRegistry::with_report_interval(
        Duration::from_millis(100),
    ));
    let metrics = Arc::new(Metrics::default());
    let server = PushServer::new(
        Arc::new(fixed_token),
        Arc::clone(&source) as Arc<dyn SnapshotSource>,
        Arc::clone(&registry),
        Arc::clone(&metrics),
        None,
        reprise_controller::telemetry::Tracing::off(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = reprise_controller::tls::server_config(&material).expect("tls config");
    tokio::spawn(server.serve(listener, tls, std::future::pending()));
    let subscription = Subscription {
        controller: format!("https://127.0.0.1:{}", addr.port())
            .parse()
            .expect("uri"),
        server_name: Some("localhost".into()),
        pod: "client-a".into(),
        namespace: "shop".into(),
        token_path: dir.join("token"),
        ca: TrustedCa::File(dir.join("ca.crt")),
        snapshot_path: dir.join("snapshot.json"),
        address_map: None,
        report_every: Duration::from_millis(100),
        diagnostics_retained: None,
        deadlines: reprise_crds::policy::DeadlinePolicy::ON,
    };
    Harness {
        source,
        registry,
        metrics,
        subscription,
        addr,
        ca_pem: material.ca_pem,
    }
}

fn empty_proxy() -> Arc<Proxy> {
    let proxy = Proxy::new(Snapshot::new(vec![], vec![]).resolve().expect("empty"));
    proxy.set_ready(false);
    proxy
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..100 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn endpoint_ports(proxy: &Proxy) -> Vec<u16> {
    proxy
        .config()
        .upstreams
        .iter()
        .flat_map(|u| u.endpoints.iter().map(|e| e.addr.port()))
        .collect()
}

#[tokio::test]
async fn snapshots_are_pushed_acked_nacked_and_resumed() {
    let h = harness("flow").await;
    let proxy = empty_proxy();
    let task = tokio::spawn(h.subscription.clone().run(Arc::clone(&proxy), None));

    // First snapshot: applied, ACKed, saved.
    let v1 = snapshot_version(&h);
    eventually("first snapshot applied and ACKed", || {
        h.registry.get("shop", "client-a").and_then(|s| s.acked) == Some(v1.clone())
    })
    .await;
    assert_eq!(endpoint_ports(&proxy), vec![1001]);
    assert!(proxy.is_ready());
    assert!(
        proxy.stats("api").is_some(),
        "the Service's short name routes"
    );
    assert!(
        h.subscription.snapshot_path.exists(),
        "the last good snapshot is on disk"
    );

    // A change is pushed without polling.
    h.source.set(snapshot(&[1001, 1002], 1));
    eventually("second snapshot applied", || {
        endpoint_ports(&proxy) == vec![1001, 1002]
    })
    .await;
    let v2 = snapshot_version(&h);
    eventually("second snapshot ACKed", || {
        h.registry.get("shop", "client-a").and_then(|s| s.acked) == Some(v2.clone())
    })
    .await;

    // An invalid snapshot is NACKed with the field named; the running config stays.
    h.source.set(snapshot(&[1003], 11));
    eventually("NACK recorded", || {
        h.registry
            .get("shop", "client-a")
            .and_then(|s| s.nack)
            .is_some()
    })
    .await;
    let nack = h
        .registry
        .get("shop", "client-a")
        .and_then(|s| s.nack)
        .expect("nack");
    assert!(
        nack.contains("shop/reads: spec.retries.attempts: must be in 0..=10 (got 11)"),
        "{nack}"
    );
    assert_eq!(
        endpoint_ports(&proxy),
        vec![1001, 1002],
        "the last good config keeps serving"
    );
    assert_eq!(h.metrics.get(Counter::Nacks), 1);
    let saved: Snapshot =
        serde_json::from_slice(&std::fs::read(&h.subscription.snapshot_path).expect("saved"))
            .expect("json");
    assert_eq!(saved.version, v2, "a refused snapshot is never saved");

    // Reconnect with the version already running: in sync without a push.
    task.abort();
    h.source.set(snapshot(&[1001, 1002], 1));
    eventually("old connection gone", || {
        h.registry.get("shop", "client-a").is_none()
    })
    .await;
    let pushes = h.metrics.get(Counter::Pushes);
    let task = tokio::spawn(
        h.subscription
            .clone()
            .run(Arc::clone(&proxy), Some(v2.clone())),
    );
    eventually("resumed in sync", || {
        h.registry.get("shop", "client-a").and_then(|s| s.acked) == Some(v2.clone())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        h.metrics.get(Counter::Pushes),
        pushes,
        "nothing re-sent on resume"
    );
    task.abort();
}

/// `snapshot`'s policy retrying 503s once, over `ports`.
fn retrying_503(ports: &[u16]) -> Snapshot {
    let mut s = snapshot(ports, 1);
    let rule = &mut s.policies[0].rule;
    rule.statuses = vec![503];
    rule.acknowledge_duplicate_risk = true;
    Snapshot::new(s.upstreams, s.policies)
}

#[tokio::test]
async fn a_sidecar_reports_its_policies_traffic_and_the_controller_adds_it_up() {
    use reprise_testkit::upstream::{Action, Upstream};
    let h = harness("traffic").await;
    let bad = Upstream::always(Action::Reply(503)).await;
    let good = Upstream::always(Action::Reply(200)).await;
    h.source
        .set(retrying_503(&[bad.addr.port(), good.addr.port()]));
    let proxy = empty_proxy();
    let task = tokio::spawn(h.subscription.clone().run(Arc::clone(&proxy), None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = tokio::spawn(reprise_sidecar::serve_proxy(
        listener,
        Arc::clone(&proxy),
        std::future::pending(),
    ));
    eventually("snapshot applied", || endpoint_ports(&proxy).len() == 2).await;
    for _ in 0..20 {
        let r = reprise_testkit::client::send(addr, "GET", "api", "/", b"", &[]).await;
        assert_eq!(r.status, 200);
    }
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64
    };
    eventually("the 20 requests reported", || {
        h.registry
            .traffic()
            .window("shop/reads", now())
            .is_some_and(|t| t.counts.requests == 20)
    })
    .await;
    let t = h
        .registry
        .traffic()
        .window("shop/reads", now())
        .expect("reported");
    // Every request that met the 503 endpoint first was recovered on the other.
    assert_eq!(t.counts.recovered, bad.count() as u64);
    assert_eq!(t.counts.retries, bad.count() as u64);
    assert_eq!(t.counts.success, 20);
    assert_eq!(t.counts.first_try_success, 20 - bad.count() as u64);
    assert_eq!(t.sidecars, 1);
    let status = reprise_controller::traffic::status(&t, "now".into());
    assert_eq!(status.effective_success, "100.00%");
    task.abort();
    serving.abort();
}

#[tokio::test]
async fn a_sidecar_restarts_from_its_saved_snapshot() {
    let h = harness("restart").await;
    let proxy = empty_proxy();
    let task = tokio::spawn(h.subscription.clone().run(Arc::clone(&proxy), None));
    eventually("applied", || endpoint_ports(&proxy) == vec![1001]).await;
    task.abort();
    let (snapshot, config) = h.subscription.load_saved().expect("saved snapshot loads");
    assert_eq!(config.upstreams[0].endpoints[0].addr.port(), 1001);
    assert_eq!(snapshot.version, snapshot_version(&h));

    // A corrupt file is ignored, not trusted.
    std::fs::write(&h.subscription.snapshot_path, b"{ not json").expect("corrupt");
    assert!(h.subscription.load_saved().is_none());
}

/// The version of the snapshot the source serves now, as sidecars that
/// take deltas are sent it (the whole snapshot's content hash for others).
fn snapshot_version(h: &Harness) -> String {
    Entries::from_snapshot(h.source.snapshot.lock().expect("lock").clone()).version()
}

#[tokio::test]
async fn a_change_is_pushed_as_a_delta_of_what_changed() {
    let h = harness("delta").await;
    let proxy = empty_proxy();
    let task = tokio::spawn(h.subscription.clone().run(Arc::clone(&proxy), None));
    eventually("first snapshot applied", || {
        endpoint_ports(&proxy) == vec![1001]
    })
    .await;
    let first_bytes = h.metrics.get(Counter::PushBytes);

    // Ten more endpoints: the whole snapshot grows, the next delta does not.
    let ports: Vec<u16> = (1001..=1011).collect();
    h.source.set(snapshot(&ports, 1));
    eventually("the endpoints added", || endpoint_ports(&proxy) == ports).await;
    let mut fewer = ports.clone();
    fewer.retain(|p| *p != 1005);
    fewer.push(1012);
    h.source.set(snapshot(&fewer, 1));
    eventually("one endpoint replaced", || endpoint_ports(&proxy) == fewer).await;
    let v = snapshot_version(&h);
    eventually("ACKed", || {
        h.registry.get("shop", "client-a").and_then(|s| s.acked) == Some(v.clone())
    })
    .await;
    assert_eq!(h.metrics.get(Counter::Pushes), 3);
    assert_eq!(h.metrics.get(Counter::DeltaPushes), 2);
    let whole = serde_json::to_vec(&snapshot(&fewer, 1))
        .expect("json")
        .len() as u64;
    let bytes = h.metrics.get(Counter::PushBytes);
    let last_delta = bytes - first_bytes;
    assert!(
        last_delta < whole,
        "two deltas ({last_delta} bytes) cost less than one whole snapshot ({whole})"
    );
    // What was applied from deltas is kept whole on disk, within a second.
    eventually("the last delta's result saved", || {
        h.subscription
            .load_saved()
            .is_some_and(|(saved, _)| saved.version == v)
    })
    .await;
    let (saved, _) = h.subscription.load_saved().expect("saved");
    assert_eq!(saved.upstreams[0].endpoints.len(), fewer.len());
    task.abort();
}

#[tokio::test]
async fn a_sidecar_without_the_snapshot_a_delta_starts_from_asks_for_it_whole() {
    let h = harness("resync").await;
    let proxy = empty_proxy();
    // It resumes the current version without its entries (as if it had
    // lost them): the controller sends nothing until a change, then a delta
    // it cannot apply.
    let v1 = snapshot_version(&h);
    let task = tokio::spawn(
        h.subscription
            .clone()
            .run(Arc::clone(&proxy), Some(v1.clone())),
    );
    eventually("resumed in sync", || {
        h.registry.get("shop", "client-a").and_then(|s| s.acked) == Some(v1.clone())
    })
    .await;
    assert_eq!(h.metrics.get(Counter::Pushes), 0);
    h.source.set(snapshot(&[1001, 1002], 1));
    let v2 = snapshot_version(&h);
    eventually("the whole snapshot applied and ACKed", || {
        h.registry.get("shop", "client-a").and_then(|s| s.acked) == Some(v2.clone())
    })
    .await;
    assert_eq!(endpoint_ports(&proxy), vec![1001, 1002]);
    assert_eq!(
        h.metrics.get(Counter::Pushes),
        2,
        "the delta, then the whole"
    );
    assert_eq!(h.metrics.get(Counter::DeltaPushes), 1);
    // And deltas flow again from there.
    h.source.set(snapshot(&[1002], 1));
    eventually("the next change applied", || {
        endpoint_ports(&proxy) == vec![1002]
    })
    .await;
    assert_eq!(h.metrics.get(Counter::DeltaPushes), 2);
    task.abort();
}

#[tokio::test]
async fn unknown_tokens_and_other_pods_are_refused() {
    let h = harness("auth").await;
    let proxy = empty_proxy();
    let mut version = reprise_sidecar::config::Running::default();
    let mut wrong_token = h.subscription.clone();
    let token = std::env::temp_dir().join(format!(
        "reprise-push-{}-auth/bad-token",
        std::process::id()
    ));
    std::fs::write(&token, "forged").expect("token");
    wrong_token.token_path = token;
    match wrong_token.session(&proxy, &mut version).await {
        Err(reprise_sidecar::Error::Refused { status, message }) => {
            assert_eq!(status, 403);
            assert!(message.contains("unknown token"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let mut other_pod = h.subscription.clone();
    other_pod.pod = "client-b".into();
    match other_pod.session(&proxy, &mut version).await {
        Err(reprise_sidecar::Error::Refused { status, .. }) => assert_eq!(status, 403),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(h.registry.connected(), 0);
    assert!(!proxy.is_ready(), "nothing was applied");
}

/// The `reprise_controller_connected_sidecars` sample the metrics endpoint shows.
fn connected_gauge(h: &Harness) -> String {
    h.metrics
        .render(&h.registry, None)
        .lines()
        .find(|l| l.starts_with("reprise_controller_connected_sidecars "))
        .unwrap_or_default()
        .to_string()
}

/// A TLS connection to the harness's push server, offering `alpn`.
async fn tls_connect(
    h: &Harness,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(h.ca_pem.as_bytes()) {
        roots.add(cert.expect("CA pem")).expect("CA");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(h.addr)
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS")
}

/// `GET /v1/snapshots` without the upgrade: the snapshots come as a streamed body.
fn snapshot_request() -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    use reprise_crds::protocol::{NAMESPACE_HEADER, POD_HEADER, SNAPSHOTS_PATH};
    http::Request::get(format!("https://localhost{SNAPSHOTS_PATH}"))
        .header("authorization", "Bearer token-a")
        .header(NAMESPACE_HEADER, "shop")
        .header(POD_HEADER, "client-a")
        .body(http_body_util::Empty::new())
        .expect("request")
}

/// Reads the first line of the streamed `response`, the current snapshot,
/// checks that the sidecar now counts as connected, and returns the rest.
async fn read_first_snapshot(
    h: &Harness,
    response: impl std::future::Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>,
) -> hyper::body::Incoming {
    use http_body_util::BodyExt;
    let mut body = response.await.expect("response").into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert!(
        first.data_ref().is_some_and(|d| d.ends_with(b"\n")),
        "the current snapshot comes first"
    );
    // A sidecar that announces no capability (an older one) gets whole
    // snapshots versioned as it checks them.
    let snapshot: Snapshot =
        serde_json::from_slice(first.data_ref().expect("data")).expect("a whole snapshot");
    assert_eq!(snapshot.version, snapshot.content_hash());
    assert_eq!(
        connected_gauge(h),
        "reprise_controller_connected_sidecars 1"
    );
    body
}

/// Waits until the connected-sidecars gauge is back to 0.
async fn until_disconnected(h: &Harness) {
    eventually("the gauge is back to 0", || {
        connected_gauge(h) == "reprise_controller_connected_sidecars 0"
    })
    .await;
}

#[tokio::test]
async fn an_upgraded_stream_dropped_mid_way_leaves_no_connected_sidecar() {
    let h = harness("drop-upgraded").await;
    assert_eq!(
        connected_gauge(&h),
        "reprise_controller_connected_sidecars 0"
    );
    let proxy = empty_proxy();
    let task = tokio::spawn(h.subscription.clone().run(Arc::clone(&proxy), None));
    eventually("connected and applied", || {
        endpoint_ports(&proxy) == vec![1001]
    })
    .await;
    assert_eq!(
        connected_gauge(&h),
        "reprise_controller_connected_sidecars 1"
    );
    // The sidecar's task is aborted mid-stream: its connection just goes away.
    task.abort();
    until_disconnected(&h).await;
    assert!(h.registry.get("shop", "client-a").is_none());
}

#[tokio::test]
async fn a_streamed_body_reset_mid_way_leaves_no_connected_sidecar() {
    let h = harness("drop-h2").await;
    let tls = tls_connect(&h, b"h2").await;
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .expect("h2 handshake");
    let connection = tokio::spawn(connection);
    let body = read_first_snapshot(&h, sender.send_request(snapshot_request())).await;
    // Resetting the stream (dropping its body) keeps the HTTP/2 connection open.
    drop(body);
    until_disconnected(&h).await;
    assert!(
        !connection.is_finished(),
        "the connection itself stays open"
    );
    drop(sender);
}

#[tokio::test]
async fn a_streamed_body_whose_connection_closes_leaves_no_connected_sidecar() {
    let h = harness("drop-h1").await;
    let tls = tls_connect(&h, b"http/1.1").await;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("http/1.1 handshake");
    let connection = tokio::spawn(connection);
    let body = read_first_snapshot(&h, sender.send_request(snapshot_request())).await;
    connection.abort();
    drop((body, sender));
    until_disconnected(&h).await;
}

/// The harness's snapshot with a second upstream, `pay.shop`, that needs
/// TLS (its CA bundle `ca_pem`) and, when `dns`, a DNS-named endpoint, and a
/// policy for it.
fn with_tls_upstream(ports: &[u16], ca_pem: &str, dns: bool) -> Snapshot {
    let base = snapshot(ports, 1);
    let pay = SnapshotUpstream {
        name: "pay.shop".into(),
        hosts: vec!["pay".into()],
        endpoints: vec![SnapshotEndpoint {
            address: "127.0.0.1".into(),
            port: 1443,
            pod: None,
            zone: None,
        }],
        dns: if dns {
            vec![reprise_crds::snapshot::SnapshotDnsEndpoint {
                host: "api.payments.example".into(),
                port: 443,
            }]
        } else {
            Vec::new()
        },
        tls: Some(reprise_crds::snapshot::SnapshotTls {
            server_name: "api.payments.example".into(),
            ca_certificates: Some(ca_pem.to_string()),
            subject_alt_names: Vec::new(),
        }),
        ..Default::default()
    };
    let mut policies = base.policies.clone();
    policies.push(SnapshotPolicy {
        namespace: "shop".into(),
        name: "pays".into(),
        generation: 1,
        upstream: "pay.shop".into(),
        rule: RetryRule::default(),
        precedence: 0,
        route: None,
    });
    let mut upstreams = base.upstreams.clone();
    upstreams.push(pay);
    Snapshot::new(upstreams, policies)
}

#[tokio::test]
async fn upstreams_over_tls_reach_only_sidecars_that_announce_tls() {
    let h = harness("capabilities").await;
    h.source.set(with_tls_upstream(&[1001], &h.ca_pem, true));
    // A sidecar from before TLS (no capabilities announced): the TLS upstream
    // and its policy are left out, the rest comes as before.
    let tls = tls_connect(&h, b"h2").await;
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .expect("h2 handshake");
    let connection = tokio::spawn(connection);
    let response = sender
        .send_request(snapshot_request())
        .await
        .expect("response");
    let first = {
        use http_body_util::BodyExt;
        let mut body = response.into_body();
        let frame = body.frame().await.expect("a frame").expect("data");
        frame.into_data().expect("data")
    };
    let old: Snapshot = serde_json::from_slice(&first).expect("a snapshot");
    let names = |s: &Snapshot| -> (Vec<String>, Vec<String>) {
        (
            s.upstreams.iter().map(|u| u.name.clone()).collect(),
            s.policies.iter().map(|p| p.name.clone()).collect(),
        )
    };
    assert_eq!(
        names(&old),
        (vec!["api.shop".to_string()], vec!["reads".to_string()])
    );
    assert!(old.resolve().is_ok(), "what is left is whole");
    drop(sender);
    connection.abort();

    // This sidecar announces TLS: it runs the upstream with its CA bundle
    // (without the DNS name, which the test does not resolve).
    h.source.set(with_tls_upstream(&[1001], &h.ca_pem, false));
    let proxy = empty_proxy();
    let task = tokio::spawn(h.subscription.clone().run(Arc::clone(&proxy), None));
    eventually("the TLS upstream is applied", || {
        proxy.stats("pay.shop").is_some()
    })
    .await;
    let config = proxy.config();
    let pay = config
        .upstreams
        .iter()
        .find(|u| u.name == "pay.shop")
        .expect("pay.shop");
    let tls = pay.tls.as_ref().expect("its TLS");
    assert_eq!(tls.server_name, "api.payments.example");
    assert!(
        matches!(&tls.trust, reprise_crds::config::TrustAnchors::Bundle(b) if b.certs.len() == 1),
        "the CA bundle from the snapshot"
    );
    task.abort();
}

#[tokio::test]
async fn changes_while_a_push_awaits_its_ack_are_one_delta_after_it() {
    use reprise_crds::protocol::{self, CAPABILITIES_HEADER};
    use reprise_crds::snapshot::DeltaLine;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let h = harness("one-at-a-time").await;
    let tls = tls_connect(&h, b"http/1.1").await;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("http/1.1 handshake");
    tokio::spawn(connection.with_upgrades());
    let mut request = snapshot_request();
    protocol::insert_upgrade_headers(request.headers_mut());
    request.headers_mut().insert(
        CAPABILITIES_HEADER,
        http::HeaderValue::from_static("tls,dns,delta"),
    );
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status(), 101);
    let io = hyper::upgrade::on(response).await.expect("upgrade");
    let (read, mut write) = tokio::io::split(hyper_util::rt::TokioIo::new(io));
    let mut lines = tokio::io::BufReader::new(read).lines();
    let first: Snapshot =
        serde_json::from_str(&lines.next_line().await.expect("read").expect("line"))
            .expect("whole");
    // Three changes, the first push not yet answered: nothing more comes.
    for ports in [[1001, 1002], [1001, 1003], [1001, 1004]] {
        h.source.set(snapshot(&ports, 1));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let early = tokio::time::timeout(Duration::from_millis(300), lines.next_line()).await;
    assert!(early.is_err(), "a line before the ACK: {early:?}");
    // The ACK: one delta from what was answered to what is current.
    let ack = format!("{{\"version\":\"{}\"}}\n", first.version);
    write.write_all(ack.as_bytes()).await.expect("ack");
    let line = lines.next_line().await.expect("read").expect("line");
    let delta: DeltaLine = serde_json::from_str(&line).expect("a delta");
    assert_eq!(delta.delta.base, first.version);
    assert_eq!(delta.delta.version, snapshot_version(&h));
    let added: Vec<u16> = delta.delta.endpoints[0]
        .added
        .iter()
        .map(|e| e.port)
        .collect();
    assert_eq!(added, [1004]);
    assert_eq!(h.metrics.get(Counter::Pushes), 2, "three changes, one push");
}

#[tokio::test]
async fn a_sidecar_that_stops_reports_what_it_counted_at_once() {
    use reprise_sidecar::config::Farewell;
    use reprise_testkit::upstream::{Action, Upstream};
    let h = harness("farewell").await;
    let up = Upstream::always(Action::Reply(200)).await;
    h.source.set(retrying_503(&[up.addr.port()]));
    let proxy = empty_proxy();
    // Reports every hour: only the final one can bring the counts in time.
    let mut subscription = h.subscription.clone();
    subscription.report_every = Duration::from_secs(3600);
    let farewell = Farewell::default();
    let task =
        tokio::spawn(subscription.run_until_farewell(Arc::clone(&proxy), None, farewell.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = tokio::spawn(reprise_sidecar::serve_proxy(
        listener,
        Arc::clone(&proxy),
        std::future::pending(),
    ));
    eventually("snapshot applied", || endpoint_ports(&proxy).len() == 1).await;
    for _ in 0..7 {
        let r = reprise_testkit::client::send(addr, "GET", "api", "/", b"", &[]).await;
        assert_eq!(r.status, 200);
    }
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64
    };
    assert!(h.registry.traffic().window("shop/reads", now()).is_none());
    assert!(
        farewell
            .say(reprise_sidecar::config::FAREWELL_TIMEOUT)
            .await,
        "the final report is written"
    );
    eventually("the 7 requests reported", || {
        h.registry
            .traffic()
            .window("shop/reads", now())
            .is_some_and(|t| t.counts.requests == 7)
    })
    .await;
    assert!(
        h.registry
            .get("shop", "client-a")
            .is_some_and(|s| s.reported_final),
        "marked final"
    );
    task.abort();
    serving.abort();
}
