//! The retry rule of a `RetryPolicy` resource, in Kubernetes camelCase: its
//! types, schema rules and defaults. It is what the controller pushes to
//! sidecars, and both run the same [`RetryRule::resolve`] (in `resolve.rs`).

mod deadlines;
mod resolve;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use self::deadlines::{Deadlines, Layers};

/// Which requests are retried and how: a rule's match and safety fields plus a
/// retries block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(kube::KubeSchema))]
#[cfg_attr(
    feature = "resource",
    x_kube(validation = Rule::new(
        "(has(self.acknowledgeDuplicateRisk) && self.acknowledgeDuplicateRisk) || ((!has(self.failureBoundary) || self.failureBoundary == 'Connect') && (!has(self.statuses) || size(self.statuses) == 0) && (!has(self.statusPresets) || size(self.statusPresets) == 0) && (!has(self.grpcStatuses) || size(self.grpcStatuses) == 0) && (!has(self.methods) || self.methods.all(m, m in ['GET', 'HEAD', 'OPTIONS'])))"
    ).message("acknowledgeDuplicateRisk must be true for methods other than GET, HEAD and OPTIONS, for failureBoundary BeforeHeaders and for status and gRPC status retries: a retry may duplicate an upstream operation").field_path(".acknowledgeDuplicateRisk"))
)]
#[serde(rename_all = "camelCase")]
pub struct RetryRule {
    /// Lower runs first; ties are broken by namespace/name. The first enabled
    /// matching policy decides.
    #[serde(default)]
    pub priority: i32,
    /// A disabled policy never matches.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Methods matched and retried. Anything but GET, HEAD and OPTIONS needs
    /// `acknowledgeDuplicateRisk`. CONNECT and TRACE are never retried.
    #[serde(default = "default_methods")]
    #[cfg_attr(feature = "resource", schemars(length(max = 8)))]
    pub methods: Vec<HttpMethod>,
    /// Path and header conditions; all must hold.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub request_match: Option<Match>,
    /// `Connect` (default): only failures before the request was written.
    /// `BeforeHeaders`: any failure before response headers (needs the acknowledgement).
    #[serde(default)]
    pub failure_boundary: Boundary,
    /// Exact upstream statuses (400-599) that trigger a retry. Needs the acknowledgement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "resource",
        schemars(length(max = 200), inner(range(min = 400, max = 599)))
    )]
    pub statuses: Vec<i32>,
    /// gRPC statuses that trigger a retry of a gRPC request: names in lower
    /// case with dashes (`unavailable`, `resource-exhausted`, `deadline-exceeded`,
    /// ...) or numbers 1-16. Needs the acknowledgement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "resource", schemars(schema_with = "int_or_string_list"))]
    pub grpc_statuses: Vec<crate::grpc::GrpcStatusEntry>,
    /// Status presets: `Gateway` (502, 503, 504), `Transient` (408, 425, 429, 500, 502, 503, 504).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "resource", schemars(length(max = 2)))]
    pub status_presets: Vec<StatusPreset>,
    /// Request bodies up to this size are buffered once and replayed (max 4 MiB).
    /// Larger bodies stream and are retried only if no byte was sent.
    #[serde(default)]
    #[cfg_attr(feature = "resource", schemars(range(min = 0, max = 4194304)))]
    pub replay_limit_bytes: i64,
    /// Accepts that a retry may make the upstream perform an operation twice.
    #[serde(default)]
    pub acknowledge_duplicate_risk: bool,
    /// Attempts, backoff, budget, deadline, timeouts and hedging.
    #[serde(default)]
    pub retries: Retries,
    /// Deadlines across hops: sent to the next hop, accepted from the
    /// caller (both on when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadlines: Option<Deadlines>,
    /// `Every` (default): every layer of a call chain retries under its own
    /// policy. `Once`: a request an upper layer already retried is not
    /// retried again here, and this policy's retries say so to the layers
    /// below (in `baggage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_layers: Option<Layers>,
}

