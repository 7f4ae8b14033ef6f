//! h2c connections from clients, served with the h2 crate directly.
//!
//! The contract, as hyper's HTTP/2 server kept it before (its defaults are
//! the settings here):
//! - Each stream is one request, handled in a task of its own; a client's
//!   `RST_STREAM` before the answer drops the request (its attempts are
//!   cancelled), one during the response body drops the body.
//! - A response gets `date` when it has none (RFC 9110 §6.6.1: a proxy
//!   that forwards a response without one appends it) and `content-length`
//!   when its body's size is known and it has none. Its head carries no
//!   hop-by-hop field already (the respond phase strips them), so it is not
//!   scanned again here.
//! - The last data frame carries `END_STREAM` when the body knows it is the
//!   last (no empty frame after it); trailers end the stream otherwise.
//! - A body that fails mid-stream resets the stream (`INTERNAL_ERROR`).
//! - CONNECT (RFC 9113 §8.5): a `2xx` answer turns the stream into the
//!   tunnel's bytes ([`crate::proxy::tunnel`]).
//! - The drain's graceful shutdown sends GOAWAY (also when it comes during
//!   the handshake): streams already open finish, new ones are refused. So
//!   does a connection with no stream open for the header read timeout
//!   (its streams are counted like HTTP/1's requests), and one whose client
//!   resets most of its streams before their answer ([`Resets`]).
//!
//! In place of hyper's server, which wrapped every stream's request in its
//! own body type and piped every response through its own send buffer type
//! from a task of its own. That was a small share of an h2c request's
//! instructions; most of the rest is the h2 crate's framing, HPACK and
//! stream bookkeeping on both connections, which this does not change
//! (measured: `e2e/bench/results/2026-12-03-issue18-bodies-and-h2c.md`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::server::{Connection, Handshake, SendResponse};
use h2::{Reason, RecvStream, SendStream};
use http::header::{HeaderValue, CONTENT_LENGTH, DATE};
use http::{Method, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};

use super::drain::{ConnDrain, ServedBody};
use super::request_box::RequestBox;
use super::serve_request;
use crate::exchange::body::{ClientBody, H2Recv};
use crate::proxy::route::Destination;
use crate::proxy::tunnel::h2_stream::{self, H2Stream};
use crate::proxy::Proxy;
use crate::socket::Socket;

/// hyper's HTTP/2 server defaults, which the sidecar's h2c listener had:
/// 1 MiB windows per stream and connection, 16 KiB frames, 200 streams at
/// once, 400 KiB of response data buffered per stream, and at most 1,024
/// streams reset for the client's errors (h2's guard against rapid reset).
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 1 << 20;
const MAX_FRAME: u32 = 16 << 10;
const MAX_STREAMS: u32 = 200;
const MAX_SEND_BUFFER: usize = 400 << 10;
const MAX_ERROR_RESETS: usize = 1024;

/// A connection has opened at least this many streams before its resets
/// are judged: a client that cancels a few requests is doing its job.
const RESET_FLOOD_MIN_STREAMS: u32 = 100;

/// The client's resets of streams before their answer, on one connection.
/// Each such reset still cost an upstream request (and, on HTTP/1, the
/// upstream connection it was on), so a client that opens streams and
/// resets them at once turns one connection into a flood of upstream
/// work (rapid reset after acceptance, which the h2 crate's own guard
/// does not see: the streams were valid). Like Envoy's premature-reset
/// limit, once a connection has opened [`RESET_FLOOD_MIN_STREAMS`] streams
/// and its client reset more than half of them before the answer, it is
/// closed with `ENHANCE_YOUR_CALM`.
#[derive(Debug, Default)]
pub(super) struct Resets {
    streams: AtomicU32,
    early: AtomicU32,
}

impl Resets {
    /// A stream opened.
    fn opened(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    /// The client reset a stream before its answer.
    fn reset_early(&self) {
        self.early.fetch_add(1, Ordering::Relaxed);
    }

    /// The connection's client floods it with early resets.
    fn flooding(&self) -> bool {
        let streams = self.streams.load(Ordering::Relaxed);
        streams >= RESET_FLOOD_MIN_STREAMS && self.early.load(Ordering::Relaxed) * 2 > streams
    }
}

/// The h2 crate's server settings, request heads up to `max_head` bytes
/// (HPACK's list size).
pub(super) fn builder(max_head: usize) -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(MAX_STREAMS)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .max_local_error_reset_streams(Some(MAX_ERROR_RESETS))
        .max_header_list_size(u32::try_from(max_head).unwrap_or(u32::MAX));
    builder
}

