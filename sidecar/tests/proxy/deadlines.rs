//! Deadlines across hops, against real upstreams on loopback: a deadline
//! in the `baggage` an application forwarded caps the retries (an attempt
//! cut at it, no retry or backoff past it, a `504 deadline_exceeded` at once
//! when it has passed, with nothing sent and nothing charged), a malformed,
//! stale or far-future one is ignored and counted, and each attempt carries
//! the request's deadline on in `baggage` (the application's entries kept)
//! and, for gRPC, `grpc-timeout`; never towards a DNS-named upstream, and
//! each way off where a switch says so.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reprise_testkit::config::{Config, ProxyConfig, Rule};
use reprise_testkit::dns::TestDns;
use reprise_testkit::grpc::{self, GrpcServer};

use crate::support::{full_budget, retries, Action, Sidecar, Upstream, UpstreamConfig};

/// The wall clock now, in Unix milliseconds.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a set clock")
        .as_millis() as u64
}

/// A baggage value with the application's entries around a deadline
/// `in_ms` from now (negative: past).
fn baggage_with(in_ms: i64) -> String {
    let d = now_ms().saturating_add_signed(in_ms);
    format!("userId=alice,reprise-deadline={d};hop=front,isProduction=false")
}

/// The deadline a received request's baggage carries.
fn deadline_of(baggage: &str) -> Option<u64> {
    baggage
        .split(',')
        .find_map(|m| m.trim().strip_prefix("reprise-deadline="))
        .map(|v| v.split(';').next().unwrap_or(v).parse().expect("digits"))
}

#[tokio::test]
async fn an_attempt_is_cut_at_the_propagated_deadline_and_no_retry_starts_past_it() {
    let (a, b) = (
        Upstream::always(Action::Stall(Duration::from_secs(5))).await,
        Upstream::always(Action::Stall(Duration::from_secs(5))).await,
    );
    let sidecar = Sidecar::start(
        UpstreamConfig::new("api")
            .endpoints([a.addr, b.addr])
            .retries(full_budget().attempts(2).retry_transport(true)),
    )
    .await;
    let baggage = baggage_with(400);
    let r = sidecar.get_with("/", &[("baggage", &baggage)]).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.header("x-reprise-error"), Some(&b"deadline_exceeded"[..]));
    assert!(
        r.elapsed < Duration::from_secs(3),
        "cut at the caller's deadline, not the upstream's 5 s: {:?}",
        r.elapsed
    );
    assert_eq!(a.count() + b.count(), 1, "no retry past the deadline");
    let stats = sidecar.stats("api");
    assert_eq!(
        stats.deadline_stops.get("attempt_cut"),
        Some(&1),
        "{stats:?}"
    );
    assert_eq!(stats.deadlines_received.get("accepted"), Some(&1));
    assert_eq!(stats.budget_retries, 0, "nothing charged");
    assert!(stats
        .endpoints
        .iter()
        .all(|e| !e.ejected && e.failure_estimate == 0.0));
}

#[tokio::test]
async fn a_retry_whose_backoff_would_end_past_the_deadline_is_not_made() {
    let (a, b) = (
        Upstream::always(Action::Reply(503)).await,
        Upstream::always(Action::Reply(503)).await,
    );
    let sidecar = Sidecar::start(
        UpstreamConfig::new("api")
            .endpoints([a.addr, b.addr])
            .retries(
                full_budget()
                    .attempts(2)
                    .retry_statuses([503])
                    .backoff_base_ms(5_000)
                    .backoff_cap_ms(5_000),
            ),
    )
    .await;
    // Without a deadline the jittered backoff may be short: with one of
    // 300 ms, only a draw under it could go. Several requests: none may
    // send its retry after its deadline.
    let mut seen = 0;
    for _ in 0..5 {
        let deadline = std::time::Instant::now() + Duration::from_millis(300);
        let baggage = baggage_with(300);
        let r = sidecar.get_with("/", &[("baggage", &baggage)]).await;
        assert!(matches!(r.status, 503 | 504), "{}", r.status);
        let mut got: Vec<_> = [&a, &b].iter().flat_map(|u| u.received()).collect();
        got.sort_by_key(|rec| rec.at);
        // Received, not sent: a few milliseconds of loopback allowed.
        for rec in &got[seen..] {
            assert!(
                rec.at <= deadline + Duration::from_millis(50),
                "attempt {:?} started {:?} past its request's deadline",
                rec.attempt,
                rec.at - deadline
            );
        }
        seen = got.len();
    }
    let stats = sidecar.stats("api");
    let refused = stats.deadline_stops.get("retry").copied().unwrap_or(0);
    assert!(refused >= 1, "{stats:?}");
}

