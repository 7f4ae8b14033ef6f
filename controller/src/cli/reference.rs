//! The user guide's reference pages generated from this crate's types:
//! `reprise-controller`'s and `kubectl-reprise`'s flags (clap), the
//! RetryPolicy fields (the CRD's schema, itself generated from the Rust
//! types) and the chart's values (`values.schema.json` and `values.yaml`).
//! Each test renders its page and fails when the committed one differs
//! (`REPRISE_BLESS=1` rewrites it), so the guide cannot drift from the code.

use std::fmt::Write as _;

use clap::CommandFactory;
use kube::CustomResourceExt;
use reprise_crds::resource::RetryPolicy;
use reprise_testkit::docs::{cell, check_generated, clap_reference, header, workspace_root};
use serde_json::Value;

const TEST: &str = "cargo test -p reprise-controller --lib cli::reference";

#[test]
fn flags_page_matches_the_commands() {
    let mut page = header(
        "the clap commands of reprise-controller and kubectl-reprise",
        TEST,
    );
    page.push_str("# reprise-controller and kubectl-reprise flags\n\n");
    page.push_str(
        "Every flag of the controller binary and of the kubectl plugin, as `--help` \
         prints it. How the plugin is used: [Troubleshooting with kubectl reprise](../tasks/troubleshooting.md).\n\n",
    );
    page.push_str(&clap_reference(
        "reprise-controller",
        &super::Args::command(),
        2,
    ));
    page.push_str(&clap_reference(
        "kubectl reprise",
        &super::plugin::Args::command(),
        2,
    ));
    check_generated("docs/src/reference/cli-controller.md", &page, TEST);
}

/// One row per field of `node`'s properties, depth first, `prefix` the path
/// so far; CEL rules collected with the path they apply to.
fn fields(node: &Value, prefix: &str, rows: &mut String, rules: &mut Vec<(String, String)>) {
    let required: Vec<&str> = node["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = node["properties"].as_object() else {
        return;
    };
    for (name, prop) in props {
        let path = format!("{prefix}{name}");
        let mut ty = type_of(prop);
        if required.contains(&name.as_str()) {
            ty.push_str(", required");
        }
        let default = match &prop["default"] {
            Value::Null => String::new(),
            v => format!("`{v}`"),
        };
        let mut bounds = Vec::new();
        for (key, word) in [
            ("minimum", "≥"),
            ("maximum", "≤"),
            ("minLength", "length ≥"),
            ("maxLength", "length ≤"),
            ("minItems", "items ≥"),
            ("maxItems", "items ≤"),
        ] {
            if let Some(n) = prop[key].as_f64() {
                bounds.push(format!("{word} {n}"));
            }
        }
        let items = &prop["items"];
        for (key, word) in [("minimum", "each ≥"), ("maximum", "each ≤")] {
            if let Some(n) = items[key].as_f64() {
                bounds.push(format!("{word} {n}"));
            }
        }
        if let Some(values) = prop["enum"].as_array().or(items["enum"].as_array()) {
            let values: Vec<String> = values
                .iter()
                .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
                .collect();
            bounds.push(format!("one of {}", values.join(", ")));
        }
        let description = prop["description"].as_str().unwrap_or_default();
        let _ = writeln!(
            rows,
            "| `{path}` | {ty} | {default} | {} | {} |",
            cell(&bounds.join("; ")),
            cell(description)
        );
        for rule in prop["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            rules.push((
                path.clone(),
                rule["message"].as_str().unwrap_or_default().to_string(),
            ));
        }
        fields(prop, &format!("{path}."), rows, rules);
        if items.is_object() {
            fields(items, &format!("{path}[]."), rows, rules);
        }
    }
}

fn type_of(prop: &Value) -> String {
    if prop["x-kubernetes-int-or-string"] == Value::Bool(true) {
        return "integer or string".into();
    }
    match prop["type"].as_str() {
        Some("array") => format!("[]{}", type_of(&prop["items"])),
        Some(t) => t.to_string(),
        None => "object".into(),
    }
}

