//! CONNECT: a tunnel to a host an upstream answers to carries HTTP (what a
//! client that honours `http_proxy` opens): its requests are served by the
//! sidecar and retried like any other. A tunnel whose first byte is a TLS
//! record stays an opaque TCP tunnel to one endpoint, byte for byte. An
//! upgrade (WebSocket) answered `101` bridges the client to the endpoint's
//! connection, which never goes back to the pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reprise_testkit::http1::{header, Wire};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{api, Action, Retries, Sidecar, Upstream, UpstreamConfig};

/// Opens `CONNECT api:80` on `sidecar` and reads the `200`.
async fn tunnel(sidecar: &Sidecar) -> Wire<TcpStream> {
    let mut stream = TcpStream::connect(sidecar.addr).await.expect("connect");
    stream
        .write_all(b"CONNECT api:80 HTTP/1.1\r\nHost: api:80\r\n\r\n")
        .await
        .expect("CONNECT");
    let mut wire = Wire::new(stream);
    let opened = wire.read_response_head().await.expect("the CONNECT answer");
    assert_eq!(opened.status, 200, "{opened:?}");
    wire
}

/// One endpoint that answers 503 the first time and 200 after, behind a
/// sidecar whose one retry may go back to it.
async fn once_unavailable() -> (Upstream, Sidecar) {
    let up = Upstream::start(|r| {
        if r.seq == 0 {
            Action::Reply(503)
        } else {
            Action::Reply(200)
        }
    })
    .await;
    let retries = Retries::new()
        .attempts(1)
        .reuse_endpoints(true)
        .budget_min_retries_per_second(1000);
    let sidecar = Sidecar::start(api(&[&up]).retries(retries)).await;
    (up, sidecar)
}

#[tokio::test]
async fn http_inside_a_tunnel_to_an_upstream_is_retried() {
    let (up, sidecar) = once_unavailable().await;
    let mut wire = tunnel(&sidecar).await;
    for _ in 0..3 {
        assert_eq!(get(&mut wire, "api").await, 200);
    }
    let got = up.received();
    assert_eq!(got.len(), 4, "the 503 was retried, the other two went once");
    assert_eq!(got[1].attempt, Some(2), "the retry came from the sidecar");
    assert_eq!(sidecar.outcomes("api", "recovered"), 1);
}

#[tokio::test]
async fn a_request_whose_first_bytes_could_start_the_http2_preface_is_served() {
    // "P" could begin "PRI * HTTP/2.0" (h2c) or "PUT": the tunnel waits for
    // the next bytes to tell, then serves HTTP/1.
    let up = Upstream::start(|_| Action::Reply(200)).await;
    let sidecar = Sidecar::start(api(&[&up])).await;
    let mut wire = tunnel(&sidecar).await;
    wire.get_mut().write_all(b"P").await.expect("first byte");
    tokio::time::sleep(Duration::from_millis(50)).await;
    wire.get_mut()
        .write_all(b"UT /items HTTP/1.1\r\nHost: api\r\nContent-Length: 2\r\n\r\nok")
        .await
        .expect("the rest of the request");
    let answer = wire.read_response("PUT").await.expect("its answer");
    assert_eq!(answer.status, 200);
    assert_eq!(get(&mut wire, "api").await, 200, "the tunnel stays open");
    let got = up.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].method, "PUT");
}

#[tokio::test]
async fn a_connect_over_h2c_carries_http_to_the_upstream() {
    // RFC 9113 §8.5: the stream's DATA frames are the tunnel's bytes.
    let (up, sidecar) = once_unavailable().await;
    let (mut sender, _conn) = reprise_testkit::client::http2(sidecar.addr).await;
    let connect = http::Request::connect("api:80")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("CONNECT");
    let opened = sender
        .send_request(connect)
        .await
        .expect("the CONNECT answer");
    assert_eq!(opened.status(), 200, "{opened:?}");
    assert!(
        !opened.headers().contains_key("content-length"),
        "a 2xx to CONNECT has no content-length (RFC 9110 §9.3.6)"
    );
    let stream = hyper::upgrade::on(opened)
        .await
        .expect("the tunnel's stream");
    let mut wire = Wire::new(hyper_util::rt::TokioIo::new(stream));
    for _ in 0..2 {
        assert_eq!(get(&mut wire, "api").await, 200);
    }
    let got = up.received();
    assert_eq!(got.len(), 3, "the 503 was retried, the other went once");
    assert_eq!(got[1].attempt, Some(2), "the retry came from the sidecar");
}

