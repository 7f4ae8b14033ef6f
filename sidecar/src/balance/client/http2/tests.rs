//! The h2c client against real loopback h2c servers (hyper's), and its idle
//! reaping under paused time.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// A loopback h2c upstream answering `200` with its connection's number
/// (from 1) as the body; with `close_after_first`, each connection is
/// shut down gracefully (GOAWAY) once its first response is out.
async fn upstream(close_after_first: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            let answered = Arc::new(tokio::sync::Notify::new());
            let notify = Arc::clone(&answered);
            let service = service_fn(move |_req| {
                notify.notify_one();
                async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(n.to_string())))) }
            });
            tokio::spawn(async move {
                let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                if close_after_first {
                    tokio::select! {
                        _ = conn.as_mut() => return,
                        () = answered.notified() => conn.as_mut().graceful_shutdown(),
                    }
                }
                let _ = conn.await;
            });
        }
    });
    (addr, accepted)
}

fn get(addr: SocketAddr) -> Request<AttemptBody> {
    Request::builder()
        .uri(format!("http://api.test:{}/", addr.port()))
        .version(http::Version::HTTP_2)
        .body(AttemptBody::Empty)
        .expect("request")
}

async fn fetch(endpoint: &Arc<Http2Endpoint>, addr: SocketAddr) -> String {
    let response = endpoint
        .send(get(addr), Instant::now())
        .await
        .expect("response");
    assert_eq!(response.status(), 200);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8(body.to_vec()).expect("utf-8")
}

#[tokio::test]
async fn concurrent_requests_share_one_dial_and_one_connection() {
    let (addr, accepted) = upstream(false).await;
    let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1), None);
    // All sixteen start with no connection: one dials, fifteen wait for it.
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let endpoint = Arc::clone(&endpoint);
            tokio::spawn(async move { fetch(&endpoint, addr).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.expect("task"), "1");
    }
    assert_eq!(fetch(&endpoint, addr).await, "1");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// A loopback h2c upstream allowing `streams` concurrent streams per
/// connection, answering each request with its connection's number once
/// `release` has a permit for it; every request it receives is announced
/// on the returned channel first.
async fn limited_upstream(
    streams: u32,
    release: Arc<tokio::sync::Semaphore>,
) -> (
    SocketAddr,
    Arc<AtomicUsize>,
    tokio::sync::mpsc::UnboundedReceiver<usize>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    let (seen, arrivals) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            let (seen, release) = (seen.clone(), Arc::clone(&release));
            let service = service_fn(move |_req| {
                let _ = seen.send(n);
                let release = Arc::clone(&release);
                async move {
                    release.acquire().await.expect("open").forget();
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(n.to_string()))))
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(streams)
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (addr, accepted, arrivals)
}

/// Starts one request in its own task and waits until the upstream has it
/// (so the client has read the connection's SETTINGS by the next one);
/// `None` if it did not arrive within 300 ms (it waits for a stream).
async fn start_held(
    endpoint: &Arc<Http2Endpoint>,
    addr: SocketAddr,
    arrivals: &mut tokio::sync::mpsc::UnboundedReceiver<usize>,
) -> (tokio::task::JoinHandle<String>, Option<usize>) {
    let task = {
        let endpoint = Arc::clone(endpoint);
        tokio::spawn(async move { fetch(&endpoint, addr).await })
    };
    let arrived = tokio::time::timeout(Duration::from_millis(300), arrivals.recv())
        .await
        .ok()
        .flatten();
    (task, arrived)
}