#[test]
fn retrypolicy_page_matches_the_crd_schema() {
    let crd = serde_json::to_value(RetryPolicy::crd()).expect("crd as json");
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let mut page = header("the RetryPolicy CRD's schema (crds/src/resource.rs)", TEST);
    let _ =
        write!(
        page,
        "# RetryPolicy fields\n\n`{}/{}`, kind `{}`, short name `{}`. Every field of the CRD the \
         chart installs, with its type, default and the bounds the API server enforces at \
         `kubectl apply`; the controller and every sidecar check the same rules again \
         ([RetryPolicy](../concepts/retrypolicy.md)). `kubectl explain retrypolicy.spec` \
         prints the same descriptions.\n\n",
        crd["spec"]["group"].as_str().unwrap_or_default(),
        version["name"].as_str().unwrap_or_default(),
        crd["spec"]["names"]["kind"].as_str().unwrap_or_default(),
        crd["spec"]["names"]["shortNames"][0].as_str().unwrap_or_default(),
    );
    for part in ["spec", "status"] {
        let mut rows = String::new();
        let mut rules = Vec::new();
        fields(
            &schema["properties"][part],
            &format!("{part}."),
            &mut rows,
            &mut rules,
        );
        let _ = writeln!(
            page,
            "## `{part}`\n\n{}\n\n| Field | Type | Default | Bounds | Description |\n|---|---|---|---|---|\n{rows}",
            cell(schema["properties"][part]["description"].as_str().unwrap_or_default())
        );
        for rule in schema["properties"][part]["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            rules.insert(
                0,
                (
                    part.to_string(),
                    rule["message"].as_str().unwrap_or_default().to_string(),
                ),
            );
        }
        if !rules.is_empty() {
            let _ = writeln!(
                page,
                "Rules the API server checks (CEL), with the message it refuses with:\n"
            );
            for (path, message) in rules {
                let _ = writeln!(page, "- `{path}`: {message}");
            }
            page.push('\n');
        }
    }
    page.push_str("## `kubectl get rp` columns\n\n| Column | From | Shown |\n|---|---|---|\n");
    for col in version["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let _ = writeln!(
            page,
            "| {} | `{}` | {} |",
            col["name"].as_str().unwrap_or_default(),
            col["jsonPath"].as_str().unwrap_or_default(),
            if col["priority"].as_i64().unwrap_or(0) > 0 {
                "`-o wide`"
            } else {
                "always"
            }
        );
    }
    check_generated("docs/src/reference/retrypolicy.md", &page, TEST);
}

/// Resolves a `$ref` to the schema's `definitions`.
fn resolve<'a>(schema: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/definitions/"))
    {
        Some(name) => &schema["definitions"][name],
        None => node,
    }
}

fn values_rows(schema: &Value, node: &Value, defaults: &Value, prefix: &str, out: &mut String) {
    let node = resolve(schema, node);
    let Some(props) = node["properties"].as_object() else {
        return;
    };
    for (name, prop) in props {
        let path = format!("{prefix}{name}");
        let resolved = resolve(schema, prop);
        let default = &defaults[name.as_str()];
        let description = prop["description"]
            .as_str()
            .or(resolved["description"].as_str())
            .unwrap_or_default();
        // An object with a description is documented as a whole, its default
        // shown as one value; one without is a group of values.
        let nested = resolved["properties"].is_object() && description.is_empty();
        if !nested {
            let mut rule = Vec::new();
            if let Some(t) = resolved["type"].as_str() {
                rule.push(t.to_string());
            }
            if let Some(values) = resolved["enum"].as_array() {
                let values: Vec<String> = values
                    .iter()
                    .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
                    .collect();
                rule.push(format!("one of {}", values.join(", ")));
            }
            for (key, word) in [
                ("minimum", "≥"),
                ("maximum", "≤"),
                ("exclusiveMinimum", ">"),
            ] {
                if let Some(n) = resolved[key].as_f64() {
                    rule.push(format!("{word} {n}"));
                }
            }
            let shown = match default {
                Value::Null => String::new(),
                v => format!("`{}`", serde_json::to_string(v).unwrap_or_default()),
            };
            let _ = writeln!(
                out,
                "| `{path}` | {shown} | {} | {} |",
                cell(&rule.join(", ")),
                cell(description)
            );
        }
        if nested {
            values_rows(schema, prop, default, &format!("{path}."), out);
        }
    }
}

#[test]
fn helm_values_page_matches_the_values_schema() {
    let root = workspace_root();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("charts/reprise/values.schema.json")).expect("schema"),
    )
    .expect("schema json");
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root.join("charts/reprise/values.yaml")).expect("values"),
    )
    .expect("values yaml");
    let values = serde_json::to_value(values).expect("values as json");
    let mut page = header("charts/reprise/values.schema.json and values.yaml", TEST);
    page.push_str(
        "# Helm values\n\nEvery value of the chart, its default (`values.yaml`) and its rule \
         (`values.schema.json`, which refuses a misspelt key, a wrong type or an out-of-range \
         value at `helm install` with the field named). Descriptions are the schema's.\n\n\
         | Key | Default | Rule | Description |\n|---|---|---|---|\n",
    );
    let mut rows = String::new();
    values_rows(&schema, &schema, &values, "", &mut rows);
    page.push_str(&rows);
    page.push_str(
        "\nThe controller Service `<fullname>-controller` exposes `push` 15010 (TLS config \
         stream for the sidecars), `metrics` 15020 (`/metrics`, `/healthz`, `/readyz`; \
         read-only; `/debug/sidecars` answers only the pod's loopback, for `kubectl reprise sent`) and `webhook` 443 → 9443.\n",
    );
    check_generated("docs/src/reference/helm-values.md", &page, TEST);
}

/// Every value a user can set has a description, so the generated page
/// explains each row (a new value without one fails here, not in review).
#[test]
fn every_chart_value_is_described() {
    let root = workspace_root();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("charts/reprise/values.schema.json")).expect("schema"),
    )
    .expect("schema json");
    let mut rows = String::new();
    values_rows(&schema, &schema, &Value::Null, "", &mut rows);
    let bare: Vec<&str> = rows.lines().filter(|l| l.ends_with("|  |")).collect();
    assert!(
        bare.is_empty(),
        "values without a description in values.schema.json: {bare:#?}"
    );
}
