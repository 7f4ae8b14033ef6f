//! One h2c endpoint's connections: HTTP/2 connections of the h2 crate that
//! requests to the endpoint multiplex over, a new one opened when every
//! stream the endpoint allows on the others is taken.
//!
//! The contract:
//! - A request takes the first connection with a free stream: fewer streams
//!   open than the endpoint's `SETTINGS_MAX_CONCURRENT_STREAMS` (counted by
//!   the sidecar: a stream is open from the request until its response body
//!   ends or is dropped). When none has one, it dials another, up to
//!   [`MAX_CONNECTIONS`]; past that, or when a dial fails while a connection
//!   is open, the stream waits in the h2 crate on the least loaded
//!   connection. Envoy opens connections the same way; with one connection,
//!   streams past HAProxy's default limit of 100, nginx's 128 or Go's 250
//!   waited for a free one although the endpoint would take more on a new
//!   connection.
//! - Requests arriving during a dial wait for that dial instead of opening
//!   connections of their own, and share its failure when it fails and no
//!   connection is open (a dead endpoint costs one connect timeout per
//!   burst, not one per waiting request in turn).
//! - A request the connection can no longer take (it had closed and we had
//!   not seen it yet) goes on another connection inside the same call, so
//!   the retry engine sees no failure; on a fresh connection the same thing
//!   is a failure at the connect stage (nothing reached the endpoint).
//! - A connection with no stream open and none started for [`IDLE_TIMEOUT`]
//!   is let go: dropping its last sender lets it finish what is still in
//!   flight, then close.
//!
//! The h2 crate is used directly, not through hyper's client: hyper's adds,
//! per request, a dispatch channel to the connection's task, a oneshot for
//! the response, a task spawned to await it and another oneshot to cancel
//! the body's pipe, and a task allocation per request (measured:
//! `e2e/bench/results/2026-12-02-issue18-h2c-client.md`). Here the stream is
//! opened in the caller's task and its response awaited there; only a
//! request with a body spawns a task, to stream it ([`stream::pipe`]).
//! Streams a GOAWAY cuts off before the endpoint took them fail as resets,
//! as they did through hyper (the h2 crate reports them the same way).

