//! Part B, request framing: a raw client writes case NN's request and, in
//! the same write, `GET /NN/smuggled`; a recording upstream parses what the
//! proxy sends it with the strict parser of [`crate::wire`] and records
//! every request (method, path, `Host`, transfer codings, body; one without
//! exactly one `Host` as unframeable), answering each with a `200` marked
//! `x-upstream: 1` so the client can tell forwarded answers from the proxy's.
//!
//! Templates: `{p}` is the case's path prefix `/NN`; `{hidden}` a whole
//! `GET /NN/hidden` request hidden in a body, which no proxy may ever let
//! reach the upstream as a request; `{hidden_hex}` its length in hex; `{CL}`
//! the length of the body as the table writes it.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::wire::{framing, Conn, WireError};

/// How long the client waits for each response.
pub const CLIENT_WAIT: Duration = Duration::from_secs(5);
/// Bound on an upstream connection with nothing to do.
const UPSTREAM_IDLE: Duration = Duration::from_secs(10);
/// Most responses read on one client connection.
const MAX_RESPONSES: usize = 6;

/// One request-framing case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    /// RFC-valid and unambiguous: Reprise must forward it as sent.
    pub valid: bool,
    /// Request line and fields, with the blank line.
    pub head: &'static str,
    /// The body as the client frames it.
    pub body: &'static str,
    /// Bytes the client writes after its body, before `GET /NN/smuggled`:
    /// part of the second message on the wire, not of the first.
    pub trailing: &'static str,
}

const fn case(name: &'static str, valid: bool, head: &'static str, body: &'static str) -> Case {
    Case {
        name,
        valid,
        head,
        body,
        trailing: "",
    }
}

const POST: &str = "POST {p}/first HTTP/1.1\r\nHost: api\r\n";
const SMUGGLE_BODY: &str = "0\r\n\r\n{hidden}";

