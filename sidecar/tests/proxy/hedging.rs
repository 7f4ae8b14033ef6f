//! Hedging: one speculative duplicate after a delay without response headers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{config, Action, Sidecar, Upstream};

#[tokio::test]
async fn a_slow_first_attempt_is_hedged_and_the_first_answer_wins() {
    // Whichever endpoint gets the very first request stalls; everything else is fast.
    let first = Arc::new(AtomicUsize::new(0));
    let script = |first: Arc<AtomicUsize>| {
        move |_| {
            if first.fetch_add(1, Ordering::SeqCst) == 0 {
                Action::Stall(Duration::from_secs(3))
            } else {
                Action::Reply(200)
            }
        }
    };
    let a = Upstream::start(script(Arc::clone(&first))).await;
    let b = Upstream::start(script(Arc::clone(&first))).await;
    let sidecar = Sidecar::start(&config(
        &[&a, &b],
        "    retries: { attempts: 1, hedge: { delay_ms: 100 }, budget_percent: 100 }\n",
    ))
    .await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 200);
    assert!(
        r.elapsed < Duration::from_secs(2),
        "the hedge answered first: {:?}",
        r.elapsed
    );
    assert!(
        r.elapsed >= Duration::from_millis(95),
        "not before the hedge delay: {:?}",
        r.elapsed
    );
    assert_eq!(
        (a.count(), b.count()),
        (1, 1),
        "one original, one duplicate on the other endpoint"
    );
    let hedges = sidecar.stats("api").hedges;
    assert_eq!(hedges, 1);
    // A fast request is never hedged.
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(a.count() + b.count(), 3);
}

#[tokio::test]
async fn hedging_is_off_by_default() {
    let a = Upstream::always(Action::Stall(Duration::from_millis(400))).await;
    let b = Upstream::always(Action::Stall(Duration::from_millis(400))).await;
    let sidecar = Sidecar::start(&config(
        &[&a, &b],
        "    retries: { attempts: 1, budget_percent: 100 }\n",
    ))
    .await;
    assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    assert_eq!(a.count() + b.count(), 1);
}
