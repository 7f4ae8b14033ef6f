//! The four HTTP/1 implementations compared, each a proxy on an ephemeral
//! loopback port in front of one upstream:
//!
//! - Reprise: the sidecar served in this process, a fresh one per case (no
//!   pooled connection, passive-health state or budget carries over between
//!   cases), retries off, so every attempt is the one being observed.
//! - hyper: a minimal proxy built from `hyper::server::conn::http1` and
//!   `hyper::client::conn::http1` with their default settings, hop-by-hop
//!   fields removed and the framing left to hyper: the reference parser.
//!   Two rules are a proxy's, not a parser's, and it follows RFC 9112 in
//!   them: an absolute-form target's authority replaces `Host` (§3.2.2),
//!   and a chunked request stays chunked (hyper's client sends no body of
//!   unknown length on `GET` and `HEAD` unless `Transfer-Encoding` is set).
//! - nginx forwards the host the request named (`$host`: the target's, else
//!   `Host`'s) rather than the upstream block's name, so all four can be
//!   compared on it.
//! - nginx and HAProxy: the Debian binaries, started with a config in a
//!   temporary directory and killed when dropped. A missing binary skips that
//!   peer with a notice, except under CI (`CI` set), where it is a failure.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use reprise_sidecar::{serve_proxy, Proxy};
use reprise_testkit::config::{Config, UpstreamConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Mutex};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// The upstream timeouts every proxy is given (connect, read), and the bound
/// on anything a peer does for one connection.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a started nginx or HAProxy may take to accept connections.
const START_WITHIN: Duration = Duration::from_secs(10);

/// One of the implementations compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Reprise,
    Hyper,
    Nginx,
    Haproxy,
}

/// In table order.
pub const KINDS: [Kind; 4] = [Kind::Reprise, Kind::Hyper, Kind::Nginx, Kind::Haproxy];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Reprise => "Reprise",
            Kind::Hyper => "hyper",
            Kind::Nginx => "nginx",
            Kind::Haproxy => "HAProxy",
        }
    }
}

/// The peers in front of one upstream.
#[derive(Debug)]
pub struct Peers {
    /// Reprise's upstream.
    upstream: SocketAddr,
    hyper: HyperProxy,
    nginx: Option<External>,
    haproxy: Option<External>,
    /// Printed with the table: skipped peers.
    pub notices: Vec<String>,
}

/// Where to send one case's client connection, and what keeps it serving.
#[derive(Debug)]
pub struct Front {
    pub addr: SocketAddr,
    _sidecar: Option<Sidecar>,
}

impl Peers {
    /// Starts hyper, nginx and HAProxy, each in front of its upstream in
    /// `upstreams` (in [`KINDS`] order; Reprise's is used by [`Peers::front`],
    /// which starts a sidecar per case).
    pub async fn start(upstreams: [SocketAddr; 4]) -> Peers {
        let mut notices = Vec::new();
        let [reprise, hyper, nginx, haproxy] = upstreams;
        let nginx = match binary("nginx") {
            Some(bin) => Some(External::start(Kind::Nginx, &bin, nginx).await),
            None => {
                missing("nginx", &mut notices);
                None
            }
        };
        let haproxy = match binary("haproxy") {
            Some(bin) => Some(External::start(Kind::Haproxy, &bin, haproxy).await),
            None => {
                missing("haproxy", &mut notices);
                None
            }
        };
        Peers {
            upstream: reprise,
            hyper: HyperProxy::start(hyper).await,
            nginx,
            haproxy,
            notices,
        }
    }

    /// The proxy of `kind` to use for one case, `None` for a skipped peer.
    pub async fn front(&self, kind: Kind) -> Option<Front> {
        let shared = |addr| Front {
            addr,
            _sidecar: None,
        };
        match kind {
            Kind::Reprise => {
                let sidecar = Sidecar::start(self.upstream).await;
                Some(Front {
                    addr: sidecar.addr,
                    _sidecar: Some(sidecar),
                })
            }
            Kind::Hyper => Some(shared(self.hyper.addr)),
            Kind::Nginx => self.nginx.as_ref().map(|p| shared(p.addr)),
            Kind::Haproxy => self.haproxy.as_ref().map(|p| shared(p.addr)),
        }
    }

    /// The last lines of nginx's and HAProxy's logs, to explain a surprise.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for p in [&self.nginx, &self.haproxy].into_iter().flatten() {
            out += &p.log_tail(15);
        }
        out
    }
}

