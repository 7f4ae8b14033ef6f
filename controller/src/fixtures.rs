//! Builders of the API objects unit tests start from.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use reprise_crds::resource::{RetryPolicy, RetryPolicySpec, TargetRef};
use reprise_crds::retry_rule::RetryRule;

use crate::policy::target::SERVICE_NAME_LABEL;

/// A RetryPolicy being built; [`policy`] starts one.
#[derive(Debug)]
pub(crate) struct PolicyBuilder(RetryPolicy);

/// The policy `shop/p` at generation 3, for requests to the Service `api`
/// from every pod, with the default rule.
pub(crate) fn policy() -> PolicyBuilder {
    let mut p = RetryPolicy::new(
        "p",
        RetryPolicySpec {
            target_ref: TargetRef {
                name: "api".into(),
                port: None,
            },
            pod_selector: None,
            rule: RetryRule::default(),
        },
    );
    p.metadata.namespace = Some("shop".into());
    p.metadata.generation = Some(3);
    PolicyBuilder(p)
}

impl PolicyBuilder {
    /// Named `name` (in `shop`).
    pub(crate) fn named(mut self, name: &str) -> Self {
        self.0.metadata.name = Some(name.into());
        self
    }

    /// At `generation`.
    pub(crate) fn generation(mut self, generation: i64) -> Self {
        self.0.metadata.generation = Some(generation);
        self
    }

    /// With `rule`.
    pub(crate) fn rule(mut self, rule: RetryRule) -> Self {
        self.0.spec.rule = rule;
        self
    }

    /// For pods with the label `key=value` only.
    pub(crate) fn selecting(mut self, key: &str, value: &str) -> Self {
        self.0.spec.pod_selector = Some(
            serde_json::from_value(serde_json::json!({ "matchLabels": { key: value } }))
                .expect("selector"),
        );
        self
    }

    /// The policy.
    pub(crate) fn build(self) -> RetryPolicy {
        self.0
    }
}

/// The Service `shop/api` with `ports` (the `spec.ports` list as JSON).
pub(crate) fn service(ports: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": "api", "namespace": "shop" },
        "spec": { "ports": ports }
    }))
    .expect("service")
}

/// An EndpointSlice `name` of the Service `shop/api` with one port `http`
/// 8080 and `endpoints` (the list as JSON).
pub(crate) fn slice(name: &str, endpoints: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": "shop", "labels": { SERVICE_NAME_LABEL: "api" } },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": endpoints
    }))
    .expect("slice")
}
