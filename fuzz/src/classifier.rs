//! Failure classification against generated policies.
//!
//! The retry loop (`sidecar/src/retry.rs`, private) treats a response as a
//! retryable failure exactly when `policy.retry_statuses.contains(status)`,
//! reads its delay with `failure::retry_after`, honours that delay only up to
//! `policy.retry_after_max`, and otherwise sleeps `full_jitter(nominal_backoff(n))`;
//! it retries a method only when `policy.methods.contains(method)`. This target
//! generates policies through the public formats (a file `retries:` block, a
//! file rule, and a snapshot's RetryRule), and checks those public pieces
//! against an independent model of what was written:
//!
//! - a status is retryable iff the written list (codes in 400..=599, the
//!   presets, the gateway block's 502/503/504 default and its implied 429)
//!   holds it; nothing outside 400..=599 is ever retryable;
//! - a method is retried only if it was listed (or `*`), never CONNECT/TRACE;
//! - every delay the loop could sleep is bounded: at most `retry_after_max`
//!   (<= 600 s) for an honoured Retry-After, at most `backoff_cap` otherwise.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::Origin;
use arbitrary::Arbitrary;
use http::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reprise_crds::file::{
    ConfigFile, EndpointSpec, RetriesSpec, RuleSpec, StatusEntry, UpstreamSpec,
};
use reprise_crds::policy::{GATEWAY_STATUSES, TRANSIENT_STATUSES};
use reprise_crds::retry_rule::{Boundary, HttpMethod, RetryRule, StatusPreset};
use reprise_crds::{FailureBoundary, RetryPolicy, ValidationErrors};
use reprise_sidecar::retry::{full_jitter, retry_after, FailureKind, ThreadRandom};

