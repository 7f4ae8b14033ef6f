//! One HTTP/1.1 connection to an endpoint, driven by the request using it.
//!
//! The contract:
//! - [`send`] writes the request head (with the body's first bytes when they
//!   are ready, in one write), keeps writing the body while it waits for the
//!   response head, and returns the response with an [`Http1Body`] that owns
//!   the connection. No task per connection and no channel per request:
//!   hyper's client spent about 14,700 instructions per request on its
//!   connection task and dispatch (`e2e/bench/results/2026-12-01-issue18.md`).
//! - A body still being written when the response head arrives goes on
//!   being written as the response body is read (an endpoint may answer
//!   early, or echo as it reads); the connection is reused only if both ended.
//! - The connection goes back to its pool in the poll that yields the body's
//!   last frame, if the endpoint allows it (`keep_alive`), the request body
//!   was written whole, and no byte past the response arrived (such a byte
//!   would be read as the next response's: a desync). A body dropped early
//!   goes back only if the rest of it is already buffered; otherwise the
//!   connection closes, as Envoy does with an upstream stream reset.
//! - An error before any byte of the request was written on a pooled
//!   connection hands the request back unsent ([`Failed::Unsent`]), unless
//!   part of its body was already taken to go behind the head: then it is a
//!   failure at the connect stage (nothing reached the endpoint), and the
//!   retry engine's next attempt replays the body whole.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::Response;
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::codec::{self, Decoded, Decoder, Encoding, WireError};
use super::Http1Pool;
use crate::proxy::tunnel::prefixed::Prefixed;
use crate::retry::attempt::{AttemptFields, AttemptRequest, RequestHead};
use crate::retry::failure::Stage;
use crate::retry::replay_body::{AttemptBody, BoxError};

/// First read buffer of a connection: one response head and a small body
/// (hyper's 8 KiB).
const READ_INIT: usize = 8 * 1024;

/// Largest read buffer: a read that fills the buffer doubles the next one up
/// to this (hyper's adaptive reads grow to about 400 KiB). At 64 KiB a 1 GiB
/// download through the sidecar ran at 878 MiB/s against 1,055 with hyper's
/// client (`e2e/bench/results/2026-12-01-2030.md`, scenario 5).
const READ_MAX: usize = 256 * 1024;

/// Body bytes copied behind the head (or a chunk-size line) into one write;
/// larger frames are written from their own buffer.
const COALESCE: usize = 16 * 1024;

/// One connection: the socket and the bytes read from it not yet consumed.
#[derive(Debug)]
pub(crate) struct Conn {
    io: TcpStream,
    read: BytesMut,
    read_size: usize,
    /// The head buffer, kept between requests.
    out: Vec<u8>,
    /// The response head parser's field offsets, kept between responses.
    spans: codec::Spans,
}

impl Conn {
    pub(crate) fn new(io: TcpStream) -> Box<Self> {
        Box::new(Self {
            io,
            read: BytesMut::new(),
            read_size: READ_INIT,
            out: Vec::new(),
            spans: codec::Spans::new(),
        })
    }

    /// Nothing arrived while the connection sat idle: no close, no stray
    /// bytes. Reads the readiness the reactor already recorded (no system
    /// call) unless it says something arrived.
    pub(crate) fn is_open(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match self.io.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            // A stale readiness (the last read took everything without
            // seeing `WouldBlock`) or a real event: one peek tells.
            Poll::Ready(Ok(())) => matches!(
                self.io.try_read(&mut [0u8; 1]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            ),
        }
    }

    /// Reads more into the buffer; `Ok(0)` at the endpoint's close.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.read.capacity() - self.read.len() < 1024 {
            self.read.reserve(self.read_size);
        }
        let room = self.read.capacity() - self.read.len();
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.read
        ))?;
        if n == room && self.read_size < READ_MAX {
            self.read_size *= 2;
        }
        Poll::Ready(Ok(n))
    }
}

