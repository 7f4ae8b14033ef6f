//! What a RetryPolicy's status says: pure functions of the policy, its target
//! and the sidecars' ACKs, so reconcile stays idempotent and testable.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use reprise_crds::resource::{RetryPolicy, RetryPolicyStatus};
use reprise_crds::retry_rule::{Boundary, HttpMethod};
use reprise_crds::snapshot::SnapshotUpstream;
use reprise_crds::validation::ValidationErrors;

use crate::endpoints::TargetProblem;

/// Sidecars selected by a policy and how many run its current generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncCounts {
    /// Connected sidecars whose pod the policy selects.
    pub selected: i32,
    /// Of those, how many ACKed a snapshot with this generation.
    pub in_sync: i32,
}

/// The verdict on one policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// The status to write.
    pub status: RetryPolicyStatus,
    /// True when the policy is valid and its target resolved.
    pub accepted: bool,
}

/// Validates a policy with the shared rules (the same the sidecar runs).
pub fn validate(policy: &RetryPolicy) -> ValidationErrors {
    let mut errs = ValidationErrors::default();
    let id = format!(
        "{}/{}",
        policy.metadata.namespace.as_deref().unwrap_or(""),
        policy.metadata.name.as_deref().unwrap_or("")
    );
    let _ = policy.spec.rule.resolve(&id, "target", "spec", &mut errs);
    errs
}

/// The status for `policy` given its target and sync counts. Conditions keep
/// their transition time while their status and reason stay the same.
pub fn evaluate(
    policy: &RetryPolicy,
    target: &Result<SnapshotUpstream, TargetProblem>,
    sync: SyncCounts,
    now: Time,
) -> Evaluation {
    let generation = policy.metadata.generation;
    let previous = policy.status.as_ref();
    let errs = validate(policy);
    let (accepted, reason, message) = if !errs.is_empty() {
        (false, "InvalidSpec", errs.to_string())
    } else {
        match target {
            Ok(_) => (
                true,
                "Valid",
                "policy is valid and its target resolved".to_string(),
            ),
            Err(TargetProblem::NotFound) => (
                false,
                "TargetNotFound",
                format!(
                    "Service {} not found in this namespace",
                    policy.spec.target_ref.name
                ),
            ),
            Err(TargetProblem::Port(m)) => (false, "PortNotFound", m.clone()),
        }
    };
    let endpoints = target
        .as_ref()
        .map_or(0, |u| i32::try_from(u.endpoints.len()).unwrap_or(i32::MAX));
    let mut conditions = vec![condition(
        previous, "Accepted", accepted, reason, &message, generation, &now,
    )];
    let (in_sync_ok, sync_reason, sync_message) = if !accepted {
        (
            false,
            "NotAccepted",
            "the policy is not pushed to sidecars".to_string(),
        )
    } else if sync.selected == 0 {
        (
            true,
            "NoSidecars",
            "no connected sidecar is selected by this policy".to_string(),
        )
    } else if sync.in_sync >= sync.selected {
        (
            true,
            "AllSidecarsInSync",
            format!(
                "{}/{} sidecars run this generation",
                sync.in_sync, sync.selected
            ),
        )
    } else {
        (
            false,
            "Pending",
            format!(
                "{}/{} sidecars run this generation",
                sync.in_sync, sync.selected
            ),
        )
    };
    conditions.push(condition(
        previous,
        "InSync",
        in_sync_ok,
        sync_reason,
        &sync_message,
        generation,
        &now,
    ));
    let warnings = if accepted {
        warnings(policy, endpoints)
    } else {
        Vec::new()
    };
    let rule = &policy.spec.rule;
    let mut statuses: Vec<String> = rule.statuses.iter().map(ToString::to_string).collect();
    statuses.extend(rule.status_presets.iter().map(|p| format!("{p:?}")));
    let state = if !accepted {
        "Rejected"
    } else if !rule.enabled {
        "Disabled"
    } else {
        "Active"
    };
    let status = RetryPolicyStatus {
        observed_generation: generation,
        conditions,
        state: Some(state.to_string()),
        in_sync: Some(format!("{}/{}", sync.in_sync, sync.selected)),
        endpoints,
        sidecars: sync.selected,
        sidecars_in_sync: sync.in_sync,
        status_summary: Some(if statuses.is_empty() {
            "transport only".to_string()
        } else {
            statuses.join(",")
        }),
        warning_summary: (!warnings.is_empty()).then(|| warnings.join("; ")),
        warnings,
    };
    Evaluation { status, accepted }
}

/// The rules document's common mistakes.
pub fn warnings(policy: &RetryPolicy, endpoints: i32) -> Vec<String> {
    let rule = &policy.spec.rule;
    let mut w = Vec::new();
    if rule.methods.contains(&HttpMethod::Any) {
        w.push(
            "all methods are retried: make sure the upstream deduplicates with idempotency keys"
                .to_string(),
        );
    }
    if rule.acknowledge_duplicate_risk {
        let mut what = Vec::new();
        if rule
            .methods
            .iter()
            .any(|m| !matches!(m, HttpMethod::Get | HttpMethod::Head | HttpMethod::Options))
        {
            what.push("non-idempotent methods");
        }
        if rule.failure_boundary == Boundary::BeforeHeaders {
            what.push("failures after the request was sent");
        }
        if !rule.statuses.is_empty() || !rule.status_presets.is_empty() {
            what.push("status retries");
        }
        if !what.is_empty() {
            w.push(format!(
                "duplicate risk acknowledged ({}): an upstream may process a request twice",
                what.join(", ")
            ));
        }
    }
    if rule.statuses.is_empty() && rule.status_presets.is_empty() {
        w.push(
            "no statuses listed: only transport failures are retried, an upstream 5xx is not"
                .to_string(),
        );
    }
    match endpoints {
        0 => w.push("no ready endpoints".to_string()),
        1 => w.push("only one endpoint: a retry has no alternate".to_string()),
        _ => {}
    }
    if rule.retries.attempts == 0 {
        w.push("attempts is 0: nothing is retried".to_string());
    }
    w
}