#[tokio::test]
async fn a_deadline_already_past_is_answered_504_at_once_and_nothing_is_sent_or_counted() {
    let a = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(
        UpstreamConfig::new("api")
            .endpoint(a.addr)
            .retries(retries().attempts(2)),
    )
    .await;
    let baggage = baggage_with(-1_000);
    let r = sidecar.get_with("/", &[("baggage", &baggage)]).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.header("x-reprise-error"), Some(&b"deadline_exceeded"[..]));
    assert!(
        r.text().contains("deadline passed before an attempt"),
        "{}",
        r.text()
    );
    assert_eq!(a.count(), 0, "nothing sent");
    let stats = sidecar.stats("api");
    assert_eq!(stats.deadline_stops.get("before_first_attempt"), Some(&1));
    assert_eq!(stats.budget_requests, 0, "not counted by the budget");
    assert_eq!(stats.outcome("exhausted"), 1);
    // Also for a request no rule's retries cover (the upstream's block off).
    let plain = Sidecar::start(UpstreamConfig::new("api").endpoint(a.addr)).await;
    let r = plain.get_with("/", &[("baggage", &baggage)]).await;
    assert_eq!(r.status, 504);
    assert_eq!(a.count(), 0);
}

#[tokio::test]
async fn malformed_stale_and_far_future_deadlines_are_ignored_and_counted() {
    let a = Upstream::always(Action::Stall(Duration::from_millis(300))).await;
    let sidecar = Sidecar::start(
        UpstreamConfig::new("api")
            .endpoint(a.addr)
            .retries(retries().attempts(1)),
    )
    .await;
    let far = now_ms() + 2 * 3_600_000;
    for (value, result) in [
        ("reprise-deadline=soon".to_string(), "malformed"),
        ("reprise-deadline=-5".to_string(), "malformed"),
        ("reprise-deadline=1000".to_string(), "stale"),
        (format!("reprise-deadline={far}"), "far_future"),
        (
            format!("a=1,reprise-deadline={}", now_ms() - 120_000),
            "stale",
        ),
    ] {
        let r = sidecar.get_with("/", &[("baggage", &value)]).await;
        assert_eq!(r.status, 200, "{value}: never a failure of its own");
        let stats = sidecar.stats("api");
        assert!(
            stats
                .deadlines_received
                .get(result)
                .is_some_and(|n| *n >= 1),
            "{value}: {stats:?}"
        );
    }
    assert_eq!(a.count(), 5);
    let stats = sidecar.stats("api");
    assert_eq!(stats.deadlines_received.get("accepted"), None);
    assert!(stats.deadline_stops.is_empty(), "{stats:?}");
}

