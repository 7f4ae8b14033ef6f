//! HTTP/1.1 framing on raw bytes: request and response heads (parsed by
//! `httparse`), Content-Length and chunked bodies, several messages in a row
//! on one keep-alive connection.
//!
//! Contract: [`Wire`] reads one whole message at a time off a byte stream and
//! keeps whatever follows it buffered, so the next message starts exactly
//! where this one ended. A head is at most [`MAX_HEAD`] bytes and
//! [`MAX_HEADERS`] fields, a body at most [`MAX_BODY`] bytes. A message over a
//! limit or badly framed is an `InvalidData` error; a connection that closes
//! part-way through a message is an `UnexpectedEof` error; a connection that
//! closes cleanly between messages is `Ok(None)` where that can happen.
//! Header names are lower-cased, values kept as sent (lossy UTF-8).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

pub use self::chunked::Chunked;

mod chunked;

/// Largest head (request or status line plus header fields) read.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in one head.
pub const MAX_HEADERS: usize = 128;
/// Largest body read, whatever its framing.
pub const MAX_BODY: usize = 64 << 20;
/// Bytes asked of the stream per read.
const READ_SIZE: usize = 16 * 1024;

/// Lower-case header fields in the order received.
pub type Fields = Vec<(String, String)>;

/// The first value of header `name` (any case) in `fields`.
pub fn header<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Every value of header `name` (any case) in `fields`, in order.
pub fn header_values<'a>(fields: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

pub(crate) fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn eof(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("connection closed in {what}"),
    )
}

fn fields(headers: &[httparse::Header<'_>]) -> Fields {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect()
}

/// A request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// Method, as sent.
    pub method: String,
    /// Request target, as sent (origin form, absolute form, ...).
    pub target: String,
    /// 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub minor_version: u8,
    /// Header fields.
    pub headers: Fields,
}

impl RequestHead {
    /// True when the connection ends after this request's answer.
    pub fn wants_close(&self) -> bool {
        let listed = |token: &str| {
            header_values(&self.headers, "connection")
                .iter()
                .flat_map(|v| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        if self.minor_version == 0 {
            !listed("keep-alive")
        } else {
            listed("close")
        }
    }
}

/// A request read off the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Its head.
    pub head: RequestHead,
    /// Its body, decoded (chunked framing removed).
    pub body: Vec<u8>,
}

/// A response read off the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header fields.
    pub headers: Fields,
    /// Body, decoded; empty until read.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// True when the response says `Connection: close`.
    pub fn closes(&self) -> bool {
        header_values(&self.headers, "connection")
            .iter()
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("close"))
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(usize),
    /// Chunked transfer coding.
    Chunked,
    /// Everything until the connection closes (responses only).
    UntilClose,
}

/// A Content-Length: every listed value the same run of digits (repeats are one
/// length, RFC 9110 §8.6).
fn content_length(fields: &[(String, String)]) -> io::Result<Option<usize>> {
    let mut length = None;
    for value in header_values(fields, "content-length") {
        for part in value.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid(format!("content-length {value:?}")));
            }
            let n: usize = part
                .parse()
                .map_err(|_| invalid(format!("content-length {value:?}")))?;
            if length.is_some_and(|l| l != n) {
                return Err(invalid("conflicting content-length values"));
            }
            length = Some(n);
        }
    }
    Ok(length)
}

fn is_chunked(fields: &[(String, String)]) -> bool {
    header_values(fields, "transfer-encoding")
        .iter()
        .any(|v| v.to_ascii_lowercase().contains("chunked"))
}

/// A request's body framing: chunked wins over a length, no framing is no body.
pub fn request_framing(head: &RequestHead) -> io::Result<Framing> {
    if is_chunked(&head.headers) {
        return Ok(Framing::Chunked);
    }
    Ok(content_length(&head.headers)?.map_or(Framing::Empty, Framing::Length))
}

/// A response's body framing, which also depends on the request's method.
pub fn response_framing(
    method: &str,
    status: u16,
    fields: &[(String, String)],
) -> io::Result<Framing> {
    if method.eq_ignore_ascii_case("HEAD")
        || (100..200).contains(&status)
        || status == 204
        || status == 304
    {
        return Ok(Framing::Empty);
    }
    if is_chunked(fields) {
        return Ok(Framing::Chunked);
    }
    Ok(content_length(fields)?.map_or(Framing::UntilClose, Framing::Length))
}

/// The length of a complete head from `httparse`'s verdict on `buf`: `None`
/// while incomplete, an error when malformed or over [`MAX_HEAD`].
fn head_length(
    verdict: Result<httparse::Status<usize>, httparse::Error>,
    buf: &[u8],
    what: &str,
) -> io::Result<Option<usize>> {
    match verdict {
        Ok(httparse::Status::Complete(n)) => Ok(Some(n)),
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            Err(invalid(format!("{what} head over {MAX_HEAD} bytes")))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(invalid(format!("{what} head: {e}"))),
    }
}

/// Parses a request head at the start of `buf`: `None` while incomplete, else
/// the head and its length in bytes.
pub fn parse_request_head(buf: &[u8]) -> io::Result<Option<(RequestHead, usize)>> {
    let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut hs);
    let Some(n) = head_length(req.parse(buf), buf, "request")? else {
        return Ok(None);
    };
    let head = RequestHead {
        method: req.method.unwrap_or_default().to_string(),
        target: req.path.unwrap_or_default().to_string(),
        minor_version: req.version.unwrap_or(1),
        headers: fields(req.headers),
    };
    Ok(Some((head, n)))
}