#[tokio::test]
async fn streams_past_the_endpoints_limit_go_on_another_connection() {
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let (addr, accepted, mut arrivals) = limited_upstream(2, Arc::clone(&release)).await;
    let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1), None);
    // One request first: its connection's SETTINGS (2 streams) are known.
    release.add_permits(1);
    assert_eq!(fetch(&endpoint, addr).await, "1");
    assert_eq!(arrivals.recv().await, Some(1));
    // Five held at once: two on each of the first two connections, one on a
    // third, none of them waiting for a stream.
    let mut held = Vec::new();
    for _ in 0..5 {
        let (task, arrived) = start_held(&endpoint, addr, &mut arrivals).await;
        held.push((task, arrived.expect("the request reached the upstream")));
    }
    let on: Vec<usize> = held.iter().map(|(_, conn)| *conn).collect();
    assert_eq!(on, [1, 1, 2, 2, 3]);
    assert_eq!(endpoint.connections(), 3);
    release.add_permits(5);
    for (task, conn) in held {
        assert_eq!(task.await.expect("task"), conn.to_string());
    }
    // Free again: the next request takes the first connection.
    release.add_permits(1);
    assert_eq!(fetch(&endpoint, addr).await, "1");
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn past_the_connection_cap_a_stream_waits_on_the_least_loaded() {
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let (addr, accepted, mut arrivals) = limited_upstream(1, Arc::clone(&release)).await;
    let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1), None);
    release.add_permits(1);
    assert_eq!(fetch(&endpoint, addr).await, "1");
    assert_eq!(arrivals.recv().await, Some(1));
    let mut held = Vec::new();
    for i in 1..=MAX_CONNECTIONS {
        let (task, arrived) = start_held(&endpoint, addr, &mut arrivals).await;
        assert_eq!(arrived, Some(i), "one stream per connection");
        held.push(task);
    }
    // Every connection is full and no more may be dialled: this one waits.
    let (late, arrived) = start_held(&endpoint, addr, &mut arrivals).await;
    assert_eq!(arrived, None, "no stream was free for it");
    assert_eq!(accepted.load(Ordering::SeqCst), MAX_CONNECTIONS);
    release.add_permits(MAX_CONNECTIONS + 1);
    for task in held {
        task.await.expect("task");
    }
    let conn: usize = late.await.expect("task").parse().expect("number");
    assert!((1..=MAX_CONNECTIONS).contains(&conn), "{conn}");
    assert_eq!(accepted.load(Ordering::SeqCst), MAX_CONNECTIONS);
}

/// A loopback h2c upstream whose stream windows are 64 KiB: each request
/// gets back what it sent, as `<bytes>/<trailer x-sum>`; with
/// `answer_first`, the answer goes out before the body is read, and how
/// the body ended afterwards is sent on the returned channel.
async fn body_upstream(
    answer_first: bool,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (ended, endings) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ended = ended.clone();
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let ended = ended.clone();
                async move {
                    let mut body = req.into_body();
                    if answer_first {
                        tokio::spawn(async move {
                            let mut read = 0;
                            let end = loop {
                                match body.frame().await {
                                    Some(Ok(f)) => {
                                        read += f.data_ref().map_or(0, Bytes::len);
                                    }
                                    Some(Err(e)) => break format!("error after {read}: {e:?}"),
                                    None => break format!("end after {read}"),
                                }
                            };
                            let _ = ended.send(end);
                        });
                        return Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("early"))));
                    }
                    let collected = body.collect().await.expect("body");
                    let sum = collected
                        .trailers()
                        .and_then(|t| t.get("x-sum"))
                        .map(|v| v.to_str().expect("ascii").to_owned())
                        .unwrap_or_default();
                    let answer = format!("{}/{sum}", collected.to_bytes().len());
                    Ok(Response::new(Full::new(Bytes::from(answer))))
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .initial_stream_window_size(65_535)
                    .initial_connection_window_size(65_535)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, endings)
}

fn post(addr: SocketAddr, len: usize) -> Request<AttemptBody> {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-sum", http::HeaderValue::from_static("42"));
    Request::builder()
        .method("POST")
        .uri(format!("http://api.test:{}/", addr.port()))
        .version(http::Version::HTTP_2)
        .body(AttemptBody::Full(
            Some(Bytes::from(vec![7u8; len])),
            Some(Box::new(trailers)),
        ))
        .expect("request")
}

#[tokio::test]
async fn a_body_larger_than_the_window_streams_whole_and_its_trailers_follow() {
    let (addr, _) = body_upstream(false).await;
    let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1), None);
    // 3 MiB through a 64 KiB window: the pipe waits for capacity ~48 times.
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        endpoint.send(post(addr, 3 << 20), Instant::now()),
    )
    .await
    .expect("in time")
    .expect("response");
    let body = response.into_body().collect().await.expect("body");
    assert_eq!(body.to_bytes(), format!("{}/42", 3 << 20).as_bytes());
}

