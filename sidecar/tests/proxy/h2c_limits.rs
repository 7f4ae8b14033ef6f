//! What an h2c client may not do with a connection: keep it open with no
//! stream (it gets GOAWAY after the header read timeout, as an idle HTTP/1
//! connection is closed), or open streams and reset each once the sidecar
//! has sent it upstream (rapid reset after acceptance: one connection
//! turned into a flood of upstream requests, and upstream connections,
//! each cancelled HTTP/1 request closing its own). Past a hundred streams,
//! a connection whose client reset most of them before the answer is
//! closed.

use std::time::{Duration, Instant};

use crate::support::{api, Action, Sidecar, Upstream};

#[tokio::test(start_paused = true)]
async fn an_h2c_connection_with_no_stream_open_gets_goaway_after_the_header_timeout() {
    let up = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(api(&[&up])).await;
    let io = tokio::net::TcpStream::connect(sidecar.addr)
        .await
        .expect("connect");
    let (h2, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    let mut conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.expect("ready");
    let req = http::Request::get("http://api/").body(()).expect("request");
    let (response, _) = h2.send_request(req, true).expect("sent");
    assert_eq!(response.await.expect("response").status(), 200);
    // Busy connections stay: 29 s of quiet is not enough.
    tokio::time::sleep(reprise_sidecar::HEADER_READ_TIMEOUT - Duration::from_secs(1)).await;
    assert!(!conn.is_finished(), "open before the timeout");
    let ended = tokio::time::timeout(Duration::from_secs(5), &mut conn).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "closed cleanly with GOAWAY once idle for the timeout: {ended:?}"
    );
}

#[tokio::test]
async fn an_h2c_client_that_resets_most_streams_before_the_answer_is_cut_off() {
    let up = Upstream::always(Action::Stall(Duration::from_secs(30))).await;
    let sidecar = Sidecar::start(api(&[&up])).await;
    let io = tokio::net::TcpStream::connect(sidecar.addr)
        .await
        .expect("connect");
    let (h2, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.expect("ready");
    let mut opened = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while opened < 400 && Instant::now() < deadline {
        let req = http::Request::get("http://api/x")
            .body(())
            .expect("request");
        let Ok((_response, mut stream)) = h2.send_request(req, true) else {
            break;
        };
        opened += 1;
        // Reset once the request has reached the upstream: after acceptance.
        let reached = Instant::now() + Duration::from_secs(2);
        while up.count() < opened && Instant::now() < reached {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        stream.send_reset(h2::Reason::CANCEL);
        h2 = match h2.ready().await {
            Ok(h2) => h2,
            Err(_) => break,
        };
    }
    assert!(
        opened < 200,
        "the connection was closed once most of its streams were reset early ({opened} opened)"
    );
    assert!(
        up.count() <= 150,
        "the upstream saw {} requests from one connection",
        up.count()
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "the client's connection ended");
    assert_eq!(
        reprise_testkit::prometheus::Metrics::parse(&reprise_sidecar::server::metrics_text(
            &sidecar.proxy
        ))
        .expect("metrics")
        .get("reprise_h2c_reset_flood_closes_total", &[]),
        Some(1.0)
    );
}
