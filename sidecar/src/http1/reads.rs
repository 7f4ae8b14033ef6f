//! How an HTTP/1 connection of either side reads: into one growing buffer,
//! 8 KiB at first (hyper's: a head and a small body), doubled after every
//! read that filled it, up to a cap that differs by direction. The cap
//! bounds the room asked for, not each read: once every frame cut from the
//! buffer is gone, `BytesMut::reserve` reclaims the whole allocation and
//! may grow it, so a read can take up to about twice the cap (120 KiB and
//! 504 KiB in `reads/tests.rs`). The caps below were measured so; a hard
//! per-read limit (`BufMut::limit`) made no difference to uploads.
//!
//! Responses (the client side, reading an endpoint): up to 256 KiB. At 64
//! KiB large downloads through the sidecar were slower, each time it was
//! tried (`e2e/bench/results/2026-12-01-issue18-codec.md`,
//! `e2e/bench/results/2026-12-05-issue18-uploads.md`).
//!
//! Requests (the server side, reading a client): up to 64 KiB. How large
//! depends on how the body is written on (`outgoing.rs`): a reader that
//! takes everything the socket holds outruns the client and sleeps until
//! its next send, and the wake-up is paid on the client's CPU, so while
//! body writes were gathered up to 256 KiB, smaller reads made uploads
//! faster. With gathers of 32 KiB, a read of 32 KiB or more is written on
//! at once, and larger reads won instead, at less of the sidecar's CPU per
//! GiB; 64 KiB was the most consistent
//! (`e2e/bench/results/2026-12-05-issue18-uploads.md`).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::AsyncRead;

/// The first read's size.
pub(crate) const READ_INIT: usize = 8 * 1024;

/// The largest read of a response (from an endpoint).
pub(crate) const RESPONSE_READ_MAX: usize = 256 * 1024;

/// The largest read of a request (from a client).
pub(crate) const REQUEST_READ_MAX: usize = 64 * 1024;

/// Reads more of `io` into `buf`, at most `*size` bytes beyond what it
/// holds, doubling `*size` up to `max` when the read filled the room;
/// `Ok(0)` at the peer's close.
pub(crate) fn poll_fill<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    size: &mut usize,
    max: usize,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(*size);
    }
    let room = buf.capacity() - buf.len();
    let n = ready!(tokio_util::io::poll_read_buf(Pin::new(io), cx, buf))?;
    if n == room && *size < max {
        *size *= 2;
    }
    Poll::Ready(Ok(n))
}

#[cfg(test)]
mod tests;