/// Why [`send`] returned no response.
#[derive(Debug)]
pub(crate) enum Failed<'t> {
    /// Not a byte of the request was written: it may go on another
    /// connection as if this one had never been tried.
    Unsent(Box<AttemptRequest<'t>>, WireError),
    /// The request may have reached the endpoint.
    Sent(WireError),
}

/// Sends `request` on `conn` and waits for the response head. The head is
/// encoded from the template's fields and the attempt's own, with no copy
/// of the header map.
pub(crate) async fn send<'t>(
    mut conn: Box<Conn>,
    request: AttemptRequest<'t>,
    pool: &Arc<Http1Pool>,
) -> Result<Response<Http1Body>, Failed<'t>> {
    let AttemptRequest {
        head: template,
        fields,
        authority,
        body,
    } = request;
    let head = &*template;
    let hint = if body.is_end_stream() {
        None
    } else {
        Some(body.size_hint().exact())
    };
    let framing = codec::request_framing(&head.method, &head.headers, hint);
    let encoding = framing.encoding;
    let close = head
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let mut out = Outgoing::new(std::mem::take(&mut conn.out), encoding, &head.headers);
    encode_head(&mut out.buf, head, &framing, &fields);
    // A body the head says is empty is never read (hyper's rule for a GET
    // whose body length is unknown).
    let mut body = Some(body).filter(|_| encoding != Encoding::Length(0));
    out.body = body.take();

    let mut writing = true;
    let mut write_failure: Option<WireError> = None;
    let method = &head.method;
    let head = poll_fn(|cx| {
        if writing {
            match out.poll_write(&mut conn.io, cx) {
                Poll::Ready(Ok(())) => writing = false,
                Poll::Ready(Err(e)) => {
                    writing = false;
                    if e.kind == crate::retry::FailureKind::RequestBodyError || !out.wrote_any {
                        return Poll::Ready(Err(e));
                    }
                    // The endpoint may have answered before it stopped
                    // reading (a 413, say): its response wins if it comes.
                    write_failure = Some(e);
                }
                Poll::Pending => {}
            }
        }
        loop {
            if !conn.read.is_empty() {
                if let Some(head) = codec::parse_response(&mut conn.read, method, &mut conn.spans)?
                {
                    return Poll::Ready(Ok(head));
                }
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => {
                    return Poll::Ready(Err(write_failure.take().unwrap_or_else(|| {
                        WireError::closed("endpoint closed the connection before responding")
                    })))
                }
                Ok(_) => {}
                Err(e) => {
                    return Poll::Ready(Err(write_failure
                        .take()
                        .unwrap_or_else(|| WireError::io("reading the response head", e))))
                }
            }
        }
    })
    .await;
    let head = match head {
        Ok(head) => head,
        Err(e) if !out.wrote_any && e.kind != crate::retry::FailureKind::RequestBodyError => {
            if out.read_body {
                // Nothing reached the endpoint, but part of this attempt's
                // body was taken to go behind the head: it cannot be sent
                // again from here. A failure before anything left (a new
                // attempt replays the body whole).
                let mut e = e;
                e.stage = Stage::Connect;
                return Err(Failed::Sent(e));
            }
            let body = out.body.take().unwrap_or(AttemptBody::Empty);
            return Err(Failed::Unsent(
                Box::new(AttemptRequest {
                    head: template,
                    fields,
                    authority,
                    body,
                }),
                e,
            ));
        }
        Err(e) => return Err(Failed::Sent(e)),
    };
    let out = if writing {
        Some(Box::new(out))
    } else {
        conn.out = out.into_buffer();
        None
    };
    let mut response = Response::new(Http1Body {
        decoder: Decoder::new(head.framing),
        keep_alive: head.keep_alive && !close,
        upgrade: head.upgrade,
        hop_by_hop: head.hop_by_hop,
        conn: Some(conn),
        out,
        pool: Arc::clone(pool),
    });
    *response.status_mut() = head.status;
    *response.version_mut() = head.version;
    *response.headers_mut() = head.headers;
    Ok(response)
}

