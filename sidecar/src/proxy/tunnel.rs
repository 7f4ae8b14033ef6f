//! Connections the proxy hands over to raw bytes: CONNECT tunnels and
//! protocol upgrades such as WebSocket (forwarded once). A tunnel to a known
//! upstream that carries HTTP is unwrapped and its requests retried like any
//! other; one that carries TLS (or anything else) stays opaque and is never
//! retried. Each open tunnel holds a [`Tunnels`] guard, so the
//! drain counts it as in flight and waits for it, up to the drain timeout.

pub(crate) mod h2_stream;
pub(crate) mod relay;
pub(crate) mod upgrade;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use http::{Request, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::Notify;

use self::h2_stream::PendingTunnel;
use self::upgrade::ClientUpgrade;
use super::body::ProxyBody;
use super::local::Local;
use super::route::Destination;
use super::Proxy;
use crate::exchange::body::ClientBody;
use crate::exchange::outcome::{Outcome, SkipReason};
use crate::exchange::prefixed::Prefixed;
use crate::retry::upstream::UpstreamState;
use crate::server::{self, FIRST_BYTES_WAIT, HEADER_READ_TIMEOUT};

/// Tunnels open now.
#[derive(Debug, Default)]
pub(crate) struct Tunnels(Arc<TunnelCount>);

#[derive(Debug, Default)]
struct TunnelCount {
    open: AtomicUsize,
    closed: Notify,
}

/// One open tunnel; dropping it closes its count.
#[derive(Debug)]
pub(crate) struct TunnelGuard(Arc<TunnelCount>);

impl Tunnels {
    /// Counts one tunnel until the guard is dropped.
    pub(crate) fn open(&self) -> TunnelGuard {
        self.0.open.fetch_add(1, Ordering::AcqRel);
        TunnelGuard(Arc::clone(&self.0))
    }

    /// Resolves once no tunnel is open.
    pub(crate) async fn idle(&self) {
        loop {
            let closed = self.0.closed.notified();
            if self.0.open.load(Ordering::Acquire) == 0 {
                return;
            }
            closed.await;
        }
    }
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed.notify_waiters();
        }
    }
}

/// The first byte of a TLS record carrying a handshake (RFC 8446 §5.1).
const TLS_HANDSHAKE: u8 = 0x16;

/// CONNECT to a host `upstream` answers to: `200`, then the tunnel's bytes
/// decide. HTTP/1.x or the h2c preface is served here as a new client
/// connection, its requests routed to `upstream` with its retries (what a
/// gRPC or HTTP client that honours `http_proxy` sends); a TLS handshake, or
/// silence, is an opaque TCP tunnel to one endpoint, never retried.
pub(crate) fn connect(
    mut req: Request<ClientBody>,
    upstream: Arc<UpstreamState>,
    proxy: Arc<Proxy>,
) -> Response<ProxyBody> {
    if upstream.endpoints.is_empty() {
        return Local::NoEndpoint(&upstream.config.name).into_response();
    }
    let guard = proxy.tunnels().open();
    let h2 = req.extensions_mut().remove::<PendingTunnel>();
    let http1 = h2.is_none().then(|| ClientUpgrade::take(&mut req));
    tokio::spawn(async move {
        let _open = guard;
        // The client's side once the `200` is out: its HTTP/1 connection,
        // or the h2c stream itself.
        match (h2, http1) {
            (Some(pending), _) => {
                if let Some(stream) = pending.opened().await {
                    carry(stream, upstream, proxy).await;
                }
            }
            (None, Some(upgrade)) => {
                if let Some(io) = upgrade.switched().await {
                    carry(io, upstream, proxy).await;
                }
            }
            (None, None) => {}
        }
    });
    Response::new(ProxyBody::Local(None))
}

/// The tunnel's bytes, by what the client sends first: HTTP served inside,
/// anything else (or silence) relayed opaquely.
async fn carry<T>(mut io: T, upstream: Arc<UpstreamState>, proxy: Arc<Proxy>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut first = BytesMut::with_capacity(4096);
    // Silence for FIRST_BYTES_WAIT leaves `first` empty: a server-first protocol.
    let read = tokio::time::timeout(FIRST_BYTES_WAIT, io.read_buf(&mut first)).await;
    if let Ok(Ok(0) | Err(_)) = read {
        return;
    }
    if first.first().is_none_or(|b| *b == TLS_HANDSHAKE) {
        relay_to_upstream(Prefixed::new(first.freeze(), io), &upstream).await;
        return;
    }
    // HTTP/1 or h2c: a first read that stopped inside the HTTP/2 preface
    // waits for the rest, within the header read timeout.
    let more = async {
        loop {
            if let Some(protocol) = server::tunnelled(&first) {
                return Some(protocol);
            }
            if !matches!(io.read_buf(&mut first).await, Ok(n) if n > 0) {
                return None;
            }
        }
    };
    let Ok(Some(protocol)) = tokio::time::timeout(HEADER_READ_TIMEOUT, more).await else {
        return;
    };
    // Requests go to `upstream` unless their own host names another; it is
    // looked up by name per request, so a long-lived tunnel follows reloads
    // (and does not keep a replaced upstream's state alive).
    let dest = Destination::Tunnel(Arc::from(upstream.config.name.as_str()));
    drop(upstream);
    server::serve_tunnelled(Prefixed::new(first.freeze(), io), protocol, dest, proxy).await;
}

/// An opaque tunnel: the bytes relayed to one endpoint of `upstream`.
async fn relay_to_upstream<T>(mut io: T, upstream: &UpstreamState)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let Ok(mut stream) = relay::connect_upstream(upstream).await else {
        upstream
            .metrics
            .record_outcome(Outcome::Skipped(SkipReason::Tunnel));
        return;
    };
    upstream.metrics.record_outcome(Outcome::Ok);
    relay::copy(&mut io, &mut stream).await;
}

/// Joins the client's upgraded connection, once it has switched protocols,
/// to the endpoint's (already switched: its `101` has arrived).
pub(crate) fn bridge<S>(client: ClientUpgrade, mut server: S, tunnels: &Tunnels)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let guard = tunnels.open();
    tokio::spawn(async move {
        let _open = guard;
        if let Some(mut client) = client.switched().await {
            relay::copy(&mut client, &mut server).await;
        }
    });
}
