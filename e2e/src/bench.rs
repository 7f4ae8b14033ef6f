//! What the benchmark's reference forwarders (`bench-bare-forwarder`,
//! `bench-bare-forwarder-h2`) share: the command line and the runtime.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::{bail, Context};

/// Runs `serve(listen, upstream)` on a one-thread runtime (the proxies under
/// test run one worker each), the two addresses read from the command line
/// as `NAME LISTEN_ADDR UPSTREAM_ADDR`.
pub fn forwarder_main<F, Fut>(name: &str, serve: F) -> anyhow::Result<()>
where
    F: FnOnce(SocketAddr, SocketAddr) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        bail!("usage: {name} LISTEN_ADDR UPSTREAM_ADDR");
    };
    let listen: SocketAddr = listen.parse().context("LISTEN_ADDR")?;
    let upstream: SocketAddr = upstream.parse().context("UPSTREAM_ADDR")?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve(listen, upstream))
}