/// Encodes the head into `dst`: the request line, the template's fields
/// less those the framing drops or the attempt replaces, then the attempt's
/// and the framing's.
fn encode_head(
    dst: &mut Vec<u8>,
    head: &RequestHead,
    framing: &codec::RequestFraming,
    fields: &AttemptFields,
) {
    let target = head.path_and_query.as_str();
    let target = if target.is_empty() { "/" } else { target };
    dst.reserve(160 + target.len() + head.headers.len() * 32);
    codec::encode_request_line(dst, &head.method, target);
    codec::encode_fields(dst, &head.headers, |name| {
        framing.drop.as_ref() == Some(name) || fields.replaces(name)
    });
    fields.for_each(|name, value| codec::encode_field(dst, name, value));
    if let Some((name, value)) = &framing.add {
        codec::encode_field(dst, name, value);
    }
    dst.extend_from_slice(b"\r\n");
}

/// The request on its way out: the bytes queued (head, chunk framing, small
/// frames), a large frame written from its own buffer, then the rest of the
/// body as it arrives.
#[derive(Debug)]
struct Outgoing {
    buf: Vec<u8>,
    pos: usize,
    data: Bytes,
    /// A chunk's CRLF is owed after `data`.
    data_crlf: bool,
    body: Option<AttemptBody>,
    encoding: Encoding,
    /// Body bytes the declared length still allows.
    left: u64,
    /// Trailer fields the request declared (sent only for chunked bodies).
    trailers: Vec<HeaderName>,
    wrote_any: bool,
    /// A frame of the body has been taken (so the request cannot be handed
    /// back unsent).
    read_body: bool,
}

impl Outgoing {
    fn new(mut buf: Vec<u8>, encoding: Encoding, headers: &http::HeaderMap) -> Self {
        buf.clear();
        let trailers = if encoding == Encoding::Chunked && headers.contains_key(header::TRAILER) {
            codec::declared_trailers(headers)
        } else {
            Vec::new()
        };
        Self {
            buf,
            pos: 0,
            data: Bytes::new(),
            data_crlf: false,
            body: None,
            encoding,
            left: match encoding {
                Encoding::Length(n) => n,
                Encoding::Chunked => 0,
            },
            trailers,
            wrote_any: false,
            read_body: false,
        }
    }

    fn into_buffer(mut self) -> Vec<u8> {
        self.buf.clear();
        std::mem::take(&mut self.buf)
    }

