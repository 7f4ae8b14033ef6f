//! One HTTP/1.1 connection to an endpoint, driven by the request using it.
//!
//! The contract:
//! - [`send`] writes the request head (with the body's first bytes when they
//!   are ready, in one write), keeps writing the body while it waits for the
//!   response head, and returns the response with an [`Http1Body`] that owns
//!   the connection. No task per connection and no channel per request:
//!   hyper's client spent a large share of a request's instructions on its
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
//!
//! The parts: this file holds the connection and [`send`]; `outgoing` writes
//! the request (head, body, chunk framing) and `body` reads the response
//! body and returns the connection.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use http::header;
use http::Response;
use http_body::Body;

mod body;

pub(crate) use self::body::Http1Body;
use super::Http1Pool;
use crate::balance::client::io::EndpointIo;
use crate::exchange::body::replay::AttemptBody;
use crate::exchange::failure::Stage;
use crate::exchange::request::{AttemptFields, AttemptRequest, RequestHead};
use crate::http1::outgoing::Outgoing;
use crate::http1::{self as codec, reads, Decoder, Encoding, WireError};

/// One connection: the socket and the bytes read from it not yet consumed.
#[derive(Debug)]
pub(crate) struct Conn {
    io: EndpointIo,
    read: BytesMut,
    read_size: usize,
    /// The head buffer, kept between requests.
    out: Vec<u8>,
    /// The response head parser's field offsets, kept between responses.
    spans: codec::Spans,
}

impl Conn {
    pub(crate) fn new(io: EndpointIo) -> Box<Self> {
        Box::new(Self {
            io,
            read: BytesMut::new(),
            read_size: reads::READ_INIT,
            out: Vec::new(),
            spans: codec::Spans::new(),
        })
    }

    /// Nothing arrived while the connection sat idle: no close, no stray
    /// bytes ([`EndpointIo::is_open`]).
    pub(crate) fn is_open(&mut self) -> bool {
        self.io.is_open()
    }

    /// Reads more into the buffer; `Ok(0)` at the endpoint's close.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        reads::poll_fill(
            &mut self.io,
            &mut self.read,
            &mut self.read_size,
            reads::RESPONSE_READ_MAX,
            cx,
        )
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
                    if e.kind == crate::exchange::failure::FailureKind::RequestBodyError
                        || !out.wrote_any
                    {
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
        Err(e)
            if !out.wrote_any
                && e.kind != crate::exchange::failure::FailureKind::RequestBodyError =>
        {
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use bytes::Bytes;
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
        let h2 = request.into_http2(http::uri::Scheme::HTTP);
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
