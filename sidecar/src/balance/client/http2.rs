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
mod tests;
