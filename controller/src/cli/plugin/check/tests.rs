//! `check`'s verdicts on fixture objects, one check at a time, then the whole
//! report of a healthy installation and of one whose webhook is down.

use kube::CustomResourceExt;

use super::*;
use crate::fixtures::{self, injected_namespace, pod, webhook_configuration};
use crate::tls::generate;

const SERVICE_NAME: &str = "reprise-controller.reprise-system.svc";
const NOW: &str = "2026-12-06T10:00:00Z";

fn now() -> Timestamp {
    NOW.parse().expect("now")
}

fn install() -> Install {
    Install::defaults(None)
}

/// The CRD as the API server returns it: this plugin's, Established.
fn installed_crd() -> CustomResourceDefinition {
    let mut crd = RetryPolicy::crd();
    crd.status = serde_json::from_value(serde_json::json!({
        "conditions": [{"type": "Established", "status": "True"}]
    }))
    .expect("status");
    crd
}

/// What a healthy installation shows `check`.
fn healthy() -> (Facts, UnixTime) {
    let m = generate(&[SERVICE_NAME.into()]).expect("material");
    let shop = vec![
        pod("web-1").injected().build(),
        pod("api-0").label(INJECT, "disabled").build(),
    ];
    let facts = Facts {
        configurations: Ok(vec![webhook_configuration(&m.ca_pem)]),
        crd: Ok(Some(installed_crd())),
        probe: Probe::Answered {
            status: 200,
            body: m.cert_pem.clone(),
        },
        deployment: Ok(Some(fixtures::deployment(2, 2))),
        lease: Ok(Some(fixtures::lease(
            "reprise-controller-abc",
            "2026-12-06T09:59:57Z",
        ))),
        policies: Ok(vec![fixtures::policy().reconciled(true, 1, 1).build()]),
        namespaces: Ok(vec![injected_namespace("shop")]),
        pods: BTreeMap::from([("shop".to_string(), Ok(shop))]),
    };
    (facts, UnixTime::now())
}

fn failures(sections: &[(&str, Vec<Verdict>)]) -> Vec<String> {
    sections
        .iter()
        .flat_map(|(_, v)| v)
        .filter(|v| !v.ok)
        .map(|v| v.line.clone())
        .collect()
}

#[test]
fn a_healthy_installation_passes_every_check() {
    let (facts, tls_now) = healthy();
    let sections = judge(&facts, None, now(), tls_now);
    assert_eq!(failures(&sections), Vec::<String>::new());
    let report = render(&sections);
    for line in [
        "RetryPolicy CRD\n---------------\n✔ CRD retrypolicies.reprise.dev is installed and Established",
        "✔ it serves reprise.dev/v1alpha1 with every field this plugin knows",
        "✔ MutatingWebhookConfiguration reprise-sidecar-injector: 2 webhooks calling Service reprise-system/reprise-controller:443",
        "✔ every webhook has a caBundle",
        "✔ the API server reaches the webhook through Service reprise-system/reprise-controller",
        "✔ its serving certificate chains to the caBundle and is valid for reprise-controller.reprise-system.svc",
        "✔ controller Deployment reprise-system/reprise-controller: 2/2 replicas ready",
        "✔ reprise-controller-abc leads (Lease reprise-system/reprise-controller renewed 3s ago)",
        "✔ 1 policies: 1/1 selected sidecars run their current generation",
        "✔ every pod in the 1 namespaces labelled reprise.dev/inject=enabled has the sidecar",
        "Status check results are ✔",
    ] {
        assert!(report.contains(line), "{line}\n{report}");
    }
}

#[test]
fn the_webhook_down_fails_its_probe_and_names_the_fix() {
    let (mut facts, tls_now) = healthy();
    facts.probe = Probe::Answered {
        status: 503,
        body: r#"{"kind":"Status","status":"Failure","message":"no endpoints available for service \"reprise-controller\"","reason":"ServiceUnavailable","code":503}"#.into(),
    };
    facts.deployment = Ok(Some(fixtures::deployment(0, 0)));
    let sections = judge(&facts, None, now(), tls_now);
    let report = render(&sections);
    assert!(
        report.contains("✘ the API server cannot reach the webhook through Service reprise-system/reprise-controller: 503 no endpoints available for service \"reprise-controller\"\n    fix: kubectl -n reprise-system get pods -l app.kubernetes.io/component=controller; if none runs: kubectl -n reprise-system scale deployment/reprise-controller --replicas=2"),
        "{report}"
    );
    assert!(
        report.contains("✘ controller Deployment reprise-system/reprise-controller is scaled to 0\n    fix: kubectl -n reprise-system scale deployment/reprise-controller --replicas=2"),
        "{report}"
    );
    assert!(
        report.ends_with("Status check results are ✘ (2 failed)\n"),
        "{report}"
    );
}

