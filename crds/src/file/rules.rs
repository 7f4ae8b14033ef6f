//! Retry rules (`rules:` in the file): match conditions and a policy,
//! evaluated by priority then id (`docs/src/reference/file-format.md`, "`rules[]`").

use crate::grpc::{GrpcStatusEntry, GrpcStatusSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::common;
use super::deadlines::DeadlinesSpec;
use super::retries::{HedgeSpec, StatusEntry};
use crate::config::Rule;
use crate::matching::RequestMatch;
use crate::policy::{FailureBoundary, MethodSet, RetryLayers, RetryPolicy, MAX_RETRIES};
use crate::validation::ValidationErrors;

/// A retry rule as written. Defaults are the safe starting
/// configuration: GET and HEAD, one retry, connection-establishment boundary,
/// transport failures only, no body buffering.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Unique id; breaks priority ties.
    pub id: String,
    /// Lower runs first (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Upstream names; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<String>,
    /// Methods matched and retried (default GET, HEAD). Anything but GET, HEAD and
    /// OPTIONS needs `acknowledge_duplicate_risk`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Path and header conditions.
    #[serde(default, rename = "match")]
    pub request_match: RequestMatch,
    /// `connect` (default) or `before_headers` (needs the acknowledgement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_boundary: Option<FailureBoundary>,
    /// Exact statuses in 400..=599 or presets `gateway`, `transient`; default none.
    /// Status retries need the acknowledgement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statuses: Vec<StatusEntry>,
    /// gRPC statuses (names or 1-16) that trigger a retry of a gRPC request;
    /// default none. gRPC status retries need the acknowledgement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grpc_statuses: Vec<GrpcStatusEntry>,
    /// Bodies up to this size are buffered and replayed (default 0, at most 4 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_limit_bytes: Option<u64>,
    /// Accepts that a retry may duplicate an upstream operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledge_duplicate_risk: Option<bool>,
    /// Retries beyond the first attempt (default 1, at most 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Retry transport failures (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_transport: Option<bool>,
    /// Backoff base in ms (default 25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_base_ms: Option<u64>,
    /// Backoff ceiling in ms (default 250).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_cap_ms: Option<u64>,
    /// Cap from first to last attempt including backoff; absent is unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_deadline_ms: Option<u64>,
    /// Per-attempt wait for response headers; default the upstream's `read_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// `off` (default) or `{ delay_ms }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeSpec>,
    /// A retry may reuse a tried endpoint when none is left (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_endpoints: Option<bool>,
    /// Longest Retry-After honoured, in ms (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_max_ms: Option<u64>,
    /// Deadlines across hops for this rule's requests (default both on).
    #[serde(default, skip_serializing_if = "DeadlinesSpec::is_empty")]
    pub deadlines: DeadlinesSpec,
    /// `every` (default) or `once`, as in `retries`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_layers: Option<RetryLayers>,
}

impl RuleSpec {
    pub(crate) fn resolve(&self, p: &str, errs: &mut ValidationErrors) -> Rule {
        if self.id.is_empty() {
            errs.push(format!("{p}.id"), "must not be empty");
        }
        let attempts = self.attempts.unwrap_or(1);
        if attempts > MAX_RETRIES {
            errs.push(
                format!("{p}.attempts"),
                format!("must be at most {MAX_RETRIES} (got {attempts})"),
            );
        }
        let methods = match &self.methods {
            Some(names) => common::methods(errs, &format!("{p}.methods"), names),
            None => MethodSet::GET_HEAD,
        };
        if methods == MethodSet::NONE && self.methods.is_some() {
            errs.push(format!("{p}.methods"), "must list at least one method");
        }
        let statuses = common::statuses(errs, &format!("{p}.statuses"), &self.statuses);
        let grpc_statuses =
            GrpcStatusSet::parse(errs, &format!("{p}.grpc_statuses"), &self.grpc_statuses);
        let boundary = self.failure_boundary.unwrap_or(FailureBoundary::Connect);
        let acknowledged = self.acknowledge_duplicate_risk.unwrap_or(false);
        common::duplicate_risk(
            errs,
            &format!("{p}.acknowledge_duplicate_risk"),
            "failure_boundary: before_headers",
            acknowledged,
            common::Retried {
                methods,
                boundary,
                statuses,
                grpc_statuses,
            },
        );
        let (backoff_base, backoff_cap) =
            common::backoff(errs, p, self.backoff_base_ms, self.backoff_cap_ms);
        let attempt_timeout = self.attempt_timeout_ms.map(|v| {
            Duration::from_millis(common::ranged(
                errs,
                &format!("{p}.attempt_timeout_ms"),
                Some(v),
                0,
                1,
                3_600_000,
            ))
        });
        let retry_after_max = common::ranged(
            errs,
            &format!("{p}.retry_after_max_ms"),
            self.retry_after_max_ms,
            30_000,
            0,
            600_000,
        );
        Rule {
            id: self.id.clone(),
            precedence: 0,
            priority: self.priority.unwrap_or(0),
            report_as: None,
            enabled: self.enabled.unwrap_or(true),
            upstreams: self
                .upstreams
                .iter()
                .map(|u| u.to_ascii_lowercase())
                .collect(),
            methods,
            request_match: RequestMatch {
                cel: None,
                ..self.request_match.clone()
            },
            cel: common::cel(
                errs,
                &format!("{p}.match.cel"),
                self.request_match.cel.as_deref(),
            ),
            policy: RetryPolicy {
                max_retries: attempts.min(MAX_RETRIES),
                methods,
                failure_boundary: boundary,
                retry_statuses: statuses,
                grpc_statuses,
                retry_transport: self.retry_transport.unwrap_or(true),
                backoff_base,
                backoff_cap,
                replay_limit_bytes: common::replay_limit(
                    errs,
                    &format!("{p}.replay_limit_bytes"),
                    self.replay_limit_bytes,
                ),
                total_deadline: common::total_deadline(errs, p, self.total_deadline_ms),
                attempt_timeout,
                hedge_delay: common::hedge(errs, p, self.hedge.as_ref()),
                reuse_endpoints: self.reuse_endpoints.unwrap_or(false),
                retry_after_max: Duration::from_millis(retry_after_max),
                duplicate_risk_acknowledged: acknowledged,
                deadlines: self.deadlines.resolve(),
                retry_layers: self.retry_layers.unwrap_or_default(),
                deadline_answers_timeout: false,
            },
        }
    }
}
