//! The drain on shutdown: HTTP/1 responses after it starts carry
//! `Connection: close`, a request that reaches an idle keep-alive connection
//! shortly after it is still answered, idle connections close after the grace
//! window, h2c connections get GOAWAY at once, and `serve_proxy` reports
//! whether every connection finished within the drain timeout.
//!
//! These drive `serve_proxy` directly (not `Sidecar`) to trigger the drain at
//! a chosen moment and read its result, with a raw client so the test controls
//! exactly when each request leaves.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use reprise_sidecar::Proxy;
use reprise_sidecar::{serve_proxy, DRAIN_IDLE_GRACE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::{config, Upstream};

/// How long the upstream holds back the body of `/slow` after its headers.
const BODY_DELAY: Duration = Duration::from_millis(300);

/// How long `/slower` holds back its body: past the drain's idle grace.
const LONG_BODY_DELAY: Duration = Duration::from_millis(DRAIN_IDLE_GRACE.as_millis() as u64 + 500);

/// Bound on any single wait for the proxy, so a regression fails instead of hanging.
const WAIT: Duration = Duration::from_secs(3);

/// A body that sends `data` once `sleep` has elapsed, with an exact size so
/// the head (with its content-length) leaves before the body.
struct Delayed {
    sleep: Pin<Box<tokio::time::Sleep>>,
    data: Option<Bytes>,
}

impl Body for Delayed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// A hyper HTTP/1.1 upstream: `/slow` sends its headers at once and its body
/// after [`BODY_DELAY`]; `/slower` the same after [`LONG_BODY_DELAY`]; `/hold`
/// waits 1 s before answering; anything else is answered at once. Request
/// bodies are read in full.
async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let path = req.uri().path().to_string();
                        let _ = req.into_body().collect().await;
                        if path == "/hold" {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        let delay = match path.as_str() {
                            "/slow" => BODY_DELAY,
                            "/slower" => LONG_BODY_DELAY,
                            _ => Duration::ZERO,
                        };
                        let body = Delayed {
                            sleep: Box::pin(tokio::time::sleep(delay)),
                            data: Some(Bytes::from(format!("body of {path}"))),
                        };
                        Ok::<_, Infallible>(http::Response::new(body))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Upstream {
        addr,
        log: Arc::default(),
    }
}

/// `serve_proxy` on a loopback port, with the drain under the test's control.
struct Draining {
    addr: SocketAddr,
    proxy: Arc<Proxy>,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<bool>,
}

impl Draining {
    async fn start(yaml: &str) -> Draining {
        let config = reprise_crds::file::parse(yaml, "test.yaml")
            .unwrap_or_else(|e| panic!("config: {e}\n{yaml}"));
        let proxy = Proxy::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(serve_proxy(listener, Arc::clone(&proxy), async {
            let _ = stopped.await;
        }));
        Draining {
            addr,
            proxy,
            stop: Some(stop),
            served,
        }
    }

    /// Starts the drain (as SIGTERM does) and returns once the proxy reports
    /// it, with the instant it was seen.
    async fn begin(&mut self) -> Instant {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let seen = tokio::time::timeout(WAIT, async {
            while !self.proxy.is_draining() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        assert!(seen.is_ok(), "the drain did not start");
        Instant::now()
    }

    /// What `serve_proxy` returned, waiting at most `within`.
    async fn finished(self, within: Duration) -> bool {
        tokio::time::timeout(within, self.served)
            .await
            .expect("serve_proxy returned in time")
            .expect("serve_proxy did not panic")
    }
}

/// One HTTP/1.1 response as read off the wire.
#[derive(Debug)]
struct Raw {
    status: u16,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn closes(&self) -> bool {
        self.headers
            .iter()
            .any(|(k, v)| k == "connection" && v.eq_ignore_ascii_case("close"))
    }
}

/// A hand-written HTTP/1.1 client on one connection.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client {
            stream: TcpStream::connect(addr).await.expect("connect"),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, request: &str) {
        self.stream
            .write_all(request.as_bytes())
            .await
            .expect("write request");
    }

    /// Reads more bytes into the buffer; panics on EOF, error or timeout.
    async fn fill(&mut self, what: &str) {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(WAIT, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) => panic!("connection closed while waiting for {what}"),
            Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            Ok(Err(e)) => panic!("connection failed while waiting for {what}: {e}"),
            Err(_) => panic!("no {what} within {WAIT:?}"),
        }
    }

    /// Reads a response head; the body is left for [`Client::body`].
    async fn head(&mut self) -> Raw {
        loop {
            let mut hs = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut hs);
            if let Ok(httparse::Status::Complete(n)) = resp.parse(&self.buf) {
                let raw = Raw {
                    status: resp.code.expect("status"),
                    headers: resp
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_ascii_lowercase(),
                                String::from_utf8_lossy(h.value).to_string(),
                            )
                        })
                        .collect(),
                    body: Vec::new(),
                };
                self.buf.drain(..n);
                return raw;
            }
            self.fill("a response head").await;
        }
    }

    /// Reads the content-length body of `raw`.
    async fn body(&mut self, raw: &mut Raw) {
        let len: usize = raw
            .headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map(|(_, v)| v.parse().expect("content-length"))
            .expect("a content-length body");
        while self.buf.len() < len {
            self.fill("the response body").await;
        }
        raw.body = self.buf.drain(..len).collect();
    }

    async fn response(&mut self) -> Raw {
        let mut raw = self.head().await;
        self.body(&mut raw).await;
        raw
    }

    /// Waits up to `within` for the proxy to close the connection.
    async fn closed_within(&mut self, within: Duration) -> bool {
        let mut chunk = [0u8; 64];
        matches!(
            tokio::time::timeout(within, self.stream.read(&mut chunk)).await,
            Ok(Ok(0) | Err(_))
        )
    }
}

