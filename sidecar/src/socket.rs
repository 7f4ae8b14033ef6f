//! A proxied TCP connection whose writes go to the kernel directly.
//!
//! Why: once a process has a second thread (the log writer, a blocking
//! pool), glibc wraps every `send` and `writev` in the bookkeeping for
//! pthread cancellation: two atomic read-modify-writes per call. The
//! sidecar never cancels threads. rustix makes the same system calls
//! without libc (its raw Linux backend), through a safe API. Reads still go
//! through tokio: a read into a buffer's spare capacity needs `unsafe` on
//! this side.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustix::net::SendFlags;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// A TCP connection: tokio's stream, written to with rustix.
#[derive(Debug)]
pub(crate) struct Socket {
    stream: TcpStream,
}

impl Socket {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Self { stream }
    }

    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// One write of up to `len` bytes once the socket is writable (`write`
    /// makes the system call). A `WouldBlock` clears the readiness and waits
    /// for the next; so does a partial write, as in tokio's own `poll_write`:
    /// on Linux a send that took less than it was given filled the socket's
    /// buffer, and the next would fail. Clearing from inside `try_io` clears
    /// only the readiness seen before the call, never a later one.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        len: usize,
        write: impl Fn(BorrowedFd<'_>) -> rustix::io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            let mut partial = None;
            let result = self.stream.try_io(Interest::WRITABLE, || {
                let n = write(self.stream.as_fd())?;
                if 0 < n && n < len {
                    partial = Some(n);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            if let Some(n) = partial {
                return Poll::Ready(Ok(n));
            }
            match result {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // MSG_NOSIGNAL: a closed peer is an EPIPE error, not a SIGPIPE.
        self.poll_send(cx, buf.len(), |fd| {
            rustix::net::send(fd, buf, SendFlags::NOSIGNAL)
        })
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).sum();
        self.poll_send(cx, len, |fd| {
            rustix::net::sendmsg(
                fd,
                bufs,
                &mut rustix::net::SendAncillaryBuffer::default(),
                SendFlags::NOSIGNAL,
            )
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A connected pair on loopback: the sidecar's side as a `Socket`, and
    /// its peer.
    async fn pair() -> (Socket, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (
            Socket::new(ours.expect("connect")),
            theirs.expect("accept").0,
        )
    }

    #[tokio::test]
    async fn plain_and_vectored_writes_reach_the_peer_in_order() {
        let (mut ours, mut theirs) = pair().await;
        ours.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
        let slices = [IoSlice::new(b"host: a\r\n"), IoSlice::new(b"\r\n")];
        let n = ours.write_vectored(&slices).await.expect("vectored write");
        assert_eq!(n, 11, "a small vectored write is taken whole");
        ours.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"GET / HTTP/1.1\r\nhost: a\r\n\r\n");
    }

    /// A peer that does not read fills the socket: the write waits (partial
    /// writes clear the readiness) and goes on, losing nothing, once the
    /// peer reads.
    #[tokio::test]
    async fn a_write_to_a_full_socket_waits_for_the_peer_then_completes() {
        const LEN: usize = 16 << 20;
        let (mut ours, mut theirs) = pair().await;
        let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            ours.write_all(&sent).await.expect("write");
            ours.shutdown().await.expect("shutdown");
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !writer.is_finished(),
            "16 MiB cannot fit in loopback socket buffers nobody reads"
        );
        let mut got = Vec::with_capacity(LEN);
        tokio::time::timeout(Duration::from_secs(20), theirs.read_to_end(&mut got))
            .await
            .expect("the writer resumes once the peer reads")
            .expect("read");
        writer.await.expect("writer");
        assert!(got == data, "{} of {LEN} bytes, in order", got.len());
    }

    #[tokio::test]
    async fn a_write_to_a_closed_peer_fails() {
        let (mut ours, theirs) = pair().await;
        drop(theirs);
        // The first write may be taken before the peer's reset comes back.
        let mut failed = None;
        for _ in 0..100 {
            if let Err(e) = ours.write_all(b"x").await {
                failed = Some(e.kind());
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            matches!(
                failed,
                Some(io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset)
            ),
            "{failed:?}"
        );
    }
}
