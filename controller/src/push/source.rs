//! What a sidecar is pushed: the snapshot of the valid policies that select
//! its pod, with the endpoints of their targets, computed from the shared
//! [`Cache`] the reconciler also reads.
//!
//! The cache source keeps each policy's entries (the policy and its
//! target's endpoints, with their digests) between changes and computes
//! again only those a change touched: an EndpointSlice event recomputes the
//! policies targeting its Service, in its namespace; a policy event, that
//! policy. A sidecar's snapshot is then the entries of its namespace's
//! policies that select it, shared, not copied.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use reprise_crds::resource::RetryPolicy;
use reprise_crds::snapshot::{
    Entries, PolicyEntry, PolicyRef, Snapshot, SnapshotPolicy, UpstreamEntry,
};
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

    /// The same snapshot as entries (a source that keeps them between
    /// changes shares them instead of computing their digests again).
    fn entries_for(&self, id: &Identity) -> Entries {
        Entries::from_snapshot(self.snapshot_for(id))
    }

    /// Bumped on every change to anything snapshots are made of.
    fn changes(&self) -> watch::Receiver<u64>;

    /// Whose snapshots the changes since the last call may have changed
    /// (called once per batch of changes, by one task).
    fn take_changed(&self) -> Changed {
        Changed::All
    }
}

/// Whose snapshots a batch of changes may have changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Changed {
    /// Nobody's.
    #[default]
    Nothing,
    /// Those of sidecars in these namespaces.
    Namespaces(BTreeSet<String>),
    /// Anybody's.
    All,
}

impl Changed {
    /// True when sidecars of `namespace` may be affected.
    pub fn includes(&self, namespace: &str) -> bool {
        match self {
            Changed::Nothing => false,
            Changed::Namespaces(set) => set.contains(namespace),
            Changed::All => true,
        }
    }

    fn add(&mut self, namespace: &str) {
        match self {
            Changed::All => {}
            Changed::Namespaces(set) => {
                set.insert(namespace.to_string());
            }
            Changed::Nothing => *self = Changed::Namespaces([namespace.to_string()].into()),
        }
    }
}

/// Snapshots from the cache.
pub(crate) struct CacheSource {
    cache: Cache,
    memo: Mutex<Memo>,
}

/// A pushed policy's entries: itself and its target.
type Pushed = (Arc<PolicyEntry>, Arc<UpstreamEntry>);

/// What the cache source keeps between changes.
#[derive(Default)]
struct Memo {
    /// Policy names by namespace (a sidecar's snapshot only holds policies
    /// of its own namespace, and a policy targets a Service of its own).
    by_namespace: HashMap<String, BTreeSet<String>>,
    /// Each policy's entries, or `None` when it is not pushed (invalid, or
    /// its target does not resolve); computed on first use.
    entries: HashMap<PolicyRef, Option<Pushed>>,
    /// Namespaces touched since [`SnapshotSource::take_changed`] last said.
    unreported: Changed,
    /// Set once the index was built from the whole store.
    indexed: bool,
}

impl std::fmt::Debug for CacheSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheSource").finish_non_exhaustive()
    }
}

impl CacheSource {
    /// The source of snapshots from `cache`.
    pub(crate) fn new(cache: Cache) -> Self {
        CacheSource {
            cache,
            memo: Mutex::default(),
        }
    }

