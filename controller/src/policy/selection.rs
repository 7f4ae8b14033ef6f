//! Which client pods a policy applies to: its `podSelector` (empty: all
//! pods) in its own namespace and, for a producer policy, in the namespaces
//! its `callerNamespaces` adds.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use reprise_crds::resource::{NamespacesFrom, RetryPolicy};

/// True when `policy` applies beyond its own namespace.
pub(crate) fn is_producer(policy: &RetryPolicy) -> bool {
    policy.spec.callers_from() != NamespacesFrom::Same
}

/// True when `policy` applies to callers in `namespace`, whose labels
/// `labels` gives (read only for a selector).
pub(crate) fn covers(
    policy: &RetryPolicy,
    namespace: &str,
    labels: impl FnOnce() -> BTreeMap<String, String>,
) -> bool {
    if policy.namespace().as_deref() == Some(namespace) {
        return true;
    }
    match &policy.spec.caller_namespaces {
        None => false,
        Some(c) => match c.from {
            NamespacesFrom::Same => false,
            NamespacesFrom::All => true,
            NamespacesFrom::Selector => c
                .selector
                .as_ref()
                .is_some_and(|sel| matches(sel, &labels())),
        },
    }
}

/// True when `policy` applies to a pod with `labels` in `namespace`.
pub(crate) fn applies(
    policy: &RetryPolicy,
    namespace: &str,
    namespace_labels: impl FnOnce() -> BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    covers(policy, namespace, namespace_labels) && selects(policy, labels)
}

/// True when `policy`'s `podSelector` selects a pod with `labels` (in a
/// namespace it covers).
pub(crate) fn selects(policy: &RetryPolicy, labels: &BTreeMap<String, String>) -> bool {
    match &policy.spec.pod_selector {
        None => true,
        Some(sel) => matches(sel, labels),
    }
}

/// Label selector semantics: every matchLabels pair and every expression holds.
fn matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selector_semantics() {
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": { "app": "web" },
            "matchExpressions": [
                { "key": "tier", "operator": "In", "values": ["front", "edge"] },
                { "key": "legacy", "operator": "DoesNotExist" }
            ]
        }))
        .expect("selector");
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(matches(&sel, &labels(&[("app", "web"), ("tier", "edge")])));
        assert!(!matches(&sel, &labels(&[("app", "web"), ("tier", "back")])));
        assert!(!matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "edge"), ("legacy", "1")])
        ));
        assert!(!matches(&sel, &labels(&[("tier", "edge")])));
        assert!(matches(&LabelSelector::default(), &labels(&[])));
    }
}
