//! Builders of the API objects unit tests start from.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use reprise_crds::resource::{RetryPolicy, RetryPolicySpec, RetryPolicyStatus, TargetRef};
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
                namespace: None,
                port: None,
            },
            pod_selector: None,
            caller_namespaces: None,
            rule: RetryRule::default(),
        },
    );
    p.metadata.namespace = Some("shop".into());
    p.metadata.generation = Some(3);
    PolicyBuilder(p)
}

impl From<RetryPolicy> for PolicyBuilder {
    fn from(p: RetryPolicy) -> Self {
        PolicyBuilder(p)
    }
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

    /// In namespace `namespace`.
    pub(crate) fn in_namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.into());
        self
    }

    /// For the Service `name` in `namespace` (a consumer policy when that is
    /// not its own).
    pub(crate) fn targeting(mut self, namespace: &str, name: &str) -> Self {
        self.0.spec.target_ref.namespace = Some(namespace.into());
        self.0.spec.target_ref.name = name.into();
        self
    }

    /// Applying to callers in every namespace (`All`) or those with the
    /// label `key=value` (`Selector`).
    pub(crate) fn callers(mut self, selector: Option<(&str, &str)>) -> Self {
        self.0.spec.caller_namespaces = Some(
            match selector {
                None => serde_json::from_value(serde_json::json!({ "from": "All" })),
                Some((k, v)) => serde_json::from_value(serde_json::json!({
                    "from": "Selector", "selector": { "matchLabels": { k: v } }
                })),
            }
            .expect("callerNamespaces"),
        );
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

    /// Reconciled at its generation: accepted (or not), `in_sync` of
    /// `sidecars` selected sidecars running it.
    pub(crate) fn reconciled(mut self, accepted: bool, in_sync: i32, sidecars: i32) -> Self {
        let condition = |type_: &str, ok: bool, reason: &str| {
            serde_json::json!({
                "type": type_, "status": if ok { "True" } else { "False" }, "reason": reason,
                "message": "", "lastTransitionTime": "2026-12-06T10:00:00Z"
            })
        };
        let status = serde_json::json!({
            "observedGeneration": self.0.metadata.generation,
            "conditions": [
                condition("Accepted", accepted, if accepted { "Valid" } else { "InvalidSpec" }),
                condition("InSync", in_sync == sidecars, if in_sync == sidecars { "AllSidecarsInSync" } else { "Pending" })
            ],
            "sidecars": sidecars,
            "sidecarsInSync": in_sync
        });
        self.0.status = Some(serde_json::from_value::<RetryPolicyStatus>(status).expect("status"));
        self
    }

    /// The policy.
    pub(crate) fn build(self) -> RetryPolicy {
        self.0
    }
}

/// A Pod being built; [`pod`] starts one.
#[derive(Debug)]
pub(crate) struct PodBuilder(serde_json::Value);

/// The running Pod `shop/NAME` with one container `app`, not injected.
pub(crate) fn pod(name: &str) -> PodBuilder {
    PodBuilder(serde_json::json!({
        "metadata": { "name": name, "namespace": "shop" },
        "spec": { "containers": [{ "name": "app", "image": "app:1" }] },
        "status": { "phase": "Running" }
    }))
}

impl PodBuilder {
    /// With the native sidecar the webhook injects.
    pub(crate) fn injected(mut self) -> Self {
        self.0["spec"]["initContainers"] = serde_json::json!([{
            "name": "reprise-sidecar", "restartPolicy": "Always",
            "args": ["--listen", "127.0.0.1:15001", "--admin", "127.0.0.1:15000"]
        }]);
        self
    }

    /// Created by the controller `kind`/`name` (e.g. a ReplicaSet).
    pub(crate) fn owned_by(mut self, kind: &str, name: &str) -> Self {
        self.0["metadata"]["ownerReferences"] = serde_json::json!([{
            "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true
        }]);
        self
    }

