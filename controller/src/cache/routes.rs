//! The Gateway API routes attached to Services, read from the cache: each
//! route's verdict for each Service parent (applied, or refused with the
//! field), and the ranked rules of every route of one namespace attached to
//! one Service, as snapshot policies (`docs/src/concepts/precedence.md`).
//!
//! A route in the Service's own namespace is its producer's: it applies to
//! every caller of the Service in the cluster. A route in another namespace
//! is a consumer's: it applies to that namespace's callers only, and
//! replaces every producer route for them (GAMMA). A route carrying
//! `reprise.dev/ignore: "true"` is left to whoever else programs it.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use reprise_crds::snapshot::{PolicyEntry, RouteKind, SnapshotPolicy};

use super::Cache;
use crate::policy::route::rank::{rank, Ranked};
use crate::policy::route::read::{self, Read, Refused, Route, Rules, ServiceParent};
use crate::policy::route::{ParentRef, IGNORE_ANNOTATION};

/// What one route says for one of its Service parents.
#[derive(Clone, Debug)]
pub(crate) struct RouteVerdict {
    /// The route's kind.
    pub(crate) kind: RouteKind,
    /// Its namespace.
    pub(crate) namespace: String,
    /// Its name.
    pub(crate) name: String,
    /// Its `metadata.generation`.
    pub(crate) generation: i64,
    /// Its creation time (RFC 3339), which orders routes.
    pub(crate) created: Option<String>,
    /// The parent reference, as written.
    pub(crate) parent: ParentRef,
    /// The Service it names.
    pub(crate) service: ServiceParent,
    /// The rules read, or why the route is not applied.
    pub(crate) read: Result<Read, Refused>,
}

/// Every route of one namespace attached to one Service: its rules ranked,
/// as snapshot policies for the route's own namespace's callers and for
/// every other namespace's.
#[derive(Clone, Debug, Default)]
pub(crate) struct RouteSet {
    /// For callers in the routes' namespace.
    pub(crate) own: Vec<Arc<PolicyEntry>>,
    /// For callers elsewhere (a producer's routes only; empty otherwise).
    pub(crate) other: Vec<Arc<PolicyEntry>>,
}

/// The precedence class of a route for callers in its own namespace.
pub(crate) const OWN_ROUTES: u8 = 1;
/// The precedence class of a producer's RetryPolicy for callers elsewhere.
pub(crate) const PRODUCER_POLICIES: u8 = 2;
/// The precedence class of a producer's route for callers elsewhere.
pub(crate) const PRODUCER_ROUTES: u8 = 3;

impl Cache {
    /// The verdicts of every route in `namespace` (every namespace when
    /// `None`), for each Service parent, but those Reprise is told to ignore.
    pub(crate) fn route_verdicts(&self, namespace: Option<&str>) -> Vec<RouteVerdict> {
        let in_ns = |ns: Option<String>| namespace.is_none_or(|n| ns.as_deref() == Some(n));
        let mut out = Vec::new();
        for r in self.http_routes.store.state() {
            if !in_ns(r.namespace()) {
                continue;
            }
            verdicts(
                &mut out,
                &r.metadata,
                RouteKind::Http,
                &r.spec.parent_refs,
                Rules::Http(&r.spec.rules),
            );
        }
        for r in self.grpc_routes.store.state() {
            if !in_ns(r.namespace()) {
                continue;
            }
            verdicts(
                &mut out,
                &r.metadata,
                RouteKind::Grpc,
                &r.spec.parent_refs,
                Rules::Grpc(&r.spec.rules),
            );
        }
        out
    }
}

fn verdicts(
    out: &mut Vec<RouteVerdict>,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kind: RouteKind,
    parents: &[ParentRef],
    rules: Rules<'_>,
) {
    let empty = BTreeMap::new();
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    if annotations.get(IGNORE_ANNOTATION).map(|v| v.trim()) == Some("true") {
        return;
    }
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let route = Route {
        kind,
        namespace: &namespace,
        name: &name,
        annotations,
        rules,
    };
    for parent in parents {
        let Some(service) = ServiceParent::of(parent, &namespace) else {
            continue;
        };
        out.push(RouteVerdict {
            kind,
            namespace: namespace.clone(),
            name: name.clone(),
            generation: meta.generation.unwrap_or(0),
            created: meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
            parent: parent.clone(),
            read: read::read(&route, &service),
            service,
        });
    }
}

