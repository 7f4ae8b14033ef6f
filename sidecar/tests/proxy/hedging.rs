//! Hedging: one speculative duplicate after a delay without response headers.

use std::time::Duration;

use reprise_testkit::upstream::first_then;

use crate::support::{api, full_budget, pair, Action, Sidecar, Upstream};

#[tokio::test]
async fn a_slow_first_attempt_is_hedged_and_the_first_answer_wins() {
    // Whichever endpoint gets the very first request stalls; everything else is fast.
    let script = first_then(Action::Stall(Duration::from_secs(3)), Action::Reply(200));
    let a = Upstream::start(script.clone()).await;
    let b = Upstream::start(script).await;
    let sidecar =
        Sidecar::start(api(&[&a, &b]).retries(full_budget().attempts(1).hedge_delay_ms(100))).await;
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
    let (a, b) = pair(Action::Stall(Duration::from_millis(400))).await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(full_budget().attempts(1))).await;
    assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    assert_eq!(a.count() + b.count(), 1);
}
