//! A connection to an endpoint: plain TCP, written with the raw system
//! calls of [`Socket`], or TLS the sidecar originated over it. The codec and
//! the h2 crate see one byte stream either way; the branch per read or
//! write is the only cost TLS puts on plain-text connections.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::socket::Socket;

/// A connection to an endpoint.
#[derive(Debug)]
pub(crate) enum EndpointIo {
    /// Plain text.
    Plain(Socket),
    /// TLS (boxed: its state is large, and most connections are plain).
    Tls(Box<TlsStream<TcpStream>>),
}

impl EndpointIo {
    /// Nothing arrived while the connection sat idle: no close, no stray
    /// bytes. Plain text reads the readiness the reactor already recorded
    /// (no system call) unless it says something arrived. TLS reads through
    /// the session, which takes in what an endpoint may send an idle
    /// client (TLS 1.3 session tickets, key updates) and yields no data for
    /// them; a close or any data means the connection cannot be reused.
    pub(crate) fn is_open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match self {
            EndpointIo::Plain(socket) => match socket.stream().poll_read_ready(&mut cx) {
                Poll::Pending => true,
                Poll::Ready(Err(_)) => false,
                // A stale readiness (the last read took everything without
                // seeing `WouldBlock`) or a real event: one peek tells.
                Poll::Ready(Ok(())) => matches!(
                    socket.stream().try_read(&mut [0u8; 1]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock
                ),
            },
            EndpointIo::Tls(tls) => {
                let mut byte = [0u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                Pin::new(&mut **tls)
                    .poll_read(&mut cx, &mut buf)
                    .is_pending()
            }
        }
    }
}

impl AsyncRead for EndpointIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EndpointIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            EndpointIo::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for EndpointIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            EndpointIo::Plain(s) => Pin::new(s).poll_write(cx, data),
            EndpointIo::Tls(s) => Pin::new(&mut **s).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            EndpointIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            EndpointIo::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            EndpointIo::Plain(s) => s.is_write_vectored(),
            EndpointIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EndpointIo::Plain(s) => Pin::new(s).poll_flush(cx),
            EndpointIo::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EndpointIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            EndpointIo::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
