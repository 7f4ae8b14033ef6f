//! One h2c endpoint's connection: a single HTTP/2 connection of the h2
//! crate that every request to the endpoint multiplexes over.
//!
//! The contract:
//! - Requests share one connection. The first request dials it, and so does
//!   the first after it closed (the endpoint went away, or sent GOAWAY and
//!   its streams finished); requests arriving during a dial wait for that
//!   dial instead of opening connections of their own, and share its
//!   failure when it fails (a dead endpoint costs one connect timeout per
//!   burst, not one per waiting request in turn).
//! - A request the connection can no longer take (it had closed and we had
//!   not seen it yet) goes on a fresh connection inside the same call, so the
//!   retry engine sees no failure; on a fresh connection the same thing is
//!   a failure at the connect stage (nothing reached the endpoint).
//! - Streams beyond the endpoint's `SETTINGS_MAX_CONCURRENT_STREAMS` wait in
//!   the h2 crate for a free one.
//! - A connection no request used for [`IDLE_TIMEOUT`] is let go: dropping
//!   the last sender lets the connection finish the streams still open, then
//!   close.
//!
//! The h2 crate is used directly, not through hyper's client: hyper's adds,
//! per request, a dispatch channel to the connection's task, a oneshot for
//! the response, a task spawned to await it and another oneshot to cancel
//! the body's pipe: about 6,300 of the 58,300 instructions of a proxied h2c
//! request (callgrind, 4 connections × 64 streams). Here the stream is
//! opened in the caller's task and its response awaited there; only a
//! request with a body spawns a task, to stream it ([`stream::pipe`]).
//! Streams a GOAWAY cuts off before the endpoint took them fail as resets,
//! as they did through hyper (the h2 crate reports them the same way).

mod stream;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

pub(crate) use self::stream::H2Body;
use super::IDLE_TIMEOUT;
use crate::retry::failure::{classify_h2_error, FailureKind, Stage};
use crate::retry::replay_body::AttemptBody;

/// Per-stream receive window: hyper's client default, kept from when the
/// endpoints' h2c connections were hyper's (2 MiB; 5 MiB for the connection).
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;
/// Response heads up to 16 KiB, and 1 MiB of request data buffered per
/// stream: hyper's client defaults too.
const MAX_HEADER_LIST: u32 = 16 << 10;
const MAX_SEND_BUFFER: usize = 1 << 20;

/// The connection to one h2c endpoint.
#[derive(Debug)]
pub(crate) struct Http2Endpoint {
    addr: SocketAddr,
    connect_timeout: Duration,
    shared: Mutex<Shared>,
    /// Held while dialling, so that one request dials and the rest wait.
    dialing: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Shared {
    send: Option<Sender>,
    /// When a request last took the connection.
    last_used: Instant,
    /// True while a reaper task watches `last_used`.
    reaping: bool,
    /// Dials finished so far, and how the latest failed, if it did.
    dials: u64,
    failed: Option<(FailureKind, Stage)>,
}

/// A handle on one connection, and whether its task has ended.
#[derive(Debug, Clone)]
struct Sender {
    send: h2::client::SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
}

impl Sender {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl Http2Endpoint {
    /// No connection yet to `addr`.
    pub(crate) fn new(addr: SocketAddr, connect_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            addr,
            connect_timeout,
            shared: Mutex::new(Shared {
                send: None,
                last_used: Instant::now(),
                reaping: false,
                dials: 0,
                failed: None,
            }),
            dialing: tokio::sync::Mutex::new(()),
        })
    }

    /// Sends `request` (absolute URI: scheme and authority become the
    /// pseudo-headers) and waits for the response headers.
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: Request<AttemptBody>,
    ) -> Result<Response<H2Body>, (FailureKind, Stage)> {
        if let Some(current) = self.current() {
            match current.send.ready().await {
                Ok(send) => return start(send, request).await,
                Err(e) => {
                    tracing::trace!(endpoint = %self.addr, error = %e, "h2c connection had closed; request not sent, dialling again");
                }
            }
        }
        // Boxed: dialling is the rare path, and its futures would otherwise
        // enlarge (and be copied with) every request's future.
        let fresh = Box::pin(self.connected()).await?;
        match fresh.send.ready().await {
            Ok(send) => start(send, request).await,
            Err(e) => Err((classify_h2_error(&e).0, Stage::Connect)),
        }
    }

    /// The open connection's sender, stamped as used now.
    fn current(&self) -> Option<Sender> {
        let mut shared = lock(&self.shared);
        match &shared.send {
            Some(send) if !send.is_closed() => {
                let send = send.clone();
                shared.last_used = Instant::now();
                Some(send)
            }
            _ => None,
        }
    }

    /// A sender on an open connection: the one another request just dialled,
    /// or a new one.
    async fn connected(self: &Arc<Self>) -> Result<Sender, (FailureKind, Stage)> {
        let seen = lock(&self.shared).dials;
        let _dialing = self.dialing.lock().await;
        if let Some(send) = self.current() {
            return Ok(send);
        }
        // A dial that ended while this request waited failed: its failure is
        // this request's too (nothing was sent, so it is a connect-stage one).
        {
            let shared = lock(&self.shared);
            if shared.dials != seen {
                if let Some(failed) = shared.failed {
                    return Err(failed);
                }
            }
        }
        let dialled = self.connect().await;
        {
            let mut shared = lock(&self.shared);
            shared.dials += 1;
            shared.failed = dialled.as_ref().err().copied();
        }
        let send = dialled?;
        self.keep(send.clone());
        Ok(send)
    }

    /// Holds `send`'s connection open for the next requests.
    fn keep(self: &Arc<Self>, send: Sender) {
        let start_reaper = {
            let mut shared = lock(&self.shared);
            shared.send = Some(send);
            shared.last_used = Instant::now();
            !std::mem::replace(&mut shared.reaping, true)
        };
        if start_reaper {
            tokio::spawn(reap(Arc::downgrade(self)));
        }
    }

    /// Dials the endpoint and shakes hands.
    async fn connect(&self) -> Result<Sender, (FailureKind, Stage)> {
        let stream = super::dial(self.addr, self.connect_timeout).await?;
        handshake(stream, self.addr).await
    }

    /// True while a connection is held open for the next request.
    #[cfg(test)]
    fn is_connected(&self) -> bool {
        lock(&self.shared)
            .send
            .as_ref()
            .is_some_and(|s| !s.is_closed())
    }
}

