//! The controller's one view of the cluster. Each kind it reads is watched
//! once, into a reflector store that every reader shares:
//!
//! | Watch | Read by |
//! |---|---|
//! | RetryPolicy (all namespaces) | push source (snapshots), reconciler (the policy itself), sync-count publisher, `Controller` triggers |
//! | Service (all namespaces) | push source and reconciler (target resolution), `Controller` triggers, injection webhook (`default/kubernetes`: the API server's ClusterIPs, left uncaptured) |
//! | EndpointSlice (all namespaces) | push source and reconciler (endpoints), `Controller` triggers |
//! | ConfigMap `reprise.dev/sync-counts` (controller namespace, leader election only) | reconciler (peers' sync counts), `Controller` triggers |
//! | BackendTLSPolicy (all namespaces; Gateway API's CRD, watched again with backoff while it is not installed) | push source and reconciler (the target's TLS), `Controller` triggers |
//! | Namespace (labels) | push source and sync counts (a producer policy's `callerNamespaces.selector`) |
//! | HTTPRoute, GRPCRoute (all namespaces; Gateway API's, watched again with backoff while not installed) | push source (route rules, [`routes`]), route status writer |
//! | XBackendTrafficPolicy (all namespaces; Gateway API's experimental channel, likewise) | push source (an upstream's budget), its status writer |
//!
//! The ConfigMaps BackendTLSPolicies reference (key `ca.crt`) are read one
//! by one, never watched cluster-wide: every minute (`backend_tls::CA_REFRESH`) and whenever
//! the set referenced changes; a change of their content reconciles every
//! policy again and is pushed.
//!
//! Status and pushes are computed from the same objects by the same
//! function ([`Cache::target`]), so they cannot disagree. Every change to a
//! policy, Service or EndpointSlice bumps the counter push streams wait on;
//! what each event touched is relayed to the reconciler while one runs.
//!
//! Benchmarks and tests fill a cache without an API server through a
//! [`Feed`] ([`Cache::fed`]), whose events take the watches' path.

mod backend_tls;
mod budget;
mod dirty;
mod feed;
mod relay;
pub(crate) mod routes;
mod watch;

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::Stream;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use reprise_crds::resource::RetryPolicy;
use reprise_crds::snapshot::SnapshotUpstream;
use tokio::sync::watch as change;

use backend_tls::{keep_ca_bundles, CaBundles};
pub(crate) use backend_tls::{TlsProblem, TlsProblemKind};
pub use dirty::Touched;
use dirty::{Dirty, Touch};
pub use feed::Feed;
pub(crate) use relay::Relay;
pub(crate) use watch::Watched;

use crate::policy::backend_tls::BackendTLSPolicy;
use crate::policy::budget::XBackendTrafficPolicy;
use crate::policy::route::{GRPCRoute, HTTPRoute};
use crate::policy::target::{self, TargetProblem, SERVICE_NAME_LABEL};

/// The label on every replica's sync-count ConfigMap; its value is the
/// replica's identity. The peers watch selects the ConfigMaps by it;
/// `reconcile::peers` writes and reads them with it.
pub(crate) const SYNC_COUNTS_LABEL: &str = "reprise.dev/sync-counts";

