//! Every YAML example of the user guide and the README, applied: Kubernetes
//! objects with a server-side dry run against this API server (the schema,
//! its CEL rules and admission all run; nothing is stored), configuration
//! files with `reprise-sidecar --check`. A block marked
//! `<!-- not applied: REASON -->` is an excerpt and is skipped (the pure
//! test `tests/docs.rs` requires the reason). An example that no longer
//! applies fails here with the page, the line and the API server's answer.

use std::process::Command;

use reprise_e2e::cluster::*;
use reprise_e2e::docs::{self, Example};

#[test]
#[ignore = "needs the e2e cluster: run e2e/test.sh"]
fn every_yaml_example_of_the_guide_applies() {
    let c = Cluster::new("docs");
    // Gateway API's CRDs, from the module e2e/tools/gateway-api pins (the
    // chart never installs them): the BackendTLSPolicy, route and budget
    // examples need them, as a user's cluster would. The experimental
    // channel: it has every standard kind and XBackendTrafficPolicy.
    c.gateway_api("experimental");
    c.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/retrypolicies.reprise.dev",
    ])
    .expect("CRDs established");

    let mut created = Vec::new();
    let mut failures = Vec::new();
    let mut applied = 0;
    for page in docs::pages() {
        for block in docs::blocks(&page) {
            if !matches!(block.lang.as_str(), "yaml" | "yml") || block.not_applied.is_some() {
                continue;
            }
            let file = c.work.join(format!("example-{}.yaml", rand_suffix()));
            std::fs::write(&file, &block.text).expect("write example");
            let file = file.to_string_lossy().into_owned();
            let result = match docs::example(&block.text) {
                Example::Kubernetes => {
                    for ns in docs::namespaces(&block.text) {
                        if c.kubectl(&["get", "namespace", &ns]).is_err() {
                            c.kubectl(&["create", "namespace", &ns])
                                .unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
                            created.push(ns);
                        }
                    }
                    c.kubectl(&["apply", "--server-side", "--dry-run=server", "-f", &file])
                        .map(|_| ())
                }
                Example::ConfigFile => {
                    let out = Command::new(c.bin.join("reprise-sidecar"))
                        .args(["--config", &file, "--check"])
                        .output()
                        .expect("run reprise-sidecar --check (cargo build --bins first)");
                    if out.status.success() {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&out.stderr).into_owned())
                    }
                }
                Example::Other => Err("neither Kubernetes objects nor a configuration file".into()),
            };
            applied += 1;
            if let Err(e) = result {
                failures.push(format!("{}:{}: {}", block.page, block.line, e.trim()));
            }
        }
    }
    for ns in &created {
        let _ = c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    }
    eprintln!(
        "docs: {applied} YAML examples applied, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "examples of the guide that no longer apply:\n  {}",
        failures.join("\n  ")
    );
    assert!(applied >= 8, "only {applied} examples found");
}
