//! Connections the proxy hands over to raw bytes: CONNECT tunnels (never
//! retried: their bytes are opaque) and protocol upgrades such as WebSocket
//! (forwarded once). Each open tunnel holds a [`Tunnels`] guard, so the
//! drain counts it as in flight and waits for it, up to the drain timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;

use super::body::ProxyBody;
use super::local::Local;
use crate::balance::picker::{self, Tried};
use crate::balance::upstream::UpstreamState;
use crate::random::ThreadRandom;
use crate::retry::outcome::{Outcome, SkipReason};

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

/// CONNECT: a TCP tunnel to one endpoint of `upstream`.
pub(crate) async fn connect(
    req: Request<Incoming>,
    upstream: &UpstreamState,
    tunnels: &Tunnels,
) -> Response<ProxyBody> {
    let Some(i) = picker::pick(
        &upstream.endpoints,
        &Tried::default(),
        false,
        &mut ThreadRandom,
    ) else {
        return Local::NoEndpoint(&upstream.config.name).into_response();
    };
    let addr = upstream.endpoints[i].endpoint.addr;
    let connect = tokio::time::timeout(
        upstream.config.connect_timeout,
        tokio::net::TcpStream::connect(addr),
    )
    .await;
    let failed = |local: Local<'_>| {
        upstream
            .metrics
            .record_outcome(Outcome::Skipped(SkipReason::Tunnel));
        local.into_response()
    };
    let stream = match connect {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            upstream.endpoints[i].record_failure(&upstream.config.passive_health);
            return failed(Local::TunnelConnect(e));
        }
        Err(_) => return failed(Local::TunnelTimeout),
    };
    upstream.metrics.record_outcome(Outcome::Ok);
    let guard = tunnels.open();
    tokio::spawn(async move {
        let _open = guard;
        if let Ok(upgraded) = hyper::upgrade::on(req).await {
            let mut client = TokioIo::new(upgraded);
            let mut stream = stream;
            let _ = tokio::io::copy_bidirectional(&mut client, &mut stream).await;
        }
    });
    Response::new(ProxyBody::Local(None))
}

/// Joins the client's upgraded connection to the endpoint's, once both sides
/// have switched protocols.
pub(crate) fn bridge(client: OnUpgrade, server: OnUpgrade, tunnels: &Tunnels) {
    let guard = tunnels.open();
    tokio::spawn(async move {
        let _open = guard;
        if let (Ok(client), Ok(server)) = (client.await, server.await) {
            let mut client = TokioIo::new(client);
            let mut server = TokioIo::new(server);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
    });
}
