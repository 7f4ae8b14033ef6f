//! The admin endpoint: `/live`, `/ready`, `/config`, `/metrics`,
//! `/diagnostics` and `/log-level`. It listens on localhost by default;
//! nothing on it changes traffic except the log level. The health listener is
//! the same server answering only `/live`, `/ready` and `GET /metrics`.
//!
//! Each listener holds at most [`AdminLimits::max_connections`] connections
//! (one more is closed at once and counted), and a connection gets the proxy
//! listener's [`HEADER_READ_TIMEOUT`] for each request head, counted from its
//! start or its last response's end (so an idle keep-alive connection closes
//! after it too), for each whole request, and for any stall of its bytes
//! while a response goes out: a client silent, slow or not reading cannot
//! hold a connection, or its file descriptor, for long.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

mod diagnostics;
mod metrics;

pub use self::metrics::metrics_text;
use super::cap::Slot;
use super::HEADER_READ_TIMEOUT;
use crate::observe::metrics::Listener;
use crate::proxy::Proxy;

/// Connections an admin or health listener holds open at once. Probes and a
/// scraper or two need a handful; the cap keeps a flood of idle connections
/// (the health listener is on the pod's IP) from taking the file descriptors
/// the proxy needs.
pub const ADMIN_MAX_CONNECTIONS: u64 = 32;

/// How an admin or health listener treats its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminLimits {
    /// Time for each request head, from the connection's start or its last
    /// response's end; and for each whole request.
    pub header_read_timeout: Duration,
    /// Longest a connection's bytes may stop moving, in either direction
    /// (a client that does not read its response).
    pub idle_timeout: Duration,
    /// Connections held open at once; one more is closed at once.
    pub max_connections: u64,
}

impl Default for AdminLimits {
    /// The proxy listener's timeouts and [`ADMIN_MAX_CONNECTIONS`].
    fn default() -> Self {
        Self {
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: HEADER_READ_TIMEOUT,
            max_connections: ADMIN_MAX_CONNECTIONS,
        }
    }
}

/// Serves the admin endpoint (or, `health_only`, the health endpoint) on
/// `listener` forever, with the default [`AdminLimits`].
pub async fn serve_admin(listener: TcpListener, admin: Admin) {
    serve_admin_with(listener, admin, AdminLimits::default()).await;
}

/// [`serve_admin`] with `limits`.
pub async fn serve_admin_with(listener: TcpListener, admin: Admin, limits: AdminLimits) {
    let which = if admin.health_only {
        Listener::Health
    } else {
        Listener::Admin
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors and similar: back off briefly.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Over the cap: reset, and dropped here.
        let Some(slot) = Slot::take(&admin.proxy, which, limits.max_connections, &stream) else {
            continue;
        };
        tokio::spawn(serve_admin_connection(stream, admin.clone(), limits, slot));
    }
}

/// Serves one admin connection within `limits`, holding `_slot` until it ends.
async fn serve_admin_connection(stream: TcpStream, admin: Admin, limits: AdminLimits, _slot: Slot) {
    let progress = Arc::new(Progress::new());
    let io = Watched {
        io: stream,
        progress: Arc::clone(&progress),
    };
    let whole = limits.header_read_timeout;
    let service = service_fn(move |req| {
        let handled = admin.clone().handle(req);
        async move {
            // A request body trickled in (PUT /log-level) gets no longer
            // than a head does.
            Ok::<_, Infallible>(
                tokio::time::timeout(whole, handled)
                    .await
                    .unwrap_or_else(|_| Ok(timed_out()))
                    .unwrap_or_else(|never| match never {}),
            )
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(io), service);
    tokio::select! {
        _ = conn => {}
        () = progress.stalled(limits.idle_timeout) => {
            tracing::debug!("admin connection stalled: closing");
        }
    }
}

/// `408` for a request that took longer than the header read timeout, and
/// the connection closes after it.
fn timed_out() -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::REQUEST_TIMEOUT, "request timeout\n");
    r.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    r
}

/// When a connection's bytes last moved.
#[derive(Debug)]
struct Progress {
    start: Instant,
    /// Milliseconds from `start` to the last read or write that moved bytes.
    last_ms: AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn moved(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once no bytes have moved for `idle`.
    async fn stalled(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            if Instant::now() >= last + idle {
                return;
            }
            tokio::time::sleep_until(last + idle).await;
        }
    }
}

