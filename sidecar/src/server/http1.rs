//! HTTP/1.1 connections from clients, served with the sidecar's own codec
//! ([`crate::http1::server`]) in place of hyper's server.
//!
//! The contract, as hyper's server kept it before:
//! - Requests are served one at a time, in order; bytes of the next
//!   (pipelined) request wait in the buffer. A malformed head gets its
//!   status (`400`, `414`, `431`) and the connection closes.
//! - The request body is read as the request consumes it, one frame at a
//!   time ([`crate::proxy::body::h1_recv`]); a small body that came with
//!   its head is handed over whole. `Expect: 100-continue` is answered when
//!   the body is first read, unless the response came first.
//! - While a request is served and its body has been read, the connection
//!   watches for the client's close: a client that leaves drops its request
//!   (its attempts are cancelled), as hyper's did without half-close.
//! - After the response, the connection carries another request only if
//!   both sides allow it and the request body ended; one whose consumer
//!   stopped early is skipped if the rest is already buffered, else the
//!   connection closes (a body cannot be told from the next request).
//! - A `101`, or a `2xx` to CONNECT, hands the connection over once its head
//!   is written ([`crate::proxy::tunnel::upgrade`]), with the bytes already
//!   read behind the head.
//! - The drain's graceful shutdown ([`ConnDrain::close`]) closes the
//!   connection before its next request.
//!
//! Why: hyper's server connection spent a sizeable share of a proxied
//! request's instructions (head parse into its own types, dispatch through
//! a channel per body, a boxed timer per head, its buffered writer;
//! measured: `e2e/bench/results/2026-12-02-issue18-attempt-head.md`) and
//! kept two 8 KiB buffers per connection, idle or not.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use http::{Method, Request, Version};
use http_body::Body;
use tokio::io::AsyncWriteExt;

use super::drain::ConnDrain;
use super::request_box::RequestBox;
use super::serve_request;
use crate::exchange::body::h1_recv::{self, H1Sender, Want};
use crate::exchange::body::BoxError;
use crate::exchange::body::ClientBody;
use crate::http1::outgoing::Outgoing;
use crate::http1::server::{self as codec, BodyLength, Exchange, RequestHead};
use crate::http1::{reads, Decoded, Decoder, Encoding, Framing, Spans};
use crate::proxy::route::Destination;
use crate::proxy::tunnel::upgrade::{self, Handover, Stream};
use crate::proxy::Proxy;

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Serves one client connection until it closes (see the module docs).
pub(super) async fn serve<I: Stream>(
    io: I,
    proxy: Arc<Proxy>,
    dest: Destination,
    drain: Arc<ConnDrain>,
    max_head: usize,
) -> Result<(), BoxError> {
    let mut conn = Conn {
        io,
        read: BytesMut::new(),
        read_size: reads::READ_INIT,
        spans: Spans::new(),
        out: Vec::new(),
        max_head,
    };
    loop {
        let head = match poll_fn(|cx| conn.poll_head(&drain, cx)).await {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(()),
            Err(Refused::Head(e)) => {
                conn.refuse(&e).await;
                return Err(e.what.into());
            }
            Err(Refused::Io(e)) => return Err(e.into()),
        };
        let exchange = Exchange {
            http10: head.version == Version::HTTP_10,
            head: head.method == Method::HEAD,
            connect: head.method == Method::CONNECT,
            keep_alive: head.keep_alive,
            trailers: head.trailers,
        };
        let (request, mut feed, handover) = conn.request(head);
        // Boxed (in a finished request's box, see `request_box`): inline,
        // the request's future would size every idle connection's task.
        let mut serving = RequestBox::new(serve_request(
            Arc::clone(&proxy),
            request,
            dest.clone(),
            Some(&drain),
        ));
        let response = poll_fn(|cx| loop {
            if let Poll::Ready(response) = Pin::new(&mut serving).poll(cx) {
                return Poll::Ready(Some(response));
            }
            if conn.poll_feed(&mut feed, cx) {
                continue;
            }
            // The body is read: a close from the client now means it left.
            if feed.is_finished() && conn.read.is_empty() {
                if let Poll::Ready(Ok(0) | Err(_)) = conn.poll_fill(cx) {
                    return Poll::Ready(None);
                }
            }
            return Poll::Pending;
        })
        .await;
        drop(serving);
        let response = match response {
            Some(Ok(response)) => response,
            Some(Err(never)) => match never {},
            // The client left: its request is dropped.
            None => return Ok(()),
        };
        feed.no_continue();

        let (parts, body) = response.into_parts();
        let length = if body.is_end_stream() {
            BodyLength::Ended
        } else {
            match body.size_hint().exact() {
                Some(n) => BodyLength::Known(n),
                None => BodyLength::Unknown,
            }
        };
        let mut buf = std::mem::take(&mut conn.out);
        buf.clear();
        let framing = match codec::encode_response(
            &mut buf,
            parts.status,
            &parts.headers,
            length,
            exchange,
        ) {
            Ok(framing) => framing,
            Err(e) => {
                conn.out = buf;
                conn.refuse(&e).await;
                return Err(e.what.into());
            }
        };
        let mut out = Outgoing::with_trailers(buf, framing.encoding, framing.trailers);
        if framing.encoding != Encoding::Length(0) && length != BodyLength::Ended {
            out.body = Some(body);
        } else {
            // No body goes out (`HEAD`, `204`, ...): its end is now.
            drop(body);
        }
        let written = poll_fn(|cx| loop {
            if let Poll::Ready(result) = out.poll_write(&mut conn.io, cx) {
                return Poll::Ready(result);
            }
            if !conn.poll_feed(&mut feed, cx) {
                return Poll::Pending;
            }
        })
        .await;
        conn.out = out.into_buffer();
        if let Err(e) = written {
            return Err(e.into());
        }
        if framing.upgrade {
            if let Some(handover) = handover {
                conn.hand_over(handover);
            }
            return Ok(());
        }
        let body_ended = conn.skip_rest(feed);
        if framing.last || !body_ended {
            let _ = conn.io.shutdown().await;
            return Ok(());
        }
        conn.after_request();
    }
}

