//! Part A, response framing: a raw upstream answers `/NN/first` with case
//! NN's bytes as they are, and `/NN/second` (on any connection, new or
//! reused) with a well-formed `200` whose body is `second`. A raw client asks
//! a proxy for `/NN/first`, then `/NN/second` on the same connection.
//!
//! The `NN` in the path ties every request to its case, so the cases run at
//! once over proxies whose upstream connections are shared between cases.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::wire::{framing, Conn, Framing, WireError};

/// How long the client waits for each response.
pub const CLIENT_WAIT: Duration = Duration::from_secs(5);
/// Bound on an upstream connection with nothing to do.
const UPSTREAM_IDLE: Duration = Duration::from_secs(10);

/// What the upstream does once it has written the case's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Keeps the connection open and answers `/NN/second` if it comes on
    /// it: anything left over from the first response is then read first.
    Keep,
    /// Closes it (FIN): for close-delimited bodies, and for framing a proxy
    /// might read as longer than what was sent.
    Close,
}
use After::{Close, Keep};

/// The upstream's bytes for one case.
#[derive(Clone, Copy, Debug)]
pub enum Bytes {
    Lit(&'static [u8]),
    Made(fn() -> Vec<u8>),
}

/// One response-framing case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    /// The client's first request is `HEAD` rather than `GET`.
    pub head: bool,
    /// RFC-valid: every implementation ought to forward it, and Reprise
    /// must (a guard against a codec that rejects everything).
    pub valid: bool,
    pub after: After,
    pub bytes: Bytes,
}

impl Case {
    fn bytes(&self) -> Vec<u8> {
        match self.bytes {
            Bytes::Lit(b) => b.to_vec(),
            Bytes::Made(f) => f(),
        }
    }
}

const fn case(name: &'static str, valid: bool, after: After, bytes: &'static [u8]) -> Case {
    Case {
        name,
        head: false,
        valid,
        after,
        bytes: Bytes::Lit(bytes),
    }
}

const fn head(name: &'static str, valid: bool, after: After, bytes: &'static [u8]) -> Case {
    Case {
        head: true,
        ..case(name, valid, after, bytes)
    }
}

const fn made(name: &'static str, valid: bool, after: After, bytes: fn() -> Vec<u8>) -> Case {
    Case {
        bytes: Bytes::Made(bytes),
        ..case(name, valid, after, b"")
    }
}