/// The shared stores. Cheap to clone: clones share the stores.
#[derive(Clone)]
pub struct Cache {
    pub(crate) policies: Watched<RetryPolicy>,
    pub(crate) services: Watched<Service>,
    pub(crate) slices: Watched<EndpointSlice>,
    /// Other replicas' sync counts; `None` without leader election.
    pub(crate) peers: Option<Watched<ConfigMap>>,
    /// Gateway API BackendTLSPolicies (empty while the CRD is not installed).
    pub(crate) backend_tls: Watched<BackendTLSPolicy>,
    /// Namespaces, for their labels.
    pub(crate) namespaces: Watched<Namespace>,
    /// Gateway API HTTPRoutes (empty while the CRD is not installed).
    pub(crate) http_routes: Watched<HTTPRoute>,
    /// Gateway API GRPCRoutes (likewise).
    pub(crate) grpc_routes: Watched<GRPCRoute>,
    /// Gateway API XBackendTrafficPolicies (likewise).
    pub(crate) traffic_policies: Watched<XBackendTrafficPolicy>,
    /// The CA bundles they reference.
    ca_bundles: Arc<RwLock<CaBundles>>,
    /// Set once the CA bundles referenced at start have been read.
    ca_read: Arc<std::sync::atomic::AtomicBool>,
    /// Bumped on every change to a policy, Service or EndpointSlice.
    changes: change::Receiver<u64>,
    /// Told when a store was replaced by a fresh list.
    relisted: Arc<Relay<()>>,
    /// What events touched since the push source last looked.
    dirty: Dirty,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("policies", &self.policies.store.len())
            .field("services", &self.services.store.len())
            .field("slices", &self.slices.store.len())
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// Starts the watches, each on a task of its own; `peers_namespace` adds
    /// the watch of the replicas' sync-count ConfigMaps there.
    pub(crate) fn start(client: &Client, peers_namespace: Option<&str>) -> Self {
        let (tx, changes) = change::channel(0u64);
        let relisted = Arc::new(Relay::default());
        let dirty = Dirty::default();
        let signals = watch::Signals {
            changes: Some(Arc::new(tx)),
            relisted: Arc::clone(&relisted),
            dirty: dirty.clone(),
        };
        let all = watcher::Config::default;
        // Who may use a BackendTLSPolicy's port is not indexed: any change to one computes everything again (they are few and rarely change).
        let backend_tls = Watched::start(Api::all(client.clone()), all(), signals.clone(), |_| {
            Touch::All
        });
        let ca_bundles = Arc::new(RwLock::new(CaBundles::new()));
        let ca_read = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(keep_ca_bundles(
            client.clone(),
            backend_tls.clone(),
            Arc::clone(&ca_bundles),
            Arc::clone(&ca_read),
            signals.clone(),
        ));
        Cache {
            backend_tls,
            ca_bundles,
            ca_read,
            namespaces: Watched::start(Api::all(client.clone()), all(), signals.clone(), |n| {
                Touch::Namespace(n.name_any())
            }),
            http_routes: Watched::start(Api::all(client.clone()), all(), signals.clone(), |r| {
                Touch::Route(r.namespace().unwrap_or_default())
            }),
            grpc_routes: Watched::start(Api::all(client.clone()), all(), signals.clone(), |r| {
                Touch::Route(r.namespace().unwrap_or_default())
            }),
            // Few, and they reach every upstream of their Services: any change computes everything again.
            traffic_policies: Watched::start(
                Api::all(client.clone()),
                all(),
                signals.clone(),
                |_| Touch::All,
            ),
            policies: Watched::start(Api::all(client.clone()), all(), signals.clone(), |p| {
                Touch::Policy(p.namespace().unwrap_or_default(), p.name_any())
            }),
            services: Watched::start(Api::all(client.clone()), all(), signals.clone(), |s| {
                Touch::Service(s.namespace().unwrap_or_default(), s.name_any())
            }),
            slices: Watched::start(
                Api::all(client.clone()),
                all(),
                signals.clone(),
                |s| match s.labels().get(SERVICE_NAME_LABEL) {
                    Some(service) => {
                        Touch::Service(s.namespace().unwrap_or_default(), service.clone())
                    }
                    None => Touch::Nothing,
                },
            ),
            peers: peers_namespace.map(|ns| {
                Watched::start(
                    Api::namespaced(client.clone(), ns),
                    all().labels(SYNC_COUNTS_LABEL),
                    // Peer counts do not change snapshots: their events need not wake the push streams.
                    watch::Signals {
                        changes: None,
                        ..signals.clone()
                    },
                    |_| Touch::Nothing,
                )
            }),
            changes,
            relisted,
            dirty,
        }
    }

