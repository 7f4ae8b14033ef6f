//! The request on its way out of one connection: head, body and chunk
//! framing queued and written as the socket takes them, several body frames
//! in one vectored write when they come together.
//!
//! Gathering: a large upload through the sidecar made more and smaller
//! writes per MiB than Envoy, for about as many reads of the client
//! (`e2e/bench/results/2026-12-02-issue18-h2c-client.md`): Envoy reads
//! until the socket is empty and then writes once, while the sidecar wrote
//! each frame as the server's body handed it over (one at a time: hyper's
//! body channel holds one frame). So when a large frame is queued and the
//! body has nothing more yet, the writer gives the connection's reader one
//! turn (the task wakes itself and yields) before writing; a frame read in
//! that turn goes in the same write, and gets another turn. A turn that
//! brings nothing, the body's end, or [`GATHER`] bytes queued ends the
//! gathering. Small requests never wait: a body at its end, or only small
//! frames, is written at once.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderName};
use http_body::{Body, Frame};
use tokio::io::AsyncWrite;

use super::{self as codec, Encoding, WireError};
use crate::exchange::body::{replay::AttemptBody, BoxError};

/// Body bytes copied behind the head (or a chunk-size line) into one write;
/// larger frames are written from their own buffers.
const COALESCE: usize = 16 * 1024;

/// Queued bytes at which the writer stops taking frames and writes; a
/// frame this large or larger is written at once. Larger writes took less
/// of the sidecar's CPU but more of the CPU the client and the endpoint
/// share, which is what limits a transfer on one host: this cap made
/// uploads and downloads faster than 256 KiB did (measured while the
/// client's request was read 16 KiB at a time, since raised, see
/// `reads::REQUEST_READ_MAX`:
/// `e2e/bench/results/2026-12-05-issue18-uploads.md`). Responses are read
/// up to 256 KiB at a time, so their frames mostly go out one per write.
const GATHER: usize = 32 * 1024;

/// Buffers per vectored write (hyper's client queues at most 16).
const SLICES: usize = 16;

/// The request on its way out: the bytes queued in `buf` (head, chunk
/// framing, small frames), then `frames` (large frames, and what came
/// behind them, in order), then the rest of the body as it arrives.
#[derive(Debug)]
pub(crate) struct Outgoing<B = AttemptBody> {
    pub(crate) buf: Vec<u8>,
    pos: usize,
    /// Written after `buf`; while it holds anything, framing and small
    /// frames go here too, to keep the order.
    frames: VecDeque<Bytes>,
    /// Bytes in `frames`.
    queued: usize,
    /// The reader has had its turn since the last frame came.
    turned: bool,
    pub(crate) body: Option<B>,
    encoding: Encoding,
    /// Body bytes the declared length still allows.
    left: u64,
    /// Trailer fields the message declared (sent only for chunked bodies).
    trailers: Vec<HeaderName>,
    pub(crate) wrote_any: bool,
    /// A frame of the body has been taken (so the request cannot be handed
    /// back unsent).
    pub(crate) read_body: bool,
}

