//! OTLP over TLS to a real receiver: Jaeger v2 (an OpenTelemetry Collector
//! build; the binary the end-to-end tests run) with TLS on its OTLP/gRPC and
//! OTLP/HTTP receivers, certificates made in the test, spans read back from
//! its query API. Each test starts its own Jaeger on 127.0.0.1, with two
//! receivers: `otlp` (server certificate only) and `otlp/mtls` (requires a
//! client certificate from the test's authority). Its `attributes` processor
//! copies the test's header into a span attribute, so a span shows that the
//! header arrived with it. Compression is seen on the wire: the exports go
//! through a TCP relay that counts the bytes, and a span carrying 100 kB of
//! one letter takes a few hundred bytes gzipped.
//!
//! Jaeger is `$JAEGER`, else the build of `e2e/build-tools.sh` in
//! `${REPRISE_TOOLS_DIR:-~/.cache/reprise-tools}` at the version
//! `e2e/tools/jaeger/go.mod` pins. They are `#[ignore]`d, since `cargo test`
//! runs before the tools are built; `e2e/test.sh` runs them with `--ignored`
//! once they are, with `$JAEGER` set, and a missing binary fails them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use opentelemetry::trace::{Span, Tracer};
use opentelemetry::KeyValue;
use reprise_telemetry::{Pipeline, Service, Settings};
use reprise_testkit::tls::{Issued, TestCa};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The header every export carries (`OTEL_EXPORTER_OTLP_HEADERS`, which the
/// OTLP crate reads from the process environment).
const HEADER: (&str, &str) = ("x-reprise-test", "over-tls");

/// Sets the header variable once, before any test does anything else: the
/// environment is process-wide.
fn header_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var(
            "OTEL_EXPORTER_OTLP_HEADERS",
            format!("{}={}", HEADER.0, HEADER.1),
        );
    });
}

/// The Jaeger binary; a test without one fails, naming where it looked.
fn jaeger_binary() -> PathBuf {
    match find_jaeger() {
        Some(path) => path,
        None => {
            panic!("no Jaeger: set JAEGER or run bash e2e/build-tools.sh (e2e/test.sh does both)")
        }
    }
}

/// `$JAEGER`, else the tools cache's build at the pinned version.
fn find_jaeger() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("JAEGER") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "JAEGER={} is not a file (e2e/build-tools.sh builds it)",
            path.display()
        );
        return Some(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let go_mod = std::fs::read_to_string(root.join("e2e/tools/jaeger/go.mod")).ok()?;
    // Jaeger's v1.N.P module tag is release v2.(N-63).P (e2e/build-tools.sh).
    let module = go_mod.lines().find_map(|l| {
        l.trim()
            .strip_prefix("require github.com/jaegertracing/jaeger v1.")
            .or_else(|| l.trim().strip_prefix("github.com/jaegertracing/jaeger v1."))
    })?;
    let (minor, patch) = module.trim().split_once('.')?;
    let version = format!("v2.{}.{patch}", minor.parse::<u32>().ok()?.checked_sub(63)?);
    let cache = std::env::var_os("REPRISE_TOOLS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/reprise-tools"))
        })?;
    let path = cache.join(format!("jaeger-{version}")).join("jaeger");
    path.is_file().then_some(path)
}

/// A free port on 127.0.0.1 (free when asked; Jaeger binds it a moment later).
fn free_port() -> u16 {
    reprise_testkit::sidecar::free_addr().port()
}