#[tokio::test]
async fn each_attempt_carries_the_request_deadline_with_the_applications_entries_kept() {
    let (a, b) = (
        Upstream::always(Action::Reply(503)).await,
        Upstream::always(Action::Reply(503)).await,
    );
    let sidecar = Sidecar::start(
        Config::new()
            // The upstream's block sets the budget the rule's retries use.
            .upstream(
                UpstreamConfig::new("api")
                    .endpoints([a.addr, b.addr])
                    .retries(full_budget()),
            )
            .rule(
                Rule::new("r")
                    .attempts(1)
                    .statuses([503])
                    .acknowledge_duplicate_risk(true)
                    .total_deadline_ms(4_000)
                    .attempt_timeout_ms(1_500)
                    .backoff_base_ms(1)
                    .backoff_cap_ms(1),
            ),
    )
    .await;
    // The application's own baggage, in two fields: both go out as one,
    // in order, with the entry added after them.
    let sent = now_ms();
    let r = sidecar
        .get_with(
            "/",
            &[("baggage", "userId=alice;p=1"), ("baggage", "tenant=t-7")],
        )
        .await;
    let done = now_ms();
    assert_eq!(r.status, 503);
    let got: Vec<_> = [&a, &b].iter().flat_map(|u| u.received()).collect();
    assert_eq!(got.len(), 2, "an attempt and its retry");
    for rec in &got {
        let values = rec.header_values("baggage");
        assert_eq!(values.len(), 1, "one field: {values:?}");
        let value = values[0];
        assert!(
            value.starts_with("userId=alice;p=1,tenant=t-7,reprise-deadline="),
            "{value}"
        );
        // The earlier of the request's 4 s and the attempt's 1.5 s.
        let d = deadline_of(value).expect("an entry");
        assert!(
            d >= sent + 1_400 && d <= done + 1_500,
            "{d} vs sent {sent}, done {done}"
        );
    }
    assert!(sidecar.stats("api").deadlines_not_propagated.is_empty());
}

#[tokio::test]
async fn a_forwarded_deadline_passes_as_it_came_and_an_earlier_own_one_replaces_it() {
    let a = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(
        Config::new()
            .upstream(UpstreamConfig::new("api").endpoint(a.addr))
            .rule(
                Rule::new("short")
                    .cel("request.path == '/short'")
                    .total_deadline_ms(500),
            ),
    )
    .await;
    let incoming = baggage_with(3_000);
    let r = sidecar.get_with("/long", &[("baggage", &incoming)]).await;
    assert_eq!(r.status, 200);
    let r = sidecar.get_with("/short", &[("baggage", &incoming)]).await;
    assert_eq!(r.status, 200);
    let got = a.received();
    assert_eq!(
        got[0].header("baggage"),
        Some(incoming.as_str()),
        "the caller's, byte for byte: nothing earlier to say"
    );
    let own = got[1].header("baggage").expect("baggage");
    let d = deadline_of(own).expect("an entry");
    let incoming_d = deadline_of(&incoming).expect("an entry");
    assert!(d + 2_000 < incoming_d, "the policy's 500 ms: {own}");
    assert_eq!(
        own,
        format!("userId=alice,reprise-deadline={d},isProduction=false"),
        "replaced where it stood, its properties gone with the old value"
    );
}

#[tokio::test]
async fn without_a_deadline_anywhere_nothing_is_added() {
    let a = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(
        UpstreamConfig::new("api")
            .endpoint(a.addr)
            .retries(retries().attempts(2)),
    )
    .await;
    sidecar.get_with("/", &[("baggage", "userId=alice")]).await;
    sidecar.get_with("/", &[]).await;
    let got = a.received();
    assert_eq!(got[0].header("baggage"), Some("userId=alice"));
    assert_eq!(
        got[1].header("baggage"),
        None,
        "the read timeout does not travel"
    );
}

#[tokio::test]
async fn baggage_past_the_limits_or_malformed_goes_out_as_the_application_sent_it() {
    let a = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(
        Config::new()
            .upstream(UpstreamConfig::new("api").endpoint(a.addr))
            .rule(Rule::new("r").total_deadline_ms(2_000)),
    )
    .await;
    let full = (0..64)
        .map(|i| format!("k{i}=v"))
        .collect::<Vec<_>>()
        .join(",");
    let bad = "userId=alice,broken entry".to_string();
    for (baggage, reason) in [(&full, "baggage_full"), (&bad, "baggage_malformed")] {
        let r = sidecar.get_with("/", &[("baggage", baggage)]).await;
        assert_eq!(r.status, 200);
        let got = a.received();
        assert_eq!(
            got.last().and_then(|g| g.header("baggage")),
            Some(baggage.as_str()),
            "{reason}: unchanged"
        );
        assert_eq!(
            sidecar.stats("api").deadlines_not_propagated.get(reason),
            Some(&1)
        );
    }
}