const SLOW_GET: &str = "GET /slow HTTP/1.1\r\nHost: api\r\n\r\n";
const FAST_GET: &str = "GET /fast HTTP/1.1\r\nHost: api\r\n\r\n";
const POST: &str = "POST /post HTTP/1.1\r\nHost: api\r\nContent-Length: 5\r\n\r\nhello";

#[tokio::test]
async fn a_request_sent_just_after_the_drain_started_is_answered_with_connection_close() {
    // The soak's lost POST: the drain starts between response 1's headers and
    // its body; the client, told nothing, sends request 2 on the same connection.
    let up = upstream().await;
    let mut sidecar = Draining::start(&config(&[&up], "")).await;
    let mut client = Client::connect(sidecar.addr).await;
    client.send(SLOW_GET).await;
    let mut first = client.head().await;
    assert_eq!(first.status, 200);
    assert!(!first.closes(), "the head left before the drain: {first:?}");
    sidecar.begin().await;
    client.body(&mut first).await;
    assert_eq!(first.body, b"body of /slow");

    client.send(POST).await;
    let second = client.response().await;
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.body, b"body of /post");
    assert!(
        second.closes(),
        "a response sent while draining tells the client to reconnect: {second:?}"
    );
    assert!(
        client.closed_within(WAIT).await,
        "the proxy closes the connection after that response"
    );
    assert!(
        sidecar.finished(WAIT).await,
        "every connection finished within the drain timeout"
    );
}

#[tokio::test]
async fn a_request_after_a_response_that_outlived_the_grace_window_is_answered() {
    // Measured in the soak: a body still streaming at SIGTERM that ends after
    // the idle grace left its connection to be closed at once, and the POST
    // the client sent on it next was dropped unread. The grace now counts from
    // the end of that response, which could not say `Connection: close`.
    let up = upstream().await;
    let mut sidecar = Draining::start(&config(&[&up], "")).await;
    let mut client = Client::connect(sidecar.addr).await;
    client
        .send("GET /slower HTTP/1.1\r\nHost: api\r\n\r\n")
        .await;
    let mut first = client.head().await;
    assert_eq!(first.status, 200);
    assert!(!first.closes(), "the head left before the drain: {first:?}");
    let started = sidecar.begin().await;
    client.body(&mut first).await;
    assert_eq!(first.body, b"body of /slower");
    assert!(
        started.elapsed() > DRAIN_IDLE_GRACE,
        "the body ended after the grace from the signal ({:?})",
        started.elapsed()
    );

    client.send(POST).await;
    let second = client.response().await;
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.body, b"body of /post");
    assert!(second.closes(), "{second:?}");
    assert!(client.closed_within(WAIT).await);
    assert!(sidecar.finished(WAIT).await);
}