/// A connection that records when its bytes move.
#[derive(Debug)]
struct Watched {
    io: TcpStream,
    progress: Arc<Progress>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.progress.moved();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.progress.moved();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.progress.moved();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Changes the log filter at run time; returns an error message for a bad filter.
pub type LogLevelSetter = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// State the admin handlers read.
#[derive(Clone)]
pub struct Admin {
    /// The proxy being administered.
    pub proxy: Arc<Proxy>,
    /// Set when the log level can be changed.
    pub set_log_level: Option<LogLevelSetter>,
    /// Serve only `/live`, `/ready` and `GET /metrics`: the health listener
    /// the kubelet probes and Prometheus scrapes on the pod IP, which must
    /// expose nothing else (no configuration, no log-level changes).
    pub health_only: bool,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

impl Admin {
    /// Handles one admin request.
    pub async fn handle(self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        if self.health_only && !matches!(req.uri().path(), "/live" | "/ready" | "/metrics") {
            return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
        }
        let (status, content_type, body) = match (req.method(), req.uri().path()) {
            (&Method::GET, "/live") => (StatusCode::OK, "text/plain", "live\n".to_string()),
            (&Method::GET, "/ready") if self.proxy.is_draining() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "draining\n".to_string(),
            ),
            (&Method::GET, "/ready") if !self.proxy.is_ready() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "waiting for the first snapshot\n".to_string(),
            ),
            (&Method::GET, "/ready") => (StatusCode::OK, "text/plain", "ready\n".to_string()),
            (&Method::GET, "/config") => {
                let routes = self.proxy.routes();
                match serde_json::to_string_pretty(routes.config.as_ref()) {
                    Ok(json) => (StatusCode::OK, "application/json", json + "\n"),
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        format!("{e}\n"),
                    ),
                }
            }
            (&Method::GET, "/metrics") => (
                StatusCode::OK,
                "text/plain; version=0.0.4",
                metrics_text(&self.proxy),
            ),
            (&Method::GET, "/diagnostics") => diagnostics::page(&self.proxy, req.uri().query()),
            (&Method::PUT | &Method::POST, "/log-level") => self.set_log_level(req).await,
            (_, "/live" | "/ready" | "/config" | "/metrics" | "/diagnostics" | "/log-level") => (
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "method not allowed\n".to_string(),
            ),
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found; try /live, /ready, /config, /metrics, /diagnostics, PUT /log-level\n"
                    .to_string(),
            ),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(v) = http::HeaderValue::from_str(content_type) {
            response.headers_mut().insert(http::header::CONTENT_TYPE, v);
        }
        Ok(response)
    }

    async fn set_log_level(&self, req: Request<Incoming>) -> (StatusCode, &'static str, String) {
        let Some(setter) = &self.set_log_level else {
            return (
                StatusCode::NOT_IMPLEMENTED,
                "text/plain",
                "log level is fixed\n".to_string(),
            );
        };
        let body = match Limited::new(req.into_body(), 1024).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return (
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    "body too large\n".to_string(),
                )
            }
        };
        let filter = String::from_utf8_lossy(&body).trim().to_string();
        match setter(&filter) {
            Ok(()) => (
                StatusCode::OK,
                "text/plain",
                format!("log level: {filter}\n"),
            ),
            Err(e) => (
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("invalid log filter \"{filter}\": {e}\n"),
            ),
        }
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn proxy() -> Arc<Proxy> {
        let yaml = "upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n";
        Proxy::new(reprise_crds::file::parse(yaml, "test.yaml").expect("valid"))
    }

    /// An admin (or, `health_only`, health) listener serving in this
    /// runtime with `limits`.
    async fn admin_listener(health_only: bool, limits: AdminLimits) -> (SocketAddr, Arc<Proxy>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let proxy = proxy();
        let admin = Admin {
            proxy: Arc::clone(&proxy),
            set_log_level: Some(Arc::new(|_: &str| Ok(()))),
            health_only,
        };
        tokio::spawn(serve_admin_with(listener, admin, limits));
        (addr, proxy)
    }

    /// True when the server has closed `s` (end of stream or reset) within
    /// `within`, reading on past any response; false when it is still open.
    async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(within, s.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    async fn get_live(s: &mut TcpStream) {
        s.write_all(b"GET /live HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("write");
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.expect("a response");
        assert_eq!(&head, b"HTTP/1.1 200");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_and_half_sent_admin_connections_close_after_the_header_read_timeout() {
        for health_only in [false, true] {
            let (addr, _proxy) = admin_listener(health_only, AdminLimits::default()).await;
            let mut silent = TcpStream::connect(addr).await.expect("connect");
            let mut half = TcpStream::connect(addr).await.expect("connect");
            half.write_all(b"GET /live HTTP/1.1\r\nHost: a")
                .await
                .expect("write");
            let mut kept = TcpStream::connect(addr).await.expect("connect");
            get_live(&mut kept).await;
            tokio::time::sleep(HEADER_READ_TIMEOUT - Duration::from_secs(1)).await;
            for s in [&mut silent, &mut half, &mut kept] {
                assert!(
                    !closed_within(s, Duration::from_millis(10)).await,
                    "open before the timeout"
                );
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            for (what, s) in [
                ("silent", &mut silent),
                ("half-sent", &mut half),
                ("idle keep-alive", &mut kept),
            ] {
                assert!(
                    closed_within(s, Duration::from_secs(1)).await,
                    "the {what} connection is closed after the header read timeout (health_only: {health_only})"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_admin_connection_over_the_cap_is_closed_at_once_and_counted() {
        let cap = ADMIN_MAX_CONNECTIONS;
        for (health_only, which) in [(false, Listener::Admin), (true, Listener::Health)] {
            let (addr, proxy) = admin_listener(health_only, AdminLimits::default()).await;
            let mut held = Vec::new();
            for _ in 0..cap {
                held.push(TcpStream::connect(addr).await.expect("connect"));
            }
            // Every held connection has been accepted before the next.
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Its reset may come before the connect returns.
            let over = TcpStream::connect(addr).await;
            assert!(
                match over {
                    Ok(mut over) => closed_within(&mut over, Duration::from_secs(1)).await,
                    Err(_) => true,
                },
                "connection {} is closed at once (health_only: {health_only})",
                cap + 1
            );
            for s in &mut held {
                assert!(!closed_within(s, Duration::from_millis(10)).await);
            }
            let counted = proxy.metrics.connections(which);
            assert_eq!((counted.open_now(), counted.refused()), (cap, 1));
            // Once one closes, a new one is served.
            held.pop();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut again = TcpStream::connect(addr).await.expect("connect");
            get_live(&mut again).await;
            let text = metrics_text(&proxy);
            let label = which.label();
            assert!(
                text.contains(&format!(
                    "reprise_connections_refused_total{{listener=\"{label}\"}} 1\n"
                )),
                "{text}"
            );
            assert!(
                text.contains(&format!(
                    "reprise_connections_open{{listener=\"{label}\"}} {cap}\n"
                )),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn diagnostics_are_on_the_admin_listener_only() {
        for (health_only, status) in [(false, "HTTP/1.1 200"), (true, "HTTP/1.1 404")] {
            let (addr, _proxy) = admin_listener(health_only, AdminLimits::default()).await;
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"GET /diagnostics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                .await
                .expect("write");
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.expect("read");
            let out = String::from_utf8_lossy(&out);
            assert!(out.starts_with(status), "health_only: {health_only}: {out}");
            if !health_only {
                assert!(out.contains("{\n  \"requests\": []\n}"), "{out}");
            }
        }
    }

    /// Short limits, so that the tests below run in real time.
    const SHORT: AdminLimits = AdminLimits {
        header_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(300),
        max_connections: 4,
    };

    #[tokio::test]
    async fn a_trickled_request_body_gets_no_longer_than_a_head() {
        let (addr, _proxy) = admin_listener(false, SHORT).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"PUT /log-level HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nd")
            .await
            .expect("write");
        // A byte now and then keeps the bytes moving, never the request whole.
        let trickle = async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if s.write_all(b"e").await.is_err() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), trickle).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_its_response_is_closed_when_the_bytes_stop() {
        let (addr, proxy) = admin_listener(false, SHORT).await;
        // A /config larger than the socket buffers hold.
        let mut file = String::from("upstreams:\n");
        for i in 0..20_000 {
            let (a, b) = (i / 250, i % 250);
            file.push_str(&format!(
                "  - name: svc-{i}\n    endpoints: [{{ address: 10.1.{a}.{b}, port: 80 }}]\n"
            ));
        }
        proxy.reload(reprise_crds::file::parse(&file, "big.yaml").expect("valid"));
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /config HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("write");
        // Not read: once the response's bytes stop moving for the short
        // limit, the connection is closed. Looked for until 10 s (rendering
        // 20,000 upstreams takes a while on a loaded machine), not slept.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while proxy.metrics.connections(Listener::Admin).open_now() > 0
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(proxy.metrics.connections(Listener::Admin).open_now(), 0);
        drop(s);
    }
}
