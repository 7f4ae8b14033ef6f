//! A client's HTTP/1 request body between the connection that reads it
//! ([`H1Sender`], held by `server::http1`) and the request that consumes it
//! ([`H1Recv`]).
//!
//! One frame at a time: the connection decodes the next frame only when the
//! slot is empty and the consumer has asked (its first poll, or taking a
//! frame, which asks for the next: the connection reads it while the
//! consumer sends the last one on). So at most one frame is held here and
//! one read's worth in the connection's buffer, whatever the body's size.
//! A consumer that is dropped early tells the connection, which then
//! decides whether the rest of the body can be skipped or the connection
//! must close.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Frame, SizeHint};

use super::BoxError;

/// The consuming half: a request body.
#[derive(Debug)]
pub(crate) struct H1Recv {
    shared: Arc<Mutex<Slot>>,
    /// Bytes the `Content-Length` still promises (none when chunked).
    left: Option<u64>,
}

/// The connection's half.
#[derive(Debug)]
pub(crate) struct H1Sender {
    shared: Arc<Mutex<Slot>>,
}

/// What the connection should do next for the body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// The slot is empty and the consumer wants a frame.
    Frame,
    /// The consumer is gone.
    Gone,
}

#[derive(Debug, Default)]
struct Slot {
    data: Option<Bytes>,
    end: End,
    /// The consumer has asked for a frame the slot does not hold yet.
    wanted: bool,
    gone: bool,
    recv: Option<Waker>,
    send: Option<Waker>,
}