/// A running Jaeger, killed when dropped.
struct Jaeger {
    child: tokio::process::Child,
    log: PathBuf,
    query: u16,
    /// `otlp`: TLS, no client certificate asked.
    grpc: u16,
    http: u16,
    /// `otlp/mtls`: TLS, a client certificate from the test's authority required.
    mtls_grpc: u16,
    mtls_http: u16,
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Jaeger {
    /// Jaeger presenting `server`, requiring client certificates of `ca` on
    /// its `otlp/mtls` receiver.
    async fn start(binary: &Path, ca: &TestCa, server: &Issued) -> Jaeger {
        let (query, query_grpc, grpc, http, mtls_grpc, mtls_http) = (
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        );
        let tls = |client_ca: bool| {
            let mut tls = format!(
                "{{cert_file: {}, key_file: {}",
                server.cert_file.display(),
                server.key_file.display()
            );
            if client_ca {
                tls.push_str(&format!(", client_ca_file: {}", ca.ca_file().display()));
            }
            tls.push('}');
            tls
        };
        let config = format!(
            r#"# Jaeger v2 for telemetry/tests/otlp_tls.rs: OTLP over TLS in, memory, query API.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp, otlp/mtls]
      processors: [attributes]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc}
        include_metadata: true
        tls: {server_tls}
      http:
        endpoint: 127.0.0.1:{http}
        include_metadata: true
        tls: {server_tls}
  otlp/mtls:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{mtls_grpc}
        include_metadata: true
        tls: {mutual_tls}
      http:
        endpoint: 127.0.0.1:{mtls_http}
        include_metadata: true
        tls: {mutual_tls}
processors:
  # The request's metadata as span attributes: what the test asserts on.
  attributes:
    actions:
      - {{key: test.header, from_context: metadata.{header}, action: insert}}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"#,
            server_tls = tls(false),
            mutual_tls = tls(true),
            header = HEADER.0,
        );
        let dir = ca.dir();
        let config_file = dir.join("jaeger.yaml");
        std::fs::write(&config_file, config).expect("Jaeger's config");
        let log = dir.join("jaeger.log");
        let out = std::fs::File::create(&log).expect("Jaeger's log");
        let child = tokio::process::Command::new(binary)
            .arg(format!("--config=file:{}", config_file.display()))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("Jaeger starts");
        let mut jaeger = Jaeger {
            child,
            log,
            query,
            grpc,
            http,
            mtls_grpc,
            mtls_http,
        };
        jaeger.wait_ready().await;
        jaeger
    }

    /// Waits until the query API answers and every receiver listens.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("Jaeger exited ({status}):\n{}", self.log_text());
            }
            let mut ready = get(&format!("http://127.0.0.1:{}/api/services", self.query))
                .await
                .is_ok();
            for port in [self.grpc, self.http, self.mtls_grpc, self.mtls_http] {
                ready &= tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok();
            }
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Jaeger not ready in 30 s:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The tags of the spans of `service` Jaeger holds, waiting up to 10 s
    /// for at least one.
    async fn spans(&self, service: &str) -> Vec<BTreeMap<String, String>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.spans_now(service).await;
            if !found.is_empty() || Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn spans_now(&self, service: &str) -> Vec<BTreeMap<String, String>> {
        let url = format!(
            "http://127.0.0.1:{}/api/traces?service={service}&lookback=1h&limit=20",
            self.query
        );
        let Ok(body) = get(&url).await else {
            return Vec::new();
        };
        let json: serde_json::Value = serde_json::from_slice(&body).expect("Jaeger's JSON");
        json["data"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|trace| trace["spans"].as_array().cloned().unwrap_or_default())
            .map(|span| {
                span["tags"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| {
                        let value = match &t["value"] {
                            serde_json::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        Some((t["key"].as_str()?.to_string(), value))
                    })
                    .chain([(
                        "name".to_string(),
                        span["operationName"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    )])
                    .collect()
            })
            .collect()
    }
}

/// GET over plain HTTP (Jaeger's query API, on loopback); the body of a 2xx.
async fn get(url: &str) -> Result<bytes::Bytes, String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let resp = client
        .get(url.parse().map_err(|e| format!("{url}: {e}"))?)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("GET {url}: {status}"))
    }
}

/// A TCP relay on 127.0.0.1 to `target`, counting the bytes clients send
/// (TLS records: the size of what was sent, compressed or not). Stops when
/// dropped.
struct Relay {
    port: u16,
    sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sent = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&sent);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    // Counted as the bytes pass: the exporter keeps its connection open.
                    let up = async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            match client_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    counted.fetch_add(n as u64, Ordering::Relaxed);
                                    if server_write.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = server_write.shutdown().await;
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                        let _ = client_write.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Relay { port, sent, task }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one export did: spans the receiver accepted and spans dropped.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    exported: u64,
    dropped: u64,
}

