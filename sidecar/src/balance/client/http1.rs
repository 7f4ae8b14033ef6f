//! One endpoint's HTTP/1.1 connections: a last-in-first-out stack of idle
//! `hyper::client::conn::http1` senders.
//!
//! The contract:
//! - A request takes the most recently returned connection that is still
//!   open, else dials a new one (TCP_NODELAY, the upstream's connect
//!   timeout). Last-in-first-out keeps the few connections a steady load
//!   needs warm and lets the rest reach [`IDLE_TIMEOUT`], after which the
//!   reaper closes them.
//! - A pooled connection that closed while idle and hyper had not noticed
//!   yet gives the request back unsent (hyper guarantees not a byte of it was
//!   written); it is sent on the next connection, and the retry engine never
//!   sees a failure. Once any of it may have been written, an error is the
//!   attempt's, classified like any other. On a fresh connection a request
//!   given back unsent is a failure at the connect stage: nothing reached
//!   the endpoint, so it is safe to retry under any boundary.
//! - The connection comes back when the response body ends ([`Lease`]),
//!   synchronously when hyper is ready for the next request then (the usual
//!   case); a body dropped before its end, or a request body still
//!   streaming, is finished by a small task that returns the connection only
//!   if hyper drains it cleanly.
//!
//! No hashing and no shared pool across endpoints: the retry loop already
//! knows which endpoint it wants. The stack sits behind one `std` mutex held
//! for a push or a pop (an uncontended lock is one atomic exchange each way;
//! nothing awaits while holding it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::IDLE_TIMEOUT;
use crate::retry::failure::{classify_send_error, FailureKind, Stage};
use crate::retry::replay_body::AttemptBody;

/// The idle connections of one HTTP/1 endpoint.
#[derive(Debug)]
pub(crate) struct Http1Pool {
    addr: SocketAddr,
    connect_timeout: Duration,
    idle: Mutex<Idle>,
}

#[derive(Debug, Default)]
struct Idle {
    /// Oldest first: a checkout pops the newest, the reaper trims the front.
    conns: Vec<IdleConn>,
    /// True while a reaper task watches `conns`.
    reaping: bool,
}

#[derive(Debug)]
struct IdleConn {
    send: SendRequest<AttemptBody>,
    since: Instant,
}

/// A connection lent to one exchange, given back by [`Lease::release`].
#[derive(Debug)]
pub(crate) struct Lease {
    pool: Arc<Http1Pool>,
    send: SendRequest<AttemptBody>,
}

impl Http1Pool {
    /// An empty pool of connections to `addr`.
    pub(crate) fn new(addr: SocketAddr, connect_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            addr,
            connect_timeout,
            idle: Mutex::new(Idle::default()),
        })
    }

    /// Sends `request` (origin-form URI, `Host` set) on a pooled connection or
    /// a new one, and waits for the response headers.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut request: Request<AttemptBody>,
    ) -> Result<(Response<Incoming>, Lease), (FailureKind, Stage)> {
        while let Some(mut send) = self.checkout() {
            match send.try_send_request(request).await {
                Ok(response) => return Ok((response, self.lease(send))),
                Err(mut e) => match e.take_message() {
                    // Closed while idle: nothing was written, the next one gets it.
                    Some(unsent) => {
                        tracing::trace!(endpoint = %self.addr, "pooled connection had closed; request not sent, trying another");
                        request = unsent;
                    }
                    None => return Err(classify_send_error(e.error())),
                },
            }
        }
        // Boxed: dialling is the rare path, and its timer and socket futures
        // would otherwise enlarge (and be copied with) every request's future.
        let mut send = Box::pin(self.connect()).await?;
        match send.try_send_request(request).await {
            Ok(response) => Ok((response, self.lease(send))),
            Err(e) => Err(super::fresh_connection_failure(&e)),
        }
    }

    /// Idle connections now (closed ones not yet noticed included).
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        lock(&self.idle).conns.len()
    }

    /// The newest idle connection still open.
    fn checkout(&self) -> Option<SendRequest<AttemptBody>> {
        let mut idle = lock(&self.idle);
        while let Some(conn) = idle.conns.pop() {
            if !conn.send.is_closed() {
                return Some(conn.send);
            }
        }
        None
    }

    fn lease(self: &Arc<Self>, send: SendRequest<AttemptBody>) -> Lease {
        Lease {
            pool: Arc::clone(self),
            send,
        }
    }

    /// Dials the endpoint and starts the connection's task.
    async fn connect(&self) -> Result<SendRequest<AttemptBody>, (FailureKind, Stage)> {
        let stream = super::dial(self.addr, self.connect_timeout).await?;
        let (send, conn) = Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| (classify_send_error(&e).0, Stage::Connect))?;
        let addr = self.addr;
        tokio::spawn(async move {
            // With upgrades: a `101` hands the socket to the WebSocket bridge.
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(endpoint = %addr, error = %e, "upstream connection ended with an error");
            }
        });
        Ok(send)
    }

    /// Puts a connection ready for its next request on top of the stack.
    fn put(self: &Arc<Self>, send: SendRequest<AttemptBody>) {
        let start_reaper = {
            let mut idle = lock(&self.idle);
            idle.conns.push(IdleConn {
                send,
                since: Instant::now(),
            });
            !std::mem::replace(&mut idle.reaping, true)
        };
        if start_reaper {
            tokio::spawn(reap(Arc::downgrade(self)));
        }
    }
}

