//! Validation and resolution of a [`RetryRule`] into the [`Rule`] a sidecar
//! runs: every broken rule reported at once with its field path, with the same
//! bounds the file format and the CRD schema use.

use std::time::Duration;

use super::{Boundary, RetryRule};
use crate::config::{BudgetSettings, Rule};
use crate::file::{common, StatusEntry};
use crate::matching::RequestMatch;
use crate::policy::{FailureBoundary, MethodSet, RetryPolicy, MAX_RETRIES};
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
        // Both lists through the file format's status list check: the codes
        // as they are, the presets by their names there.
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
        let grpc_statuses = crate::grpc::GrpcStatusSet::parse(
            errs,
            &format!("{p}.grpcStatuses"),
            &self.grpc_statuses,
        );
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
                cel: None,
            })
            .unwrap_or_default();
        let cel = common::cel(
            errs,
            &format!("{p}.match.cel"),
            self.request_match.as_ref().and_then(|m| m.cel.as_deref()),
        );
        let rule = Rule {
            id: id.to_string(),
            priority: self.priority,
            enabled: self.enabled,
            upstreams: vec![upstream.to_string()],
            methods,
            request_match,
            cel,
            policy: RetryPolicy {
                max_retries: attempts.min(MAX_RETRIES),
                methods,
                failure_boundary: boundary,
                retry_statuses: statuses,
                grpc_statuses,
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
