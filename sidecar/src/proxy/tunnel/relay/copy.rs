//! Both directions of an opaque relay, each through a buffer that grows
//! while the bytes come in bulk and shrinks back once they trickle.
//!
//! tokio's `copy_bidirectional` reads 8 KiB at a time, and the sidecar's
//! relays were slower than Envoy's `tcp_proxy` on large transfers, at more
//! CPU per GiB. A throwaway tokio relay with fixed buffers gained
//! throughput up to 64 KiB and lost some past it, where only the relay's
//! CPU kept falling (`e2e/bench/results/2026-12-05-issue18-relay.md`).
//!
//! A fixed 64 KiB buffer would hold 128 KiB for every idle relay (a
//! database pool through transparent capture keeps many), so a buffer
//! starts at [`MIN`], the size tokio's copy used, and doubles each time a
//! read fills it, up to [`MAX`]; two reads in a row that would have fit in
//! a quarter of it halve it again. Idle and chatty relays hold what they
//! did before; bulk transfers get 64 KiB reads and writes, faster and at
//! less CPU per GiB than through tokio's copy (`e2e/bench/tunnel.sh`;
//! `e2e/bench/results/2026-12-05-issue18-relay.md`).
//!
//! The contract is `copy_bidirectional`'s: bytes are written in the order
//! read; EOF from one side shuts down writing towards the other while the
//! other direction keeps flowing; the first error ends both.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A buffer's first size (tokio's copy buffer), and the least it shrinks to.
pub(crate) const MIN: usize = 8 * 1024;

/// The most a buffer grows to: past it, larger reads saved little relay
/// CPU and cost throughput (the table above).
pub(crate) const MAX: usize = 64 * 1024;

/// Copies `a` to `b` and `b` to `a` until both directions have ended; the
/// bytes copied each way.
pub(crate) async fn copy_both<A, B>(a: &mut A, b: &mut B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut a_to_b = Direction::new();
    let mut b_to_a = Direction::new();
    poll_fn(|cx| {
        let forth = a_to_b.poll_copy(cx, Pin::new(&mut *a), Pin::new(&mut *b))?;
        let back = b_to_a.poll_copy(cx, Pin::new(&mut *b), Pin::new(&mut *a))?;
        match (forth, back) {
            (Poll::Ready(forth), Poll::Ready(back)) => Poll::Ready(Ok((forth, back))),
            _ => Poll::Pending,
        }
    })
    .await
}

/// One direction: what was read and not yet written, and where it stands.
#[derive(Debug)]
struct Direction {
    buf: Vec<u8>,
    /// `buf[pos..end]` is read and not yet written.
    pos: usize,
    end: usize,
    /// Reads in a row that would have fit in a quarter of `buf`.
    small_reads: u8,
    /// The reader reached EOF.
    read_done: bool,
    /// Bytes were written since the last flush.
    unflushed: bool,
    /// EOF has been passed on (the writer shut down).
    done: bool,
    copied: u64,
}

impl Direction {
    fn new() -> Self {
        Self {
            buf: vec![0; MIN],
            pos: 0,
            end: 0,
            small_reads: 0,
            read_done: false,
            unflushed: false,
            done: false,
            copied: 0,
        }
    }

    /// Moves bytes until the reader has none ready and everything read is
    /// written, or until EOF has been passed on; the bytes copied once done.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
    ) -> Poll<io::Result<u64>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(self.copied));
        }
        loop {
            if self.pos == self.end && !self.read_done {
                // Each read spends from the task's budget: a reader that
                // always has bytes must not keep the thread's other tasks
                // waiting (the socket's own budget does not cover every
                // reader the relay is given).
                let coop = ready!(tokio::task::coop::poll_proceed(cx));
                let mut read = ReadBuf::new(&mut self.buf);
                match reader.as_mut().poll_read(cx, &mut read) {
                    Poll::Pending => {
                        // Nothing more to send soon: push out what was written.
                        if self.unflushed {
                            ready!(writer.as_mut().poll_flush(cx))?;
                            self.unflushed = false;
                        }
                        return Poll::Pending;
                    }
                    Poll::Ready(result) => {
                        coop.made_progress();
                        result?;
                    }
                }
                let n = read.filled().len();
                if n == 0 {
                    self.read_done = true;
                } else {
                    self.pos = 0;
                    self.end = n;
                    self.adapt(n);
                }
            }
            while self.pos < self.end {
                let n = ready!(writer
                    .as_mut()
                    .poll_write(cx, &self.buf[self.pos..self.end]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.pos += n;
                self.copied += n as u64;
                self.unflushed = true;
            }
            if self.read_done {
                ready!(writer.as_mut().poll_flush(cx))?;
                ready!(writer.as_mut().poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(self.copied));
            }
            self.resize();
        }
    }

    /// Notes a read of `n` bytes: a full buffer asks for a larger one, two
    /// small reads in a row for a smaller one ([`Direction::resize`], once
    /// the bytes are written).
    fn adapt(&mut self, n: usize) {
        if n <= self.buf.len() / 4 {
            self.small_reads = self.small_reads.saturating_add(1);
        } else {
            self.small_reads = 0;
        }
    }

    /// Grows or shrinks the (empty) buffer as the last reads asked.
    fn resize(&mut self) {
        let len = self.buf.len();
        let size = if self.end == len && len < MAX {
            len * 2
        } else if self.small_reads >= 2 && len > MIN {
            self.small_reads = 0;
            len / 2
        } else {
            return;
        };
        // A new allocation, not `resize`: the old bytes need no copying, and
        // shrinking gives the memory back.
        self.buf = vec![0; size];
        self.pos = 0;
        self.end = 0;
    }
}

#[cfg(test)]
mod tests;
