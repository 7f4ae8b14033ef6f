//! Which failures are retried: statuses, 429 with Retry-After, transport
//! errors, read timeouts, failure boundaries, mid-stream body errors.

use std::time::Duration;

use reprise_testkit::config::FailureBoundary;

use crate::support::{
    api, pair, retries, retry_after, Action, Config, Rule, Sidecar, Upstream, UpstreamConfig,
};

/// Two retries with the shared budget floor.
fn retry2(endpoints: &[&Upstream]) -> Config {
    api(endpoints).retries(retries().attempts(2)).into()
}

/// Sends `n` GETs through `sidecar`, expecting 200 for each, all answered by `good`.
async fn all_answered_by(sidecar: &Sidecar, good: &Upstream, n: usize) {
    for _ in 0..n {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    }
    assert_eq!(good.count(), n);
}

/// An endpoint doing `action`, a healthy one, and a sidecar with two retries over both.
async fn failing_and_good(action: Action) -> (Upstream, Upstream, Sidecar) {
    let bad = Upstream::always(action).await;
    let good = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(retry2(&[&bad, &good])).await;
    (bad, good, sidecar)
}

/// Upstream `api` over `endpoints` whose endpoints are ejected for a minute
/// after `failures` transport failures in a row, with `attempts` retries.
fn ejecting(endpoints: &[&Upstream], failures: u32, attempts: u32) -> UpstreamConfig {
    api(endpoints)
        .consecutive_failures(failures)
        .ejection_ms(60000)
        .retries(retries().attempts(attempts))
}

#[tokio::test]
async fn gateway_statuses_are_retried_on_an_untried_endpoint() {
    for status in [502, 503, 504] {
        let (a, b) = pair(Action::Reply(status)).await;
        let good = Upstream::always(Action::Reply(200)).await;
        let sidecar = Sidecar::start(retry2(&[&a, &b, &good])).await;
        for _ in 0..10 {
            let r = sidecar.send("GET", "api", "/", b"").await;
            assert_eq!(
                r.status, 200,
                "status {status}: the client never sees the retryable response"
            );
            assert!(
                r.text().starts_with("from "),
                "the final body is the good endpoint's"
            );
        }
        assert_eq!(
            good.count(),
            10,
            "every request ends on the good endpoint exactly once"
        );
        for bad in [&a, &b] {
            for rec in bad.received() {
                assert!(
                    rec.attempt.is_some_and(|n| n <= 2),
                    "a bad endpoint only sees attempts 1 or 2"
                );
            }
        }
        assert_eq!(
            sidecar.outcomes("api", "ok") + sidecar.outcomes("api", "recovered"),
            10
        );
        // Each request whose first pick was bad is recovered (all ten picking the
        // good one first has a chance of 3^-10).
        assert!(sidecar.outcomes("api", "recovered") >= 1);
    }
}

#[tokio::test]
async fn other_4xx_and_500_are_not_retried_by_default() {
    for status in [400, 404, 409, 500] {
        let (a, b) = pair(Action::Reply(status)).await;
        let sidecar = Sidecar::start(retry2(&[&a, &b])).await;
        let r = sidecar.send("GET", "api", "/", b"").await;
        assert_eq!(r.status, status);
        assert_eq!(
            a.count() + b.count(),
            1,
            "status {status} is passed through after one attempt"
        );
    }
}

#[tokio::test]
async fn exhausted_status_retries_return_the_last_response_unchanged() {
    let down = |name: &'static str| {
        Action::ReplyWith(
            503,
            vec![("x-from", name.into())],
            format!("{name} is down").into(),
        )
    };
    let a = Upstream::always(down("a")).await;
    let b = Upstream::always(down("b")).await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(retries().attempts(5))).await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 503);
    let from = r
        .headers
        .get("x-from")
        .expect("upstream header kept")
        .to_str()
        .expect("text")
        .to_string();
    assert_eq!(
        r.text(),
        format!("{from} is down"),
        "headers and body belong to the same, last attempt"
    );
    assert_eq!(
        (a.count(), b.count()),
        (1, 1),
        "no alternate left after two endpoints"
    );
    assert_eq!(sidecar.outcomes("api", "exhausted"), 1);
}

