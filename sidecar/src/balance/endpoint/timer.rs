//! Attempt timeouts from timers kept for reuse.
//!
//! A fresh `tokio::time::Sleep` per attempt costs its registration in the
//! runtime's timer wheel on the first poll and its removal when dropped,
//! each under the wheel's lock, besides looking up the runtime (measured
//! against a build with no attempt timeout:
//! `e2e/bench/results/2026-12-05-issue18-send.md`). A kept timer moved to a
//! later deadline only updates the entry it already has in the wheel (one
//! atomic compare-and-swap); the wheel moves it when the earlier deadline
//! comes. A kept timer whose deadline passes while unused wakes the task
//! that last polled it once, which re-polls and finds nothing to do; until
//! then it holds that task's waker (at most [`KEEP`] per endpoint, for at
//! most the attempt timeout, 15 s by default).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

/// At most this many idle timers kept: the attempts in flight at once on
/// one endpoint, in the common case.
const KEEP: usize = 64;

/// Idle timers of one endpoint's attempts. The endpoint's state lives and
/// dies with the runtime that made its timers.
#[derive(Debug, Default)]
pub(crate) struct TimerPool(Mutex<Vec<Pin<Box<Sleep>>>>);

impl TimerPool {
    /// A timer that fires at `deadline`, back in the pool when dropped.
    pub(crate) fn at(&self, deadline: Instant) -> Timer<'_> {
        let kept = lock(&self.0).pop();
        let sleep = match kept {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Timer {
            pool: self,
            sleep: Some(sleep),
        }
    }
}

/// A timer taken from a [`TimerPool`].
#[derive(Debug)]
pub(crate) struct Timer<'p> {
    pool: &'p TimerPool,
    /// `None` only once dropped.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Future for Timer<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut().sleep.as_mut() {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let Some(sleep) = self.sleep.take() else {
            return;
        };
        let mut kept = lock(&self.pool.0);
        if kept.len() < KEEP {
            kept.push(sleep);
        }
    }
}

fn lock(pool: &Mutex<Vec<Pin<Box<Sleep>>>>) -> MutexGuard<'_, Vec<Pin<Box<Sleep>>>> {
    // A push or a pop: a panic cannot leave the list inconsistent.
    pool.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Whether `timer` has fired, polled once.
    fn fired(timer: &mut Timer<'_>) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(timer).poll(&mut cx).is_ready()
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_timer_fires_at_its_new_deadline_later_or_earlier() {
        let pool = TimerPool::default();
        let start = Instant::now();
        let mut first = pool.at(start + Duration::from_secs(1));
        assert!(!fired(&mut first), "registered, not due");
        drop(first);
        assert_eq!(lock(&pool.0).len(), 1, "kept");

        // Later: moved forward in place, not due at the old deadline.
        let mut later = pool.at(start + Duration::from_secs(5));
        assert_eq!(lock(&pool.0).len(), 0, "taken from the pool");
        tokio::time::sleep_until(start + Duration::from_secs(2)).await;
        assert!(!fired(&mut later), "the first deadline no longer counts");
        tokio::time::sleep_until(start + Duration::from_secs(5)).await;
        assert!(fired(&mut later), "due at the new deadline");
        drop(later);

        // Earlier than the kept one's: re-registered, due then.
        let now = Instant::now();
        let mut far = pool.at(now + Duration::from_secs(60));
        assert!(!fired(&mut far));
        drop(far);
        let mut near = pool.at(now + Duration::from_secs(1));
        tokio::time::sleep_until(now + Duration::from_secs(1)).await;
        assert!(fired(&mut near), "an earlier deadline is kept too");
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_that_fired_while_kept_waits_for_its_next_deadline() {
        let pool = TimerPool::default();
        let start = Instant::now();
        let mut timer = pool.at(start + Duration::from_secs(1));
        assert!(!fired(&mut timer));
        drop(timer);
        // Its deadline passes while nobody uses it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = Instant::now();
        let mut timer = pool.at(now + Duration::from_secs(2));
        assert!(!fired(&mut timer), "not still fired from before");
        tokio::time::sleep_until(now + Duration::from_secs(2)).await;
        assert!(fired(&mut timer));
    }

    #[tokio::test(start_paused = true)]
    async fn the_pool_keeps_at_most_its_limit() {
        let pool = TimerPool::default();
        let deadline = Instant::now() + Duration::from_secs(1);
        let timers: Vec<_> = (0..KEEP + 10).map(|_| pool.at(deadline)).collect();
        drop(timers);
        assert_eq!(lock(&pool.0).len(), KEEP);
    }
}