/// An HTTP method a rule matches; `*` is every method but CONNECT and TRACE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(schemars::JsonSchema))]
pub enum HttpMethod {
    /// GET
    #[serde(rename = "GET")]
    Get,
    /// HEAD
    #[serde(rename = "HEAD")]
    Head,
    /// OPTIONS
    #[serde(rename = "OPTIONS")]
    Options,
    /// PUT (needs the acknowledgement)
    #[serde(rename = "PUT")]
    Put,
    /// DELETE (needs the acknowledgement)
    #[serde(rename = "DELETE")]
    Delete,
    /// POST (needs the acknowledgement)
    #[serde(rename = "POST")]
    Post,
    /// PATCH (needs the acknowledgement)
    #[serde(rename = "PATCH")]
    Patch,
    /// Every method but CONNECT and TRACE (needs the acknowledgement)
    #[serde(rename = "*")]
    Any,
}

/// How far a failed attempt may have got and still be retried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(schemars::JsonSchema))]
pub enum Boundary {
    /// Before the request was written: the upstream cannot have seen it.
    #[default]
    Connect,
    /// Before response headers: resets and read timeouts too (duplicate risk).
    BeforeHeaders,
}

/// A named set of statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(schemars::JsonSchema))]
pub enum StatusPreset {
    /// 502, 503, 504.
    Gateway,
    /// 408, 425, 429, 500, 502, 503, 504.
    Transient,
}

/// Request conditions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Match {
    /// The path must equal this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_exact: Option<String>,
    /// The path must start with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Every listed header must be present (and equal `value` when given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "resource", schemars(length(max = 16)))]
    pub headers: Vec<HeaderCondition>,
    /// A CEL expression over the request only (`request.method`,
    /// `request.path`, `request.host`, `request.headers` with lower-case
    /// names) that must be true, e.g.
    /// `request.headers['x-tenant'] == 'a' && request.path.startsWith('/v1/')`.
    /// An expression that fails at run time counts as no match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "resource", schemars(length(min = 1, max = 4096)))]
    pub cel: Option<String>,
}

/// One header condition.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(schemars::JsonSchema))]
pub struct HeaderCondition {
    /// Header name (case-insensitive).
    #[cfg_attr(feature = "resource", schemars(length(min = 1, max = 256)))]
    pub name: String,
    /// Exact value; absent means "present".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// The retries block: attempts, budget, backoff, deadline, hedge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(kube::KubeSchema))]
#[cfg_attr(
    feature = "resource",
    x_kube(validation = Rule::new("!has(self.backoffCapMs) || !has(self.backoffBaseMs) || self.backoffCapMs >= self.backoffBaseMs").message("backoffCapMs must be >= backoffBaseMs").field_path(".backoffCapMs"))
)]
#[serde(rename_all = "camelCase")]
pub struct Retries {
    /// Retries beyond the first attempt (0-10).
    #[serde(default = "one")]
    #[cfg_attr(feature = "resource", schemars(range(min = 0, max = 10)))]
    pub attempts: i32,
    /// Backoff base: the nominal delay before retry n is min(base * 2^(n-1), cap); the
    /// actual sleep is uniform in [0, nominal] (full jitter).
    #[serde(default = "backoff_base")]
    #[cfg_attr(feature = "resource", schemars(range(min = 0, max = 600000)))]
    pub backoff_base_ms: i64,
    /// Backoff ceiling; must be >= backoffBaseMs.
    #[serde(default = "backoff_cap")]
    #[cfg_attr(feature = "resource", schemars(range(min = 0, max = 600000)))]
    pub backoff_cap_ms: i64,
    /// Share of requests to the target, over a rolling window, that may be retries (0 < p <= 100).
    #[serde(default = "budget_percent")]
    #[cfg_attr(feature = "resource", schemars(range(min = 0.001, max = 100)))]
    pub budget_percent: f64,
    /// Retries per second allowed on top of the percentage, so a fresh or quiet
    /// client still retries its first failures (default 10, Gateway API's
    /// `minRetryRate`; 0 keeps the percentage exact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "resource", schemars(range(min = 0, max = 100000)))]
    pub budget_min_retries_per_second: Option<i32>,
    /// Cap from the first attempt to the last, backoff included (1-600000 ms). Omit for unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "resource", schemars(range(min = 1, max = 600000)))]
    pub total_deadline_ms: Option<i64>,
    /// Time one attempt may wait for response headers (default 15000 ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "resource", schemars(range(min = 1, max = 3600000)))]
    pub attempt_timeout_ms: Option<i64>,
    /// Retry transport failures (connect errors, resets, timeouts).
    #[serde(default = "yes")]
    pub retry_transport: bool,
    /// Send one speculative duplicate to another endpoint after this delay without response headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<Hedge>,
    /// Allow a retry to reuse an endpoint already tried when none is left.
    #[serde(default)]
    pub reuse_endpoints: bool,
    /// Longest Retry-After honoured (ms); a longer one ends the retries.
    #[serde(default = "retry_after_max")]
    #[cfg_attr(feature = "resource", schemars(range(min = 0, max = 600000)))]
    pub retry_after_max_ms: i64,
}

