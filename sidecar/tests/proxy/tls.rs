//! TLS the sidecar originates towards HTTPS endpoints: the test kit's TLS
//! front (rustls) before the fault upstream, with certificates from an
//! authority made in the test, and Python's `ssl` server as a peer nobody
//! on the project wrote. A handshake that fails is retried on another
//! endpoint like a refused connection; a certificate that fails validation
//! is answered `502 tls_certificate` and never retried.

use std::time::Duration;

use reprise_testkit::tls::{FrontSettings, TestCa, TlsFront};

use crate::support::{retries, Action, Sidecar, Upstream, UpstreamConfig};

/// An upstream `api` over TLS to `fronts`, trusting `ca`, verifying the
/// name `api.test`.
fn over_tls(fronts: &[&TlsFront], ca: &TestCa) -> UpstreamConfig {
    UpstreamConfig::new("api")
        .endpoints(fronts.iter().map(|f| f.addr))
        .tls(Some(&ca.ca_file()), Some("api.test"))
}

/// A TLS front for `api.test` with a certificate from `ca`.
async fn front(ca: &TestCa, label: &str, backend: &Upstream) -> TlsFront {
    TlsFront::start(
        backend.addr,
        FrontSettings::new(ca.issue(label, &["api.test"])),
    )
    .await
}

#[tokio::test]
async fn https_endpoints_are_reached_over_tls_keeping_the_host_the_application_sent() {
    let ca = TestCa::new("plain");
    let up = Upstream::always(Action::Reply(200)).await;
    let tls = front(&ca, "api", &up).await;
    let sidecar = Sidecar::start(over_tls(&[&tls], &ca)).await;
    for _ in 0..3 {
        let r = sidecar.send("GET", "api", "/orders", b"").await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(up.count(), 3);
    assert_eq!(
        up.received()[0].header("host"),
        Some("api"),
        "the Host the application sent"
    );
    assert_eq!(tls.handshakes(), 1, "one pooled connection, one handshake");
    // rcgen's default validity ends on 4096-01-01.
    assert_eq!(
        sidecar.stats("api").endpoints[0].certificate_expiry,
        Some(67_090_118_400),
        "the leaf's notAfter, for reprise_tls_peer_certificate_expiry_seconds"
    );
}

#[tokio::test]
async fn host_rewrite_replaces_the_host_on_every_attempt() {
    let ca = TestCa::new("rewrite");
    let up = Upstream::always(Action::Reply(200)).await;
    let tls = front(&ca, "api", &up).await;
    let sidecar = Sidecar::start(over_tls(&[&tls], &ca).host_rewrite("api.test")).await;
    assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    assert_eq!(up.received()[0].header("host"), Some("api.test"));
}

/// An upstream answering 200 with `Connection: close`, so every request
/// opens a new connection and shakes hands again.
async fn closing_upstream() -> Upstream {
    Upstream::always(Action::ReplyWith(
        200,
        vec![("connection", "close".into())],
        Default::default(),
    ))
    .await
}

#[tokio::test]
async fn sessions_are_resumed_per_endpoint_so_pods_with_their_own_keys_resume_too() {
    let ca = TestCa::new("resume");
    let up = closing_upstream().await;
    // Two fronts, each with its own session cache: two pods.
    let (a, b) = (front(&ca, "a", &up).await, front(&ca, "b", &up).await);
    let sidecar = Sidecar::start(over_tls(&[&a, &b], &ca)).await;
    for _ in 0..20 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    }
    let (full_a, full_b) = (a.handshakes() - a.resumed(), b.handshakes() - b.resumed());
    assert_eq!(
        a.handshakes() + b.handshakes(),
        20,
        "a connection per request"
    );
    // With one store for the upstream's name, a ticket from one front was
    // offered to the other, refused, and the handshake was a full one.
    assert_eq!(
        (full_a, full_b),
        (1, 1),
        "one full handshake per endpoint, the rest resumed"
    );
}

