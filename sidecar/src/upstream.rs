//! One upstream's live state: endpoints, budget and metrics; and the HTTP
//! clients that reach its endpoints.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use reprise_crds::{Protocol, Upstream};

use crate::budget::RetryBudget;
use crate::endpoint::EndpointState;
use crate::metrics::UpstreamMetrics;
use crate::replay_body::AttemptBody;

/// The pooled HTTP client of one endpoint. Requests carry the host the client
/// asked for (so HTTP/2's `:authority` and HTTP/1's `Host` stay the
/// application's); the connector always dials the endpoint.
pub type EndpointClient = Client<EndpointConnector, AttemptBody>;

/// A client for hosts outside every upstream (resolved by the system).
pub type PassthroughClient = Client<HttpConnector, AttemptBody>;

/// Dials one fixed endpoint whatever the request URI says.
#[derive(Clone, Debug)]
pub struct EndpointConnector {
    inner: HttpConnector,
    target: Uri,
}

/// An upstream as the proxy runs it. Rebuilt on every reload, but its budget,
/// metrics and each endpoint's state (with its connection pool) carry over.
#[derive(Debug)]
pub struct UpstreamState {
    /// The resolved configuration.
    pub config: Upstream,
    /// Live endpoint state, in configuration order.
    pub endpoints: Vec<Arc<EndpointState>>,
    /// The rolling retry budget.
    pub budget: Arc<RetryBudget>,
    /// Counters and histograms.
    pub metrics: Arc<UpstreamMetrics>,
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

impl UpstreamState {
    /// Builds the state for `config`, keeping what `previous` (the same upstream
    /// before a reload) had accumulated.
    pub fn new(config: Upstream, previous: Option<&UpstreamState>) -> Self {
        let same_transport = previous.is_some_and(|p| {
            p.config.protocol == config.protocol
                && p.config.connect_timeout == config.connect_timeout
        });
        let endpoints = config
            .endpoints
            .iter()
            .map(|e| {
                previous
                    .filter(|_| same_transport)
                    .and_then(|p| p.endpoints.iter().find(|s| s.endpoint == *e))
                    .cloned()
                    .unwrap_or_else(|| {
                        Arc::new(EndpointState::new(
                            e.clone(),
                            endpoint_client(e.addr, config.protocol, config.connect_timeout),
                        ))
                    })
            })
            .collect();
        let budget = match previous {
            Some(p) if p.budget.same_window(&config.budget) => {
                p.budget.update(&config.budget);
                Arc::clone(&p.budget)
            }
            _ => Arc::new(RetryBudget::new(&config.budget)),
        };
        Self {
            metrics: previous.map(|p| Arc::clone(&p.metrics)).unwrap_or_default(),
            config,
            endpoints,
            budget,
        }
    }
}

/// A pooled client that always dials `addr`.
pub fn endpoint_client(
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
pub fn passthrough_client() -> PassthroughClient {
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