/// Starts the pipeline the variables `vars` describe for `service`, ends one
/// span named `service` and waits for its export.
async fn export_one(service: &'static str, vars: &[(&str, String)]) -> Outcome {
    header_env();
    let settings = Settings::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("settings")
    .expect("tracing on");
    let pipeline = Pipeline::start(
        &settings,
        Service {
            name: service,
            version: "0.0.0-test",
        },
    )
    .expect("pipeline");
    let mut span = pipeline.tracer().start(service);
    // 100 kB that gzip makes a few hundred bytes: compression shows on the wire.
    span.set_attribute(KeyValue::new("test.payload", "a".repeat(PAYLOAD)));
    span.end();
    assert!(
        pipeline.shutdown(Duration::from_secs(30)).await,
        "{service}: the export did not finish in 30 s"
    );
    Outcome {
        exported: pipeline.counters().exported(),
        dropped: pipeline.counters().dropped(),
    }
}

/// The size of the attribute every test span carries.
const PAYLOAD: usize = 100_000;

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
const COMPRESSION: &str = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION";
const CLIENT_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE";
const CLIENT_KEY: &str = "OTEL_EXPORTER_OTLP_CLIENT_KEY";
/// A failed export is retried by the OTLP crate; a short request timeout
/// keeps the refusals quick.
const TIMEOUT: (&str, &str) = ("OTEL_EXPORTER_OTLP_TIMEOUT", "3000");