#[tokio::test]
async fn h2c_attempts_carry_it_too() {
    let a = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(
        Config::new()
            .upstream(UpstreamConfig::new("api").endpoint(a.addr).h2c())
            .rule(Rule::new("r").total_deadline_ms(2_000)),
    )
    .await;
    let sent = now_ms();
    let r = sidecar.get_with("/", &[("baggage", "userId=alice")]).await;
    assert_eq!(r.status, 200);
    let got = a.received();
    assert_eq!(got[0].version, http::Version::HTTP_2);
    let value = got[0].header("baggage").expect("baggage");
    assert!(
        value.starts_with("userId=alice,reprise-deadline="),
        "{value}"
    );
    let d = deadline_of(value).expect("an entry");
    assert!(d >= sent + 1_900 && d <= now_ms() + 2_000, "{d}");
}

#[tokio::test]
async fn grpc_attempts_carry_the_deadline_in_grpc_timeout_and_baggage() {
    let server = GrpcServer::healthy("a").await;
    let sidecar = Sidecar::start(
        Config::new()
            .upstream(UpstreamConfig::new("echo").endpoint(server.addr).h2c())
            .rule(
                Rule::new("r")
                    .methods(["POST"])
                    .acknowledge_duplicate_risk(true)
                    .replay_limit_bytes(65_536)
                    .total_deadline_ms(3_000),
            ),
    )
    .await;
    let channel = grpc::channel(sidecar.addr, "echo:50051").await;
    // Without a grpc-timeout from the client: the policy's deadline.
    grpc::say(&channel, "hi", &[]).await.expect("call");
    // With a forwarded deadline earlier than the policy's: that one.
    let baggage = baggage_with(1_000);
    grpc::say(&channel, "hi", &[("baggage", &baggage)])
        .await
        .expect("call");
    let calls = server.calls();
    let timeout = |i: usize| {
        let v = calls[i].get("grpc-timeout").expect("grpc-timeout");
        v.strip_suffix('m')
            .expect("milliseconds")
            .parse::<u64>()
            .expect("digits")
    };
    assert!((2_500..=3_000).contains(&timeout(0)), "{}", timeout(0));
    assert!(timeout(1) <= 1_000 && timeout(1) > 500, "{}", timeout(1));
    assert!(calls[0]
        .get("baggage")
        .is_some_and(|b| b.starts_with("reprise-deadline=")));
    assert_eq!(
        calls[1].get("baggage"),
        Some(baggage.as_str()),
        "already said"
    );
}