#[tokio::test]
async fn status_429_honours_a_seconds_retry_after() {
    let limited = Upstream::always(retry_after(429, "1", "slow down")).await;
    let good = Upstream::start(|_| Action::Reply(200)).await;
    let sidecar = Sidecar::start(retry2(&[&limited, &good])).await;
    // Requests until one hits the limited endpoint first (the pick is random).
    for _ in 0..20 {
        let r = sidecar.send("GET", "api", "/", b"").await;
        assert_eq!(r.status, 200);
        if limited.count() == 1 {
            assert!(
                r.elapsed >= Duration::from_millis(990),
                "waited {:?}, Retry-After said 1 s",
                r.elapsed
            );
            return;
        }
    }
    panic!("the limited endpoint was never picked first in 20 requests");
}

#[tokio::test]
async fn status_503_honours_an_http_date_retry_after() {
    // Two seconds from now, in IMF-fixdate (whole seconds): the wait is the
    // time left until then, between one and two seconds.
    let until = std::time::SystemTime::now() + Duration::from_secs(2);
    let date = httpdate::fmt_http_date(until);
    let limited = Upstream::always(retry_after(503, &date, "maintenance")).await;
    let good = Upstream::start(|_| Action::Reply(200)).await;
    let sidecar = Sidecar::start(retry2(&[&limited, &good])).await;
    for _ in 0..20 {
        let r = sidecar.send("GET", "api", "/", b"").await;
        assert_eq!(r.status, 200);
        if limited.count() == 1 {
            assert!(
                r.elapsed >= Duration::from_millis(900) && r.elapsed < Duration::from_millis(2500),
                "waited {:?}, Retry-After said {date}",
                r.elapsed
            );
            return;
        }
    }
    panic!("the limited endpoint was never picked first in 20 requests");
}

#[tokio::test]
async fn retry_after_longer_than_the_maximum_ends_retries_with_the_429() {
    let (limited, other) = pair(retry_after(429, "120", "later")).await;
    let sidecar = Sidecar::start(
        api(&[&limited, &other]).retries(retries().attempts(2).retry_after_max_ms(5000)),
    )
    .await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some(&b"120"[..]));
    assert_eq!(limited.count() + other.count(), 1);
    assert!(r.elapsed < Duration::from_secs(2));
}

#[tokio::test]
async fn garbage_retry_after_falls_back_to_backoff() {
    let (a, b) = pair(retry_after(503, "soon-ish", "x")).await;
    let sidecar = Sidecar::start(
        api(&[&a, &b]).retries(retries().attempts(1).backoff_base_ms(1).backoff_cap_ms(1)),
    )
    .await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 503);
    assert_eq!(a.count() + b.count(), 2, "retried with normal backoff");
    assert!(r.elapsed < Duration::from_secs(1));
}

#[tokio::test]
async fn connect_refused_is_retried_even_at_the_connect_boundary() {
    let down = Upstream::refusing().await;
    let down2 = Upstream::refusing().await;
    let good = Upstream::always(Action::Reply(200)).await;
    let config = Config::from(api(&[&down, &down2, &good])).rule(Rule::new("reads").attempts(2));
    let sidecar = Sidecar::start(config).await;
    all_answered_by(&sidecar, &good, 10).await;
}

#[tokio::test]
async fn reset_after_the_request_was_written_needs_the_before_headers_boundary() {
    // Rule with the safe default boundary (connect): a reset after writing is not retried.
    let (a, b) = pair(Action::Reset).await;
    let config = Config::from(api(&[&a, &b])).rule(Rule::new("reads").attempts(1));
    let sidecar = Sidecar::start(config).await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-reprise-error"), Some(&b"connection_reset"[..]));
    assert_eq!(
        a.count() + b.count(),
        1,
        "the request reached an upstream once and was not duplicated"
    );
    assert_eq!(sidecar.outcomes("api", "skipped"), 1);

    // With before_headers and the acknowledgement, it is retried.
    let a = Upstream::always(Action::Reset).await;
    let good = Upstream::always(Action::Reply(200)).await;
    let config = Config::from(api(&[&a, &good])).rule(
        Rule::new("reads")
            .attempts(1)
            .failure_boundary(FailureBoundary::BeforeHeaders)
            .acknowledge_duplicate_risk(true),
    );
    let sidecar = Sidecar::start(config).await;
    all_answered_by(&sidecar, &good, 6).await;
}

#[tokio::test]
async fn close_before_headers_is_a_transport_failure() {
    let (_a, good, sidecar) = failing_and_good(Action::Close).await;
    all_answered_by(&sidecar, &good, 6).await;
}