    /// Brings the memo up to date with what events touched: forgets the
    /// entries they may have changed and notes their namespaces.
    fn sync(&self, memo: &mut Memo) {
        let touched = self.cache.take_touched();
        if touched.all || !memo.indexed {
            memo.entries.clear();
            memo.by_namespace.clear();
            for p in self.cache.policies() {
                memo.by_namespace
                    .entry(p.namespace().unwrap_or_default())
                    .or_default()
                    .insert(p.name_any());
            }
            memo.indexed = true;
            memo.unreported = Changed::All;
            return;
        }
        for (ns, name) in touched.policies {
            let key = ObjectRef::<RetryPolicy>::new(&name).within(&ns);
            let names = memo.by_namespace.entry(ns.clone()).or_default();
            if self.cache.policies.store.get(&key).is_some() {
                names.insert(name.clone());
            } else {
                names.remove(&name);
            }
            memo.entries.remove(&PolicyRef {
                namespace: ns.clone(),
                name,
            });
            memo.unreported.add(&ns);
        }
        for (ns, service) in touched.services {
            let names = memo.by_namespace.get(&ns).cloned().unwrap_or_default();
            for name in names {
                let targets = self
                    .cache
                    .policies
                    .store
                    .get(&ObjectRef::new(&name).within(&ns))
                    .is_some_and(|p| p.spec.target_ref.name == service);
                if targets {
                    memo.entries.remove(&PolicyRef {
                        namespace: ns.clone(),
                        name,
                    });
                    memo.unreported.add(&ns);
                }
            }
        }
    }