#[tokio::test]
async fn nothing_is_carried_towards_a_dns_named_upstream() {
    let dns = TestDns::start().await;
    dns.set("pay.test", &[IpAddr::V4(Ipv4Addr::LOCALHOST)], 60);
    let a = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(
        Config::new()
            .upstream(UpstreamConfig::new("api").host_endpoint("pay.test", a.addr.port()))
            .rule(Rule::new("r").total_deadline_ms(2_000))
            // The name points at loopback, which Kubernetes mode refuses.
            .proxy(
                ProxyConfig::new()
                    .dns_resolver(dns.addr)
                    .dns_allow_local(true),
            ),
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sidecar.stats("api").endpoints.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pay.test never resolved"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = sidecar.get_with("/", &[("baggage", "userId=alice")]).await;
    assert_eq!(r.status, 200);
    // A forwarded deadline still bounds the request itself.
    let baggage = baggage_with(5_000);
    let r = sidecar.get_with("/", &[("baggage", &baggage)]).await;
    assert_eq!(r.status, 200);
    let got = a.received();
    assert_eq!(
        got[0].header("baggage"),
        Some("userId=alice"),
        "no entry added"
    );
    assert_eq!(
        got[1].header("baggage"),
        Some(baggage.as_str()),
        "the app's, as sent"
    );
    assert_eq!(
        sidecar.stats("api").deadlines_received.get("accepted"),
        Some(&1)
    );
}

#[tokio::test]
async fn each_way_turns_off_for_the_sidecar_or_for_one_rule() {
    let a = Upstream::always(Action::Stall(Duration::from_millis(600))).await;
    let upstream = || UpstreamConfig::new("api").endpoint(a.addr);
    // The sidecar ignores incoming deadlines: the request runs its course.
    let ignoring = Sidecar::start(
        Config::new()
            .upstream(upstream())
            .proxy(ProxyConfig::new().deadlines(true, false)),
    )
    .await;
    let baggage = baggage_with(200);
    let r = ignoring.get_with("/", &[("baggage", &baggage)]).await;
    assert_eq!(r.status, 200, "not cut at the caller's 200 ms");
    assert!(ignoring.stats("api").deadlines_received.is_empty());
    // One rule sends nothing on; another on the same sidecar does.
    let quiet = Sidecar::start(
        Config::new()
            .upstream(upstream())
            .rule(
                Rule::new("quiet")
                    .priority(-1)
                    .cel("request.path == '/quiet'")
                    .total_deadline_ms(2_000)
                    .deadlines(false, true),
            )
            .rule(Rule::new("loud").total_deadline_ms(2_000)),
    )
    .await;
    quiet.get_with("/quiet", &[]).await;
    quiet.get_with("/loud", &[]).await;
    let got = a.received();
    let n = got.len();
    assert_eq!(got[n - 2].header("baggage"), None, "propagate: false");
    assert!(got[n - 1]
        .header("baggage")
        .is_some_and(|b| b.starts_with("reprise-deadline=")));
    // The sidecar's propagate: false wins over a rule's default.
    let off = Sidecar::start(
        Config::new()
            .upstream(upstream())
            .rule(Rule::new("loud").total_deadline_ms(2_000))
            .proxy(ProxyConfig::new().deadlines(false, true)),
    )
    .await;
    off.get_with("/", &[]).await;
    assert_eq!(a.received().last().and_then(|g| g.header("baggage")), None);
}

#[tokio::test]
async fn once_across_layers_an_upper_layers_retry_is_not_retried_and_own_retries_are_marked() {
    use reprise_testkit::config::RetryLayers;
    let (a, b) = (
        Upstream::always(Action::Reply(503)).await,
        Upstream::always(Action::Reply(503)).await,
    );
    let sidecar = Sidecar::start(
        UpstreamConfig::new("api")
            .endpoints([a.addr, b.addr])
            .retries(
                full_budget()
                    .attempts(1)
                    .retry_statuses([503])
                    .backoff_base_ms(1)
                    .backoff_cap_ms(1)
                    .retry_layers(RetryLayers::Once),
            ),
    )
    .await;
    // A request an upper layer already retried: one attempt here.
    let r = sidecar
        .get_with("/", &[("baggage", "userId=alice,reprise-retry=1")])
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(a.count() + b.count(), 1, "not retried again");
    assert_eq!(sidecar.outcomes("api", "skipped"), 1);
    let stats = sidecar.stats("api");
    assert_eq!(
        stats.outcomes.get(&("skipped", "upper_layer_retry")),
        Some(&1),
        "{stats:?}"
    );
    // A first attempt: retried, and only the retry carries the mark.
    let r = sidecar.get_with("/", &[("baggage", "userId=alice")]).await;
    assert_eq!(r.status, 503);
    let mut got: Vec<_> = [&a, &b].iter().flat_map(|u| u.received()).collect();
    got.sort_by_key(|rec| rec.at);
    assert_eq!(got.len(), 3);
    assert_eq!(got[1].header("baggage"), Some("userId=alice"));
    assert_eq!(
        got[2].header("baggage"),
        Some("userId=alice,reprise-retry=1")
    );
}

#[tokio::test]
async fn every_layer_retries_by_default_whatever_the_mark_says() {
    let (a, b) = (
        Upstream::always(Action::Reply(503)).await,
        Upstream::always(Action::Reply(503)).await,
    );
    let sidecar = Sidecar::start(
        UpstreamConfig::new("api")
            .endpoints([a.addr, b.addr])
            .retries(
                full_budget()
                    .attempts(1)
                    .retry_statuses([503])
                    .backoff_base_ms(1)
                    .backoff_cap_ms(1),
            ),
    )
    .await;
    sidecar
        .get_with("/", &[("baggage", "reprise-retry=1")])
        .await;
    assert_eq!(a.count() + b.count(), 2);
    assert!([&a, &b]
        .iter()
        .flat_map(|u| u.received())
        .all(|rec| rec.header("baggage") == Some("reprise-retry=1")));
}