/// The name a route rule's snapshot policy has for the Service `v`
/// attaches to: `Kind:route:rule:service.namespace`, so that its id
/// (`namespace/name`, in ACKs, traffic reports, metrics and logs) names the
/// route's kind and is unique among the Services a route attaches to.
pub(crate) fn policy_name(v: &RouteVerdict, rule: &str) -> String {
    format!(
        "{}:{}:{}:{}.{}",
        v.kind.name(),
        v.name,
        rule,
        v.service.name,
        v.service.namespace
    )
}

/// The ids (`namespace/name`) of the rules a verdict applies, by rule.
pub(crate) fn rule_ids(v: &RouteVerdict) -> Vec<(String, String)> {
    match &v.read {
        Ok(read) => read
            .rules
            .iter()
            .map(|r| {
                (
                    r.route.rule.clone(),
                    format!("{}/{}", v.namespace, policy_name(v, &r.route.rule)),
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The sets of the routes in one namespace, by the Service they attach to:
/// each applied route's rules ranked with the others' (Gateway API's order).
pub(crate) fn sets(verdicts: &[RouteVerdict]) -> BTreeMap<ServiceParent, RouteSet> {
    let mut by_service: BTreeMap<ServiceParent, Vec<&RouteVerdict>> = BTreeMap::new();
    for v in verdicts.iter().filter(|v| v.read.is_ok()) {
        by_service.entry(v.service.clone()).or_default().push(v);
    }
    by_service
        .into_iter()
        .map(|(service, routes)| {
            let producer = routes
                .first()
                .is_some_and(|r| r.namespace == service.namespace);
            let policies = ranked(&service, &routes);
            let entries = |precedence: u8| {
                policies
                    .iter()
                    .map(|p| {
                        Arc::new(PolicyEntry::new(SnapshotPolicy {
                            precedence,
                            ..p.clone()
                        }))
                    })
                    .collect::<Vec<_>>()
            };
            let set = RouteSet {
                own: entries(OWN_ROUTES),
                other: if producer {
                    entries(PRODUCER_ROUTES)
                } else {
                    Vec::new()
                },
            };
            (service, set)
        })
        .collect()
}

/// The snapshot policies of `routes` attached to `service`, every match
/// given its rank among all of theirs.
fn ranked(service: &ServiceParent, routes: &[&RouteVerdict]) -> Vec<SnapshotPolicy> {
    let mut policies: Vec<SnapshotPolicy> = Vec::new();
    // Where each policy comes from: its route and rule index.
    let mut origins: Vec<(&RouteVerdict, usize)> = Vec::new();
    for v in routes {
        let Ok(read) = &v.read else { continue };
        for r in &read.rules {
            origins.push((v, r.index));
            policies.push(SnapshotPolicy {
                namespace: v.namespace.clone(),
                name: policy_name(v, &r.route.rule),
                generation: v.generation,
                upstream: format!("{}.{}", service.name, service.namespace),
                rule: r.rule.clone(),
                precedence: 0,
                route: Some(r.route.clone()),
            });
        }
    }
    let mut at: Vec<(usize, usize)> = Vec::new();
    let mut keys: Vec<Ranked<'_>> = Vec::new();
    for (i, (p, (v, rule))) in policies.iter().zip(&origins).enumerate() {
        for (j, m) in p.route.iter().flat_map(|r| r.matches.iter()).enumerate() {
            at.push((i, j));
            keys.push(Ranked {
                kind: v.kind,
                created: v.created.clone(),
                route: format!("{}/{}", v.namespace, v.name),
                rule: *rule,
                index: j,
                m,
            });
        }
    }
    let priorities = rank(&keys);
    drop(keys);
    for ((i, j), priority) in at.into_iter().zip(priorities) {
        if let Some(route) = policies[i].route.as_mut() {
            route.matches[j].priority = priority;
        }
    }
    policies
}
