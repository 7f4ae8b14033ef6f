use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::balance::client::io::EndpointIo;
use crate::exchange::body::replay::AttemptBody;
use crate::socket::Socket;

/// A loopback upstream that hands each accepted connection, with its
/// number (from 1), to `serve`; counts connections.
async fn listen<F, Fut>(serve: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(usize, TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(serve(n, stream));
        }
    });
    (addr, accepted)
}

/// Reads one request head (bytes past it are dropped); false at EOF or
/// on an error.
async fn read_head(stream: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
    true
}

/// An upstream that answers every request `200` with the number of its
/// connection as the body; counts connections.
async fn upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    listen(|n, mut stream| async move {
        while read_head(&mut stream).await {
            let body = n.to_string();
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            if stream
                .write_all(format!("{head}{body}").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    })
    .await
}

fn get() -> AttemptRequest<'static> {
    AttemptRequest::fixture(http::Method::GET, "/", "api", AttemptBody::Empty)
}

/// Sends a GET and reads its body to the end (the connection goes back).
async fn fetch(pool: &Arc<Http1Pool>) -> String {
    let mut body = pool.send(get()).await.expect("response").into_body();
    let mut text = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            text.extend_from_slice(&data);
        }
    }
    String::from_utf8(text).expect("utf-8")
}

fn pool(addr: SocketAddr) -> Arc<Http1Pool> {
    Http1Pool::new(addr, Duration::from_secs(1), None)
}

#[tokio::test]
async fn sequential_requests_share_one_connection() {
    let (addr, accepted) = upstream().await;
    let pool = pool(addr);
    for _ in 0..5 {
        assert_eq!(fetch(&pool).await, "1");
        assert_eq!(pool.idle_count(), 1, "back as soon as the body ended");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_most_recently_returned_connection_goes_first() {
    let (addr, accepted) = upstream().await;
    let pool = pool(addr);
    // Two exchanges at once need two connections.
    let mut a = pool.send(get()).await.expect("response").into_body();
    let mut b = pool.send(get()).await.expect("response").into_body();
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let text = |d: Bytes| String::from_utf8(d.to_vec()).expect("utf-8");
    let a_text = text(
        a.frame()
            .await
            .expect("frame")
            .expect("data")
            .into_data()
            .expect("data"),
    );
    let b_text = text(
        b.frame()
            .await
            .expect("frame")
            .expect("data")
            .into_data()
            .expect("data"),
    );
    assert_eq!(pool.idle_count(), 2, "back with their last frames");
    drop(a);
    drop(b);
    assert_eq!(fetch(&pool).await, b_text, "last in, first out");
    assert_eq!(fetch(&pool).await, b_text);
    assert_ne!(a_text, b_text);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// An upstream on its own thread (so it runs while this test's runtime
/// is blocked) that answers one request per connection, then closes it
/// 20 ms later without saying so.
fn closing_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            let mut buf = [0u8; 1024];
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => head.extend_from_slice(&buf[..k]),
                }
            }
            let _ = write!(stream, "HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n{n}");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_connection_the_endpoint_closed_while_idle_is_skipped() {
    let (addr, accepted) = closing_upstream();
    let pool = pool(addr);
    assert_eq!(fetch(&pool).await, "1");
    assert_eq!(pool.idle_count(), 1, "nothing said it would close");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fetch(&pool).await, "2");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "one request each");
}

/// A connection whose peer has reset it (SO_LINGER 0) before any
/// request: its first write fails with nothing written.
fn reset_connection() -> Box<Conn> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let client =
        std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    socket2::SockRef::from(&server)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(server);
    std::thread::sleep(Duration::from_millis(20));
    client.set_nonblocking(true).expect("nonblocking");
    Conn::new(EndpointIo::Plain(Socket::new(
        TcpStream::from_std(client).expect("tokio"),
    )))
}

