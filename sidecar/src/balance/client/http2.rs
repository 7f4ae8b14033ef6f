//! One h2c endpoint's connection: a single `hyper::client::conn::http2`
//! connection that every request to the endpoint multiplexes over.
//!
//! The contract:
//! - Requests share one connection. The first request dials it, and so does
//!   the first after it closed (the endpoint went away, or sent GOAWAY and
//!   its streams finished); requests arriving during a dial wait for that
//!   dial instead of opening connections of their own, and share its
//!   failure when it fails (a dead endpoint costs one connect timeout per
//!   burst, not one per waiting request in turn).
//! - A request the connection never took (it had closed and hyper had not
//!   told us yet) goes on a fresh connection inside the same call, so the
//!   retry engine sees no failure; on a fresh connection the same thing is
//!   a failure at the connect stage (nothing reached the endpoint).
//! - Streams beyond the endpoint's `SETTINGS_MAX_CONCURRENT_STREAMS` wait in
//!   hyper for a free one, as they did with hyper-util's client.
//! - A connection no request used for [`IDLE_TIMEOUT`] is let go: dropping
//!   the last sender lets hyper finish the streams still open, then close.
//!
//! Against hyper-util's pooled client this skips, per request, the pool
//! key's hashing, its shared lock and its checkout future: one `std` mutex
//! held to clone a sender and stamp the time.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Instant;

use super::IDLE_TIMEOUT;
use crate::retry::failure::{classify_send_error, FailureKind, Stage};
use crate::retry::replay_body::AttemptBody;

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
    send: Option<SendRequest<AttemptBody>>,
    /// When a request last took the connection.
    last_used: Instant,
    /// True while a reaper task watches `last_used`.
    reaping: bool,
    /// Dials finished so far, and how the latest failed, if it did.
    dials: u64,
    failed: Option<(FailureKind, Stage)>,
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
        mut request: Request<AttemptBody>,
    ) -> Result<Response<Incoming>, (FailureKind, Stage)> {
        if let Some(mut send) = self.current() {
            match send.try_send_request(request).await {
                Ok(response) => return Ok(response),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => {
                        tracing::trace!(endpoint = %self.addr, "h2c connection had closed; request not sent, dialling again");
                        request = unsent;
                    }
                    None => return Err(classify_send_error(e.error())),
                },
            }
        }
        // Boxed: dialling is the rare path, and its futures would otherwise
        // enlarge (and be copied with) every request's future.
        let mut send = Box::pin(self.connected()).await?;
        match send.try_send_request(request).await {
            Ok(response) => Ok(response),
            Err(e) => Err(super::fresh_connection_failure(&e)),
        }
    }

    /// The open connection's sender, stamped as used now.
    fn current(&self) -> Option<SendRequest<AttemptBody>> {
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
    async fn connected(self: &Arc<Self>) -> Result<SendRequest<AttemptBody>, (FailureKind, Stage)> {
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
    fn keep(self: &Arc<Self>, send: SendRequest<AttemptBody>) {
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

    /// Dials the endpoint, shakes hands and starts the connection's task.
    async fn connect(&self) -> Result<SendRequest<AttemptBody>, (FailureKind, Stage)> {
        let stream = super::dial(self.addr, self.connect_timeout).await?;
        let (send, conn) = Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| (classify_send_error(&e).0, Stage::Connect))?;
        let addr = self.addr;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(endpoint = %addr, error = %e, "upstream h2c connection ended with an error");
            }
        });
        Ok(send)
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
            let closed = shared.send.as_ref().is_none_or(SendRequest::is_closed);
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
        let (send, conn) = Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake::<_, AttemptBody>(TokioIo::new(client))
            .await
            .expect("handshake");
        tokio::spawn(conn);
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
