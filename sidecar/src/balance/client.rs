//! The HTTP clients that reach endpoints: one pooled client per endpoint,
//! whose connector always dials that endpoint whatever the request URI says,
//! and one for hosts outside every upstream.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use reprise_crds::Protocol;

use crate::retry::replay_body::AttemptBody;

/// The pooled HTTP client of one endpoint. Requests carry the host the client
/// asked for (so HTTP/2's `:authority` and HTTP/1's `Host` stay the
/// application's); the connector always dials the endpoint.
pub(crate) type EndpointClient = Client<EndpointConnector, AttemptBody>;

/// A client for hosts outside every upstream (resolved by the system).
pub(crate) type PassthroughClient = Client<HttpConnector, AttemptBody>;

/// Dials one fixed endpoint whatever the request URI says.
#[derive(Clone, Debug)]
pub(crate) struct EndpointConnector {
    inner: HttpConnector,
    target: Uri,
}

impl tower_service::Service<Uri> for EndpointConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, _requested: Uri) -> Self::Future {
        let connecting = self.inner.call(self.target.clone());
        Box::pin(async move { connecting.await.map_err(Into::into) })
    }
}

/// A pooled client that always dials `addr`.
pub(crate) fn endpoint_client(
    addr: std::net::SocketAddr,
    protocol: Protocol,
    connect_timeout: Duration,
) -> EndpointClient {
    let target = Uri::try_from(format!("http://{addr}")).unwrap_or_default();
    builder(protocol).build(EndpointConnector {
        inner: connector(connect_timeout),
        target,
    })
}

/// A client for hosts outside any upstream.
pub(crate) fn passthrough_client() -> PassthroughClient {
    builder(Protocol::Http1).build(connector(Duration::from_secs(5)))
}

fn connector(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http
}

fn builder(protocol: Protocol) -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new());
    if protocol == Protocol::H2c {
        builder.http2_only(true);
    }
    builder
}
