//! A CONNECT tunnel once its `200` is out (`proxy::tunnel` answered it):
//! the tunnel's first bytes decide. HTTP/1.x or the h2c preface is served
//! by this listener's own servers as a new client connection, its requests
//! routed to the tunnel's upstream; a TLS handshake, or silence, is relayed
//! opaquely to one endpoint and never retried.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::{serve_tunnelled, tunnelled, FIRST_BYTES_WAIT, HEADER_READ_TIMEOUT};
use crate::exchange::outcome::{Outcome, SkipReason};
use crate::exchange::prefixed::Prefixed;
use crate::proxy::route::Destination;
use crate::proxy::tunnel::relay;
use crate::proxy::tunnel::{Tunnel, TunnelClient};
use crate::proxy::Proxy;
use crate::retry::upstream::UpstreamState;

/// The first byte of a TLS record carrying a handshake (RFC 8446 §5.1).
const TLS_HANDSHAKE: u8 = 0x16;

/// Carries `tunnel` in a task of its own once the client's side has
/// switched (its `200` is out), counted as open until it ends.
pub(super) fn spawn(tunnel: Tunnel, proxy: Arc<Proxy>) {
    tokio::spawn(async move {
        let Tunnel {
            client,
            upstream,
            open: _open,
        } = tunnel;
        match client {
            TunnelClient::H2(pending) => {
                if let Some(stream) = pending.opened().await {
                    carry(stream, upstream, proxy).await;
                }
            }
            TunnelClient::Http1(upgrade) => {
                if let Some(io) = upgrade.switched().await {
                    carry(io, upstream, proxy).await;
                }
            }
        }
    });
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
            if let Some(protocol) = tunnelled(&first) {
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
    serve_tunnelled(Prefixed::new(first.freeze(), io), protocol, dest, proxy).await;
}

/// An opaque tunnel: the bytes relayed to one endpoint of `upstream`.
async fn relay_to_upstream<T>(mut io: T, upstream: &UpstreamState)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let Ok(mut stream) = relay::connect_upstream(upstream).await else {
        upstream
            .metrics
            .record_outcome(Outcome::Skipped(SkipReason::Tunnel), false);
        return;
    };
    upstream.metrics.record_outcome(Outcome::Ok, true);
    relay::copy(&mut io, &mut stream).await;
}
