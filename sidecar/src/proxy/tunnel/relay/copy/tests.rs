use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::{copy_both, MAX, MIN};

/// What a scripted side's next read does.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// Fills the buffer it is given.
    Fill,
    /// Gives this many bytes.
    Bytes(usize),
}

/// One side of a relay whose reads follow a script (then EOF) and whose
/// writes are kept; it records the buffer size each read was offered.
#[derive(Debug, Default)]
struct Scripted {
    reads: VecDeque<Read>,
    offered: Vec<usize>,
    next_byte: u8,
    written: Vec<u8>,
    shut_down: bool,
    fail_writes: bool,
    /// Reads answered so far, for another task to look at.
    reads_done: Arc<AtomicUsize>,
}

impl Scripted {
    fn reading(reads: impl IntoIterator<Item = Read>) -> Self {
        Self {
            reads: reads.into_iter().collect(),
            ..Self::default()
        }
    }
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let room = buf.remaining();
        self.offered.push(room);
        self.reads_done.fetch_add(1, Ordering::Relaxed);
        let n = match self.reads.pop_front() {
            None => 0,
            Some(Read::Fill) => room,
            Some(Read::Bytes(n)) => n.min(room),
        };
        for _ in 0..n {
            let b = self.next_byte;
            self.next_byte = b.wrapping_add(1);
            buf.put_slice(&[b]);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.fail_writes {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        // Half of it at most: the copy must write the rest.
        let n = buf.len().div_ceil(2);
        self.written.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shut_down = true;
        Poll::Ready(Ok(()))
    }
}

/// The byte sequence `Scripted` produces.
fn counting(n: usize) -> Vec<u8> {
    (0..n).map(|i| i as u8).collect()
}

#[tokio::test]
async fn a_buffer_grows_while_reads_fill_it_and_stops_at_the_cap() {
    let mut a = Scripted::reading([Read::Fill; 6]);
    let mut b = Scripted::default();
    let (forth, back) = copy_both(&mut a, &mut b).await.expect("copies");
    assert_eq!(
        a.offered,
        [MIN, 2 * MIN, 4 * MIN, MAX, MAX, MAX, MAX],
        "8, 16, 32, 64 KiB, then 64 KiB until EOF"
    );
    let total = MIN + 2 * MIN + 4 * MIN + 3 * MAX;
    assert_eq!(forth, total as u64);
    assert_eq!(back, 0);
    assert_eq!(b.written, counting(total), "every byte, in order");
    assert!(b.shut_down && a.shut_down, "EOF passed on both ways");
}

#[tokio::test]
async fn two_small_reads_in_a_row_halve_the_buffer_and_one_does_not() {
    use Read::{Bytes, Fill};
    let small = MAX / 4;
    let script = [
        Fill, // 8 -> 16
        Fill, // 16 -> 32
        Fill, // 32 -> 64
        Bytes(small),
        Fill, // one small read between full ones: stays at 64
        Bytes(small),
        Bytes(small), // two in a row: 32
        Bytes(100),
        Bytes(100), // 16
        Bytes(100),
        Bytes(100), // 8, the floor
        Bytes(100),
        Bytes(100),
    ];
    let mut a = Scripted::reading(script);
    let mut b = Scripted::default();
    copy_both(&mut a, &mut b).await.expect("copies");
    let k = 1024;
    assert_eq!(
        a.offered,
        [
            8 * k,
            16 * k,
            32 * k,
            64 * k,
            64 * k,
            64 * k,
            64 * k,
            32 * k,
            32 * k,
            16 * k,
            16 * k,
            8 * k,
            8 * k,
            8 * k
        ],
    );
}

#[tokio::test]
async fn a_write_error_ends_the_relay_with_it() {
    let mut a = Scripted::reading([Read::Bytes(10)]);
    let mut b = Scripted {
        fail_writes: true,
        ..Scripted::default()
    };
    let err = copy_both(&mut a, &mut b)
        .await
        .expect_err("b cannot be written");
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
}

#[tokio::test]
async fn a_half_close_travels_through_and_the_other_way_keeps_flowing() {
    let (mut client, mut relay_client) = tokio::io::duplex(1024);
    let (mut relay_server, mut server) = tokio::io::duplex(1024);
    let relay = tokio::spawn(async move { copy_both(&mut relay_client, &mut relay_server).await });

    client.write_all(b"request").await.expect("client writes");
    client
        .shutdown()
        .await
        .expect("client shuts down its sending side");
    let mut got = Vec::new();
    server
        .read_to_end(&mut got)
        .await
        .expect("server reads to EOF");
    assert_eq!(got, b"request", "the server sees the request, then EOF");

    // A reply far larger than the duplex's buffers, sent after the half-close.
    let reply = counting(300 * 1024);
    let sent = reply.clone();
    let serving = tokio::spawn(async move {
        server.write_all(&sent).await.expect("server writes");
        server.shutdown().await.expect("server closes");
    });
    let mut got = Vec::new();
    client
        .read_to_end(&mut got)
        .await
        .expect("client reads to EOF");
    serving.await.expect("server task");
    assert_eq!(got, reply);
    let (forth, back) = relay
        .await
        .expect("relay task")
        .expect("relay ends cleanly");
    assert_eq!((forth, back), (7, reply.len() as u64));
}

#[tokio::test]
async fn a_reader_that_always_has_bytes_leaves_other_tasks_their_turn() {
    const READS: usize = 10_000;
    let a = Scripted::reading([Read::Bytes(1); READS]);
    let reads = Arc::clone(&a.reads_done);
    let relay = tokio::spawn(async move {
        let (mut a, mut b) = (a, Scripted::default());
        copy_both(&mut a, &mut b).await
    });
    // Spawned second, so on this one-thread runtime it runs only when the
    // relay's task gives the thread up.
    let seen = tokio::spawn(async move { reads.load(Ordering::Relaxed) });
    let seen = seen.await.expect("observer task");
    let (forth, _) = relay.await.expect("relay task").expect("copies");
    assert_eq!(forth, READS as u64);
    assert!(
        seen < READS,
        "the other task ran only after all {READS} reads"
    );
}
