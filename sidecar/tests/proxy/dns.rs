//! Endpoints named by DNS, resolved by the sidecar through a DNS server the
//! test runs on loopback (the machine's resolver is never asked): every
//! address a name resolves to is an endpoint, a change of addresses keeps
//! the endpoints that stay, a failed refresh keeps the last addresses, and
//! a name that never resolved is answered at once.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use reprise_sidecar::server::metrics_text;
use reprise_testkit::config::{Config, ProxyConfig};
use reprise_testkit::dns::{Answer, TestDns};

use crate::support::{retries, Action, Sidecar, Upstream, UpstreamConfig};

const V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

/// Two upstream servers on one port, at 127.0.0.1 and ::1 (a name gives
/// every address the same port): the first does `first`, the second `second`.
async fn twins(first: Action, second: Action) -> (Upstream, Upstream) {
    let a = Upstream::always(first).await;
    let b = Upstream::builder()
        .bind(SocketAddr::new(V6, a.addr.port()))
        .start(move |_| second.clone())
        .await
        .expect("bind [::1] on the first server's port");
    (a, b)
}

/// A sidecar whose upstream `api` is `host` on `port`, resolved by `dns`.
async fn sidecar(dns: &TestDns, api: UpstreamConfig) -> Sidecar {
    Sidecar::start(
        Config::new().upstream(api).proxy(
            ProxyConfig::new()
                .dns_resolver(dns.addr)
                .dns_allow_local(true),
        ),
    )
    .await
}

