//! The status Reprise writes on the Gateway API objects it reads, as the
//! leader: on each HTTPRoute and GRPCRoute attached to a Service, an entry
//! of `status.parents` per Service parent; on each XBackendTrafficPolicy,
//! an entry of `status.ancestors` per Service it targets. Both under
//! [`CONTROLLER_NAME`], with `Accepted` (applied, or the field that keeps it
//! from being applied whole) and `ResolvedRefs` (the Service exists); a
//! route's entry also tells its rules' traffic over the last window in a
//! `reprise.dev/Traffic` condition (Gateway API leaves a route no traffic
//! field; implementation-specific conditions carry a domain).
//!
//! The lists are atomic and shared with other implementations (a mesh or a
//! gateway may program the same route): Reprise's entries are replaced,
//! the others kept as they were, and the list written back with the
//! `resourceVersion` read, so a concurrent write by another controller
//! fails this one (409), which the next pass tries again. Nothing is
//! written when the entries say what they already said. A route that tells
//! Reprise to ignore it loses Reprise's entries.
//!
//! The writer runs after every change (debounced) and once a minute.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{json, Value};

use super::backend_tls::CONTROLLER_NAME;
use super::Context;
use crate::cache::routes::{self, RouteVerdict};
use crate::policy::budget::XBackendTrafficPolicy;
use crate::policy::route::{GRPCRoute, HTTPRoute, ParentRef};
use crate::Error;

/// The condition of Reprise's entry that tells a route's traffic.
pub(crate) const TRAFFIC_CONDITION: &str = "reprise.dev/Traffic";

/// Changes closer together than this are written once.
const DEBOUNCE: Duration = Duration::from_secs(1);
/// Every status is checked again this often with nothing changed.
const RESYNC: Duration = Duration::from_secs(60);

