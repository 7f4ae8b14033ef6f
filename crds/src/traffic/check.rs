//! What a controller takes from a report line: the names sidecars produce
//! (exhaustion and skip reasons, failure kinds, the fixed latency
//! histogram), integers within bounds, and counts that agree with each
//! other (`success ≤ requests`). A report is read from a pod the controller
//! cannot trust: whatever it holds, what is kept is bounded by this
//! vocabulary, never by what the pod sent.
//!
//! A name this build does not know (a newer sidecar's reason) is dropped
//! and counted, as an unknown field is: never a reason to refuse the rest.
//! A count out of bounds, or counts that contradict each other, refuse the
//! whole report: no part of it can be believed.

use std::collections::BTreeMap;

use super::{TrafficCounts, TrafficReport, LATENCY_BOUNDS_MS};
use crate::Error;

/// Why a sidecar's request ran out of retries, as sidecars name it.
pub const EXHAUSTED_REASONS: [&str; 5] = [
    "attempts",
    "budget",
    "deadline",
    "no_alternate",
    "retry_after_too_long",
];

/// Why a failed request was not retried, as sidecars name it.
pub const SKIP_REASONS: [&str; 10] = [
    "retries_off",
    "method",
    "tunnel",
    "upgrade",
    "body_consumed",
    "failure_boundary",
    "transport_off",
    "not_retryable",
    "pushback",
    "upper_layer_retry",
];

/// Failure kinds with a fixed name; `upstream_status_NNN` (400-599) and
/// `grpc_status_NAME` (a gRPC code's name, `_` for `-`) are the others.
pub const FAILURE_KINDS: [&str; 15] = [
    "connect_refused",
    "connect_timeout",
    "connect_error",
    "local_resources",
    "tls_handshake",
    "tls_certificate",
    "connection_reset",
    "connection_closed",
    "protocol_error",
    "read_timeout",
    "deadline_exceeded",
    "request_body_error",
    "stream_refused",
    "stream_reset",
    "other",
];

/// The largest count a report may carry in any field: far above what a
/// sidecar counts between two reports, far below what a sum of reports
/// over the window could overflow.
pub const MAX_COUNT: u64 = 1 << 40;

/// Distinct failure kinds one policy's counts may carry in one report.
pub const MAX_FAILURE_KINDS: usize = 32;

/// Requests a sidecar may have counted in part while it took its report:
/// the latency bucket, first failure and retries of a request finishing
/// meanwhile can land in one report and its request in the next. Counts
/// that only the next report's requests explain are allowed this far.
pub const RECORD_LAG: u64 = 1024;

/// Most retries and hedges one request can have sent.
const MAX_RETRIES_PER_REQUEST: u64 = 32;

/// What [`TrafficReport::check`] dropped from a report it took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Fields this build does not know.
    pub fields: u64,
    /// Reasons and failure kinds this build does not know.
    pub names: u64,
}

impl Dropped {
    /// True when nothing was dropped.
    pub fn is_empty(&self) -> bool {
        self.fields == 0 && self.names == 0
    }
}

/// Whether `name` is a failure kind a sidecar produces.
pub fn is_failure_kind(name: &str) -> bool {
    if FAILURE_KINDS.contains(&name) {
        return true;
    }
    if let Some(code) = name.strip_prefix("upstream_status_") {
        return code.len() == 3
            && code.bytes().all(|b| b.is_ascii_digit())
            && code.parse::<u16>().is_ok_and(|c| (400..=599).contains(&c));
    }
    if let Some(grpc) = name.strip_prefix("grpc_status_") {
        return crate::grpc::CODES[1..]
            .iter()
            .any(|c| c.len() == grpc.len() && c.replace('-', "_") == grpc);
    }
    false
}

impl TrafficReport {
    /// Checks the report as a controller takes it from a sidecar: names
    /// it does not know are dropped (and counted in what it returns); a
    /// count over [`MAX_COUNT`], counts that contradict each other, or more
    /// than [`MAX_FAILURE_KINDS`] failure kinds refuse it, naming the field
    /// and the rule.
    pub fn check(&mut self) -> Result<Dropped, Error> {
        let mut dropped = Dropped {
            fields: self.unknown.0,
            names: 0,
        };
        self.unknown = Default::default();
        for (policy, c) in &mut self.traffic {
            dropped.fields += c.unknown.0;
            c.unknown = Default::default();
            dropped.names += keep_known(&mut c.exhausted, |n| EXHAUSTED_REASONS.contains(&n));
            dropped.names += keep_known(&mut c.skipped, |n| SKIP_REASONS.contains(&n));
            dropped.names += keep_known(&mut c.failures, is_failure_kind);
            check_counts(policy, c)?;
        }
        Ok(dropped)
    }
}