#[derive(Debug, Default)]
enum End {
    #[default]
    Open,
    /// Ended, with trailers still to give.
    Trailers(HeaderMap),
    Ended,
    Failed(BoxError),
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A channel for one body of `length` bytes (`None`: chunked).
pub(crate) fn channel(length: Option<u64>) -> (H1Sender, H1Recv) {
    let shared = Arc::new(Mutex::new(Slot::default()));
    (
        H1Sender {
            shared: Arc::clone(&shared),
        },
        H1Recv {
            shared,
            left: length,
        },
    )
}

impl H1Sender {
    /// Ready when the connection should decode the next frame, or stop.
    pub(crate) fn poll_want(&self, cx: &mut Context<'_>) -> Poll<Want> {
        let mut slot = lock(&self.shared);
        if slot.gone {
            return Poll::Ready(Want::Gone);
        }
        if slot.wanted && slot.data.is_none() {
            return Poll::Ready(Want::Frame);
        }
        if !slot.send.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            slot.send = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Hands over body bytes; `last` when the body ends with them.
    pub(crate) fn send(&self, data: Bytes, last: bool) {
        self.give(|slot| {
            slot.data = Some(data);
            if last {
                slot.end = End::Ended;
            }
        });
    }

    /// The body has ended, with `trailers` if any.
    pub(crate) fn end(&self, trailers: Option<HeaderMap>) {
        self.give(|slot| {
            slot.end = match trailers {
                Some(t) => End::Trailers(t),
                None => End::Ended,
            }
        });
    }

    /// The body failed (its framing, or the client's connection).
    pub(crate) fn fail(&self, error: BoxError) {
        self.give(|slot| slot.end = End::Failed(error));
    }

    fn give(&self, change: impl FnOnce(&mut Slot)) {
        let waker = {
            let mut slot = lock(&self.shared);
            change(&mut slot);
            slot.wanted = false;
            slot.recv.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Drop for H1Sender {
    fn drop(&mut self) {
        // A connection that stops feeding mid-body (it closed) fails the
        // body rather than leaving its consumer waiting.
        let mut slot = lock(&self.shared);
        if matches!(slot.end, End::Open) {
            slot.end = End::Failed("client connection ended before the request body".into());
            if let Some(w) = slot.recv.take() {
                drop(slot);
                w.wake();
            }
        }
    }
}

impl H1Recv {
    /// The next frame; see [`http_body::Body::poll_frame`].
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut slot = lock(&self.shared);
        if let Some(data) = slot.data.take() {
            if let Some(left) = self.left.as_mut() {
                *left = left.saturating_sub(data.len() as u64);
            }
            // Taking a frame asks for the next one, so the connection
            // reads it while this one goes on.
            let waker = if matches!(slot.end, End::Open) {
                slot.wanted = true;
                slot.send.take()
            } else {
                None
            };
            drop(slot);
            if let Some(w) = waker {
                w.wake();
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match std::mem::replace(&mut slot.end, End::Ended) {
            End::Ended => return Poll::Ready(None),
            End::Trailers(t) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
            End::Failed(e) => return Poll::Ready(Some(Err(e))),
            End::Open => slot.end = End::Open,
        }
        if !slot.recv.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            slot.recv = Some(cx.waker().clone());
        }
        let waker = if slot.wanted {
            None
        } else {
            slot.wanted = true;
            slot.send.take()
        };
        drop(slot);
        if let Some(w) = waker {
            w.wake();
        }
        Poll::Pending
    }

    /// True once nothing is left to read.
    pub(crate) fn is_end_stream(&self) -> bool {
        let slot = lock(&self.shared);
        slot.data.is_none() && matches!(slot.end, End::Ended)
    }

    /// Exact while the `Content-Length` says how much is left.
    pub(crate) fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

impl Drop for H1Recv {
    fn drop(&mut self) {
        let waker = {
            let mut slot = lock(&self.shared);
            slot.gone = true;
            slot.send.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Wakes>, Waker) {
        let w = Arc::new(Wakes::default());
        (Arc::clone(&w), Waker::from(w))
    }

    #[test]
    fn frames_pass_one_at_a_time_and_each_taken_frame_asks_for_the_next() {
        let (tx, mut rx) = channel(Some(5));
        let (conn_wakes, conn) = waker();
        let (body_wakes, body) = waker();
        let mut conn_cx = Context::from_waker(&conn);
        let mut body_cx = Context::from_waker(&body);
        // Nothing is read before the consumer asks.
        assert!(tx.poll_want(&mut conn_cx).is_pending());
        assert!(rx.poll_frame(&mut body_cx).is_pending());
        assert_eq!(
            conn_wakes.0.load(Ordering::SeqCst),
            1,
            "the ask wakes the connection"
        );
        assert_eq!(tx.poll_want(&mut conn_cx), Poll::Ready(Want::Frame));
        tx.send(Bytes::from_static(b"hel"), false);
        assert_eq!(body_wakes.0.load(Ordering::SeqCst), 1);
        // The slot is full until taken.
        assert!(tx.poll_want(&mut conn_cx).is_pending());
        assert_eq!(rx.size_hint().exact(), Some(5));
        let Poll::Ready(Some(Ok(frame))) = rx.poll_frame(&mut body_cx) else {
            panic!("a frame");
        };
        assert_eq!(frame.into_data().expect("data"), "hel");
        assert_eq!(rx.size_hint().exact(), Some(2));
        // Taking it asked for the next one already.
        assert_eq!(tx.poll_want(&mut conn_cx), Poll::Ready(Want::Frame));
        tx.send(Bytes::from_static(b"lo"), true);
        assert!(!rx.is_end_stream(), "the last bytes are still to take");
        assert!(matches!(
            rx.poll_frame(&mut body_cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(rx.is_end_stream());
        assert!(matches!(rx.poll_frame(&mut body_cx), Poll::Ready(None)));
    }

    #[test]
    fn trailers_failures_and_a_gone_consumer_reach_the_other_side() {
        let (tx, mut rx) = channel(None);
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", "1".parse().expect("value"));
        tx.end(Some(trailers));
        let Poll::Ready(Some(Ok(frame))) = rx.poll_frame(&mut cx) else {
            panic!("trailers");
        };
        assert!(frame.is_trailers());
        assert!(matches!(rx.poll_frame(&mut cx), Poll::Ready(None)));

        let (tx, mut rx) = channel(None);
        tx.fail("bad chunk".into());
        assert!(matches!(rx.poll_frame(&mut cx), Poll::Ready(Some(Err(_)))));

        // A connection that goes away mid-body fails it.
        let (tx, mut rx) = channel(Some(9));
        drop(tx);
        assert!(matches!(rx.poll_frame(&mut cx), Poll::Ready(Some(Err(_)))));

        let (tx, rx) = channel(Some(9));
        let (conn_wakes, conn) = waker();
        assert!(tx.poll_want(&mut Context::from_waker(&conn)).is_pending());
        drop(rx);
        assert_eq!(conn_wakes.0.load(Ordering::SeqCst), 1);
        assert_eq!(tx.poll_want(&mut cx), Poll::Ready(Want::Gone));
    }
}
