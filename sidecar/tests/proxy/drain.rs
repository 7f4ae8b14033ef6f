//! The drain on shutdown: HTTP/1 responses after it starts carry
//! `Connection: close`, a request that reaches an idle keep-alive connection
//! shortly after it is still answered, idle connections close after the grace
//! window, h2c connections get GOAWAY at once, and `serve_proxy` reports
//! whether every connection finished within the drain timeout.
//!
//! These run `serve_proxy` in this process, trigger the drain at a chosen
//! moment and read its result, with a raw client so the test controls exactly
//! when each request leaves.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use reprise_sidecar::{serve_proxy, Proxy, DRAIN_IDLE_GRACE};
use reprise_testkit::http1::{Response, Wire};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{api, Action, Config, ProxyConfig, Sidecar, Upstream};

/// How long the upstream holds back the body of `/slow` after its headers.
const BODY_DELAY: Duration = Duration::from_millis(300);

/// How long `/slower` holds back its body: past the drain's idle grace.
const LONG_BODY_DELAY: Duration = Duration::from_millis(DRAIN_IDLE_GRACE.as_millis() as u64 + 500);

/// Bound on any single wait for the proxy, so a regression fails instead of hanging.
const WAIT: Duration = Duration::from_secs(3);

/// `/slow` sends its headers at once and its body after [`BODY_DELAY`];
/// `/slower` the same after [`LONG_BODY_DELAY`]; `/hold` waits 1 s before answering; anything else is answered at once.
/// The body is `body of PATH`.
async fn upstream() -> Upstream {
    Upstream::start(|r| {
        let body = Bytes::from(format!("body of {}", r.path));
        match r.path.as_str() {
            "/slow" => Action::SlowBody(BODY_DELAY, body),
            "/slower" => Action::SlowBody(LONG_BODY_DELAY, body),
            "/hold" => Action::Delay(
                Duration::from_secs(1),
                Box::new(Action::ReplyWith(200, Vec::new(), body)),
            ),
            _ => Action::ReplyWith(200, Vec::new(), body),
        }
    })
    .await
}

/// [`upstream`], a sidecar in front of it with `config`, and a client
/// connected to the sidecar.
async fn connected<C: Into<Config>>(
    config: impl FnOnce(&[&Upstream]) -> C,
) -> (Upstream, Sidecar, Client) {
    let up = upstream().await;
    let sidecar = Sidecar::start(config(&[&up])).await;
    let client = Client::connect(sidecar.addr).await;
    (up, sidecar, client)
}

/// A hand-written HTTP/1.1 client on one connection.
struct Client {
    wire: Wire<TcpStream>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client {
            wire: Wire::new(TcpStream::connect(addr).await.expect("connect")),
        }
    }

    async fn send(&mut self, request: &str) {
        self.wire
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .expect("write request");
    }

    /// Reads a response head; the body is left for [`Client::body`].
    async fn head(&mut self) -> Response {
        tokio::time::timeout(WAIT, self.wire.read_response_head())
            .await
            .unwrap_or_else(|_| panic!("no response head within {WAIT:?}"))
            .expect("a response head")
    }

    /// Reads the content-length body of `raw`.
    async fn body(&mut self, raw: &mut Response) {
        assert!(
            raw.header("content-length").is_some(),
            "a content-length body: {raw:?}"
        );
        tokio::time::timeout(WAIT, self.wire.read_response_body(raw, "GET"))
            .await
            .unwrap_or_else(|_| panic!("no response body within {WAIT:?}"))
            .expect("the response body");
    }

    async fn response(&mut self) -> Response {
        let mut raw = self.head().await;
        self.body(&mut raw).await;
        raw
    }

    /// Waits up to `within` for the proxy to close the connection.
    async fn closed_within(&mut self, within: Duration) -> bool {
        let mut chunk = [0u8; 64];
        matches!(
            tokio::time::timeout(within, self.wire.get_mut().read(&mut chunk)).await,
            Ok(Ok(0) | Err(_))
        )
    }
}

/// Sends a GET on `client` during the drain: it is answered 200 with
/// `Connection: close`, the connection closes after it, and every connection
/// finished within the drain timeout.
async fn answered_with_close_then_closed(mut client: Client, sidecar: Sidecar) {
    client.send(FAST_GET).await;
    let answer = client.response().await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.closes(), "{answer:?}");
    assert!(client.closed_within(WAIT).await);
    assert!(sidecar.finished(WAIT).await);
}

