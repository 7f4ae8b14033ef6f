//! One upstream's live state: endpoints, budget, connection pool and metrics.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use reprise_crds::{Protocol, Upstream};

use crate::budget::RetryBudget;
use crate::endpoint::EndpointState;
use crate::metrics::UpstreamMetrics;
use crate::replay_body::AttemptBody;

/// The pooled HTTP client the sidecar uses towards endpoints.
pub type UpstreamClient = Client<HttpConnector, AttemptBody>;

/// An upstream as the proxy runs it. Rebuilt on every reload, but its budget,
/// metrics, connection pool and each endpoint's state carry over.
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
    /// Connection pool towards the endpoints.
    pub client: UpstreamClient,
}

impl UpstreamState {
    /// Builds the state for `config`, keeping what `previous` (the same upstream
    /// before a reload) had accumulated.
    pub fn new(config: Upstream, previous: Option<&UpstreamState>) -> Self {
        let endpoints = config
            .endpoints
            .iter()
            .map(|e| {
                previous
                    .and_then(|p| p.endpoints.iter().find(|s| s.endpoint == *e))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(EndpointState::new(e.clone())))
            })
            .collect();
        let budget = match previous {
            Some(p) if p.budget.same_window(&config.budget) => {
                p.budget.update(&config.budget);
                Arc::clone(&p.budget)
            }
            _ => Arc::new(RetryBudget::new(&config.budget)),
        };
        let client = match previous {
            Some(p)
                if p.config.protocol == config.protocol
                    && p.config.connect_timeout == config.connect_timeout =>
            {
                p.client.clone()
            }
            _ => client(config.protocol, config.connect_timeout),
        };
        Self {
            metrics: previous.map(|p| Arc::clone(&p.metrics)).unwrap_or_default(),
            config,
            endpoints,
            budget,
            client,
        }
    }
}

/// A client for hosts outside any upstream (resolves names with the system resolver).
pub fn passthrough_client() -> UpstreamClient {
    client(Protocol::Http1, Duration::from_secs(5))
}

fn client(protocol: Protocol, connect_timeout: Duration) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new());
    if protocol == Protocol::H2c {
        builder.http2_only(true);
    }
    builder.build(http)
}