/// One client's h2c connection: resolves when it has closed. `T` is a
/// proxy listener's socket, or the bytes of a CONNECT tunnel.
pub(super) struct H2cConnection<T = Socket> {
    state: State<T>,
    /// The drain asked for GOAWAY before the handshake finished.
    shutdown_pending: bool,
    proxy: Arc<Proxy>,
    dest: Destination,
    /// Open streams, for the idle timeout.
    streams: Arc<ConnDrain>,
    resets: Arc<Resets>,
    /// Closed for a reset flood: GOAWAY sent, the connection is ending.
    closing: bool,
}

enum State<T> {
    Handshaking(Handshake<T, Bytes>),
    Serving(Connection<T, Bytes>),
}

impl<T: AsyncRead + AsyncWrite + Unpin> H2cConnection<T> {
    /// Starts the handshake (the client's preface, then SETTINGS).
    pub(super) fn new(
        io: T,
        builder: &h2::server::Builder,
        proxy: Arc<Proxy>,
        dest: Destination,
        streams: Arc<ConnDrain>,
    ) -> Self {
        Self {
            state: State::Handshaking(builder.handshake(io)),
            shutdown_pending: false,
            proxy,
            dest,
            streams,
            resets: Arc::default(),
            closing: false,
        }
    }

    /// GOAWAY: streams open now finish, later ones are refused.
    pub(super) fn graceful_shutdown(self: Pin<&mut Self>) {
        let this = self.get_mut();
        match &mut this.state {
            State::Serving(conn) => conn.graceful_shutdown(),
            State::Handshaking(_) => this.shutdown_pending = true,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Future for H2cConnection<T> {
    type Output = Result<(), h2::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Handshaking(handshake) => {
                    let mut conn = ready!(Pin::new(handshake).poll(cx))?;
                    if this.shutdown_pending {
                        conn.graceful_shutdown();
                    }
                    this.state = State::Serving(conn);
                }
                State::Serving(conn) => {
                    // Also drives the connection: frames are read and
                    // written while this is polled, streams or none.
                    return match ready!(conn.poll_accept(cx)) {
                        Some(Ok((req, respond))) => {
                            if this.resets.flooding() && !this.closing {
                                this.closing = true;
                                this.proxy
                                    .metrics
                                    .h2c_reset_floods
                                    .fetch_add(1, Ordering::Relaxed);
                                tracing::warn!("h2c client resets most of its streams before the answer; closing the connection");
                                conn.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                            }
                            if this.closing {
                                // Refused, not served: the connection is going.
                                let mut respond = respond;
                                respond.send_reset(Reason::REFUSED_STREAM);
                                continue;
                            }
                            this.resets.opened();
                            tokio::spawn(serve_stream(
                                Arc::clone(&this.proxy),
                                this.dest.clone(),
                                req,
                                respond,
                                &this.streams,
                                Arc::clone(&this.resets),
                            ));
                            continue;
                        }
                        Some(Err(e)) => Poll::Ready(Err(e)),
                        None => Poll::Ready(Ok(())),
                    };
                }
            }
        }
    }
}

/// Handles one stream: the request, then its response.
///
/// Not an async fn: the request's future is made (and boxed) here, before
/// the task, so the task holds only that box, the stream's sending half and
/// a tunnel's halves. An async fn keeps its arguments for its whole life
/// (the request head among them): its task was then past the size under
/// which glibc serves a block without first consolidating its freed small
/// blocks (measured: `e2e/bench/results/2026-12-03-issue18-request-box.md`).
fn serve_stream(
    proxy: Arc<Proxy>,
    dest: Destination,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    streams: &Arc<ConnDrain>,
    resets: Arc<Resets>,
) -> impl Future<Output = ()> + Send {
    let (mut parts, recv) = req.into_parts();
    // CONNECT's stream carries the tunnel's bytes once it is answered, not
    // a body: its receiving half waits here for the answer.
    let (req, tunnel) = if parts.method == Method::CONNECT {
        let (pending, opened) = h2_stream::pending();
        parts.extensions.insert(pending);
        (
            Request::from_parts(parts, ClientBody::Empty),
            Some((opened, recv)),
        )
    } else {
        let body = ClientBody::H2(H2Recv::new(recv, &parts.headers));
        (Request::from_parts(parts, body), None)
    };
    // Boxed: inline, the request's future would make the task as large,
    // and `tokio::spawn` moves a future through several calls before it
    // reaches the task's memory (each move a copy of all of it; measured:
    // `e2e/bench/results/2026-12-03-issue18-bodies-and-h2c.md`).
    let mut served = RequestBox::new(serve_request(proxy, req, dest, Some(streams)));
    async move {
        let response = tokio::select! {
            biased;
            response = &mut served => match response {
                Ok(response) => response,
                Err(never) => match never {},
            },
            // The client gave up on the request: dropping it cancels its attempts.
            _ = std::future::poll_fn(|cx| respond.poll_reset(cx)) => return resets.reset_early(),
        };
        drop(resets);
        // Its box goes back for the next stream now, not after the body.
        drop(served);
        respond_with(response, respond, tunnel).await;
    }
}

