//! The drain after SIGTERM, as every connection task sees it.
//!
//! From the signal on, every HTTP/1 response whose headers are not yet out
//! carries `Connection: close`, so its client reconnects (to a pod that is not
//! leaving), and HTTP/2 connections get GOAWAY at once. An HTTP/1 connection
//! whose last response could not say so (its headers left before the signal)
//! may still receive a request from a client that knows nothing: it stays
//! open for a grace period counted from the later of the signal and the end
//! of that response, answers what arrives with `Connection: close`, and is
//! closed once quiet that long. A response still streaming when the signal
//! comes thus gets its full grace after it ends, not a grace that ran out
//! while it streamed (the soak's lost POST).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{watch, Notify};

use crate::clock;
use crate::exchange::body::{impl_body, BoxError, Frames};
use crate::proxy::body::ProxyBody;

/// How far the drain has got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum DrainPhase {
    /// No drain yet.
    Serving,
    /// The signal came: responses say `Connection: close`, HTTP/2 gets GOAWAY.
    Draining,
    /// The grace window from the signal is over: connections that have not
    /// sent a byte yet are closed.
    ClosingIdle,
}

/// The drain as broadcast to connection tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Drain {
    pub(crate) phase: DrainPhase,
    /// When the signal came (`clock::now_ms`), once draining.
    pub(crate) started_ms: u64,
    /// How long an HTTP/1 connection stays open once quiet.
    pub(crate) grace: Duration,
}

impl Drain {
    /// Before any signal.
    pub(crate) const SERVING: Drain = Drain {
        phase: DrainPhase::Serving,
        started_ms: 0,
        grace: Duration::ZERO,
    };
}

/// Resolves once the drain has reached `at` (or the drain's sender is gone).
pub(crate) async fn reached(drain: &mut watch::Receiver<Drain>, at: DrainPhase) {
    let _ = drain.wait_for(|d| d.phase >= at).await;
}

/// One HTTP/1 connection's responses, as far as the drain and the idle
/// deadline care.
#[derive(Debug)]
pub(crate) struct ConnDrain {
    /// Requests whose response has not ended yet (body sent or dropped).
    open: AtomicU32,
    /// When the last response ended, or the connection was taken in.
    quiet_since_ms: AtomicU64,
    /// Set when the connection task waits on `changed`.
    watching: AtomicBool,
    changed: Notify,
    /// The drain closes the connection: no further request is read.
    closing: AtomicBool,
}

/// Futures polled beside a connection only after one of their own wakers
/// fired, not on every wake of the connection's task. Each poll registers
/// the task's waker first and then takes the flag, so a wake that comes
/// while they are being polled is kept for the next poll, never lost.
pub(crate) struct SideWake {
    flag: Arc<Flag>,
    waker: Waker,
}

struct Flag {
    fired: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl SideWake {
    /// Fired at first, so the side futures get their first poll.
    pub(crate) fn new() -> Self {
        let flag = Arc::new(Flag {
            fired: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&flag));
        Self { flag, waker }
    }

    /// Runs `poll` with the side futures' waker if it fired since the last
    /// time; `Pending` otherwise.
    pub(crate) fn poll_fired<T>(
        &self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.flag.task.register(cx.waker());
        if !self.flag.fired.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        poll(&mut Context::from_waker(&self.waker))
    }
}

/// Held from a request's arrival to the end of its response.
#[derive(Debug)]
pub(crate) struct ResponseGuard(Arc<ConnDrain>);

impl ConnDrain {
    /// A connection taken in now.
    pub(crate) fn new() -> Self {
        Self {
            open: AtomicU32::new(0),
            quiet_since_ms: AtomicU64::new(clock::now_ms()),
            watching: AtomicBool::new(false),
            changed: Notify::new(),
            closing: AtomicBool::new(false),
        }
    }

    /// The drain's graceful shutdown of an HTTP/1 connection: it reads no
    /// further request (one in flight is answered first).
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// True once [`Self::close`] was called.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Resolves once no request has been open for `limit`, counted from the
    /// connection's start or its last response's end: the client took that
    /// long to send a whole request head, or sent none. This is hyper's
    /// header read timeout (which ran from the end of one response to the
    /// next head, so it also closed idle keep-alive connections) at one timer
    /// per connection instead of one per request: hyper armed and dropped a
    /// boxed sleep for every head (measured:
    /// `e2e/bench/results/2026-12-02-issue18-server-path.md`); here a
    /// response's end only stores the time, and the timer wakes once per
    /// `limit`.
    pub(crate) async fn idle(&self, limit: Duration) {
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        loop {
            let now = clock::now_ms();
            let wait = if self.open.load(Ordering::Acquire) > 0 {
                // A request in flight has no deadline here; look again later.
                limit_ms
            } else {
                let until = self
                    .quiet_since_ms
                    .load(Ordering::Acquire)
                    .saturating_add(limit_ms);
                if until <= now {
                    return;
                }
                until - now
            };
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }

    /// A request arrived; the guard marks its response's end.
    pub(crate) fn request(self: &Arc<Self>) -> ResponseGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        ResponseGuard(Arc::clone(self))
    }