/// Writes the routes' and budgets' status for as long as this replica leads.
pub(crate) async fn run(ctx: Arc<Context>) {
    let mut changes = ctx.cache.changes();
    loop {
        if let Err(e) = write_all(&ctx).await {
            tracing::debug!(error = %e, "Gateway API status not written; trying again");
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            () = ctx.traffic.routes_changed.notified() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
    }
}

/// One pass over every route and budget policy.
async fn write_all(ctx: &Context) -> Result<(), Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let verdicts = ctx.cache.route_verdicts(None);
    let mut by_route: BTreeMap<(&'static str, String, String), Vec<&RouteVerdict>> =
        BTreeMap::new();
    for v in &verdicts {
        by_route
            .entry((v.kind.name(), v.namespace.clone(), v.name.clone()))
            .or_default()
            .push(v);
    }
    let mut result = Ok(());
    for r in ctx.cache.http_routes.store.state() {
        let key = ("HTTPRoute", r.namespace().unwrap_or_default(), r.name_any());
        let mine = by_route.get(&key).map(Vec::as_slice).unwrap_or_default();
        let current = r
            .status
            .as_ref()
            .map(|s| s.parents.clone())
            .unwrap_or_default();
        if let Some(parents) = updated_parents(&current, &entries(ctx, mine, &current, &now)) {
            let api: Api<HTTPRoute> = Api::namespaced(ctx.client.clone(), &key.1);
            if let Err(e) = patch(
                &api,
                &r.name_any(),
                r.resource_version(),
                "parents",
                parents,
            )
            .await
            {
                result = Err(e);
            }
        }
    }
    for r in ctx.cache.grpc_routes.store.state() {
        let key = ("GRPCRoute", r.namespace().unwrap_or_default(), r.name_any());
        let mine = by_route.get(&key).map(Vec::as_slice).unwrap_or_default();
        let current = r
            .status
            .as_ref()
            .map(|s| s.parents.clone())
            .unwrap_or_default();
        if let Some(parents) = updated_parents(&current, &entries(ctx, mine, &current, &now)) {
            let api: Api<GRPCRoute> = Api::namespaced(ctx.client.clone(), &key.1);
            if let Err(e) = patch(
                &api,
                &r.name_any(),
                r.resource_version(),
                "parents",
                parents,
            )
            .await
            {
                result = Err(e);
            }
        }
    }
    for p in ctx.cache.traffic_policies.store.state() {
        let current = p
            .status
            .as_ref()
            .map(|s| s.ancestors.clone())
            .unwrap_or_default();
        if let Some(ancestors) =
            updated_ancestors(&current, &budget_entries(ctx, &p, &current, &now))
        {
            let ns = p.namespace().unwrap_or_default();
            let api: Api<XBackendTrafficPolicy> = Api::namespaced(ctx.client.clone(), &ns);
            if let Err(e) = patch(
                &api,
                &p.name_any(),
                p.resource_version(),
                "ancestors",
                ancestors,
            )
            .await
            {
                result = Err(e);
            }
        }
    }
    result
}

async fn patch<K>(
    api: &Api<K>,
    name: &str,
    version: Option<String>,
    field: &str,
    list: Vec<Value>,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({
        "metadata": { "resourceVersion": version },
        "status": { field: list },
    });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

/// Reprise's entries for one route: one per Service parent.
fn entries(ctx: &Context, verdicts: &[&RouteVerdict], current: &[Value], now: &Time) -> Vec<Value> {
    verdicts
        .iter()
        .map(|v| {
            let previous = current.iter().find(|e| ours(e) && same_parent(e, &v.parent));
            let found = ctx
                .cache
                .services
                .store
                .get(&kube::runtime::reflector::ObjectRef::new(&v.service.name).within(&v.service.namespace))
                .is_some();
            let side = if v.namespace == v.service.namespace {
                "a producer route: applies to every caller of the Service, but where a caller's namespace has routes of its own for it".to_string()
            } else {
                format!(
                    "a consumer route: applies to callers in {} and replaces the producer's routes for them",
                    v.namespace
                )
            };
            let accepted = match &v.read {
                Ok(read) => {
                    let mut said = vec![format!("applied by Reprise's sidecars; {side}")];
                    said.extend(read.notes.iter().cloned());
                    (true, "Accepted", said.join("; "))
                }
                Err(refused) => (false, refused.reason, refused.message.clone()),
            };
            let resolved = if found {
                (true, "ResolvedRefs", "every reference resolved".to_string())
            } else {
                (
                    false,
                    "BackendNotFound",
                    format!("Service {}/{} not found", v.service.namespace, v.service.name),
                )
            };
            let mut conditions = vec![
                condition(previous, "Accepted", accepted, v.generation, now),
                condition(previous, "ResolvedRefs", resolved, v.generation, now),
            ];
            // HTTPRoute has no traffic status: Reprise's entry carries it,
            // as a condition of its own domain (written at most once a minute).
            let traffic: Vec<String> = routes::rule_ids(v)
                .into_iter()
                .filter_map(|(rule, id)| {
                    let t = ctx.traffic.get(&id)?;
                    (t.requests > 0).then(|| {
                        format!(
                            "rule {rule}: {} requests over {}, first try {}, effective {}, {} retries, {} recovered, {} exhausted",
                            t.requests, t.window, t.first_try_success, t.effective_success, t.retries, t.recovered, t.exhausted_total
                        )
                    })
                })
                .collect();
            if !traffic.is_empty() {
                conditions.push(condition(
                    previous,
                    TRAFFIC_CONDITION,
                    (true, "Reported", traffic.join("; ")),
                    v.generation,
                    now,
                ));
            }
            json!({
                "parentRef": parent_json(&v.parent),
                "controllerName": CONTROLLER_NAME,
                "conditions": conditions,
            })
        })
        .collect()
}

/// Reprise's entries for one budget policy: one per Service it targets.
fn budget_entries(
    ctx: &Context,
    p: &XBackendTrafficPolicy,
    current: &[Value],
    now: &Time,
) -> Vec<Value> {
    let ns = p.namespace().unwrap_or_default();
    p.spec
        .target_refs
        .iter()
        .filter(|t| t.group.is_empty() && t.kind == "Service")
        .map(|t| {
            let previous = current.iter().find(|e| {
                ours(e)
                    && e["ancestorRef"]["kind"] == "Service"
                    && e["ancestorRef"]["name"] == t.name.as_str()
            });
            let accepted = match ctx.cache.budget_of(&ns, &t.name) {
                Some((winner, Ok(_))) if winner.name_any() == p.name_any() => (
                    true,
                    "Accepted",
                    format!(
                        "the retry budget of every retry Reprise's sidecars make to Service {}",
                        t.name
                    ),
                ),
                Some((winner, Err(refused))) if winner.name_any() == p.name_any() => {
                    (false, refused.reason, refused.message)
                }
                Some((winner, _)) => (
                    false,
                    "Conflicted",
                    format!(
                        "{} is older (or first by name) and sets Service {}'s budget",
                        winner.name_any(),
                        t.name
                    ),
                ),
                None => (false, "Invalid", "not read".to_string()),
            };
            let generation = p.metadata.generation.unwrap_or(0);
            json!({
                "ancestorRef": { "group": "", "kind": "Service", "name": t.name, "namespace": ns },
                "controllerName": CONTROLLER_NAME,
                "conditions": [condition(previous, "Accepted", accepted, generation, now)],
            })
        })
        .collect()
}

fn ours(e: &Value) -> bool {
    e["controllerName"] == CONTROLLER_NAME
}

fn parent_json(p: &ParentRef) -> Value {
    serde_json::to_value(p).unwrap_or(Value::Null)
}

fn same_parent(e: &Value, p: &ParentRef) -> bool {
    serde_json::from_value::<ParentRef>(e["parentRef"].clone()).is_ok_and(|q| q == *p)
}

/// A condition that keeps its transition time while its status and reason stay.
fn condition(
    previous: Option<&Value>,
    kind: &str,
    (ok, reason, message): (bool, &str, String),
    generation: i64,
    now: &Time,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .and_then(|p| p["conditions"].as_array())
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .filter(|c| c["status"] == status && c["reason"] == reason)
        .and_then(|c| serde_json::from_value::<Time>(c["lastTransitionTime"].clone()).ok())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        // A status message is capped (32 KiB); Reprise's are far shorter.
        message: message.chars().take(32 * 1024).collect(),
        observed_generation: Some(generation),
        last_transition_time: since,
    }
}

/// `current` with Reprise's entries replaced by `mine` (others kept, in
/// their place), or `None` when nothing changes.
fn updated_parents(current: &[Value], mine: &[Value]) -> Option<Vec<Value>> {
    let mut out: Vec<Value> = current.iter().filter(|e| !ours(e)).cloned().collect();
    out.extend(mine.iter().cloned());
    let unchanged = {
        let old: Vec<&Value> = current.iter().filter(|e| ours(e)).collect();
        old.len() == mine.len() && old.iter().zip(mine).all(|(a, b)| *a == b)
    };
    (!unchanged).then_some(out)
}

/// The same for a policy's ancestors.
fn updated_ancestors(current: &[Value], mine: &[Value]) -> Option<Vec<Value>> {
    updated_parents(current, mine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reprises_entries_change_and_an_unchanged_one_is_not_written() {
        let other = json!({ "parentRef": { "kind": "Service", "name": "api" }, "controllerName": "istio.io/mesh", "conditions": [] });
        let mine = json!({ "parentRef": { "kind": "Service", "name": "api" }, "controllerName": CONTROLLER_NAME, "conditions": [{"type": "Accepted"}] });
        let updated = updated_parents(std::slice::from_ref(&other), std::slice::from_ref(&mine))
            .expect("added");
        assert_eq!(updated, vec![other.clone(), mine.clone()]);
        assert_eq!(
            updated_parents(&updated, std::slice::from_ref(&mine)),
            None,
            "said already"
        );
        // A route Reprise no longer applies (ignored, or its parent gone): its entry goes, the other stays.
        assert_eq!(updated_parents(&updated, &[]), Some(vec![other]));
    }

    #[test]
    fn a_condition_keeps_its_time_while_it_says_the_same() {
        let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"));
        let first = condition(
            None,
            "Accepted",
            (true, "Accepted", "ok".into()),
            1,
            &at(100),
        );
        let previous = json!({ "conditions": [first] });
        let same = condition(
            Some(&previous),
            "Accepted",
            (true, "Accepted", "ok, said again".into()),
            2,
            &at(200),
        );
        assert_eq!(same.last_transition_time, at(100));
        let turned = condition(
            Some(&previous),
            "Accepted",
            (false, "UnsupportedValue", "no".into()),
            2,
            &at(300),
        );
        assert_eq!(turned.last_transition_time, at(300));
    }
}