#[tokio::test]
async fn dropping_the_response_resets_a_body_still_streaming() {
    let (addr, mut endings) = body_upstream(true).await;
    let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1), None);
    let response = endpoint
        .send(post(addr, 3 << 20), Instant::now())
        .await
        .expect("response");
    assert_eq!(response.status(), 200);
    // The pipe is stalled on the 64 KiB window, the upstream reading.
    drop(response);
    let ended = tokio::time::timeout(Duration::from_secs(5), endings.recv())
        .await
        .expect("the upstream's body ended in time")
        .expect("ending");
    assert!(ended.starts_with("error after"), "{ended}");
    assert!(ended.contains("CANCEL"), "reset as cancelled: {ended}");
}

#[tokio::test]
async fn a_connection_the_endpoint_closed_is_dialled_again_without_a_failure() {
    let (addr, accepted) = upstream(true).await;
    let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1), None);
    assert_eq!(fetch(&endpoint, addr).await, "1");
    // The GOAWAY reaches the client's connection task.
    for _ in 0..200 {
        if !endpoint.is_connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !endpoint.is_connected(),
        "the closed connection is seen as closed"
    );
    assert_eq!(fetch(&endpoint, addr).await, "2");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn requests_waiting_on_a_dial_that_times_out_share_its_failure() {
    // A listener that never accepts, with a backlog of 0 (one pending
    // connection) already taken: the kernel drops further SYNs, so a
    // dial hangs until the connect timeout.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(0).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut held = Vec::new();
    while let Ok(Ok(stream)) =
        tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
    {
        held.push(stream);
    }
    let endpoint = Http2Endpoint::new(addr, Duration::from_millis(300), None);
    let started = std::time::Instant::now();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let endpoint = Arc::clone(&endpoint);
            tokio::spawn(async move { endpoint.send(get(addr), Instant::now()).await.map(|_| ()) })
        })
        .collect();
    for call in calls {
        assert_eq!(
            call.await.expect("task"),
            Err((FailureKind::ConnectTimeout, Stage::Connect))
        );
    }
    // One timeout for the burst: eight in turn would take 2.4 s.
    assert_eq!(lock(&endpoint.shared).dials, 1);
    assert!(
        started.elapsed() < Duration::from_millis(1200),
        "{:?}",
        started.elapsed()
    );
    drop(held);
}

#[tokio::test]
async fn a_refused_dial_is_a_connect_failure() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1), None);
    let err = endpoint
        .send(get(addr), Instant::now())
        .await
        .expect_err("refused");
    assert_eq!(err, (FailureKind::ConnectRefused, Stage::Connect));
}

#[tokio::test(start_paused = true)]
async fn an_unused_connection_is_let_go_after_the_idle_timeout() {
    let endpoint = Http2Endpoint::new(
        "127.0.0.1:1".parse().expect("addr"),
        Duration::from_secs(1),
        None,
    );
    // An in-memory connection: nothing here depends on real time.
    let (client, server) = tokio::io::duplex(64 * 1024);
    let served = tokio::spawn(
        hyper::server::conn::http2::Builder::new(TokioExecutor::new()).serve_connection(
            TokioIo::new(server),
            service_fn(|_req| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
            }),
        ),
    );
    let send = handshake(client, "127.0.0.1:1".parse().expect("addr"))
        .await
        .expect("handshake");
    // Kept with no stream open (the one `keep` hands back is dropped).
    drop(endpoint.keep(send));
    tokio::time::sleep(Duration::from_secs(60)).await;
    // A request 60 s in restarts the idle clock.
    let response = endpoint
        .send(get("127.0.0.1:1".parse().expect("addr")), Instant::now())
        .await
        .expect("response");
    assert_eq!(response.status(), 200);
    drop(response);
    tokio::time::sleep(IDLE_TIMEOUT - Duration::from_secs(1)).await;
    assert!(
        endpoint.is_connected(),
        "89 s after the last request it is still held"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        lock(&endpoint.shared).conns.is_empty(),
        "let go 90 s after the last request"
    );
    assert!(!lock(&endpoint.shared).reaping, "the reaper stops with it");
    // With its last sender gone, the connection closes: the server's ends.
    tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("server connection ended")
        .expect("task")
        .expect("clean end");
}
