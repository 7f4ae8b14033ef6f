//! The duplicate-risk rule is stated twice: in Rust
//! ([`common::duplicate_risk`], run by both formats) and in CEL, on the CRD
//! (`RetryRule`'s validation on `acknowledgeDuplicateRisk`, which the API
//! server runs). These tests run the CEL rule as it appears in the generated
//! CRD and the Rust function on the same specs and require the same verdict.

use cel::{Context, Program, Value};
use serde_json::json;

use super::RetryRule;
use crate::file::common;
use crate::validation::ValidationErrors;

/// The generated CRD as committed (the controller's drift test keeps it
/// equal to what the types generate).
const CRD_YAML: &str = include_str!("../../retrypolicy.yaml");

/// Where the rule sits in the CRD.
const FIELD_PATH: &str = ".acknowledgeDuplicateRisk";

/// The `rule` of every `x-kubernetes-validations` entry on `fieldPath`
/// [`FIELD_PATH`], anywhere in `crd`.
fn rules_on_the_acknowledgement(crd: &serde_yaml::Value, out: &mut Vec<String>) {
    match crd {
        serde_yaml::Value::Mapping(m) => {
            if let Some(serde_yaml::Value::Sequence(validations)) =
                m.get("x-kubernetes-validations")
            {
                for v in validations {
                    if v.get("fieldPath").and_then(|f| f.as_str()) == Some(FIELD_PATH) {
                        let rule = v.get("rule").and_then(|r| r.as_str());
                        out.push(rule.expect("a validation has a rule").to_string());
                    }
                }
            }
            m.values()
                .for_each(|v| rules_on_the_acknowledgement(v, out));
        }
        serde_yaml::Value::Sequence(s) => {
            s.iter().for_each(|v| rules_on_the_acknowledgement(v, out))
        }
        _ => {}
    }
}

/// The one CEL rule on the acknowledgement in `crd_yaml`.
fn cel_rule(crd_yaml: &str) -> String {
    let crd: serde_yaml::Value = serde_yaml::from_str(crd_yaml).expect("the CRD parses");
    let mut rules = Vec::new();
    rules_on_the_acknowledgement(&crd, &mut rules);
    assert_eq!(rules.len(), 1, "one CEL rule on {FIELD_PATH}: {rules:?}");
    rules.remove(0)
}

/// The CEL rule compiled, with a way to run it on a spec (`self`).
struct CelRule(Program);

impl CelRule {
    fn new(source: &str) -> CelRule {
        CelRule(Program::compile(source).expect("the CRD's CEL rule compiles"))
    }

    /// True when the rule refuses `spec` (the API server's verdict).
    fn refuses(&self, spec: &serde_json::Value) -> bool {
        let mut context = Context::default();
        context.add_variable_from_value("self", cel::to_value(spec).expect("a JSON value"));
        match self.0.execute(&context) {
            Ok(Value::Bool(holds)) => !holds,
            other => panic!("the CEL rule on {spec} yielded {other:?}"),
        }
    }
}

/// The Rust verdicts on `spec`: the shared function on what the spec
/// resolves to, and `RetryRule::resolve` (which calls it) as a whole.
fn rust_refuses(spec: &serde_json::Value) -> (bool, bool) {
    let rule: RetryRule = serde_json::from_value(spec.clone()).expect("the spec deserializes");
    let mut errs = ValidationErrors::default();
    let (resolved, _) = rule.resolve("ns/p", "api.ns", "spec", &mut errs);
    let by_resolve = errs
        .0
        .iter()
        .any(|e| e.field == "spec.acknowledgeDuplicateRisk");
    let p = &resolved.policy;
    let mut direct = ValidationErrors::default();
    common::duplicate_risk(
        &mut direct,
        "spec.acknowledgeDuplicateRisk",
        "failureBoundary BeforeHeaders",
        rule.acknowledge_duplicate_risk,
        common::Retried {
            methods: p.methods,
            boundary: p.failure_boundary,
            statuses: p.retry_statuses,
            grpc_statuses: p.grpc_statuses,
        },
    );
    (!direct.is_empty(), by_resolve)
}

