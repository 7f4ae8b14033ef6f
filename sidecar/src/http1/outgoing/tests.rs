//! The writer against a scripted body and a socket that takes what it is
//! told to: how many writes a body's frames cost, and that no split of
//! frames and writes changes the bytes on the wire.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use http::{HeaderMap, HeaderValue};
use http_body::SizeHint;

use super::*;

/// One answer of the scripted body's `poll_frame`.
enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    Pending,
    End,
}

/// A body that answers each poll with its script's next step.
struct Script(VecDeque<Step>);

impl Body for Script {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.0.pop_front().expect("polled past the script's end") {
            Step::Data(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Step::Trailers(map) => Poll::Ready(Some(Ok(Frame::trailers(map)))),
            Step::Pending => Poll::Pending,
            Step::End => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.0.front(), None | Some(Step::End))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// A socket that takes at most the next of `caps` bytes per write (all of
/// it once `caps` runs out) and records each write.
#[derive(Default)]
struct Wire {
    bytes: Vec<u8>,
    writes: usize,
    caps: VecDeque<usize>,
}

impl Wire {
    fn take(&mut self, bufs: &[IoSlice<'_>]) -> usize {
        let mut cap = self.caps.pop_front().unwrap_or(usize::MAX);
        let mut n = 0;
        for buf in bufs {
            let k = buf.len().min(cap);
            self.bytes.extend_from_slice(&buf[..k]);
            n += k;
            cap -= k;
        }
        self.writes += 1;
        n
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(self.get_mut().take(&[IoSlice::new(buf)])))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(self.get_mut().take(bufs)))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Counts the times the task woke itself.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const HEAD: &[u8] = b"PUT /upload HTTP/1.1\r\nhost: big\r\n\r\n";

fn outgoing(encoding: Encoding, headers: &HeaderMap, steps: Vec<Step>) -> Outgoing<Script> {
    let mut out = Outgoing::new(Vec::new(), encoding, headers);
    out.buf.extend_from_slice(HEAD);
    out.body = Some(Script(steps.into()));
    out
}

/// Polls once: the result and whether the writer woke its own task.
fn poll(out: &mut Outgoing<Script>, wire: &mut Wire) -> (Poll<Result<(), WireError>>, bool) {
    let wakes = Arc::new(Wakes::default());
    let waker = Waker::from(Arc::clone(&wakes));
    let result = out.poll_write(wire, &mut Context::from_waker(&waker));
    (result, wakes.0.load(Ordering::SeqCst) > 0)
}

fn frame(len: usize, fill: u8) -> Bytes {
    Bytes::from(vec![fill; len])
}

#[test]
fn frames_ready_together_go_out_in_one_write() {
    // Three frames too large to copy, together under the gathering cap.
    let frames = [
        frame(10_000, b'a'),
        frame(10_000, b'b'),
        frame(10_000, b'c'),
    ];
    let steps = frames
        .iter()
        .cloned()
        .map(Step::Data)
        .chain([Step::End])
        .collect();
    let mut out = outgoing(Encoding::Length(30_000), &HeaderMap::new(), steps);
    let mut wire = Wire::default();
    let (result, woke) = poll(&mut out, &mut wire);
    assert!(matches!(result, Poll::Ready(Ok(()))));
    assert!(!woke, "a body at its end is written at once");
    assert_eq!(wire.writes, 1);
    assert_eq!(wire.bytes, [HEAD, &frames.concat()].concat());
}

#[test]
fn a_frame_read_in_the_readers_turn_goes_in_the_same_write() {
    let (a, b) = (frame(10_000, b'a'), frame(10_000, b'b'));
    let steps = vec![
        Step::Data(a.clone()),
        Step::Pending,
        Step::Data(b.clone()),
        Step::Pending,
        Step::Pending,
        Step::End,
    ];
    let mut out = outgoing(Encoding::Length(20_000), &HeaderMap::new(), steps);
    let mut wire = Wire::default();
    // The first frame, then the reader's turn: nothing written yet.
    let (result, woke) = poll(&mut out, &mut wire);
    assert!(result.is_pending() && woke);
    assert_eq!(wire.writes, 0);
    // The turn brought a second frame: another turn.
    let (result, woke) = poll(&mut out, &mut wire);
    assert!(result.is_pending() && woke);
    assert_eq!(wire.writes, 0);
    // This one brought nothing: both frames go, behind the head, at once.
    let (result, woke) = poll(&mut out, &mut wire);
    assert!(matches!(result, Poll::Ready(Ok(()))));
    assert!(!woke);
    assert_eq!(wire.writes, 1);
    assert_eq!(wire.bytes, [HEAD, &a, &b].concat());
}

#[test]
fn a_turn_that_brings_nothing_ends_the_gathering() {
    let (a, b) = (frame(10_000, b'a'), frame(10_000, b'b'));
    let steps = vec![
        Step::Data(a.clone()),
        Step::Pending,
        // The turn: nothing.
        Step::Pending,
        // After the write.
        Step::Pending,
        Step::Data(b.clone()),
        Step::End,
    ];
    let mut out = outgoing(Encoding::Length(20_000), &HeaderMap::new(), steps);
    let mut wire = Wire::default();
    assert!(poll(&mut out, &mut wire).0.is_pending());
    // Nothing came in the turn: the first frame is written and the writer
    // waits on the body (its waker, not its own).
    let (result, woke) = poll(&mut out, &mut wire);
    assert!(result.is_pending() && !woke);
    assert_eq!(wire.writes, 1);
    let (result, _) = poll(&mut out, &mut wire);
    assert!(matches!(result, Poll::Ready(Ok(()))));
    assert_eq!(wire.writes, 2);
    assert_eq!(wire.bytes, [HEAD, &a, &b].concat());
}

#[test]
fn small_frames_never_wait_for_a_turn() {
    let small = frame(300, b's');
    // Pending before and after the write.
    let steps = vec![Step::Data(small.clone()), Step::Pending, Step::Pending];
    let mut out = outgoing(Encoding::Length(600), &HeaderMap::new(), steps);
    let mut wire = Wire::default();
    let (result, woke) = poll(&mut out, &mut wire);
    assert!(result.is_pending() && !woke);
    assert_eq!(wire.writes, 1, "the head and the small frame in one write");
    assert_eq!(wire.bytes, [HEAD, &small].concat());
}

#[test]
fn gathering_stops_at_its_cap() {
    // Each frame three eighths of the cap: the third takes a write past it.
    let size = GATHER * 3 / 8;
    let frames: Vec<Bytes> = (0..8).map(|i| frame(size, b'a' + i)).collect();
    let steps = frames
        .iter()
        .cloned()
        .map(Step::Data)
        .chain([Step::End])
        .collect();
    let total = 8 * size;
    let mut out = outgoing(Encoding::Length(total as u64), &HeaderMap::new(), steps);
    let mut wire = Wire::default();
    assert!(matches!(poll(&mut out, &mut wire).0, Poll::Ready(Ok(()))));
    // The head and three frames, three frames, then the last two.
    assert_eq!(wire.writes, 3);
    assert_eq!(wire.bytes, [HEAD, &frames.concat()].concat());
}

#[test]
fn a_frame_at_the_cap_is_written_without_a_turn() {
    let big = frame(GATHER, b'g');
    // Pending after the frame: a smaller frame would wait for a turn.
    let steps = vec![Step::Data(big.clone()), Step::Pending, Step::Pending];
    let mut out = outgoing(
        Encoding::Length(2 * GATHER as u64),
        &HeaderMap::new(),
        steps,
    );
    let mut wire = Wire::default();
    let (result, woke) = poll(&mut out, &mut wire);
    assert!(result.is_pending() && !woke, "no turn for the reader");
    assert_eq!(wire.writes, 1);
    assert_eq!(wire.bytes, [HEAD, &big].concat());
}

/// xorshift64: the same cases every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn no_split_of_frames_and_writes_changes_the_bytes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut declared = HeaderMap::new();
    declared.insert(header::TRAILER, HeaderValue::from_static("x-sum"));
    for case in 0..300 {
        let chunked = case % 2 == 0;
        let mut steps = Vec::new();
        let mut want = HEAD.to_vec();
        let mut total = 0;
        for i in 0..rng.below(12) {
            let len = [0, 1, 100, 8 * 1024, 8 * 1024 + 1, 20_000, 70_000][rng.below(7)];
            let data = frame(len, b'a' + (i % 26) as u8);
            if chunked && len > 0 {
                want.extend_from_slice(format!("{len:X}\r\n").as_bytes());
                want.extend_from_slice(&data);
                want.extend_from_slice(b"\r\n");
            } else {
                want.extend_from_slice(&data);
            }
            total += len;
            steps.push(Step::Data(data));
            for _ in 0..rng.below(3) {
                steps.push(Step::Pending);
            }
        }
        if chunked && rng.below(2) == 0 {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-sum", HeaderValue::from_static("42"));
            trailers.insert("x-undeclared", HeaderValue::from_static("dropped"));
            steps.push(Step::Trailers(trailers));
            want.extend_from_slice(b"0\r\nx-sum: 42\r\n\r\n");
        } else {
            steps.push(Step::End);
            if chunked {
                want.extend_from_slice(b"0\r\n\r\n");
            }
        }
        let encoding = if chunked {
            Encoding::Chunked
        } else {
            Encoding::Length(total as u64)
        };
        let mut out = outgoing(encoding, &declared, steps);
        let mut wire = Wire {
            caps: (0..64).map(|_| 1 + rng.below(100_000)).collect(),
            ..Wire::default()
        };
        let mut polls = 0;
        loop {
            match poll(&mut out, &mut wire).0 {
                Poll::Ready(result) => {
                    result.unwrap_or_else(|e| panic!("case {case}: {e}"));
                    break;
                }
                Poll::Pending => polls += 1,
            }
            assert!(polls < 1_000, "case {case}: no progress");
        }
        assert_eq!(wire.bytes.len(), want.len(), "case {case}");
        assert!(wire.bytes == want, "case {case}: the bytes differ");
    }
}

#[test]
fn a_body_longer_than_its_length_is_refused_before_it_is_written() {
    let steps = vec![
        Step::Data(frame(20_000, b'a')),
        Step::Data(frame(20_000, b'b')),
    ];
    let mut out = outgoing(Encoding::Length(30_000), &HeaderMap::new(), steps);
    let mut wire = Wire::default();
    let Poll::Ready(Err(e)) = poll(&mut out, &mut wire).0 else {
        panic!("a body over its Content-Length must fail");
    };
    assert_eq!(
        e.kind,
        crate::exchange::failure::FailureKind::RequestBodyError
    );
    assert!(!out.wrote_any);
}
