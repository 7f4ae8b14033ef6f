//! The three bounds: attempt cap, rolling budget, total deadline; and endpoint
//! exclusion.

use std::time::Duration;

use crate::support::{
    api, full_budget, pair, retries, retry_after, Action, Retries, Sidecar, Upstream,
};

#[tokio::test]
async fn the_attempt_cap_bounds_retries_to_distinct_endpoints() {
    let eps: Vec<Upstream> =
        futures_util::future::join_all((0..4).map(|_| Upstream::always(Action::Reply(503)))).await;
    let refs: Vec<&Upstream> = eps.iter().collect();
    let sidecar = Sidecar::start(
        api(&refs).retries(retries().attempts(2).backoff_base_ms(1).backoff_cap_ms(2)),
    )
    .await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 503);
    let counts: Vec<usize> = eps.iter().map(Upstream::count).collect();
    assert_eq!(counts.iter().sum::<usize>(), 3, "1 + attempts");
    assert!(
        counts.iter().all(|c| *c <= 1),
        "each attempt went to an untried endpoint: {counts:?}"
    );
    let mut attempts: Vec<u32> = eps
        .iter()
        .flat_map(|e| e.received())
        .filter_map(|r| r.attempt)
        .collect();
    attempts.sort_unstable();
    assert_eq!(attempts, vec![1, 2, 3]);
}

#[tokio::test]
async fn without_an_alternate_the_retries_stop_unless_reuse_is_allowed() {
    let quick = || retries().backoff_base_ms(1).backoff_cap_ms(1);
    let (a, b) = pair(Action::Reply(503)).await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(quick().attempts(5))).await;
    sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(a.count() + b.count(), 2);

    let a = Upstream::always(Action::Reply(503)).await;
    let sidecar =
        Sidecar::start(api(&[&a]).retries(quick().attempts(3).reuse_endpoints(true))).await;
    sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(
        a.count(),
        4,
        "reuse allowed: every attempt went to the only endpoint"
    );
}

/// One retry without backoff under a budget of `percent` (and no floor).
fn no_backoff(percent: f64) -> Retries {
    Retries::new()
        .attempts(1)
        .budget_percent(percent)
        .backoff_base_ms(0)
        .backoff_cap_ms(0)
}

#[tokio::test]
async fn the_budget_caps_retries_during_an_outage() {
    let (a, b) = pair(Action::Reply(503)).await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(no_backoff(10.0))).await;
    for _ in 0..100 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 503);
    }
    // (retries + 1) * 100 <= 10 * requests, every retry counted as a request
    // to the upstream: exactly 11 retries for 100 client requests.
    assert_eq!(a.count() + b.count(), 111, "amplification 1.11");
    let stats = sidecar.stats("api");
    assert_eq!((stats.budget_requests, stats.budget_retries), (111, 11));
    assert_eq!(stats.budget_refusals, 89);
}

#[tokio::test]
async fn the_budget_is_shared_by_concurrent_requests() {
    let (a, b) = pair(Action::Reply(503)).await;
    let sidecar =
        std::sync::Arc::new(Sidecar::start(api(&[&a, &b]).retries(no_backoff(20.0))).await);
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let s = std::sync::Arc::clone(&sidecar);
            tokio::spawn(async move { s.send("GET", "api", "/", b"").await.status })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.expect("task"), 503);
    }
    let stats = sidecar.stats("api");
    let (requests, retries) = (stats.budget_requests, stats.budget_retries);
    assert_eq!(requests, 100 + retries, "each retry is a request too");
    assert!(
        retries * 100 <= 20 * requests,
        "never overdrawn: {retries} retries"
    );
    assert_eq!(a.count() + b.count(), requests as usize);
}

#[tokio::test]
async fn the_total_deadline_bounds_the_whole_chain() {
    let (a, b) = pair(Action::Stall(Duration::from_secs(2))).await;
    let sidecar = Sidecar::start(
        api(&[&a, &b])
            .read_ms(1500)
            .retries(retries().attempts(2).total_deadline_ms(300)),
    )
    .await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 504);
    assert_eq!(r.header("x-reprise-error"), Some(&b"deadline_exceeded"[..]));
    assert!(r.elapsed >= Duration::from_millis(290), "{:?}", r.elapsed);
    assert!(
        r.elapsed < Duration::from_millis(1200),
        "the deadline, not read_ms, ended it: {:?}",
        r.elapsed
    );
    assert_eq!(sidecar.outcomes("api", "exhausted"), 1);
}

#[tokio::test]
async fn a_retry_that_would_cross_the_deadline_is_not_made_and_not_charged() {
    let (a, b) = pair(retry_after(503, "1", "busy")).await;
    let sidecar =
        Sidecar::start(api(&[&a, &b]).retries(full_budget().attempts(2).total_deadline_ms(300)))
            .await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 503, "the last response goes to the client");
    assert_eq!(r.text(), "busy");
    assert!(
        r.elapsed < Duration::from_millis(900),
        "no sleep past the deadline: {:?}",
        r.elapsed
    );
    assert_eq!(a.count() + b.count(), 1);
    assert_eq!(
        {
            let s = sidecar.stats("api");
            (s.budget_requests, s.budget_retries)
        },
        (1, 0),
        "not charged"
    );
}

#[tokio::test]
async fn backoff_sleeps_at_most_the_nominal_delay() {
    let (a, b) = pair(Action::Reply(503)).await;
    let sidecar = Sidecar::start(
        api(&[&a, &b]).retries(
            full_budget()
                .attempts(1)
                .backoff_base_ms(300)
                .backoff_cap_ms(300),
        ),
    )
    .await;
    for _ in 0..5 {
        let r = sidecar.send("GET", "api", "/", b"").await;
        assert!(
            r.elapsed < Duration::from_millis(900),
            "full jitter never exceeds the 300 ms nominal: {:?}",
            r.elapsed
        );
    }
    assert_eq!(a.count() + b.count(), 10);
}

#[tokio::test]
async fn a_hundred_percent_budget_leaves_only_the_attempt_cap() {
    // 20 requests, two retries each, three endpoints all answering 503: every
    // retry is allowed, so the upstreams see 60 requests (40 when retries did
    // not count as requests to them).
    let up = [
        Upstream::always(Action::Reply(503)).await,
        Upstream::always(Action::Reply(503)).await,
        Upstream::always(Action::Reply(503)).await,
    ];
    let retries = Retries::new()
        .attempts(2)
        .budget_percent(100.0)
        .backoff_base_ms(0)
        .backoff_cap_ms(0);
    let sidecar = Sidecar::start(api(&[&up[0], &up[1], &up[2]]).retries(retries)).await;
    for _ in 0..20 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 503);
    }
    assert_eq!(up.iter().map(Upstream::count).sum::<usize>(), 60);
    assert_eq!(sidecar.stats("api").budget_refusals, 0);
}