/// The corpus: one case a line (name, RFC-valid, head, body); the head
/// starts with [`POST`] unless it says otherwise.
#[rustfmt::skip]
pub const CASES: &[Case] = &[
    case("get",                  true,  "GET {p}/first HTTP/1.1\r\nHost: api\r\n\r\n", ""),
    case("cl",                   true,  "+Content-Length: {CL}\r\n\r\n", "hello"),
    case("chunked",              true,  "+Transfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"),
    case("cl.te",                false, "+Content-Length: {CL}\r\nTransfer-Encoding: chunked\r\n\r\n", SMUGGLE_BODY),
    case("cl.te-te-first",       false, "+Transfer-Encoding: chunked\r\nContent-Length: {CL}\r\n\r\n", SMUGGLE_BODY),
    case("te.cl",                false, "+Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", "{hidden_hex}\r\n{hidden}\r\n0\r\n\r\n"),
    case("te.cl-te-first",       false, "+Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", "{hidden_hex}\r\n{hidden}\r\n0\r\n\r\n"),
    case("te-xchunked",          false, "+Content-Length: {CL}\r\nTransfer-Encoding: xchunked\r\n\r\n", SMUGGLE_BODY),
    case("te-value-lead-space",  false, "+Content-Length: {CL}\r\nTransfer-Encoding:  chunked\r\n\r\n", SMUGGLE_BODY),
    case("te-name-lead-space",   false, "POST {p}/first HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: api\r\nContent-Length: {CL}\r\n\r\n", SMUGGLE_BODY),
    case("te-trailing-space",    false, "+Content-Length: {CL}\r\nTransfer-Encoding: chunked \r\n\r\n", SMUGGLE_BODY),
    case("te-tab",               false, "+Content-Length: {CL}\r\nTransfer-Encoding:\tchunked\r\n\r\n", SMUGGLE_BODY),
    case("te-twice",             false, "+Content-Length: {CL}\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", SMUGGLE_BODY),
    case("te-chunked-identity",  false, "+Content-Length: {CL}\r\nTransfer-Encoding: chunked, identity\r\n\r\n", SMUGGLE_BODY),
    case("te-obs-fold",          false, "+Content-Length: {CL}\r\nTransfer-Encoding:\r\n chunked\r\n\r\n", SMUGGLE_BODY),
    case("te-space-before-colon",false, "+Content-Length: {CL}\r\nTransfer-Encoding : chunked\r\n\r\n", SMUGGLE_BODY),
    case("cl-space-before-colon",false, "+Content-Length : {CL}\r\n\r\n", "hello"),
    case("cl-list-5-5",          false, "+Content-Length: 5, 5\r\n\r\n", "hello"),
    case("cl-plus",              false, "+Content-Length: +5\r\n\r\n", "hello"),
    case("cl-dup-differ",        false, "+Content-Length: 5\r\nContent-Length: 6\r\n\r\n", "hello!"),
    case("http10-te-chunked",    false, "POST {p}/first HTTP/1.0\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"),
    case("bare-lf-head",         false, "POST {p}/first HTTP/1.1\nHost: api\nContent-Length: {CL}\n\n", "hello"),
    case("bare-lf-chunked",      false, "+Transfer-Encoding: chunked\r\n\r\n", "5\nhello\n0\n\n"),
    case("chunk-size-overflow",  false, "+Transfer-Encoding: chunked\r\n\r\n", "10000000000000005\r\nhello\r\n0\r\n\r\n"),
    case("chunk-size-invalid",   false, "+Transfer-Encoding: chunked\r\n\r\n", "zz\r\nhello\r\n0\r\n\r\n"),
    case("chunk-ext-quoted-lf",  false, "+Transfer-Encoding: chunked\r\n\r\n", "5;a=\"b\nc\"\r\nhello\r\n0\r\n\r\n"),
    case("chunk-ext-quoted-crlf",false, "+Transfer-Encoding: chunked\r\n\r\n", "5;a=\"\r\n0\r\n\r\n{hidden}\"\r\nhello\r\n0\r\n\r\n"),
    case("cl-on-get",            false, "GET {p}/first HTTP/1.1\r\nHost: api\r\nContent-Length: {CL}\r\n\r\n", "hello"),
    case("absolute-form",        true,  "GET http://api{p}/first HTTP/1.1\r\nHost: api\r\n\r\n", ""),
    case("request-line-2-spaces",false, "GET  {p}/first HTTP/1.1\r\nHost: api\r\n\r\n", ""),
    case("header-name-invalid",  false, "+X-Bad@Name: 1\r\nContent-Length: {CL}\r\n\r\n", "hello"),
    case("nul-in-value",         false, "+X-Nul: a\0b\r\nContent-Length: {CL}\r\n\r\n", "hello"),
    case("expect-100-continue",  true,  "+Expect: 100-continue\r\nContent-Length: {CL}\r\n\r\n", "hello"),
    case("te-gzip-chunked",      false, "+Transfer-Encoding: gzip, chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"),
    case("te-gzip-cl",           false, "+Transfer-Encoding: gzip\r\nContent-Length: {CL}\r\n\r\n", "hello"),
    case("te-identity",          false, "+Transfer-Encoding: identity\r\nContent-Length: {CL}\r\n\r\n", "hello"),
    case("te-chunked-chunked",   false, "+Transfer-Encoding: chunked, chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"),
    case("trailers",             true,  "+Transfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\nX-T: y\r\n\r\n"),
    case("trailer-bare-lf",      false, "+Transfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\nX-T: y\n\r\n"),
    case("trailer-bare-lf-hides",false, "+Transfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\nX-T: y\n{hidden}"),
    case("chunked-on-get",       false, "GET {p}/first HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"),
    case("host-twice-differ",    false, "GET {p}/first HTTP/1.1\r\nHost: api\r\nHost: other\r\n\r\n", ""),
    case("host-twice-same",      false, "GET {p}/first HTTP/1.1\r\nHost: api\r\nHost: api\r\n\r\n", ""),
    case("absolute-form-other-host", false, "GET http://api{p}/first HTTP/1.1\r\nHost: other\r\n\r\n", ""),
    case("connection-names-host",false, "GET {p}/first HTTP/1.1\r\nHost: api\r\nConnection: host\r\n\r\n", ""),
    Case { trailing: "EXTRA",  ..case("body-longer-than-cl", false, "+Content-Length: 5\r\n\r\n", "hello") },
    Case { trailing: "\r\n",   ..case("cl-then-extra-crlf",  false, "+Content-Length: 5\r\n\r\n", "hello") },
];

impl Case {
    /// The path prefix of case `n`.
    fn prefix(n: usize) -> String {
        format!("/{n:02}")
    }

