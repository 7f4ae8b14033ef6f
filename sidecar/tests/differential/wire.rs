//! Just enough HTTP/1.1 on raw sockets for the differential tests: strict
//! heads and framing for what the proxies send us (their responses to the
//! client, their requests to the upstream), read against a deadline.
//!
//! Strict on purpose: this is the yardstick, not a peer. A head is CRLF
//! lines only, no obs-fold, token header names, no control bytes in values;
//! a message with both Transfer-Encoding and Content-Length, or with lengths
//! that disagree, is refused. Heads may be large (1 MiB) and have any number
//! of fields, so what a proxy forwards is seen as sent.

use std::time::Duration;

use reprise_testkit::http1::Chunked;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Largest head read.
const MAX_HEAD: usize = 1 << 20;
/// Largest body read.
const MAX_BODY: usize = 4 << 20;

/// Why a message could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The peer closed (or reset) before the first byte of the message.
    Eof,
    /// The peer closed part-way through the message (after `status`, for a
    /// response whose head was complete).
    Cut(Option<u16>),
    /// Nothing (more) arrived before the deadline.
    Timeout,
    /// Not well-formed HTTP/1.1.
    Invalid(String),
}

fn invalid<T>(why: impl Into<String>) -> Result<T, WireError> {
    Err(WireError::Invalid(why.into()))
}

/// A parsed head: the start line's first two parts (checked whole) and the
/// fields.
#[derive(Clone, Debug)]
pub struct Head {
    /// Method, or the HTTP version of a response.
    pub first: String,
    /// Request target, or the status code of a response.
    pub second: String,
    /// Fields, names lower-cased, values with surrounding whitespace removed.
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Head {
    /// Every value of field `name`.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// True when `name` is present.
    pub fn has(&self, name: &str) -> bool {
        self.values(name).next().is_some()
    }

    /// The status code of a response head.
    pub fn status(&self) -> u16 {
        self.second.parse().unwrap_or_default()
    }

    /// True when a `Connection` field lists `close`.
    pub fn closes(&self) -> bool {
        self.values("connection").any(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("close"))
        })
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a head at the start of `buf`: `None` while incomplete, else the
/// head and its length with the blank line.
pub fn parse_head(buf: &[u8], response: bool) -> Result<Option<(Head, usize)>, WireError> {
    let mut lines = Vec::new();
    let mut at = 0;
    // Each round consumes one line; the buffer bounds them.
    loop {
        let Some(lf) = buf[at..].iter().position(|&b| b == b'\n') else {
            if buf.len() > MAX_HEAD {
                return invalid("head over 1 MiB");
            }
            return Ok(None);
        };
        let end = at + lf;
        if end == at || buf[end - 1] != b'\r' {
            return invalid("bare LF in the head");
        }
        let line = &buf[at..end - 1];
        at = end + 1;
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    let Some((start, field_lines)) = lines.split_first() else {
        return invalid("empty head");
    };
    let start = String::from_utf8_lossy(start).into_owned();
    let parts: Vec<&str> = start.splitn(3, ' ').collect();
    let (first, second, third) = match parts.as_slice() {
        [a, b, c] => (a.to_string(), b.to_string(), c.to_string()),
        // A status line may omit the reason phrase's space (many servers do).
        [a, b] if response => (a.to_string(), b.to_string(), String::new()),
        _ => return invalid(format!("start line {start:?}")),
    };
    if response {
        if !matches!(first.as_str(), "HTTP/1.1" | "HTTP/1.0")
            || second.len() != 3
            || !second.bytes().all(|b| b.is_ascii_digit())
        {
            return invalid(format!("status line {start:?}"));
        }
    } else if first.is_empty()
        || !first.bytes().all(is_tchar)
        || second.is_empty()
        || second.bytes().any(|b| b <= b' ' || b == 0x7f)
        || !matches!(third.as_str(), "HTTP/1.1" | "HTTP/1.0")
    {
        return invalid(format!("request line {start:?}"));
    }
    let mut fields = Vec::with_capacity(field_lines.len());
    for line in field_lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return invalid(format!("field without a colon {:?}", lossy(line)));
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().copied().all(is_tchar) {
            return invalid(format!("field name {:?}", lossy(name)));
        }
        let value = value.trim_ascii();
        if value.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return invalid(format!("control byte in field {:?}", lossy(name)));
        }
        fields.push((
            String::from_utf8_lossy(name).to_ascii_lowercase(),
            value.to_vec(),
        ));
    }
    Ok(Some((
        Head {
            first,
            second,
            fields,
        },
        at,
    )))
}

/// How a body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// This many bytes.
    Length(usize),
    /// Chunked.
    Chunked,
    /// Until the connection closes (responses only).
    UntilClose,
}

