//! Request bodies that can be sent more than once.
//!
//! A body within the policy's replay limit (and the process-wide reservation)
//! is read once and replayed from memory for each attempt. Any other body
//! streams; it can still be retried while no attempt has consumed a byte of it.
//!
//! The reservation holds what has been read, never what a client declared:
//! a client that announces a large body and sends it slowly holds only its
//! bytes, so slow clients cannot take replay away from everyone else. And a
//! body being read for replay that stops arriving is given up after
//! [`BODY_IDLE_TIMEOUT`].

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::{impl_body, BoxError, ClientBody, Frames};

/// How long a body being read for replay may go without a frame before it
/// is given up: no longer than a client may take to send a request head
/// (the server's header read timeout), so a client that stops mid-body
/// holds its connection and task no longer than one that never sent a head.
pub(crate) const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A body being read for replay stopped arriving for [`BODY_IDLE_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error("no request body bytes for {0:?}")]
pub(crate) struct BodyIdle(pub(crate) Duration);

/// The error of an attempt's view of a streaming body polled after a newer
/// attempt took the body over (that attempt was abandoned: a hedge lost).
#[derive(Debug, thiserror::Error)]
#[error("request body was handed to a newer attempt")]
pub(crate) struct BodySuperseded;

/// The bytes every replay buffer in this process holds together, bounded by the
/// configured reservation (64 MiB by default).
#[derive(Debug)]
pub(crate) struct ReplayReservation {
    limit: AtomicU64,
    in_use: AtomicU64,
}

/// Bytes held from a [`ReplayReservation`]; given back when dropped.
#[derive(Debug)]
pub(crate) struct Reserved {
    pool: Arc<ReplayReservation>,
    bytes: u64,
}

/// A request body prepared for one or more attempts.
#[derive(Debug)]
pub(crate) enum ReplayBody {
    /// Read whole; every attempt gets the same bytes.
    Buffered {
        /// The body.
        data: Bytes,
        /// Trailers, if the client sent any.
        trailers: Option<HeaderMap>,
        /// Memory held for `data`, given back when the body is dropped.
        _reserved: Option<Reserved>,
    },
    /// Streams from the client; replayable only while unconsumed.
    Streaming(Arc<Mutex<StreamState>>),
}

/// Shared state of a streaming body.
#[derive(Debug)]
pub(crate) struct StreamState {
    generation: u64,
    prefix: Option<Bytes>,
    rest: Option<ClientBody>,
    consumed: bool,
    _reserved: Option<Reserved>,
}

/// The body of one attempt.
#[derive(Debug)]
pub(crate) enum AttemptBody {
    /// No body.
    Empty,
    /// Bytes from a buffered body, then its trailers (boxed: rare, and an
    /// attempt's body moves with its request through several futures).
    Full(Option<Bytes>, Option<Box<HeaderMap>>),
    /// The client's body, passed straight through (retries off: no copy, no lock).
    Direct(ClientBody),
    /// A view of a streaming body; stops working when a newer attempt takes over.
    Shared(Arc<Mutex<StreamState>>, u64),
}

impl ReplayReservation {
    /// A reservation of at most `limit` bytes.
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit: AtomicU64::new(limit),
            in_use: AtomicU64::new(0),
        })
    }

    /// Changes the limit (on reload); held bytes stay held.
    pub(crate) fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Holds `bytes` if they fit under the limit.
    pub(crate) fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reserved> {
        let limit = self.limit.load(Ordering::Relaxed);
        self.in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            })
            .ok()
            .map(|_| Reserved {
                pool: Arc::clone(self),
                bytes,
            })
    }
}

impl Reserved {
    /// Holds `bytes` more if they fit under the limit.
    fn grow(&mut self, bytes: u64) -> bool {
        let limit = self.pool.limit.load(Ordering::Relaxed);
        let grown = self
            .pool
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            })
            .is_ok();
        if grown {
            self.bytes += bytes;
        }
        grown
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.pool.in_use.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl ReplayBody {
    /// Prepares `body` for replay within `limit` bytes. Never refuses a request:
    /// when the body is over the limit or the reservation runs out while it
    /// is read, what was read goes first and the rest streams. Errors when
    /// the client's body itself fails while being read, or stops arriving
    /// ([`BodyIdle`]).
    pub(crate) async fn prepare(
        mut body: ClientBody,
        content_length: Option<u64>,
        limit: u64,
        pool: &Arc<ReplayReservation>,
    ) -> Result<ReplayBody, BoxError> {
        if body.is_end_stream() || content_length == Some(0) {
            return Ok(ReplayBody::Buffered {
                data: Bytes::new(),
                trailers: None,
                _reserved: None,
            });
        }
        let want = match content_length {
            Some(n) if n > limit => return Ok(Self::streaming(None, body, None)),
            Some(n) => n,
            None if limit == 0 => return Ok(Self::streaming(None, body, None)),
            None => limit,
        };
        let Some(mut reserved) = pool.try_reserve(0) else {
            return Ok(Self::streaming(None, body, None));
        };
        let mut buf = BytesMut::with_capacity(usize::try_from(want).unwrap_or(0).min(1 << 16));
        let mut trailers = None;
        let idle = tokio::time::sleep(BODY_IDLE_TIMEOUT);
        tokio::pin!(idle);
        loop {
            let frame = tokio::select! {
                biased;
                frame = http_body_util::BodyExt::frame(&mut body) => frame,
                () = &mut idle => return Err(Box::new(BodyIdle(BODY_IDLE_TIMEOUT))),
            };
            let Some(frame) = frame else { break };
            let frame = frame?;
            match frame.into_data() {
                Ok(data) => {
                    let over =
                        buf.len() + data.len() > usize::try_from(limit).unwrap_or(usize::MAX);
                    // Over the cap, or no memory left to hold it: what was
                    // read goes first, the rest streams.
                    if over || !reserved.grow(data.len() as u64) {
                        buf.extend_from_slice(&data);
                        return Ok(Self::streaming(Some(buf.freeze()), body, Some(reserved)));
                    }
                    buf.extend_from_slice(&data);
                    idle.as_mut()
                        .reset(tokio::time::Instant::now() + BODY_IDLE_TIMEOUT);
                }
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        trailers = Some(t);
                    }
                }
            }
        }
        Ok(ReplayBody::Buffered {
            data: buf.freeze(),
            trailers,
            _reserved: Some(reserved),
        })
    }

    fn streaming(
        prefix: Option<Bytes>,
        rest: ClientBody,
        reserved: Option<Reserved>,
    ) -> ReplayBody {
        ReplayBody::Streaming(Arc::new(Mutex::new(StreamState {
            generation: 0,
            prefix,
            rest: Some(rest),
            consumed: false,
            _reserved: reserved,
        })))
    }

    /// True when the whole body is in memory (required for hedging).
    pub(crate) fn is_buffered(&self) -> bool {
        matches!(self, ReplayBody::Buffered { .. })
    }

    /// True when another attempt can send this body in full.
    pub(crate) fn is_replayable(&self) -> bool {
        match self {
            ReplayBody::Buffered { .. } => true,
            ReplayBody::Streaming(state) => !lock(state).consumed,
        }
    }

    /// The body for a new attempt. For a streaming body, every older attempt's
    /// view stops working, so two attempts never interleave the client's bytes.
    pub(crate) fn for_attempt(&self) -> AttemptBody {
        match self {
            ReplayBody::Buffered { data, trailers, .. }
                if data.is_empty() && trailers.is_none() =>
            {
                AttemptBody::Empty
            }
            ReplayBody::Buffered { data, trailers, .. } => {
                AttemptBody::Full(Some(data.clone()), trailers.clone().map(Box::new))
            }
            ReplayBody::Streaming(state) => {
                let mut s = lock(state);
                s.generation += 1;
                AttemptBody::Shared(Arc::clone(state), s.generation)
            }
        }
    }
}

fn lock(state: &Mutex<StreamState>) -> MutexGuard<'_, StreamState> {
    // A panic while holding the lock cannot leave the state inconsistent: keep going.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Frames for AttemptBody {
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self {
            AttemptBody::Empty => Poll::Ready(None),
            AttemptBody::Full(data, trailers) => {
                if let Some(d) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(*t))))
            }
            AttemptBody::Direct(inner) => Pin::new(inner).poll_frame(cx),
            AttemptBody::Shared(state, generation) => {
                let mut s = lock(state);
                if s.generation != *generation {
                    return Poll::Ready(Some(Err(BodySuperseded.into())));
                }
                if let Some(prefix) = s.prefix.take() {
                    s.consumed = true;
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
                }
                let Some(rest) = s.rest.as_mut() else {
                    return Poll::Ready(None);
                };
                match Pin::new(rest).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if frame.is_data() {
                            s.consumed = true;
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Poll::Ready(Some(Err(e))) => {
                        s.consumed = true;
                        Poll::Ready(Some(Err(e)))
                    }
                    Poll::Ready(None) => {
                        s.rest = None;
                        Poll::Ready(None)
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_ended(&self) -> bool {
        match self {
            AttemptBody::Empty => true,
            AttemptBody::Full(data, trailers) => data.is_none() && trailers.is_none(),
            AttemptBody::Direct(inner) => inner.is_end_stream(),
            AttemptBody::Shared(state, _) => {
                let s = lock(state);
                s.prefix.is_none() && s.rest.as_ref().is_none_or(|r| r.is_end_stream())
            }
        }
    }

    fn size(&self) -> SizeHint {
        match self {
            AttemptBody::Empty => SizeHint::with_exact(0),
            AttemptBody::Full(data, _) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            AttemptBody::Direct(inner) => inner.size_hint(),
            AttemptBody::Shared(state, _) => {
                let s = lock(state);
                let prefix = s.prefix.as_ref().map_or(0, |p| p.len() as u64);
                match s.rest.as_ref().map(|r| r.size_hint()) {
                    Some(h) => match h.exact() {
                        Some(n) => SizeHint::with_exact(prefix + n),
                        None => {
                            let mut hint = SizeHint::new();
                            hint.set_lower(prefix + h.lower());
                            hint
                        }
                    },
                    None => SizeHint::with_exact(prefix),
                }
            }
        }
    }
}

impl_body!(AttemptBody);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_is_bounded_and_given_back() {
        let pool = ReplayReservation::new(100);
        let a = pool.try_reserve(60).expect("fits");
        assert!(pool.try_reserve(41).is_none());
        let mut b = pool.try_reserve(30).expect("fits");
        assert!(!b.grow(11), "past the limit");
        assert!(b.grow(10), "fits exactly");
        assert_eq!(pool.in_use(), 100);
        drop(a);
        assert_eq!(pool.in_use(), 40);
        drop(b);
        assert_eq!(pool.in_use(), 0);
    }

    /// A body of `length` bytes from a client that sends `first`, then
    /// nothing more while the returned task runs.
    fn stalling(length: u64, first: &'static [u8]) -> (ClientBody, tokio::task::JoinHandle<()>) {
        let (sender, recv) = super::super::h1_recv::channel(Some(length));
        let feeder = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| sender.poll_want(cx)).await;
            sender.send(Bytes::from_static(first), false);
            std::future::pending::<()>().await;
        });
        (ClientBody::Http1(recv), feeder)
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_body_holds_what_it_sent_not_what_it_declared() {
        let pool = ReplayReservation::new(8 << 20);
        let (body, feeder) = stalling(4 << 20, b"x");
        let reading = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { ReplayBody::prepare(body, Some(4 << 20), 4 << 20, &pool).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(pool.in_use(), 1, "one byte read, one byte held");
        // The rest of the reservation is free for others.
        assert!(pool.try_reserve((8 << 20) - 1).is_some());
        reading.abort();
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_is_given_up_after_the_idle_timeout() {
        let pool = ReplayReservation::new(1 << 20);
        let (body, feeder) = stalling(10, b"abc");
        let started = tokio::time::Instant::now();
        let err = ReplayBody::prepare(body, Some(10), 1 << 20, &pool)
            .await
            .expect_err("given up");
        assert!(err.downcast_ref::<BodyIdle>().is_some(), "{err}");
        assert_eq!(
            started.elapsed(),
            BODY_IDLE_TIMEOUT,
            "counted from the last frame"
        );
        assert_eq!(pool.in_use(), 0, "what it held is given back");
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_arriving_is_read_whole_however_long_it_takes() {
        let pool = ReplayReservation::new(1 << 20);
        let (sender, recv) = super::super::h1_recv::channel(Some(3));
        let feeder = tokio::spawn(async move {
            for (i, byte) in [b"a", b"b", b"c"].into_iter().enumerate() {
                let _ = std::future::poll_fn(|cx| sender.poll_want(cx)).await;
                tokio::time::sleep(BODY_IDLE_TIMEOUT - Duration::from_secs(1)).await;
                sender.send(Bytes::from_static(byte), i == 2);
            }
        });
        let body = ReplayBody::prepare(ClientBody::Http1(recv), Some(3), 1 << 20, &pool)
            .await
            .expect("read whole");
        assert!(body.is_buffered());
        assert_eq!(pool.in_use(), 3);
        feeder.await.expect("fed");
    }
}
