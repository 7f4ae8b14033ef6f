//! A response body read off its connection, which goes back to the pool in
//! the poll that yields the body's end.

use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::super::Http1Pool;
use super::Conn;
use crate::balance::client::io::EndpointIo;
use crate::exchange::body::{impl_body, BoxError, Frames};
use crate::exchange::prefixed::Prefixed;
use crate::http1::outgoing::Outgoing;
use crate::http1::{Decoded, Decoder, WireError};

/// A response body read straight off its connection; the connection goes
/// back to the pool as the body ends.
#[derive(Debug)]
pub(crate) struct Http1Body {
    pub(super) decoder: Decoder,
    pub(super) keep_alive: bool,
    pub(super) upgrade: bool,
    /// The head still holds hop-by-hop fields (the codec's `ResponseHead::hop_by_hop`).
    pub(super) hop_by_hop: bool,
    /// `None` once the body ended or failed.
    pub(super) conn: Option<Box<Conn>>,
    /// The request body, when it was still being written at the response.
    pub(super) out: Option<Box<Outgoing>>,
    pub(super) pool: Arc<Http1Pool>,
}

impl Http1Body {
    /// The response head still holds hop-by-hop fields to strip.
    pub(crate) fn hop_by_hop_in_head(&self) -> bool {
        self.hop_by_hop
    }

    /// The connection after a `101`, with the bytes of the new protocol
    /// that came behind the head.
    pub(crate) fn take_upgrade(&mut self) -> Option<Prefixed<EndpointIo>> {
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

impl Frames for Http1Body {
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.poll_request_body(cx);
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match self.decoder.decode(&mut conn.read) {
                Ok(Decoded::Data(data)) => {
                    if self.decoder.is_done() {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::Trailers(trailers)) => {
                    self.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Ok(Decoded::End) => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {}
                Err(e) => {
                    self.conn = None;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
            }
            let read = ready!(conn.poll_fill(cx));
            match read {
                Ok(0) => {
                    let end = self.decoder.eof();
                    // Ended by the close: never reused.
                    self.conn = None;
                    return Poll::Ready(match end {
                        Ok(_) => None,
                        Err(e) => Some(Err(Box::new(e))),
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    self.conn = None;
                    return Poll::Ready(Some(Err(Box::new(WireError::io(
                        "reading the response body",
                        e,
                    )))));
                }
            }
        }
    }

    fn is_ended(&self) -> bool {
        self.decoder.is_done()
    }

    fn size(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl_body!(Http1Body);

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