/// Parses a response head at the start of `buf`: `None` while incomplete,
/// else the response (body empty) and the head's length in bytes.
pub fn parse_response_head(buf: &[u8]) -> io::Result<Option<(Response, usize)>> {
    let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut hs);
    let Some(n) = head_length(resp.parse(buf), buf, "response")? else {
        return Ok(None);
    };
    let response = Response {
        status: resp.code.unwrap_or_default(),
        headers: fields(resp.headers),
        body: Vec::new(),
    };
    Ok(Some((response, n)))
}

/// Every response in `bytes`, which holds everything a server sent on one
/// connection (answers to requests other than HEAD). Fails on a response
/// that is not well framed or is cut short.
pub fn parse_responses(bytes: &[u8]) -> io::Result<Vec<Response>> {
    let mut out = Vec::new();
    let mut rest = bytes;
    // Each round consumes at least a head, so the input bounds the rounds.
    for _ in 0..=bytes.len() {
        if rest.is_empty() {
            return Ok(out);
        }
        let (mut r, head) = parse_response_head(rest)?.ok_or_else(|| eof("a response head"))?;
        rest = &rest[head..];
        match response_framing("GET", r.status, &r.headers)? {
            Framing::Empty => {}
            Framing::Length(n) => {
                if rest.len() < n {
                    return Err(eof("a response body"));
                }
                r.body = rest[..n].to_vec();
                rest = &rest[n..];
            }
            Framing::Chunked => {
                let mut chunked = Chunked::default();
                let used = chunked.decode(rest)?;
                if !chunked.is_done() {
                    return Err(eof("a chunked response body"));
                }
                r.body = chunked.into_body();
                rest = &rest[used..];
            }
            Framing::UntilClose => {
                r.body = rest.to_vec();
                rest = &[];
            }
        }
        out.push(r);
    }
    Ok(out)
}

/// A byte stream read as HTTP/1.1 messages.
#[derive(Debug)]
pub struct Wire<S> {
    io: S,
    buf: Vec<u8>,
}

impl<S> Wire<S> {
    /// Wraps `io`, nothing buffered yet.
    pub fn new(io: S) -> Wire<S> {
        Wire {
            io,
            buf: Vec::with_capacity(READ_SIZE),
        }
    }

    /// The stream, to write to it.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.io
    }

    /// The stream; bytes read but not yet consumed are lost.
    pub fn into_inner(self) -> S {
        self.io
    }

    /// Bytes read but not yet consumed.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }
}

impl<S: AsyncRead + Unpin> Wire<S> {
    /// Reads more bytes into the buffer; false at end of stream.
    pub async fn fill(&mut self) -> io::Result<bool> {
        self.buf.reserve(READ_SIZE);
        Ok(self.io.read_buf(&mut self.buf).await? > 0)
    }

    /// Reads one request, head and body. `None` when the stream ends cleanly
    /// before its first byte.
    pub async fn read_request(&mut self) -> io::Result<Option<Request>> {
        // Each round adds at least one byte; the head limit bounds them.
        for _ in 0..=MAX_HEAD + 1 {
            if let Some((head, n)) = parse_request_head(&self.buf)? {
                self.buf.drain(..n);
                let body = self.read_body(request_framing(&head)?).await?;
                return Ok(Some(Request { head, body }));
            }
            if !self.fill().await? {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(eof("a request head"))
                };
            }
        }
        Err(invalid("request head never completed"))
    }

    /// Reads a response head; its body stays unread (see
    /// [`Wire::read_response_body`]).
    pub async fn read_response_head(&mut self) -> io::Result<Response> {
        for _ in 0..=MAX_HEAD + 1 {
            if let Some((r, n)) = parse_response_head(&self.buf)? {
                self.buf.drain(..n);
                return Ok(r);
            }
            if !self.fill().await? {
                return Err(eof("a response head"));
            }
        }
        Err(invalid("response head never completed"))
    }

    /// Reads the body of `response`, the answer to a `method` request.
    pub async fn read_response_body(
        &mut self,
        response: &mut Response,
        method: &str,
    ) -> io::Result<()> {
        let framing = response_framing(method, response.status, &response.headers)?;
        response.body = self.read_body(framing).await?;
        Ok(())
    }

    /// Reads a whole response to a `method` request.
    pub async fn read_response(&mut self, method: &str) -> io::Result<Response> {
        let mut r = self.read_response_head().await?;
        self.read_response_body(&mut r, method).await?;
        Ok(r)
    }

    /// Reads a body framed as `framing`.
    pub async fn read_body(&mut self, framing: Framing) -> io::Result<Vec<u8>> {
        match framing {
            Framing::Empty => Ok(Vec::new()),
            Framing::Length(n) if n > MAX_BODY => {
                Err(invalid(format!("body of {n} bytes over {MAX_BODY}")))
            }
            Framing::Length(n) => {
                // Each round adds at least one byte.
                for _ in 0..=n {
                    if self.buf.len() >= n {
                        return Ok(self.buf.drain(..n).collect());
                    }
                    if !self.fill().await? {
                        return Err(eof("a body"));
                    }
                }
                Err(eof("a body"))
            }
            Framing::Chunked => {
                let mut chunked = Chunked::default();
                for _ in 0..=MAX_BODY {
                    let used = chunked.decode(&self.buf)?;
                    self.buf.drain(..used);
                    if chunked.is_done() {
                        return Ok(chunked.into_body());
                    }
                    if !self.fill().await? {
                        return Err(eof("a chunked body"));
                    }
                }
                Err(invalid("chunked body never completed"))
            }
            Framing::UntilClose => {
                for _ in 0..=MAX_BODY {
                    if self.buf.len() > MAX_BODY {
                        return Err(invalid(format!("body over {MAX_BODY} bytes")));
                    }
                    if !self.fill().await? {
                        return Ok(std::mem::take(&mut self.buf));
                    }
                }
                Err(invalid("body never ended"))
            }
        }
    }
}

#[cfg(test)]
mod tests;
