//! Opaque relays: bytes copied both ways unchanged, never retried. A
//! half-close travels through (EOF from one side shuts down writing towards
//! the other, and the other direction keeps flowing), so a client that
//! shuts down its sending side still reads the whole reply.

mod copy;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::balance::picker;
use crate::exchange::failure::is_local_resources;
use crate::exchange::report::Tried;
use crate::random::ThreadRandom;
use crate::retry::upstream::UpstreamState;

/// Connects to one endpoint of `upstream`, picked as a request's first
/// attempt would be, within the upstream's connect timeout. A refused
/// connection counts against the endpoint's passive health.
pub(crate) async fn connect_upstream(upstream: &UpstreamState) -> io::Result<TcpStream> {
    let i = picker::pick(
        &upstream.endpoints,
        &Tried::default(),
        false,
        &mut ThreadRandom,
    )
    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no endpoint"))?;
    let endpoint = &upstream.endpoints[i];
    let connected = connect(endpoint.endpoint.addr, upstream.config.connect_timeout).await;
    // A timeout may be the path's, and running out of descriptors or memory
    // is this process's: neither says the endpoint refused.
    if connected
        .as_ref()
        .is_err_and(|e| e.kind() != io::ErrorKind::TimedOut && !is_local_resources(e))
    {
        endpoint.record_failure(&upstream.config.passive_health);
    }
    connected
}

/// Connects to `addr` within `timeout` (a timeout is `TimedOut`).
pub(crate) async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Copies both ways until both directions have closed; the bytes sent from
/// `client` to `server`, and back, as far as they got (0 after an error).
pub(crate) async fn copy<C, S>(client: &mut C, server: &mut S) -> (u64, u64)
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    match copy::copy_both(client, server).await {
        Ok(counts) => counts,
        Err(e) => {
            tracing::debug!(error = %e, "opaque relay ended with an error");
            (0, 0)
        }
    }
}