#[tokio::test]
async fn an_open_tunnel_counts_as_in_flight_until_it_closes() {
    let up = upstream().await;
    let mut sidecar = Draining::start(&config(&[&up], "")).await;
    let mut client = Client::connect(sidecar.addr).await;
    client
        .send("CONNECT api:80 HTTP/1.1\r\nHost: api:80\r\n\r\n")
        .await;
    let opened = client.head().await;
    assert_eq!(opened.status, 200, "{opened:?}");
    sidecar.begin().await;
    // Past the grace window the tunnel still carries a request end to end.
    tokio::time::sleep(DRAIN_IDLE_GRACE + Duration::from_millis(200)).await;
    client.send(FAST_GET).await;
    let through = client.response().await;
    assert_eq!(through.body, b"body of /fast", "{through:?}");
    assert!(
        !sidecar.served.is_finished(),
        "the drain waits for the open tunnel"
    );
    drop(client);
    assert!(sidecar.finished(WAIT).await, "done once the tunnel closed");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_still_serves_a_request_within_the_grace_window() {
    let up = upstream().await;
    let mut sidecar = Draining::start(&config(&[&up], "")).await;
    let mut client = Client::connect(sidecar.addr).await;
    client.send(FAST_GET).await;
    let first = client.response().await;
    assert_eq!(first.status, 200);
    assert!(!first.closes());
    sidecar.begin().await;
    tokio::time::sleep(DRAIN_IDLE_GRACE / 4).await;

    client.send(FAST_GET).await;
    let second = client.response().await;
    assert_eq!(second.status, 200, "{second:?}");
    assert!(second.closes(), "{second:?}");
    assert!(client.closed_within(WAIT).await);
    assert!(sidecar.finished(WAIT).await);
}

#[tokio::test]
async fn a_new_connection_that_has_not_spoken_yet_gets_the_grace_window_too() {
    let up = upstream().await;
    let mut sidecar = Draining::start(&config(&[&up], "")).await;
    let mut client = Client::connect(sidecar.addr).await;
    // Let the proxy accept it before the drain closes the listener.
    tokio::time::sleep(Duration::from_millis(100)).await;
    sidecar.begin().await;
    tokio::time::sleep(DRAIN_IDLE_GRACE / 4).await;

    client.send(FAST_GET).await;
    let only = client.response().await;
    assert_eq!(only.status, 200, "{only:?}");
    assert!(only.closes(), "{only:?}");
    assert!(client.closed_within(WAIT).await);
    assert!(sidecar.finished(WAIT).await);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_grace_window() {
    let up = upstream().await;
    let mut sidecar = Draining::start(&config(&[&up], "")).await;
    let mut client = Client::connect(sidecar.addr).await;
    client.send(FAST_GET).await;
    assert_eq!(client.response().await.status, 200);
    let started = sidecar.begin().await;

    let margin = Duration::from_secs(1);
    assert!(
        client.closed_within(DRAIN_IDLE_GRACE + margin).await,
        "the idle connection was closed"
    );
    let waited = started.elapsed();
    assert!(
        waited >= DRAIN_IDLE_GRACE * 3 / 4,
        "not cut the instant the drain started (closed after {waited:?})"
    );
    assert!(sidecar.finished(margin).await);
}

#[tokio::test]
async fn a_request_in_flight_finishes_and_an_overrun_drain_reports_false() {
    // A drain timeout shorter than the upstream's answer: serve_proxy gives up
    // and says so, and the client still gets its answer (the process exits
    // only after serve_proxy returns; here nothing stops the connection task).
    let up = upstream().await;
    let yaml = format!("{}proxy: {{ drain_timeout_ms: 300 }}\n", config(&[&up], ""));
    let mut sidecar = Draining::start(&yaml).await;
    let mut client = Client::connect(sidecar.addr).await;
    client.send("GET /hold HTTP/1.1\r\nHost: api\r\n\r\n").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    sidecar.begin().await;
    assert!(
        !sidecar.finished(WAIT).await,
        "a connection outlived the drain timeout"
    );
    let answer = client.response().await;
    assert_eq!(answer.status, 200);
    assert!(answer.closes(), "{answer:?}");
}

#[tokio::test]
async fn h2c_connections_get_goaway_as_soon_as_the_drain_starts() {
    let up = upstream().await;
    let mut sidecar = Draining::start(&config(&[&up], "")).await;
    let stream = TcpStream::connect(sidecar.addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let req = http::Request::get("http://api/slow")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers().get("connection").is_none(),
        "no connection header in HTTP/2"
    );
    let started = sidecar.begin().await;
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"body of /slow", "the stream in flight finished");
    let ended = tokio::time::timeout(WAIT, conn).await;
    assert!(ended.is_ok(), "the proxy ended the h2 connection");
    assert!(
        started.elapsed() < DRAIN_IDLE_GRACE,
        "h2 does not wait for the HTTP/1 grace window ({:?})",
        started.elapsed()
    );
    assert!(sidecar.finished(WAIT).await);
}

#[tokio::test]
async fn connections_waiting_in_the_backlog_when_the_drain_starts_are_served() {
    let up = upstream().await;
    let yaml = config(&[&up], "");
    let cfg = reprise_crds::file::parse(&yaml, "test.yaml").expect("config");
    let proxy = Proxy::new(cfg);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // The kernel completes these connections before the proxy accepts any:
    // they wait in the listen backlog with their requests sent.
    let mut clients = Vec::new();
    for _ in 0..5 {
        let mut c = Client::connect(addr).await;
        c.send(FAST_GET).await;
        clients.push(c);
    }
    // The drain starts at once, racing the first accept.
    let served = tokio::spawn(serve_proxy(listener, proxy, async {}));
    for c in &mut clients {
        let r = c.response().await;
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.closes(), "{r:?}");
    }
    let finished = tokio::time::timeout(WAIT, served)
        .await
        .expect("serve_proxy returned in time")
        .expect("no panic");
    assert!(finished);
}