    /// What the client writes: this case's request, its trailing bytes, then
    /// the real second request.
    pub fn wire(&self, n: usize) -> Vec<u8> {
        let p = Case::prefix(n);
        let hidden = format!("GET {p}/hidden HTTP/1.1\r\nHost: api\r\n\r\n");
        let body = self
            .body
            .replace("{hidden_hex}", &format!("{:x}", hidden.len()))
            .replace("{hidden}", &hidden)
            .replace("{p}", &p);
        let head = match self.head.strip_prefix('+') {
            Some(fields) => format!("{POST}{fields}"),
            None => self.head.to_string(),
        }
        .replace("{CL}", &body.len().to_string())
        .replace("{p}", &p);
        format!(
            "{head}{body}{}GET {p}/smuggled HTTP/1.1\r\nHost: api\r\n\r\n",
            self.trailing
        )
        .into_bytes()
    }

    /// The method of the real second request as the client wrote it (its
    /// trailing bytes glued on; leading empty lines are not part of it).
    pub fn second_method(&self) -> String {
        format!("{}GET", self.trailing.trim_start_matches("\r\n"))
    }
}

/// One request the upstream received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    /// The path after the case prefix (`/first`, `/smuggled`, `/hidden`).
    pub path: String,
    /// Its `Host` values, joined: which host the proxy forwarded.
    pub host: String,
    /// Its transfer codings but a final `chunked`, joined: what the body
    /// still has to be decoded from (empty: nothing).
    pub codings: String,
    pub body: Vec<u8>,
    /// Set when the request was not whole.
    pub bad: Option<Bad>,
}

/// What was wrong with a request the upstream received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bad {
    /// The proxy closed part-way through it: how a proxy that has started
    /// forwarding a request refuses the rest of it.
    Cut,
    /// The strict parser refused it (why): misframed by the proxy.
    Invalid(String),
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if self.host != "api" {
            write!(f, " host={:?}", self.host)?;
        }
        if !self.codings.is_empty() {
            write!(f, " te={:?}", self.codings)?;
        }
        if !self.body.is_empty() {
            write!(f, " {}", crate::show(&self.body))?;
        }
        match &self.bad {
            Some(Bad::Cut) => write!(f, " CUT")?,
            Some(Bad::Invalid(why)) => write!(f, " BAD({why})")?,
            None => {}
        }
        Ok(())
    }
}

/// How the client's first request was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// By the upstream, through the proxy.
    Forwarded,
    /// By the proxy itself, with this status.
    Status(u16),
    /// Not at all: closed.
    Closed,
    /// Not within [`CLIENT_WAIT`].
    Hung,
    /// With something that is not well-formed HTTP/1.1.
    Garbled(String),
}

/// What one proxy did with one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub answer: Answer,
    /// Every request of this case the upstream received, in order.
    pub seen: Vec<Seen>,
}

impl Outcome {
    /// The interpretation compared between proxies, if it forwarded.
    pub fn forwarded(&self) -> Option<&[Seen]> {
        (self.answer == Answer::Forwarded).then_some(self.seen.as_slice())
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.answer {
            Answer::Forwarded => write!(f, "fwd")?,
            Answer::Status(s) => write!(f, "rej {s}")?,
            Answer::Closed => write!(f, "rej closed")?,
            Answer::Hung => write!(f, "HUNG")?,
            Answer::Garbled(why) => write!(f, "GARBLED({why})")?,
        }
        if !self.seen.is_empty() {
            let seen: Vec<String> = self.seen.iter().map(Seen::to_string).collect();
            write!(f, " [{}]", seen.join(", "))?;
        }
        Ok(())
    }
}

type Records = Arc<Mutex<Vec<(Option<usize>, Seen)>>>;

/// The recording upstream of Part B.
#[derive(Debug)]
pub struct Upstream {
    pub addr: SocketAddr,
    records: Records,
    accept: JoinHandle<()>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let records = Records::default();
        let rec = Arc::clone(&records);
        let accept = tokio::spawn(async move {
            for _ in 0..100_000 {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(Conn::new(stream), Arc::clone(&rec)));
            }
        });
        Upstream {
            addr,
            records,
            accept,
        }
    }

    /// Takes every record: per case, and those tied to no case.
    pub fn take(&self) -> (Vec<Vec<Seen>>, Vec<Seen>) {
        let all = std::mem::take(&mut *self.records.lock().unwrap_or_else(PoisonError::into_inner));
        let mut per_case = vec![Vec::new(); CASES.len()];
        let mut untied = Vec::new();
        for (n, seen) in all {
            match n.and_then(|n| per_case.get_mut(n)) {
                Some(list) => list.push(seen),
                None => untied.push(seen),
            }
        }
        (per_case, untied)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The case index and the rest of the path of a target (origin or absolute
/// form): `/NN/rest`.
fn tie(target: &str) -> (Option<usize>, String) {
    let path = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let tied = path
        .strip_prefix('/')
        .and_then(|r| r.split_once('/'))
        .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, format!("/{rest}"))));
    match tied {
        Some((n, rest)) => (Some(n), rest),
        None => (None, target.to_string()),
    }
}

