//! A [`Cache`] filled by hand instead of by watches, for benchmarks and
//! tests (`examples/cluster_scale.rs`): a model cluster of thousands of
//! Services and pods needs no API server.
//!
//! Why not [`Cache::fixed`]: a fed cache changes, and each change takes the
//! live watch's path (`watch::on_event`: store, change counter, relay to
//! the reconciler), so whatever the controller does per event is exercised
//! and measured as in a cluster. Its stores start complete (a list, as a
//! watch's first one), so [`Cache::ready`] holds at once; BackendTLSPolicies,
//! GRPCRoutes, XBackendTrafficPolicies and the replicas' sync counts are not
//! fed (none).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use reprise_crds::resource::RetryPolicy;
use tokio::sync::watch as change;

use super::relay::Relay;
use super::watch::{self, Fed, Kind, Watched};
use super::Cache;
use crate::policy::route::HTTPRoute;

/// Applies and deletes the objects of a [`Cache::fed`] cache, each as a
/// watch event. For benchmarks and tests.
pub struct Feed {
    policies: Fed<RetryPolicy>,
    services: Fed<Service>,
    slices: Fed<EndpointSlice>,
    namespaces: Fed<Namespace>,
    http_routes: Fed<HTTPRoute>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed").finish_non_exhaustive()
    }
}

impl Cache {
    /// A complete cache of these objects and the [`Feed`] that changes it
    /// (for benchmarks and tests).
    pub fn fed(
        policies: impl IntoIterator<Item = RetryPolicy>,
        services: impl IntoIterator<Item = Service>,
        slices: impl IntoIterator<Item = EndpointSlice>,
    ) -> (Cache, Feed) {
        let (tx, changes) = change::channel(0u64);
        let relisted = Arc::new(Relay::default());
        let dirty = super::Dirty::default();
        let signals = watch::Signals {
            changes: Some(Arc::new(tx)),
            relisted: Arc::clone(&relisted),
            dirty: dirty.clone(),
        };
        let (policies, policies_fed) =
            Watched::fed(signals.clone(), policies, super::dirty::policy);
        let (services, services_fed) =
            Watched::fed(signals.clone(), services, super::dirty::service);
        let (slices, slices_fed) = Watched::fed(signals.clone(), slices, super::dirty::slice);
        let (namespaces, namespaces_fed) =
            Watched::fed(signals.clone(), [], super::dirty::namespace);
        let (http_routes, http_routes_fed) = Watched::fed(signals, [], super::dirty::http_route);
        let cache = Cache {
            policies,
            services,
            slices,
            peers: None,
            backend_tls: Watched::fixed([]),
            namespaces,
            http_routes,
            grpc_routes: Watched::fixed([]),
            traffic_policies: Watched::fixed([]),
            ca_bundles: Arc::default(),
            ca_read: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            changes,
            relisted,
            dirty,
        };
        let feed = Feed {
            policies: policies_fed,
            services: services_fed,
            slices: slices_fed,
            namespaces: namespaces_fed,
            http_routes: http_routes_fed,
        };
        (cache, feed)
    }
}

impl Feed {
    /// Adds or replaces a RetryPolicy.
    pub fn apply_policy(&mut self, policy: RetryPolicy) {
        apply(&mut self.policies, policy);
    }

    /// Deletes a RetryPolicy.
    pub fn delete_policy(&mut self, policy: RetryPolicy) {
        delete(&mut self.policies, policy);
    }

    /// Adds or replaces a Service.
    pub fn apply_service(&mut self, service: Service) {
        apply(&mut self.services, service);
    }

    /// Deletes a Service.
    pub fn delete_service(&mut self, service: Service) {
        delete(&mut self.services, service);
    }

    /// Adds or replaces an EndpointSlice.
    pub fn apply_slice(&mut self, slice: EndpointSlice) {
        apply(&mut self.slices, slice);
    }

    /// Deletes an EndpointSlice.
    pub fn delete_slice(&mut self, slice: EndpointSlice) {
        delete(&mut self.slices, slice);
    }

    /// Adds or replaces a Namespace (its labels).
    pub fn apply_namespace(&mut self, namespace: Namespace) {
        apply(&mut self.namespaces, namespace);
    }

    /// Adds or replaces an HTTPRoute.
    pub fn apply_http_route(&mut self, route: HTTPRoute) {
        apply(&mut self.http_routes, route);
    }

    /// Deletes an HTTPRoute.
    pub fn delete_http_route(&mut self, route: HTTPRoute) {
        delete(&mut self.http_routes, route);
    }
}

fn apply<K: Kind>(fed: &mut Fed<K>, obj: K) {
    fed.send(Event::Apply(obj));
}

fn delete<K: Kind>(fed: &mut Fed<K>, obj: K) {
    fed.send(Event::Delete(obj));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, service, slice};

    #[tokio::test]
    async fn a_fed_cache_is_ready_and_each_change_is_announced_and_seen() {
        let endpoints = |ips: &[&str]| {
            serde_json::Value::Array(
                ips.iter()
                    .map(|ip| serde_json::json!({ "addresses": [ip], "conditions": { "ready": true } }))
                    .collect(),
            )
        };
        let (cache, mut feed) = Cache::fed(
            [fixtures::policy().build()],
            [service(serde_json::json!([{ "name": "http", "port": 80 }]))],
            [slice("api-1", endpoints(&["127.0.0.11"]))],
        );
        assert!(cache.ready().await, "the stores start complete");
        let mut changes = cache.changes();
        changes.borrow_and_update();
        let count = |c: &Cache| {
            let p = fixtures::policy().build();
            c.target(&p)
                .map(|u| u.endpoints.len())
                .unwrap_or(usize::MAX)
        };
        assert_eq!(count(&cache), 1);

        feed.apply_slice(slice("api-1", endpoints(&["127.0.0.11", "127.0.0.12"])));
        assert!(
            changes.has_changed().unwrap_or(false),
            "push streams are woken"
        );
        assert_eq!(count(&cache), 2);

        // What the controller never reads is not kept: server-side apply's
        // bookkeeping and kubectl's last-applied copy; other annotations stay.
        let mut policy = fixtures::policy().build();
        policy.metadata.managed_fields = Some(vec![Default::default(); 3]);
        policy.metadata.annotations = Some(
            [
                ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
                ("team", "shop"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        feed.apply_policy(policy);
        let kept = cache.policies();
        assert_eq!(kept[0].metadata.managed_fields, None);
        assert_eq!(
            kept[0]
                .metadata
                .annotations
                .as_ref()
                .map(|a| a.keys().collect::<Vec<_>>()),
            Some(vec![&"team".to_string()])
        );

        feed.delete_slice(slice("api-1", endpoints(&[])));
        assert_eq!(count(&cache), 0);
        feed.delete_policy(fixtures::policy().build());
        assert!(cache.policies().is_empty());
    }
}