/// Skips a peer whose binary is missing, or fails under CI.
fn missing(name: &str, notices: &mut Vec<String>) {
    if std::env::var_os("CI").is_some() {
        panic!(
            "{name} is missing under CI (the differential tests need it; e2e/test.sh installs it)"
        );
    }
    notices.push(format!(
        "NOTICE: {name} not found (/usr/sbin or PATH): its column is skipped (apt-get install {name})"
    ));
}

/// `/usr/sbin/<name>`, else `<name>` on PATH.
fn binary(name: &str) -> Option<PathBuf> {
    let sbin = Path::new("/usr/sbin").join(name);
    if sbin.is_file() {
        return Some(sbin);
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The sidecar in this process in front of `upstream` as upstream `api`.
#[derive(Debug)]
struct Sidecar {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Sidecar {
    async fn start(upstream: SocketAddr) -> Sidecar {
        let ms = UPSTREAM_TIMEOUT.as_millis() as u64;
        // No retries block: retries off, each case is one attempt.
        let config = Config::from(
            UpstreamConfig::new("api")
                .endpoint(upstream)
                .connect_ms(ms)
                .read_ms(ms),
        );
        let proxy = Proxy::new(config.resolve());
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind sidecar");
        let addr = listener.local_addr().expect("sidecar addr");
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(serve_proxy(listener, proxy, async {
            let _ = stopped.await;
        }));
        Sidecar {
            addr,
            stop: Some(stop),
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// hyper's HTTP/1 server and client back to back.
#[derive(Debug)]
struct HyperProxy {
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

type Reply = Response<Either<Incoming, Full<Bytes>>>;

impl HyperProxy {
    async fn start(upstream: SocketAddr) -> HyperProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind hyper proxy");
        let addr = listener.local_addr().expect("hyper proxy addr");
        let accept = tokio::spawn(async move {
            // Bounded: the tests open a few hundred connections.
            for _ in 0..100_000 {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(hyper_connection(stream, upstream));
            }
        });
        HyperProxy { addr, accept }
    }
}

impl Drop for HyperProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One client connection: requests forwarded in turn over one upstream
/// connection, dialled again when hyper says it cannot take another.
async fn hyper_connection(stream: TcpStream, upstream: SocketAddr) {
    let pooled: Arc<Mutex<Option<SendRequest<Incoming>>>> = Arc::default();
    let service = service_fn(move |req| {
        let pooled = Arc::clone(&pooled);
        async move { Ok::<_, Infallible>(hyper_forward(req, &pooled, upstream).await) }
    });
    let serve =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let _ = timeout(Duration::from_secs(30), serve).await;
}

async fn hyper_forward(
    req: Request<Incoming>,
    pooled: &Mutex<Option<SendRequest<Incoming>>>,
    upstream: SocketAddr,
) -> Reply {
    let (mut parts, body) = req.into_parts();
    let chunked = parts
        .headers
        .get(TRANSFER_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    strip_hop_by_hop(&mut parts.headers);
    if let Some(authority) = parts.uri.authority() {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            parts.headers.insert(HOST, host);
        }
    }
    if chunked {
        parts
            .headers
            .insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    parts.uri = parts
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
    let mut slot = pooled.lock().await;
    let mut reuse = slot.take();
    if let Some(s) = &mut reuse {
        // Ready once the previous response's body has been read to its end.
        if !timeout(UPSTREAM_TIMEOUT, s.ready())
            .await
            .is_ok_and(|r| r.is_ok())
        {
            reuse = None;
        }
    }
    let mut send = match reuse {
        Some(s) => s,
        None => match hyper_dial(upstream).await {
            Ok(s) => s,
            Err(e) => return bad_gateway(e),
        },
    };
    let sent = timeout(
        UPSTREAM_TIMEOUT,
        send.send_request(Request::from_parts(parts, body)),
    )
    .await;
    *slot = Some(send);
    match sent {
        Ok(Ok(resp)) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Either::Left(body))
        }
        Ok(Err(e)) => bad_gateway(e.to_string()),
        Err(_) => bad_gateway("timeout".into()),
    }
}

async fn hyper_dial(upstream: SocketAddr) -> Result<SendRequest<Incoming>, String> {
    let stream = timeout(UPSTREAM_TIMEOUT, TcpStream::connect(upstream))
        .await
        .map_err(|_| "connect timeout".to_string())?
        .map_err(|e| e.to_string())?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = timeout(Duration::from_secs(30), conn).await;
    });
    Ok(send)
}

fn bad_gateway(why: String) -> Reply {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(why))));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r
}

