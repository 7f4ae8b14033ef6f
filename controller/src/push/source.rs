//! What a sidecar is pushed: the snapshot of the valid policies that select
//! its pod, with the endpoints of their targets, computed from the shared
//! [`Cache`] the reconciler also reads.
//!
//! The cache source keeps each policy's entry, each upstream's (a Service's
//! endpoints, TLS and budget, as one side of its callers sees it) and each
//! namespace's routes between changes, and computes again only what a
//! change touched: an EndpointSlice event, its Service's upstreams; a
//! policy event, that policy; a route event, its namespace's routes. A
//! sidecar's snapshot is then the entries of the policies and routes that
//! reach it, shared, not copied. A change reaches the namespaces of the
//! policies and routes it touched, and every namespace when one of them is
//! a producer's (it applies to callers everywhere).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use reprise_crds::resource::RetryPolicy;
use reprise_crds::snapshot::{
    Entries, PolicyEntry, PolicyRef, Snapshot, SnapshotPolicy, UpstreamEntry,
};
use tokio::sync::watch;

use super::auth::Identity;
use crate::cache::routes::{self, RouteSet};
use crate::cache::Cache;
use crate::policy::route::read::ServiceParent;
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

    /// Adds what `other` names.
    fn merge(&mut self, other: Changed) {
        match other {
            Changed::Nothing => {}
            Changed::All => *self = Changed::All,
            Changed::Namespaces(set) => {
                for ns in set {
                    self.add(&ns);
                }
            }
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

/// A Service for one side of its callers: `(namespace, name, port, the
/// caller in its namespace)`; only callers there reach it by its short name.
type UpstreamKey = (String, String, Option<i32>, bool);

/// What the cache source keeps between changes.
#[derive(Default)]
struct Memo {
    /// RetryPolicy names by namespace.
    by_namespace: HashMap<String, BTreeSet<String>>,
    /// RetryPolicies that apply beyond their namespace (producers).
    producers: BTreeSet<PolicyRef>,
    /// RetryPolicies by the Service they target, `(namespace, name)`.
    by_target: HashMap<(String, String), BTreeSet<PolicyRef>>,
    /// Each policy's entry for its own namespace's callers (`false`) or
    /// others' (`true`); `None` when it is not pushed (invalid).
    policies: HashMap<(PolicyRef, bool), Option<Arc<PolicyEntry>>>,
    /// Each upstream as a side of its callers sees it; `None` when the
    /// Service does not resolve.
    upstreams: HashMap<UpstreamKey, Option<Arc<UpstreamEntry>>>,
    /// The routes of each namespace, by the Service they attach to.
    routes: HashMap<String, Arc<BTreeMap<ServiceParent, RouteSet>>>,
    /// Route namespaces by the Service their routes attach to.
    route_parents: HashMap<(String, String), BTreeSet<String>>,
    /// Each group's entries (by namespace and labels), kept until a change
    /// may reach them; a change of a Service's endpoints is patched into
    /// the kept entries that hold its upstream rather than computed again,
    /// so that a producer's Service, in every snapshot, costs a pointer
    /// swap per group.
    kept: HashMap<(String, Vec<(String, String)>), Kept>,
    /// When idle kept entries were last dropped.
    swept: Option<std::time::Instant>,
    /// Namespaces touched since [`SnapshotSource::take_changed`] last said.
    unreported: Changed,
    /// Set once the indexes were built from the whole store.
    indexed: bool,
}

/// A group's entries, and the key each upstream was computed under.
#[derive(Clone)]
struct Kept {
    entries: Entries,
    keys: BTreeMap<String, UpstreamKey>,
    /// When a stream last asked for them.
    used: std::time::Instant,
}

impl Default for Kept {
    fn default() -> Self {
        Kept {
            entries: Entries::default(),
            keys: BTreeMap::new(),
            used: std::time::Instant::now(),
        }
    }
}

/// Kept entries no stream asked for this long are dropped: a rollout gives
/// its pods new labels (`pod-template-hash`), so the old groups' entries
/// would otherwise stay for good. A live group's are computed again.
const KEPT_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

impl std::fmt::Debug for CacheSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheSource").finish_non_exhaustive()
    }
}

