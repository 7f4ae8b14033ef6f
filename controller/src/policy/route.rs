//! Gateway API's `HTTPRoute` and `GRPCRoute` (`gateway.networking.k8s.io/v1`)
//! attached to a Service, as Reprise reads them (GAMMA, the mesh profile):
//! a second way to say what a RetryPolicy says (`docs/src/tasks/httproute.md`).
//!
//! - [`read`]: one route, for one of its Service parents, into the rules a
//!   sidecar runs, or the field that keeps it from being applied whole.
//! - [`rank`]: Gateway API's order between the matches of every route
//!   attached to one Service.
//!
//! Every field of a rule is read or refused: the types keep what they do
//! not name (`other`), so a field a newer Gateway API adds is refused by
//! name rather than silently left out of a half-applied route.

pub(crate) mod rank;
pub(crate) mod read;

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The annotation that keeps Reprise from applying a route (another mesh
/// programs it): `reprise.dev/ignore: "true"`.
pub(crate) const IGNORE_ANNOTATION: &str = "reprise.dev/ignore";
/// The annotation that accepts duplicate risk for a route's retries:
/// every method but CONNECT and TRACE is retried, not only GET, HEAD and
/// OPTIONS.
pub(crate) const ACKNOWLEDGE_ANNOTATION: &str = "reprise.dev/acknowledge-duplicate-risk";
/// gRPC statuses retried (`unavailable, resource-exhausted`): a GRPCRoute
/// has no `retry` field (as Linkerd's `retry.linkerd.io/grpc`).
pub(crate) const GRPC_STATUSES_ANNOTATION: &str = "reprise.dev/retry-grpc-statuses";
/// Retries of a GRPCRoute's rules (default 1 with statuses).
pub(crate) const ATTEMPTS_ANNOTATION: &str = "reprise.dev/retry-attempts";
/// Backoff base of a GRPCRoute's retries (a Gateway API duration).
pub(crate) const BACKOFF_ANNOTATION: &str = "reprise.dev/retry-backoff";
/// A GRPCRoute's request timeout (a Gateway API duration): it has no
/// `timeouts` field.
pub(crate) const REQUEST_TIMEOUT_ANNOTATION: &str = "reprise.dev/request-timeout";
/// Request bodies buffered for replay, in bytes (default 65536).
pub(crate) const REPLAY_ANNOTATION: &str = "reprise.dev/replay-limit-bytes";

/// `HTTPRoute` as far as Reprise reads it.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "HTTPRoute",
    plural = "httproutes",
    namespaced,
    status = "RouteStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// What the route attaches to: Reprise reads `kind: Service`.
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    /// Ignored for Service parents (GAMMA).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The rules.
    #[serde(default)]
    pub rules: Vec<HttpRouteRule>,
}

/// `GRPCRoute` as far as Reprise reads it.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "GRPCRoute",
    plural = "grpcroutes",
    namespaced,
    status = "RouteStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteSpec {
    /// What the route attaches to: Reprise reads `kind: Service`.
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    /// Ignored for Service parents (GAMMA).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The rules.
    #[serde(default)]
    pub rules: Vec<GrpcRouteRule>,
}

/// A `ParentReference`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// API group (`""` for core; Gateway API's default is its own group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (`Service`; Gateway API's default is `Gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace (default: the route's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// A listener's name (not for Services).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// The Service port (none: every port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

impl ParentRef {
    /// True when it names a core Service (GAMMA).
    pub(crate) fn is_service(&self) -> bool {
        self.kind.as_deref() == Some("Service") && self.group.as_deref().unwrap_or_default() == ""
    }
}

/// One HTTPRoute rule.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    /// The rule's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Any of these (the API server defaults an empty list to `PathPrefix /`).
    #[serde(default)]
    pub matches: Vec<HttpRouteMatch>,
    /// Filters: none is implemented, so a rule with one is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Value>,
    /// Where requests go: only the parent Service itself can be honoured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<BackendRef>,
    /// Request and backend request timeouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,
    /// Retries (GEP-1731).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// One HTTPRoute match.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// The path condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    /// Header conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    /// Query parameter conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<ValueMatch>,
    /// The method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `path`: `Exact`, `PathPrefix` (the default) or `RegularExpression`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PathMatch {
    /// The match type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The value (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A header or query parameter condition: `Exact` (the default) or
/// `RegularExpression`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueMatch {
    /// The match type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The header or parameter name.
    #[serde(default)]
    pub name: String,
    /// The value.
    #[serde(default)]
    pub value: String,
}

/// A `backendRef` (HTTP or gRPC).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// API group (`""` for core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (default `Service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace (default: the route's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Weight (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Filters: refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Value>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `timeouts` (GEP-1742).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// The whole request, retries included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// One request to a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `retry` (GEP-1731).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// Statuses retried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<i32>,
    /// Retries beyond the first attempt (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i64>,
    /// Backoff base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// One GRPCRoute rule.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteRule {
    /// The rule's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Any of these; none: every call.
    #[serde(default)]
    pub matches: Vec<GrpcRouteMatch>,
    /// Filters: refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Value>,
    /// Where calls go: only the parent Service itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<BackendRef>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// One GRPCRoute match.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteMatch {
    /// The service and method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<GrpcMethodMatch>,
    /// Header conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `method`: `Exact` (the default) or `RegularExpression`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcMethodMatch {
    /// The match type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// `pkg.Service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// `Method`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// A route's `status` (`RouteStatus`): one entry per parent and controller.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// Entries, Reprise's among others'.
    #[serde(default)]
    pub parents: Vec<Value>,
}