    /// Writes everything queued and the body's frames as they come; ready
    /// once the body has ended and every byte is written.
    fn poll_write(
        &mut self,
        io: &mut TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), WireError>> {
        loop {
            // Gather what the body has ready behind the queued bytes.
            if self.data.is_empty() && self.buf.len() - self.pos < COALESCE {
                if let Some(body) = self.body.as_mut() {
                    if let Poll::Ready(frame) = Pin::new(body).poll_frame(cx) {
                        self.read_body = true;
                        self.queue(frame)?;
                        continue;
                    }
                }
            }
            if self.pos < self.buf.len() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.buf[self.pos..]))
                    .map_err(|e| WireError::io("writing the request", e))?;
                if n == 0 {
                    return Poll::Ready(Err(WireError::closed(
                        "endpoint stopped reading the request",
                    )));
                }
                self.wrote_any = true;
                self.pos += n;
                if self.pos == self.buf.len() {
                    self.buf.clear();
                    self.pos = 0;
                }
                continue;
            }
            if !self.data.is_empty() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.data))
                    .map_err(|e| WireError::io("writing the request body", e))?;
                if n == 0 {
                    return Poll::Ready(Err(WireError::closed(
                        "endpoint stopped reading the request",
                    )));
                }
                self.wrote_any = true;
                self.data.advance(n);
                if self.data.is_empty() && std::mem::take(&mut self.data_crlf) {
                    self.buf.extend_from_slice(b"\r\n");
                }
                continue;
            }
            // Nothing queued: done, or the body's waker is registered.
            return if self.body.is_none() {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            };
        }
    }

    /// Queues one polled body frame (or the body's end).
    fn queue(&mut self, frame: Option<Result<Frame<Bytes>, BoxError>>) -> Result<(), WireError> {
        let chunked = self.encoding == Encoding::Chunked;
        match frame {
            None => {
                self.body = None;
                if chunked {
                    codec::encode_last_chunk(&mut self.buf, None, &[]);
                } else if self.left != 0 {
                    return Err(WireError::request_length(
                        "request body shorter than its Content-Length",
                    ));
                }
            }
            Some(Err(e)) => {
                self.body = None;
                return Err(WireError::request_body(e));
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => {
                    if chunked {
                        codec::encode_chunk_size(&mut self.buf, data.len());
                    } else {
                        let len = data.len() as u64;
                        if len > self.left {
                            self.body = None;
                            return Err(WireError::request_length(
                                "request body longer than its Content-Length",
                            ));
                        }
                        self.left -= len;
                    }
                    if data.len() <= COALESCE / 2 {
                        self.buf.extend_from_slice(&data);
                        if chunked {
                            self.buf.extend_from_slice(b"\r\n");
                        }
                    } else {
                        self.data = data;
                        self.data_crlf = chunked;
                    }
                }
                Err(frame) => {
                    // Trailers end the body; only chunked can carry them.
                    self.body = None;
                    if chunked {
                        codec::encode_last_chunk(
                            &mut self.buf,
                            frame.trailers_ref(),
                            &self.trailers,
                        );
                    } else if self.left != 0 {
                        return Err(WireError::request_length(
                            "request body shorter than its Content-Length",
                        ));
                    }
                }
            },
        }
        Ok(())
    }
}

/// A response body read straight off its connection; the connection goes
/// back to the pool as the body ends.
#[derive(Debug)]
pub(crate) struct Http1Body {
    decoder: Decoder,
    keep_alive: bool,
    upgrade: bool,
    /// The head still holds hop-by-hop fields (the codec's `ResponseHead::hop_by_hop`).
    hop_by_hop: bool,
    /// `None` once the body ended or failed.
    conn: Option<Box<Conn>>,
    /// The request body, when it was still being written at the response.
    out: Option<Box<Outgoing>>,
    pool: Arc<Http1Pool>,
}

impl Http1Body {
    /// The response head still holds hop-by-hop fields to strip.
    pub(crate) fn hop_by_hop_in_head(&self) -> bool {
        self.hop_by_hop
    }

    /// The connection after a `101`, with the bytes of the new protocol
    /// that came behind the head.
    pub(crate) fn take_upgrade(&mut self) -> Option<Prefixed<TcpStream>> {
        if !self.upgrade {
            return None;
        }
        let conn = self.conn.take()?;
        let Conn { io, mut read, .. } = *conn;
        Some(Prefixed::new(read.split().freeze(), io))
    }

    /// The connection is no longer this body's.
    #[cfg(test)]
    pub(crate) fn conn_is_gone(&self) -> bool {
        self.conn.is_none()
    }

    /// The body has ended: the connection goes back if it can carry
    /// another request, else it closes here.
    fn finish(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.keep_alive && self.out.is_none() && conn.read.is_empty() {
            self.pool.put(conn);
        }
    }

    /// Drives the rest of the request body, if any, without waiting on it.
    fn poll_request_body(&mut self, cx: &mut Context<'_>) {
        let (Some(out), Some(conn)) = (self.out.as_mut(), self.conn.as_mut()) else {
            return;
        };
        match out.poll_write(&mut conn.io, cx) {
            Poll::Pending => {}
            Poll::Ready(Ok(())) => {
                if let Some(out) = self.out.take() {
                    conn.out = out.into_buffer();
                }
            }
            // The response stands; the connection is not reused.
            Poll::Ready(Err(_)) => {
                self.keep_alive = false;
                self.out = None;
            }
        }
    }
}