/// Waits (at most `within`) until upstream `api` has `n` endpoints.
async fn endpoints(sidecar: &Sidecar, n: usize, within: Duration) -> Vec<SocketAddr> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let now: Vec<SocketAddr> = sidecar
            .stats("api")
            .endpoints
            .iter()
            .map(|e| e.addr)
            .collect();
        if now.len() == n {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "upstream api has endpoints {now:?}, not {n}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A sample of the sidecar's metrics, by family and labels as written.
fn metric(sidecar: &Sidecar, line_start: &str) -> Option<f64> {
    metrics_text(&sidecar.proxy)
        .lines()
        .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
}

#[tokio::test]
async fn every_address_of_a_name_is_an_endpoint_and_a_retry_goes_to_the_other() {
    let dns = TestDns::start().await;
    dns.set("pay.test", &[V4, V6], 60);
    let (failing, healthy) = twins(Action::Reply(503), Action::Reply(200)).await;
    let api = UpstreamConfig::new("api")
        .host_endpoint("pay.test", failing.addr.port())
        .retries(
            retries()
                .attempts(1)
                .backoff_base_ms(1)
                .retry_statuses([503]),
        )
        .consecutive_failures(0);
    let sidecar = sidecar(&dns, api).await;
    let addrs = endpoints(&sidecar, 2, Duration::from_secs(5)).await;
    assert!(addrs.contains(&failing.addr) && addrs.contains(&healthy.addr));
    for _ in 0..10 {
        let r = sidecar.send("GET", "api", "/", b"").await;
        assert_eq!(
            r.status, 200,
            "a 503 from one address is retried on the other"
        );
    }
    assert!(failing.count() > 0, "both addresses were picked");
    assert_eq!(healthy.count(), 10);
    assert_eq!(
        metric(&sidecar, "reprise_dns_addresses{host=\"pay.test\"}"),
        Some(2.0)
    );
}

#[tokio::test]
async fn a_name_that_never_resolved_is_answered_at_once_with_dns_unresolved() {
    let dns = TestDns::start().await;
    dns.answer("gone.test", Answer::NxDomain);
    dns.answer("slow.test", Answer::Silent);
    let sidecar = Sidecar::start(
        Config::new()
            .upstream(UpstreamConfig::new("api").host_endpoint("gone.test", 443))
            .upstream(UpstreamConfig::new("slow").host_endpoint("slow.test", 443))
            .proxy(
                ProxyConfig::new()
                    .dns_resolver(dns.addr)
                    .dns_allow_local(true),
            ),
    )
    .await;
    // Let the lookups go out; NXDOMAIN comes back, the silent one hangs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(dns.queries("gone.test") > 0 && dns.queries("slow.test") > 0);
    for host in ["api", "slow"] {
        let r = tokio::time::timeout(Duration::from_secs(2), sidecar.send("GET", host, "/", b""))
            .await
            .unwrap_or_else(|_| panic!("{host}: no answer while its name is unresolved"));
        assert_eq!(r.status, 503, "{host}");
        assert_eq!(
            r.headers
                .get("x-reprise-error")
                .and_then(|v| v.to_str().ok()),
            Some("dns_unresolved"),
            "{host}"
        );
    }
}

#[tokio::test]
async fn new_addresses_are_added_and_the_endpoints_that_stay_keep_their_state() {
    let dns = TestDns::start().await;
    // A TTL under the floor: the sidecar asks again after 5 s, not 1.
    dns.set("pay.test", &[V4, V6], 1);
    let (failing, healthy) = twins(Action::Reset, Action::Reply(200)).await;
    let third_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let third = Upstream::builder()
        .bind(SocketAddr::new(third_ip, failing.addr.port()))
        .start(|_| Action::Reply(200))
        .await
        .expect("bind 127.0.0.2 on the first server's port");
    let api = UpstreamConfig::new("api")
        .host_endpoint("pay.test", failing.addr.port())
        .retries(
            retries()
                .attempts(1)
                .backoff_base_ms(1)
                .retry_statuses([503]),
        )
        .consecutive_failures(1)
        .ejection_ms(600_000);
    let sidecar = sidecar(&dns, api).await;
    endpoints(&sidecar, 2, Duration::from_secs(5)).await;
    let ejected = |s: &Sidecar| {
        s.stats("api")
            .endpoints
            .iter()
            .find(|e| e.addr == failing.addr)
            .map(|e| (e.ejected, e.ejections))
    };
    for _ in 0..20 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
        if failing.count() > 0 {
            break;
        }
    }
    assert_eq!(ejected(&sidecar), Some((true, 1)), "one reset ejects it");
    let asked = dns.queries("pay.test");
    dns.set("pay.test", &[V4, V6, third_ip], 60);
    endpoints(&sidecar, 3, Duration::from_secs(15)).await;
    assert!(dns.queries("pay.test") > asked);
    assert_eq!(
        ejected(&sidecar),
        Some((true, 1)),
        "the endpoint that stayed is still ejected, its count kept"
    );
    let before = healthy.count();
    for _ in 0..20 {
        assert_eq!(sidecar.send("GET", "api", "/", b"").await.status, 200);
    }
    assert!(third.count() > 0, "the new address serves");
    assert_eq!(failing.count(), 1, "the ejected endpoint got nothing more");
    assert_eq!(healthy.count() - before + third.count(), 20);
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_last_addresses_and_is_counted() {
    let dns = TestDns::start().await;
    dns.set("pay.test", &[V4], 1);
    let up = Upstream::always(Action::Reply(200)).await;
    let api = UpstreamConfig::new("api").host_endpoint("pay.test", up.addr.port());
    let sidecar = sidecar(&dns, api).await;
    endpoints(&sidecar, 1, Duration::from_secs(5)).await;
    dns.answer("pay.test", Answer::ServFail);
    let failed = "reprise_dns_lookups_total{host=\"pay.test\",result=\"failed\"}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while metric(&sidecar, failed).unwrap_or(0.0) < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failed refresh counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        sidecar.send("GET", "api", "/", b"").await.status,
        200,
        "the last address still serves"
    );
    assert_eq!(endpoints(&sidecar, 1, Duration::ZERO).await, vec![up.addr]);
    assert!(
        metric(
            &sidecar,
            "reprise_dns_lookups_total{host=\"pay.test\",result=\"resolved\"}"
        )
        .unwrap_or(0.0)
            >= 1.0
    );
}