#[tokio::test]
async fn a_burst_of_new_connections_resumes_with_the_tickets_kept() {
    let ca = TestCa::new("burst");
    let up = closing_upstream().await;
    let tls = front(&ca, "api", &up).await;
    let sidecar = Sidecar::start(over_tls(&[&tls], &ca)).await;
    // One at a time: each connection takes a ticket and gets two.
    for _ in 0..40 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    }
    let before = tls.handshakes() - tls.resumed();
    let burst = (0..40).map(|_| sidecar.send("GET", "api", "/", b""));
    for r in futures_util::future::join_all(burst).await {
        assert_eq!(r.status, 200);
    }
    assert_eq!(tls.handshakes(), 80);
    // rustls' own cache keeps eight tickets per server: 32 of these 40 were full.
    assert_eq!(
        tls.handshakes() - tls.resumed() - before,
        0,
        "40 connections opened at once all resumed"
    );
}

#[tokio::test]
async fn a_failed_handshake_is_retried_on_another_endpoint() {
    let ca = TestCa::new("handshake");
    // Plain text where TLS is expected: the handshake cannot complete.
    let plain = Upstream::always(Action::Reply(200)).await;
    let up = Upstream::always(Action::Reply(200)).await;
    let good = front(&ca, "api", &up).await;
    let config = UpstreamConfig::new("api")
        .endpoint(plain.addr)
        .endpoint(good.addr)
        .tls(Some(&ca.ca_file()), Some("api.test"))
        .retries(retries().attempts(1).backoff_base_ms(1))
        .consecutive_failures(0);
    let sidecar = Sidecar::start(config).await;
    let mut retried = 0.0;
    for _ in 0..20 {
        let r = sidecar.send("GET", "api", "/", b"").await;
        assert_eq!(r.status, 200, "recovered on the TLS endpoint");
        retried = sidecar
            .stats("api")
            .retries
            .get("tls_handshake")
            .copied()
            .unwrap_or(0) as f64;
        if retried > 0.0 {
            break;
        }
    }
    assert!(
        retried > 0.0,
        "a request went to the plain endpoint first and was retried"
    );
    assert_eq!(plain.count(), 0, "no HTTP request was read in plain text");
}

