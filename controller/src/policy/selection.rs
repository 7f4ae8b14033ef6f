//! Which client pods a policy applies to: its `podSelector` (empty: all pods in
//! its namespace).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use reprise_crds::resource::RetryPolicy;

/// True when `policy` selects a pod with `labels` (in the policy's namespace).
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