/// Hedging settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Hedge {
    /// Delay without response headers before the duplicate is sent (ms).
    #[cfg_attr(feature = "resource", schemars(range(min = 1, max = 600000)))]
    pub delay_ms: i64,
}

fn yes() -> bool {
    true
}
fn one() -> i32 {
    1
}
fn backoff_base() -> i64 {
    25
}
fn backoff_cap() -> i64 {
    250
}
fn budget_percent() -> f64 {
    10.0
}
fn retry_after_max() -> i64 {
    30_000
}
fn default_methods() -> Vec<HttpMethod> {
    vec![HttpMethod::Get, HttpMethod::Head]
}

impl Default for RetryRule {
    /// The same defaults the API server applies from the schema.
    fn default() -> Self {
        Self {
            priority: 0,
            enabled: true,
            methods: default_methods(),
            request_match: None,
            failure_boundary: Boundary::Connect,
            statuses: Vec::new(),
            grpc_statuses: Vec::new(),
            status_presets: Vec::new(),
            replay_limit_bytes: 0,
            acknowledge_duplicate_risk: false,
            retries: Retries::default(),
            deadlines: None,
            retry_layers: None,
        }
    }
}

/// Retries per second a RetryPolicy's budget allows on top of its percentage
/// when it does not say (GEP-3388's `minRetryRate` default; Linkerd's 10/s).
pub const DEFAULT_MIN_RETRIES_PER_SECOND: i32 = 10;

impl Default for Retries {
    fn default() -> Self {
        Self {
            attempts: one(),
            backoff_base_ms: backoff_base(),
            backoff_cap_ms: backoff_cap(),
            budget_percent: budget_percent(),
            budget_min_retries_per_second: None,
            total_deadline_ms: None,
            attempt_timeout_ms: None,
            retry_transport: true,
            hedge: None,
            reuse_endpoints: false,
            retry_after_max_ms: retry_after_max(),
        }
    }
}

impl HttpMethod {
    fn token(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Head => "HEAD",
            HttpMethod::Options => "OPTIONS",
            HttpMethod::Put => "PUT",
            HttpMethod::Delete => "DELETE",
            HttpMethod::Post => "POST",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Any => "*",
        }
    }
}

impl StatusPreset {
    /// The preset's name in the file format (`gateway`, `transient`), whose
    /// status list check resolves both formats' presets.
    fn name(self) -> &'static str {
        match self {
            StatusPreset::Gateway => "gateway",
            StatusPreset::Transient => "transient",
        }
    }
}

/// The schema of `grpcStatuses`: at most 16 items, each an integer or a
/// string (names and numbers are checked by the shared validation).
#[cfg(feature = "resource")]
fn int_or_string_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 16,
        "items": { "x-kubernetes-int-or-string": true }
    })
}