/// `certificate` issued for the front, then one request: its status, its
/// `x-reprise-error`, and the reasons the sidecar counted.
async fn refused(
    ca: &TestCa,
    front_ca: &TestCa,
    names: &[&str],
    expired: bool,
) -> (u16, String, Vec<(&'static str, u64)>) {
    let up = Upstream::always(Action::Reply(200)).await;
    let identity = front_ca.issue_with("bad", names, |p| {
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
    });
    let tls = TlsFront::start(up.addr, FrontSettings::new(identity)).await;
    let config = over_tls(&[&tls], ca).retries(retries().attempts(2).backoff_base_ms(1));
    let sidecar = Sidecar::start(config).await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(up.count(), 0, "nothing reached the endpoint");
    assert_eq!(
        sidecar.outcomes("api", "skipped"),
        1,
        "never retried: the failure is the certificate's"
    );
    let stats = sidecar.stats("api");
    assert!(stats.retries.is_empty(), "no retry");
    let reasons = stats.certificate_failures.into_iter().collect();
    (r.status, error_kind(&r), reasons)
}

#[tokio::test]
async fn a_certificate_for_another_name_is_502_tls_certificate_and_never_retried() {
    let ca = TestCa::new("names");
    assert_eq!(
        refused(&ca, &ca, &["other.test"], false).await,
        (
            502,
            "tls_certificate".to_string(),
            vec![("name_mismatch", 1)]
        )
    );
}

#[tokio::test]
async fn an_expired_certificate_or_an_unknown_issuer_is_tls_certificate_too() {
    let ca = TestCa::new("expiry");
    assert_eq!(
        refused(&ca, &ca, &["api.test"], true).await,
        (502, "tls_certificate".to_string(), vec![("expired", 1)])
    );
    let stranger = TestCa::new("stranger");
    assert_eq!(
        refused(&ca, &stranger, &["api.test"], false).await,
        (
            502,
            "tls_certificate".to_string(),
            vec![("unknown_issuer", 1)]
        )
    );
}

#[tokio::test]
async fn h2_speaks_http2_over_tls_and_needs_the_endpoint_to_select_it() {
    let ca = TestCa::new("h2");
    let up = Upstream::always(Action::Reply(200)).await;
    let h2 = TlsFront::start(
        up.addr,
        FrontSettings::new(ca.issue("h2", &["api.test"])).alpn(&["h2"]),
    )
    .await;
    let sidecar = Sidecar::start(over_tls(&[&h2], &ca).h2()).await;
    assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    let seen = up.received();
    assert_eq!(seen[0].version, http::Version::HTTP_2);
    assert_eq!(seen[0].authority.as_deref(), Some("api"));

    // An endpoint that selects only HTTP/1.1: no HTTP/2 to speak.
    let h1 = TlsFront::start(
        up.addr,
        FrontSettings::new(ca.issue("h1", &["api.test"])).alpn(&["http/1.1"]),
    )
    .await;
    let sidecar = Sidecar::start(over_tls(&[&h1], &ca).h2()).await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(
        (r.status, error_kind(&r)),
        (502, "tls_handshake".to_string())
    );
}

#[tokio::test]
async fn subject_alt_names_accept_a_certificate_for_one_of_them_and_only_for_them() {
    let ca = TestCa::new("sans");
    let up = Upstream::always(Action::Reply(200)).await;
    // The endpoint's certificate names api.internal, not the SNI name.
    let front = TlsFront::start(
        up.addr,
        FrontSettings::new(ca.issue("internal", &["api.internal"])),
    )
    .await;
    let accepting =
        Sidecar::start(over_tls(&[&front], &ca).subject_alt_names(&["api.other", "api.internal"]))
            .await;
    assert_eq!(accepting.send("GET", "api", "/", b"").await.status, 200);
    let refusing = Sidecar::start(over_tls(&[&front], &ca).subject_alt_names(&["api.other"])).await;
    let r = refusing.send("GET", "api", "/", b"").await;
    assert_eq!(
        (r.status, error_kind(&r)),
        (502, "tls_certificate".to_string())
    );
    assert_eq!(
        refusing
            .stats("api")
            .certificate_failures
            .into_iter()
            .collect::<Vec<_>>(),
        [("name_mismatch", 1)]
    );
    // Another issuer still fails on its chain, whatever the names.
    let stranger = TestCa::new("sans-stranger");
    let foreign = TlsFront::start(
        up.addr,
        FrontSettings::new(stranger.issue("internal", &["api.internal"])),
    )
    .await;
    let chain =
        Sidecar::start(over_tls(&[&foreign], &ca).subject_alt_names(&["api.internal"])).await;
    chain.send("GET", "api", "/", b"").await;
    assert_eq!(
        chain
            .stats("api")
            .certificate_failures
            .into_iter()
            .collect::<Vec<_>>(),
        [("unknown_issuer", 1)]
    );
}

#[tokio::test]
async fn auto_speaks_what_each_endpoint_selects_on_the_connection_that_asked() {
    let ca = TestCa::new("auto");
    for (alpn, version) in [
        (&["h2", "http/1.1"][..], http::Version::HTTP_2),
        (&["h2"][..], http::Version::HTTP_2),
        (&["http/1.1"][..], http::Version::HTTP_11),
        // No ALPN at all: HTTP/1.1, as RFC 7301 has it.
        (&[][..], http::Version::HTTP_11),
    ] {
        let up = Upstream::always(Action::Reply(200)).await;
        let front = TlsFront::start(
            up.addr,
            FrontSettings::new(ca.issue("auto", &["api.test"])).alpn(alpn),
        )
        .await;
        let sidecar = Sidecar::start(over_tls(&[&front], &ca).auto()).await;
        for _ in 0..3 {
            assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
        }
        let seen = up.received();
        assert!(
            seen.iter().all(|r| r.version == version),
            "{alpn:?}: {:?}",
            seen.iter().map(|r| r.version).collect::<Vec<_>>()
        );
        assert_eq!(
            seen[0].header("host").or(seen[0].authority.as_deref()),
            Some("api"),
            "{alpn:?}: the host the application sent"
        );
        assert_eq!(
            front.handshakes(),
            1,
            "{alpn:?}: the connection that asked is the one used"
        );
    }
}

#[tokio::test]
async fn a_client_certificate_is_presented_when_the_endpoint_requires_one() {
    let ca = TestCa::new("mtls");
    let up = Upstream::always(Action::Reply(200)).await;
    let tls = TlsFront::start(
        up.addr,
        FrontSettings::new(ca.issue("server", &["api.test"])).require_client_cert(&ca.cert_pem),
    )
    .await;
    let client = ca.issue("client", &["client.test"]);
    let sidecar =
        Sidecar::start(over_tls(&[&tls], &ca).client_cert(&client.cert_file, &client.key_file))
            .await;
    assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);

    let without = Sidecar::start(over_tls(&[&tls], &ca)).await;
    let r = without.send("GET", "api", "/", b"").await;
    assert_eq!(
        (r.status, error_kind(&r).as_str()),
        (502, "tls_handshake"),
        "refused without a client certificate: the endpoint's alert ends the handshake"
    );
    assert_eq!(
        up.count(),
        1,
        "only the request with a certificate got through"
    );
}

