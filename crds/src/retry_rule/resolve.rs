//! Validation and resolution of a [`RetryRule`] into the [`Rule`] a sidecar
//! runs: every broken rule reported at once with its field path, with the same
//! bounds the file format and the CRD schema use.

use std::time::Duration;

use super::{Boundary, RetryRule, DEFAULT_MIN_RETRIES_PER_SECOND};
use crate::config::{BudgetSettings, Rule};
use crate::file::{common, HedgeSpec, StatusEntry};
use crate::grpc::GrpcStatusSet;
use crate::matching::{HeaderMatch, RequestMatch};
use crate::policy::{FailureBoundary, MethodSet, RetryPolicy, StatusSet, MAX_RETRIES};
use crate::validation::ValidationErrors;

fn non_negative(errs: &mut ValidationErrors, field: &str, v: i64) -> Option<u64> {
    match u64::try_from(v) {
        Ok(v) => Some(v),
        Err(_) => {
            errs.push(field, format!("must be at least 0 (got {v})"));
            None
        }
    }
}

/// The numbers of a rule resolved: its retries block and its replay limit.
struct Limits {
    max_retries: u32,
    backoff_base: Duration,
    backoff_cap: Duration,
    replay_limit_bytes: u64,
    total_deadline: Option<Duration>,
    attempt_timeout: Option<Duration>,
    hedge_delay: Option<Duration>,
    retry_after_max: Duration,
    budget: BudgetSettings,
}

/// The checks shared with the file format, whose results the rule keeps.
struct Shared {
    backoff_base: Duration,
    backoff_cap: Duration,
    total_deadline: Option<Duration>,
    hedge_delay: Option<Duration>,
    replay_limit_bytes: u64,
}

impl RetryRule {
    /// Validates (with the rules the file format and the CRD schema also use)
    /// and resolves this rule. `p` is the field path prefix (e.g. `spec`).
    /// Returns the rule and the budget it asks for its target. Errors come in
    /// this order: methods, statuses, gRPC statuses, the acknowledgement, the
    /// retries block (with the replay limit), the CEL condition.
    pub fn resolve(
        &self,
        id: &str,
        upstream: &str,
        p: &str,
        errs: &mut ValidationErrors,
    ) -> (Rule, BudgetSettings) {
        let methods = self.resolve_methods(p, errs);
        let statuses = self.resolve_statuses(p, errs);
        let grpc_statuses =
            GrpcStatusSet::parse(errs, &format!("{p}.grpcStatuses"), &self.grpc_statuses);
        let boundary = match self.failure_boundary {
            Boundary::Connect => FailureBoundary::Connect,
            Boundary::BeforeHeaders => FailureBoundary::BeforeHeaders,
        };
        common::duplicate_risk(
            errs,
            &format!("{p}.acknowledgeDuplicateRisk"),
            "failureBoundary BeforeHeaders",
            self.acknowledge_duplicate_risk,
            common::Retried {
                methods,
                boundary,
                statuses,
                grpc_statuses,
            },
        );
        let limits = self.resolve_limits(p, errs);
        let cel = common::cel(
            errs,
            &format!("{p}.match.cel"),
            self.request_match.as_ref().and_then(|m| m.cel.as_deref()),
        );
        let rule = Rule {
            id: id.to_string(),
            precedence: 0,
            priority: self.priority,
            report_as: None,
            enabled: self.enabled,
            upstreams: vec![upstream.to_string()],
            methods,
            request_match: self.plain_match(),
            cel,
            policy: RetryPolicy {
                max_retries: limits.max_retries,
                methods,
                failure_boundary: boundary,
                retry_statuses: statuses,
                grpc_statuses,
                retry_transport: self.retries.retry_transport,
                backoff_base: limits.backoff_base,
                backoff_cap: limits.backoff_cap,
                replay_limit_bytes: limits.replay_limit_bytes,
                total_deadline: limits.total_deadline,
                attempt_timeout: limits.attempt_timeout,
                hedge_delay: limits.hedge_delay,
                reuse_endpoints: self.retries.reuse_endpoints,
                retry_after_max: limits.retry_after_max,
                duplicate_risk_acknowledged: self.acknowledge_duplicate_risk,
                deadlines: self
                    .deadlines
                    .as_ref()
                    .map_or(crate::policy::DeadlinePolicy::ON, super::Deadlines::resolve),
                retry_layers: self
                    .retry_layers
                    .map_or(crate::policy::RetryLayers::Every, super::Layers::resolve),
                deadline_answers_timeout: false,
            },
        };
        (rule, limits.budget)
    }