    /// A complete cache of these objects that never changes (for `explain`
    /// and tests).
    pub fn fixed(
        policies: impl IntoIterator<Item = RetryPolicy>,
        services: impl IntoIterator<Item = Service>,
        slices: impl IntoIterator<Item = EndpointSlice>,
    ) -> Self {
        Cache {
            policies: Watched::fixed(policies),
            services: Watched::fixed(services),
            slices: Watched::fixed(slices),
            peers: None,
            backend_tls: Watched::fixed([]),
            namespaces: Watched::fixed([]),
            http_routes: Watched::fixed([]),
            grpc_routes: Watched::fixed([]),
            traffic_policies: Watched::fixed([]),
            ca_bundles: Arc::default(),
            ca_read: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            changes: change::channel(0).1,
            relisted: Arc::default(),
            dirty: Dirty::default(),
        }
    }

    /// This fixed cache with `policies` (BackendTLSPolicies) and the CA
    /// bundles `(namespace, name, ca.crt)` of ConfigMaps (for tests).
    pub fn with_backend_tls(
        mut self,
        policies: impl IntoIterator<Item = BackendTLSPolicy>,
        config_maps: impl IntoIterator<Item = (String, String, String)>,
    ) -> Self {
        self.backend_tls = Watched::fixed(policies);
        self.ca_bundles = Arc::new(RwLock::new(
            config_maps
                .into_iter()
                .map(|(ns, name, pem)| ((ns, name), Ok(pem)))
                .collect(),
        ));
        self
    }

    /// This fixed cache with `namespaces` (for their labels), HTTPRoutes,
    /// GRPCRoutes and XBackendTrafficPolicies (for tests and `explain`).
    pub fn with_gateway_api(
        mut self,
        namespaces: impl IntoIterator<Item = Namespace>,
        http_routes: impl IntoIterator<Item = HTTPRoute>,
        grpc_routes: impl IntoIterator<Item = GRPCRoute>,
        traffic_policies: impl IntoIterator<Item = XBackendTrafficPolicy>,
    ) -> Self {
        self.namespaces = Watched::fixed(namespaces);
        self.http_routes = Watched::fixed(http_routes);
        self.grpc_routes = Watched::fixed(grpc_routes);
        self.traffic_policies = Watched::fixed(traffic_policies);
        self
    }

    /// Waits until every store holds a complete list, so nothing is
    /// computed from a half-filled cache. `false` when a watch is gone.
    pub(crate) async fn ready(&self) -> bool {
        let peers = async {
            match &self.peers {
                Some(p) => p.store.wait_until_ready().await.is_ok(),
                None => true,
            }
        };
        // BackendTLSPolicies too, when their CRD is installed: a snapshot
        // computed before they are listed would leave a TLS port in plain text.
        // Routes and budgets too: a snapshot computed before them would
        // retry what a route says not to, or spend another budget.
        let gateway = async {
            // Namespaces too, but a replica under an older chart's RBAC
            // (not allowed to list them) goes on without their labels.
            let (namespaces, http, grpc, budgets) = tokio::join!(
                self.namespaces.ready_or_missing(),
                self.http_routes.ready_or_missing(),
                self.grpc_routes.ready_or_missing(),
                self.traffic_policies.ready_or_missing(),
            );
            namespaces && http && grpc && budgets
        };
        let (policies, services, slices, peers, gateway, backend_tls) = tokio::join!(
            self.policies.store.wait_until_ready(),
            self.services.store.wait_until_ready(),
            self.slices.store.wait_until_ready(),
            peers,
            gateway,
            async {
                // And the CA bundles they reference, read once.
                let ready = self.backend_tls.ready_or_missing().await;
                while ready && !self.ca_read.load(std::sync::atomic::Ordering::Acquire) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                ready
            },
        );
        policies.is_ok() && services.is_ok() && slices.is_ok() && peers && gateway && backend_tls
    }

    /// Bumped on every change to anything snapshots are made of.
    pub(crate) fn changes(&self) -> change::Receiver<u64> {
        self.changes.clone()
    }

    /// What events touched since the last call (the push source's to call).
    pub(crate) fn take_touched(&self) -> Touched {
        self.dirty.take()
    }

