//! What every controller listener holds a client to (the push stream's,
//! the webhook's, the metrics'), as the sidecar's admin listener does: a
//! cap on connections open at once (and, where many clients share the
//! listener, per source address), a time for the TLS handshake and each
//! request head, a time a connection may go without a byte moving either
//! way, and the HTTP settings that bound a request's head. Each listener
//! adds its own whole-request time and body limits where it reads bodies.
//!
//! A connection over a cap is closed at once; one that stalls is cut, even
//! an upgraded push stream (its writes stop moving when its sidecar stops
//! reading, while its heartbeats keep a healthy one moving). Each closing
//! is counted by reason.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Longest request head (request line and headers) read, in bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// What one listener holds its connections to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; one more is closed at once.
    pub max_connections: usize,
    /// Connections open at once from one source address.
    pub max_per_source: Option<usize>,
    /// Time for the TLS handshake, and for each request head (counted from
    /// the connection's start or its last response's end, so an idle
    /// keep-alive connection closes after it too).
    pub header_timeout: Duration,
    /// Longest a connection may go without a byte moving either way.
    pub idle_timeout: Duration,
}

/// Why a connection was closed, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Closed {
    /// Over the listener's cap.
    OverCapacity,
    /// Over the cap of its source address.
    OverSourceCapacity,
    /// No TLS handshake within the header timeout.
    HandshakeTimeout,
    /// No byte moved for the idle timeout.
    Idle,
}

impl Closed {
    /// Every reason, as the metric names them.
    pub const ALL: [Closed; 4] = [
        Closed::OverCapacity,
        Closed::OverSourceCapacity,
        Closed::HandshakeTimeout,
        Closed::Idle,
    ];

    /// The metric's `reason`.
    pub fn name(self) -> &'static str {
        match self {
            Closed::OverCapacity => "over_capacity",
            Closed::OverSourceCapacity => "over_source_capacity",
            Closed::HandshakeTimeout => "handshake_timeout",
            Closed::Idle => "idle",
        }
    }
}

/// One listener's connections: its limits, those open, those closed.
#[derive(Debug)]
pub struct Gate {
    /// The listener's name in metrics and logs (`push`, `webhook`, `metrics`).
    pub name: &'static str,
    /// Its limits.
    pub limits: Limits,
    open: AtomicU64,
    per_source: Mutex<HashMap<IpAddr, usize>>,
    closed: [AtomicU64; 4],
}

impl Gate {
    /// A listener `name` holding connections to `limits`.
    pub fn new(name: &'static str, limits: Limits) -> Arc<Self> {
        Arc::new(Gate {
            name,
            limits,
            open: AtomicU64::new(0),
            per_source: Mutex::default(),
            closed: [const { AtomicU64::new(0) }; 4],
        })
    }

    /// A slot for a connection from `peer`, or `None` (counted) when a cap
    /// is reached: the caller drops the connection.
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<Slot> {
        let source = peer.ip().to_canonical();
        let open = self.open.fetch_add(1, Ordering::AcqRel);
        if open >= self.limits.max_connections as u64 {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.count(Closed::OverCapacity);
            return None;
        }
        if let Some(max) = self.limits.max_per_source {
            let mut per_source = self.per_source.lock().unwrap_or_else(|e| e.into_inner());
            let n = per_source.entry(source).or_insert(0);
            if *n >= max {
                drop(per_source);
                self.open.fetch_sub(1, Ordering::AcqRel);
                self.count(Closed::OverSourceCapacity);
                return None;
            }
            *n += 1;
        }
        Some(Slot {
            gate: Arc::clone(self),
            source,
        })
    }

    /// Counts a connection closed for `why`.
    pub fn count(&self, why: Closed) {
        self.closed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Acquire)
    }

    /// Connections closed for `why` so far.
    pub fn closed(&self, why: Closed) -> u64 {
        self.closed[why as usize].load(Ordering::Relaxed)
    }

    /// `io`, a connection admitted in `slot`, cut when no byte moves for
    /// the idle timeout.
    pub fn watch<IO>(self: &Arc<Self>, io: IO, slot: Slot) -> Watched<IO> {
        let idle = self.limits.idle_timeout;
        Watched {
            io,
            idle,
            stall: Box::pin(tokio::time::sleep(idle)),
            _slot: slot,
        }
    }
}