impl Memo {
    /// Indexes `p` (present) or forgets it, returning whether it was or is
    /// a producer (its change then reaches every namespace).
    fn index_policy(&mut self, key: &PolicyRef, p: Option<&RetryPolicy>) -> bool {
        let was = self.producers.remove(key);
        for refs in self.by_target.values_mut() {
            refs.remove(key);
        }
        let names = self.by_namespace.entry(key.namespace.clone()).or_default();
        let Some(p) = p else {
            names.remove(&key.name);
            return was;
        };
        names.insert(key.name.clone());
        let target = (
            p.spec.target_namespace(&key.namespace).to_string(),
            p.spec.target_ref.name.clone(),
        );
        self.by_target
            .entry(target)
            .or_default()
            .insert(key.clone());
        let is = selection::is_producer(p);
        if is {
            self.producers.insert(key.clone());
        }
        was || is
    }

    /// Reads the routes of `namespace` again, returning whether a
    /// producer's (a route in its Service's namespace) was or is among them.
    fn index_routes(&mut self, cache: &Cache, namespace: &str) -> bool {
        let sets = routes::sets(&cache.route_verdicts(Some(namespace)));
        let old = self.routes.insert(namespace.to_string(), Arc::new(sets));
        let producer_in = |sets: &BTreeMap<ServiceParent, RouteSet>| {
            sets.keys().any(|s| s.namespace == namespace)
        };
        let mut producer = old.as_deref().is_some_and(producer_in);
        for refs in self.route_parents.values_mut() {
            refs.remove(namespace);
        }
        if let Some(sets) = self.routes.get(namespace).cloned() {
            producer |= producer_in(&sets);
            for service in sets.keys() {
                self.route_parents
                    .entry((service.namespace.clone(), service.name.clone()))
                    .or_default()
                    .insert(namespace.to_string());
            }
        }
        producer
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
    /// entries they may have changed and notes the namespaces whose
    /// sidecars they may reach.
    fn sync(&self, memo: &mut Memo) {
        let touched = self.cache.take_touched();
        if touched.all || !memo.indexed {
            *memo = Memo::default();
            for p in self.cache.policies() {
                let key = PolicyRef {
                    namespace: p.namespace().unwrap_or_default(),
                    name: p.name_any(),
                };
                memo.index_policy(&key, Some(&p));
            }
            let route_namespaces: BTreeSet<String> = self
                .cache
                .route_verdicts(None)
                .into_iter()
                .map(|v| v.namespace)
                .collect();
            for ns in route_namespaces {
                memo.index_routes(&self.cache, &ns);
            }
            memo.indexed = true;
            memo.unreported = Changed::All;
            return;
        }
        for (ns, name) in touched.policies {
            let key = PolicyRef {
                namespace: ns.clone(),
                name,
            };
            let p = self
                .cache
                .policies
                .store
                .get(&ObjectRef::<RetryPolicy>::new(&key.name).within(&ns));
            if memo.index_policy(&key, p.as_deref()) {
                memo.unreported = Changed::All;
                memo.kept.clear();
            }
            memo.kept.retain(|(n, _), _| *n != ns);
            memo.policies.remove(&(key.clone(), false));
            memo.policies.remove(&(key, true));
            memo.unreported.add(&ns);
        }
        for ns in touched.routes {
            if memo.index_routes(&self.cache, &ns) {
                memo.unreported = Changed::All;
                memo.kept.clear();
            }
            memo.kept.retain(|(n, _), _| *n != ns);
            memo.unreported.add(&ns);
        }
        for ns in touched.namespaces {
            // A producer's selector may take or leave it.
            memo.kept.retain(|(n, _), _| *n != ns);
            memo.unreported.add(&ns);
        }
        for (ns, service) in touched.services {
            memo.upstreams
                .retain(|(n, s, _, _), _| !(*n == ns && *s == service));
            let key = (ns.clone(), service);
            let mut reached = Changed::Nothing;
            for p in memo.by_target.get(&key).cloned().unwrap_or_default() {
                if memo.producers.contains(&p) {
                    reached = Changed::All;
                }
                reached.add(&p.namespace);
            }
            for route_ns in memo.route_parents.get(&key).cloned().unwrap_or_default() {
                if route_ns == ns {
                    reached = Changed::All;
                }
                reached.add(&route_ns);
            }
            self.patch_kept(memo, &key, &reached);
            memo.unreported.merge(reached);
        }
    }

    /// Brings the kept entries of the groups `reached` names up to date
    /// with the Service `service`'s upstream: patched where they hold it and
    /// it still resolves, forgotten otherwise (computed again on demand:
    /// a Service that appears may bring policies in).
    fn patch_kept(&self, memo: &mut Memo, service: &(String, String), reached: &Changed) {
        let name = format!("{}.{}", service.1, service.0);
        let groups: Vec<(String, Vec<(String, String)>)> = memo
            .kept
            .keys()
            .filter(|(ns, _)| reached.includes(ns))
            .cloned()
            .collect();
        for group in groups {
            let Some(key) = memo
                .kept
                .get(&group)
                .and_then(|k| k.keys.get(&name))
                .cloned()
            else {
                memo.kept.remove(&group);
                continue;
            };
            let client = if key.3 {
                key.0.clone()
            } else {
                group.0.clone()
            };
            let fresh = self.upstream_entry(memo, (&key.0, &key.1, key.2), &client);
            match (fresh, memo.kept.get_mut(&group)) {
                (Some(u), Some(kept)) => {
                    kept.entries.upstreams.insert(name.clone(), u);
                }
                _ => {
                    memo.kept.remove(&group);
                }
            }
        }
    }

    /// A policy's entry, as callers in its namespace (`other` false) or
    /// elsewhere see it, when it is pushed.
    fn policy_entry(
        &self,
        memo: &mut Memo,
        key: &PolicyRef,
        p: &RetryPolicy,
        other: bool,
    ) -> Option<Arc<PolicyEntry>> {
        if let Some(e) = memo.policies.get(&(key.clone(), other)) {
            return e.clone();
        }
        let entry = policy::validate(p).is_empty().then(|| {
            let own = p.namespace().unwrap_or_default();
            Arc::new(PolicyEntry::new(SnapshotPolicy {
                namespace: own.clone(),
                name: p.name_any(),
                generation: policy::generation(p),
                upstream: format!(
                    "{}.{}",
                    p.spec.target_ref.name,
                    p.spec.target_namespace(&own)
                ),
                rule: p.spec.rule.clone(),
                precedence: if other { routes::PRODUCER_POLICIES } else { 0 },
                route: None,
            }))
        });
        memo.policies.insert((key.clone(), other), entry.clone());
        entry
    }

    /// The upstream of Service `name` in `namespace` on `port`, as callers
    /// in `client` see it, when it resolves.
    fn upstream_entry(
        &self,
        memo: &mut Memo,
        (namespace, name, port): (&str, &str, Option<i32>),
        client: &str,
    ) -> Option<Arc<UpstreamEntry>> {
        let key = (
            namespace.to_string(),
            name.to_string(),
            port,
            namespace == client,
        );
        if let Some(e) = memo.upstreams.get(&key) {
            return e.clone();
        }
        let entry = self
            .cache
            .service_upstream(namespace, name, port, client)
            .ok()
            .map(|u| Arc::new(UpstreamEntry::new(u)));
        memo.upstreams.insert(key, entry.clone());
        entry
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Kept {
    /// Adds `policy` and its `upstream`, computed under `key`.
    fn add(&mut self, policy: Arc<PolicyEntry>, upstream: Arc<UpstreamEntry>, key: UpstreamKey) {
        self.keys.insert(upstream.upstream.name.clone(), key);
        self.entries
            .upstreams
            .insert(upstream.upstream.name.clone(), upstream);
        self.entries.policies.insert(policy.key(), policy);
    }
}

/// The memo key of the upstream `(namespace, name, port)` for callers in `client`.
fn upstream_key((namespace, name, port): (&str, &str, Option<i32>), client: &str) -> UpstreamKey {
    (
        namespace.to_string(),
        name.to_string(),
        port,
        namespace == client,
    )
}

impl SnapshotSource for CacheSource {
    fn snapshot_for(&self, id: &Identity) -> Snapshot {
        let s = self.entries_for(id).to_snapshot();
        Snapshot::new(s.upstreams, s.policies)
    }

    /// In the order of precedence: the pod's own namespace's RetryPolicies
    /// that select it and its routes, then the producers' RetryPolicies
    /// that reach it and the producers' routes for the Services its own
    /// namespace has no route for (`docs/src/concepts/precedence.md`).
    fn entries_for(&self, id: &Identity) -> Entries {
        let mut memo = self.lock();
        self.sync(&mut memo);
        let group = (
            id.namespace.clone(),
            id.labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>(),
        );
        let now = std::time::Instant::now();
        if memo
            .swept
            .is_none_or(|t| now.duration_since(t) > KEPT_IDLE / 10)
        {
            memo.kept
                .retain(|_, k| now.duration_since(k.used) < KEPT_IDLE);
            memo.swept = Some(now);
        }
        if let Some(kept) = memo.kept.get_mut(&group) {
            kept.used = now;
            return kept.entries.clone();
        }
        let kept = self.compute_entries(&mut memo, id);
        let entries = kept.entries.clone();
        memo.kept.insert(group, kept);
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

impl CacheSource {
    /// The entries of `id`'s group, computed from the memo.
    fn compute_entries(&self, memo: &mut Memo, id: &Identity) -> Kept {
        let ns = id.namespace.as_str();
        let mut entries = Kept::default();
        let own: Vec<String> = memo
            .by_namespace
            .get(ns)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default();
        for name in own {
            let Some(p) = self
                .cache
                .policies
                .store
                .get(&ObjectRef::new(&name).within(ns))
            else {
                continue;
            };
            if !selection::selects(&p, &id.labels) {
                continue;
            }
            let key = PolicyRef {
                namespace: ns.to_string(),
                name,
            };
            let target = (
                p.spec.target_namespace(ns),
                p.spec.target_ref.name.as_str(),
                p.spec.target_ref.port,
            );
            if let (Some(policy), Some(upstream)) = (
                self.policy_entry(memo, &key, &p, false),
                self.upstream_entry(memo, target, ns),
            ) {
                entries.add(policy, upstream, upstream_key(target, ns));
            }
        }
        let own_routes = memo.routes.get(ns).cloned().unwrap_or_default();
        for (service, set) in own_routes.iter() {
            let target = (
                service.namespace.as_str(),
                service.name.as_str(),
                service.port,
            );
            if let Some(upstream) = self.upstream_entry(memo, target, ns) {
                for policy in &set.own {
                    entries.add(
                        Arc::clone(policy),
                        Arc::clone(&upstream),
                        upstream_key(target, ns),
                    );
                }
            }
        }
        let mut labels: Option<BTreeMap<String, String>> = None;
        let producers: Vec<PolicyRef> = memo
            .producers
            .iter()
            .filter(|p| p.namespace != ns)
            .cloned()
            .collect();
        for key in producers {
            let Some(p) = self
                .cache
                .policies
                .store
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
            else {
                continue;
            };
            let covered = selection::applies(
                &p,
                ns,
                || {
                    labels
                        .get_or_insert_with(|| self.cache.namespace_labels(ns))
                        .clone()
                },
                &id.labels,
            );
            if !covered {
                continue;
            }
            let target = (
                key.namespace.as_str(),
                p.spec.target_ref.name.as_str(),
                p.spec.target_ref.port,
            );
            if let (Some(policy), Some(upstream)) = (
                self.policy_entry(memo, &key, &p, true),
                self.upstream_entry(memo, target, ns),
            ) {
                entries.add(policy, upstream, upstream_key(target, ns));
            }
        }
        let producer_routes: Vec<(ServiceParent, Vec<Arc<PolicyEntry>>)> = memo
            .routes
            .iter()
            .filter(|(route_ns, _)| route_ns.as_str() != ns)
            .flat_map(|(route_ns, sets)| {
                sets.iter()
                    .filter(|(s, _)| s.namespace == *route_ns)
                    .map(|(s, set)| (s.clone(), set.other.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (service, policies) in producer_routes {
            // A consumer's routes for the Service replace the producer's.
            let replaced = own_routes
                .keys()
                .any(|s| s.namespace == service.namespace && s.name == service.name);
            if replaced {
                continue;
            }
            let target = (
                service.namespace.as_str(),
                service.name.as_str(),
                service.port,
            );
            if let Some(upstream) = self.upstream_entry(memo, target, ns) {
                for policy in policies {
                    entries.add(policy, Arc::clone(&upstream), upstream_key(target, ns));
                }
            }
        }
        entries
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

    /// Services `api` in `shop` and `catalog`, each with one endpoint.
    fn two_namespaces(
        policies: Vec<RetryPolicy>,
        routes: Vec<crate::policy::route::HTTPRoute>,
    ) -> Cache {
        let mut services = Vec::new();
        let mut slices = Vec::new();
        for (ns, ip) in [
            ("shop", "127.0.0.11"),
            ("catalog", "127.0.0.21"),
            ("web", "127.0.0.31"),
        ] {
            let mut s = service(serde_json::json!([{ "name": "http", "port": 80 }]));
            s.metadata.namespace = Some(ns.into());
            services.push(s);
            let mut sl = slice(
                "api-1",
                serde_json::json!([{ "addresses": [ip], "conditions": { "ready": true } }]),
            );
            sl.metadata.namespace = Some(ns.into());
            slices.push(sl);
        }
        Cache::fixed(policies, services, slices).with_gateway_api(
            [
                fixtures::namespace("shop", &[("team", "web")]),
                fixtures::namespace("catalog", &[]),
                fixtures::namespace("web", &[("team", "web")]),
                fixtures::namespace("other", &[]),
            ],
            routes,
            [],
            [],
        )
    }

    fn pod_in(ns: &str) -> Identity {
        Identity {
            namespace: ns.into(),
            pod: "web-1".into(),
            labels: BTreeMap::from([("app".to_string(), "web".to_string())]),
            capabilities: Default::default(),
        }
    }

    /// `(id, precedence)` of each policy.
    type Ranks = Vec<(String, u8)>;
    /// Each upstream's hosts.
    type Hosts = BTreeMap<String, Vec<String>>;

    /// `(id, precedence)` of each policy, and each upstream's hosts.
    fn seen(entries: &Entries) -> (Ranks, Hosts) {
        (
            entries
                .policies
                .values()
                .map(|p| (p.policy.id(), p.policy.precedence))
                .collect(),
            entries
                .upstreams
                .values()
                .map(|u| (u.upstream.name.clone(), u.upstream.hosts.clone()))
                .collect(),
        )
    }

    #[test]
    fn a_consumer_policy_reaches_another_namespaces_service_for_its_own_callers_only() {
        let consumer = fixtures::policy()
            .named("reads")
            .targeting("catalog", "api")
            .build();
        let source = CacheSource::new(two_namespaces(vec![consumer], vec![]));
        let (policies, upstreams) = seen(&source.entries_for(&pod_in("shop")));
        assert_eq!(policies, [("shop/reads".to_string(), 0)]);
        assert_eq!(
            upstreams["api.catalog"],
            [
                "api.catalog",
                "api.catalog.svc",
                "api.catalog.svc.cluster.local"
            ],
            "no short name: `api` is shop's own Service from shop"
        );
        assert!(source.entries_for(&pod_in("catalog")).policies.is_empty());
    }

    #[test]
    fn a_producer_policy_reaches_the_namespaces_it_names_after_their_own() {
        let all = fixtures::policy()
            .named("everyone")
            .in_namespace("catalog")
            .callers(None)
            .build();
        let selected = fixtures::policy()
            .named("team")
            .in_namespace("catalog")
            .callers(Some(("team", "web")))
            .build();
        let source = CacheSource::new(two_namespaces(vec![all, selected], vec![]));
        let (policies, upstreams) = seen(&source.entries_for(&pod_in("web")));
        assert_eq!(
            policies,
            [
                ("catalog/everyone".to_string(), routes::PRODUCER_POLICIES),
                ("catalog/team".to_string(), routes::PRODUCER_POLICIES)
            ]
        );
        assert_eq!(upstreams["api.catalog"][0], "api.catalog");
        let (policies, _) = seen(&source.entries_for(&pod_in("other")));
        assert_eq!(
            policies,
            [("catalog/everyone".to_string(), routes::PRODUCER_POLICIES)],
            "other has no team label"
        );
        let (policies, upstreams) = seen(&source.entries_for(&pod_in("catalog")));
        assert_eq!(
            policies,
            [
                ("catalog/everyone".to_string(), 0),
                ("catalog/team".to_string(), 0)
            ],
            "its own namespace's callers first"
        );
        assert_eq!(upstreams["api.catalog"][0], "api");
    }

    #[test]
    fn a_consumers_routes_replace_the_producers_for_its_callers() {
        let producer = fixtures::http_route("catalog", "retries", "catalog", "/", &[503], 2);
        let consumer = fixtures::http_route("web", "mine", "catalog", "/v1", &[500], 1);
        let source = CacheSource::new(two_namespaces(vec![], vec![producer, consumer]));
        let (policies, _) = seen(&source.entries_for(&pod_in("shop")));
        assert_eq!(
            policies,
            [(
                "catalog/HTTPRoute:retries:0:api.catalog".to_string(),
                routes::PRODUCER_ROUTES
            )]
        );
        let (policies, _) = seen(&source.entries_for(&pod_in("web")));
        assert_eq!(
            policies,
            [(
                "web/HTTPRoute:mine:0:api.catalog".to_string(),
                routes::OWN_ROUTES
            )],
            "web's own route replaces the producer's"
        );
        let (policies, _) = seen(&source.entries_for(&pod_in("catalog")));
        assert_eq!(
            policies,
            [(
                "catalog/HTTPRoute:retries:0:api.catalog".to_string(),
                routes::OWN_ROUTES
            )]
        );
        // What the sidecar runs: the route's rule, element-wise prefix, 504 deadline off.
        let snapshot = source.snapshot_for(&pod_in("web"));
        let config = snapshot.resolve().expect("valid");
        assert_eq!(config.rules.len(), 1);
        assert_eq!(config.rules[0].precedence, routes::OWN_ROUTES);
        assert_eq!(
            config.rules[0].request_match.path_segment_prefix.as_deref(),
            Some("/v1")
        );
        assert_eq!(config.rules[0].policy.retry_statuses.statuses(), vec![500]);
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
            // Consumers of the other namespace's Services, producers for
            // every namespace or a labelled one, and now and then both (which
            // the API server refuses, and so must the controller).
            match rng.random_range(0..6) {
                0 => p.spec.target_ref.namespace = Some(NAMESPACES[rng.random_range(0..2)].into()),
                1 => p = fixtures::PolicyBuilder::from(p).callers(None).build(),
                2 => {
                    p = fixtures::PolicyBuilder::from(p)
                        .callers(Some(("team", "x")))
                        .build()
                }
                3 => {
                    p.spec.target_ref.namespace = Some(NAMESPACES[rng.random_range(0..2)].into());
                    p = fixtures::PolicyBuilder::from(p).callers(None).build();
                }
                _ => {}
            }
            p
        }

        fn route(rng: &mut StdRng, ns: &str, name: &str) -> crate::policy::route::HTTPRoute {
            let mut r = fixtures::http_route(
                ns,
                name,
                NAMESPACES[rng.random_range(0..2)],
                ["/", "/a", "/a/b"][rng.random_range(0..3)],
                &[503],
                rng.random_range(0..3),
            );
            if let Some(parent) = r.spec.parent_refs.first_mut() {
                parent.name = SERVICES[rng.random_range(0..2)].into();
            }
            if let Some(b) = r
                .spec
                .rules
                .first_mut()
                .and_then(|rule| rule.backend_refs.first_mut())
            {
                b.name = r.spec.parent_refs[0].name.clone();
                // Now and then one Reprise refuses: another backend.
                if rng.random_range(0..5) == 0 {
                    b.name = "elsewhere".into();
                }
            }
            r
        }

        fn step(rng: &mut StdRng, feed: &mut Feed) {
            let ns = NAMESPACES[rng.random_range(0..2)];
            let svc = SERVICES[rng.random_range(0..2)];
            match rng.random_range(0..14) {
                10 | 11 => {
                    let name = format!("r{}", rng.random_range(0..2));
                    feed.apply_http_route(route(rng, ns, &name));
                }
                12 => {
                    let name = format!("r{}", rng.random_range(0..2));
                    feed.delete_http_route(route(rng, ns, &name));
                }
                13 => {
                    let labels: &[(&str, &str)] = if rng.random_range(0..2) == 0 {
                        &[("team", "x")]
                    } else {
                        &[]
                    };
                    feed.apply_namespace(fixtures::namespace(ns, labels));
                }
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
            let mut sources = [0usize; 4];
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
                        for p in now.policies.values() {
                            sources[usize::from(p.policy.precedence)] += 1;
                        }
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
            // Not vacuous: snapshots had endpoints and changed often, and
            // reached across namespaces through every kind of source.
            assert!(pushed > 3000 && changes > 1000, "{pushed} {changes}");
            for precedence in [
                0,
                routes::OWN_ROUTES,
                routes::PRODUCER_POLICIES,
                routes::PRODUCER_ROUTES,
            ] {
                assert!(
                    sources[usize::from(precedence)] > 100,
                    "precedence {precedence}: {sources:?}"
                );
            }
        }
    }
}