/// Why no request head came.
enum Refused {
    /// It cannot be served: answered with its status, then closed.
    Head(codec::HeadError),
    /// The connection failed.
    Io(io::Error),
}

/// One client connection: the socket, what was read from it and not yet
/// used, and the buffer response heads are encoded in.
struct Conn<I> {
    io: I,
    read: BytesMut,
    read_size: usize,
    spans: Spans,
    out: Vec<u8>,
    max_head: usize,
}

/// How the request body is being read.
enum Feed {
    /// Read whole (or none), or read to its end.
    Done,
    /// Being read for its consumer.
    Active(Box<Active>),
    /// Its consumer stopped before the end.
    Abandoned(Decoder),
    /// It failed (framing, or the client's connection): the connection
    /// cannot carry another request.
    Failed,
}

struct Active {
    decoder: Decoder,
    tx: H1Sender,
    /// `100 Continue` bytes already written, while it is still to go.
    continue_at: Option<usize>,
}

impl Feed {
    /// Nothing more will be read for the body.
    fn is_finished(&self) -> bool {
        !matches!(self, Feed::Active(_))
    }

    /// The response head is going out: too late for `100 Continue`.
    fn no_continue(&mut self) {
        if let Feed::Active(active) = self {
            active.continue_at = None;
        }
    }
}

