//! One upstream's live state: its endpoints, retry budget and metrics, kept
//! across reloads.

use std::collections::HashMap;
use std::sync::Arc;

use reprise_crds::{Endpoint, Upstream};

use super::budget::RetryBudget;
use crate::balance::client::endpoint_client;
use crate::balance::client::tls::TlsOrigin;
use crate::balance::endpoint::EndpointState;
use crate::observe::metrics::{EndpointStats, UpstreamMetrics, UpstreamStats};

/// An upstream as the proxy runs it. Rebuilt on every reload, but its budget,
/// metrics and each endpoint's state (with its connection pool) carry over.
#[derive(Debug)]
pub(crate) struct UpstreamState {
    /// The resolved configuration, but for its endpoints: they are
    /// `endpoints`', so that a patch copies the list once.
    pub(crate) config: Upstream,
    /// Live endpoint state, in configuration order.
    pub(crate) endpoints: Vec<Arc<EndpointState>>,
    /// The rolling retry budget.
    pub(crate) budget: Arc<RetryBudget>,
    /// Counters and histograms.
    pub(crate) metrics: Arc<UpstreamMetrics>,
    /// The TLS every endpoint's connections use (its session cache shared).
    tls: Option<TlsOrigin>,
}

impl UpstreamState {
    /// Builds the state for `config`, keeping what `previous` (the same upstream
    /// before a reload) had accumulated.
    pub(crate) fn new(mut config: Upstream, previous: Option<&UpstreamState>) -> Self {
        // TLS settings that changed (another trust bundle, a rotated client
        // certificate) need new connections, as another protocol does.
        let same_transport = previous.is_some_and(|p| {
            p.config.protocol == config.protocol
                && p.config.connect_timeout == config.connect_timeout
                && p.config.tls == config.tls
        });
        // The previous endpoints by what they are (the first of any twins),
        // so that a reload of many endpoints looks each one up once.
        let mut kept: HashMap<&Endpoint, &Arc<EndpointState>> = HashMap::new();
        for s in previous
            .filter(|_| same_transport)
            .iter()
            .flat_map(|p| &p.endpoints)
        {
            kept.entry(&s.endpoint).or_insert(s);
        }
        // One TLS origin for every endpoint: one policy for every attempt.
        // Kept while the settings are, so that endpoints added later (a DNS
        // name's new address) resume sessions from the same cache.
        let tls = match previous {
            Some(p) if same_transport => p.tls.clone(),
            _ => config
                .tls
                .as_ref()
                .map(|t| TlsOrigin::new(t, config.protocol)),
        };
        let endpoints = config
            .endpoints
            .iter()
            .map(|e| {
                kept.get(e).map(|s| Arc::clone(s)).unwrap_or_else(|| {
                    Arc::new(EndpointState::new(
                        e.clone(),
                        endpoint_client(
                            e.addr,
                            config.protocol,
                            config.connect_timeout,
                            tls.as_ref(),
                        ),
                    ))
                })
            })
            .collect();
        config.endpoints = Vec::new();
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
            tls,
        }
    }
}

impl UpstreamState {
    /// This upstream with the endpoints `removed` taken out (at their
    /// positions before, highest first) and those `added` put in (at their
    /// positions after, lowest first), which keeps the order a whole
    /// configuration gives; everything else is
    /// kept: budget, metrics, TLS, and each remaining endpoint's state with
    /// its health, in-flight count and pool. What it costs follows the
    /// change: a new state for each endpoint added, and one copy of the
    /// endpoint list. `None` when an endpoint removed is not at its
    /// position, or a position is out of range.
    pub(crate) fn with_endpoints(
        &self,
        added: &[(usize, Endpoint)],
        removed: &[(usize, Endpoint)],
    ) -> Option<UpstreamState> {
        let mut endpoints = self.endpoints.clone();
        for (at, r) in removed {
            if endpoints.get(*at).map(|s| &s.endpoint) != Some(r) {
                return None;
            }
            endpoints.remove(*at);
        }
        for (at, e) in added {
            if *at > endpoints.len() {
                return None;
            }
            let state = EndpointState::new(
                e.clone(),
                endpoint_client(
                    e.addr,
                    self.config.protocol,
                    self.config.connect_timeout,
                    self.tls.as_ref(),
                ),
            );
            endpoints.insert(*at, Arc::new(state));
        }
        Some(UpstreamState {
            config: self.config.clone(),
            endpoints,
            budget: Arc::clone(&self.budget),
            metrics: Arc::clone(&self.metrics),
            tls: self.tls.clone(),
        })
    }

    /// What this upstream has done so far: its counters, budget and
    /// endpoints.
    pub(crate) fn stats(&self) -> UpstreamStats {
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| EndpointStats {
                addr: e.endpoint.addr,
                name: e.endpoint.name.as_deref().map(str::to_owned),
                in_flight: e.in_flight(),
                ejected: e.is_ejected(),
                ejections: e.ejections(),
                failure_estimate: e.failure_estimate(),
                certificate_expiry: self.tls.as_ref().and_then(|t| t.expiry(e.endpoint.addr)),
            })
            .collect();
        let (budget_requests, budget_retries) = self.budget.totals();
        UpstreamStats {
            budget_requests,
            budget_retries,
            budget_remaining: self.budget.remaining(),
            ..UpstreamStats::counted(&self.metrics, endpoints)
        }
    }
}
