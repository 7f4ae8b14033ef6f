//! The HTTP clients that reach endpoints, one per endpoint, each dialling
//! that endpoint whatever the request says, and one for hosts outside every
//! upstream.
//!
//! The contract: [`EndpointClient::request`] sends one attempt and returns
//! its response headers, or the failure classified as the retry engine sees
//! it ([`FailureKind`] and how far the request got). A request that never
//! left the sidecar (a pooled connection had closed while idle) is sent again
//! on another connection inside the same call, so the engine never counts it
//! as a failure. HTTP/1 endpoints use the sidecar's own pool ([`http1`]):
//! last-in-first-out, one short lock per checkout and return, the connection
//! back in the pool as soon as the response body ends. h2c endpoints
//! multiplex every request over one connection of their own ([`http2`]).

pub(crate) mod http1;
pub(crate) mod http2;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use reprise_crds::Protocol;

use self::http1::{Http1Pool, Lease};
use self::http2::Http2Endpoint;
use crate::retry::failure::{classify_connect_error, classify_send_error, FailureKind, Stage};
use crate::retry::replay_body::AttemptBody;

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
}

/// A client for hosts outside every upstream (resolved by the system).
pub(crate) type PassthroughClient = Client<HttpConnector, AttemptBody>;

impl EndpointClient {
    /// Sends one attempt and waits for its response headers.
    pub(crate) async fn request(
        &self,
        request: Request<AttemptBody>,
    ) -> Result<Response<EndpointBody>, (FailureKind, Stage)> {
        match self {
            EndpointClient::Http1(pool) => {
                let (response, lease) = pool.send(request).await?;
                Ok(response.map(|inner| EndpointBody {
                    inner,
                    lease: Some(lease),
                }))
            }
            EndpointClient::H2c(endpoint) => {
                let response = endpoint.send(request).await?;
                Ok(response.map(|inner| EndpointBody { inner, lease: None }))
            }
        }
    }
}

/// An endpoint's response body. Over HTTP/1 it holds the connection until
/// the body ends (its last frame, or the body dropped), then gives it back
/// to the endpoint's pool in the same call, without a task or a wait.
#[derive(Debug)]
pub(crate) struct EndpointBody {
    inner: Incoming,
    lease: Option<Lease>,
}

impl EndpointBody {
    fn release(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
    }
}

impl Body for EndpointBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Pending => {}
            Poll::Ready(Some(Ok(_))) if !this.inner.is_end_stream() => {}
            // A broken exchange: the connection is never lent again.
            Poll::Ready(Some(Err(_))) => this.lease = None,
            // The last frame (hyper's server stops polling once the body
            // says it has ended, so this is the moment, not the `None`).
            Poll::Ready(_) => this.release(),
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for EndpointBody {
    fn drop(&mut self) {
        self.release();
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

/// How a request failed on a connection dialled for it: one hyper gave back
/// unsent never reached the endpoint, so it failed at the connect stage
/// (safe to retry under any boundary).
fn fresh_connection_failure(
    e: &hyper::client::conn::TrySendError<Request<AttemptBody>>,
) -> (FailureKind, Stage) {
    let (kind, stage) = classify_send_error(e.error());
    if e.message().is_some() {
        (kind, Stage::Connect)
    } else {
        (kind, stage)
    }
}

/// The client of the endpoint at `addr`.
pub(crate) fn endpoint_client(
    addr: std::net::SocketAddr,
    protocol: Protocol,
    connect_timeout: Duration,
) -> EndpointClient {
    match protocol {
        Protocol::Http1 => EndpointClient::Http1(Http1Pool::new(addr, connect_timeout)),
        Protocol::H2c => EndpointClient::H2c(Http2Endpoint::new(addr, connect_timeout)),
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