/// Hop-by-hop fields (RFC 9110 §7.6.1) and the framing ones, which hyper
/// sets again from the body it is given.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    ] {
        headers.remove(name);
    }
}

/// nginx or HAProxy, running until dropped.
#[derive(Debug)]
struct External {
    kind: Kind,
    addr: SocketAddr,
    child: Child,
    dir: PathBuf,
}

impl External {
    /// Starts `kind` from `bin` in front of `upstream`. The listening port is
    /// picked free, then bound by the process: another process may take it in
    /// between, so a start that fails is tried again on a new port.
    async fn start(kind: Kind, bin: &Path, upstream: SocketAddr) -> External {
        let mut last = String::new();
        for attempt in 0..3 {
            let dir = std::env::temp_dir().join(format!(
                "reprise-differential-{}-{}-{}-{attempt}",
                std::process::id(),
                kind.name(),
                upstream.port()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            let port = free_port();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let mut cmd = Command::new(bin);
            match kind {
                Kind::Nginx => {
                    let conf = dir.join("nginx.conf");
                    std::fs::write(&conf, nginx_conf(&dir, port, upstream)).expect("nginx.conf");
                    cmd.arg("-p").arg(&dir).arg("-c").arg(&conf);
                    cmd.args(["-g", "daemon off;"]);
                }
                _ => {
                    let conf = dir.join("haproxy.cfg");
                    std::fs::write(&conf, haproxy_cfg(port, upstream)).expect("haproxy.cfg");
                    cmd.arg("-f").arg(&conf).arg("-db");
                }
            }
            let log = std::fs::File::create(dir.join("output.log")).expect("log file");
            cmd.stdin(Stdio::null())
                .stdout(log.try_clone().expect("log file"))
                .stderr(log);
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
            let mut me = External {
                kind,
                addr,
                child,
                dir,
            };
            if me.ready().await {
                return me;
            }
            last = me.log_tail(20);
        }
        panic!("{} did not start: {last}", kind.name());
    }

    /// Waits until the port accepts, false if the process exited first or
    /// [`START_WITHIN`] passed.
    async fn ready(&mut self) -> bool {
        let deadline = tokio::time::Instant::now() + START_WITHIN;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if TcpStream::connect(self.addr).await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    fn log_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for file in ["output.log", "error.log"] {
            let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
            // Every keep-alive close is logged at info: noise here.
            let all: Vec<&str> = text
                .lines()
                .filter(|l| !l.contains("closed keepalive connection"))
                .collect();
            for line in &all[all.len().saturating_sub(lines)..] {
                out += &format!("{} {file}: {line}\n", self.kind.name());
            }
        }
        out
    }
}

impl Drop for External {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    reprise_testkit::sidecar::free_addr().port()
}

/// One single-process nginx (no `user`: without a master process it never
/// changes user, root or not), everything in `dir`, no retries to the next
/// server, upstream keep-alive as in a production proxy.
fn nginx_conf(dir: &Path, port: u16, upstream: SocketAddr) -> String {
    let d = dir.display();
    let t = UPSTREAM_TIMEOUT.as_secs();
    format!(
        "master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    client_header_timeout {t}s;
    client_body_timeout {t}s;
    proxy_http_version 1.1;
    proxy_set_header Connection \"\";
    proxy_set_header Host $host;
    proxy_connect_timeout {t}s;
    proxy_read_timeout {t}s;
    proxy_send_timeout {t}s;
    proxy_next_upstream off;
    upstream up {{
        server {upstream} max_fails=0;
        keepalive 8;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{ proxy_pass http://up; }}
    }}
}}
"
    )
}

/// HAProxy in HTTP mode with keep-alive on both sides, defaults otherwise.
fn haproxy_cfg(port: u16, upstream: SocketAddr) -> String {
    let t = UPSTREAM_TIMEOUT.as_secs();
    format!(
        "global
    nbthread 1
defaults
    mode http
    timeout connect {t}s
    timeout client {t}s
    timeout server {t}s
    option http-keep-alive
frontend front
    bind 127.0.0.1:{port}
    default_backend back
backend back
    server s1 {upstream}
"
    )
}