impl Lease {
    /// The exchange is over for the caller: the connection goes back now if
    /// hyper is ready for another request, later if it is still finishing
    /// this one, never if it closed.
    pub(crate) fn release(self) {
        let Lease { pool, mut send } = self;
        if send.is_ready() {
            pool.put(send);
        } else if !send.is_closed() {
            let pool = Arc::downgrade(&pool);
            tokio::spawn(async move {
                if send.ready().await.is_ok() {
                    if let Some(pool) = pool.upgrade() {
                        pool.put(send);
                    }
                }
            });
        }
    }
}

/// Closes connections idle for [`IDLE_TIMEOUT`] (and drops the ones the
/// endpoint closed), waking when the oldest expires; ends when none is left
/// or the pool is gone, and `put` starts it again.
async fn reap(pool: Weak<Http1Pool>) {
    loop {
        let next = {
            let Some(pool) = pool.upgrade() else {
                return;
            };
            let mut idle = lock(&pool.idle);
            let now = Instant::now();
            idle.conns
                .retain(|c| now.duration_since(c.since) < IDLE_TIMEOUT && !c.send.is_closed());
            match idle.conns.first() {
                Some(oldest) => oldest.since + IDLE_TIMEOUT,
                None => {
                    idle.reaping = false;
                    return;
                }
            }
        };
        tokio::time::sleep_until(next).await;
    }
}

fn lock(idle: &Mutex<Idle>) -> MutexGuard<'_, Idle> {
    // Every critical section is a push, a pop or a trim: a panic inside one
    // cannot leave the stack inconsistent.
    idle.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

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

    fn get() -> Request<AttemptBody> {
        Request::builder()
            .uri("/")
            .header(http::header::HOST, "api")
            .body(AttemptBody::Empty)
            .expect("request")
    }

    /// Sends a GET and reads its body to the end (the connection goes back).
    async fn fetch(pool: &Arc<Http1Pool>) -> String {
        let (response, lease) = pool.send(get()).await.expect("response");
        let mut body = super::super::EndpointBody {
            inner: response.into_body(),
            lease: Some(lease),
        };
        let mut text = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.expect("frame").into_data() {
                text.extend_from_slice(&data);
            }
        }
        String::from_utf8(text).expect("utf-8")
    }

    fn pool(addr: SocketAddr) -> Arc<Http1Pool> {
        Http1Pool::new(addr, Duration::from_secs(1))
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
        let (first, lease1) = pool.send(get()).await.expect("response");
        let (second, lease2) = pool.send(get()).await.expect("response");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        let body = |r: Response<Incoming>, l| super::super::EndpointBody {
            inner: r.into_body(),
            lease: Some(l),
        };
        let (mut a, mut b) = (body(first, lease1), body(second, lease2));
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
        drop(a);
        drop(b);
        assert_eq!(pool.idle_count(), 2);
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

    #[tokio::test]
    async fn a_request_given_back_unsent_goes_on_another_connection() {
        let (addr, accepted) = upstream().await;
        let pool = pool(addr);
        // A pooled connection whose peer has just closed, before hyper's
        // task has run to see it: the request is queued on it, hyper reads
        // the end of the stream first and hands the request back unwritten.
        let (client, server) = tokio::io::duplex(1024);
        let (send, conn) = Builder::new()
            .handshake::<_, AttemptBody>(TokioIo::new(client))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        pool.put(send);
        drop(server);
        assert_eq!(fetch(&pool).await, "1", "sent once, on a fresh connection");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_is_drained_and_the_connection_reused() {
        let (addr, accepted) = upstream().await;
        let pool = pool(addr);
        let (response, lease) = pool.send(get()).await.expect("response");
        drop(super::super::EndpointBody {
            inner: response.into_body(),
            lease: Some(lease),
        });
        for _ in 0..50 {
            if pool.idle_count() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
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
        let (response, lease) = pool.send(get()).await.expect("response");
        let mut body = super::super::EndpointBody {
            inner: response.into_body(),
            lease: Some(lease),
        };
        let first = body.frame().await.expect("frame").expect("data");
        assert_eq!(first.into_data().expect("data"), "partial");
        // 993 bytes are still owed: hyper cannot reuse this connection, so
        // the pool must not get it back, now or once hyper has closed it.
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
        let (response, lease) = pool.send(get()).await.expect("response");
        let mut body = super::super::EndpointBody {
            inner: response.into_body(),
            lease: Some(lease),
        };
        let mut failed = false;
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "the endpoint closed 993 bytes short");
        assert!(body.lease.is_none(), "the lease is given up at the error");
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
        // In-memory connections: nothing here depends on real time.
        let (mut ends, mut servers) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            let (client, server) = tokio::io::duplex(1024);
            let (send, conn) = Builder::new()
                .handshake::<_, AttemptBody>(TokioIo::new(client))
                .await
                .expect("handshake");
            ends.push(tokio::spawn(conn));
            servers.push(server);
            pool.put(send);
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        // The first went in 60 s ago, the second 30 s ago.
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert_eq!(pool.idle_count(), 2);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(pool.idle_count(), 1, "the oldest is gone after 90 s");
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(pool.idle_count(), 0);
        assert!(
            !lock(&pool.idle).reaping,
            "the reaper stops with nothing to watch"
        );
    }
}
