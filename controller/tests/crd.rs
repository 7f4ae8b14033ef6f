//! The generated CRD: committed copy in sync, CEL rules refuse what they must,
//! schema bounds present for the API server to enforce.

use reprise_crds::resource::{RetryPolicy, RetryPolicySpec, TargetRef};
use reprise_crds::retry_rule::{Boundary, HttpMethod, RetryRule};

fn committed(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn committed_crd_matches_the_types() {
    let generated = reprise_controller::crd::crd_yaml().expect("render");
    assert!(
        committed(reprise_controller::crd::CRD_PATH) == generated,
        "crds/retrypolicy.yaml is stale: run `cargo run -p reprise-controller -- crd > crds/retrypolicy.yaml`"
    );
}

fn policy(rule: RetryRule) -> RetryPolicy {
    RetryPolicy::new(
        "p",
        RetryPolicySpec {
            target_ref: TargetRef {
                name: "api".into(),
                port: None,
            },
            pod_selector: None,
            rule,
        },
    )
}

fn cel_error(rule: RetryRule) -> Option<String> {
    kube::core::cel::validate_cel(&policy(rule))
        .err()
        .map(|e| format!("{e:?}"))
}

#[test]
fn cel_accepts_the_safe_defaults() {
    assert_eq!(cel_error(RetryRule::default()), None);
    let rule = RetryRule {
        methods: vec![HttpMethod::Get, HttpMethod::Head, HttpMethod::Options],
        ..RetryRule::default()
    };
    assert_eq!(cel_error(rule), None);
}

#[test]
fn cel_requires_the_acknowledgement_for_duplicate_risk() {
    let post = RetryRule {
        methods: vec![HttpMethod::Post],
        ..RetryRule::default()
    };
    let statuses = RetryRule {
        statuses: vec![503],
        ..RetryRule::default()
    };
    let broad = RetryRule {
        failure_boundary: Boundary::BeforeHeaders,
        ..RetryRule::default()
    };
    for rule in [post, statuses, broad] {
        let err = cel_error(rule.clone()).expect("refused without acknowledgement");
        assert!(
            err.contains("acknowledgeDuplicateRisk must be true"),
            "{err}"
        );
        let mut acked = rule;
        acked.acknowledge_duplicate_risk = true;
        assert_eq!(cel_error(acked), None);
    }
}

#[test]
fn cel_requires_cap_at_least_base() {
    let mut rule = RetryRule::default();
    rule.retries.backoff_base_ms = 100;
    rule.retries.backoff_cap_ms = 50;
    let err = cel_error(rule).expect("refused");
    assert!(
        err.contains("backoffCapMs must be >= backoffBaseMs"),
        "{err}"
    );
}

#[test]
fn schema_carries_the_bounds_the_api_server_enforces() {
    let crd = serde_json::to_value(<RetryPolicy as kube::CustomResourceExt>::crd()).expect("json");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    assert_eq!(spec["retries"]["properties"]["attempts"]["maximum"], 10.0);
    assert_eq!(
        spec["retries"]["properties"]["totalDeadlineMs"]["minimum"],
        1.0
    );
    assert_eq!(
        spec["retries"]["properties"]["totalDeadlineMs"]["maximum"],
        600000.0
    );
    assert_eq!(spec["replayLimitBytes"]["maximum"], 4194304.0);
    assert_eq!(spec["statuses"]["items"]["minimum"], 400.0);
    assert_eq!(spec["statuses"]["items"]["maximum"], 599.0);
    assert_eq!(
        spec["methods"]["items"]["enum"].as_array().map(Vec::len),
        Some(8)
    );
    let names = &crd["spec"]["names"];
    assert_eq!(names["shortNames"][0], "rp");
    assert!(crd["spec"]["versions"][0]["subresources"]["status"].is_object());
}

#[test]
fn helm_chart_crd_matches_the_types() {
    let generated = reprise_controller::crd::crd_yaml().expect("render");
    assert!(
        committed("charts/reprise/crds/retrypolicy.yaml") == generated,
        "charts/reprise/crds/retrypolicy.yaml is stale: run `cp crds/retrypolicy.yaml charts/reprise/crds/retrypolicy.yaml` (after regenerating crds/retrypolicy.yaml)"
    );
}