    /// `methods`: at least one, each known and retryable.
    fn resolve_methods(&self, p: &str, errs: &mut ValidationErrors) -> MethodSet {
        let methods_field = format!("{p}.methods");
        let names: Vec<String> = self.methods.iter().map(|m| m.token().to_string()).collect();
        let methods = common::methods(errs, &methods_field, &names);
        if self.methods.is_empty() {
            errs.push(methods_field, "must list at least one method");
        }
        methods
    }

    /// `statuses` and `statusPresets`, through the file format's status list
    /// check (as codes and as the presets' names).
    fn resolve_statuses(&self, p: &str, errs: &mut ValidationErrors) -> StatusSet {
        let codes: Vec<StatusEntry> = self
            .statuses
            .iter()
            .map(|s| StatusEntry::Code(i64::from(*s)))
            .collect();
        let presets: Vec<StatusEntry> = self
            .status_presets
            .iter()
            .map(|s| StatusEntry::Preset(s.name().to_string()))
            .collect();
        let mut statuses = common::statuses(errs, &format!("{p}.statuses"), &codes);
        for s in common::statuses(errs, &format!("{p}.statusPresets"), &presets).statuses() {
            statuses.insert(s);
        }
        statuses
    }

    /// The retries block (`{p}.retries`) and the replay limit: attempts,
    /// backoff, deadline, hedge, replay buffer, budget, timeouts. Signed
    /// fields are refused when negative rather than read as a default.
    fn resolve_limits(&self, p: &str, errs: &mut ValidationErrors) -> Limits {
        let r = &self.retries;
        let rp = format!("{p}.retries");
        let attempts = u32::try_from(r.attempts).unwrap_or(u32::MAX);
        if r.attempts < 0 || attempts > MAX_RETRIES {
            errs.push(
                format!("{rp}.attempts"),
                format!("must be in 0..=10 (got {})", r.attempts),
            );
        }
        let shared = self.shared_limits(p, &rp, errs);
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
            i64::from(
                r.budget_min_retries_per_second
                    .unwrap_or(DEFAULT_MIN_RETRIES_PER_SECOND),
            ),
        )
        .map(|v| common::ranged(errs, &min_per_second_field, Some(v), 0, 0, 100_000))
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or(0);
        Limits {
            max_retries: attempts.min(MAX_RETRIES),
            backoff_base: shared.backoff_base,
            backoff_cap: shared.backoff_cap,
            replay_limit_bytes: shared.replay_limit_bytes,
            total_deadline: shared.total_deadline,
            attempt_timeout,
            hedge_delay: shared.hedge_delay,
            retry_after_max: Duration::from_millis(retry_after_max),
            budget: BudgetSettings {
                percent: r.budget_percent,
                window: Duration::from_secs(10),
                min_retries_per_second: f64::from(min_retries_per_second),
            },
        }
    }

    /// Backoff, deadline, hedge and replay limit through the file format's
    /// checks, after refusing negative values (which those checks cannot see).
    fn shared_limits(&self, p: &str, rp: &str, errs: &mut ValidationErrors) -> Shared {
        let r = &self.retries;
        let base = non_negative(errs, &format!("{rp}.backoffBaseMs"), r.backoff_base_ms);
        let cap = non_negative(errs, &format!("{rp}.backoffCapMs"), r.backoff_cap_ms);
        // A negative size must be refused, not read as "unset" (the default).
        let replay_bytes = non_negative(
            errs,
            &format!("{p}.replayLimitBytes"),
            self.replay_limit_bytes,
        );
        let mut camel = ValidationErrors::default();
        let (backoff_base, backoff_cap) = common::backoff(&mut camel, rp, base, cap);
        let total_deadline = common::total_deadline(
            &mut camel,
            rp,
            r.total_deadline_ms
                .and_then(|v| u64::try_from(v).ok().or(Some(0))),
        );
        let hedge = r.hedge.as_ref().map(|h| HedgeSpec::Delay {
            delay_ms: u64::try_from(h.delay_ms).unwrap_or(0),
        });
        let hedge_delay = common::hedge(&mut camel, rp, hedge.as_ref());
        let replay_limit_bytes =
            common::replay_limit(&mut camel, &format!("{p}.replay_limit_bytes"), replay_bytes);
        // The shared checks name fields as the file does; rename them to the resource's camelCase.
        for e in camel.0 {
            errs.push(snake_to_camel(&e.field), snake_to_camel(&e.rule));
        }
        Shared {
            backoff_base,
            backoff_cap,
            total_deadline,
            hedge_delay,
            replay_limit_bytes,
        }
    }

    /// `match` without its CEL condition (compiled separately), header names
    /// in lower case.
    fn plain_match(&self) -> RequestMatch {
        self.request_match
            .as_ref()
            .map(|m| RequestMatch {
                path_exact: m.path_exact.clone(),
                path_prefix: m.path_prefix.clone(),
                path_segment_prefix: None,
                query: Vec::new(),
                headers: m
                    .headers
                    .iter()
                    .map(|h| HeaderMatch {
                        name: h.name.to_ascii_lowercase(),
                        value: h.value.clone(),
                    })
                    .collect(),
                cel: None,
            })
            .unwrap_or_default()
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
    use crate::retry_rule::Retries;

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
                budget_min_retries_per_second: Some(v),
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
    fn a_policy_without_a_budget_floor_gets_ten_and_an_explicit_zero_keeps_zero() {
        let floor_of = |json: &str| {
            let rule: RetryRule = serde_json::from_str(json).expect("a rule");
            let mut errs = ValidationErrors::default();
            let (_, budget) = rule.resolve("ns/p", "api.ns", "spec", &mut errs);
            assert!(errs.is_empty(), "{errs}");
            budget.min_retries_per_second
        };
        assert_eq!(floor_of(r#"{"targetRef":{"name":"api"}}"#), 10.0);
        assert_eq!(floor_of(r#"{"retries":{"attempts":2}}"#), 10.0);
        assert_eq!(
            floor_of(r#"{"retries":{"budgetMinRetriesPerSecond":0}}"#),
            0.0
        );
    }

    #[test]
    fn a_broken_cel_condition_is_refused_at_spec_match_cel() {
        let rule = |cel: &str| RetryRule {
            request_match: Some(crate::retry_rule::Match {
                cel: Some(cel.to_string()),
                ..Default::default()
            }),
            ..RetryRule::default()
        };
        assert_eq!(
            resolve_errors(&rule("request.method = 'GET'")),
            "spec.match.cel: line 1, column 16: Syntax error: token recognition error at: '= '; \
             line 1, column 18: Syntax error: extraneous input ''GET'' expecting <EOF>"
        );
        assert_eq!(resolve_errors(&rule("request.method == 'GET'")), "");
    }

    #[test]
    fn statuses_and_presets_are_checked_as_the_file_checks_them() {
        let rule = |statuses: Vec<i32>, presets: Vec<crate::retry_rule::StatusPreset>| RetryRule {
            statuses,
            status_presets: presets,
            acknowledge_duplicate_risk: true,
            ..RetryRule::default()
        };
        assert_eq!(
            resolve_errors(&rule(vec![503, 600, 399], vec![])),
            "spec.statuses[1]: must be a 4xx or 5xx status in 400..=599 (got 600); \
             spec.statuses[2]: must be a 4xx or 5xx status in 400..=599 (got 399)"
        );
        let mut errs = ValidationErrors::default();
        let (resolved, _) = rule(vec![418], vec![crate::retry_rule::StatusPreset::Gateway])
            .resolve("ns/p", "api.ns", "spec", &mut errs);
        assert_eq!(errs.to_string(), "");
        assert_eq!(
            resolved.policy.retry_statuses.statuses(),
            vec![418, 502, 503, 504]
        );
    }

    #[test]
    fn every_broken_field_is_reported_in_a_fixed_order() {
        let rule = RetryRule {
            methods: vec![],
            statuses: vec![600],
            status_presets: vec![crate::retry_rule::StatusPreset::Transient],
            grpc_statuses: vec![crate::grpc::GrpcStatusEntry::Name("bogus".into())],
            failure_boundary: crate::retry_rule::Boundary::BeforeHeaders,
            replay_limit_bytes: -1,
            request_match: Some(crate::retry_rule::Match {
                cel: Some("nope".to_string()),
                ..Default::default()
            }),
            retries: Retries {
                attempts: 11,
                backoff_base_ms: -1,
                backoff_cap_ms: 700_000,
                budget_percent: 0.0,
                budget_min_retries_per_second: Some(-1),
                total_deadline_ms: Some(0),
                attempt_timeout_ms: Some(0),
                hedge: Some(crate::retry_rule::Hedge { delay_ms: 0 }),
                retry_after_max_ms: -1,
                ..Retries::default()
            },
            ..RetryRule::default()
        };
        let mut errs = ValidationErrors::default();
        rule.resolve("ns/p", "api.ns", "spec", &mut errs);
        let found: Vec<String> = errs.0.iter().map(|e| e.to_string()).collect();
        let grpc_names = crate::grpc::CODES[1..].join(", ");
        assert_eq!(
            found,
            vec![
                "spec.methods: must list at least one method".to_string(),
                "spec.statuses[0]: must be a 4xx or 5xx status in 400..=599 (got 600)".into(),
                format!("spec.grpcStatuses[0]: must be a gRPC status name ({grpc_names}) or a number in 1..=16 (got \"bogus\")"),
                "spec.acknowledgeDuplicateRisk: must be true for failureBoundary BeforeHeaders, status retries (a retry may duplicate an upstream operation)".into(),
                "spec.retries.attempts: must be in 0..=10 (got 11)".into(),
                "spec.retries.backoffBaseMs: must be at least 0 (got -1)".into(),
                "spec.replayLimitBytes: must be at least 0 (got -1)".into(),
                "spec.retries.backoffCapMs: must be at most 600000 (got 700000)".into(),
                "spec.retries.totalDeadlineMs: must not be 0; omit the field for an unbounded deadline".into(),
                "spec.retries.hedge.delayMs: must be at least 1 (got 0)".into(),
                "spec.retries.budgetPercent: must be in (0, 100] (got 0)".into(),
                "spec.retries.attemptTimeoutMs: must be in 1..=3600000 (got 0)".into(),
                "spec.retries.retryAfterMaxMs: must be at least 0 (got -1)".into(),
                "spec.retries.budgetMinRetriesPerSecond: must be at least 0 (got -1)".into(),
                "spec.match.cel: unknown variable `nope`: only `request` (method, path, host, headers) is defined".into(),
            ]
        );
    }

    #[test]
    fn retry_after_max_is_bounded_as_in_the_schema() {
        // Found by the classifier fuzz target (fuzz/src/classifier.rs): the snapshot path accepted any value.
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

    #[test]
    fn deadlines_resolve_on_when_absent_and_each_way_as_written() {
        use crate::policy::DeadlinePolicy;
        use crate::retry_rule::Deadlines;
        let resolved = |deadlines: Option<Deadlines>| {
            let rule = RetryRule {
                deadlines,
                ..RetryRule::default()
            };
            let mut errs = ValidationErrors::default();
            let (rule, _) = rule.resolve("ns/p", "api.ns", "spec", &mut errs);
            assert_eq!(errs.to_string(), "");
            rule.policy.deadlines
        };
        assert_eq!(resolved(None), DeadlinePolicy::ON);
        let off: Deadlines = serde_json::from_value(serde_json::json!({ "acceptIncoming": false }))
            .expect("camelCase, propagate defaulted");
        assert_eq!(
            resolved(Some(off)),
            DeadlinePolicy {
                propagate: true,
                accept_incoming: false
            }
        );
        let off: Deadlines = serde_json::from_value(serde_json::json!({ "propagate": false }))
            .expect("acceptIncoming defaulted");
        assert_eq!(
            resolved(Some(off)),
            DeadlinePolicy {
                propagate: false,
                accept_incoming: true
            }
        );
    }
}