#[tokio::test]
async fn an_upstream_half_close_is_retried_for_get_and_never_duplicates_a_post() {
    let (half, good, sidecar) = failing_and_good(Action::HalfClose).await;
    for _ in 0..6 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    }
    assert_eq!(
        good.count(),
        6,
        "every GET answered by the healthy endpoint"
    );
    // A POST is not retried without retry_post: whichever endpoint took it
    // took it once, and a half-close reaches the client as a 502.
    let (half_before, good_before) = (half.count(), good.count());
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(sidecar.send("POST", "api", "/", b"x").await.status);
    }
    let delivered = (half.count() - half_before) + (good.count() - good_before);
    assert_eq!(delivered, 6, "each POST reached exactly one endpoint once");
    assert_eq!(
        statuses.iter().filter(|s| **s == 502).count(),
        half.count() - half_before,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn read_timeout_is_retried_on_another_endpoint() {
    let slow = Upstream::always(Action::Stall(Duration::from_secs(3))).await;
    let fast = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(
        api(&[&slow, &fast])
            .read_ms(200)
            .retries(retries().attempts(1)),
    )
    .await;
    for _ in 0..4 {
        let r = sidecar.send("GET", "api", "/", b"").await;
        assert_eq!(r.status, 200);
        assert!(
            r.elapsed < Duration::from_millis(2500),
            "the stall was cut by read_ms: {:?}",
            r.elapsed
        );
    }
    assert_eq!(fast.count(), 4);
}

#[tokio::test]
async fn read_timeout_without_retries_answers_504() {
    let slow = Upstream::always(Action::Stall(Duration::from_secs(3))).await;
    let sidecar = Sidecar::start(api(&[&slow]).read_ms(100)).await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 504);
    assert_eq!(r.header("x-reprise-error"), Some(&b"read_timeout"[..]));
}

#[tokio::test]
async fn retry_transport_false_leaves_transport_errors_alone() {
    let a = Upstream::refusing().await;
    let b = Upstream::refusing().await;
    let sidecar =
        Sidecar::start(api(&[&a, &b]).retries(retries().attempts(2).retry_transport(false))).await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-reprise-error"), Some(&b"connect_refused"[..]));
    assert_eq!(sidecar.outcomes("api", "skipped"), 1);
}

#[tokio::test]
async fn a_body_failing_mid_stream_is_never_retried_and_feeds_passive_health() {
    let (a, b) = pair(Action::AbortMidBody).await;
    let sidecar = Sidecar::start(retry2(&[&a, &b])).await;
    let r = sidecar.send("GET", "api", "/", b"").await;
    assert_eq!(r.status, 200, "headers were already on their way");
    assert!(
        r.body.is_err(),
        "the client sees the body fail, not a spliced retry"
    );
    assert_eq!(a.count() + b.count(), 1, "never retried");
    // Give the response body wrapper a moment to record the error.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sidecar.stats("api").response_body_errors, 1);
}

#[tokio::test]
async fn passive_health_ejects_after_consecutive_transport_failures() {
    // Alone in its upstream, the endpoint takes every request: the second
    // reset in a row ejects it, the first does not.
    let bad = Upstream::always(Action::Reset).await;
    let sidecar = Sidecar::start(ejecting(&[&bad], 2, 0)).await;
    let endpoint = || sidecar.stats("api").endpoints[0].clone();
    assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 502);
    assert!(!endpoint().ejected);
    assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 502);
    assert!(endpoint().ejected);
    assert_eq!(endpoint().ejections, 1);

    // With a healthy peer, an ejected endpoint is never picked.
    let bad = Upstream::always(Action::Reset).await;
    let good = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(ejecting(&[&bad, &good], 1, 1)).await;
    for _ in 0..40 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    }
    assert!(bad.count() <= 1, "picked again after its ejection");
    if bad.count() == 1 {
        assert!(sidecar.stats("api").endpoints[0].ejected);
    }
}

#[tokio::test]
async fn retryable_statuses_weigh_endpoint_choice_but_never_eject() {
    // An origin status does not mark the endpoint unhealthy (`docs/src/concepts/retries.md`): it only shifts load (the failure estimate), never ejects.
    let bad = Upstream::always(Action::Reply(503)).await;
    let sidecar = Sidecar::start(ejecting(&[&bad], 2, 1)).await;
    for _ in 0..5 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 503);
    }
    let endpoint = &sidecar.stats("api").endpoints[0];
    assert!(!endpoint.ejected);
    assert_eq!(endpoint.ejections, 0);
    assert!(endpoint.failure_estimate > 0.5, "the 503s weigh its choice");
}
