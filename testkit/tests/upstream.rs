//! The kit's upstream against raw and hyper clients: what it records, that
//! its faults are the TCP events they name, close and reopen, h2c.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use reprise_testkit::client;
use reprise_testkit::http1::Wire;
use reprise_testkit::upstream::{Action, ActionKind, Deliveries, Upstream, ABORT_LENGTH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(5);

/// Writes `raw` on a new connection and reads until the upstream closes it:
/// the bytes, and whether it ended with a reset.
async fn until_closed(up: &Upstream, raw: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(up.addr).await.expect("connect");
    s.write_all(raw).await.expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    for _ in 0..1000 {
        match tokio::time::timeout(WAIT, s.read(&mut buf)).await {
            Ok(Ok(0)) => return (out, false),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => return (out, e.kind() == std::io::ErrorKind::ConnectionReset),
            Err(_) => panic!("the upstream neither answered nor closed"),
        }
    }
    panic!("endless answer");
}

#[tokio::test]
async fn keep_alive_requests_are_recorded_and_answered_as_scripted() {
    let up = Upstream::start(|r| match r.path.as_str() {
        "/echo" => Action::Echo,
        "/busy" => Action::ReplyWith(503, vec![("retry-after", "1".into())], "busy".into()),
        _ => Action::Reply(200),
    })
    .await;
    let mut wire = Wire::new(TcpStream::connect(up.addr).await.expect("connect"));
    wire.get_mut()
        .write_all(
            b"GET /plain HTTP/1.1\r\nHost: api\r\nX-Reprise-Attempt: 2\r\n\r\n\
POST /echo HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
HEAD /busy HTTP/1.1\r\nHost: api\r\n\r\n",
        )
        .await
        .expect("write");
    let plain = wire.read_response("GET").await.expect("first");
    assert_eq!(
        (plain.status, plain.text()),
        (200, format!("from {}\n", up.addr.port()))
    );
    let echo = wire.read_response("POST").await.expect("second");
    assert_eq!((echo.status, echo.text().as_str()), (200, "hello"));
    let busy = wire.read_response("HEAD").await.expect("third");
    assert_eq!(busy.status, 503);
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(
        busy.header("content-length"),
        Some("4"),
        "HEAD: the length, no body"
    );
    assert!(busy.body.is_empty());
    let got = up.received();
    assert_eq!(got.len(), 3);
    assert_eq!(up.connections(), 1, "one keep-alive connection");
    let seen: Vec<(usize, &str, &str, Option<u32>)> = got
        .iter()
        .map(|r| (r.seq, r.method.as_str(), r.path.as_str(), r.attempt))
        .collect();
    assert_eq!(
        seen,
        [
            (0, "GET", "/plain", Some(2)),
            (1, "POST", "/echo", None),
            (2, "HEAD", "/busy", None)
        ]
    );
    assert_eq!(got[1].body, b"hello");
    assert_eq!(
        got[1].body_digest,
        reprise_testkit::upstream::digest(b"hello")
    );
    assert_eq!(got[0].header("host"), Some("api"));
    assert_eq!(got[2].action, Some(ActionKind::Reply(503)));
    assert!(got.iter().all(|r| r.answered));
}

#[tokio::test]
async fn faults_are_the_tcp_events_they_name() {
    let get = b"GET / HTTP/1.1\r\nHost: api\r\n\r\n";
    let reset = Upstream::always(Action::Reset).await;
    assert_eq!(
        until_closed(&reset, get).await,
        (Vec::new(), true),
        "RST, no bytes"
    );
    let close = Upstream::always(Action::Close).await;
    assert_eq!(
        until_closed(&close, get).await,
        (Vec::new(), false),
        "FIN, no bytes"
    );
    let abort = Upstream::always(Action::AbortMidBody).await;
    let (bytes, was_reset) = until_closed(&abort, get).await;
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.contains(&format!("content-length: {ABORT_LENGTH}")),
        "{text}"
    );
    assert!(bytes.len() < ABORT_LENGTH, "the body is cut");
    assert!(was_reset);
    let hold = Upstream::always(Action::Hold(Duration::from_millis(200))).await;
    let started = Instant::now();
    assert_eq!(until_closed(&hold, get).await, (Vec::new(), false));
    assert!(started.elapsed() >= Duration::from_millis(190));
    for (up, kind) in [
        (&reset, ActionKind::Reset),
        (&close, ActionKind::Close),
        (&abort, ActionKind::AbortMidBody),
        (&hold, ActionKind::Hold),
    ] {
        let r = &up.received()[0];
        assert_eq!(r.action, Some(kind));
        assert!(!r.answered, "{kind:?} never answers");
    }
}

#[tokio::test]
async fn a_closed_upstream_refuses_and_reopens_on_the_same_port() {
    let up = Upstream::always(Action::Reply(204)).await;
    assert_eq!(
        client::get(up.addr, "api", "/").await.expect("open").status,
        204
    );
    up.close();
    assert!(!up.is_open());
    let mut refused = false;
    for _ in 0..50 {
        if TcpStream::connect(up.addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "nothing listens once closed");
    up.reopen().await.expect("reopen");
    assert_eq!(
        client::get(up.addr, "api", "/")
            .await
            .expect("reopened")
            .status,
        204
    );
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn h2c_connections_run_the_same_script() {
    let up = Upstream::start(|r| match r.path.as_str() {
        "/abort" => Action::AbortMidBody,
        "/reset" => Action::Reset,
        _ => Action::text(
            201,
            format!("{:?} {}", r.version, r.authority.as_deref().unwrap_or("-")),
        ),
    })
    .await;
    let (mut sender, _conn) = client::http2::<Full<Bytes>>(up.addr).await;
    let get = |path: &str| {
        http::Request::get(format!("http://api{path}"))
            .body(Full::new(Bytes::new()))
            .expect("request")
    };
    let ok = sender.send_request(get("/")).await.expect("response");
    assert_eq!(ok.status(), 201);
    let body = ok.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"HTTP/2.0 api");
    let cut = sender
        .send_request(get("/abort"))
        .await
        .expect("response head");
    assert!(
        cut.into_body().collect().await.is_err(),
        "the stream is reset mid-body"
    );
    assert!(
        sender.send_request(get("/reset")).await.is_err(),
        "reset before headers"
    );
    assert_eq!(up.count(), 3);
}

#[tokio::test]
async fn deliveries_are_counted_across_upstreams() {
    let deliveries = Deliveries::default();
    let start = || {
        Upstream::builder()
            .count_ids("x-id", &deliveries)
            .keep_bodies(false)
            .start(|_| Action::Echo)
    };
    let (a, b) = (start().await.expect("a"), start().await.expect("b"));
    for (up, id) in [(&a, "1"), (&b, "1"), (&b, "2")] {
        let raw =
            format!("POST / HTTP/1.1\r\nHost: api\r\nx-id: {id}\r\nContent-Length: 2\r\n\r\nhi");
        assert_eq!(
            client::exchange(up.addr, raw.as_bytes())
                .await
                .expect("answer")
                .text(),
            "hi"
        );
    }
    assert_eq!(deliveries.repeated(), [("1".to_string(), 2)]);
    assert_eq!(deliveries.of("2"), 1);
    let r = &b.received()[0];
    assert!(
        r.body.is_empty() && r.body_len == 2,
        "the length, not the body"
    );
}
