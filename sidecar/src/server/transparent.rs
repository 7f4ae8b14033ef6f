//! Transparently captured connections: outbound TCP that the pod's
//! `REPRISE_OUTPUT` rules (`reprise-sidecar iptables`) redirected to the
//! `--transparent` listener. The contract, per connection:
//!
//! 1. The original destination comes from `SO_ORIGINAL_DST` (IPv4) or
//!    `IP6T_SO_ORIGINAL_DST` (IPv6). A connection without one (it was not
//!    redirected) or whose destination is one of the sidecar's own listeners
//!    (a loop) is reset at once.
//! 2. A destination that is no upstream's virtual or endpoint address is
//!    relayed as opaque TCP to that destination, unsniffed, so server-first
//!    protocols work and nothing is added to their latency.
//! 3. To an upstream's address, the first bytes decide: an HTTP/1.x request
//!    line or the h2c preface is served through the retry path, each request
//!    routed by the original destination with its `Host` header forwarded
//!    unchanged; anything else (TLS, silence for [`FIRST_BYTES_WAIT`]) is
//!    relayed as opaque TCP to one of the upstream's endpoints (where the
//!    address leads: kube-proxy would pick one too).
//!
//! An opaque relay whose destination cannot be reached resets the client's
//! connection, so the app sees a failure rather than an orderly close. Open
//! relays count as in flight in the drain, like CONNECT tunnels.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::cap::Slot;
use super::drain::{reached, Drain, DrainPhase};
use super::sniff::{self, Protocol, Sniffed};
use super::{serve_http, HttpBuilders, FIRST_BYTES_WAIT};
use crate::proxy::route::Destination;
use crate::proxy::tunnel::relay;
use crate::proxy::Proxy;

/// Connect timeout of an opaque relay to a destination outside every
/// upstream (which has no configured one): Istio's default `connectTimeout`.
const OPAQUE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The addresses this process listens on, which no captured connection may
/// lead back to.
#[derive(Clone, Debug, Default)]
pub(crate) struct OwnListeners(pub(crate) Vec<SocketAddr>);

impl OwnListeners {
    /// True when `dst` reaches one of the listeners: the same address, or the
    /// same port on a local address for a listener bound to all addresses.
    fn contains(&self, dst: SocketAddr) -> bool {
        self.0.iter().any(|own| {
            own.port() == dst.port()
                && (own.ip() == dst.ip() || (own.ip().is_unspecified() && is_local(dst.ip())))
        })
    }
}

/// Whether `ip` is an address of this network namespace: binding a socket
/// to it succeeds only then. Asked only for a port the sidecar listens on.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// The destination the client dialled before the redirect.
pub(crate) fn original_destination(stream: &TcpStream) -> io::Result<SocketAddr> {
    let socket = SockRef::from(stream);
    let addr = if stream.local_addr()?.is_ipv4() {
        socket.original_dst_v4()?
    } else {
        socket.original_dst_v6()?
    };
    addr.as_socket()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an IP address"))
}

/// Closes `stream` with a reset (RST), not an orderly FIN.
fn reset(stream: TcpStream) {
    let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Serves one captured connection (see the module docs); `_slot` is its
/// place under the transparent listeners' cap, held to its end.
pub(crate) async fn serve_captured(
    stream: TcpStream,
    proxy: Arc<Proxy>,
    builder: Arc<HttpBuilders>,
    mut drain: watch::Receiver<Drain>,
    own: Arc<OwnListeners>,
    _slot: Slot,
) {
    let captured = &proxy.metrics.captured;
    let dst = match original_destination(&stream) {
        Ok(dst) if own.contains(dst) => {
            captured.refused_loop.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%dst, "captured connection to the sidecar's own listener refused (loop)");
            return reset(stream);
        }
        Ok(dst) => dst,
        Err(e) => {
            captured
                .refused_no_destination
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, "connection without an original destination refused");
            return reset(stream);
        }
    };
    let Some(upstream) = proxy.routes().upstream_at(&dst).cloned() else {
        let connect = relay::connect(dst, OPAQUE_CONNECT_TIMEOUT);
        return relay_opaque(stream, connect, &proxy).await;
    };
    let max_line = proxy.config().proxy.max_request_header_bytes;
    // Biased, as on the proxy listener: bytes already here are served even
    // once the drain has started.
    let sniffed = tokio::select! {
        biased;
        s = sniff::captured(&stream, FIRST_BYTES_WAIT, max_line) => s,
        () = reached(&mut drain, DrainPhase::ClosingIdle) => return,
    };
    match sniffed {
        Some(Sniffed::Http(protocol)) => {
            let counter = match protocol {
                Protocol::Http1 => &captured.http1,
                Protocol::H2c => &captured.h2c,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            serve_http(
                stream,
                protocol,
                Destination::Original(dst),
                proxy,
                builder,
                drain,
            )
            .await;
        }
        Some(Sniffed::Opaque) => {
            relay_opaque(stream, relay::connect_upstream(&upstream), &proxy).await;
        }
        Some(Sniffed::NeedMore) | None => {}
    }
}

/// Relays `client` to the stream `connect` opens, counted as opaque.
async fn relay_opaque(
    mut client: TcpStream,
    connect: impl std::future::Future<Output = io::Result<TcpStream>>,
    proxy: &Proxy,
) {
    let m = &proxy.metrics.captured;
    m.opaque.fetch_add(1, Ordering::Relaxed);
    let _in_flight = proxy.tunnels().open();
    let _open = m.opaque_open.enter();
    let mut server = match connect.await {
        Ok(s) => s,
        Err(e) => {
            m.opaque_connect_failures.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, "opaque relay: destination unreachable");
            return reset(client);
        }
    };
    let (sent, received) = relay::copy(&mut client, &mut server).await;
    m.opaque_bytes_sent.fetch_add(sent, Ordering::Relaxed);
    m.opaque_bytes_received
        .fetch_add(received, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_listeners_match_their_address_or_any_local_address_on_their_port() {
        let own = OwnListeners(vec![
            "127.0.0.1:15006".parse().expect("addr"),
            "0.0.0.0:15021".parse().expect("addr"),
        ]);
        assert!(own.contains("127.0.0.1:15006".parse().expect("addr")));
        assert!(own.contains("127.0.0.1:15021".parse().expect("addr")));
        assert!(!own.contains("127.0.0.1:15007".parse().expect("addr")));
        // Not an address of this machine: an app calling port 15021 elsewhere.
        assert!(!own.contains("192.0.2.10:15021".parse().expect("addr")));
        assert!(!own.contains("192.0.2.10:15006".parse().expect("addr")));
    }
}