/// RFC 9112 §6.3, strictly: chunked last or (responses) close-delimited; a
/// length must be one run of digits, repeats equal; both at once refused.
pub fn framing(head: &Head, response: bool, method: &str) -> Result<Framing, WireError> {
    if response {
        let status = head.status();
        if method == "HEAD" || (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok(Framing::Empty);
        }
    }
    let codings: Vec<String> = head
        .values("transfer-encoding")
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut length: Option<usize> = None;
    for value in head.values("content-length") {
        for part in String::from_utf8_lossy(value).split(',') {
            let part = part.trim();
            if part.is_empty() || part.len() > 15 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return invalid(format!("content-length {part:?}"));
            }
            let n: usize = part.parse().unwrap_or(usize::MAX);
            if length.is_some_and(|l| l != n) {
                return invalid("content-length values differ");
            }
            length = Some(n);
        }
    }
    if !codings.is_empty() {
        if length.is_some() {
            return invalid("both transfer-encoding and content-length");
        }
        return match codings.last().map(String::as_str) {
            Some("chunked") => Ok(Framing::Chunked),
            _ if response => Ok(Framing::UntilClose),
            _ => invalid(format!("transfer-encoding {codings:?} not chunked last")),
        };
    }
    Ok(match length {
        Some(n) => Framing::Length(n),
        None if response => Framing::UntilClose,
        None => Framing::Empty,
    })
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A raw connection with what has been read but not consumed.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Connects to `addr` within `within`.
    pub async fn connect(addr: std::net::SocketAddr, within: Duration) -> std::io::Result<Conn> {
        match tokio::time::timeout(within, TcpStream::connect(addr)).await {
            Ok(s) => Ok(Conn::new(s?)),
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        }
    }

    /// Bytes read but not consumed (a head that failed to parse stays here).
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Writes all of `bytes`.
    pub async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Sends FIN, then reads until the peer closes too (at most `within`), so
    /// closing never turns into a reset that could destroy what was written.
    pub async fn close(mut self, within: Duration) {
        let _ = self.stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let deadline = Instant::now() + within;
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, self.stream.read(&mut sink)).await {
            if n == 0 {
                break;
            }
        }
    }

    /// Reads more bytes; false at end of stream (a reset counts as one).
    async fn fill(&mut self, deadline: Instant) -> Result<bool, WireError> {
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
            Err(_) => Err(WireError::Timeout),
            Ok(Err(_)) | Ok(Ok(0)) => Ok(false),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
        }
    }

    /// Reads a head. [`WireError::Eof`] when the connection ends before its
    /// first byte. Leading empty lines before a request are skipped
    /// (RFC 9112 §2.2).
    pub async fn read_head(
        &mut self,
        response: bool,
        deadline: Instant,
    ) -> Result<Head, WireError> {
        // Each round but the last reads at least one byte; MAX_HEAD bounds them.
        for _ in 0..=MAX_HEAD {
            if !response {
                while self.buf.starts_with(b"\r\n") {
                    self.buf.drain(..2);
                }
            }
            if !self.buf.is_empty() {
                if let Some((head, n)) = parse_head(&self.buf, response)? {
                    self.buf.drain(..n);
                    return Ok(head);
                }
            }
            if !self.fill(deadline).await? {
                return Err(if self.buf.is_empty() {
                    WireError::Eof
                } else {
                    WireError::Cut(None)
                });
            }
        }
        invalid("head never completed")
    }

    /// Reads a body framed as `framing`; `status` names the message in a
    /// [`WireError::Cut`].
    pub async fn read_body(
        &mut self,
        framing: Framing,
        status: Option<u16>,
        deadline: Instant,
    ) -> Result<Vec<u8>, WireError> {
        let cut = WireError::Cut(status);
        match framing {
            Framing::Empty => Ok(Vec::new()),
            Framing::Length(n) if n > MAX_BODY => invalid(format!("body of {n} bytes")),
            Framing::Length(n) => {
                for _ in 0..=n {
                    if self.buf.len() >= n {
                        return Ok(self.buf.drain(..n).collect());
                    }
                    if !self.fill(deadline).await? {
                        return Err(cut);
                    }
                }
                Err(cut)
            }
            Framing::Chunked => {
                let mut chunked = Chunked::default();
                for _ in 0..=MAX_BODY {
                    let used = chunked
                        .decode(&self.buf)
                        .map_err(|e| WireError::Invalid(e.to_string()))?;
                    self.buf.drain(..used);
                    if chunked.is_done() {
                        return Ok(chunked.into_body());
                    }
                    if !self.fill(deadline).await? {
                        return Err(cut);
                    }
                }
                Err(cut)
            }
            Framing::UntilClose => {
                for _ in 0..=MAX_BODY {
                    if self.buf.len() > MAX_BODY {
                        return invalid("body over 4 MiB");
                    }
                    if !self.fill(deadline).await? {
                        return Ok(std::mem::take(&mut self.buf));
                    }
                }
                invalid("body never ended")
            }
        }
    }

    /// Reads one final response to a `method` request (interim 1xx other than
    /// 101 skipped): its head, body and whether its body ran to the close.
    pub async fn read_response(
        &mut self,
        method: &str,
        deadline: Instant,
    ) -> Result<(Head, Vec<u8>, Framing), WireError> {
        // At most a few interim responses before the final one.
        for _ in 0..8 {
            let head = self.read_head(true, deadline).await?;
            let status = head.status();
            let framing = framing(&head, true, method)?;
            let body = self.read_body(framing, Some(status), deadline).await?;
            if (100..200).contains(&status) && status != 101 {
                continue;
            }
            return Ok((head, body, framing));
        }
        invalid("more than 8 interim responses")
    }
}
