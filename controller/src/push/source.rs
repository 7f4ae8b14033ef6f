//! What a sidecar is pushed: the snapshot of the valid policies that select
//! its pod, with the endpoints of their targets, computed from the shared
//! [`Cache`] the reconciler also reads.

use std::collections::BTreeMap;

use kube::ResourceExt;
use reprise_crds::snapshot::{Snapshot, SnapshotPolicy};
use tokio::sync::watch;

use super::auth::Identity;
use crate::cache::Cache;
use crate::policy::{self, selection};

/// Computes snapshots and announces changes. A trait so the protocol can be
/// tested without an API server.
pub trait SnapshotSource: Send + Sync + 'static {
    /// The snapshot for one sidecar. It must depend only on the sidecar's
    /// namespace and labels: the server shares it between sidecars alike.
    fn snapshot_for(&self, id: &Identity) -> Snapshot;

    /// Bumped on every change to anything snapshots are made of.
    fn changes(&self) -> watch::Receiver<u64>;
}

/// Snapshots from the cache.
#[derive(Clone, Debug)]
pub(crate) struct CacheSource(pub(crate) Cache);

impl SnapshotSource for CacheSource {
    fn snapshot_for(&self, id: &Identity) -> Snapshot {
        let mut upstreams = BTreeMap::new();
        let mut policies = Vec::new();
        for p in self.0.policies() {
            if p.namespace().as_deref() != Some(id.namespace.as_str())
                || !selection::selects(&p, &id.labels)
                || !policy::validate(&p).is_empty()
            {
                continue;
            }
            let Ok(upstream) = self.0.target(&p) else {
                continue;
            };
            policies.push(SnapshotPolicy {
                namespace: id.namespace.clone(),
                name: p.name_any(),
                generation: policy::generation(&p),
                upstream: upstream.name.clone(),
                rule: p.spec.rule.clone(),
            });
            upstreams.insert(upstream.name.clone(), upstream);
        }
        Snapshot::new(upstreams.into_values().collect(), policies)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.0.changes()
    }
}

#[cfg(test)]
mod tests {
    use reprise_crds::retry_rule::RetryRule;

    use super::*;
    use crate::fixtures::{self, service, slice};
    use crate::reconcile::status::evaluate;
    use crate::sidecars::SyncCounts;

    fn cache() -> Cache {
        let valid = fixtures::policy().named("reads").build();
        let mut rule = RetryRule::default();
        rule.retries.attempts = 11;
        let invalid = fixtures::policy().named("broken").rule(rule).build();
        let elsewhere = fixtures::policy()
            .named("web-only")
            .selecting("app", "web")
            .build();
        let endpoints = serde_json::json!([
            { "addresses": ["127.0.0.11"], "conditions": { "ready": true }, "targetRef": { "kind": "Pod", "name": "api-a" } },
            { "addresses": ["127.0.0.12"], "conditions": { "ready": true }, "targetRef": { "kind": "Pod", "name": "api-b" } }
        ]);
        Cache::fixed(
            [valid, invalid, elsewhere],
            [service(serde_json::json!([{ "name": "http", "port": 80 }]))],
            [slice("api-1", endpoints)],
        )
    }

    #[test]
    fn sidecars_get_the_valid_policies_selecting_them_with_the_endpoints_status_counts() {
        let cache = cache();
        let id = Identity {
            namespace: "shop".into(),
            pod: "batch-1".into(),
            labels: BTreeMap::from([("app".to_string(), "batch".to_string())]),
            capabilities: Default::default(),
        };
        let snapshot = CacheSource(cache.clone()).snapshot_for(&id);
        let names: Vec<&str> = snapshot.policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["reads"],
            "not the invalid one, not the one for app=web"
        );
        assert_eq!(snapshot.upstreams.len(), 1);
        let pushed = &snapshot.upstreams[0];
        assert_eq!(pushed.name, "api.shop");
        assert_eq!(pushed.endpoints.len(), 2);

        // The reconciler reads the same cache: the status counts what is pushed.
        let reads = cache
            .policies()
            .into_iter()
            .find(|p| p.name_any() == "reads")
            .expect("reads");
        let target = cache.target(&reads);
        assert_eq!(target.as_ref().ok(), Some(pushed));
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        let eval = evaluate(&reads, &target, SyncCounts::default(), now);
        assert_eq!(eval.status.endpoints, 2);
        assert!(eval.accepted);
    }
}
