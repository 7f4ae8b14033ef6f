//! Counts that go up when a request starts and down when it ends return to
//! zero however it ends: the in-flight gauges after HTTP/1 clients close
//! their connections and an HTTP/2 client resets its stream, all while the
//! upstream stalls (each count is held by a guard in the request's future,
//! so dropping the future gives it back).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use reprise_testkit::sidecar::Running;

use crate::cli::{config_file, start};
use crate::support::{api, Action, Upstream};

/// Polls until `f` holds, at most 5 s.
async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..100 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

/// The request and endpoint in-flight gauges (one endpoint).
async fn gauges(sidecar: &Running) -> (Option<f64>, Option<f64>) {
    let m = sidecar.metrics().await.expect("a /metrics scrape");
    (
        m.get("reprise_requests_in_flight", &[]),
        Some(m.sum("reprise_endpoint_in_flight", &[("upstream", "api")])),
    )
}

#[tokio::test]
async fn in_flight_gauges_return_to_zero_when_clients_give_up() {
    let up = Upstream::always(Action::Stall(Duration::from_secs(30))).await;
    let path = config_file("gauges", api(&[&up]).read_ms(60_000));
    let sidecar = start(&path, &[]).await;

    // Five HTTP/1 clients send a request each and give up while it stalls.
    let mut clients = Vec::new();
    for _ in 0..5 {
        let mut c = TcpStream::connect(sidecar.listen).await.expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nHost: api\r\n\r\n")
            .await
            .expect("request");
        clients.push(c);
    }
    eventually("five requests reach the upstream", async || up.count() == 5).await;
    assert_eq!(gauges(&sidecar).await, (Some(5.0), Some(5.0)));
    drop(clients);
    eventually("HTTP/1 cancellations give their counts back", async || {
        gauges(&sidecar).await == (Some(0.0), Some(0.0))
    })
    .await;

    // An HTTP/2 client resets its stream; its connection stays open.
    let stream = TcpStream::connect(sidecar.listen).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let request = http::Request::get("http://api/")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let call = tokio::spawn(sender.send_request(request));
    eventually("the h2 request reaches the upstream", async || {
        up.count() == 6
    })
    .await;
    assert_eq!(gauges(&sidecar).await, (Some(1.0), Some(1.0)));
    call.abort();
    eventually("a reset stream gives its counts back", async || {
        gauges(&sidecar).await == (Some(0.0), Some(0.0))
    })
    .await;
    assert!(!conn.is_finished(), "only the stream was reset");
}
