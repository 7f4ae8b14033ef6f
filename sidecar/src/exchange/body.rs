//! The bodies every floor passes along: the request body read from the
//! client ([`ClientBody`]: from the sidecar's HTTP/1 server, an h2c stream,
//! or whole with its head), an HTTP/2 stream's receiving half read as a body
//! ([`H2Recv`]), and each attempt's request body ([`replay`]: replayed from
//! memory or streamed once).

use std::task::{Context, Poll};

use bytes::Bytes;
use h2::RecvStream;
use http::HeaderMap;
use http_body::{Frame, SizeHint};

pub(crate) mod h1_recv;
pub(crate) mod replay;

pub(crate) use self::h1_recv::H1Recv;

/// Error type of bodies the sidecar sends upstream.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a body of the sidecar's does: every one is `Unpin`, yields `Bytes`
/// frames and fails with a [`BoxError`], so each says only how to take its
/// next frame, whether it has ended and what it knows of its size, and
/// [`impl_body!`] writes the [`Body`](http_body::Body) around it, the same for all.
pub(crate) trait Frames: Unpin {
    /// The next frame; see [`Body::poll_frame`](http_body::Body::poll_frame).
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>;

    /// True once nothing is left; see [`Body::is_end_stream`](http_body::Body::is_end_stream).
    fn is_ended(&self) -> bool;

    /// See [`Body::size_hint`](http_body::Body::size_hint).
    fn size(&self) -> SizeHint;
}

/// Implements [`Body`](http_body::Body) for types that implement [`Frames`].
macro_rules! impl_body {
    ($($body:ty),+ $(,)?) => {$(
        impl http_body::Body for $body {
            type Data = bytes::Bytes;
            type Error = $crate::exchange::body::BoxError;

            #[inline]
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
                $crate::exchange::body::Frames::poll_next_frame(self.get_mut(), cx)
            }

            #[inline]
            fn is_end_stream(&self) -> bool {
                $crate::exchange::body::Frames::is_ended(self)
            }

            #[inline]
            fn size_hint(&self) -> http_body::SizeHint {
                $crate::exchange::body::Frames::size(self)
            }
        }
    )+};
}
pub(crate) use impl_body;

/// The next frame of a body that is one chunk of bytes, `data` (taken).
pub(crate) fn chunk_frame(
    data: &mut Option<Bytes>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    Poll::Ready(data.take().map(|d| Ok(Frame::data(d))))
}

/// The size of a body that is one chunk of bytes, `data`, or nothing left.
pub(crate) fn chunk_hint(data: Option<&Bytes>) -> SizeHint {
    SizeHint::with_exact(data.map_or(0, |d| d.len() as u64))
}

/// A request body from the client.
#[derive(Debug)]
pub(crate) enum ClientBody {
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

impl Frames for ClientBody {
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self {
            ClientBody::Http1(inner) => inner.poll_frame(cx),
            ClientBody::Full(data) => chunk_frame(data),
            ClientBody::H2(inner) => inner.poll_frame(cx).map_err(Into::into),
            ClientBody::Empty => Poll::Ready(None),
        }
    }

    fn is_ended(&self) -> bool {
        match self {
            ClientBody::Http1(inner) => inner.is_end_stream(),
            ClientBody::Full(data) => data.is_none(),
            ClientBody::H2(inner) => inner.is_end_stream(),
            ClientBody::Empty => true,
        }
    }

    fn size(&self) -> SizeHint {
        match self {
            ClientBody::Http1(inner) => inner.size_hint(),
            ClientBody::Full(data) => chunk_hint(data.as_ref()),
            ClientBody::H2(inner) => inner.size_hint(),
            ClientBody::Empty => SizeHint::with_exact(0),
        }
    }
}

impl_body!(ClientBody);

/// The receiving half of an HTTP/2 stream (the client's request or an
/// endpoint's response) read as a body: data frame by frame, each one's
/// flow-control window released as soon as it is read (what is buffered is
/// the reader's, not the window's), then the trailers or the end.
#[derive(Debug)]
pub(crate) struct H2Recv {
    recv: RecvStream,
    /// The data has ended; trailers (or the end) are next.
    data_done: bool,
    /// Bytes the message's `content-length` still promises.
    left: Option<u64>,
}

impl H2Recv {
    /// The body of a message whose head was `headers`.
    pub(crate) fn new(recv: RecvStream, headers: &HeaderMap) -> Self {
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
    pub(crate) fn without_content(recv: RecvStream) -> Self {
        Self {
            recv,
            data_done: false,
            left: None,
        }
    }

    /// The next frame; see [`Body::poll_frame`](http_body::Body::poll_frame).
    pub(crate) fn poll_frame(
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
    /// takes the h2 crate's lock (measured:
    /// `e2e/bench/results/2026-12-04-issue18-h2c-reference.md`): a stream
    /// that ends short of it is an error the next read returns.
    pub(crate) fn is_end_stream(&self) -> bool {
        if self.left.is_some_and(|left| left > 0) {
            return false;
        }
        self.recv.is_end_stream()
    }

    /// Exact while the `content-length` says how much is left.
    pub(crate) fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}