/// Both statements' verdicts on `spec`, each on the spec as written and as
/// the API server defaults it (the serde defaults are the schema's).
fn verdicts(cel: &CelRule, spec: &serde_json::Value) -> [(&'static str, bool); 4] {
    let rule: RetryRule = serde_json::from_value(spec.clone()).expect("the spec deserializes");
    let defaulted = serde_json::to_value(&rule).expect("the rule serializes");
    let (direct, by_resolve) = rust_refuses(spec);
    [
        ("CEL, as written", cel.refuses(spec)),
        ("CEL, defaulted", cel.refuses(&defaulted)),
        ("common::duplicate_risk", direct),
        ("RetryRule::resolve", by_resolve),
    ]
}

/// Hand-picked specs and whether the acknowledgement is missing.
fn table() -> Vec<(serde_json::Value, bool)> {
    let ack = |mut spec: serde_json::Value| {
        spec["acknowledgeDuplicateRisk"] = json!(true);
        spec
    };
    let mut cases = vec![
        // The safe defaults and safe methods.
        (json!({}), false),
        (json!({ "methods": ["GET"] }), false),
        (json!({ "methods": ["GET", "HEAD"] }), false),
        (json!({ "methods": ["GET", "HEAD", "OPTIONS"] }), false),
        (json!({ "methods": ["OPTIONS"] }), false),
        (json!({ "methods": [] }), false),
        (json!({ "acknowledgeDuplicateRisk": false }), false),
        (json!({ "acknowledgeDuplicateRisk": true }), false),
        // Each unsafe method, alone and beside safe ones.
        (json!({ "methods": ["POST"] }), true),
        (json!({ "methods": ["PUT"] }), true),
        (json!({ "methods": ["DELETE"] }), true),
        (json!({ "methods": ["PATCH"] }), true),
        (json!({ "methods": ["*"] }), true),
        (json!({ "methods": ["GET", "POST"] }), true),
        (
            json!({ "methods": ["GET", "HEAD", "OPTIONS", "PUT"] }),
            true,
        ),
        // The failure boundary.
        (json!({ "failureBoundary": "Connect" }), false),
        (json!({ "failureBoundary": "BeforeHeaders" }), true),
        // Status retries: an empty list retries nothing.
        (json!({ "statuses": [] }), false),
        (json!({ "statuses": [503] }), true),
        (json!({ "statuses": [429, 502, 503, 504] }), true),
        (json!({ "statusPresets": [] }), false),
        (json!({ "statusPresets": ["Gateway"] }), true),
        (json!({ "statusPresets": ["Transient"] }), true),
        // gRPC status retries, by name and by number.
        (json!({ "grpcStatuses": [] }), false),
        (json!({ "grpcStatuses": ["unavailable"] }), true),
        (json!({ "grpcStatuses": [14] }), true),
        (json!({ "grpcStatuses": ["resource-exhausted", 4] }), true),
        // Everything at once.
        (
            json!({
                "methods": ["*"],
                "failureBoundary": "BeforeHeaders",
                "statuses": [503],
                "statusPresets": ["Transient"],
                "grpcStatuses": ["unavailable"],
            }),
            true,
        ),
    ];
    // Every case that needs the acknowledgement passes with it, and an
    // explicit `false` is no acknowledgement.
    let risky: Vec<_> = cases
        .iter()
        .filter(|(_, r)| *r)
        .map(|(s, _)| s.clone())
        .collect();
    for spec in risky {
        let mut unacknowledged = spec.clone();
        unacknowledged["acknowledgeDuplicateRisk"] = json!(false);
        cases.push((unacknowledged, true));
        cases.push((ack(spec), false));
    }
    cases
}

#[test]
fn the_crd_and_the_types_carry_the_same_cel_rule() {
    // The committed CRD is the generated one (the controller's drift test);
    // with the resource feature, read the rule from the types as well.
    let committed = cel_rule(CRD_YAML);
    #[cfg(feature = "resource")]
    {
        use kube::CustomResourceExt;
        let crd = serde_yaml::to_string(&crate::resource::RetryPolicy::crd()).expect("render");
        assert_eq!(cel_rule(&crd), committed);
    }
    assert!(
        committed.contains("acknowledgeDuplicateRisk"),
        "{committed}"
    );
}

#[test]
fn cel_and_rust_agree_on_the_duplicate_risk_table() {
    let cel = CelRule::new(&cel_rule(CRD_YAML));
    let cases = table();
    let mut wrong = Vec::new();
    for (spec, refused) in &cases {
        for (who, verdict) in verdicts(&cel, spec) {
            if verdict != *refused {
                wrong.push(format!(
                    "{spec}: {who} {} (expected {})",
                    if verdict { "refuses" } else { "accepts" },
                    if *refused { "refused" } else { "accepted" }
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(cases.len(), 60);
}

#[test]
fn cel_and_rust_agree_on_every_combination() {
    let cel = CelRule::new(&cel_rule(CRD_YAML));
    let methods = [
        None,
        Some(json!([])),
        Some(json!(["GET"])),
        Some(json!(["GET", "HEAD", "OPTIONS"])),
        Some(json!(["POST"])),
        Some(json!(["GET", "PUT"])),
        Some(json!(["DELETE"])),
        Some(json!(["PATCH"])),
        Some(json!(["*"])),
    ];
    let boundaries = [None, Some(json!("Connect")), Some(json!("BeforeHeaders"))];
    let statuses = [None, Some(json!([])), Some(json!([503]))];
    let presets = [None, Some(json!(["Gateway"]))];
    let grpc = [
        None,
        Some(json!([])),
        Some(json!(["unavailable"])),
        Some(json!([14])),
    ];
    let acks = [None, Some(json!(false)), Some(json!(true))];
    let mut checked = 0;
    let mut disagreements = Vec::new();
    for m in &methods {
        for b in &boundaries {
            for s in &statuses {
                for sp in &presets {
                    for g in &grpc {
                        for a in &acks {
                            let mut spec = json!({});
                            for (key, value) in [
                                ("methods", m),
                                ("failureBoundary", b),
                                ("statuses", s),
                                ("statusPresets", sp),
                                ("grpcStatuses", g),
                                ("acknowledgeDuplicateRisk", a),
                            ] {
                                if let Some(v) = value {
                                    spec[key] = v.clone();
                                }
                            }
                            let verdicts = verdicts(&cel, &spec);
                            if verdicts.iter().any(|(_, v)| *v != verdicts[0].1) {
                                disagreements.push(format!("{spec}: {verdicts:?}"));
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(checked, 9 * 3 * 3 * 2 * 4 * 3);
    assert!(
        disagreements.is_empty(),
        "{} of {checked} specs:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}
