//! Request bodies: buffered replay within the cap, streaming over it, the
//! zero-consumed rule, and the global reservation.

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use tokio::io::AsyncWriteExt;

use crate::support::{api, pair, retries, Action, Config, ProxyConfig, Retries, Sidecar, Upstream};

/// One retry, POST included.
fn replayable() -> Retries {
    retries().attempts(1).retry_post(true)
}

#[tokio::test]
async fn a_body_within_the_cap_is_replayed_byte_for_byte() {
    let a = Upstream::always(Action::Reply(503)).await;
    let b = Upstream::always(Action::Echo).await;
    let body: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let sidecar =
        Sidecar::start(api(&[&a, &b]).retries(replayable().buffer_max_bytes(16384))).await;
    for _ in 0..6 {
        let r = sidecar.send("POST", "api", "/orders", &body).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body.as_ref().expect("body").as_ref(), body.as_slice());
    }
    for rec in a.received().iter().chain(b.received().iter()) {
        assert_eq!(rec.body, body, "every attempt carried the whole body");
    }
    assert_eq!(b.count(), 6);
    assert_eq!(
        sidecar.proxy.replay_buffer_bytes(),
        0,
        "buffers are given back"
    );
}

#[tokio::test]
async fn a_body_over_the_cap_streams_and_is_not_retried_once_consumed() {
    let (a, b) = pair(Action::Reply(503)).await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(replayable().buffer_max_bytes(100))).await;
    let body = vec![7u8; 5000];
    let r = sidecar.send("POST", "api", "/", &body).await;
    assert_eq!(
        r.status, 503,
        "the request was not rejected; its failure passed through"
    );
    assert_eq!(
        a.count() + b.count(),
        1,
        "the consumed body could not be replayed"
    );
    assert_eq!(
        a.received()
            .iter()
            .chain(b.received().iter())
            .next()
            .expect("one")
            .body
            .len(),
        5000
    );
    assert_eq!(sidecar.outcomes("api", "skipped"), 1);
}

#[tokio::test]
async fn an_unconsumed_streaming_body_is_retried_after_connect_refused() {
    let down = Upstream::refusing().await;
    let down2 = Upstream::refusing().await;
    let good = Upstream::always(Action::Echo).await;
    let sidecar = Sidecar::start(
        api(&[&down, &down2, &good]).retries(retries().attempts(2).retry_post(true)),
    )
    .await;
    let body = vec![9u8; 200_000];
    for _ in 0..5 {
        let r = sidecar.send("POST", "api", "/", &body).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.body.as_ref().expect("body").len(),
            200_000,
            "no byte was lost to the failed attempts"
        );
    }
}

#[tokio::test]
async fn buffer_zero_replays_only_empty_bodies() {
    let (a, b) = pair(Action::Reply(503)).await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(replayable())).await;
    assert_eq!(sidecar.send("POST", "api", "/", b"").await.status, 503);
    assert_eq!(a.count() + b.count(), 2, "an empty body is replayable");
    assert_eq!(sidecar.send("POST", "api", "/", b"x").await.status, 503);
    assert_eq!(
        a.count() + b.count(),
        3,
        "a one-byte body is over the default cap of 0"
    );
}

#[tokio::test]
async fn a_chunked_body_within_the_cap_is_buffered_and_replayed() {
    let a = Upstream::always(Action::Reply(503)).await;
    let b = Upstream::always(Action::Echo).await;
    let sidecar = Sidecar::start(api(&[&a, &b]).retries(replayable().buffer_max_bytes(1024))).await;
    for _ in 0..4 {
        let mut sender = reprise_testkit::client::http1(sidecar.addr).await;
        let chunks: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"hello "))),
            Ok(http_body::Frame::data(Bytes::from_static(b"chunked "))),
            Ok(http_body::Frame::data(Bytes::from_static(b"world"))),
        ];
        let body = StreamBody::new(futures_util::stream::iter(chunks));
        let req = http::Request::post("/")
            .header("host", "api")
            .body(body)
            .expect("request");
        let resp = sender.send_request(req).await.expect("response");
        assert_eq!(resp.status(), 200);
        let got = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&got[..], b"hello chunked world");
    }
    assert_eq!(b.count(), 4);
}

