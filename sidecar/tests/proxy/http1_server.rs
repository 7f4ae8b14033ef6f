//! The sidecar's own HTTP/1 server as a client sees it on the wire: the
//! interim `100 Continue`, pipelined requests, HTTP/1.0 clients, and the
//! framing of a response whose length the endpoint did not give.

use std::time::Duration;

use reprise_testkit::http1::{parse_responses, Wire};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

use crate::support::{api, retries, Action, Sidecar, Upstream, UpstreamConfig};

/// Bound on every read in these tests: a hang is a failure, not a wait.
const WAIT: Duration = Duration::from_secs(5);

async fn connect(sidecar: &Sidecar) -> Wire<TcpStream> {
    Wire::new(TcpStream::connect(sidecar.addr).await.expect("connect"))
}

#[tokio::test]
async fn a_client_that_expects_100_continue_gets_it_before_it_sends_the_body() {
    // The body streamed (retries off), and read for replay first (retries on).
    let replayed = retries().attempts(1).buffer_max_bytes(1024);
    for (n, retries) in [None, Some(replayed)].into_iter().enumerate() {
        let up = Upstream::always(Action::Echo).await;
        let config = match retries {
            None => api(&[&up]),
            Some(r) => api(&[&up]).retries(r),
        };
        continue_then_body(&Sidecar::start(config).await).await;
        assert_eq!(up.count(), 1, "config {n}");
    }
}

async fn continue_then_body(sidecar: &Sidecar) {
    let mut wire = connect(sidecar).await;
    wire.get_mut()
        .write_all(
            b"PUT /e HTTP/1.1\r\nHost: api\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .expect("head");
    // Nothing of the body is sent until the sidecar asks for it.
    let interim = timeout(WAIT, wire.read_response_head())
        .await
        .expect("an interim answer in time")
        .expect("a head");
    assert_eq!(interim.status, 100);
    wire.get_mut().write_all(b"hello").await.expect("body");
    let response = timeout(WAIT, wire.read_response("PUT"))
        .await
        .expect("the answer in time")
        .expect("a response");
    assert_eq!((response.status, response.text().as_str()), (200, "hello"));
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let up = Upstream::always(Action::Echo).await;
    let sidecar = Sidecar::start(api(&[&up])).await;
    let mut wire = connect(&sidecar).await;
    // Three requests in one write, the last of them split from its body.
    wire.get_mut()
        .write_all(
            b"POST /1 HTTP/1.1\r\nHost: api\r\nContent-Length: 3\r\n\r\none\
              POST /2 HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ntwo\r\n0\r\n\r\n\
              POST /3 HTTP/1.1\r\nHost: api\r\nContent-Length: 5\r\n\r\n",
        )
        .await
        .expect("requests");
    wire.get_mut().write_all(b"three").await.expect("body");
    for want in ["one", "two", "three"] {
        let r = timeout(WAIT, wire.read_response("POST"))
            .await
            .expect("in time")
            .expect("a response");
        assert_eq!((r.status, r.text().as_str()), (200, want));
        assert!(!r.closes());
    }
    assert_eq!(up.count(), 3);
}

/// Sends `request` on a new connection and reads until the sidecar closes
/// it or `WAIT` passes; returns what came and whether it closed.
async fn exchange(sidecar: &Sidecar, request: &[u8]) -> (String, bool) {
    let mut stream = TcpStream::connect(sidecar.addr).await.expect("connect");
    stream.write_all(request).await.expect("request");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match timeout(Duration::from_millis(500), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

#[tokio::test]
async fn http_1_0_clients_get_http_1_0_answers_kept_alive_only_when_they_ask() {
    let up = Upstream::always(Action::Echo).await;
    let sidecar = Sidecar::start(api(&[&up])).await;

    let (text, closed) = exchange(&sidecar, b"GET / HTTP/1.0\r\nHost: api\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "{text}");
    assert!(closed, "HTTP/1.0 closes unless kept alive: {text}");

    let two = b"GET /a HTTP/1.0\r\nHost: api\r\nConnection: keep-alive\r\n\r\n\
                GET /b HTTP/1.0\r\nHost: api\r\nConnection: keep-alive\r\n\r\n";
    let (text, closed) = exchange(&sidecar, two).await;
    assert_eq!(text.matches("HTTP/1.0 200 OK\r\n").count(), 2, "{text}");
    assert_eq!(
        text.matches("connection: keep-alive\r\n").count(),
        2,
        "{text}"
    );
    assert!(!closed, "kept alive: {text}");

    // HTTP/1.1 with `Connection: close` is told so, and closed.
    let (text, closed) = exchange(
        &sidecar,
        b"GET / HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(closed);
    assert_eq!(up.count(), 4);
}

/// An endpoint that answers every request with a chunked body of `hello`,
/// ending it with the trailer `x-sum: 5`, and declares that trailer.
async fn chunked_endpoint() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut wire = Wire::new(stream);
                while let Ok(Some(_)) = wire.read_request().await {
                    let answer =
                        b"HTTP/1.1 200 OK\r\ntrailer: x-sum\r\ntransfer-encoding: chunked\r\n\r\n\
                                   2\r\nhe\r\n3\r\nllo\r\n0\r\nx-sum: 5\r\n\r\n";
                    if wire.get_mut().write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_body_of_unknown_length_is_chunked_to_http_1_1_and_runs_to_the_close_for_http_1_0() {
    let endpoint = chunked_endpoint().await;
    let sidecar = Sidecar::start(UpstreamConfig::new("api").endpoints([endpoint])).await;

    // HTTP/1.1 that takes trailers: chunked, with the declared trailer.
    let (text, _) = exchange(
        &sidecar,
        b"GET / HTTP/1.1\r\nHost: api\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        text.contains("\r\ntransfer-encoding: chunked\r\n"),
        "{text}"
    );
    assert!(!text.contains("content-length"), "{text}");
    assert!(text.ends_with("\r\n0\r\nx-sum: 5\r\n\r\n"), "{text:?}");
    let responses = parse_responses(text.as_bytes()).expect("well framed");
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].text(), "hello");

    // HTTP/1.1 without `TE: trailers`: chunked, no trailer.
    let (text, _) = exchange(
        &sidecar,
        b"GET / HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(text.ends_with("\r\n0\r\n\r\n"), "{text:?}");
    assert_eq!(
        parse_responses(text.as_bytes()).expect("well framed")[0].text(),
        "hello"
    );

    // HTTP/1.0 cannot take chunks: the body as it is, then the close.
    let (text, closed) = exchange(&sidecar, b"GET / HTTP/1.0\r\nHost: api\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "{text}");
    assert!(!text.contains("transfer-encoding"), "{text}");
    assert!(text.ends_with("\r\n\r\nhello"), "{text:?}");
    assert!(closed);
}