    /// A policy's entries, when it is pushed.
    fn compute(&self, p: &RetryPolicy) -> Option<Pushed> {
        if !policy::validate(p).is_empty() {
            return None;
        }
        let upstream = self.cache.target(p).ok()?;
        let policy = SnapshotPolicy {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
            generation: policy::generation(p),
            upstream: upstream.name.clone(),
            rule: p.spec.rule.clone(),
        };
        Some((
            Arc::new(PolicyEntry::new(policy)),
            Arc::new(UpstreamEntry::new(upstream)),
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SnapshotSource for CacheSource {
    fn snapshot_for(&self, id: &Identity) -> Snapshot {
        let s = self.entries_for(id).to_snapshot();
        Snapshot::new(s.upstreams, s.policies)
    }

    fn entries_for(&self, id: &Identity) -> Entries {
        let mut memo = self.lock();
        self.sync(&mut memo);
        let names = memo
            .by_namespace
            .get(&id.namespace)
            .cloned()
            .unwrap_or_default();
        let mut entries = Entries::default();
        for name in names {
            let Some(p) = self
                .cache
                .policies
                .store
                .get(&ObjectRef::new(&name).within(&id.namespace))
            else {
                continue;
            };
            if !selection::selects(&p, &id.labels) {
                continue;
            }
            let key = PolicyRef {
                namespace: id.namespace.clone(),
                name,
            };
            let computed = match memo.entries.get(&key) {
                Some(c) => c.clone(),
                None => {
                    let c = self.compute(&p);
                    memo.entries.insert(key.clone(), c.clone());
                    c
                }
            };
            if let Some((policy, upstream)) = computed {
                entries
                    .upstreams
                    .insert(upstream.upstream.name.clone(), upstream);
                entries.policies.insert(key, policy);
            }
        }
        entries
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.cache.changes()
    }

    fn take_changed(&self) -> Changed {
        let mut memo = self.lock();
        self.sync(&mut memo);
        std::mem::take(&mut memo.unreported)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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
        let snapshot = CacheSource::new(cache.clone()).snapshot_for(&id);
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

    /// The cluster the property test changes at random: in each of two
    /// namespaces, Services `api` and `db`, their slices, and policies
    /// selecting `app=a` or `app=b`.
    mod random {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};

        use super::*;
        use crate::cache::Feed;

        const NAMESPACES: [&str; 2] = ["shop", "web"];
        const SERVICES: [&str; 2] = ["api", "db"];

        fn service(ns: &str, name: &str, port: u16) -> k8s_openapi::api::core::v1::Service {
            let mut s = fixtures::service(serde_json::json!([{ "name": "http", "port": port }]));
            s.metadata.namespace = Some(ns.into());
            s.metadata.name = Some(name.into());
            s
        }

        fn slice(
            ns: &str,
            service: &str,
            n: usize,
            ips: &[u8],
        ) -> k8s_openapi::api::discovery::v1::EndpointSlice {
            let endpoints: Vec<serde_json::Value> = ips
                .iter()
                .map(|i| serde_json::json!({ "addresses": [format!("10.0.0.{i}")], "conditions": { "ready": true } }))
                .collect();
            let mut s = fixtures::slice(
                &format!("{service}-{n}"),
                serde_json::Value::Array(endpoints),
            );
            s.metadata.namespace = Some(ns.into());
            s.metadata.labels = Some(
                [(
                    crate::policy::target::SERVICE_NAME_LABEL.to_string(),
                    service.to_string(),
                )]
                .into(),
            );
            s
        }

        fn policy(rng: &mut StdRng, ns: &str, name: &str) -> RetryPolicy {
            let mut rule = RetryRule::default();
            // Now and then an invalid one, which is not pushed.
            rule.retries.attempts = rng.random_range(1..12);
            let mut p = fixtures::policy()
                .named(name)
                .selecting("app", ["a", "b"][rng.random_range(0..2)])
                .generation(rng.random_range(1..5))
                .rule(rule)
                .build();
            p.metadata.namespace = Some(ns.into());
            p.spec.target_ref.name = SERVICES[rng.random_range(0..2)].into();
            p
        }

        fn step(rng: &mut StdRng, feed: &mut Feed) {
            let ns = NAMESPACES[rng.random_range(0..2)];
            let svc = SERVICES[rng.random_range(0..2)];
            match rng.random_range(0..10) {
                0..=3 => {
                    let ips: Vec<u8> = (0..rng.random_range(0..5))
                        .map(|_| rng.random_range(1..20))
                        .collect();
                    feed.apply_slice(slice(ns, svc, rng.random_range(0..2), &ips));
                }
                4 => feed.delete_slice(slice(ns, svc, rng.random_range(0..2), &[])),
                5 => feed.apply_service(service(ns, svc, [80, 81][rng.random_range(0..2)])),
                6 => feed.delete_service(service(ns, svc, 80)),
                7 | 8 => {
                    let name = format!("p{}", rng.random_range(0..3));
                    feed.apply_policy(policy(rng, ns, &name));
                }
                _ => {
                    let name = format!("p{}", rng.random_range(0..3));
                    feed.delete_policy(policy(rng, ns, &name));
                }
            }
        }

        #[test]
        fn kept_entries_give_what_a_full_recomputation_gives_and_changes_name_their_namespace() {
            let ids: Vec<Identity> = NAMESPACES
                .iter()
                .flat_map(|ns| {
                    ["a", "b", "c"].map(|app| Identity {
                        namespace: ns.to_string(),
                        pod: format!("{app}-1"),
                        labels: BTreeMap::from([("app".to_string(), app.to_string())]),
                        capabilities: Default::default(),
                    })
                })
                .collect();
            let (mut pushed, mut changes) = (0, 0);
            for seed in 0..30u64 {
                let mut rng = StdRng::seed_from_u64(seed);
                let (cache, mut feed) = Cache::fed([], [], []);
                let kept = CacheSource::new(cache.clone());
                let mut before: Vec<Entries> = ids.iter().map(|id| kept.entries_for(id)).collect();
                kept.take_changed();
                for round in 0..80 {
                    for _ in 0..rng.random_range(1..4) {
                        step(&mut rng, &mut feed);
                    }
                    let changed = kept.take_changed();
                    let fresh = CacheSource::new(cache.clone());
                    for (i, id) in ids.iter().enumerate() {
                        let now = kept.entries_for(id);
                        assert_eq!(
                            now.version(),
                            fresh.entries_for(id).version(),
                            "seed {seed} round {round}: {}/{:?}",
                            id.namespace,
                            id.labels
                        );
                        pushed += usize::from(!now.upstreams.is_empty());
                        if now.version() != before[i].version() {
                            changes += 1;
                            assert!(
                                changed.includes(&id.namespace),
                                "seed {seed} round {round}: {}'s snapshot changed, unannounced ({changed:?})",
                                id.namespace
                            );
                        }
                        before[i] = now;
                    }
                }
            }
            // Not vacuous: snapshots had endpoints and changed often.
            assert!(pushed > 3000 && changes > 1000, "{pushed} {changes}");
        }
    }
}
