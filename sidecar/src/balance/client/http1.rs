//! One endpoint's HTTP/1.1 connections: a last-in-first-out stack of idle
//! connections, each driven by the request that uses it ([`conn`]) through
//! the sidecar's own HTTP/1.1 codec ([`codec`]).
//!
//! The contract:
//! - A request takes the most recently returned connection that is still
//!   open, else dials a new one (TCP_NODELAY, the upstream's connect
//!   timeout). Last-in-first-out keeps the few connections a steady load
//!   needs warm and lets the rest reach [`IDLE_TIMEOUT`], after which the
//!   reaper closes them.
//! - A pooled connection the endpoint closed while it was idle is noticed
//!   at checkout (the reactor has recorded the close: no system call in the
//!   usual case) and skipped. One that fails before a byte of the request
//!   was written gives the request back, and it goes on the next
//!   connection; the retry engine never sees a failure. Once any of it may
//!   have been written, an error is the attempt's, classified like any
//!   other. On a fresh connection a request that never left is a failure
//!   at the connect stage: nothing reached the endpoint, so it is safe to
//!   retry under any boundary.
//! - The connection comes back in the poll that yields the response body's
//!   last frame, or when a body dropped early had its rest buffered already;
//!   otherwise it closes.
//!
//! No hashing and no shared pool across endpoints: the retry loop already
//! knows which endpoint it wants. The stack sits behind one `std` mutex held
//! for a push or a pop (an uncontended lock is one atomic exchange each way;
//! nothing awaits while holding it).

pub(crate) mod conn;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::Response;
use tokio::time::Instant;

use self::conn::{Conn, Failed, Http1Body};
use super::io::EndpointIo;
use super::tls::TlsOrigin;
use super::IDLE_TIMEOUT;
use crate::exchange::failure::{FailureKind, Stage};
use crate::exchange::request::AttemptRequest;
use crate::socket::Socket;

/// The idle connections of one HTTP/1 endpoint.
#[derive(Debug)]
pub(crate) struct Http1Pool {
    addr: SocketAddr,
    connect_timeout: Duration,
    /// TLS to the endpoint, when the upstream has it.
    tls: Option<TlsOrigin>,
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
    conn: Box<Conn>,
    since: Instant,
}

impl Http1Pool {
    /// An empty pool of connections to `addr`, over TLS from `tls`.
    pub(crate) fn new(
        addr: SocketAddr,
        connect_timeout: Duration,
        tls: Option<TlsOrigin>,
    ) -> Arc<Self> {
        Arc::new(Self {
            addr,
            connect_timeout,
            tls,
            idle: Mutex::new(Idle::default()),
        })
    }

    /// Sends `request` on a pooled connection or
    /// a new one, and waits for the response headers.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut request: AttemptRequest<'_>,
    ) -> Result<Response<Http1Body>, (FailureKind, Stage)> {
        while let Some(conn) = self.checkout() {
            match conn::send(conn, request, self).await {
                Ok(response) => return Ok(response),
                Err(Failed::Unsent(unsent, e)) => {
                    tracing::trace!(endpoint = %self.addr, error = %e, "pooled connection failed before the request left; trying another");
                    request = *unsent;
                }
                Err(Failed::Sent(e)) => return Err((e.kind, e.stage)),
            }
        }
        // Boxed: dialling is the rare path, and its timer and socket futures
        // would otherwise enlarge (and be copied with) every request's future.
        let conn = Box::pin(self.connect()).await?;
        match conn::send(conn, request, self).await {
            Ok(response) => Ok(response),
            Err(Failed::Unsent(_, e)) => Err((e.kind, Stage::Connect)),
            Err(Failed::Sent(e)) => Err((e.kind, e.stage)),
        }
    }

    /// Idle connections now (closed ones not yet noticed included).
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        lock(&self.idle).conns.len()
    }

    /// The newest idle connection still open (checked outside the lock).
    fn checkout(&self) -> Option<Box<Conn>> {
        loop {
            let mut conn = lock(&self.idle).conns.pop()?.conn;
            if conn.is_open() {
                return Some(conn);
            }
        }
    }

    /// Dials the endpoint, and shakes hands when it speaks TLS (the
    /// connect timeout bounds both).
    async fn connect(&self) -> Result<Box<Conn>, (FailureKind, Stage)> {
        let deadline = Instant::now() + self.connect_timeout;
        let stream = super::dial(self.addr, self.connect_timeout).await?;
        let io = match &self.tls {
            Some(tls) => EndpointIo::Tls(Box::new(tls.handshake(stream, deadline).await?)),
            None => EndpointIo::Plain(Socket::new(stream)),
        };
        Ok(Conn::new(io))
    }

    /// Puts a connection ready for its next request on top of the stack.
    pub(crate) fn put(self: &Arc<Self>, conn: Box<Conn>) {
        let start_reaper = {
            let mut idle = lock(&self.idle);
            idle.conns.push(IdleConn {
                conn,
                since: Instant::now(),
            });
            !std::mem::replace(&mut idle.reaping, true)
        };
        if start_reaper {
            tokio::spawn(reap(Arc::downgrade(self)));
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
                .retain_mut(|c| now.duration_since(c.since) < IDLE_TIMEOUT && c.conn.is_open());
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
mod tests;