fn condition(
    previous: Option<&RetryPolicyStatus>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status && c.reason == reason)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

#[cfg(test)]
mod tests {
    use reprise_crds::resource::{RetryPolicySpec, TargetRef};
    use reprise_crds::retry_rule::RetryRule;
    use reprise_crds::snapshot::SnapshotEndpoint;

    use super::*;

    fn policy(rule: RetryRule) -> RetryPolicy {
        let mut p = RetryPolicy::new(
            "p",
            RetryPolicySpec {
                target_ref: TargetRef {
                    name: "api".into(),
                    port: None,
                },
                pod_selector: None,
                rule,
            },
        );
        p.metadata.namespace = Some("shop".into());
        p.metadata.generation = Some(3);
        p
    }

    fn target(n: usize) -> Result<SnapshotUpstream, TargetProblem> {
        Ok(SnapshotUpstream {
            name: "api.shop".into(),
            hosts: vec![],
            protocol: Default::default(),
            endpoints: (0..n)
                .map(|i| SnapshotEndpoint {
                    address: format!("127.0.0.{}", i + 1),
                    port: 80,
                    pod: None,
                    zone: None,
                })
                .collect(),
        })
    }

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"))
    }

    #[test]
    fn accepted_and_in_sync() {
        let e = evaluate(
            &policy(RetryRule::default()),
            &target(3),
            SyncCounts {
                selected: 3,
                in_sync: 3,
            },
            t(100),
        );
        assert!(e.accepted);
        let s = &e.status;
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.in_sync.as_deref(), Some("3/3"));
        assert_eq!(s.state.as_deref(), Some("Active"));
        assert_eq!(s.endpoints, 3);
        assert_eq!(
            (
                s.conditions[0].type_.as_str(),
                s.conditions[0].status.as_str()
            ),
            ("Accepted", "True")
        );
        assert_eq!(
            (
                s.conditions[1].type_.as_str(),
                s.conditions[1].reason.as_str()
            ),
            ("InSync", "AllSidecarsInSync")
        );
        assert_eq!(
            s.warnings,
            vec!["no statuses listed: only transport failures are retried, an upstream 5xx is not"]
        );
    }

    #[test]
    fn invalid_policies_are_rejected_with_the_field_named() {
        let mut rule = RetryRule::default();
        rule.retries.total_deadline_ms = Some(0);
        let e = evaluate(&policy(rule), &target(3), SyncCounts::default(), t(100));
        assert!(!e.accepted);
        let c = &e.status.conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert_eq!(
            c.message,
            "spec.retries.totalDeadlineMs: must not be 0; omit the field for an unbounded deadline"
        );
        assert_eq!(e.status.state.as_deref(), Some("Rejected"));
        let e = evaluate(
            &policy(RetryRule::default()),
            &Err(TargetProblem::NotFound),
            SyncCounts::default(),
            t(100),
        );
        assert_eq!(e.status.conditions[0].reason, "TargetNotFound");
    }

    #[test]
    fn common_mistakes_are_warned() {
        let rule = RetryRule {
            methods: vec![HttpMethod::Any],
            status_presets: vec![reprise_crds::retry_rule::StatusPreset::Gateway],
            acknowledge_duplicate_risk: true,
            ..RetryRule::default()
        };
        let e = evaluate(
            &policy(rule),
            &target(1),
            SyncCounts {
                selected: 2,
                in_sync: 1,
            },
            t(1),
        );
        let w = e.status.warnings.join("\n");
        assert!(w.contains("all methods are retried"), "{w}");
        assert!(
            w.contains("duplicate risk acknowledged (non-idempotent methods, status retries)"),
            "{w}"
        );
        assert!(
            w.contains("only one endpoint: a retry has no alternate"),
            "{w}"
        );
        assert_eq!(e.status.conditions[1].reason, "Pending");
        assert_eq!(e.status.status_summary.as_deref(), Some("Gateway"));
    }

    #[test]
    fn transition_times_survive_an_unchanged_reconcile() {
        let mut p = policy(RetryRule::default());
        let first = evaluate(
            &p,
            &target(2),
            SyncCounts {
                selected: 1,
                in_sync: 1,
            },
            t(100),
        );
        p.status = Some(first.status.clone());
        let again = evaluate(
            &p,
            &target(2),
            SyncCounts {
                selected: 1,
                in_sync: 1,
            },
            t(200),
        );
        assert_eq!(first.status, again.status, "idempotent: nothing to write");
        let changed = evaluate(
            &p,
            &target(2),
            SyncCounts {
                selected: 2,
                in_sync: 1,
            },
            t(300),
        );
        assert_eq!(changed.status.conditions[0].last_transition_time, t(100));
        assert_eq!(changed.status.conditions[1].last_transition_time, t(300));
    }
}
