//! One-shot HTTP clients.
//!
//! Contract: [`send`] makes one request over a fresh HTTP/1.1 connection with
//! hyper and returns the whole response; a body that fails after the head is
//! part of the result, not a panic. [`exchange`] writes raw bytes on a fresh
//! connection and reads one response with the kit's own framing
//! ([`crate::http1`]), for requests a client library would not send and for
//! the admin listener. Every call gives up after [`TIMEOUT`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::http1::{Response, Wire};

/// Longest a call waits for its answer.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A response as a hyper client saw it.
#[derive(Debug)]
pub struct Reply {
    /// Status.
    pub status: u16,
    /// Headers.
    pub headers: HeaderMap,
    /// Body, or the error that cut it.
    pub body: Result<Bytes, hyper::Error>,
    /// Time from sending to the end of the body.
    pub elapsed: Duration,
}

impl Reply {
    /// The body as text; panics if the body failed.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(self.body.as_ref().expect("complete body")).into_owned()
    }

    /// The first value of header `name` as bytes.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.get(name).map(|v| v.as_bytes())
    }
}

/// Sends `method path` with `Host: host`, `body` and extra `headers` to
/// `addr` over a new HTTP/1.1 connection; panics unless a response head
/// arrives within [`TIMEOUT`].
pub async fn send(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Reply {
    let mut sender = http1(addr).await;
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::copy_from_slice(body)))
        .expect("request");
    let started = Instant::now();
    let resp = tokio::time::timeout(TIMEOUT, sender.send_request(req))
        .await
        .expect("a response head in time")
        .expect("response head");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(TIMEOUT, resp.into_body().collect())
        .await
        .expect("the body in time")
        .map(|b| b.to_bytes());
    Reply {
        status,
        headers,
        body,
        elapsed: started.elapsed(),
    }
}

/// A hyper HTTP/1.1 connection to `addr` (its driver spawned); panics when
/// the connection or handshake fails.
pub async fn http1<B>(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<B>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(conn);
    sender
}

/// A hyper h2c (prior knowledge) connection to `addr` and its driver task,
/// which ends when the connection does; panics when the handshake fails.
pub async fn http2<B>(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<B>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
)
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    (sender, tokio::spawn(conn))
}

/// Writes `raw` (one whole request) to `addr` on a new connection and reads
/// the response.
pub async fn exchange(addr: SocketAddr, raw: &[u8]) -> anyhow::Result<Response> {
    let method = raw
        .split(|b| *b == b' ')
        .next()
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .unwrap_or_default();
    let io = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(raw).await?;
        Wire::new(stream).read_response(&method).await
    };
    tokio::time::timeout(TIMEOUT, io)
        .await
        .with_context(|| format!("no answer from {addr} within {TIMEOUT:?}"))?
        .with_context(|| format!("exchange with {addr}"))
}

/// `GET path` with `Host: host` and `Connection: close`.
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> anyhow::Result<Response> {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    exchange(addr, raw.as_bytes()).await
}

/// `PUT path` with `Host: host`, `body` and `Connection: close`.
pub async fn put(addr: SocketAddr, host: &str, path: &str, body: &str) -> anyhow::Result<Response> {
    let raw = format!(
        "PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    exchange(addr, raw.as_bytes()).await
}