/// The variables for `protocol` to `port` over TLS, verified with `ca_file`.
fn vars(protocol: &str, port: u16, ca_file: &Path) -> Vec<(&'static str, String)> {
    vec![
        (ENDPOINT, format!("https://127.0.0.1:{port}")),
        (PROTOCOL, protocol.to_string()),
        (CERTIFICATE, ca_file.display().to_string()),
        (TIMEOUT.0, TIMEOUT.1.to_string()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Jaeger: e2e/test.sh runs it with --ignored after building the tools"]
async fn spans_arrive_over_grpc_and_http_with_tls_gzip_and_a_header() {
    let binary = jaeger_binary();
    let ca = TestCa::new("otlp-tls");
    let server = ca.issue("jaeger", &["127.0.0.1"]);
    let jaeger = Jaeger::start(&binary, &ca, &server).await;
    // The exports go through relays, which count the bytes sent.
    let grpc = Relay::start(jaeger.grpc).await;
    let http = Relay::start(jaeger.http).await;
    // (service, protocol, relay, compression)
    let cases: [(&'static str, &str, &Relay, &str); 4] = [
        ("grpc-tls", "grpc", &grpc, "none"),
        ("grpc-tls-gzip", "grpc", &grpc, "gzip"),
        ("http-tls", "http/protobuf", &http, "none"),
        ("http-tls-gzip", "http/protobuf", &http, "gzip"),
    ];
    for (service, protocol, relay, compression) in cases {
        let mut vars = vars(protocol, relay.port, &ca.ca_file());
        vars.push((COMPRESSION, compression.to_string()));
        let before = relay.sent();
        let outcome = export_one(service, &vars).await;
        let sent = relay.sent() - before;
        assert_eq!(
            outcome,
            Outcome {
                exported: 1,
                dropped: 0
            },
            "{service}:\n{}",
            jaeger.log_text()
        );
        let spans = jaeger.spans(service).await;
        assert_eq!(spans.len(), 1, "{service}: {spans:?}");
        let tags = &spans[0];
        assert_eq!(tags.get("name").map(String::as_str), Some(service));
        assert_eq!(
            tags.get("test.payload").map(String::len),
            Some(PAYLOAD),
            "{service}: the span whole"
        );
        assert_eq!(
            tags.get("test.header").map(String::as_str),
            Some(HEADER.1),
            "{service}: the header arrived: {tags:?}"
        );
        // The handshake and the headers are a few kB either way.
        if compression == "gzip" {
            assert!(sent < 20_000, "{service}: {sent} bytes sent, gzipped");
        } else {
            assert!(sent > PAYLOAD as u64, "{service}: {sent} bytes sent, plain");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Jaeger: e2e/test.sh runs it with --ignored after building the tools"]
async fn a_receiver_that_requires_a_client_certificate_gets_one_and_refuses_none() {
    let binary = jaeger_binary();
    let ca = TestCa::new("otlp-mtls");
    let server = ca.issue("jaeger", &["127.0.0.1"]);
    let client = ca.issue("reprise", &["reprise.test"]);
    let jaeger = Jaeger::start(&binary, &ca, &server).await;
    // (service, protocol, port, with the client certificate)
    let cases: [(&'static str, &str, u16, bool); 4] = [
        ("grpc-mtls", "grpc", jaeger.mtls_grpc, true),
        ("http-mtls", "http/protobuf", jaeger.mtls_http, true),
        ("grpc-mtls-none", "grpc", jaeger.mtls_grpc, false),
        ("http-mtls-none", "http/protobuf", jaeger.mtls_http, false),
    ];
    for (service, protocol, port, with_cert) in cases {
        let mut vars = vars(protocol, port, &ca.ca_file());
        if with_cert {
            vars.push((CLIENT_CERTIFICATE, client.cert_file.display().to_string()));
            vars.push((CLIENT_KEY, client.key_file.display().to_string()));
        }
        let outcome = export_one(service, &vars).await;
        if with_cert {
            assert_eq!(
                outcome,
                Outcome {
                    exported: 1,
                    dropped: 0
                },
                "{service}:\n{}",
                jaeger.log_text()
            );
            let spans = jaeger.spans(service).await;
            assert_eq!(spans.len(), 1, "{service}: {spans:?}");
            assert_eq!(
                spans[0].get("test.header").map(String::as_str),
                Some(HEADER.1)
            );
        } else {
            assert_eq!(
                outcome,
                Outcome {
                    exported: 0,
                    dropped: 1
                },
                "{service}: refused without a client certificate"
            );
            assert!(jaeger.spans_now(service).await.is_empty(), "{service}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Jaeger: e2e/test.sh runs it with --ignored after building the tools"]
async fn the_collector_certificate_is_verified() {
    let binary = jaeger_binary();
    let ca = TestCa::new("otlp-verify");
    let server = ca.issue("jaeger", &["127.0.0.1"]);
    let stranger = TestCa::new("otlp-stranger");
    let jaeger = Jaeger::start(&binary, &ca, &server).await;
    // (service, protocol, endpoint, bundle; none: the public roots)
    let grpc = format!("https://127.0.0.1:{}", jaeger.grpc);
    let http = format!("https://127.0.0.1:{}", jaeger.http);
    let other_name = format!("https://localhost:{}", jaeger.http);
    let cases: [(&'static str, &str, &str, Option<PathBuf>); 5] = [
        ("grpc-public-roots", "grpc", &grpc, None),
        ("http-public-roots", "http/protobuf", &http, None),
        ("grpc-other-ca", "grpc", &grpc, Some(stranger.ca_file())),
        (
            "http-other-ca",
            "http/protobuf",
            &http,
            Some(stranger.ca_file()),
        ),
        // The certificate names 127.0.0.1, not localhost.
        (
            "http-other-name",
            "http/protobuf",
            &other_name,
            Some(ca.ca_file()),
        ),
    ];
    for (service, protocol, endpoint, bundle) in cases {
        let mut vars = vec![
            (ENDPOINT, endpoint.to_string()),
            (PROTOCOL, protocol.to_string()),
            (TIMEOUT.0, TIMEOUT.1.to_string()),
        ];
        if let Some(bundle) = bundle {
            vars.push((CERTIFICATE, bundle.display().to_string()));
        }
        let outcome = export_one(service, &vars).await;
        assert_eq!(
            outcome,
            Outcome {
                exported: 0,
                dropped: 1
            },
            "{service}: the receiver's certificate is not trusted"
        );
        assert!(jaeger.spans_now(service).await.is_empty(), "{service}");
    }
}
