//! `protocol: auto`: the endpoint chooses between HTTP/2 and HTTP/1.1 in
//! the TLS handshake (ALPN, RFC 7301), as Envoy's `auto_config` and
//! Go's `http.Transport` let it.
//!
//! The first connection offers both. What the endpoint selected decides how
//! that connection is used (kept by the endpoint's h2 client or put in its
//! HTTP/1.1 pool, not wasted) and how the next ones are dialled: offering
//! only the chosen protocol, so a pooled connection always speaks what its
//! pool expects. A connect-stage failure forgets the choice, so an endpoint
//! that was redeployed speaking the other protocol is asked again on the
//! next attempt.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::HOST;
use http::uri::Scheme;
use http::Response;
use reprise_crds::Protocol;
use tokio::time::Instant;

use super::http1::conn::Conn;
use super::http1::Http1Pool;
use super::http2::Http2Endpoint;
use super::io::EndpointIo;
use super::tls::{selected_h2, TlsOrigin};
use super::EndpointBody;
use crate::exchange::failure::{FailureKind, Stage};
use crate::exchange::request::AttemptRequest;

/// Not asked yet (or asked again after a failed connect).
const UNKNOWN: u8 = 0;
/// The endpoint selected `http/1.1` (or nothing, which means HTTP/1.1).
const HTTP1: u8 = 1;
/// The endpoint selected `h2`.
const HTTP2: u8 = 2;

/// One endpoint of an `auto` upstream.
#[derive(Debug)]
pub(crate) struct AutoEndpoint {
    addr: std::net::SocketAddr,
    connect_timeout: Duration,
    /// Offers both protocols.
    both: TlsOrigin,
    http1: Arc<Http1Pool>,
    http2: Arc<Http2Endpoint>,
    chosen: AtomicU8,
}

impl AutoEndpoint {
    /// The endpoint at `addr`, over `tls`.
    pub(crate) fn new(
        addr: std::net::SocketAddr,
        connect_timeout: Duration,
        tls: &TlsOrigin,
    ) -> Arc<Self> {
        Arc::new(Self {
            addr,
            connect_timeout,
            both: tls.speaking(Protocol::Auto),
            http1: Http1Pool::new(addr, connect_timeout, Some(tls.speaking(Protocol::Http1))),
            http2: Http2Endpoint::new(addr, connect_timeout, Some(tls.speaking(Protocol::H2))),
            chosen: AtomicU8::new(UNKNOWN),
        })
    }

    /// Sends one attempt in the protocol the endpoint chose, asking it
    /// first if it has not been asked.
    pub(crate) async fn send(
        self: Arc<Self>,
        request: AttemptRequest<'_>,
        now: Instant,
    ) -> Result<Response<EndpointBody>, (FailureKind, Stage)> {
        let chosen = match self.chosen.load(Ordering::Acquire) {
            UNKNOWN => self.ask().await?,
            chosen => chosen,
        };
        let sent = if chosen == HTTP2 {
            // The request was prepared for HTTP/1.1: its `Host` becomes
            // `:authority` alone (RFC 9113 §8.3.1).
            let mut request = request.into_http2(Scheme::HTTPS);
            request.headers_mut().remove(HOST);
            self.http2
                .send(request, now)
                .await
                .map(|r| r.map(EndpointBody::H2c))
        } else {
            self.http1
                .send(request)
                .await
                .map(|r| r.map(EndpointBody::Http1))
        };
        if let Err((_, Stage::Connect)) = sent {
            self.chosen.store(UNKNOWN, Ordering::Release);
        }
        sent
    }

    /// Dials offering both protocols and hands the connection to the client
    /// of the one the endpoint selected.
    async fn ask(&self) -> Result<u8, (FailureKind, Stage)> {
        let deadline = Instant::now() + self.connect_timeout;
        let tcp = super::dial(self.addr, self.connect_timeout).await?;
        let tls = self.both.handshake(tcp, deadline).await?;
        let chosen = if selected_h2(&tls) {
            self.http2.adopt(tls).await?;
            HTTP2
        } else {
            self.http1.put(Conn::new(EndpointIo::Tls(Box::new(tls))));
            HTTP1
        };
        self.chosen.store(chosen, Ordering::Release);
        Ok(chosen)
    }
}