/// The corpus: one case a line (name, RFC-valid, after, upstream bytes).
#[rustfmt::skip]
pub const CASES: &[Case] = &[
    case("cl",                   true,  Keep,  b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    case("cl-dup-equal",         false,  Keep,  b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
    case("cl-dup-differ",        false, Keep,  b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
    case("cl-list-5-5",          false,  Keep,  b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello"),
    case("cl-plus",              false, Close, b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"),
    case("cl-minus",             false, Close, b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nhello"),
    case("cl-hex",               false, Close, b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\nhello"),
    case("cl-over-u64",          false, Close, b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551621\r\n\r\nhello"),
    case("cl-whitespace",        true,  Keep,  b"HTTP/1.1 200 OK\r\nContent-Length: \t 5 \t\r\n\r\nhello"),
    case("cl-short-then-close",  false, Close, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello"),
    case("cl-extra-response",    false, Keep,  b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"),
    case("chunked",              true,  Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    case("chunked-then-cl",      false, Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    case("cl-then-chunked",      false, Keep,  b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    case("te-chunked-chunked",   false, Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    case("te-Chunked-uppercase", true,  Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    case("te-identity",          false, Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nhello"),
    case("te-gzip-close",        false,  Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello"),
    case("te-gzip-chunked",      false,  Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    case("chunk-ext",            true,  Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\n\r\n"),
    case("chunk-hex-uppercase",  true,  Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA\r\nhelloworld\r\n0\r\n\r\n"),
    case("chunk-leading-zeros",  true,  Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0005\r\nhello\r\n0\r\n\r\n"),
    case("chunk-size-overflow",  false, Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n"),
    case("chunk-size-0x",        false, Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n"),
    case("chunk-size-space",     false, Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n"),
    case("chunk-no-crlf-after",  false, Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello0\r\n\r\n"),
    case("head-bare-lf",         false, Keep,  b"HTTP/1.1 200 OK\nContent-Length: 5\n\nhello"),
    case("chunked-bare-lf",      false, Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n"),
    case("obs-fold",             false, Keep,  b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 5\r\n\r\nhello"),
    case("obs-fold-te",          false, Close, b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    case("space-before-colon",   false, Close, b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello"),
    case("header-name-invalid",  false, Keep,  b"HTTP/1.1 200 OK\r\nX-Bad@Name: 1\r\nContent-Length: 5\r\n\r\nhello"),
    case("nul-in-value",         false, Keep,  b"HTTP/1.1 200 OK\r\nX-Nul: a\0b\r\nContent-Length: 5\r\n\r\nhello"),
    case("status-no-reason",     false,  Keep,  b"HTTP/1.1 200\r\nContent-Length: 5\r\n\r\nhello"),
    case("status-empty-reason",  true,  Keep,  b"HTTP/1.1 200 \r\nContent-Length: 5\r\n\r\nhello"),
    case("status-4-digits",      false, Close, b"HTTP/1.1 2000 OK\r\nContent-Length: 5\r\n\r\nhello"),
    case("http10-close",         true,  Close, b"HTTP/1.0 200 OK\r\n\r\nhello"),
    case("http11-close-delim",   true,  Close, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello"),
    case("http20-status-line",   false, Close, b"HTTP/2.0 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    case("204-with-body",        false, Keep,  b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"),
    case("304-cl-no-body",       true,  Keep,  b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"),
    head("head-cl-no-body",      true,  Keep,  b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
    head("head-chunked-no-body", true,  Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
    case("100-then-200",         true,  Keep,  b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    case("unsolicited-101",      false, Close, b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: evil\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    case("trailers",             true,  Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"),
    case("trailer-bare-lf",      false, Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: 1\n\r\n"),
    case("trailer-bare-lf-lf",   false, Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: 1\n\n"),
    case("te-x-custom-chunked",  false, Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: x-custom, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    case("cl-in-trailers",       false, Keep,  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: 100\r\n\r\n"),
    made("huge-header-block",    false, Keep,  huge_header_block),
    made("over-100-headers",     false, Keep,  over_100_headers),
];

/// 70 KiB of header fields: over the 64 KiB most proxies read.
fn huge_header_block() -> Vec<u8> {
    let mut b = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..70 {
        b.extend_from_slice(format!("X-Big-{i:02}: {}\r\n", "a".repeat(1010)).as_bytes());
    }
    b.extend_from_slice(b"Content-Length: 5\r\n\r\nhello");
    b
}

/// 110 small header fields: over hyper's default of 100.
fn over_100_headers() -> Vec<u8> {
    let mut b = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..110 {
        b.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    b.extend_from_slice(b"Content-Length: 5\r\n\r\nhello");
    b
}

/// What a proxy made of the first response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum First {
    /// A complete response from the upstream: its status, its transfer
    /// codings but a final `chunked` (what the body still has to be decoded
    /// from; empty: nothing) and its body.
    Forwarded {
        status: u16,
        codings: String,
        body: Vec<u8>,
    },
    /// The proxy answered 5xx itself.
    Status(u16),
    /// Closed (or reset) without a response.
    Closed,
    /// Closed part-way through a response whose head said `status`.
    Cut(Option<u16>),
    /// No complete response within [`CLIENT_WAIT`].
    Hung,
    /// Sent something that is not well-formed HTTP/1.1.
    Garbled(String),
}

/// What is compared of a forwarded response: status, codings, body.
pub type Forwarded<'a> = (u16, &'a str, &'a [u8]);

impl First {
    /// The interpretation compared between proxies, if it forwarded one.
    pub fn forwarded(&self) -> Option<Forwarded<'_>> {
        match self {
            First::Forwarded {
                status,
                codings,
                body,
            } => Some((*status, codings, body)),
            _ => None,
        }
    }
}

/// The second response on the client connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Second {
    /// Exactly the `200 second`.
    Clean,
    /// The connection was closed (not reused): fine.
    Closed,
    /// Anything else: leftover bytes, a rejection, garbage, a hang.
    Other(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub first: First,
    pub second: Second,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.first {
            First::Forwarded {
                status,
                codings,
                body,
            } => {
                write!(f, "{status} {}", crate::show(body))?;
                if !codings.is_empty() {
                    write!(f, " te={codings:?}")?;
                }
            }
            First::Status(s) => write!(f, "rej {s}")?,
            First::Closed => write!(f, "rej closed")?,
            First::Cut(Some(s)) => write!(f, "rej cut-{s}")?,
            First::Cut(None) => write!(f, "rej cut")?,
            First::Hung => write!(f, "HUNG")?,
            First::Garbled(why) => write!(f, "GARBLED({why})")?,
        }
        match &self.second {
            Second::Clean => write!(f, " | ok"),
            Second::Closed => write!(f, " | closed"),
            Second::Other(what) => write!(f, " | 2nd: {what}"),
        }
    }
}

/// The raw upstream of Part A.
#[derive(Debug)]
pub struct Upstream {
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let accept = tokio::spawn(async move {
            for _ in 0..100_000 {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(Conn::new(stream)));
            }
        });
        Upstream { addr, accept }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// `/NN/first` or `/NN/second`: the case index and which request.
fn parse_target(target: &str) -> Option<(usize, &str)> {
    let rest = target.strip_prefix('/')?;
    let (n, which) = rest.split_once('/')?;
    Some((n.parse().ok()?, which))
}

async fn serve(mut conn: Conn) {
    // A proxy sends a few requests on one connection at most.
    for _ in 0..32 {
        let deadline = Instant::now() + UPSTREAM_IDLE;
        let Ok(head) = conn.read_head(false, deadline).await else {
            return;
        };
        let Ok(fr) = framing(&head, false, &head.first) else {
            return;
        };
        if conn.read_body(fr, None, deadline).await.is_err() {
            return;
        }
        match parse_target(&head.second) {
            Some((n, "first")) if n < CASES.len() => {
                let case = &CASES[n];
                // One write, so the bytes usually arrive in one segment.
                if conn.write(&case.bytes()).await.is_err() {
                    return;
                }
                if case.after == Close {
                    conn.close(UPSTREAM_IDLE).await;
                    return;
                }
            }
            Some((_, "second")) => {
                let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond";
                if conn.write(ok).await.is_err() {
                    return;
                }
            }
            _ => {
                let _ = conn
                    .write(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )
                    .await;
                return;
            }
        }
    }
}

/// Runs case `n` through the proxy at `addr`.
pub async fn exchange(addr: SocketAddr, n: usize) -> Outcome {
    let case = &CASES[n];
    let method = if case.head { "HEAD" } else { "GET" };
    let closed = |first| Outcome {
        first,
        second: Second::Closed,
    };
    let Ok(mut conn) = Conn::connect(addr, CLIENT_WAIT).await else {
        return closed(First::Closed);
    };
    let request = format!("{method} /{n:02}/first HTTP/1.1\r\nHost: api\r\n\r\n");
    if conn.write(request.as_bytes()).await.is_err() {
        return closed(First::Closed);
    }
    let (head, body, fr) = match conn
        .read_response(method, Instant::now() + CLIENT_WAIT)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return closed(match e {
                WireError::Eof => First::Closed,
                WireError::Cut(s) => First::Cut(s),
                WireError::Timeout => First::Hung,
                WireError::Invalid(why) => First::Garbled(why),
            })
        }
    };
    let status = head.status();
    let te: Vec<String> = head
        .values("transfer-encoding")
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    let mut codings: Vec<String> = te
        .join(",")
        .split(',')
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    if codings.last().is_some_and(|c| c == "chunked") {
        codings.pop();
    }
    let first = if status >= 500 {
        First::Status(status)
    } else {
        First::Forwarded {
            status,
            codings: codings.join(", "),
            body,
        }
    };
    // A close-delimited body or `Connection: close`: nothing follows. (After a
    // 101 the second request is still sent: a client that asked for no
    // upgrade would read whatever comes back as its answer.)
    if fr == Framing::UntilClose || head.closes() {
        return closed(first);
    }
    let second = second(&mut conn, n).await;
    Outcome { first, second }
}

async fn second(conn: &mut Conn, n: usize) -> Second {
    let request = format!("GET /{n:02}/second HTTP/1.1\r\nHost: api\r\n\r\n");
    if conn.write(request.as_bytes()).await.is_err() {
        return Second::Closed;
    }
    match conn
        .read_response("GET", Instant::now() + CLIENT_WAIT)
        .await
    {
        Ok((head, body, _)) if head.status() == 200 && body == b"second" => Second::Clean,
        Ok((head, body, _)) => Second::Other(format!("{} {}", head.status(), crate::show(&body))),
        Err(WireError::Eof) => Second::Closed,
        Err(WireError::Cut(_)) => Second::Other("cut".into()),
        Err(WireError::Timeout) => Second::Other("hung".into()),
        Err(WireError::Invalid(why)) => Second::Other(format!("garbled({why})")),
    }
}