async fn serve(mut conn: Conn, records: Records) {
    let record = |n, seen| {
        records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((n, seen));
    };
    for _ in 0..64 {
        let deadline = Instant::now() + UPSTREAM_IDLE;
        let head = match conn.read_head(false, deadline).await {
            Ok(h) => h,
            Err(WireError::Invalid(why)) => {
                // Tied to its case by a loose look at the request line.
                let line = String::from_utf8_lossy(conn.buffered()).into_owned();
                let mut words = line.split([' ', '\r', '\n']);
                let method = words.next().unwrap_or_default().to_string();
                let (n, path) = tie(words.next().unwrap_or_default());
                record(
                    n,
                    Seen {
                        method,
                        path,
                        host: String::new(),
                        codings: String::new(),
                        body: Vec::new(),
                        bad: Some(Bad::Invalid(why)),
                    },
                );
                let _ = conn.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                return;
            }
            Err(_) => return,
        };
        let (n, path) = tie(&head.second);
        let joined = |name| {
            let values: Vec<String> = head
                .values(name)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect();
            values.join(", ")
        };
        let mut codings: Vec<String> = joined("transfer-encoding")
            .split(',')
            .map(|t| t.trim().to_ascii_lowercase())
            .filter(|t| !t.is_empty())
            .collect();
        if codings.last().is_some_and(|c| c == "chunked") {
            codings.pop();
        }
        let mut seen = Seen {
            method: head.first.clone(),
            path,
            host: joined("host"),
            codings: codings.join(", "),
            body: Vec::new(),
            bad: None,
        };
        // RFC 9112 §3.2: exactly one Host, which a proxy must not drop.
        let hosts = head.values("host").count();
        let framed = match hosts {
            1 => framing(&head, false, &head.first),
            n => Err(WireError::Invalid(format!("{n} Host fields"))),
        };
        let expects = head
            .values("expect")
            .any(|v| v.eq_ignore_ascii_case(b"100-continue"));
        if expects && conn.write(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err() {
            return;
        }
        let body = match framed {
            Ok(fr) => conn.read_body(fr, None, deadline).await,
            Err(e) => Err(e),
        };
        match body {
            Ok(body) => seen.body = body,
            Err(e) => {
                seen.bad = Some(match e {
                    WireError::Invalid(why) => Bad::Invalid(why),
                    _ => Bad::Cut,
                });
                record(n, seen);
                let _ = conn.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                return;
            }
        }
        let echo = format!("{} {}", head.first, head.second);
        record(n, seen);
        let response = format!(
            "HTTP/1.1 200 OK\r\nx-upstream: 1\r\nContent-Length: {}\r\n\r\n{echo}",
            echo.len()
        );
        if conn.write(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Runs case `n` through the proxy at `addr`: the answer to the first
/// request (the upstream's records are gathered by the caller).
pub async fn exchange(addr: SocketAddr, n: usize) -> Answer {
    let case = &CASES[n];
    let Ok(mut conn) = Conn::connect(addr, CLIENT_WAIT).await else {
        return Answer::Closed;
    };
    if conn.write(&case.wire(n)).await.is_err() {
        return Answer::Closed;
    }
    let mut answer = None;
    // Read on until the second request's answer, a close or a silence, so
    // everything the proxy forwards has been forwarded when this returns.
    for _ in 0..MAX_RESPONSES {
        let got = conn
            .read_response("POST", Instant::now() + CLIENT_WAIT)
            .await;
        let this = match &got {
            Ok((head, _, _)) if head.has("x-upstream") => Answer::Forwarded,
            Ok((head, _, _)) => Answer::Status(head.status()),
            Err(WireError::Eof | WireError::Cut(_)) => Answer::Closed,
            Err(WireError::Timeout) => Answer::Hung,
            Err(WireError::Invalid(why)) => Answer::Garbled(why.clone()),
        };
        let first = answer.is_none();
        if first {
            answer = Some(this);
        }
        match got {
            Ok((head, body, _)) if !body.ends_with(b"/smuggled") && !head.closes() => {}
            // After the first answer a silence just means nothing more came.
            _ => break,
        }
    }
    answer.unwrap_or(Answer::Hung)
}