#[tokio::test]
async fn without_a_reservation_the_body_streams_and_the_request_is_not_rejected() {
    let (a, b) = pair(Action::Reply(503)).await;
    let config = Config::from(api(&[&a, &b]).retries(replayable().buffer_max_bytes(4096)))
        .proxy(ProxyConfig::new().replay_reservation_bytes(0));
    let sidecar = Sidecar::start(config).await;
    let r = sidecar.send("POST", "api", "/", &[1u8; 100]).await;
    assert_eq!(r.status, 503);
    assert_eq!(a.count() + b.count(), 1);
}

#[tokio::test]
async fn slow_bodies_hold_only_what_they_sent_so_other_bodies_are_still_replayed() {
    let a = Upstream::always(Action::Reply(503)).await;
    let b = Upstream::always(Action::Echo).await;
    let config = Config::from(api(&[&a, &b]).retries(replayable().buffer_max_bytes(4 << 20)))
        .proxy(ProxyConfig::new().replay_reservation_bytes(8 << 20));
    let sidecar = Sidecar::start(config).await;
    // Two clients declare 4 MiB each, the whole reservation, and send a byte.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(sidecar.addr)
            .await
            .expect("connect");
        c.write_all(b"POST / HTTP/1.1\r\nHost: api\r\nContent-Length: 4194304\r\n\r\nx")
            .await
            .expect("head and a byte");
        slow.push(c);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sidecar.proxy.replay_buffer_bytes() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        sidecar.proxy.replay_buffer_bytes(),
        2,
        "each slow body holds the byte it sent, not the 4 MiB it declared"
    );
    // A 1 MiB body still fits, so the first endpoint's 503 is retried.
    let body = vec![5u8; 1 << 20];
    let r = sidecar.send("POST", "api", "/", &body).await;
    assert_eq!(r.status, 200, "replayed to the second endpoint");
    assert_eq!(r.body.as_ref().expect("body").len(), 1 << 20);
    drop(slow);
}

#[tokio::test]
async fn with_retries_off_a_large_body_streams_through_without_buffering() {
    let echo = Upstream::always(Action::Echo).await;
    let sidecar = Sidecar::start(api(&[&echo])).await;
    let body = vec![3u8; 8 << 20];
    let r = sidecar.send("POST", "api", "/", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.as_ref().expect("body").len(), 8 << 20);
    assert_eq!(sidecar.proxy.replay_buffer_bytes(), 0);
}

#[tokio::test]
async fn an_h2c_body_past_the_flow_control_windows_goes_through_both_ways() {
    // 3 MiB each way: three times the sidecar's 1 MiB receive windows and
    // past the client's, so the windows must be given back as data is read.
    let echo = Upstream::always(Action::Echo).await;
    let sidecar = Sidecar::start(api(&[&echo])).await;
    let (mut sender, _conn) = reprise_testkit::client::http2(sidecar.addr).await;
    let body: Vec<u8> = (0..3u32 << 20).map(|i| (i % 253) as u8).collect();
    let chunks: Vec<Result<http_body::Frame<Bytes>, std::convert::Infallible>> = body
        .chunks(64 << 10)
        .map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let req = http::Request::post("http://api/upload")
        .body(StreamBody::new(futures_util::stream::iter(chunks)))
        .expect("request");
    // Bounded: a window never given back would stall the exchange, not fail it.
    let exchange = async {
        let resp = sender.send_request(req).await.expect("response");
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("body").to_bytes()
    };
    let back = tokio::time::timeout(std::time::Duration::from_secs(30), exchange)
        .await
        .expect("3 MiB each way within 30 s");
    assert!(back == body, "the same {} bytes came back", body.len());
    assert_eq!(echo.received()[0].body.len(), body.len());
}
