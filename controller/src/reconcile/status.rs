//! What a RetryPolicy's status says: pure functions of the policy, its target
//! and the sidecars' ACKs, so reconcile stays idempotent and testable.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use reprise_crds::resource::{RetryPolicy, RetryPolicyStatus};
use reprise_crds::retry_rule::{Boundary, HttpMethod};
use reprise_crds::snapshot::SnapshotUpstream;

use super::conditions::{condition, ConditionType, Reason, Verdict};
use crate::policy::{self, target::TargetProblem};
use crate::sidecars::SyncCounts;

/// The verdict on one policy.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Evaluation {
    /// The status to write.
    pub(crate) status: RetryPolicyStatus,
    /// True when the policy is valid and its target resolved.
    pub(crate) accepted: bool,
}

/// `status.state`, the State column of `kubectl get rp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Accepted and enabled.
    Active,
    /// Not accepted.
    Rejected,
    /// Accepted, but `enabled: false`.
    Disabled,
}

impl State {
    const fn as_str(self) -> &'static str {
        match self {
            State::Active => "Active",
            State::Rejected => "Rejected",
            State::Disabled => "Disabled",
        }
    }
}

/// The status for `policy` given its target and sync counts. Conditions keep
/// their transition time while their status and reason stay the same.
pub(crate) fn evaluate(
    policy: &RetryPolicy,
    target: &Result<SnapshotUpstream, TargetProblem>,
    sync: SyncCounts,
    now: Time,
) -> Evaluation {
    let generation = policy.metadata.generation;
    let previous = policy.status.as_ref();
    let acceptance = acceptance(policy, target);
    let accepted = acceptance.ok;
    let endpoints = target
        .as_ref()
        .map_or(0, |u| i32::try_from(u.endpoints.len()).unwrap_or(i32::MAX));
    let conditions = vec![
        condition(
            previous,
            ConditionType::Accepted,
            acceptance,
            generation,
            &now,
        ),
        condition(
            previous,
            ConditionType::InSync,
            in_sync(accepted, sync),
            generation,
            &now,
        ),
    ];
    // An ExternalName target's endpoints are a DNS name each sidecar resolves.
    let dns_named = target.as_ref().is_ok_and(|u| !u.dns.is_empty());
    let warnings = if accepted {
        warnings(policy, endpoints, dns_named)
    } else {
        Vec::new()
    };
    let rule = &policy.spec.rule;
    let mut statuses: Vec<String> = rule.statuses.iter().map(ToString::to_string).collect();
    statuses.extend(rule.status_presets.iter().map(|p| format!("{p:?}")));
    let state = if !accepted {
        State::Rejected
    } else if !rule.enabled {
        State::Disabled
    } else {
        State::Active
    };
    let status = RetryPolicyStatus {
        observed_generation: generation,
        conditions,
        state: Some(state.as_str().to_string()),
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
        traffic: None,
    };
    Evaluation { status, accepted }
}

/// `Accepted`: valid by the shared rules, and the target resolved.
fn acceptance(policy: &RetryPolicy, target: &Result<SnapshotUpstream, TargetProblem>) -> Verdict {
    let errs = policy::validate(policy);
    let (ok, reason, message) = if !errs.is_empty() {
        (false, Reason::InvalidSpec, errs.to_string())
    } else {
        match target {
            Ok(_) => (
                true,
                Reason::Valid,
                "policy is valid and its target resolved".to_string(),
            ),
            Err(TargetProblem::NotFound) => (
                false,
                Reason::TargetNotFound,
                format!(
                    "Service {} not found in this namespace",
                    policy.spec.target_ref.name
                ),
            ),
            Err(TargetProblem::Port(m)) => (false, Reason::PortNotFound, m.clone()),
            Err(TargetProblem::Tls(m)) => (false, Reason::BackendTLSNotResolved, m.clone()),
        }
    };
    Verdict {
        ok,
        reason,
        message,
    }
}

/// `InSync`: how many of the selected sidecars run this generation.
fn in_sync(accepted: bool, sync: SyncCounts) -> Verdict {
    let counted = || {
        format!(
            "{}/{} sidecars run this generation",
            sync.in_sync, sync.selected
        )
    };
    let (ok, reason, message) = if !accepted {
        (
            false,
            Reason::NotAccepted,
            "the policy is not pushed to sidecars".to_string(),
        )
    } else if sync.selected == 0 {
        (
            true,
            Reason::NoSidecars,
            "no connected sidecar is selected by this policy".to_string(),
        )
    } else if sync.in_sync >= sync.selected {
        (true, Reason::AllSidecarsInSync, counted())
    } else if sync.outdated > 0 {
        (
            false,
            Reason::SidecarsOutdated,
            format!(
                "{}; {} run a sidecar that does not support its target (TLS or DNS-named endpoints), whose snapshots leave the policy out: upgrade them",
                counted(),
                sync.outdated
            ),
        )
    } else {
        (false, Reason::Pending, counted())
    };
    Verdict {
        ok,
        reason,
        message,
    }
}