/// Drops the entries of `map` whose name `known` refuses; how many.
fn keep_known(map: &mut BTreeMap<String, u64>, known: impl Fn(&str) -> bool) -> u64 {
    let before = map.len();
    map.retain(|name, _| known(name));
    (before - map.len()) as u64
}

fn check_counts(policy: &str, c: &TrafficCounts) -> Result<(), Error> {
    let refuse = |field: &str, rule: String| Error::Report {
        field: format!("traffic[{policy:?}].{field}"),
        rule,
    };
    let singles = [
        ("requests", c.requests),
        ("firstTrySuccess", c.first_try_success),
        ("success", c.success),
        ("retries", c.retries),
        ("recovered", c.recovered),
        ("budgetRefusals", c.budget_refusals),
    ];
    let maps = [
        ("exhausted", &c.exhausted),
        ("skipped", &c.skipped),
        ("failures", &c.failures),
    ];
    let entries = maps
        .iter()
        .flat_map(|(field, m)| m.iter().map(move |(k, v)| (format!("{field}[{k:?}]"), *v)));
    let buckets = c
        .latency
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("latency[{i}]"), *v));
    for (field, v) in singles
        .iter()
        .map(|(f, v)| (f.to_string(), *v))
        .chain(entries)
        .chain(buckets)
    {
        if v > MAX_COUNT {
            return Err(refuse(
                &field,
                format!("must be at most {MAX_COUNT} (got {v})"),
            ));
        }
    }
    let at_most = |field: &str, v: u64, bound: u64, of: &str| {
        if v > bound {
            Err(refuse(
                field,
                format!("must be at most {of} ({bound}) (got {v})"),
            ))
        } else {
            Ok(())
        }
    };
    let sum = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
    at_most("success", c.success, c.requests, "requests")?;
    at_most("firstTrySuccess", c.first_try_success, c.success, "success")?;
    at_most("recovered", c.recovered, c.requests, "requests")?;
    at_most("budgetRefusals", c.budget_refusals, c.requests, "requests")?;
    at_most(
        "exhausted",
        sum(&c.exhausted) + sum(&c.skipped),
        c.requests,
        "requests, with skipped",
    )?;
    let lagging = c.requests + RECORD_LAG;
    at_most(
        "retries",
        c.retries,
        c.requests * MAX_RETRIES_PER_REQUEST + RECORD_LAG,
        "32 per request",
    )?;
    at_most("failures", sum(&c.failures), lagging, "requests")?;
    at_most("latency", c.latency.iter().sum(), lagging, "requests")?;
    if c.failures.len() > MAX_FAILURE_KINDS {
        return Err(refuse(
            "failures",
            format!(
                "must name at most {MAX_FAILURE_KINDS} kinds (got {})",
                c.failures.len()
            ),
        ));
    }
    let buckets = LATENCY_BOUNDS_MS.len() + 1;
    if c.latency.len() > buckets {
        return Err(refuse(
            "latency",
            format!(
                "must have at most {buckets} buckets (got {})",
                c.latency.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::SidecarLine;

    fn line(json: &str) -> TrafficReport {
        match serde_json::from_str::<SidecarLine>(json).expect("a line") {
            SidecarLine::Traffic(r) => r,
            other => panic!("not a report: {other:?}"),
        }
    }

    #[test]
    fn known_names_are_kept_and_unknown_ones_and_fields_dropped_and_counted() {
        let mut r = line(
            r#"{"traffic":{"shop/reads":{"requests":10,"success":9,"firstTrySuccess":8,
            "exhausted":{"budget":1,"made_up":1},"skipped":{"\u001b[2J":1},
            "failures":{"upstream_status_503":2,"grpc_status_unavailable":1,"upstream_status_200":1,"connect_refused":1},
            "observed":{"x":1}}},"routes":{"HTTPRoute:shop/r#0":{}},"final":true}"#,
        );
        assert!(r.last);
        let dropped = r.check().expect("taken");
        assert_eq!(
            dropped,
            Dropped {
                fields: 2,
                names: 3
            }
        );
        let c = &r.traffic["shop/reads"];
        assert_eq!(c.exhausted.keys().collect::<Vec<_>>(), ["budget"]);
        assert!(c.skipped.is_empty());
        assert_eq!(
            c.failures.keys().collect::<Vec<_>>(),
            [
                "connect_refused",
                "grpc_status_unavailable",
                "upstream_status_503"
            ]
        );
        assert_eq!(r.unknown.0, 0, "nothing unknown is kept");
    }

    #[test]
    fn counts_out_of_bounds_or_contradicting_each_other_refuse_the_report() {
        for (counts, field, rule) in [
            (
                r#"{"requests":5,"success":9}"#,
                r#"traffic["shop/reads"].success"#,
                "must be at most requests (5) (got 9)",
            ),
            (
                r#"{"requests":2000000000000,"success":1}"#,
                r#"traffic["shop/reads"].requests"#,
                "must be at most 1099511627776 (got 2000000000000)",
            ),
            (
                r#"{"requests":5,"success":5,"firstTrySuccess":6}"#,
                r#"traffic["shop/reads"].firstTrySuccess"#,
                "must be at most success (5) (got 6)",
            ),
            (
                r#"{"requests":5,"exhausted":{"budget":3},"skipped":{"method":3}}"#,
                r#"traffic["shop/reads"].exhausted"#,
                "must be at most requests, with skipped (5) (got 6)",
            ),
            (
                r#"{"requests":1,"latency":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}"#,
                r#"traffic["shop/reads"].latency"#,
                "must have at most 16 buckets (got 17)",
            ),
            (
                r#"{"requests":0,"latency":[2000]}"#,
                r#"traffic["shop/reads"].latency"#,
                "must be at most requests (1024) (got 2000)",
            ),
        ] {
            let mut r = line(&format!(r#"{{"traffic":{{"shop/reads":{counts}}}}}"#));
            match r.check() {
                Err(Error::Report { field: f, rule: r }) => {
                    assert_eq!((f.as_str(), r.as_str()), (field, rule), "{counts}");
                }
                other => panic!("{counts}: {other:?}"),
            }
        }
        // Numbers no u64 holds, or below zero, are not a report at all.
        assert!(serde_json::from_str::<SidecarLine>(
            r#"{"traffic":{"a/b":{"requests":99999999999999999999999}}}"#
        )
        .is_err());
        assert!(
            serde_json::from_str::<SidecarLine>(r#"{"traffic":{"a/b":{"requests":-1}}}"#).is_err()
        );
    }

    #[test]
    fn too_many_failure_kinds_refuse_the_report() {
        let kinds: Vec<String> = (500..540)
            .map(|s| format!(r#""upstream_status_{s}":1"#))
            .collect();
        let mut r = line(&format!(
            r#"{{"traffic":{{"a/b":{{"requests":100,"failures":{{{}}}}}}}}}"#,
            kinds.join(",")
        ));
        let e = r.check().expect_err("refused").to_string();
        assert!(e.contains("must name at most 32 kinds (got 40)"), "{e}");
    }

    #[test]
    fn failure_kinds_are_the_sidecars_names_only() {
        for ok in [
            "connect_refused",
            "upstream_status_503",
            "upstream_status_429",
            "grpc_status_resource_exhausted",
            "grpc_status_unavailable",
        ] {
            assert!(is_failure_kind(ok), "{ok}");
        }
        for bad in [
            "upstream_status_200",
            "upstream_status_5030",
            "upstream_status_+50",
            "grpc_status_ok",
            "grpc_status_resource-exhausted",
            "grpc_status_code_20",
            "",
            "\u{1b}]52;c;aGk=\u{7}",
        ] {
            assert!(!is_failure_kind(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_sidecars_own_report_reads_back_without_final_or_unknown_fields() {
        let r = TrafficReport {
            traffic: [(
                "shop/reads".to_string(),
                TrafficCounts {
                    requests: 1,
                    ..TrafficCounts::default()
                },
            )]
            .into(),
            ..TrafficReport::default()
        };
        let json = serde_json::to_string(&r).expect("json");
        assert_eq!(
            json,
            r#"{"traffic":{"shop/reads":{"requests":1,"firstTrySuccess":0,"success":0,"retries":0,"recovered":0,"budgetRefusals":0}}}"#
        );
        let last = TrafficReport { last: true, ..r };
        assert!(serde_json::to_string(&last)
            .expect("json")
            .ends_with(r#","final":true}"#));
    }
}
