//! An upstream's `retries` block, with Reprise's extensions (`docs/src/reference/file-format.md`,
//! "`upstreams[].retries`").

use crate::grpc::{GrpcStatusEntry, GrpcStatusSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::common;
use super::deadlines::DeadlinesSpec;
use crate::config::BudgetSettings;
use crate::policy::{
    FailureBoundary, MethodSet, RetryLayers, RetryPolicy, StatusSet, GATEWAY_STATUSES, MAX_RETRIES,
};
use crate::validation::ValidationErrors;

/// `retries` as written: the gateway format's fields (attempts, budget, backoff,
/// buffering, deadline, hedge), plus the rule settings that format lacks
/// (methods, failure boundary, acknowledgement, endpoint reuse).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetriesSpec {
    /// Retries beyond the first attempt; 0 (default) is off; at most 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Retry POST, accepting that the upstream may see a body twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_post: Option<bool>,
    /// Backoff base in ms (default 25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_base_ms: Option<u64>,
    /// Backoff ceiling in ms (default 250); must be >= the base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_cap_ms: Option<u64>,
    /// Statuses that trigger a retry (default 502, 503, 504); empty disables status retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_statuses: Option<Vec<StatusEntry>>,
    /// gRPC statuses that trigger a retry of a gRPC request, names or 1-16
    /// (default `[unavailable]`); `[]` disables gRPC status retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_statuses: Option<Vec<GrpcStatusEntry>>,
    /// Retry transport errors and per-attempt read timeouts (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_transport: Option<bool>,
    /// Share of requests that may be retries, in (0, 100] (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_percent: Option<f64>,
    /// Bodies up to this size are buffered and replayable (default 0: only empty bodies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_max_bytes: Option<u64>,
    /// Cap from first to last attempt including backoff, 1..=600000 ms; absent is unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_deadline_ms: Option<u64>,
    /// `off` (default) or `{ delay_ms }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeSpec>,
    /// Extension: methods retried (default GET, HEAD, OPTIONS; plus POST with `retry_post`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Extension: `before_headers` (default in this block) or `connect`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_boundary: Option<FailureBoundary>,
    /// Extension: needed to retry PUT, DELETE, PATCH or `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledge_duplicate_risk: Option<bool>,
    /// Extension: a retry may reuse a tried endpoint when none is left (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_endpoints: Option<bool>,
    /// Extension: rolling budget window in ms (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_window_ms: Option<u64>,
    /// Extension: retries per second allowed beyond the percentage (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_min_retries_per_second: Option<u32>,
    /// Extension: longest Retry-After honoured, in ms (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_max_ms: Option<u64>,
    /// Extension: deadlines across hops for this upstream's requests
    /// (default both on).
    #[serde(default, skip_serializing_if = "DeadlinesSpec::is_empty")]
    pub deadlines: DeadlinesSpec,
    /// Extension: `every` (default) or `once`: a request an upper layer
    /// already retried is not retried here, and these retries say so below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_layers: Option<RetryLayers>,
}

/// A status list entry: a code or a preset name (`gateway`, `transient`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StatusEntry {
    /// An exact status code.
    Code(i64),
    /// A preset name.
    Preset(String),
}

/// `hedge` as written: `off`, a boolean, or `{ delay_ms }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HedgeSpec {
    /// `false` is off; `true` is refused (a hedge needs its delay).
    Enabled(bool),
    /// `off`.
    Word(String),
    /// Send one speculative duplicate after this delay without response headers.
    Delay {
        /// Delay in milliseconds.
        delay_ms: u64,
    },
}