#[tokio::test]
async fn a_request_given_back_unsent_goes_on_another_connection() {
    let (addr, accepted) = upstream().await;
    let pool = pool(addr);
    // A pooled connection the peer reset before the request (SO_LINGER
    // 0): the first write fails, nothing of the request left.
    let mut conn = reset_connection();
    // The runtime has not run since: the reactor has not seen the reset,
    // so the checkout takes the connection and its first write fails.
    assert!(conn.is_open());
    pool.put(conn);
    assert_eq!(fetch(&pool).await, "1", "sent once, on a fresh connection");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_request_whose_body_was_taken_is_never_sent_again_truncated() {
    let (addr, accepted) = upstream().await;
    let pool = pool(addr);
    pool.put(reset_connection());
    // The body's bytes go behind the head in the one write that fails:
    // resending this attempt would send the head with no body.
    let post = AttemptRequest::fixture(
        http::Method::POST,
        "/",
        "api",
        AttemptBody::Full(Some(Bytes::from_static(b"hello")), None),
    );
    let err = pool
        .send(post)
        .await
        .expect_err("the reset connection fails");
    assert_eq!(
        err.1,
        Stage::Connect,
        "nothing reached the endpoint: {err:?}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "not resent on another connection"
    );
}

#[tokio::test]
async fn a_body_dropped_before_its_end_is_drained_and_the_connection_reused() {
    let (addr, accepted) = upstream().await;
    let pool = pool(addr);
    let response = pool.send(get()).await.expect("response");
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(response);
    assert_eq!(
        pool.idle_count(),
        1,
        "the buffered rest is read past at once"
    );
    assert_eq!(fetch(&pool).await, "1");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// An upstream whose first connection answers with a 1,000-byte body but
/// sends only 7 bytes of it, then stalls (`close` false) or closes (`close`
/// true); later connections answer like [`upstream`]'s.
async fn truncating_upstream(close: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    listen(move |n, mut stream| async move {
        while read_head(&mut stream).await {
            let reply = if n == 1 {
                "HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial".to_owned()
            } else {
                format!("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n{n}")
            };
            if stream.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            if n == 1 {
                if !close {
                    // Stalled: hold the connection open, say nothing.
                    let _ = stream.read(&mut [0u8; 1024]).await;
                }
                return;
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_body_dropped_mid_stream_never_returns_its_connection() {
    let (addr, accepted) = truncating_upstream(false).await;
    let pool = pool(addr);
    let mut body = pool.send(get()).await.expect("response").into_body();
    let first = body.frame().await.expect("frame").expect("data");
    assert_eq!(first.into_data().expect("data"), "partial");
    // 993 bytes are still owed and not buffered: the connection cannot
    // carry another request, so the pool must not get it back.
    drop(body);
    assert_eq!(pool.idle_count(), 0, "a connection mid-body was pooled");
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(pool.idle_count(), 0, "a connection mid-body was pooled");
    }
    assert_eq!(fetch(&pool).await, "2", "the next request dials afresh");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert_eq!(pool.idle_count(), 1, "and that one goes back");
}

#[tokio::test]
async fn a_body_that_fails_mid_stream_never_returns_its_connection() {
    let (addr, accepted) = truncating_upstream(true).await;
    let pool = pool(addr);
    let mut body = pool.send(get()).await.expect("response").into_body();
    let mut failed = false;
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "the endpoint closed 993 bytes short");
    assert!(
        body.conn_is_gone(),
        "the connection is given up at the error"
    );
    assert_eq!(pool.idle_count(), 0, "a failed connection was pooled");
    drop(body);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(pool.idle_count(), 0);
    assert_eq!(fetch(&pool).await, "2");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_refused_dial_is_a_connect_failure() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let err = pool(addr).send(get()).await.expect_err("refused");
    assert_eq!(err, (FailureKind::ConnectRefused, Stage::Connect));
}

#[tokio::test(start_paused = true)]
async fn idle_connections_close_after_the_idle_timeout() {
    let pool = pool("127.0.0.1:1".parse().expect("addr"));
    // Connections made without the runtime (a loopback connect completes
    // in the kernel): nothing here waits on real time.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut servers = Vec::new();
    for _ in 0..2 {
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        servers.push(listener.accept().expect("accept").0);
        client.set_nonblocking(true).expect("nonblocking");
        pool.put(Conn::new(EndpointIo::Plain(Socket::new(
            TcpStream::from_std(client).expect("tokio"),
        ))));
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    // The first went in 60 s ago, the second 30 s ago.
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(pool.idle_count(), 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(pool.idle_count(), 1, "the oldest is gone after 90 s");
    let mut first = &servers[0];
    assert_eq!(
        std::io::Read::read(&mut first, &mut [0u8; 1]).expect("read"),
        0,
        "and its socket is closed"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(pool.idle_count(), 0);
    assert!(
        !lock(&pool.idle).reaping,
        "the reaper stops with nothing to watch"
    );
}
