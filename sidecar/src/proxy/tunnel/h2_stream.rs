//! A CONNECT tunnel on an HTTP/2 stream (RFC 9113 §8.5): once the `2xx` is
//! sent, the stream's DATA frames are the tunnel's bytes both ways, and
//! `END_STREAM` is its half-close.
//!
//! The h2c server puts a [`PendingTunnel`] in the CONNECT request's
//! extensions and keeps the stream's receiving half; when it has sent the
//! `2xx` it hands both halves over through [`Opened::open`], and the tunnel
//! task, which took the [`PendingTunnel`] out, gets them as an
//! [`H2Stream`].

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

/// The tunnel's stream, before its answer is sent. A request extension, so
/// it must be `Clone`; only the first to take it gets the stream.
#[derive(Clone, Debug)]
pub(crate) struct PendingTunnel(Arc<Mutex<Option<oneshot::Receiver<H2Stream>>>>);

/// The server's half: hands the stream over once the `2xx` is out.
#[derive(Debug)]
pub(crate) struct Opened(oneshot::Sender<H2Stream>);

/// A tunnel stream waiting for its answer, and the way to hand it over.
pub(crate) fn pending() -> (PendingTunnel, Opened) {
    let (tx, rx) = oneshot::channel();
    (PendingTunnel(Arc::new(Mutex::new(Some(rx)))), Opened(tx))
}

impl PendingTunnel {
    /// The stream once its answer is sent; `None` when it never will be
    /// (the answer was not a `2xx`, or the client reset the stream first).
    pub(crate) async fn opened(self) -> Option<H2Stream> {
        let rx = self.0.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        rx.await.ok()
    }
}

impl Opened {
    /// Hands `stream` to the tunnel task (dropped if it is gone).
    pub(crate) fn open(self, stream: H2Stream) {
        let _ = self.0.send(stream);
    }
}

/// An HTTP/2 stream's two halves as a byte stream.
#[derive(Debug)]
pub(crate) struct H2Stream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    /// Received data not read yet.
    unread: Bytes,
}

impl H2Stream {
    pub(crate) fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        Self {
            send,
            recv,
            unread: Bytes::new(),
        }
    }
}

fn io_error(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e.into_io().unwrap_or_else(|| io::Error::other("h2"));
    }
    io::Error::new(io::ErrorKind::ConnectionReset, e)
}

impl AsyncRead for H2Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.unread.is_empty() {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    this.unread = data;
                }
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
                // END_STREAM: the client's half is closed.
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = this.unread.len().min(buf.remaining());
        buf.put_slice(&this.unread[..n]);
        this.unread.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        // As much as the stream's window takes now: the copy loop above
        // offers the rest again.
        this.send.reserve_capacity(data.len());
        // Capacity left from an earlier grant is not announced again.
        let mut granted = this.send.capacity();
        while granted == 0 {
            match ready!(this.send.poll_capacity(cx)) {
                Some(Ok(n)) => granted = n,
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
        let n = granted.min(data.len());
        this.send
            .send_data(Bytes::copy_from_slice(&data[..n]), false)
            .map_err(io_error)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection's task writes what the stream has queued.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.send.reserve_capacity(0);
        // An empty frame with END_STREAM needs no window.
        let _ = this.send.send_data(Bytes::new(), true);
        Poll::Ready(Ok(()))
    }
}