#[test]
fn the_crd_missing_not_established_or_older_than_the_plugin_fails() {
    let v = crd(&Ok(None));
    assert_eq!(v.len(), 1);
    assert!(!v[0].ok);
    assert!(v[0]
        .fix
        .as_deref()
        .is_some_and(|f| f.contains("kubectl apply --server-side")));
    let v = crd(&Err("forbidden".into()));
    assert!(v[0].line.contains("cannot read CRD"), "{v:?}");
    let mut pending = installed_crd();
    pending.status = None;
    assert!(!crd(&Ok(Some(pending)))[0].ok);
    // An older release's CRD: no status.traffic in its schema.
    let mut older = installed_crd();
    let mut json = serde_json::to_value(&older).expect("json");
    json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        .as_object_mut()
        .expect("status properties")
        .remove("traffic");
    older = serde_json::from_value(json).expect("crd");
    let v = crd(&Ok(Some(older)));
    assert!(v[0].ok);
    assert!(!v[1].ok);
    assert!(
        v[1].line
            .starts_with("it serves reprise.dev/v1alpha1 from an older release: no status.traffic"),
        "{}",
        v[1].line
    );
}

#[test]
fn schema_paths_cover_nested_lists_and_maps() {
    let schema = serde_json::json!({"properties": {
        "spec": {"properties": {"statuses": {"items": {"type": "integer"}}}},
        "status": {"properties": {
            "conditions": {"items": {"properties": {"type": {}}}},
            "traffic": {"properties": {"exhausted": {"additionalProperties": {"properties": {"n": {}}}}}}
        }}
    }});
    let mut out = BTreeSet::new();
    schema_paths(&schema, "", &mut out);
    assert!(out.contains("spec.statuses"));
    assert!(out.contains("status.conditions[].type"));
    assert!(out.contains("status.traffic.exhausted{}.n"));
}

#[test]
fn the_installation_is_found_by_its_webhooks_or_defaulted() {
    let mut elsewhere = webhook_configuration("");
    elsewhere.metadata.name = Some("shop-reprise-sidecar-injector".into());
    for w in elsewhere.webhooks.iter_mut().flatten() {
        if let Some(s) = w.client_config.service.as_mut() {
            s.namespace = "platform".into();
            s.name = "shop-reprise-controller".into();
        }
    }
    let both = [webhook_configuration(""), elsewhere];
    let l = locate(&both, Some("platform"));
    assert!(l.verdict.ok, "{:?}", l.verdict);
    assert_eq!(l.install.namespace, "platform");
    assert_eq!(l.install.controller, "shop-reprise-controller");
    let l = locate(&both, None);
    assert!(!l.verdict.ok, "two installations need --reprise-namespace");
    assert!(l
        .verdict
        .fix
        .as_deref()
        .is_some_and(|f| f.contains("--reprise-namespace")));
    let l = locate(&[], None);
    assert!(!l.verdict.ok);
    assert_eq!(l.install, Install::defaults(None));
    assert!(l
        .verdict
        .fix
        .as_deref()
        .is_some_and(|f| f.contains("helm install reprise")));
}

#[test]
fn a_missing_or_foreign_ca_bundle_fails() {
    let (v, bundle) = ca_bundle(&webhook_configuration(""), &install());
    assert!(!v.ok);
    assert_eq!(v.line, "webhook inject.reprise.dev has no caBundle");
    assert!(v
        .fix
        .as_deref()
        .is_some_and(|f| f.contains("logs deployment/reprise-controller")));
    assert_eq!(bundle, None);
    let (v, _) = ca_bundle(&webhook_configuration("not a certificate"), &install());
    assert!(v.line.contains("holds no PEM certificate"), "{v:?}");
    // Served by a controller whose CA is not the bundle's.
    let (facts, tls_now) = healthy();
    let other = generate(&[SERVICE_NAME.into()]).expect("material");
    let c = webhook_configuration(&other.ca_pem);
    let v = reachable_and_certified(
        &facts.probe,
        Some(other.ca_pem.as_bytes()),
        &c,
        &install(),
        tls_now,
    );
    assert!(v[0].ok);
    assert_eq!(
        v[1].line,
        "its serving certificate is not signed by the caBundle's CA"
    );
}

#[test]
fn probe_answers_are_told_apart() {
    let c = webhook_configuration("");
    let older = Probe::Answered {
        status: 404,
        body: "POST /inject or /inject/transparent only\n".into(),
    };
    let v = reachable_and_certified(&older, None, &c, &install(), UnixTime::now());
    assert!(v[0].ok, "reached");
    assert!(!v[1].ok);
    assert!(v[1].line.contains("predates GET /certificate"), "{v:?}");
    let v = reachable_and_certified(
        &Probe::Failed("connection reset".into()),
        None,
        &c,
        &install(),
        UnixTime::now(),
    );
    assert_eq!(v.len(), 1);
    assert!(v[0].line.ends_with("connection reset"), "{v:?}");
    let v = reachable_and_certified(
        &Probe::Answered {
            status: 502,
            body: "plain text from a proxy".into(),
        },
        None,
        &c,
        &install(),
        UnixTime::now(),
    );
    assert!(v[0].line.ends_with("502 plain text from a proxy"), "{v:?}");
}

