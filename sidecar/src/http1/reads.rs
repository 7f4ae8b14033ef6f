//! How an HTTP/1 connection of either side reads: into one growing buffer,
//! 8 KiB at first (hyper's: a head and a small body), doubled after every
//! read that filled it, up to a cap that differs by direction. The cap
//! bounds the room asked for, not each read: once every frame cut from the
//! buffer is gone, `BytesMut::reserve` reclaims the whole allocation and
//! may grow it, so a read can take up to about twice the cap (120 KiB and
//! 504 KiB in `reads/tests.rs`). The figures below were measured so; a hard
//! per-read limit (`BufMut::limit`) made no difference to uploads.
//!
//! Responses (the client side, reading an endpoint): up to 256 KiB. At 64
//! KiB a 1 GiB download through the sidecar ran at 878 MiB/s against 1,055
//! with hyper's client (`e2e/bench/results/2026-12-01-2030.md`, scenario
//! 5), and again 1,291-1,445 against 1,685-1,864 on 2026-12-05.
//!
//! Requests (the server side, reading a client): up to 64 KiB. How large
//! depends on how the body is written on (`outgoing.rs`): a reader that
//! takes everything the socket holds outruns the client and sleeps until
//! its next send, and while body writes were gathered up to 256 KiB, small
//! reads paid: a 1 GiB upload (curl on the other CPU with the upstream),
//! per GiB:
//!
//! | cap | MiB/s | sidecar wake-ups | curl system time | sidecar CPU |
//! |---|---|---|---|---|
//! | 256 KiB | 1,056-1,148 | 9,700-10,500 | 0.57-0.59 s | 410-460 ms |
//! | 64 KiB | 1,293-1,334 | 5,100-7,600 | 0.44-0.49 s | 410-460 ms |
//! | 64 KiB | 1,333 (median of 12) | 6,400 | 0.46 s | 410 ms |
//! | 16 KiB | 1,435 (median of 12) | 3,400 | 0.39 s | 425 ms |
//!
//! (HAProxy in the same rounds: 1,282-1,415 and 1,361.) With gathers of
//! 32 KiB, a read of 32 KiB or more is written on at once, and larger reads
//! won instead, through `bench.py` (scenario 5, 8 rounds each, against 16
//! KiB in the same rounds): 64 KiB 1.027× per round (faster in 8 of 8),
//! 128 KiB 1.032× (7 of 8), 256 KiB 1.023× and 1.013× (6 of 8); the sidecar's
//! CPU per GiB 299 ms at 16 KiB, 264 at 64, 242 at 256
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