#[tokio::test]
async fn a_tls_tunnel_stays_opaque() {
    // An endpoint that echoes whatever it receives.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let sidecar = Sidecar::start(UpstreamConfig::new("api").endpoint(addr)).await;
    let mut wire = tunnel(&sidecar).await;
    // A TLS ClientHello's record header, then arbitrary bytes.
    let hello = [0x16, 0x03, 0x01, 0x00, 0x05, b'h', b'e', b'l', b'l', b'o'];
    wire.get_mut().write_all(&hello).await.expect("write");
    let mut back = [0u8; 10];
    tokio::time::timeout(Duration::from_secs(3), wire.get_mut().read_exact(&mut back))
        .await
        .expect("echoed in time")
        .expect("echoed");
    assert_eq!(back, hello, "byte for byte");
}

#[tokio::test]
async fn requests_in_a_long_lived_tunnel_follow_a_reload() {
    // A gRPC channel through http_proxy keeps one tunnel for hours; the pods
    // behind it change. Each request is routed on the routes of its time.
    let (old, new) = (
        Upstream::always(Action::Reply(200)).await,
        Upstream::always(Action::Reply(200)).await,
    );
    let sidecar = Sidecar::start(UpstreamConfig::new("api").endpoint(old.addr)).await;
    let mut wire = tunnel(&sidecar).await;
    assert_eq!(get(&mut wire, "10.1.2.3").await, 200);
    sidecar.proxy.reload(
        reprise_testkit::config::Config::from(UpstreamConfig::new("api").endpoint(new.addr))
            .resolve(),
    );
    assert_eq!(get(&mut wire, "10.1.2.3").await, 200);
    assert_eq!(old.received().len(), 1, "before the reload");
    assert_eq!(new.received().len(), 1, "after it, in the same tunnel");
}

/// `GET /items` on the tunnel's HTTP connection with a host that names no
/// upstream (so only the tunnel says where it goes); the answer's status.
async fn get<S>(wire: &mut Wire<S>, host: &str) -> u16
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let request = format!("GET /items HTTP/1.1\r\nHost: {host}\r\n\r\n");
    wire.get_mut()
        .write_all(request.as_bytes())
        .await
        .expect("a request in the tunnel");
    wire.read_response("GET").await.expect("its answer").status
}

#[tokio::test]
async fn a_websocket_upgrade_is_bridged_and_its_connection_never_pooled() {
    // An endpoint that answers an upgrade `101` and then echoes in upper
    // case, and anything else `200` with the number of its connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let mut wire = Wire::new(stream);
                while let Ok(Some(r)) = wire.read_request().await {
                    if header(&r.head.headers, "upgrade") == Some("websocket") {
                        let head = "HTTP/1.1 101 Switching Protocols\r\n\
                                    connection: upgrade\r\nupgrade: websocket\r\n\r\n";
                        let early = wire.buffered().to_ascii_uppercase();
                        let mut s = wire.into_inner();
                        if s.write_all(head.as_bytes()).await.is_err()
                            || s.write_all(&early).await.is_err()
                        {
                            return;
                        }
                        let mut buf = [0u8; 1024];
                        while let Ok(k) = s.read(&mut buf).await {
                            if k == 0 || s.write_all(&buf[..k].to_ascii_uppercase()).await.is_err()
                            {
                                return;
                            }
                        }
                        return;
                    }
                    let reply = format!("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n{n}");
                    if wire.get_mut().write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let sidecar = Sidecar::start(UpstreamConfig::new("api").endpoint(addr)).await;

    // A plain request first, so an idle pooled connection exists: the
    // upgrade takes it, and must not leave it in the pool afterwards.
    let mut plain = Wire::new(TcpStream::connect(sidecar.addr).await.expect("connect"));
    let get = b"GET /items HTTP/1.1\r\nHost: api\r\n\r\n";
    plain.get_mut().write_all(get).await.expect("GET");
    assert_eq!(plain.read_response("GET").await.expect("200").text(), "1");

    let mut ws = Wire::new(TcpStream::connect(sidecar.addr).await.expect("connect"));
    ws.get_mut()
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: api\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .expect("upgrade request");
    let switched = ws.read_response_head().await.expect("the upgrade answer");
    assert_eq!(switched.status, 101, "{switched:?}");
    assert!(ws.buffered().is_empty());
    let mut ws = ws.into_inner();
    for word in [&b"ping"[..], b"frames both ways"] {
        ws.write_all(word).await.expect("write");
        let mut back = vec![0u8; word.len()];
        tokio::time::timeout(Duration::from_secs(3), ws.read_exact(&mut back))
            .await
            .expect("echoed in time")
            .expect("echoed");
        assert_eq!(back, word.to_ascii_uppercase());
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "the upgrade reused it");

    // The bridged connection is the WebSocket's now: the next request dials.
    plain.get_mut().write_all(get).await.expect("GET");
    assert_eq!(plain.read_response("GET").await.expect("200").text(), "2");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);

    // And the WebSocket still works after that.
    ws.write_all(b"still").await.expect("write");
    let mut back = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(3), ws.read_exact(&mut back))
        .await
        .expect("echoed in time")
        .expect("echoed");
    assert_eq!(&back, b"STILL");
}