/// Warnings for the common mistakes: every method retried, duplicate risk
/// acknowledged, no statuses listed, fewer than two endpoints, attempts 0
/// (`docs/src/reference/errors.md`, "RetryPolicy conditions").
fn warnings(policy: &RetryPolicy, endpoints: i32, dns_named: bool) -> Vec<String> {
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
        _ if dns_named => {}
        0 => w.push("no ready endpoints".to_string()),
        1 => w.push("only one endpoint: a retry has no alternate".to_string()),
        _ => {}
    }
    if rule.retries.attempts == 0 {
        w.push("attempts is 0: nothing is retried".to_string());
    } else if rule.retries.budget_percent >= 100.0 {
        w.push(
            "budgetPercent is 100: retries may be all of the upstream's traffic; only attempts limits them in an outage"
                .to_string(),
        );
    }
    w
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use reprise_crds::retry_rule::RetryRule;
    use reprise_crds::snapshot::SnapshotEndpoint;

    use super::*;
    use crate::fixtures;
    use crate::reconcile::conditions::find;

    fn policy(rule: RetryRule) -> RetryPolicy {
        fixtures::policy().rule(rule).build()
    }

    /// The condition `type_` of the evaluated status.
    fn cond(e: &Evaluation, type_: ConditionType) -> &Condition {
        find(Some(&e.status), type_).unwrap_or_else(|| panic!("no {type_:?} condition"))
    }

    fn target(n: usize) -> Result<SnapshotUpstream, TargetProblem> {
        Ok(SnapshotUpstream {
            name: "api.shop".into(),
            hosts: vec![],
            protocol: Default::default(),
            addresses: vec![],
            endpoints: (0..n)
                .map(|i| SnapshotEndpoint {
                    address: format!("127.0.0.{}", i + 1),
                    port: 80,
                    pod: None,
                    zone: None,
                })
                .collect(),
            ..Default::default()
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
                ..Default::default()
            },
            t(100),
        );
        assert!(e.accepted);
        let s = &e.status;
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.in_sync.as_deref(), Some("3/3"));
        assert_eq!(s.state.as_deref(), Some("Active"));
        assert_eq!(s.endpoints, 3);
        let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Accepted", "InSync"], "written in this order");
        assert_eq!(cond(&e, ConditionType::Accepted).status, "True");
        assert_eq!(
            cond(&e, ConditionType::InSync).reason,
            Reason::AllSidecarsInSync.as_str()
        );
        assert_eq!(Reason::AllSidecarsInSync.as_str(), "AllSidecarsInSync");
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
        let c = cond(&e, ConditionType::Accepted);
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
        assert_eq!(cond(&e, ConditionType::Accepted).reason, "TargetNotFound");
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
                ..Default::default()
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
        assert_eq!(cond(&e, ConditionType::InSync).reason, "Pending");
        assert_eq!(e.status.status_summary.as_deref(), Some("Gateway"));
        assert!(!w.contains("budgetPercent"), "{w}");

        let mut unbudgeted = RetryRule::default();
        unbudgeted.retries.budget_percent = 100.0;
        let e = evaluate(&policy(unbudgeted), &target(2), SyncCounts::default(), t(1));
        let w = e.status.warnings.join("\n");
        assert!(
            w.contains("budgetPercent is 100: retries may be all"),
            "{w}"
        );
    }

    #[test]
    fn sidecars_too_old_for_the_target_are_named_as_why_the_policy_is_not_in_sync() {
        let e = evaluate(
            &policy(RetryRule::default()),
            &target(2),
            SyncCounts {
                selected: 3,
                in_sync: 1,
                outdated: 2,
            },
            t(1),
        );
        let c = cond(&e, ConditionType::InSync);
        assert_eq!(c.reason, "SidecarsOutdated");
        assert_eq!(c.status, "False");
        assert!(c.message.starts_with("1/3 sidecars run this generation; 2 run a sidecar that does not support its target"), "{}", c.message);
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
                ..Default::default()
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
                ..Default::default()
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
                ..Default::default()
            },
            t(300),
        );
        assert_eq!(
            cond(&changed, ConditionType::Accepted).last_transition_time,
            t(100)
        );
        assert_eq!(
            cond(&changed, ConditionType::InSync).last_transition_time,
            t(300)
        );
    }
}