impl RetriesSpec {
    /// Resolves this block into the upstream's policy and budget.
    pub(crate) fn resolve(
        &self,
        p: &str,
        errs: &mut ValidationErrors,
    ) -> (RetryPolicy, BudgetSettings) {
        let attempts = self.attempts.unwrap_or(0);
        if attempts > MAX_RETRIES {
            errs.push(
                format!("{p}.attempts"),
                format!("must be at most {MAX_RETRIES} (got {attempts})"),
            );
        }
        let retry_post = self.retry_post.unwrap_or(false);
        let acknowledged = self.acknowledge_duplicate_risk.unwrap_or(false);
        let mut methods = match &self.methods {
            Some(names) => common::methods(errs, &format!("{p}.methods"), names),
            None => MethodSet::SAFE,
        };
        let post = MethodSet::parse_one("POST").unwrap_or(MethodSet::NONE);
        if self.methods.is_some()
            && methods.union(post) == methods
            && !methods.is_any()
            && !retry_post
        {
            errs.push(format!("{p}.methods"), "POST needs retry_post: true (a retried POST may replay a body the upstream already processed)");
        }
        if retry_post {
            methods = methods.union(post);
        }
        // POST is acknowledged by retry_post itself; other unsafe methods need the explicit flag.
        let other_unsafe = methods.is_any()
            || ["PUT", "DELETE", "PATCH"]
                .iter()
                .any(|m| methods.contains(m));
        if other_unsafe && !acknowledged {
            errs.push(
                format!("{p}.acknowledge_duplicate_risk"),
                "must be true to retry PUT, DELETE, PATCH or * (a retry may duplicate the operation)",
            );
        }
        let statuses = match &self.retry_statuses {
            None => StatusSet::from_statuses(GATEWAY_STATUSES),
            Some(list) => common::statuses(errs, &format!("{p}.retry_statuses"), list),
        };
        // 429 (honouring Retry-After) is retried whenever status retries are on
        // (`docs/src/reference/file-format.md`, `retry_statuses`).
        let mut statuses = statuses;
        if !statuses.is_empty() {
            statuses.insert(429);
        }
        let percent = self.budget_percent.unwrap_or(10.0);
        if !(percent > 0.0 && percent <= 100.0) {
            errs.push(
                format!("{p}.budget_percent"),
                format!("must be in (0, 100] (got {percent})"),
            );
        }
        let (backoff_base, backoff_cap) =
            common::backoff(errs, p, self.backoff_base_ms, self.backoff_cap_ms);
        let window = common::ranged(
            errs,
            &format!("{p}.budget_window_ms"),
            self.budget_window_ms,
            10_000,
            1_000,
            600_000,
        );
        let retry_after_max = common::ranged(
            errs,
            &format!("{p}.retry_after_max_ms"),
            self.retry_after_max_ms,
            30_000,
            0,
            600_000,
        );
        let policy = RetryPolicy {
            max_retries: attempts.min(MAX_RETRIES),
            methods,
            failure_boundary: self
                .failure_boundary
                .unwrap_or(FailureBoundary::BeforeHeaders),
            retry_statuses: statuses,
            grpc_statuses: match &self.grpc_statuses {
                None => GrpcStatusSet::only(crate::grpc::UNAVAILABLE),
                Some(list) => GrpcStatusSet::parse(errs, &format!("{p}.grpc_statuses"), list),
            },
            retry_transport: self.retry_transport.unwrap_or(true),
            backoff_base,
            backoff_cap,
            replay_limit_bytes: common::replay_limit(
                errs,
                &format!("{p}.buffer_max_bytes"),
                self.buffer_max_bytes,
            ),
            total_deadline: common::total_deadline(errs, p, self.total_deadline_ms),
            attempt_timeout: None,
            hedge_delay: common::hedge(errs, p, self.hedge.as_ref()),
            reuse_endpoints: self.reuse_endpoints.unwrap_or(false),
            retry_after_max: Duration::from_millis(retry_after_max),
            duplicate_risk_acknowledged: acknowledged || retry_post,
            deadlines: self.deadlines.resolve(),
            retry_layers: self.retry_layers.unwrap_or_default(),
            deadline_answers_timeout: false,
        };
        let budget = BudgetSettings {
            percent,
            window: Duration::from_millis(window),
            min_retries_per_second: f64::from(self.budget_min_retries_per_second.unwrap_or(0)),
        };
        (policy, budget)
    }
}