impl Body for Http1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        this.poll_request_body(cx);
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.decoder.decode(&mut conn.read) {
                Ok(Decoded::Data(data)) => {
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::Trailers(trailers)) => {
                    this.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Ok(Decoded::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
            }
            let read = ready!(conn.poll_fill(cx));
            match read {
                Ok(0) => {
                    let end = this.decoder.eof();
                    // Ended by the close: never reused.
                    this.conn = None;
                    return Poll::Ready(match end {
                        Ok(_) => None,
                        Err(e) => Some(Err(Box::new(e))),
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(Box::new(WireError::io(
                        "reading the response body",
                        e,
                    )))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for Http1Body {
    fn drop(&mut self) {
        if self.conn.is_none() || self.decoder.is_done() {
            // Ended (the connection already went back), or the body had no
            // bytes and nobody polled it.
            self.finish();
            return;
        }
        // Dropped early (a retried 503, say): its rest is usually in the
        // buffer already; read past it and the connection goes back.
        while let Some(conn) = self.conn.as_mut() {
            match self.decoder.decode(&mut conn.read) {
                Ok(Decoded::Data(_)) => {}
                Ok(Decoded::Trailers(_) | Decoded::End) => return self.finish(),
                Ok(Decoded::More) | Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use http::header::HeaderValue;
    use http::Method;

    use super::*;

    /// The head's fields, each as `name: value`, sorted.
    fn fields(head: &[u8]) -> Vec<String> {
        let text = std::str::from_utf8(head).expect("ascii");
        let mut lines: Vec<String> = text
            .split("\r\n")
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn an_attempts_fields_replace_the_templates_on_http1_as_on_http2() {
        // The application sent its own trace context and attempt header, and
        // a length that does not parse; a retry sends its own, once each.
        let mut request = AttemptRequest::fixture(
            Method::POST,
            "/a?b=1",
            "api",
            AttemptBody::Full(Some(Bytes::from_static(b"abc")), None),
        );
        let Cow::Owned(head) = &mut request.head else {
            unreachable!("the fixture owns its head");
        };
        for (name, value) in [
            ("traceparent", "00-app"),
            ("tracestate", "app=1"),
            ("x-reprise-attempt", "7"),
            ("content-length", "x"),
            ("x-app", "kept"),
        ] {
            head.headers.append(name, HeaderValue::from_static(value));
        }
        request.fields = AttemptFields::fixture(2, "00-mine");
        let framing = codec::request_framing(&head.method, &head.headers, Some(Some(3)));
        let mut out = Vec::new();
        encode_head(&mut out, head, &framing, &request.fields);
        assert!(out.starts_with(b"POST /a?b=1 HTTP/1.1\r\n"), "{out:?}");
        assert!(out.ends_with(b"\r\n\r\n"));
        let want = [
            "content-length: 3",
            "host: api",
            "traceparent: 00-mine",
            "x-app: kept",
            "x-reprise-attempt: 2",
        ];
        assert_eq!(fields(&out), want);
        // HTTP/2: the same fields but the length (h2 frames the body itself).
        let h2 = request.into_http2();
        let mut h2_fields: Vec<String> = h2
            .headers()
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.to_str().expect("ascii")))
            .filter(|f| !f.starts_with("content-length"))
            .collect();
        h2_fields.sort();
        let want_h2: Vec<&str> = want
            .iter()
            .copied()
            .filter(|f| !f.starts_with("content-length"))
            .collect();
        assert_eq!(h2_fields, want_h2);
        assert_eq!(h2.uri().to_string(), "http://api/a?b=1");
    }
}