#[derive(Arbitrary, Debug)]
enum Entry {
    Code(i16),
    Gateway,
    Transient,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Method {
    Get,
    Head,
    Options,
    Put,
    Delete,
    Post,
    Patch,
    Any,
    Connect,
    Other(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    // The upstream's gateway `retries:` block.
    attempts: Option<u8>,
    retry_post: Option<bool>,
    statuses: Option<Vec<Entry>>,
    methods: Option<Vec<Method>>,
    acknowledge: Option<bool>,
    backoff_base_ms: Option<u32>,
    backoff_cap_ms: Option<u32>,
    retry_after_max_ms: Option<u32>,
    before_headers: Option<bool>,
    // A file rule.
    rule_statuses: Vec<Entry>,
    rule_methods: Option<Vec<Method>>,
    rule_acknowledge: Option<bool>,
    rule_before_headers: Option<bool>,
    // A snapshot RetryRule.
    snap_statuses: Vec<i32>,
    snap_presets: Vec<bool>,
    snap_methods: Vec<u8>,
    snap_acknowledge: bool,
    snap_retry_after_max_ms: i64,
    // What the upstream answers, and the request method.
    probes: Vec<(u16, Vec<u8>, String)>,
}

fn entry(e: &Entry) -> StatusEntry {
    match e {
        Entry::Code(c) => StatusEntry::Code(i64::from(*c)),
        Entry::Gateway => StatusEntry::Preset("gateway".into()),
        Entry::Transient => StatusEntry::Preset("transient".into()),
        Entry::Other(s) => StatusEntry::Preset(s.clone()),
    }
}

/// The statuses a written list names, by the presets' definitions (`docs/src/reference/file-format.md`).
fn model_statuses(entries: &[Entry]) -> BTreeSet<u16> {
    let mut set = BTreeSet::new();
    for e in entries {
        match e {
            Entry::Code(c) if (400..=599).contains(c) => {
                set.insert(*c as u16);
            }
            Entry::Gateway => set.extend(GATEWAY_STATUSES),
            Entry::Transient => set.extend(TRANSIENT_STATUSES),
            // Refused by validation; when the config is accepted these never occur.
            Entry::Code(_) | Entry::Other(_) => {}
        }
    }
    set
}

fn token(m: &Method) -> String {
    match m {
        Method::Get => "GET".into(),
        Method::Head => "head".into(), // tokens are case-insensitive in the file
        Method::Options => "OPTIONS".into(),
        Method::Put => "PUT".into(),
        Method::Delete => "Delete".into(),
        Method::Post => "POST".into(),
        Method::Patch => "PATCH".into(),
        Method::Any => "*".into(),
        Method::Connect => "CONNECT".into(),
        Method::Other(s) => s.clone(),
    }
}

/// The request methods (as sent, upper case) a written list retries; `None` = every method.
fn model_methods(tokens: &[String]) -> Option<BTreeSet<String>> {
    let mut set = BTreeSet::new();
    for t in tokens {
        if t == "*" {
            return None;
        }
        set.insert(t.to_ascii_uppercase());
    }
    Some(set)
}

const HTTP_METHODS: [&str; 10] = [
    "GET", "HEAD", "OPTIONS", "PUT", "DELETE", "POST", "PATCH", "CONNECT", "TRACE", "PROPFIND",
];

fn check_policy_against_model(
    origin: Origin,
    p: &RetryPolicy,
    statuses: &BTreeSet<u16>,
    methods: &Option<BTreeSet<String>>,
    probes: &[(u16, Vec<u8>, String)],
) {
    crate::check_policy(p, origin);
    // Every status the retry loop could see (hyper only yields 100..=999).
    for s in 0..=1000u16 {
        let retryable = p.retry_statuses.contains(s);
        assert_eq!(retryable, statuses.contains(&s), "status {s}");
        assert!(!retryable || (400..=599).contains(&s), "{s} retryable");
    }
    let methods_probe = HTTP_METHODS
        .iter()
        .map(|m| m.to_string())
        .chain(probes.iter().map(|p| p.2.clone()));
    for m in methods_probe {
        let retried = p.methods.contains(&m);
        if m == "CONNECT" || m == "TRACE" {
            assert!(!retried, "{m} retried");
        }
        if let Some(listed) = methods {
            assert_eq!(retried, listed.contains(&m), "method {m:?}");
        }
    }
    for (status, value, _) in probes {
        assert_eq!(
            p.retry_statuses.contains(*status),
            statuses.contains(status)
        );
        let kind = FailureKind::UpstreamStatus(*status);
        assert!(!kind.is_transport(), "a status never feeds passive health");
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.insert(RETRY_AFTER, v);
        }
        // The retry loop sleeps an honoured Retry-After (<= retry_after_max) or a
        // jittered backoff (<= backoff_cap); a longer Retry-After ends the retries.
        let sleep = match retry_after(&headers) {
            Some(wait) if wait > p.retry_after_max => None,
            Some(wait) => Some(wait),
            None => Some(full_jitter(
                p.nominal_backoff(p.max_retries.max(1)),
                &mut ThreadRandom,
            )),
        };
        if let Some(sleep) = sleep {
            assert!(sleep <= p.retry_after_max.max(p.backoff_cap));
            assert!(
                sleep <= Duration::from_secs(600),
                "unbounded sleep {sleep:?}"
            );
        }
    }
}

/// Replays one input: the bytes become an [`Input`] as libFuzzer's typed
/// targets make it (`arbitrary_take_rest`); too few bytes check nothing.
pub fn check(data: &[u8]) {
    if data.len() < <Input as Arbitrary>::size_hint(0).0 {
        return;
    }
    let Ok(input) = Input::arbitrary_take_rest(arbitrary::Unstructured::new(data)) else {
        return;
    };
    // The file: one upstream with a generated `retries:` block, one generated rule.
    let retries = RetriesSpec {
        attempts: input.attempts.map(u32::from),
        retry_post: input.retry_post,
        backoff_base_ms: input.backoff_base_ms.map(u64::from),
        backoff_cap_ms: input.backoff_cap_ms.map(u64::from),
        retry_statuses: input
            .statuses
            .as_ref()
            .map(|l| l.iter().map(entry).collect()),
        methods: input
            .methods
            .as_ref()
            .map(|l| l.iter().map(token).collect()),
        acknowledge_duplicate_risk: input.acknowledge,
        retry_after_max_ms: input.retry_after_max_ms.map(u64::from),
        failure_boundary: input.before_headers.map(|b| {
            if b {
                FailureBoundary::BeforeHeaders
            } else {
                FailureBoundary::Connect
            }
        }),
        budget_min_retries_per_second: Some(1),
        ..RetriesSpec::default()
    };
    let rule = RuleSpec {
        id: "r".into(),
        statuses: input.rule_statuses.iter().map(entry).collect(),
        methods: input
            .rule_methods
            .as_ref()
            .map(|l| l.iter().map(token).collect()),
        acknowledge_duplicate_risk: input.rule_acknowledge,
        failure_boundary: input.rule_before_headers.map(|b| {
            if b {
                FailureBoundary::BeforeHeaders
            } else {
                FailureBoundary::Connect
            }
        }),
        ..RuleSpec::default()
    };
    let file = ConfigFile {
        upstreams: vec![UpstreamSpec {
            name: "api".into(),
            endpoints: vec![EndpointSpec {
                address: "127.0.0.1".into(),
                port: 1,
                ..EndpointSpec::default()
            }],
            retries,
            ..UpstreamSpec::default()
        }],
        rules: vec![rule],
        ..ConfigFile::default()
    };
    if let Ok(cfg) = file.resolve() {
        crate::check_config(&cfg);
        // The gateway block: default 502/503/504; 429 joins whenever status retries are on.
        let mut up_statuses = match &input.statuses {
            None => GATEWAY_STATUSES.into_iter().collect(),
            Some(l) => model_statuses(l),
        };
        if !up_statuses.is_empty() {
            up_statuses.insert(429);
        }
        let mut up_tokens: Vec<String> = match &input.methods {
            None => vec!["GET".into(), "HEAD".into(), "OPTIONS".into()],
            Some(l) => l.iter().map(token).collect(),
        };
        if input.retry_post == Some(true) {
            up_tokens.push("POST".into());
        }
        check_policy_against_model(
            Origin::Upstream,
            &cfg.upstreams[0].retries,
            &up_statuses,
            &model_methods(&up_tokens),
            &input.probes,
        );
        let rule_tokens: Vec<String> = match &input.rule_methods {
            None => vec!["GET".into(), "HEAD".into()],
            Some(l) => l.iter().map(token).collect(),
        };
        check_policy_against_model(
            Origin::Rule,
            &cfg.rules[0].policy,
            &model_statuses(&input.rule_statuses),
            &model_methods(&rule_tokens),
            &input.probes,
        );
    }

    // A snapshot's RetryRule: the controller's format, the same checks.
    const ALL: [HttpMethod; 8] = [
        HttpMethod::Get,
        HttpMethod::Head,
        HttpMethod::Options,
        HttpMethod::Put,
        HttpMethod::Delete,
        HttpMethod::Post,
        HttpMethod::Patch,
        HttpMethod::Any,
    ];
    let methods: Vec<HttpMethod> = input
        .snap_methods
        .iter()
        .map(|i| ALL[usize::from(*i) % ALL.len()])
        .collect();
    let rule = RetryRule {
        statuses: input.snap_statuses.clone(),
        status_presets: input
            .snap_presets
            .iter()
            .map(|g| {
                if *g {
                    StatusPreset::Gateway
                } else {
                    StatusPreset::Transient
                }
            })
            .collect(),
        methods: methods.clone(),
        acknowledge_duplicate_risk: input.snap_acknowledge,
        failure_boundary: Boundary::Connect,
        retries: reprise_crds::retry_rule::Retries {
            retry_after_max_ms: input.snap_retry_after_max_ms,
            ..Default::default()
        },
        ..RetryRule::default()
    };
    let mut errs = ValidationErrors::default();
    let (resolved, _) = rule.resolve("ns/p", "api.ns", "ns/p: spec", &mut errs);
    if errs.is_empty() {
        crate::check_rule(&resolved);
        let mut statuses: BTreeSet<u16> = input
            .snap_statuses
            .iter()
            .filter_map(|s| u16::try_from(*s).ok())
            .collect();
        for g in &input.snap_presets {
            statuses.extend(if *g {
                &GATEWAY_STATUSES[..]
            } else {
                &TRANSIENT_STATUSES[..]
            });
        }
        let tokens: Vec<String> = methods
            .iter()
            .map(|m| {
                serde_json::to_value(m)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            })
            .collect();
        check_policy_against_model(
            Origin::Rule,
            &resolved.policy,
            &statuses,
            &model_methods(&tokens),
            &input.probes,
        );
    }
}