    /// Resolves once no response is open and none has ended for `grace`
    /// after the later of `since_ms` (the signal) and the last response's end.
    pub(crate) async fn quiet(&self, since_ms: u64, grace: Duration) {
        self.watching.store(true, Ordering::Release);
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        loop {
            let changed = self.changed.notified();
            if self.open.load(Ordering::Acquire) > 0 {
                changed.await;
                continue;
            }
            let from = since_ms.max(self.quiet_since_ms.load(Ordering::Acquire));
            let left = from
                .saturating_add(grace_ms)
                .saturating_sub(clock::now_ms());
            if left == 0 {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(Duration::from_millis(left)) => {}
            }
        }
    }
}

impl Drop for ResponseGuard {
    fn drop(&mut self) {
        let conn = &self.0;
        // The time is read only by the watchers above, and only while no
        // response is open: stored when this is likely the last one open,
        // not on every response's end (an h2c connection ends dozens of
        // streams per quiet moment, and a clock read is not free: measured in
        // `e2e/bench/results/2026-12-04-issue18-clocks-and-copies.md`). A
        // response that ends at once beside this one still stores it below,
        // after the count.
        let last = conn.open.load(Ordering::Acquire) == 1;
        if last {
            conn.quiet_since_ms
                .store(clock::now_ms(), Ordering::Release);
        }
        if conn.open.fetch_sub(1, Ordering::AcqRel) == 1 && !last {
            conn.quiet_since_ms
                .store(clock::now_ms(), Ordering::Release);
        }
        if conn.watching.load(Ordering::Acquire) {
            conn.changed.notify_waiters();
        }
    }
}

/// A response body as served: the proxy's body and, on HTTP/1, the guard
/// that marks the response's end when hyper drops the body after sending it.
#[derive(Debug)]
pub(crate) struct ServedBody {
    inner: ProxyBody,
    _end: Option<ResponseGuard>,
}

impl ServedBody {
    pub(crate) fn new(inner: ProxyBody, end: Option<ResponseGuard>) -> Self {
        Self { inner, _end: end }
    }
}

impl Frames for ServedBody {
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_ended(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl_body!(ServedBody);

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    use super::*;

    /// Counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn side_futures_are_polled_only_after_their_own_waker_fired() {
        let task = Arc::new(Wakes::default());
        let task_waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&task_waker);
        let side = SideWake::new();
        let polls = AtomicUsize::new(0);
        let kept: Mutex<Option<Waker>> = Mutex::new(None);
        // The side future: counts its polls, keeps the waker it was given.
        let poll = |side: &SideWake, cx: &mut Context<'_>| {
            side.poll_fired(cx, |cx| {
                polls.fetch_add(1, Ordering::SeqCst);
                *kept.lock().expect("lock") = Some(cx.waker().clone());
                Poll::<()>::Pending
            })
        };
        assert!(poll(&side, &mut cx).is_pending());
        assert_eq!(
            polls.load(Ordering::SeqCst),
            1,
            "the first poll goes through"
        );
        // The connection's own wakes (its socket) do not reach the side.
        for _ in 0..3 {
            assert!(poll(&side, &mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        // The side's waker (a timer, the drain signal) wakes the task, and
        // the next poll reaches the side, once.
        kept.lock().expect("lock").take().expect("waker").wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task was woken");
        assert!(poll(&side, &mut cx).is_pending());
        assert!(poll(&side, &mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_a_limit_after_its_start_or_last_response() {
        let limit = Duration::from_secs(30);
        let conn = Arc::new(ConnDrain::new());
        let started = clock::now_ms();
        conn.idle(limit).await;
        assert_eq!(
            clock::now_ms() - started,
            30_000,
            "from the connection's start"
        );

        let conn = Arc::new(ConnDrain::new());
        tokio::time::advance(Duration::from_secs(20)).await;
        // A request 20 s in, answered for 100 s: never idle while it is open.
        let answering = conn.request();
        let ended = async {
            tokio::time::sleep(Duration::from_secs(100)).await;
            drop(answering);
        };
        let idle = conn.idle(limit);
        tokio::pin!(idle);
        tokio::select! {
            () = &mut idle => panic!("idle while a response was open"),
            () = ended => {}
        }
        let ended_at = clock::now_ms();
        idle.await;
        assert_eq!(
            clock::now_ms() - ended_at,
            30_000,
            "a full limit after the response ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_quiet_a_grace_after_its_last_response_ends() {
        let conn = Arc::new(ConnDrain::new());
        tokio::time::advance(Duration::from_millis(10)).await;
        let streaming = conn.request();
        let signal = clock::now_ms();
        let grace = Duration::from_secs(1);
        let quiet = conn.quiet(signal, grace);
        tokio::pin!(quiet);
        // The response streams for 3 s after the signal: no closing meanwhile.
        let ended = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(streaming);
        };
        tokio::select! {
            () = &mut quiet => panic!("quiet while a response was open"),
            () = ended => {}
        }
        let ended_at = clock::now_ms();
        quiet.await;
        assert_eq!(
            clock::now_ms() - ended_at,
            1000,
            "a full grace after the response ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_gets_the_grace_from_the_signal() {
        let conn = Arc::new(ConnDrain::new());
        tokio::time::advance(Duration::from_millis(10)).await;
        drop(conn.request());
        tokio::time::advance(Duration::from_secs(5)).await;
        let signal = clock::now_ms();
        conn.quiet(signal, Duration::from_secs(1)).await;
        assert_eq!(clock::now_ms() - signal, 1000);
    }
}
