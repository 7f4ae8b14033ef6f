//! The request on its way out of one connection: head, body and chunk
//! framing queued in one buffer and written as the socket takes them.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderName};
use http_body::{Body, Frame};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::super::codec::{self, Encoding, WireError};
use crate::retry::replay_body::{AttemptBody, BoxError};

/// Body bytes copied behind the head (or a chunk-size line) into one write;
/// larger frames are written from their own buffer.
const COALESCE: usize = 16 * 1024;

/// The request on its way out: the bytes queued (head, chunk framing, small
/// frames), a large frame written from its own buffer, then the rest of the
/// body as it arrives.
#[derive(Debug)]
pub(super) struct Outgoing {
    pub(super) buf: Vec<u8>,
    pos: usize,
    data: Bytes,
    /// A chunk's CRLF is owed after `data`.
    data_crlf: bool,
    pub(super) body: Option<AttemptBody>,
    encoding: Encoding,
    /// Body bytes the declared length still allows.
    left: u64,
    /// Trailer fields the request declared (sent only for chunked bodies).
    trailers: Vec<HeaderName>,
    pub(super) wrote_any: bool,
    /// A frame of the body has been taken (so the request cannot be handed
    /// back unsent).
    pub(super) read_body: bool,
}

impl Outgoing {
    pub(super) fn new(mut buf: Vec<u8>, encoding: Encoding, headers: &http::HeaderMap) -> Self {
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

    pub(super) fn into_buffer(mut self) -> Vec<u8> {
        self.buf.clear();
        std::mem::take(&mut self.buf)
    }

    /// Writes everything queued and the body's frames as they come; ready
    /// once the body has ended and every byte is written.
    pub(super) fn poll_write(
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