/// A connection's place under its listener's caps, given back on drop.
#[derive(Debug)]
pub struct Slot {
    gate: Arc<Gate>,
    source: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gate.open.fetch_sub(1, Ordering::AcqRel);
        if self.gate.limits.max_per_source.is_some() {
            let mut per_source = self
                .gate
                .per_source
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(n) = per_source.get_mut(&self.source) {
                *n -= 1;
                if *n == 0 {
                    per_source.remove(&self.source);
                }
            }
        }
    }
}

/// A connection that fails (`TimedOut`) once no byte has moved on it, in
/// either direction, for its listener's idle timeout; it holds its slot.
#[derive(Debug)]
pub struct Watched<IO> {
    io: IO,
    idle: Duration,
    stall: Pin<Box<Sleep>>,
    _slot: Slot,
}

impl<IO> Watched<IO> {
    fn moved(&mut self) {
        self.stall.as_mut().reset(Instant::now() + self.idle);
    }

    /// When nothing moved: the stall's timer, polled so it wakes this task.
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        if self.stall.as_mut().poll(cx).is_ready() {
            self._slot.gate.count(Closed::Idle);
            // Counted once: the timer is pushed far out.
            self.stall
                .as_mut()
                .reset(Instant::now() + Duration::from_secs(86_400 * 365));
            return true;
        }
        false
    }
}

fn stalled_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no byte moved for the idle timeout",
    )
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.stalled(cx) => Poll::Ready(Err(stalled_error())),
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.stalled(cx) => Poll::Ready(Err(stalled_error())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending if self.stalled(cx) => Poll::Ready(Err(stalled_error())),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO> Watched<IO> {
    /// The connection inside.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

/// Serves HTTP on `io` with `service`: HTTP/2 when its TLS handshake chose
/// `h2`, else HTTP/1.1 (upgrades allowed), with `limits`' head timeout,
/// [`MAX_HEAD_BYTES`] of head, and h2's concurrent streams bounded to
/// `max_streams`. The version comes from ALPN, never from reading the
/// first bytes, which would read with no timeout.
pub async fn serve_http<I, S, B>(io: I, h2: bool, limits: &Limits, max_streams: u32, service: S)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let timer = hyper_util::rt::TokioTimer::new();
    if h2 {
        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .timer(timer)
            .max_concurrent_streams(max_streams)
            .max_header_list_size(MAX_HEAD_BYTES as u32)
            .max_pending_accept_reset_streams(Some(max_streams as usize))
            .serve_connection(io, service)
            .await;
    } else {
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(timer)
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(io, service)
            .with_upgrades()
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits() -> Limits {
        Limits {
            max_connections: 2,
            max_per_source: Some(1),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn connections_over_the_caps_are_refused_and_counted() {
        let gate = Gate::new("test", limits());
        let a: SocketAddr = "10.0.0.1:1000".parse().expect("addr");
        let a2: SocketAddr = "10.0.0.1:1001".parse().expect("addr");
        let b: SocketAddr = "10.0.0.2:1000".parse().expect("addr");
        let c: SocketAddr = "10.0.0.3:1000".parse().expect("addr");
        let first = gate.admit(a).expect("first");
        assert!(gate.admit(a2).is_none(), "one per source");
        let second = gate.admit(b).expect("another source");
        assert!(gate.admit(c).is_none(), "two in all");
        assert_eq!(gate.open(), 2);
        assert_eq!(gate.closed(Closed::OverCapacity), 1);
        assert_eq!(gate.closed(Closed::OverSourceCapacity), 1);
        drop(first);
        assert_eq!(gate.open(), 1);
        assert!(gate.admit(a2).is_some(), "its slot came back");
        drop(second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_where_nothing_moves_is_cut_and_one_that_moves_is_not() {
        let gate = Gate::new("test", limits());
        let (client, server) = tokio::io::duplex(64);
        let slot = gate
            .admit("10.0.0.1:1".parse().expect("addr"))
            .expect("slot");
        let mut watched = gate.watch(server, slot);
        let mut client = client;
        let talker = tokio::spawn(async move {
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(20)).await;
                client.write_all(b"x").await.expect("write");
            }
            client
        });
        let mut buf = [0u8; 8];
        let mut got = 0;
        let started = Instant::now();
        let err = loop {
            match watched.read(&mut buf).await {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert_eq!(got, 4, "each byte came within the idle timeout");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(80 + 30));
        assert_eq!(gate.closed(Closed::Idle), 1);
        drop(talker.await.expect("talker"));
        drop(watched);
        assert_eq!(gate.open(), 0, "the slot went with the connection");
    }
}
