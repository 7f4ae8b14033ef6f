//! The `RetryPolicy` custom resource (`reprise.dev/v1alpha1`, short name `rp`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::retry_rule::RetryRule;

/// Retries for requests from the selected client pods to one Service: which
/// requests, on which failures, how many times, within which budget and
/// deadline. The Service's ready pods are the alternate endpoints: each retry
/// goes to a pod the request has not tried yet.
// Each printcolumn repeats `type_`; clippy takes that for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "reprise.dev",
    version = "v1alpha1",
    kind = "RetryPolicy",
    namespaced,
    shortname = "rp",
    category = "reprise",
    status = "RetryPolicyStatus",
    derive = "PartialEq",
    doc = "Retries for requests from the selected client pods to one Service.",
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.targetRef.name"),
    printcolumn(
        name = "Attempts",
        type_ = "integer",
        json_path = ".spec.retries.attempts"
    ),
    printcolumn(
        name = "Boundary",
        type_ = "string",
        json_path = ".spec.failureBoundary"
    ),
    printcolumn(
        name = "Budget",
        type_ = "number",
        json_path = ".spec.retries.budgetPercent"
    ),
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "In-Sync", type_ = "string", json_path = ".status.inSync"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Statuses",
        type_ = "string",
        json_path = ".status.statusSummary",
        priority = 1
    ),
    printcolumn(
        name = "Warnings",
        type_ = "string",
        json_path = ".status.warningSummary",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicySpec {
    /// The upstream Service (in this namespace) whose ready pods are the alternate endpoints.
    pub target_ref: TargetRef,
    /// Client pods whose sidecars enforce this policy; empty selects every pod in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// The rule: matching, failure boundary, statuses, body replay and the retries block.
    #[serde(flatten)]
    pub rule: RetryRule,
}

/// The Service a policy applies to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// Service name.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Service port number the clients call; may be omitted when the Service has one port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// What the controller found and what the sidecars run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicyStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (valid and its target resolved) and `InSync` (every selected sidecar ACKed it).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Active, Rejected or Disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Sidecars running this generation over sidecars selected, e.g. `12/12`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_sync: Option<String>,
    /// Ready endpoints of the target.
    #[serde(default)]
    pub endpoints: i32,
    /// Sidecars the policy applies to.
    #[serde(default)]
    pub sidecars: i32,
    /// Sidecars that ACKed a snapshot containing this generation.
    #[serde(default)]
    pub sidecars_in_sync: i32,
    /// Common mistakes found in this policy, such as a target with one endpoint (no alternate).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Statuses retried, for `kubectl get -o wide`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_summary: Option<String>,
    /// Warnings joined, for `kubectl get -o wide`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning_summary: Option<String>,
}
