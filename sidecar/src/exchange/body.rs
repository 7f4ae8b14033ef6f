//! The bodies every floor passes along: the request body read from the
//! client ([`ClientBody`]: from the sidecar's HTTP/1 server, an h2c stream,
//! or whole with its head), an HTTP/2 stream's receiving half read as a body
//! ([`H2Recv`]), and each attempt's request body ([`replay`]: replayed from
//! memory or streamed once).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::RecvStream;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

pub(crate) mod h1_recv;
pub(crate) mod replay;

pub(crate) use self::h1_recv::H1Recv;

/// Error type of bodies the sidecar sends upstream.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body from the client.
#[derive(Debug)]
pub enum ClientBody {
    /// Read by the sidecar's HTTP/1 server as it streams in.
    Http1(H1Recv),
    /// Read whole with its head (no trailers): what a small body sent in
    /// the same packets as its head is.
    Full(Option<Bytes>),
    /// An h2c stream's data, read through the h2 crate directly.
    H2(H2Recv),
    /// None: a CONNECT stream, whose bytes after the answer are the
    /// tunnel's.
    Empty,
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::Http1(inner) => inner.poll_frame(cx),
            ClientBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ClientBody::H2(inner) => inner.poll_frame(cx).map_err(Into::into),
            ClientBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Http1(inner) => inner.is_end_stream(),
            ClientBody::Full(data) => data.is_none(),
            ClientBody::H2(inner) => inner.is_end_stream(),
            ClientBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Http1(inner) => inner.size_hint(),
            ClientBody::Full(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            ClientBody::H2(inner) => inner.size_hint(),
            ClientBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// The receiving half of an HTTP/2 stream (the client's request or an
/// endpoint's response) read as a body: data frame by frame, each one's
/// flow-control window released as soon as it is read (what is buffered is
/// the reader's, not the window's), then the trailers or the end.
#[derive(Debug)]
pub struct H2Recv {
    recv: RecvStream,
    /// The data has ended; trailers (or the end) are next.
    data_done: bool,
    /// Bytes the message's `content-length` still promises.
    left: Option<u64>,
}

impl H2Recv {
    /// The body of a message whose head was `headers`.
    pub fn new(recv: RecvStream, headers: &HeaderMap) -> Self {
        let left = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Self {
            recv,
            data_done: false,
            left,
        }
    }

    /// The body of a response that has none whatever its `content-length`
    /// says (to a HEAD request, or a 204 or 304).
    pub fn without_content(recv: RecvStream) -> Self {
        Self {
            recv,
            data_done: false,
            left: None,
        }
    }

    /// The next frame; see [`Body::poll_frame`].
    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.data_done {
            match std::task::ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = self.left.as_mut() {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => self.data_done = true,
            }
        }
        match std::task::ready!(self.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    /// True once nothing is left to read. While the `content-length`
    /// promises more data the answer is no without asking the stream, which
    /// takes the h2 crate's lock (about 120 instructions): a stream that
    /// ends short of it is an error the next read returns.
    pub fn is_end_stream(&self) -> bool {
        if self.left.is_some_and(|left| left > 0) {
            return false;
        }
        self.recv.is_end_stream()
    }

    /// Exact while the `content-length` says how much is left.
    pub fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}