/// Sends `response` on the stream: its head, then its body, or the tunnel
/// when it opens one.
fn respond_with(
    response: Response<ServedBody>,
    mut respond: SendResponse<Bytes>,
    tunnel: Option<(h2_stream::Opened, RecvStream)>,
) -> impl Future<Output = ()> + Send {
    let (mut head, body) = response.into_parts();
    head.headers.entry(DATE).or_insert_with(crate::clock::date);
    if let Some((opened, recv)) = tunnel {
        if head.status.is_success() {
            head.headers.remove(CONTENT_LENGTH);
            if let Ok(send) = respond.send_response(Response::from_parts(head, ()), false) {
                opened.open(H2Stream::new(send, recv));
            }
            return send_body(None);
        }
    }
    let end = body.is_end_stream();
    if !end {
        if let Some(len) = body.size_hint().exact() {
            head.headers
                .entry(CONTENT_LENGTH)
                .or_insert_with(|| HeaderValue::from(len));
        }
    }
    match respond.send_response(Response::from_parts(head, ()), end) {
        Ok(send) if !end => send_body(Some((body, send))),
        Ok(_) => send_body(None),
        Err(e) => {
            tracing::debug!(error = %e, "h2c response head not sent");
            respond.send_reset(Reason::INTERNAL_ERROR);
            send_body(None)
        }
    }
}

/// Streams `body` onto `send` until it ends, fails (the stream is reset)
/// or the client resets the stream (the body is dropped); with `None`,
/// nothing is left to send.
///
/// Not an async fn, for the reason [`serve_stream`] gives: the block works
/// on its captured pair in place.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would keep a second copy of its argument"
)]
fn send_body(
    mut stream: Option<(ServedBody, SendStream<Bytes>)>,
) -> impl Future<Output = ()> + Send {
    async move {
        let Some((body, send)) = &mut stream else {
            return;
        };
        loop {
            let frame = tokio::select! {
                biased;
                frame = body.frame() => frame,
                _ = std::future::poll_fn(|cx| send.poll_reset(cx)) => return,
            };
            let frame = match frame {
                None => {
                    let _ = send.send_data(Bytes::new(), true);
                    return;
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "h2c response body failed; resetting the stream");
                    return send.send_reset(Reason::INTERNAL_ERROR);
                }
                Some(Ok(frame)) => frame,
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        // No more data: whatever capacity was asked for goes back.
                        send.reserve_capacity(0);
                        let _ = send.send_trailers(trailers);
                        return;
                    }
                    continue;
                }
            };
            let end = body.is_end_stream();
            if !data.is_empty() {
                // Asks for one byte, not the chunk's length, as hyper does: the
                // h2 crate raises the claim to what is buffered once the chunk
                // is handed over, and a whole-length claim from every waiting
                // stream would share a small window out thinly.
                send.reserve_capacity(1);
                while send.capacity() == 0 {
                    match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                        Some(Ok(_)) => {}
                        // The stream was reset or the connection ended.
                        Some(Err(_)) | None => return,
                    }
                }
            }
            if send.send_data(data, end).is_err() || end {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resets(streams: u32, early: u32) -> Resets {
        let r = Resets::default();
        (0..streams).for_each(|_| r.opened());
        (0..early).for_each(|_| r.reset_early());
        r
    }

    #[test]
    fn a_flood_is_most_streams_reset_early_past_a_hundred() {
        assert!(!resets(99, 99).flooding(), "too few streams to judge");
        assert!(!resets(100, 50).flooding(), "half is not most");
        assert!(resets(100, 51).flooding());
        assert!(
            !resets(10_000, 4_000).flooding(),
            "a client cancelling some requests"
        );
    }
}
