//! The `RetryPolicy` custom resource (`reprise.dev/v1alpha1`, short name `rp`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::retry_rule::RetryRule;

/// Retries for requests from the selected client pods to one Service: which
/// requests, on which failures, how many times, within which budget and
/// deadline. The Service's ready pods are the alternate endpoints: each retry
/// goes to a pod the request has not tried yet.
// Each printcolumn repeats `type_`; clippy takes that for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new(
    "!has(self.callerNamespaces) || self.callerNamespaces.from == 'Same' || !has(self.targetRef.namespace)"
).message("callerNamespaces other than Same needs a Service in this namespace (omit targetRef.namespace): a policy applies to other namespaces' callers only for a Service its own namespace owns").field_path(".callerNamespaces"))]
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
        name = "Effective",
        type_ = "string",
        json_path = ".status.traffic.effectiveSuccess"
    ),
    printcolumn(
        name = "First-Try",
        type_ = "string",
        json_path = ".status.traffic.firstTrySuccess"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Recovered",
        type_ = "integer",
        json_path = ".status.traffic.recovered",
        priority = 1
    ),
    printcolumn(
        name = "Exhausted",
        type_ = "integer",
        json_path = ".status.traffic.exhaustedTotal",
        priority = 1
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
    /// The upstream Service whose ready pods are the alternate endpoints:
    /// in this namespace, or in `targetRef.namespace` (a consumer policy,
    /// for this namespace's callers only).
    pub target_ref: TargetRef,
    /// Client pods whose sidecars enforce this policy; empty selects every
    /// pod (in this namespace, and in the namespaces `callerNamespaces` adds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Callers in other namespaces this policy also applies to (a producer
    /// policy: its target is a Service of this namespace). Omitted: this
    /// namespace's pods only. A consumer policy in a caller's namespace for
    /// the same Service and request takes precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_namespaces: Option<CallerNamespaces>,
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
    /// The Service's namespace; omitted: the policy's own. A policy for a
    /// Service in another namespace applies to the pods it selects in its
    /// own namespace (their calls to that Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
    /// Service port number the clients call; may be omitted when the Service has one port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// Which namespaces' callers a producer policy applies to, as Gateway API's
/// `allowedRoutes.namespaces` says which namespaces' routes a listener takes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("(self.from == 'Selector') == has(self.selector)").message("selector is set with from: Selector, and only then").field_path(".selector"))]
#[serde(rename_all = "camelCase")]
pub struct CallerNamespaces {
    /// `Same`: this namespace's pods only (the default). `All`: every
    /// namespace's. `Selector`: this namespace's and those `selector` picks.
    #[serde(default)]
    pub from: NamespacesFrom,
    /// Labels of the namespaces whose pods are callers, with `from: Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// Where a producer policy's callers may be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NamespacesFrom {
    /// The policy's namespace only.
    #[default]
    Same,
    /// Every namespace.
    All,
    /// The policy's namespace and those a label selector picks.
    Selector,
}

impl RetryPolicySpec {
    /// The target Service's namespace, for a policy in `own`.
    pub fn target_namespace<'a>(&'a self, own: &'a str) -> &'a str {
        self.target_ref.namespace.as_deref().unwrap_or(own)
    }

    /// Where its callers may be (`Same` when not said).
    pub fn callers_from(&self) -> NamespacesFrom {
        self.caller_namespaces
            .as_ref()
            .map_or(NamespacesFrom::Same, |c| c.from)
    }
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
    /// What the policy did to the traffic it saw over the last window, as
    /// the sidecars it applies to report it: written at most once a minute
    /// and only when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<TrafficStatus>,
}

/// Requests the policy's sidecars finished over `window`, and how. Counts are
/// integers and ratios are strings (`"99.95%"`): Kubernetes APIs avoid floats.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficStatus {
    /// The window the counts cover, e.g. `5m`.
    pub window: String,
    /// When the counts were taken (RFC 3339).
    pub observed_at: String,
    /// Requests the policy's rule matched.
    pub requests: i64,
    /// Of them, the share whose first attempt succeeded (a final HTTP status
    /// under 500 other than 429, gRPC `OK`), two decimals and `%`.
    pub first_try_success: String,
    /// The share whose final answer succeeded, retries included.
    pub effective_success: String,
    /// Retries sent (hedges included).
    pub retries: i64,
    /// Requests that failed first and succeeded on a retry.
    pub recovered: i64,
    /// Requests whose retries ran out, by reason (`attempts`, `budget`, ...).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub exhausted: std::collections::BTreeMap<String, i64>,
    /// The sum of `exhausted`, for `kubectl get -o wide`.
    #[serde(default)]
    pub exhausted_total: i64,
    /// Requests that failed and were not retried, by reason (`method`, ...).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub skipped: std::collections::BTreeMap<String, i64>,
    /// Retries the budget refused.
    #[serde(default)]
    pub budget_refusals: i64,
    /// The failure kind seen most often on failed attempts (`upstream_status_503`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_failure: Option<String>,
    /// Median latency of final responses, e.g. `12ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50: Option<String>,
    /// 99th percentile latency of final responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99: Option<String>,
    /// Sidecars whose reports are in the window.
    #[serde(default)]
    pub sidecars: i64,
}