mod stream;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Scheme;
use http::{Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

pub(crate) use self::stream::H2Body;
use super::tls::TlsOrigin;
use super::IDLE_TIMEOUT;
use crate::exchange::body::replay::AttemptBody;
use crate::exchange::failure::{classify_h2_error, FailureKind, Stage};
use crate::socket::Socket;

/// Per-stream receive window: hyper's client default, kept from when the
/// endpoints' h2c connections were hyper's (2 MiB; 5 MiB for the connection).
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;
/// Response heads up to 16 KiB, and 1 MiB of request data buffered per
/// stream: hyper's client defaults too.
const MAX_HEADER_LIST: u32 = 16 << 10;
const MAX_SEND_BUFFER: usize = 1 << 20;

/// Connections to one endpoint at most: 800 streams at HAProxy's default
/// limit, more than one sidecar's application keeps in flight to one pod
/// (Envoy's default circuit breaker allows 1,024 requests per cluster).
pub(crate) const MAX_CONNECTIONS: usize = 8;

/// The connections to one HTTP/2 endpoint (h2c, or h2 over TLS).
#[derive(Debug)]
pub(crate) struct Http2Endpoint {
    addr: SocketAddr,
    connect_timeout: Duration,
    /// TLS to the endpoint (`h2`), when the upstream has it.
    tls: Option<TlsOrigin>,
    shared: Mutex<Shared>,
    /// Held while dialling, so that one request dials and the rest wait.
    dialing: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Shared {
    /// The connections held open, in the order they were dialled.
    conns: Vec<Held>,
    /// True while a reaper task watches `conns`.
    reaping: bool,
    /// Dials finished so far, and how the latest failed, if it did.
    dials: u64,
    failed: Option<(FailureKind, Stage)>,
}

#[derive(Debug)]
struct Held {
    sender: Sender,
    /// When a request last took the connection.
    last_used: Instant,
}

/// A handle on one connection, whether its task has ended, and the streams
/// open on it.
#[derive(Debug)]
struct Sender {
    send: h2::client::SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
}

impl Sender {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn open_streams(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Fewer streams open than the endpoint allows (unlimited until its
    /// SETTINGS arrive, as the h2 crate counts).
    fn has_room(&self) -> bool {
        self.open_streams() < self.send.current_max_send_streams()
    }

    /// A handle for one more stream, counted until the slot is dropped.
    fn take(&self) -> (h2::client::SendRequest<Bytes>, StreamSlot) {
        self.open.fetch_add(1, Ordering::AcqRel);
        (self.send.clone(), StreamSlot(Arc::clone(&self.open)))
    }
}

/// One stream counted against its connection until dropped (with the
/// response body, or with the attempt when it fails first).
#[derive(Debug)]
pub(crate) struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a request may take a connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Take {
    /// Only one with a free stream (a new one may be dialled).
    Free,
    /// The least loaded one if none has a free stream: no dial will help.
    Any,
}

impl Http2Endpoint {
    /// No connection yet to `addr`, over TLS from `tls` when given.
    pub(crate) fn new(
        addr: SocketAddr,
        connect_timeout: Duration,
        tls: Option<TlsOrigin>,
    ) -> Arc<Self> {
        Arc::new(Self {
            addr,
            connect_timeout,
            tls,
            shared: Mutex::new(Shared {
                conns: Vec::new(),
                reaping: false,
                dials: 0,
                failed: None,
            }),
            dialing: tokio::sync::Mutex::new(()),
        })
    }

    /// Sends `request` (absolute URI: scheme and authority become the
    /// pseudo-headers) at `now` (the caller's clock reading, the connection's
    /// last use) and waits for the response headers.
    ///
    /// One async fn from the stream's handle to the response head: the
    /// request goes into the h2 crate synchronously ([`open`]) once a
    /// connection is ready, so no inner future holds a copy of it. With the
    /// opening in a future of its own this future was larger, and every
    /// request copied it on the way in (measured:
    /// `e2e/bench/results/2026-12-04-issue18-h2c-reference.md`).
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: Request<AttemptBody>,
        now: Instant,
    ) -> Result<Response<H2Body>, (FailureKind, Stage)> {
        let ready = match self.current(Take::Free, now) {
            Some((send, slot)) => match send.ready().await {
                Ok(send) => Some((send, slot)),
                Err(e) => {
                    tracing::trace!(endpoint = %self.addr, error = %e, "h2c connection had closed; request not sent, taking another");
                    None
                }
            },
            None => None,
        };
        let (send, slot) = match ready {
            Some(ready) => ready,
            // Boxed: dialling is the rare path, and its futures would
            // otherwise enlarge (and be copied with) every request's future.
            None => Box::pin(self.fresh()).await?,
        };
        let head = request.method() == http::Method::HEAD;
        let (response, cancel) = open(send, request)?;
        let response = response.await.map_err(|e| classify_h2_error(&e))?;
        let (parts, recv) = response.into_parts();
        let content = !head
            && !matches!(
                parts.status,
                http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
            );
        let body = H2Body::new(recv, &parts.headers, content, cancel, slot);
        Ok(Response::from_parts(parts, body))
    }

    /// A stream on a connection ready for it: one another request just
    /// dialled, or a new one.
    async fn fresh(
        self: &Arc<Self>,
    ) -> Result<(h2::client::SendRequest<Bytes>, StreamSlot), (FailureKind, Stage)> {
        let (send, slot) = self.connected().await?;
        match send.ready().await {
            Ok(send) => Ok((send, slot)),
            Err(e) => Err((classify_h2_error(&e).0, Stage::Connect)),
        }
    }

    /// A stream on an open connection, the connection stamped as used at
    /// `now`: the first with a free stream; with [`Take::Any`], or once
    /// [`MAX_CONNECTIONS`] are open, the least loaded if none has one.
    fn current(
        &self,
        take: Take,
        now: Instant,
    ) -> Option<(h2::client::SendRequest<Bytes>, StreamSlot)> {
        let mut shared = lock(&self.shared);
        shared.conns.retain(|held| !held.sender.is_closed());
        let index = shared
            .conns
            .iter()
            .position(|held| held.sender.has_room())
            .or_else(|| {
                if take == Take::Free && shared.conns.len() < MAX_CONNECTIONS {
                    return None;
                }
                (0..shared.conns.len()).min_by_key(|&i| shared.conns[i].sender.open_streams())
            })?;
        let held = &mut shared.conns[index];
        held.last_used = now;
        Some(held.sender.take())
    }

    /// A stream on an open connection: one another request just dialled, or
    /// a new one.
    async fn connected(
        self: &Arc<Self>,
    ) -> Result<(h2::client::SendRequest<Bytes>, StreamSlot), (FailureKind, Stage)> {
        let seen = lock(&self.shared).dials;
        let _dialing = self.dialing.lock().await;
        if let Some(stream) = self.current(Take::Free, Instant::now()) {
            return Ok(stream);
        }
        // A dial that ended while this request waited failed: its failure is
        // this request's too (nothing was sent, so it is a connect-stage
        // one), unless a connection is open to wait on.
        let failed = {
            let shared = lock(&self.shared);
            shared.failed.filter(|_| shared.dials != seen)
        };
        if let Some(failed) = failed {
            return self.current(Take::Any, Instant::now()).ok_or(failed);
        }
        let dialled = self.connect().await;
        {
            let mut shared = lock(&self.shared);
            shared.dials += 1;
            shared.failed = dialled.as_ref().err().copied();
        }
        match dialled {
            Ok(sender) => Ok(self.keep(sender)),
            Err(failed) => self.current(Take::Any, Instant::now()).ok_or(failed),
        }
    }

    /// Holds `sender`'s connection open for the next requests; a stream on
    /// it for this one.
    fn keep(self: &Arc<Self>, sender: Sender) -> (h2::client::SendRequest<Bytes>, StreamSlot) {
        let (stream, start_reaper) = {
            let mut shared = lock(&self.shared);
            let stream = sender.take();
            shared.conns.push(Held {
                sender,
                last_used: Instant::now(),
            });
            (stream, !std::mem::replace(&mut shared.reaping, true))
        };
        if start_reaper {
            tokio::spawn(reap(Arc::downgrade(self)));
        }
        stream
    }

    /// Keeps a connection another dialled and shook TLS hands on, and that
    /// selected `h2` (`protocol: auto`'s first connection).
    pub(crate) async fn adopt<T>(self: &Arc<Self>, io: T) -> Result<(), (FailureKind, Stage)>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let sender = handshake(io, self.addr).await?;
        drop(self.keep(sender));
        Ok(())
    }

    /// `https` over TLS, `http` in clear: the `:scheme` of its requests.
    pub(crate) fn scheme(&self) -> Scheme {
        if self.tls.is_some() {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        }
    }

    /// Dials the endpoint and shakes hands: TLS first when the upstream has
    /// it (the connect timeout bounds the connect and that handshake).
    async fn connect(&self) -> Result<Sender, (FailureKind, Stage)> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let stream = super::dial(self.addr, self.connect_timeout).await?;
        match &self.tls {
            Some(tls) => handshake(tls.handshake(stream, deadline).await?, self.addr).await,
            None => handshake(Socket::new(stream), self.addr).await,
        }
    }

    /// Connections held open now (closed ones not yet seen included).
    #[cfg(test)]
    fn connections(&self) -> usize {
        lock(&self.shared).conns.len()
    }

    /// True while a connection is held open for the next request.
    #[cfg(test)]
    fn is_connected(&self) -> bool {
        lock(&self.shared)
            .conns
            .iter()
            .any(|held| !held.sender.is_closed())
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
    Ok(Sender {
        send,
        closed,
        open: Arc::new(AtomicUsize::new(0)),
    })
}

/// A stream's response head to wait for, and what cancels its body's pipe
/// (none without a body).
type Opened = (
    h2::client::ResponseFuture,
    Option<tokio::sync::oneshot::Sender<()>>,
);

/// Opens `request`'s stream on a ready connection and starts its body's
/// pipe if it has a body.
fn open(
    mut send: h2::client::SendRequest<Bytes>,
    request: Request<AttemptBody>,
) -> Result<Opened, (FailureKind, Stage)> {
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
    Ok((response, cancel))
}

/// Lets connections go once no stream is open on them and none started
/// for [`IDLE_TIMEOUT`] (and drops those seen closed), waking when the next
/// would expire; ends when none is held or the endpoint is gone, and the
/// next dial starts it again.
async fn reap(endpoint: Weak<Http2Endpoint>) {
    loop {
        let next = {
            let Some(endpoint) = endpoint.upgrade() else {
                return;
            };
            let mut shared = lock(&endpoint.shared);
            let now = Instant::now();
            shared.conns.retain_mut(|held| {
                if held.sender.open_streams() > 0 {
                    // In use: as good as used now.
                    held.last_used = now;
                }
                !held.sender.is_closed() && now < held.last_used + IDLE_TIMEOUT
            });
            match shared.conns.iter().map(|held| held.last_used).min() {
                Some(oldest) => oldest + IDLE_TIMEOUT,
                None => {
                    shared.reaping = false;
                    return;
                }
            }
        };
        tokio::time::sleep_until(next).await;
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // Every critical section is a scan, a push or a trim: a panic inside one
    // cannot leave the state inconsistent.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
