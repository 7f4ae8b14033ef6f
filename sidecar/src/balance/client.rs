//! The HTTP clients that reach endpoints, one per endpoint, each dialling
//! that endpoint whatever the request says, and one for hosts outside every
//! upstream.
//!
//! The contract: [`EndpointClient::request`] sends one attempt and returns
//! its response headers, or the failure classified as the retry engine sees
//! it ([`FailureKind`] and how far the request got). A request that never
//! left the sidecar (a pooled connection had closed while idle) is sent again
//! on another connection inside the same call, so the engine never counts it
//! as a failure. HTTP/1 endpoints use the sidecar's own pool and HTTP/1.1
//! codec ([`http1`]): last-in-first-out, one short lock per checkout and
//! return, the connection back in the pool as soon as the response body
//! ends. h2c endpoints
//! multiplex every request over one connection of their own ([`http2`]).

pub(crate) mod auto;
pub(crate) mod http1;
pub(crate) mod http2;
pub(crate) mod io;
pub(crate) mod tls;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use reprise_crds::Protocol;
use tokio::time::Instant;

use self::auto::AutoEndpoint;
use self::http1::conn::Http1Body;
use self::http1::Http1Pool;
use self::http2::{H2Body, Http2Endpoint};
use self::io::EndpointIo;
use self::tls::TlsOrigin;
use crate::exchange::body::{impl_body, replay::AttemptBody, BoxError, Frames};
use crate::exchange::failure::{classify_connect_error, FailureKind, Stage};
use crate::exchange::prefixed::Prefixed;
use crate::exchange::request::AttemptRequest;
use crate::http1::WireError;

/// How long an unused connection stays open, for every client: hyper-util's
/// default, kept from before the endpoints' clients were the sidecar's own.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The client of one endpoint. Requests carry the host the client asked for
/// (so HTTP/2's `:authority` and HTTP/1's `Host` stay the application's);
/// the connection always goes to the endpoint.
#[derive(Debug)]
pub(crate) enum EndpointClient {
    /// HTTP/1.1: the sidecar's own pool of connections.
    Http1(Arc<Http1Pool>),
    /// h2c: one multiplexed connection.
    H2c(Arc<Http2Endpoint>),
    /// `auto`: HTTP/2 or HTTP/1.1 over TLS, as the endpoint selects.
    Auto(Arc<AutoEndpoint>),
}

/// A client for hosts outside every upstream (resolved by the system).
pub(crate) type PassthroughClient = Client<HttpConnector, AttemptBody>;

impl EndpointClient {
    /// Sends one attempt, starting `now` (the caller's clock reading), and
    /// waits for its response headers.
    ///
    /// Not an async fn: one would keep its own copy of the attempt's request
    /// beside the protocol's future that takes it, and add a level that
    /// every request's future is copied through. As an async fn it held the
    /// two protocols' futures side by side; now it is the larger of the two
    /// plus a tag (measured:
    /// `e2e/bench/results/2026-12-04-issue18-h2c-reference.md`).
    // Always inlined: built in the attempt's own future, the protocol's
    // future is not copied into it (measured:
    // `e2e/bench/results/2026-12-06-issue43-instructions.md`).
    #[inline(always)]
    pub(crate) fn request<'a, 't>(
        &'a self,
        request: AttemptRequest<'t>,
        now: Instant,
    ) -> impl Future<Output = Result<Response<EndpointBody>, (FailureKind, Stage)>> + use<'a, 't>
    {
        match self {
            EndpointClient::Http1(pool) => Sending::Http1 {
                f: pool
                    .send(request)
                    .map(|sent| sent.map(|r| r.map(EndpointBody::Http1))),
            },
            EndpointClient::H2c(endpoint) => Sending::Http2 {
                f: endpoint
                    .send(request.into_http2(endpoint.scheme()), now)
                    .map(|sent| sent.map(|r| r.map(EndpointBody::H2c))),
            },
            // Boxed, so that `auto`'s larger future (both protocols' and the
            // first dial's) does not enlarge every other request's.
            EndpointClient::Auto(endpoint) => Sending::Auto {
                f: Box::pin(Arc::clone(endpoint).send(request, now)),
            },
        }
    }
}

/// What one attempt waits on, for one protocol. One flat enum rather than
/// nested `Either`s, whose extra level made every HTTP/1 request's future
/// larger and copied with `memcpy` (measured:
/// `e2e/bench/results/2026-12-06-issue43-instructions.md`).
type Sent = Result<Response<EndpointBody>, (FailureKind, Stage)>;