    /// Tells when a store was replaced by a fresh list, from now on.
    pub(crate) fn relisted(&self) -> impl Stream<Item = ()> + Send + 'static {
        self.relisted.subscribe()
    }

    /// The ClusterIPs of the `default/kubernetes` Service, by which pods
    /// reach the API server; empty until the Services are listed.
    pub(crate) fn api_server_ips(&self) -> Vec<IpAddr> {
        let Some(svc) = self
            .services
            .store
            .get(&ObjectRef::new("kubernetes").within("default"))
        else {
            return Vec::new();
        };
        let spec = svc.spec.as_ref();
        let ips = spec
            .and_then(|s| s.cluster_ips.clone())
            .filter(|ips| !ips.is_empty())
            .or_else(|| spec.and_then(|s| s.cluster_ip.clone()).map(|ip| vec![ip]))
            .unwrap_or_default();
        // "None" (headless) and anything else that is not an address is skipped.
        ips.iter().filter_map(|ip| ip.parse().ok()).collect()
    }

    /// Every RetryPolicy.
    pub(crate) fn policies(&self) -> Vec<Arc<RetryPolicy>> {
        self.policies.store.state()
    }

    /// The labels of `namespace` (none while it is not known).
    pub(crate) fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
        self.namespaces
            .store
            .get(&ObjectRef::new(namespace))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }

    /// The upstream `policy`'s `targetRef` resolves to, for clients in the
    /// policy's namespace.
    pub(crate) fn target(&self, policy: &RetryPolicy) -> Result<SnapshotUpstream, TargetProblem> {
        let own = policy.namespace().unwrap_or_default();
        self.target_for(policy, &own)
    }

    /// The upstream `policy`'s `targetRef` resolves to, for clients in
    /// `client_namespace` (the short name reaches it only from its own).
    pub(crate) fn target_for(
        &self,
        policy: &RetryPolicy,
        client_namespace: &str,
    ) -> Result<SnapshotUpstream, TargetProblem> {
        let own = policy.namespace().unwrap_or_default();
        self.service_upstream(
            policy.spec.target_namespace(&own),
            &policy.spec.target_ref.name,
            policy.spec.target_ref.port,
            client_namespace,
        )
    }

    /// The upstream the Service `name` in `namespace` is, on `port`, for
    /// clients in `client_namespace`: its endpoints, its TLS (a
    /// BackendTLSPolicy) and its budget (an XBackendTrafficPolicy).
    pub(crate) fn service_upstream(
        &self,
        namespace: &str,
        name: &str,
        port: Option<i32>,
        client_namespace: &str,
    ) -> Result<SnapshotUpstream, TargetProblem> {
        let service = self
            .services
            .store
            .get(&ObjectRef::new(name).within(namespace));
        let slices = self.slices.store.state_filter(|s| {
            s.namespace().as_deref() == Some(namespace)
                && s.labels().get(SERVICE_NAME_LABEL).map(String::as_str) == Some(name)
        });
        let mut upstream = target::resolve(
            service.as_deref(),
            slices.iter().map(|s| &**s),
            port,
            client_namespace,
        )?;
        let port_name = target::port_name(service.as_deref(), port);
        self.with_tls(&mut upstream, namespace, name, port_name.as_deref())?;
        if let Some((_, Ok(budget))) = self.budget_of(namespace, name) {
            upstream.budget = Some(budget);
        }
        Ok(upstream)
    }

    /// The policies whose `targetRef` names the Service `service` in
    /// `namespace`, from any namespace.
    pub(crate) fn targeting(
        &self,
        namespace: Option<&str>,
        service: Option<&str>,
    ) -> Vec<ObjectRef<RetryPolicy>> {
        self.policies
            .store
            .state()
            .iter()
            .filter(|p| {
                let own = p.namespace().unwrap_or_default();
                Some(p.spec.target_namespace(&own)) == namespace
                    && Some(p.spec.target_ref.name.as_str()) == service
            })
            .map(|p| ObjectRef::from_obj(&**p))
            .collect()
    }
}