impl<I: Stream> Conn<I> {
    /// Reads more into the buffer; `Ok(0)` at the client's close.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        reads::poll_fill(
            &mut self.io,
            &mut self.read,
            &mut self.read_size,
            reads::REQUEST_READ_MAX,
            cx,
        )
    }

    /// The next request head; `None` when the client closed between
    /// requests or the drain closes the connection.
    fn poll_head(
        &mut self,
        drain: &ConnDrain,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<RequestHead>, Refused>> {
        loop {
            if !self.read.is_empty() {
                match codec::parse_request(&mut self.read, self.max_head, &mut self.spans) {
                    Ok(Some(head)) => return Poll::Ready(Ok(Some(head))),
                    Ok(None) => {}
                    Err(e) => return Poll::Ready(Err(Refused::Head(e))),
                }
            }
            if drain.is_closing() {
                return Poll::Ready(Ok(None));
            }
            match ready!(self.poll_fill(cx)) {
                // A close between requests, or inside a head (which gets
                // no answer: there is no request to answer).
                Ok(0) => return Poll::Ready(Ok(None)),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(Refused::Io(e))),
            }
        }
    }

    /// The request for `head`, how its body will be read, and the
    /// connection's handover if it may change hands.
    fn request(&mut self, head: RequestHead) -> (Request<ClientBody>, Feed, Option<Handover>) {
        let (body, feed) = match head.framing {
            Framing::Length(0) => (ClientBody::Empty, Feed::Done),
            // All of it came with the head: no channel, nothing to feed.
            Framing::Length(n) if !head.expect_continue && self.read.len() as u64 >= n => {
                let data = self.read.split_to(n as usize).freeze();
                (ClientBody::Full(Some(data)), Feed::Done)
            }
            framing => {
                let length = match framing {
                    Framing::Length(n) => Some(n),
                    _ => None,
                };
                let (tx, rx) = h1_recv::channel(length);
                let active = Active {
                    decoder: Decoder::new(framing),
                    tx,
                    continue_at: head.expect_continue.then_some(0),
                };
                (ClientBody::Http1(rx), Feed::Active(Box::new(active)))
            }
        };
        let mut request = Request::new(body);
        *request.method_mut() = head.method;
        *request.uri_mut() = head.uri;
        *request.version_mut() = head.version;
        *request.headers_mut() = head.headers;
        let handover = head.upgrade.then(|| {
            let (pending, handover) = upgrade::pending();
            request.extensions_mut().insert(pending);
            handover
        });
        (request, feed, handover)
    }

    /// Reads the body for its consumer while it asks; true when a frame,
    /// the end or a failure was handed over (the consumer can go on).
    fn poll_feed(&mut self, feed: &mut Feed, cx: &mut Context<'_>) -> bool {
        let Feed::Active(active) = feed else {
            return false;
        };
        let mut gave = false;
        loop {
            match active.tx.poll_want(cx) {
                Poll::Pending => return gave,
                Poll::Ready(Want::Gone) => {
                    let decoder =
                        std::mem::replace(&mut active.decoder, Decoder::new(Framing::Length(0)));
                    *feed = Feed::Abandoned(decoder);
                    return gave;
                }
                Poll::Ready(Want::Frame) => {}
            }
            if let Some(at) = active.continue_at {
                match Pin::new(&mut self.io).poll_write(cx, &CONTINUE[at..]) {
                    Poll::Pending => return gave,
                    Poll::Ready(Ok(n)) if n > 0 => {
                        let at = at + n;
                        active.continue_at = (at < CONTINUE.len()).then_some(at);
                        continue;
                    }
                    Poll::Ready(Ok(_)) => {
                        active.tx.fail("client stopped reading".into());
                        *feed = Feed::Failed;
                        return true;
                    }
                    Poll::Ready(Err(e)) => {
                        active.tx.fail(Box::new(e));
                        *feed = Feed::Failed;
                        return true;
                    }
                }
            }
            match active.decoder.decode(&mut self.read) {
                Ok(Decoded::Data(data)) => {
                    let last = active.decoder.is_done();
                    active.tx.send(data, last);
                    gave = true;
                    if last {
                        *feed = Feed::Done;
                        return true;
                    }
                }
                Ok(Decoded::Trailers(trailers)) => {
                    active.tx.end(Some(trailers));
                    *feed = Feed::Done;
                    return true;
                }
                Ok(Decoded::End) => {
                    active.tx.end(None);
                    *feed = Feed::Done;
                    return true;
                }
                Ok(Decoded::More) => match self.poll_fill(cx) {
                    Poll::Pending => return gave,
                    Poll::Ready(Ok(0)) => {
                        active.tx.fail(
                            "client closed the connection before the request body ended".into(),
                        );
                        *feed = Feed::Failed;
                        return true;
                    }
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(e)) => {
                        active.tx.fail(Box::new(e));
                        *feed = Feed::Failed;
                        return true;
                    }
                },
                Err(e) => {
                    active.tx.fail(Box::new(e));
                    *feed = Feed::Failed;
                    return true;
                }
            }
        }
    }

    /// After the response: true if the request body has ended, skipping
    /// what its consumer left of it when that is already buffered.
    fn skip_rest(&mut self, feed: Feed) -> bool {
        let mut decoder = match feed {
            Feed::Done => return true,
            Feed::Failed => return false,
            Feed::Active(active) => active.decoder,
            Feed::Abandoned(decoder) => decoder,
        };
        loop {
            match decoder.decode(&mut self.read) {
                Ok(Decoded::Data(_)) => {}
                Ok(Decoded::Trailers(_) | Decoded::End) => return true,
                Ok(Decoded::More) | Err(_) => return false,
            }
        }
    }

    /// Between requests: a buffer grown by a large body is given back.
    fn after_request(&mut self) {
        if self.read.is_empty() && self.read.capacity() > reads::READ_INIT * 4 {
            self.read = BytesMut::new();
            self.read_size = reads::READ_INIT;
        }
    }

    /// Answers a head that cannot be served with `error`'s status and
    /// kind, and closes.
    async fn refuse(&mut self, error: &codec::HeadError) {
        let mut buf = std::mem::take(&mut self.out);
        buf.clear();
        codec::encode_refusal(&mut buf, error);
        let _ = self.io.write_all(&buf).await;
        let _ = self.io.shutdown().await;
    }

    /// Hands the connection over (after a `101` or a CONNECT's `2xx`).
    fn hand_over(self, handover: Handover) {
        let Conn { io, read, .. } = self;
        handover.hand_over(io, read.freeze());
    }
}
