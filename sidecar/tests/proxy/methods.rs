//! Methods: safe ones by default, POST only with retry_post, others only with
//! the duplicate-risk acknowledgement, CONNECT/TRACE/upgrades never.

use crate::support::{api, pair, retries, Action, Config, Rule, Sidecar, Upstream};

async fn two_failing() -> (Upstream, Upstream) {
    pair(Action::Reply(503)).await
}

#[tokio::test]
async fn post_is_not_retried_without_retry_post() {
    let (a, b) = two_failing().await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(retries().attempts(2))).await;
    assert_eq!(sidecar.send("POST", "api", "/", b"").await.status, 503);
    assert_eq!(a.count() + b.count(), 1, "POST reached the upstream once");
    assert_eq!(sidecar.outcomes("api", "skipped"), 1);
}

#[tokio::test]
async fn post_is_retried_with_retry_post() {
    let (a, b) = two_failing().await;
    let sidecar =
        Sidecar::start(api(&[&a, &b]).retries(retries().attempts(2).retry_post(true))).await;
    assert_eq!(sidecar.send("POST", "api", "/", b"").await.status, 503);
    assert_eq!(a.count() + b.count(), 2);
}

#[tokio::test]
async fn put_and_delete_need_the_acknowledgement_and_then_are_retried() {
    let (a, b) = two_failing().await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(retries().attempts(1))).await;
    assert_eq!(sidecar.send("PUT", "api", "/", b"").await.status, 503);
    assert_eq!(
        a.count() + b.count(),
        1,
        "PUT is not retried by default (the safer of the two documents)"
    );

    let (a, b) = two_failing().await;
    let sidecar = Sidecar::start(
        api(&[&a, &b]).retries(
            retries()
                .attempts(1)
                .methods(["GET", "PUT", "DELETE"])
                .acknowledge_duplicate_risk(true),
        ),
    )
    .await;
    assert_eq!(sidecar.send("PUT", "api", "/", b"").await.status, 503);
    assert_eq!(sidecar.send("DELETE", "api", "/", b"").await.status, 503);
    assert_eq!(a.count() + b.count(), 4);
}

#[tokio::test]
async fn trace_is_never_retried_even_under_the_wildcard() {
    let (a, b) = two_failing().await;
    let config = Config::from(api(&[&a, &b])).rule(
        Rule::new("all")
            .methods(["*"])
            .statuses([503])
            .acknowledge_duplicate_risk(true),
    );
    let sidecar = Sidecar::start(config).await;
    assert_eq!(sidecar.send("PATCH", "api", "/", b"").await.status, 503);
    assert_eq!(a.count() + b.count(), 2, "the wildcard retries PATCH");
    assert_eq!(sidecar.send("TRACE", "api", "/", b"").await.status, 503);
    assert_eq!(a.count() + b.count(), 3, "TRACE went once");
}

#[tokio::test]
async fn upgrade_requests_are_never_retried() {
    let (a, b) = two_failing().await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(retries().attempts(2))).await;
    let r = sidecar
        .get_with(
            "/ws",
            &[("connection", "Upgrade"), ("upgrade", "websocket")],
        )
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(a.count() + b.count(), 1);
    let upgrade_seen = a
        .received()
        .iter()
        .chain(b.received().iter())
        .any(|r| r.header_values("upgrade").contains(&"websocket"));
    assert!(upgrade_seen, "the upgrade request itself was forwarded");
}

#[tokio::test]
async fn status_retries_in_a_rule_go_to_a_different_endpoint_each_time() {
    let (a, b) = two_failing().await;
    let c = Upstream::always(Action::Reply(200)).await;
    let config = Config::from(api(&[&a, &b, &c])).rule(
        Rule::new("reads")
            .attempts(2)
            .statuses(["gateway"])
            .acknowledge_duplicate_risk(true),
    );
    let sidecar = Sidecar::start(config).await;
    for n in 1..=10 {
        let (a0, b0) = (a.count(), b.count());
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
        let (da, db) = (a.count() - a0, b.count() - b0);
        assert!(
            da <= 1 && db <= 1,
            "request {n}: a failing endpoint was tried twice ({da}, {db})"
        );
        let last = c.received().last().and_then(|r| r.attempt);
        assert_eq!(
            last,
            Some(u32::try_from(1 + da + db).expect("small")),
            "request {n}: the good endpoint got the attempt after each distinct failure"
        );
    }
    assert_eq!(c.count(), 10);
}