const SLOW_GET: &str = "GET /slow HTTP/1.1\r\nHost: api\r\n\r\n";
const FAST_GET: &str = "GET /fast HTTP/1.1\r\nHost: api\r\n\r\n";
const POST: &str = "POST /post HTTP/1.1\r\nHost: api\r\nContent-Length: 5\r\n\r\nhello";

#[tokio::test]
async fn a_request_sent_just_after_the_drain_started_is_answered_with_connection_close() {
    // The soak's lost POST: the drain starts between response 1's headers and
    // its body; the client, told nothing, sends request 2 on the same connection.
    let (_up, mut sidecar, mut client) = connected(api).await;
    client.send(SLOW_GET).await;
    let mut first = client.head().await;
    assert_eq!(first.status, 200);
    assert!(!first.closes(), "the head left before the drain: {first:?}");
    sidecar.begin_drain(WAIT).await;
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
    let (_up, mut sidecar, mut client) = connected(api).await;
    client
        .send("GET /slower HTTP/1.1\r\nHost: api\r\n\r\n")
        .await;
    let mut first = client.head().await;
    assert_eq!(first.status, 200);
    assert!(!first.closes(), "the head left before the drain: {first:?}");
    let started = sidecar.begin_drain(WAIT).await;
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
    let (_up, mut sidecar, mut client) = connected(api).await;
    client
        .send("CONNECT api:80 HTTP/1.1\r\nHost: api:80\r\n\r\n")
        .await;
    let opened = client.head().await;
    assert_eq!(opened.status, 200, "{opened:?}");
    sidecar.begin_drain(WAIT).await;
    // Past the grace window the tunnel still carries a request end to end.
    tokio::time::sleep(DRAIN_IDLE_GRACE + Duration::from_millis(200)).await;
    client.send(FAST_GET).await;
    let through = client.response().await;
    assert_eq!(through.body, b"body of /fast", "{through:?}");
    assert!(
        !sidecar.has_finished(),
        "the drain waits for the open tunnel"
    );
    drop(client);
    assert!(sidecar.finished(WAIT).await, "done once the tunnel closed");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_still_serves_a_request_within_the_grace_window() {
    let (_up, mut sidecar, mut client) = connected(api).await;
    client.send(FAST_GET).await;
    let first = client.response().await;
    assert_eq!(first.status, 200);
    assert!(!first.closes());
    sidecar.begin_drain(WAIT).await;
    tokio::time::sleep(DRAIN_IDLE_GRACE / 4).await;

    answered_with_close_then_closed(client, sidecar).await;
}

#[tokio::test]
async fn a_new_connection_that_has_not_spoken_yet_gets_the_grace_window_too() {
    let (_up, mut sidecar, client) = connected(api).await;
    // Let the proxy accept it before the drain closes the listener.
    tokio::time::sleep(Duration::from_millis(100)).await;
    sidecar.begin_drain(WAIT).await;
    tokio::time::sleep(DRAIN_IDLE_GRACE / 4).await;

    answered_with_close_then_closed(client, sidecar).await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_grace_window() {
    let (_up, mut sidecar, mut client) = connected(api).await;
    client.send(FAST_GET).await;
    assert_eq!(client.response().await.status, 200);
    let started = sidecar.begin_drain(WAIT).await;

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
    let short_drain =
        |up: &[&Upstream]| Config::from(api(up)).proxy(ProxyConfig::new().drain_timeout_ms(300));
    let (_up, mut sidecar, mut client) = connected(short_drain).await;
    client.send("GET /hold HTTP/1.1\r\nHost: api\r\n\r\n").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    sidecar.begin_drain(WAIT).await;
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
    let mut sidecar = Sidecar::start(api(&[&up])).await;
    let (mut sender, conn) = reprise_testkit::client::http2(sidecar.addr).await;
    let req = http::Request::get("http://api/slow")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers().get("connection").is_none(),
        "no connection header in HTTP/2"
    );
    let started = sidecar.begin_drain(WAIT).await;
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
    let proxy = Proxy::new(Config::from(api(&[&up])).resolve());
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
