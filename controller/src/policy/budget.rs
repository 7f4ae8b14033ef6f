//! Gateway API's `XBackendTrafficPolicy` (`gateway.networking.x-k8s.io/v1alpha1`,
//! experimental, GEP-3388) as Reprise reads it: the retry budget of every
//! retry towards the Services it targets, whatever RetryPolicy or route
//! asked for the retry (`docs/src/tasks/httproute.md`, "Budgets").
//!
//! - `targetRefs` naming core Services in the policy's namespace; of several
//!   policies for one Service the oldest wins, then the first by name;
//! - `retryConstraint.budget.percent` (default 20) and `.interval` (default
//!   10 s, 1 s to 1 h): the share of the Service's requests over the window
//!   that may be retries, 0 allowed;
//! - `retryConstraint.minRetryRate` (default 10 per second): retries always
//!   allowed on top, below one a second too.
//!
//! `sessionPersistence` is refused: a policy Reprise cannot apply whole is
//! not applied, and its status says why.
//!
//! An exhausted budget leaves the client the last answer it got, as a
//! RetryPolicy's does, not the 503 GEP-3388 suggests: a real upstream
//! answer (its body, its `Retry-After`) says more than a made-up 503, and
//! `x-reprise-skip`-style diagnostics and `status.traffic` say the budget
//! refused.

use std::collections::BTreeMap;

use kube::CustomResource;
use reprise_crds::snapshot::SnapshotBudget;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::route::read::{duration_ms, Refused};

/// `XBackendTrafficPolicy` as far as Reprise reads it.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize)]
#[kube(
    group = "gateway.networking.x-k8s.io",
    version = "v1alpha1",
    kind = "XBackendTrafficPolicy",
    plural = "xbackendtrafficpolicies",
    namespaced,
    status = "PolicyStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct BackendTrafficPolicySpec {
    /// What it applies to: core Services.
    #[serde(default)]
    pub target_refs: Vec<LocalTargetRef>,
    /// The retry budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_constraint: Option<RetryConstraint>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A `LocalPolicyTargetReference`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LocalTargetRef {
    /// API group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub name: String,
}

/// `retryConstraint`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryConstraint {
    /// The percentage and its window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetDetails>,
    /// The floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_retry_rate: Option<RequestRate>,
    /// Every other field (refused by name).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `budget`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetDetails {
    /// 0..=100 (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i64>,
    /// The window (default 10 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// `minRetryRate`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRate {
    /// Retries per interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// The interval (default 1 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// `status` (a `PolicyStatus`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// One entry per ancestor and controller.
    #[serde(default)]
    pub ancestors: Vec<Value>,
}

impl XBackendTrafficPolicy {
    /// True when it targets the core Service `name` (of its namespace).
    pub(crate) fn targets(&self, name: &str) -> bool {
        self.spec
            .target_refs
            .iter()
            .any(|t| t.group.is_empty() && t.kind == "Service" && t.name == name)
    }
}

/// The budget a policy gives, or why it is not applied.
pub(crate) fn budget(spec: &BackendTrafficPolicySpec) -> Result<SnapshotBudget, Refused> {
    let unsupported = |field: &str, why: String| Refused {
        reason: "Invalid",
        message: format!("{field}: {why}; Reprise does not apply the policy"),
    };
    if let Some(field) = spec.other.keys().next() {
        return Err(unsupported(
            &format!("spec.{field}"),
            "not implemented by Reprise".into(),
        ));
    }
    let c = spec.retry_constraint.clone().unwrap_or_default();
    if let Some(field) = c.other.keys().next() {
        return Err(unsupported(
            &format!("spec.retryConstraint.{field}"),
            "not implemented by Reprise".into(),
        ));
    }
    let b = c.budget.unwrap_or_default();
    let percent = b.percent.unwrap_or(20);
    if !(0..=100).contains(&percent) {
        return Err(unsupported(
            "spec.retryConstraint.budget.percent",
            format!("must be in 0..=100 (got {percent})"),
        ));
    }
    let window = |field: &str, d: Option<&str>, default: i64| -> Result<u64, Refused> {
        let ms = match d {
            None => default,
            Some(d) => duration_ms(field, d).map_err(|r| Refused {
                reason: "Invalid",
                ..r
            })?,
        };
        if !(1_000..=3_600_000).contains(&ms) {
            return Err(unsupported(
                field,
                format!("must be from 1s to 1h (got {ms} ms)"),
            ));
        }
        Ok(u64::try_from(ms).unwrap_or(1_000))
    };
    let interval_ms = window(
        "spec.retryConstraint.budget.interval",
        b.interval.as_deref(),
        10_000,
    )?;
    let rate = c.min_retry_rate.unwrap_or(RequestRate {
        count: Some(10),
        interval: None,
    });
    let count = rate.count.unwrap_or(10);
    if !(0..=1_000_000).contains(&count) {
        return Err(unsupported(
            "spec.retryConstraint.minRetryRate.count",
            format!("must be in 0..=1000000 (got {count})"),
        ));
    }
    let per_ms = window(
        "spec.retryConstraint.minRetryRate.interval",
        rate.interval.as_deref(),
        1_000,
    )?;
    Ok(SnapshotBudget {
        percent: percent as f64,
        interval_ms,
        min_retries: u32::try_from(count).unwrap_or(0),
        min_retries_per_ms: per_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> BackendTrafficPolicySpec {
        serde_yaml::from_str(yaml).expect("a spec")
    }

    #[test]
    fn the_budget_with_the_specification_defaults() {
        let b = budget(&spec(
            "targetRefs: [{ group: \"\", kind: Service, name: api }]",
        ))
        .expect("applied");
        assert_eq!(
            b,
            SnapshotBudget {
                percent: 20.0,
                interval_ms: 10_000,
                min_retries: 10,
                min_retries_per_ms: 1_000
            }
        );
        let b = budget(&spec(
            "targetRefs: []\nretryConstraint: { budget: { percent: 0, interval: 1m }, minRetryRate: { count: 1, interval: 10s } }",
        ))
        .expect("applied");
        assert_eq!(
            (
                b.percent,
                b.interval_ms,
                b.min_retries,
                b.min_retries_per_ms
            ),
            (0.0, 60_000, 1, 10_000)
        );
        let mut errs = reprise_crds::ValidationErrors::default();
        let settings = b.resolve("budget", &mut errs);
        assert!(errs.is_empty());
        assert!(
            (settings.min_retries_per_second - 0.1).abs() < 1e-9,
            "one per ten seconds, not rounded"
        );
    }

    #[test]
    fn what_cannot_be_applied_whole_is_refused() {
        let refused = budget(&spec(
            "targetRefs: []\nsessionPersistence: { sessionName: s }",
        ))
        .expect_err("refused");
        assert_eq!(refused.message, "spec.sessionPersistence: not implemented by Reprise; Reprise does not apply the policy");
        let refused = budget(&spec(
            "targetRefs: []\nretryConstraint: { budget: { interval: 2h } }",
        ))
        .expect_err("refused");
        assert!(
            refused
                .message
                .starts_with("spec.retryConstraint.budget.interval: must be from 1s to 1h"),
            "{}",
            refused.message
        );
    }
}
