//! The retry rule of a `RetryPolicy` resource, in Kubernetes camelCase. It is
//! what the controller pushes to sidecars, and both run the same [`RetryRule::resolve`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{BudgetSettings, Rule};
use crate::file::common;
use crate::matching::RequestMatch;
use crate::policy::{
    FailureBoundary, MethodSet, RetryPolicy, StatusSet, GATEWAY_STATUSES, MAX_RETRIES,
    TRANSIENT_STATUSES,
};
use crate::validation::ValidationErrors;

/// Which requests are retried and how: a rule's match and safety fields plus a
/// retries block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(kube::KubeSchema))]
#[cfg_attr(
    feature = "resource",
    x_kube(validation = Rule::new(
        "(has(self.acknowledgeDuplicateRisk) && self.acknowledgeDuplicateRisk) || ((!has(self.failureBoundary) || self.failureBoundary == 'Connect') && (!has(self.statuses) || size(self.statuses) == 0) && (!has(self.statusPresets) || size(self.statusPresets) == 0) && (!has(self.methods) || self.methods.all(m, m in ['GET', 'HEAD', 'OPTIONS'])))"
    ).message("acknowledgeDuplicateRisk must be true for methods other than GET, HEAD and OPTIONS, for failureBoundary BeforeHeaders and for status retries: a retry may duplicate an upstream operation").field_path(".acknowledgeDuplicateRisk"))
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
    /// Retries per second allowed on top of the percentage (0 keeps the formula exact).
    #[serde(default)]
    #[cfg_attr(feature = "resource", schemars(range(min = 0, max = 100000)))]
    pub budget_min_retries_per_second: i32,
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
            status_presets: Vec::new(),
            replay_limit_bytes: 0,
            acknowledge_duplicate_risk: false,
            retries: Retries::default(),
        }
    }
}