impl<B> Outgoing<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    /// A request's body: chunked, it carries the trailers its headers declare.
    pub(crate) fn new(mut buf: Vec<u8>, encoding: Encoding, headers: &http::HeaderMap) -> Self {
        buf.clear();
        let trailers = if encoding == Encoding::Chunked && headers.contains_key(header::TRAILER) {
            codec::declared_trailers(headers)
        } else {
            Vec::new()
        };
        Self::with_trailers(buf, encoding, trailers)
    }

    /// A message after what `buf` holds (its head), framed by `encoding`,
    /// whose chunked body sends only the `trailers` fields.
    pub(crate) fn with_trailers(
        buf: Vec<u8>,
        encoding: Encoding,
        trailers: Vec<HeaderName>,
    ) -> Self {
        Self {
            buf,
            pos: 0,
            frames: VecDeque::new(),
            queued: 0,
            turned: false,
            body: None,
            encoding,
            left: match encoding {
                Encoding::Length(n) => n,
                Encoding::Chunked => 0,
                Encoding::Close => u64::MAX,
            },
            trailers,
            wrote_any: false,
            read_body: false,
        }
    }

    pub(crate) fn into_buffer(mut self) -> Vec<u8> {
        self.buf.clear();
        std::mem::take(&mut self.buf)
    }

    /// The body ended before the length its head declared.
    fn short(&self) -> bool {
        matches!(self.encoding, Encoding::Length(_)) && self.left != 0
    }

    /// Bytes queued and not yet written.
    fn pending(&self) -> usize {
        self.buf.len() - self.pos + self.queued
    }

    /// Writes everything queued and the body's frames as they come; ready
    /// once the body has ended and every byte is written.
    pub(crate) fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), WireError>> {
        loop {
            // Gather what the body has ready behind the queued bytes.
            if self.pending() < GATHER && self.frames.len() < SLICES {
                if let Some(body) = self.body.as_mut() {
                    match Pin::new(&mut *body).poll_frame(cx) {
                        Poll::Ready(frame) => {
                            self.read_body = true;
                            self.turned = false;
                            self.queue(frame)?;
                            continue;
                        }
                        Poll::Pending => {
                            if self.queued > 0 && !self.turned && !body.is_end_stream() {
                                // The reader's turn (module doc); the body's
                                // waker is registered too.
                                self.turned = true;
                                cx.waker().wake_by_ref();
                                return Poll::Pending;
                            }
                        }
                    }
                }
            }
            if self.pending() > 0 {
                let n = ready!(self.poll_write_queued(io, cx))?;
                if n == 0 {
                    return Poll::Ready(Err(WireError::closed(
                        "endpoint stopped reading the request",
                    )));
                }
                self.wrote_any = true;
                self.advance(n);
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

    /// One write of what is queued: `buf` alone, or with the frames behind
    /// it in one vectored write.
    fn poll_write_queued<W: AsyncWrite + Unpin>(
        &self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<Result<usize, WireError>> {
        let head = &self.buf[self.pos..];
        let result = if self.frames.is_empty() {
            ready!(Pin::new(io).poll_write(cx, head))
        } else {
            let mut slices = [IoSlice::new(&[]); SLICES + 1];
            let mut n = 0;
            if !head.is_empty() {
                slices[0] = IoSlice::new(head);
                n = 1;
            }
            for frame in self.frames.iter().take(SLICES + 1 - n) {
                slices[n] = IoSlice::new(frame);
                n += 1;
            }
            ready!(Pin::new(io).poll_write_vectored(cx, &slices[..n]))
        };
        Poll::Ready(result.map_err(|e| WireError::io("writing the request", e)))
    }

    /// Drops `n` written bytes from the front of the queue.
    fn advance(&mut self, mut n: usize) {
        let from_buf = n.min(self.buf.len() - self.pos);
        self.pos += from_buf;
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        n -= from_buf;
        self.queued -= n;
        while n > 0 {
            let Some(front) = self.frames.front_mut() else {
                unreachable!("a write cannot take more than was queued");
            };
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.frames.pop_front();
        }
    }

    /// Queues framing (or other small bytes) behind everything queued.
    fn push_small(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        if self.frames.is_empty() {
            write(&mut self.buf);
        } else {
            let mut bytes = Vec::new();
            write(&mut bytes);
            self.queued += bytes.len();
            self.frames.push_back(Bytes::from(bytes));
        }
    }

    /// Queues a frame's data behind everything queued: copied into `buf` if
    /// small and nothing large waits, else kept as it is.
    fn push_data(&mut self, data: Bytes) {
        if self.frames.is_empty() && data.len() <= COALESCE / 2 {
            self.buf.extend_from_slice(&data);
        } else {
            self.queued += data.len();
            self.frames.push_back(data);
        }
    }

    /// Queues one polled body frame (or the body's end).
    fn queue(&mut self, frame: Option<Result<Frame<Bytes>, BoxError>>) -> Result<(), WireError> {
        let chunked = self.encoding == Encoding::Chunked;
        match frame {
            None => {
                self.body = None;
                if chunked {
                    self.push_small(|dst| codec::encode_last_chunk(dst, None, &[]));
                } else if self.short() {
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
                        self.push_small(|dst| codec::encode_chunk_size(dst, data.len()));
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
                    self.push_data(data);
                    if chunked {
                        self.push_small(|dst| dst.extend_from_slice(b"\r\n"));
                    }
                }
                Err(frame) => {
                    // Trailers end the body; only chunked can carry them.
                    self.body = None;
                    if chunked {
                        let declared = std::mem::take(&mut self.trailers);
                        self.push_small(|dst| {
                            codec::encode_last_chunk(dst, frame.trailers_ref(), &declared)
                        });
                    } else if self.short() {
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

#[cfg(test)]
mod tests;
