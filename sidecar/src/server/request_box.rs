//! The heap memory a request's future runs in, reused from one request to
//! the next on the same thread.
//!
//! A request's future is large, boxed so that it does not size every
//! connection's task (HTTP/1) and is not copied through `tokio::spawn`
//! (h2c). glibc serves a block that large from its sorted bins, not from
//! its per-thread cache, and first merges every freed small block
//! (`malloc_consolidate`, which then ran for most h2c requests). Here a
//! finished request's box is emptied (its future dropped at once, as a
//! freed box's would be) and kept, up to [`SPARES`] per thread, for the
//! next request on that thread: memory glibc would mostly have kept in its
//! bins anyway. That took instructions off each HTTP/1 request and most of
//! the consolidations away under h2c load, with no change in CPU time
//! beyond the runs' spread (measured:
//! `e2e/bench/results/2026-12-03-issue18-request-box.md`). The binary has
//! since moved to jemalloc (`main.rs`), whose thread cache serves blocks
//! this large; the spares still save a request its box's allocation and
//! free there.
//!
//! Only one future type is kept per thread (the first one boxed here; the
//! sidecar boxes one); a box of another type is allocated and freed as
//! usual.

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Emptied boxes kept per thread (that many request futures' memory at
/// most, held only after that many requests were in flight at once). h2c
/// clients send in bursts: h2load's 4 × 64 streams end 256 at a time and
/// the next 256 start after them, so with 32 spares most boxes were freed
/// past the cap, and 128 still left a burst to allocate many of its boxes
/// (measured: `e2e/bench/results/2026-12-03-issue18-request-box.md`,
/// `e2e/bench/results/2026-12-04-issue18-h2c-reference.md`); HTTP/1 needs
/// one per connection with a request in flight.
const SPARES: usize = 256;

thread_local! {
    /// This thread's spare boxes: a `Vec<Pin<Box<Option<F>>>>` for the
    /// future type `F` boxed first on the thread.
    static SPARE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// A request's future in a box that goes back to its thread's spares when
/// this is dropped (after the future ends, or to cancel it).
pub(super) struct RequestBox<F: 'static> {
    /// `None` only once dropped.
    boxed: Option<Pin<Box<Option<F>>>>,
}

impl<F: Future + 'static> RequestBox<F> {
    /// Boxes `future`, in a spare box if this thread has one.
    ///
    /// Always inlined: of a new future only its arguments are set, a small
    /// part of it; inlined, the compiler writes those into the box, where a
    /// call copied all of it (measured:
    /// `e2e/bench/results/2026-12-04-issue18-clocks-and-copies.md`).
    #[inline(always)]
    pub(super) fn new(future: F) -> Self {
        let mut boxed = take_spare::<F>().unwrap_or_else(|| Box::pin(None));
        boxed.set(Some(future));
        Self { boxed: Some(boxed) }
    }
}

impl<F: Future + 'static> Future for RequestBox<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self
            .get_mut()
            .boxed
            .as_mut()
            .and_then(|b| b.as_mut().as_pin_mut())
        {
            Some(future) => future.poll(cx),
            // Unreachable: the box is emptied only when this is dropped.
            None => Poll::Pending,
        }
    }
}

impl<F: 'static> Drop for RequestBox<F> {
    fn drop(&mut self) {
        let Some(mut boxed) = self.boxed.take() else {
            return;
        };
        // The future is dropped now, before the spares are borrowed (its
        // drop could box or drop another request's future).
        boxed.set(None);
        let _ = SPARE.try_with(|spare| {
            let Ok(mut spare) = spare.try_borrow_mut() else {
                return;
            };
            let list = spare
                .get_or_insert_with(|| Box::new(Vec::<Pin<Box<Option<F>>>>::with_capacity(SPARES)));
            if let Some(list) = list.downcast_mut::<Vec<Pin<Box<Option<F>>>>>() {
                if list.len() < SPARES {
                    list.push(boxed);
                }
            }
        });
    }
}

/// One of this thread's spare boxes for `F`, if it has one.
fn take_spare<F: 'static>() -> Option<Pin<Box<Option<F>>>> {
    SPARE
        .try_with(|spare| {
            spare
                .try_borrow_mut()
                .ok()?
                .as_mut()?
                .downcast_mut::<Vec<Pin<Box<Option<F>>>>>()?
                .pop()
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts its drops: the future must be dropped with its box's owner,
    /// not kept alive in the spares.
    struct Tracked(Arc<AtomicUsize>, u64);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn spares<F: 'static>() -> usize {
        SPARE.with(|s| {
            s.borrow()
                .as_ref()
                .and_then(|l| l.downcast_ref::<Vec<Pin<Box<Option<F>>>>>())
                .map_or(0, Vec::len)
        })
    }

    /// The spares of `tracked`'s future type on this thread.
    fn tracked_spares() -> usize {
        fn of<F: 'static>(_: fn(Arc<AtomicUsize>, u64) -> F) -> usize {
            spares::<F>()
        }
        of(tracked)
    }

    fn tracked(drops: Arc<AtomicUsize>, n: u64) -> impl Future<Output = u64> + 'static {
        let t = Tracked(drops, n);
        async move {
            tokio::task::yield_now().await;
            t.1
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_finished_box_is_reused_and_its_future_dropped() {
        let drops = Arc::new(AtomicUsize::new(0));
        let first = RequestBox::new(tracked(Arc::clone(&drops), 1));
        let first_at = first.boxed.as_ref().map(|b| &**b as *const _ as usize);
        assert_eq!(first.await, 1);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "the future dropped with its box's owner"
        );

        let second = RequestBox::new(tracked(Arc::clone(&drops), 2));
        let second_at = second.boxed.as_ref().map(|b| &**b as *const _ as usize);
        assert_eq!(
            first_at, second_at,
            "the second request runs in the first one's box"
        );
        drop(second);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            2,
            "a cancelled future is dropped at once"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn at_most_spares_boxes_are_kept() {
        let drops = Arc::new(AtomicUsize::new(0));
        let boxes: Vec<_> = (0..SPARES as u64 + 5)
            .map(|n| RequestBox::new(tracked(Arc::clone(&drops), n)))
            .collect();
        drop(boxes);
        assert_eq!(drops.load(Ordering::SeqCst), SPARES + 5);
        assert_eq!(tracked_spares(), SPARES);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_second_future_type_is_boxed_without_spares() {
        let drops = Arc::new(AtomicUsize::new(0));
        // The thread's list is for the first type boxed on it.
        drop(RequestBox::new(tracked(Arc::clone(&drops), 1)));
        let other = RequestBox::new(async { 7u8 });
        assert_eq!(other.await, 7);
        // Still the first type's list, with its one box.
        assert_eq!(tracked_spares(), 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
