//! Cancellation across hops, on loopback with the real binaries: a client
//! calls `front` through its sidecar; `front` calls `orders` and `orders`
//! calls `stock` (the e2e app in chain mode, each through its own
//! sidecar, forwarding `traceparent` and `baggage` with OpenTelemetry's
//! propagators); `stock` takes 30 s. The client gives up once `stock` has
//! the request: every hop must see its request cancelled and cancel its own
//! call, and no hop finishes or starts another attempt. Once for each way a
//! sidecar reaches the next app: HTTP/1.1, h2c, gRPC (over h2c) and TLS.
//!
//! Needs `reprise-sidecar` and `reprise-e2e-app` built next to this test
//! (`cargo test --workspace` builds them; alone: `cargo build -p
//! reprise-sidecar -p reprise-e2e`).

use std::time::{Duration, Instant};

use reprise_e2e::chain::{Chain, HopCounts, Leg, Retries, Spec};
use reprise_testkit::config::ProxyConfig;
use tokio::io::AsyncWriteExt;

const HOPS: [&str; 3] = ["front", "orders", "stock"];

fn spec(leg: Leg) -> Spec {
    Spec {
        hops: HOPS.to_vec(),
        replicas: 1,
        leg,
        // Retries on, so a cancelled attempt could be followed by another:
        // none may be.
        retries: Retries::new()
            .attempts(2)
            .retry_post(true)
            .buffer_max_bytes(65_536)
            .reuse_endpoints(true)
            .budget_min_retries_per_second(1000),
        rules: Vec::new(),
        fail_percent: 0,
        delay_ms: 30_000,
        proxy: ProxyConfig::new().access_log(false),
        sidecar_env: Vec::new(),
        apps_cancel: true,
    }
}

/// Waits (at most `within`) until every hop's counts satisfy `done`.
async fn until(
    chain: &Chain,
    what: &str,
    within: Duration,
    done: impl Fn(&[HopCounts]) -> bool,
) -> Vec<HopCounts> {
    let deadline = Instant::now() + within;
    loop {
        let counts = chain.all_counts().await.expect("every app's /stats");
        if done(&counts) {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After the client gave up: each hop's request cancelled, each chain
/// hop's call cancelled, nothing finished, and a second later still no
/// other attempt anywhere.
async fn every_hop_stops(chain: &Chain) {
    let counts = until(chain, "every hop cancelled", Duration::from_secs(10), |c| {
        c.iter().all(|h| h.cancelled == 1)
    })
    .await;
    for (i, (hop, c)) in HOPS.iter().zip(&counts).enumerate() {
        assert_eq!(
            c.started, 1,
            "{hop}: one request, no other attempt: {counts:?}"
        );
        assert_eq!(c.finished, 0, "{hop}: {counts:?}");
        if i + 1 < HOPS.len() {
            assert_eq!(
                (c.calls, c.calls_cancelled),
                (1, 1),
                "{hop}'s call: {counts:?}"
            );
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = chain.all_counts().await.expect("counts");
    assert_eq!(later, counts, "nothing started after the cancellation");
}

/// An HTTP/1.1 client that gives up (closes) once `stock` has the request.
async fn give_up_over_http1(chain: &Chain) {
    let mut client = tokio::net::TcpStream::connect(chain.entry())
        .await
        .expect("the client's sidecar");
    client
        .write_all(b"GET /work HTTP/1.1\r\nHost: front\r\nbaggage: userId=alice\r\n\r\n")
        .await
        .expect("send");
    until(
        chain,
        "stock has the request",
        Duration::from_secs(10),
        |c| c[2].started == 1,
    )
    .await;
    drop(client);
}

#[tokio::test]
async fn a_caller_giving_up_stops_every_later_hop_over_http1() {
    let chain = Chain::start(&spec(Leg::Http1)).await.expect("the chain");
    give_up_over_http1(&chain).await;
    every_hop_stops(&chain).await;
}

#[tokio::test]
async fn a_caller_giving_up_stops_every_later_hop_over_h2c() {
    let chain = Chain::start(&spec(Leg::H2c)).await.expect("the chain");
    give_up_over_http1(&chain).await;
    every_hop_stops(&chain).await;
}

#[tokio::test]
async fn a_caller_giving_up_stops_every_later_hop_over_tls() {
    let chain = Chain::start(&spec(Leg::Tls)).await.expect("the chain");
    give_up_over_http1(&chain).await;
    every_hop_stops(&chain).await;
}

#[tokio::test]
async fn a_grpc_caller_giving_up_stops_every_later_hop() {
    let chain = Chain::start(&spec(Leg::H2c)).await.expect("the chain");
    let channel = reprise_testkit::grpc::channel(chain.entry(), "front:50051").await;
    let call = tokio::spawn(async move {
        reprise_testkit::grpc::say(&channel, "hi", &[("baggage", "userId=alice")]).await
    });
    until(&chain, "stock has the call", Duration::from_secs(10), |c| {
        c[2].started == 1
    })
    .await;
    // The client gives up: its call (and the HTTP/2 stream) is dropped.
    call.abort();
    every_hop_stops(&chain).await;
}