#[tokio::test]
async fn python_ssl_serves_the_sidecar_over_tls() {
    let Ok(python) = which("python3") else {
        eprintln!("skipped: python3 is not installed");
        return;
    };
    let ca = TestCa::new("python");
    let server = ca.issue("python", &["api.test"]);
    let port = reprise_testkit::sidecar::free_addr().port();
    let script = format!(
        r#"
import http.server, ssl
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = ("host=" + self.headers.get("Host", "")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("{cert}", "{key}")
s = http.server.HTTPServer(("127.0.0.1", {port}), H)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#,
        cert = server.cert_file.display(),
        key = server.key_file.display(),
    );
    let _server = KillOnDrop(
        std::process::Command::new(python)
            .args(["-c", &script])
            .spawn()
            .expect("python3 starts"),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let config = UpstreamConfig::new("api")
        .endpoint(addr)
        .tls(Some(&ca.ca_file()), Some("api.test"));
    let sidecar = Sidecar::start(config).await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "host=api");
}

/// A child process killed when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The response's `x-reprise-error`, or empty.
fn error_kind(r: &crate::support::Reply) -> String {
    r.header("x-reprise-error")
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

fn which(program: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or(())
}

#[test]
fn check_refuses_bad_tls_settings_naming_file_field_and_rule() {
    let ca = TestCa::new("check");
    let client = ca.issue("client", &["client.test"]);
    let other = ca.issue("other", &["other.test"]);
    let empty = ca.dir().join("empty.pem");
    std::fs::write(&empty, "").expect("written");
    let yaml = format!(
        "upstreams:
  - name: a
    endpoints: [{{ address: 127.0.0.1, port: 1 }}]
    tls: {{ ca_file: {empty} }}
  - name: b
    endpoints: [{{ address: 127.0.0.1, port: 1 }}]
    tls: {{ client_cert_file: {cert}, client_key_file: {key} }}
  - name: c
    endpoints: [{{ address: 127.0.0.1, port: 1 }}]
    tls: {{ client_cert_file: {cert} }}
  - name: d
    endpoints: [{{ address: 127.0.0.1, port: 1 }}]
    protocol: h2
  - name: e
    endpoints: [{{ address: 127.0.0.1, port: 1 }}]
    protocol: h2c
    tls: {{}}
  - name: f
    endpoints: [{{ address: 127.0.0.1, port: 1 }}]
    protocol: auto
",
        empty = empty.display(),
        cert = client.cert_file.display(),
        key = other.key_file.display(),
    );
    let path = reprise_testkit::sidecar::write_temp("tls-check", &yaml);
    let out = reprise_testkit::sidecar::check(std::path::Path::new(crate::cli::BIN), &path);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let p = path.display();
    for want in [
        format!("{p}: upstreams[0].tls.ca_file: must hold at least one PEM certificate"),
        format!("{p}: upstreams[1].tls.client_key_file: does not match the certificate in"),
        format!("{p}: upstreams[2].tls.client_key_file: must be set with client_cert_file"),
        format!("{p}: upstreams[3].protocol: h2 is HTTP/2 over TLS and needs a tls block"),
        format!("{p}: upstreams[4].protocol: h2c is cleartext HTTP/2 and cannot have a tls block"),
        format!("{p}: upstreams[5].protocol: auto lets the endpoint choose through TLS (ALPN) and needs a tls block"),
    ] {
        assert!(stderr.contains(&want), "missing `{want}` in:\n{stderr}");
    }
}