    /// Labelled `key=value`.
    pub(crate) fn label(mut self, key: &str, value: &str) -> Self {
        self.0["metadata"]["labels"][key] = value.into();
        self
    }

    /// In `phase` (`Succeeded`, `Failed`, ...).
    pub(crate) fn phase(mut self, phase: &str) -> Self {
        self.0["status"]["phase"] = phase.into();
        self
    }

    /// The Pod.
    pub(crate) fn build(self) -> Pod {
        serde_json::from_value(self.0).expect("pod")
    }
}

/// The chart's MutatingWebhookConfiguration `reprise-sidecar-injector` of a
/// release in `reprise-system`, both entries calling Service
/// `reprise-controller` on 443, each trusting `ca_pem` (none when empty).
pub(crate) fn webhook_configuration(ca_pem: &str) -> MutatingWebhookConfiguration {
    let entry = |name: &str, path: &str| {
        let mut client_config = serde_json::json!({
            "service": { "namespace": "reprise-system", "name": "reprise-controller", "path": path, "port": 443 }
        });
        if !ca_pem.is_empty() {
            client_config["caBundle"] =
                serde_json::to_value(k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()))
                    .expect("bundle");
        }
        serde_json::json!({
            "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": client_config,
            "namespaceSelector": { "matchLabels": { "reprise.dev/inject": "enabled" } }
        })
    };
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": "reprise-sidecar-injector" },
        "webhooks": [
            entry("inject.reprise.dev", "/inject"),
            entry("transparent.inject.reprise.dev", "/inject/transparent")
        ]
    }))
    .expect("webhook configuration")
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

/// The controller Deployment `reprise-system/reprise-controller` asking for
/// `replicas`, `ready` of them ready.
pub(crate) fn deployment(replicas: i32, ready: i32) -> k8s_openapi::api::apps::v1::Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": "reprise-controller", "namespace": "reprise-system" },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app.kubernetes.io/component": "controller" } },
            "template": { "spec": { "containers": [{ "name": "controller" }] } }
        },
        "status": { "replicas": replicas, "readyReplicas": ready }
    }))
    .expect("deployment")
}

/// The Lease `reprise-system/reprise-controller` held by `holder`, last
/// renewed at `renewed` (RFC 3339).
pub(crate) fn lease(holder: &str, renewed: &str) -> k8s_openapi::api::coordination::v1::Lease {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": "reprise-controller", "namespace": "reprise-system" },
        "spec": { "holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": 15 }
    }))
    .expect("lease")
}

/// The Namespace `name` labelled `reprise.dev/inject=enabled`.
pub(crate) fn injected_namespace(name: &str) -> k8s_openapi::api::core::v1::Namespace {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "reprise.dev/inject": "enabled" } }
    }))
    .expect("namespace")
}

/// The Namespace `name` with `labels`.
pub(crate) fn namespace(
    name: &str,
    labels: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Namespace {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    serde_json::from_value(serde_json::json!({ "metadata": { "name": name, "labels": labels } }))
        .expect("namespace")
}

/// The HTTPRoute `namespace/name` attached to the Service
/// `service_namespace/api`, one rule for `PathPrefix path` retrying
/// `codes` `attempts` times, its backend the Service itself.
pub(crate) fn http_route(
    namespace: &str,
    name: &str,
    service_namespace: &str,
    path: &str,
    codes: &[i32],
    attempts: i64,
) -> crate::policy::route::HTTPRoute {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": namespace, "generation": 1,
                      "creationTimestamp": "2026-12-01T00:00:00Z" },
        "spec": {
            "parentRefs": [{ "group": "", "kind": "Service", "name": "api", "namespace": service_namespace }],
            "rules": [{
                "matches": [{ "path": { "type": "PathPrefix", "value": path } }],
                "retry": { "codes": codes, "attempts": attempts },
                "backendRefs": [{ "name": "api", "namespace": service_namespace, "port": 80 }]
            }]
        }
    }))
    .expect("route")
}
