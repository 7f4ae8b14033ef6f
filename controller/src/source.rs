//! Snapshots computed from watched RetryPolicies, Services and EndpointSlices.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use reprise_crds::resource::RetryPolicy;
use reprise_crds::snapshot::{Snapshot, SnapshotPolicy};
use tokio::sync::watch;

use crate::auth::Identity;
use crate::push::SnapshotSource;
use crate::{endpoints, selection, status};

/// Snapshot source over reflector stores.
#[derive(Clone)]
pub struct StoreSource {
    /// RetryPolicies.
    pub policies: Store<RetryPolicy>,
    /// Services.
    pub services: Store<Service>,
    /// EndpointSlices.
    pub slices: Store<EndpointSlice>,
    /// Bumped by the watchers on every event.
    pub changes: watch::Receiver<u64>,
}

impl std::fmt::Debug for StoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSource").finish_non_exhaustive()
    }
}

impl SnapshotSource for StoreSource {
    fn snapshot_for(&self, id: &Identity) -> Snapshot {
        let mut upstreams = BTreeMap::new();
        let mut policies = Vec::new();
        for p in self.policies.state() {
            if p.namespace().as_deref() != Some(id.namespace.as_str())
                || !selection::selects(&p, &id.labels)
                || !status::validate(&p).is_empty()
            {
                continue;
            }
            let target = &p.spec.target_ref.name;
            let service = self
                .services
                .get(&ObjectRef::new(target).within(&id.namespace));
            let slices: Vec<EndpointSlice> = self
                .slices
                .state()
                .iter()
                .filter(|s| {
                    s.namespace().as_deref() == Some(id.namespace.as_str())
                        && s.labels().get("kubernetes.io/service-name") == Some(target)
                })
                .map(|s| (**s).clone())
                .collect();
            let Ok(upstream) = endpoints::resolve(
                service.as_deref(),
                &slices,
                p.spec.target_ref.port,
                &id.namespace,
            ) else {
                continue;
            };
            policies.push(SnapshotPolicy {
                namespace: id.namespace.clone(),
                name: p.name_any(),
                generation: p.metadata.generation.unwrap_or(0),
                upstream: upstream.name.clone(),
                rule: p.spec.rule.clone(),
            });
            upstreams.insert(upstream.name.clone(), upstream);
        }
        Snapshot::new(upstreams.into_values().collect(), policies)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }
}