/// Upstream `name`'s requests when its only endpoint is `host`, on `port`:
/// the status and the sidecar's error kind.
async fn answered(sidecar: &Sidecar, name: &str) -> (u16, Option<String>) {
    let r = tokio::time::timeout(Duration::from_secs(2), sidecar.send("GET", name, "/", b""))
        .await
        .unwrap_or_else(|_| panic!("{name}: no answer"));
    let error = r
        .headers
        .get("x-reprise-error")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (r.status, error)
}

#[tokio::test]
async fn names_that_resolve_to_loopback_link_local_or_the_metadata_service_lead_nowhere() {
    let dns = TestDns::start().await;
    let up = Upstream::always(Action::Reply(200)).await;
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
    // Both reach the upstream's IPv4 listener when allowed.
    dns.set("loop.test", &[V4, mapped], 60);
    dns.set("loop6.test", &[V6], 60);
    dns.set(
        "metadata.test",
        &["169.254.169.254".parse().expect("ip")],
        60,
    );
    dns.set("link.test", &["fe80::1".parse().expect("ip")], 60);
    let port = up.addr.port();
    let config = |allow: bool| {
        Config::new()
            .upstream(UpstreamConfig::new("loop").host_endpoint("loop.test", port))
            .upstream(UpstreamConfig::new("loop6").host_endpoint("loop6.test", port))
            .upstream(UpstreamConfig::new("meta").host_endpoint("metadata.test", 80))
            .upstream(UpstreamConfig::new("link").host_endpoint("link.test", 80))
            .proxy(
                ProxyConfig::new()
                    .dns_resolver(dns.addr)
                    .dns_allow_local(allow),
            )
    };
    // The default: none of them is an endpoint.
    let sidecar = Sidecar::start(config(false)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for name in ["loop", "loop6", "meta", "link"] {
        assert!(
            sidecar.stats(name).endpoints.is_empty(),
            "{name}: {:?}",
            sidecar.stats(name).endpoints
        );
        assert_eq!(answered(&sidecar, name).await.0, 503, "{name}");
    }
    assert_eq!(up.count(), 0, "nothing reached the loopback upstream");
    // Standalone, allowed: the loopback name is the upstream again.
    let allowed = Sidecar::start(config(true)).await;
    endpoints_of(&allowed, "loop", 2).await;
    assert_eq!(answered(&allowed, "loop").await.0, 200);
}

#[tokio::test]
async fn a_name_that_resolves_to_the_sidecars_own_listener_is_never_an_endpoint() {
    let dns = TestDns::start().await;
    let up = Upstream::always(Action::Reply(200)).await;
    dns.set("self.test", &[V4], 60);
    let config = |port: u16| {
        Config::new()
            .upstream(UpstreamConfig::new("api").host_endpoint("self.test", port))
            .proxy(
                ProxyConfig::new()
                    .dns_resolver(dns.addr)
                    .dns_allow_local(true),
            )
            .resolve()
    };
    let sidecar = Sidecar::serve(reprise_sidecar::Proxy::new(config(up.addr.port()))).await;
    endpoints_of(&sidecar, "api", 1).await;
    // The same name on the sidecar's own port (its proxy listener): a loop,
    // left out even where local addresses are allowed.
    sidecar.proxy.reload(config(sidecar.addr.port()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        sidecar.stats("api").endpoints.is_empty(),
        "the sidecar's own listener: {:?}",
        sidecar.stats("api").endpoints
    );
    assert_eq!(answered(&sidecar, "api").await.0, 503);
}

/// Waits until upstream `name` has `n` endpoints.
async fn endpoints_of(sidecar: &Sidecar, name: &str, n: usize) {
    for _ in 0..250 {
        if sidecar.stats(name).endpoints.len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{name} has {:?}, not {n} endpoints",
        sidecar.stats(name).endpoints
    );
}