#[test]
fn replicas_short_of_ready_and_stale_leases_fail() {
    let v = deployment_verdict(1, 2);
    assert!(!v.ok);
    assert_eq!(
        v.line,
        "controller Deployment reprise-system/reprise-controller: 1/2 replicas ready"
    );
    assert!(!deployment(&Ok(None), &install()).ok);
    let stale = lease(
        &Ok(Some(fixtures::lease("r-1", "2026-12-06T09:58:00Z"))),
        &install(),
        now(),
    );
    assert!(!stale.ok);
    assert_eq!(
        stale.line,
        "r-1 held Lease reprise-system/reprise-controller until it expired (120s since its renewal, 15s allowed): no leader runs"
    );
    let expired = lease(
        &Ok(Some(fixtures::lease("r-1", "2026-12-06T09:59:44Z"))),
        &install(),
        now(),
    );
    assert!(
        !expired.ok,
        "16 s after its renewal a 15 s Lease has expired"
    );
    let none = lease(&Ok(None), &install(), now());
    assert!(none
        .fix
        .as_deref()
        .is_some_and(|f| f.contains("scale deployment/reprise-controller")));
    let forbidden = lease(&Err("leases is forbidden".into()), &install(), now());
    assert!(forbidden.line.contains("leases is forbidden"));
}

fn deployment_verdict(ready: i32, replicas: i32) -> Verdict {
    deployment(&Ok(Some(fixtures::deployment(replicas, ready))), &install())
}

#[test]
fn sidecars_behind_their_policy_or_unreconciled_policies_fail() {
    let behind = fixtures::policy()
        .named("reads")
        .reconciled(true, 1, 2)
        .build();
    let rejected = fixtures::policy()
        .named("broken")
        .reconciled(false, 0, 0)
        .build();
    let v = in_sync(&Ok(vec![behind, rejected.clone()]), &install());
    assert!(!v.ok);
    assert_eq!(
        v.line,
        "sidecars not running their policy: shop/reads 1/2, Pending"
    );
    let mut stale = fixtures::policy()
        .named("new")
        .reconciled(true, 1, 1)
        .build();
    stale.metadata.generation = Some(4);
    let v = in_sync(
        &Ok(vec![stale, fixtures::policy().named("fresh").build()]),
        &install(),
    );
    assert_eq!(
        v.line,
        "policies the leader has not reconciled: shop/new (status of generation 3, policy at 4), shop/fresh (no status)"
    );
    let v = in_sync(&Ok(vec![rejected]), &install());
    assert!(
        v.ok,
        "a rejected policy is not pushed, so not out of sync: {v:?}"
    );
    assert_eq!(v.line, "no accepted RetryPolicies yet");
}

#[test]
fn pods_left_without_the_sidecar_are_named_with_what_to_restart() {
    let pods = vec![
        pod("web-7d4b9c-x2x")
            .owned_by("ReplicaSet", "web-7d4b9c")
            .build(),
        pod("db-0").owned_by("StatefulSet", "db").build(),
        pod("web-7d4b9c-ok").injected().build(),
        pod("job-1").phase("Succeeded").build(),
        pod("opted-out").label(INJECT, "disabled").build(),
    ];
    let namespaces = Ok(vec![
        injected_namespace("shop"),
        injected_namespace("reprise-system"),
    ]);
    let listed = BTreeMap::from([("shop".to_string(), Ok(pods))]);
    let v = uninjected(&namespaces, &listed, &install());
    assert!(!v.ok);
    assert_eq!(
        v.line,
        "pods without the sidecar in namespaces labelled reprise.dev/inject=enabled: shop: web-7d4b9c-x2x, db-0"
    );
    assert_eq!(
        v.fix.as_deref(),
        Some("they were created before the label or while the webhook was unreachable; recreate them: kubectl -n shop rollout restart deployment/web statefulset/db")
    );
    let v = uninjected(&Ok(vec![]), &BTreeMap::new(), &install());
    assert!(v.ok);
    assert_eq!(
        v.line,
        "no namespace is labelled reprise.dev/inject=enabled: nothing is injected"
    );
}

#[test]
fn what_the_webhook_probe_answered_is_printed_escaped() {
    let (mut facts, tls_now) = healthy();
    // Whatever answers on the webhook's port writes the body the line quotes.
    facts.probe = Probe::Answered {
        status: 500,
        body: "\u{1b}[2J\u{1b}]52;c;cm0gLXJmIH4=\u{7}broken\nforged ✔ line".into(),
    };
    let report = render(&judge(&facts, None, now(), tls_now));
    assert!(
        !report.chars().any(|c| c.is_control() && c != '\n'),
        "{report:?}"
    );
    assert!(
        !report.contains("\nforged"),
        "a line break forged a line: {report}"
    );
}