pin_project_lite::pin_project! {
    #[project = SendingProj]
    pub(crate) enum Sending<'t, A, B> {
        Http1 { #[pin] f: A },
        Http2 { #[pin] f: B },
        Auto { f: Pin<Box<dyn Future<Output = Sent> + Send + 't>> },
    }
}

impl<A, B> Future for Sending<'_, A, B>
where
    A: Future<Output = Sent>,
    B: Future<Output = Sent>,
{
    type Output = Sent;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Sent> {
        match self.project() {
            SendingProj::Http1 { f } => f.poll(cx),
            SendingProj::Http2 { f } => f.poll(cx),
            SendingProj::Auto { f } => f.as_mut().poll(cx),
        }
    }
}

/// An endpoint's response body. Over HTTP/1 it owns the connection until
/// the body ends, then gives it back to the endpoint's pool in the same
/// call ([`Http1Body`]).
#[derive(Debug)]
pub(crate) enum EndpointBody {
    /// Read off an HTTP/1.1 connection by the sidecar's codec.
    Http1(Http1Body),
    /// A stream of the h2c connection.
    H2c(H2Body),
}

impl EndpointBody {
    /// After a `101`: the endpoint's connection, now speaking the upgraded
    /// protocol (its first bytes included).
    pub(crate) fn take_upgrade(&mut self) -> Option<Prefixed<EndpointIo>> {
        match self {
            EndpointBody::Http1(body) => body.take_upgrade(),
            EndpointBody::H2c(_) => None,
        }
    }

    /// The response head may still hold hop-by-hop fields. HTTP/2 forbids
    /// connection-specific fields, but `TE` and names the h2 crate lets
    /// through are stripped as before.
    pub(crate) fn hop_by_hop_in_head(&self) -> bool {
        match self {
            EndpointBody::Http1(body) => body.hop_by_hop_in_head(),
            EndpointBody::H2c(_) => true,
        }
    }
}

impl Frames for EndpointBody {
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self {
            EndpointBody::Http1(body) => Pin::new(body).poll_frame(cx),
            EndpointBody::H2c(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_ended(&self) -> bool {
        match self {
            EndpointBody::Http1(body) => body.is_end_stream(),
            EndpointBody::H2c(body) => body.is_end_stream(),
        }
    }

    fn size(&self) -> SizeHint {
        match self {
            EndpointBody::Http1(body) => body.size_hint(),
            EndpointBody::H2c(body) => body.size_hint(),
        }
    }
}

impl_body!(EndpointBody);

/// How a response body's failure before its first frame counts: the
/// endpoint's close is a closed connection, anything else a reset.
pub(crate) fn early_body_failure(e: &BoxError) -> (FailureKind, Stage) {
    if let Some(wire) = e.downcast_ref::<WireError>() {
        return (wire.kind, Stage::AfterWrite);
    }
    match e.downcast_ref::<hyper::Error>() {
        Some(h) if h.is_incomplete_message() => (FailureKind::ConnectionClosed, Stage::AfterWrite),
        _ => (FailureKind::StreamReset, Stage::AfterWrite),
    }
}

/// Dials an endpoint within `timeout`, with TCP_NODELAY: a request or
/// response smaller than a segment goes out at once instead of waiting up
/// to 40 ms for the peer's delayed ACK.
async fn dial(
    addr: std::net::SocketAddr,
    timeout: Duration,
) -> Result<tokio::net::TcpStream, (FailureKind, Stage)> {
    let stream = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(classify_connect_error(&e)),
        Err(_) => return Err((FailureKind::ConnectTimeout, Stage::Connect)),
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// The client of the endpoint at `addr`, over TLS from `tls` when the
/// upstream has it.
pub(crate) fn endpoint_client(
    addr: std::net::SocketAddr,
    protocol: Protocol,
    connect_timeout: Duration,
    tls: Option<&TlsOrigin>,
) -> EndpointClient {
    match protocol {
        Protocol::Http1 => {
            EndpointClient::Http1(Http1Pool::new(addr, connect_timeout, tls.cloned()))
        }
        Protocol::H2c | Protocol::H2 => {
            EndpointClient::H2c(Http2Endpoint::new(addr, connect_timeout, tls.cloned()))
        }
        Protocol::Auto => match tls {
            Some(tls) => EndpointClient::Auto(AutoEndpoint::new(addr, connect_timeout, tls)),
            // The configuration's checks refuse `auto` without TLS; were one
            // to pass, HTTP/1.1 in clear is what an endpoint without ALPN speaks.
            None => EndpointClient::Http1(Http1Pool::new(addr, connect_timeout, None)),
        },
    }
}

/// A client for hosts outside any upstream.
pub(crate) fn passthrough_client() -> PassthroughClient {
    builder().build(connector(Duration::from_secs(5)))
}

fn connector(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http
}

fn builder() -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new());
    builder
}
