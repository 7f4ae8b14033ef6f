//! Connections the proxy hands over to raw bytes: CONNECT tunnels and
//! protocol upgrades such as WebSocket (forwarded once). A CONNECT to a
//! known upstream is answered here and its tunnel handed to the server that
//! answered ([`OpenTunnel`]), which unwraps HTTP inside it (its requests
//! retried like any other) or relays anything else opaquely, never retried.
//! Each open tunnel holds a [`Tunnels`] guard, so the drain counts it as in
//! flight and waits for it, up to the drain timeout.

pub(crate) mod h2_stream;
pub(crate) mod relay;
pub(crate) mod upgrade;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;

use self::h2_stream::PendingTunnel;
use self::upgrade::ClientUpgrade;
use super::body::ProxyBody;
use super::local::Local;
use crate::exchange::body::ClientBody;
use crate::retry::upstream::UpstreamState;

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

/// CONNECT to a host `upstream` answers to: `200`, with the tunnel in the
/// response's extensions ([`OpenTunnel`]) for the server that answered to
/// carry once the answer is out: HTTP/1.x or the h2c preface inside is
/// served as a new client connection, its requests routed to `upstream`
/// with its retries (what a gRPC or HTTP client that honours `http_proxy`
/// sends); a TLS handshake, or silence, is an opaque TCP tunnel to one
/// endpoint, never retried.
pub(crate) fn connect(
    mut req: Request<ClientBody>,
    upstream: Arc<UpstreamState>,
    tunnels: &Tunnels,
) -> Response<ProxyBody> {
    if upstream.endpoints.is_empty() {
        return Local::no_endpoint(&upstream).into_response();
    }
    let guard = tunnels.open();
    let client = match req.extensions_mut().remove::<PendingTunnel>() {
        Some(h2) => TunnelClient::H2(h2),
        None => TunnelClient::Http1(ClientUpgrade::take(&mut req)),
    };
    let mut response = Response::new(ProxyBody::Local(None));
    response
        .extensions_mut()
        .insert(OpenTunnel(Arc::new(Mutex::new(Some(Tunnel {
            client,
            upstream,
            open: guard,
        })))));
    response
}

/// A CONNECT answered `200`, in its response's extensions until the server
/// that answered takes it ([`OpenTunnel::take`]). An extension must be
/// `Clone`; only the first to take it gets the tunnel.
#[derive(Clone)]
pub(crate) struct OpenTunnel(Arc<Mutex<Option<Tunnel>>>);

impl std::fmt::Debug for OpenTunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenTunnel")
    }
}

/// One open tunnel: the client's side, the upstream it goes to, and its
/// count in [`Tunnels`] (held until the tunnel ends).
#[derive(Debug)]
pub(crate) struct Tunnel {
    /// The client's side once the `200` is out.
    pub(crate) client: TunnelClient,
    /// Where the tunnel goes.
    pub(crate) upstream: Arc<UpstreamState>,
    /// Its count in [`Tunnels`], held until the tunnel ends.
    pub(crate) open: TunnelGuard,
}

/// The client's side of a tunnel: its HTTP/1 connection, or the h2c stream.
#[derive(Debug)]
pub(crate) enum TunnelClient {
    /// The CONNECT came on an h2c stream.
    H2(PendingTunnel),
    /// The CONNECT came on an HTTP/1 connection.
    Http1(ClientUpgrade),
}

impl OpenTunnel {
    /// Takes the tunnel out of `response`, if it opened one.
    pub(crate) fn take(response: &mut Response<ProxyBody>) -> Option<Tunnel> {
        let OpenTunnel(slot) = response.extensions_mut().remove::<OpenTunnel>()?;
        let tunnel = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        tunnel
    }
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