impl Default for Retries {
    fn default() -> Self {
        Self {
            attempts: one(),
            backoff_base_ms: backoff_base(),
            backoff_cap_ms: backoff_cap(),
            budget_percent: budget_percent(),
            budget_min_retries_per_second: 0,
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

fn non_negative(errs: &mut ValidationErrors, field: &str, v: i64) -> Option<u64> {
    match u64::try_from(v) {
        Ok(v) => Some(v),
        Err(_) => {
            errs.push(field, format!("must be at least 0 (got {v})"));
            None
        }
    }
}

impl RetryRule {
    /// Validates (with the rules the file format and the CRD schema also use)
    /// and resolves this rule. `p` is the field path prefix (e.g. `spec`).
    /// Returns the rule and the budget it asks for its target.
    pub fn resolve(
        &self,
        id: &str,
        upstream: &str,
        p: &str,
        errs: &mut ValidationErrors,
    ) -> (Rule, BudgetSettings) {
        let methods_field = format!("{p}.methods");
        let names: Vec<String> = self.methods.iter().map(|m| m.token().to_string()).collect();
        let methods = common::methods(errs, &methods_field, &names);
        if self.methods.is_empty() {
            errs.push(methods_field, "must list at least one method");
        }
        let mut statuses = StatusSet::NONE;
        for (i, s) in self.statuses.iter().enumerate() {
            if (400..=599).contains(s) {
                statuses.insert(u16::try_from(*s).unwrap_or(0));
            } else {
                errs.push(
                    format!("{p}.statuses[{i}]"),
                    format!("must be a 4xx or 5xx status in 400..=599 (got {s})"),
                );
            }
        }
        for preset in &self.status_presets {
            let list: &[u16] = match preset {
                StatusPreset::Gateway => &GATEWAY_STATUSES,
                StatusPreset::Transient => &TRANSIENT_STATUSES,
            };
            list.iter().for_each(|s| statuses.insert(*s));
        }
        let boundary = match self.failure_boundary {
            Boundary::Connect => FailureBoundary::Connect,
            Boundary::BeforeHeaders => FailureBoundary::BeforeHeaders,
        };
        if !self.acknowledge_duplicate_risk {
            let mut needs = Vec::new();
            if methods.has_unsafe() {
                needs.push("methods other than GET, HEAD and OPTIONS");
            }
            if boundary == FailureBoundary::BeforeHeaders {
                needs.push("failureBoundary BeforeHeaders");
            }
            if !statuses.is_empty() {
                needs.push("status retries");
            }
            if !needs.is_empty() {
                errs.push(
                    format!("{p}.acknowledgeDuplicateRisk"),
                    format!(
                        "must be true for {} (a retry may duplicate an upstream operation)",
                        needs.join(", ")
                    ),
                );
            }
        }
        let r = &self.retries;
        let rp = format!("{p}.retries");
        let attempts = u32::try_from(r.attempts).unwrap_or(u32::MAX);
        if r.attempts < 0 || attempts > MAX_RETRIES {
            errs.push(
                format!("{rp}.attempts"),
                format!("must be in 0..=10 (got {})", r.attempts),
            );
        }
        let base = non_negative(errs, &format!("{rp}.backoffBaseMs"), r.backoff_base_ms);
        let cap = non_negative(errs, &format!("{rp}.backoffCapMs"), r.backoff_cap_ms);
        let mut camel = ValidationErrors::default();
        let (backoff_base, backoff_cap) = common::backoff(&mut camel, &rp, base, cap);
        let total_deadline = common::total_deadline(
            &mut camel,
            &rp,
            r.total_deadline_ms
                .and_then(|v| u64::try_from(v).ok().or(Some(0))),
        );
        let hedge = r.hedge.as_ref().map(|h| crate::file::HedgeSpec::Delay {
            delay_ms: u64::try_from(h.delay_ms).unwrap_or(0),
        });
        let hedge_delay = common::hedge(&mut camel, &rp, hedge.as_ref());
        // A negative size must be refused, not read as "unset" (the default).
        let replay_bytes = non_negative(
            errs,
            &format!("{p}.replayLimitBytes"),
            self.replay_limit_bytes,
        );
        let replay =
            common::replay_limit(&mut camel, &format!("{p}.replay_limit_bytes"), replay_bytes);
        // The shared checks name fields as the file does; rename them to the resource's camelCase.
        for e in camel.0 {
            errs.push(snake_to_camel(&e.field), snake_to_camel(&e.rule));
        }
        if !(r.budget_percent > 0.0 && r.budget_percent <= 100.0) {
            errs.push(
                format!("{rp}.budgetPercent"),
                format!("must be in (0, 100] (got {})", r.budget_percent),
            );
        }
        let attempt_timeout = r.attempt_timeout_ms.and_then(|v| {
            if (1..=3_600_000).contains(&v) {
                Some(Duration::from_millis(v.unsigned_abs()))
            } else {
                errs.push(
                    format!("{rp}.attemptTimeoutMs"),
                    format!("must be in 1..=3600000 (got {v})"),
                );
                None
            }
        });
        // Bounded like the file format's `retry_after_max_ms` and the CRD schema: an
        // unbounded value would let an upstream's Retry-After hold a request for years.
        let retry_after_max_field = format!("{rp}.retryAfterMaxMs");
        let retry_after_max = non_negative(errs, &retry_after_max_field, r.retry_after_max_ms)
            .map(|v| common::ranged(errs, &retry_after_max_field, Some(v), 0, 0, 600_000))
            .unwrap_or(0);
        // Bounded like the CRD schema; negative is refused rather than read as 0.
        let min_per_second_field = format!("{rp}.budgetMinRetriesPerSecond");
        let min_retries_per_second = non_negative(
            errs,
            &min_per_second_field,
            i64::from(r.budget_min_retries_per_second),
        )
        .map(|v| common::ranged(errs, &min_per_second_field, Some(v), 0, 0, 100_000))
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or(0);
        let request_match = self
            .request_match
            .as_ref()
            .map(|m| RequestMatch {
                path_exact: m.path_exact.clone(),
                path_prefix: m.path_prefix.clone(),
                headers: m
                    .headers
                    .iter()
                    .map(|h| crate::matching::HeaderMatch {
                        name: h.name.to_ascii_lowercase(),
                        value: h.value.clone(),
                    })
                    .collect(),
            })
            .unwrap_or_default();
        let rule = Rule {
            id: id.to_string(),
            priority: self.priority,
            enabled: self.enabled,
            upstreams: vec![upstream.to_string()],
            methods,
            request_match,
            policy: RetryPolicy {
                max_retries: attempts.min(MAX_RETRIES),
                methods,
                failure_boundary: boundary,
                retry_statuses: statuses,
                retry_transport: r.retry_transport,
                backoff_base,
                backoff_cap,
                replay_limit_bytes: replay,
                total_deadline,
                attempt_timeout,
                hedge_delay,
                reuse_endpoints: r.reuse_endpoints,
                retry_after_max: Duration::from_millis(retry_after_max),
                duplicate_risk_acknowledged: self.acknowledge_duplicate_risk,
            },
        };
        let budget = BudgetSettings {
            percent: r.budget_percent,
            window: Duration::from_secs(10),
            min_retries_per_second,
        };
        (rule, budget)
    }

    /// The methods as a set (for display).
    pub fn method_set(&self) -> MethodSet {
        self.methods
            .iter()
            .filter_map(|m| MethodSet::parse_one(m.token()))
            .fold(MethodSet::NONE, MethodSet::union)
    }
}

fn snake_to_camel(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut upper = false;
    for c in path.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(retry_after_max_ms: i64) -> String {
        let rule = RetryRule {
            retries: Retries {
                retry_after_max_ms,
                ..Retries::default()
            },
            ..RetryRule::default()
        };
        let mut errs = ValidationErrors::default();
        rule.resolve("ns/p", "api.ns", "spec", &mut errs);
        errs.to_string()
    }

    fn resolve_errors(rule: &RetryRule) -> String {
        let mut errs = ValidationErrors::default();
        rule.resolve("ns/p", "api.ns", "spec", &mut errs);
        errs.to_string()
    }

    #[test]
    fn a_negative_replay_limit_or_budget_floor_is_refused_not_read_as_a_default() {
        let replay = RetryRule {
            replay_limit_bytes: -1,
            ..RetryRule::default()
        };
        assert_eq!(
            resolve_errors(&replay),
            "spec.replayLimitBytes: must be at least 0 (got -1)"
        );
        let floor = |v: i32| RetryRule {
            retries: Retries {
                budget_min_retries_per_second: v,
                ..Retries::default()
            },
            ..RetryRule::default()
        };
        assert_eq!(
            resolve_errors(&floor(-5)),
            "spec.retries.budgetMinRetriesPerSecond: must be at least 0 (got -5)"
        );
        assert_eq!(
            resolve_errors(&floor(100_001)),
            "spec.retries.budgetMinRetriesPerSecond: must be at most 100000 (got 100001)"
        );
        assert_eq!(resolve_errors(&floor(20)), "");
    }

    #[test]
    fn retry_after_max_is_bounded_as_in_the_schema() {
        // Found by fuzz/fuzz_targets/classifier.rs: the snapshot path accepted any value.
        assert_eq!(errors(600_000), "");
        assert_eq!(
            errors(600_001),
            "spec.retries.retryAfterMaxMs: must be at most 600000 (got 600001)"
        );
        assert_eq!(
            errors(i64::MAX),
            format!(
                "spec.retries.retryAfterMaxMs: must be at most 600000 (got {})",
                i64::MAX
            )
        );
        assert_eq!(
            errors(-1),
            "spec.retries.retryAfterMaxMs: must be at least 0 (got -1)"
        );
    }
}