/// Shakes hands over `io` and starts the connection's task, which marks
/// the sender closed when the connection ends.
async fn handshake<T>(io: T, addr: SocketAddr) -> Result<Sender, (FailureKind, Stage)>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = h2::client::Builder::new()
        .enable_push(false)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(|e| (classify_h2_error(&e).0, Stage::Connect))?;
    let closed = Arc::new(AtomicBool::new(false));
    let ended = Arc::clone(&closed);
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(endpoint = %addr, error = %e, "upstream h2c connection ended with an error");
        }
        ended.store(true, Ordering::Release);
    });
    Ok(Sender { send, closed })
}

/// Opens `request`'s stream on a ready connection, starts its body's pipe if
/// it has a body, and waits for the response head.
async fn start(
    mut send: h2::client::SendRequest<Bytes>,
    request: Request<AttemptBody>,
) -> Result<Response<H2Body>, (FailureKind, Stage)> {
    let (head, body) = request.into_parts();
    let end_of_stream = body.is_end_stream();
    let (response, stream) = send
        .send_request(Request::from_parts(head, ()), end_of_stream)
        // Refused before anything was written (a malformed head, say).
        .map_err(|e| (classify_h2_error(&e).0, Stage::Connect))?;
    let cancel = if end_of_stream {
        None
    } else {
        let (cancel, cancelled) = tokio::sync::oneshot::channel();
        tokio::spawn(stream::pipe(body, stream, cancelled));
        Some(cancel)
    };
    let response = response.await.map_err(|e| classify_h2_error(&e))?;
    let (parts, recv) = response.into_parts();
    let body = H2Body::new(recv, &parts.headers, cancel);
    Ok(Response::from_parts(parts, body))
}

/// Lets the connection go once no request took it for [`IDLE_TIMEOUT`] (or
/// drops it as soon as it is seen closed), waking when that time would come;
/// ends with the connection or the endpoint, and the next dial starts it again.
async fn reap(endpoint: Weak<Http2Endpoint>) {
    loop {
        let next = {
            let Some(endpoint) = endpoint.upgrade() else {
                return;
            };
            let mut shared = lock(&endpoint.shared);
            let expires = shared.last_used + IDLE_TIMEOUT;
            let closed = shared.send.as_ref().is_none_or(Sender::is_closed);
            if closed || Instant::now() >= expires {
                shared.send = None;
                shared.reaping = false;
                return;
            }
            expires
        };
        tokio::time::sleep_until(next).await;
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // Every critical section is a clone, a store or a check: a panic inside
    // one cannot leave the state inconsistent.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
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
                    async move {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(n.to_string()))))
                    }
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
        let response = endpoint.send(get(addr)).await.expect("response");
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
        let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1));
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
                            return Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
                                "early",
                            ))));
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
                Some(trailers),
            ))
            .expect("request")
    }

    #[tokio::test]
    async fn a_body_larger_than_the_window_streams_whole_and_its_trailers_follow() {
        let (addr, _) = body_upstream(false).await;
        let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1));
        // 3 MiB through a 64 KiB window: the pipe waits for capacity ~48 times.
        let response =
            tokio::time::timeout(Duration::from_secs(10), endpoint.send(post(addr, 3 << 20)))
                .await
                .expect("in time")
                .expect("response");
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes(), format!("{}/42", 3 << 20).as_bytes());
    }

    #[tokio::test]
    async fn dropping_the_response_resets_a_body_still_streaming() {
        let (addr, mut endings) = body_upstream(true).await;
        let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1));
        let response = endpoint.send(post(addr, 3 << 20)).await.expect("response");
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
        let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1));
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
        let endpoint = Http2Endpoint::new(addr, Duration::from_millis(300));
        let started = std::time::Instant::now();
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let endpoint = Arc::clone(&endpoint);
                tokio::spawn(async move { endpoint.send(get(addr)).await.map(|_| ()) })
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
        let endpoint = Http2Endpoint::new(addr, Duration::from_secs(1));
        let err = endpoint.send(get(addr)).await.expect_err("refused");
        assert_eq!(err, (FailureKind::ConnectRefused, Stage::Connect));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unused_connection_is_let_go_after_the_idle_timeout() {
        let endpoint =
            Http2Endpoint::new("127.0.0.1:1".parse().expect("addr"), Duration::from_secs(1));
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
        endpoint.keep(send);
        tokio::time::sleep(Duration::from_secs(60)).await;
        // A request 60 s in restarts the idle clock.
        let response = endpoint
            .send(get("127.0.0.1:1".parse().expect("addr")))
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
            lock(&endpoint.shared).send.is_none(),
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
}
