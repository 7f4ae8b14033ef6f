//! `kubectl reprise check`: the installation, as `linkerd check` checks
//! its own: one line per check, ✔ or ✘, each ✘ with the fix named, exit
//! status 1 when any failed.
//!
//! It first reads what it needs (every read may fail on its own, e.g.
//! Forbidden, and fails only its own checks), then judges each check with a
//! pure function the tests call on fixture objects:
//!
//! - the RetryPolicy CRD: installed and Established; serving this release's
//!   version with every field this plugin's schema has;
//! - the webhook: its configuration (found by its webhook names, which gives
//!   the installation's namespace and Service), a caBundle in every entry,
//!   the webhook reached through the API server's service proxy, and the
//!   certificate chain it serves (`GET /certificate`) valid for the
//!   Service's name under that caBundle now;
//! - the controller: its Deployment's replicas ready, a replica holding the
//!   Lease within its duration;
//! - the sidecars: every accepted policy's selected sidecars running its
//!   current generation (`status.sidecarsInSync` of `status.sidecars`), and
//!   no pod left without the sidecar in a namespace labelled for injection.

mod certificate;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use http_body_util::BodyExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use reprise_crds::resource::RetryPolicy;
use rustls_pki_types::UnixTime;
use serde_json::Value;

use crate::inject::{INJECT, INJECTED, SIDECAR_NAME};
use crate::leader::LEASE_NAME;

/// The webhook entries the chart installs; a configuration with one of them
/// is Reprise's.
const WEBHOOK_NAMES: [&str; 2] = ["inject.reprise.dev", "transparent.inject.reprise.dev"];
/// Where the guide installs it (`docs/src/install/helm.md`), when nothing
/// says otherwise.
const DEFAULT_NAMESPACE: &str = "reprise-system";
/// The controller Deployment and Service of a release named `reprise`.
const DEFAULT_CONTROLLER: &str = "reprise-controller";
/// The injection label, when the webhook configuration does not say.
const DEFAULT_INJECT_LABEL: &str = "reprise.dev/inject";
/// How long a Lease holds without renewal when it does not say.
const LEASE_DEFAULT_DURATION: i64 = 30;
/// How long the service-proxy probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
/// Where the user guide lists the permissions each verb needs.
const RBAC_FIX: &str =
    "grant the reads the user guide lists for check (docs/src/operations/rbac.md, \"kubectl reprise\")";

// The verb's help is the doc comment of `Verb::Check`.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// The namespace Reprise is installed in (default: the one its webhook
    /// configuration names, else reprise-system). Needed only when several
    /// installations share the cluster.
    #[arg(long)]
    reprise_namespace: Option<String>,
}

/// One check's result: a line, and for a failure what to do.
#[derive(Clone, Debug, PartialEq)]
struct Verdict {
    ok: bool,
    line: String,
    fix: Option<String>,
}

fn pass(line: impl Into<String>) -> Verdict {
    Verdict {
        ok: true,
        line: line.into(),
        fix: None,
    }
}

fn fail(line: impl Into<String>, fix: impl Into<String>) -> Verdict {
    Verdict {
        ok: false,
        line: line.into(),
        fix: Some(fix.into()),
    }
}

/// Where the installation is: from its webhook configuration, else the
/// chart's defaults.
#[derive(Clone, Debug, PartialEq)]
struct Install {
    namespace: String,
    /// The controller's Service and Deployment (the chart names both alike).
    controller: String,
    /// The Service port the webhook is called on.
    port: i32,
    /// The namespace label that opts namespaces into injection.
    inject_label: String,
}

impl Install {
    fn defaults(namespace: Option<&str>) -> Self {
        Install {
            namespace: namespace.unwrap_or(DEFAULT_NAMESPACE).into(),
            controller: DEFAULT_CONTROLLER.into(),
            port: 443,
            inject_label: DEFAULT_INJECT_LABEL.into(),
        }
    }

    /// The name the API server verifies on the webhook's certificate.
    fn server_name(&self) -> String {
        format!("{}.{}.svc", self.controller, self.namespace)
    }

    fn logs(&self) -> String {
        format!(
            "kubectl -n {} logs deployment/{}",
            self.namespace, self.controller
        )
    }
}

/// What the probe through the API server's service proxy got.
#[derive(Clone, Debug, PartialEq)]
enum Probe {
    /// No Service to probe (no configuration, or it calls a URL).
    NotRun,
    /// An HTTP answer: the webhook's own, or the API server's about it.
    Answered { status: u16, body: String },
    /// The request itself failed.
    Failed(String),
}

/// Everything `check` reads, each read's failure kept for its own checks.
#[derive(Debug)]
struct Facts {
    configurations: Result<Vec<MutatingWebhookConfiguration>, String>,
    crd: Result<Option<CustomResourceDefinition>, String>,
    probe: Probe,
    deployment: Result<Option<Deployment>, String>,
    lease: Result<Option<Lease>, String>,
    policies: Result<Vec<RetryPolicy>, String>,
    namespaces: Result<Vec<Namespace>, String>,
    pods: BTreeMap<String, Result<Vec<Pod>, String>>,
}

/// Runs every check: the report, and whether all passed.
pub(super) async fn run(client: Client, args: &Args) -> (String, bool) {
    let facts = gather(&client, args).await;
    let sections = judge(
        &facts,
        args.reprise_namespace.as_deref(),
        Timestamp::now(),
        UnixTime::now(),
    );
    let ok = sections.iter().flat_map(|(_, v)| v).all(|v| v.ok);
    (render(&sections), ok)
}

/// The namespace Reprise runs in, found as `check` finds it: `wanted`
/// when given, else the namespace of the Service the webhook configuration
/// calls, else `reprise-system`. Every verb that talks to the controller
/// asks this, so they agree with `check`.
pub(super) async fn reprise_namespace(client: &Client, wanted: Option<&str>) -> String {
    if let Some(ns) = wanted {
        return ns.to_string();
    }
    let configurations = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    locate(&configurations, None).install.namespace
}

fn text(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.reason),
        e => e.to_string(),
    }
}

async fn gather(client: &Client, args: &Args) -> Facts {
    let configurations = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(text);
    let located = locate(
        configurations.as_deref().unwrap_or_default(),
        args.reprise_namespace.as_deref(),
    );
    let install = &located.install;
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(RetryPolicy::crd_name())
        .await
        .map_err(text);
    let probe = match located.configuration.map(calls_service) {
        Some(true) => probe(client, install).await,
        _ => Probe::NotRun,
    };
    let deployment = Api::<Deployment>::namespaced(client.clone(), &install.namespace)
        .get_opt(&install.controller)
        .await
        .map_err(text);
    let lease = Api::<Lease>::namespaced(client.clone(), &install.namespace)
        .get_opt(LEASE_NAME)
        .await
        .map_err(text);
    let policies = Api::<RetryPolicy>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(text);
    let selector = format!("{}=enabled", install.inject_label);
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .map_err(text);
    let mut pods = BTreeMap::new();
    for ns in namespaces.iter().flatten() {
        let name = ns.name_any();
        if injectable(&name, install) {
            let listed = Api::<Pod>::namespaced(client.clone(), &name)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .map_err(text);
            pods.insert(name, listed);
        }
    }
    Facts {
        configurations,
        crd,
        probe,
        deployment,
        lease,
        policies,
        namespaces,
        pods,
    }
}

/// `GET /certificate` on the webhook, through the API server's service
/// proxy: the path the API server's own calls take (Service, endpoints,
/// pod), though the proxy does not verify the certificate, so the chain
/// comes back to be verified here.
async fn probe(client: &Client, install: &Install) -> Probe {
    let path = format!(
        "/api/v1/namespaces/{}/services/https:{}:{}/proxy/certificate",
        install.namespace, install.controller, install.port
    );
    let request = match http::Request::get(&path).body(kube::client::Body::from(Vec::new())) {
        Ok(r) => r,
        Err(e) => return Probe::Failed(e.to_string()),
    };
    let exchange = async {
        let response = client.send(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>(Probe::Answered {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    match tokio::time::timeout(PROBE_TIMEOUT, exchange).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => Probe::Failed(e),
        Err(_) => Probe::Failed(format!("no answer in {PROBE_TIMEOUT:?}")),
    }
}

/// Whether the chart's webhook configuration would send this namespace's
/// pods to the webhook at all (never its own namespace nor kube-system).
fn injectable(namespace: &str, install: &Install) -> bool {
    namespace != install.namespace && namespace != "kube-system"
}

/// The installation, from the webhook configurations present.
#[derive(Debug)]
struct Located<'a> {
    install: Install,
    configuration: Option<&'a MutatingWebhookConfiguration>,
    verdict: Verdict,
}

fn is_reprise(c: &MutatingWebhookConfiguration) -> bool {
    c.webhooks
        .iter()
        .flatten()
        .any(|w| WEBHOOK_NAMES.contains(&w.name.as_str()))
}

/// The configuration's Service, as `(namespace, name, port)`.
fn service_of(c: &MutatingWebhookConfiguration) -> Option<(String, String, i32)> {
    c.webhooks.iter().flatten().find_map(|w| {
        let s = w.client_config.service.as_ref()?;
        Some((s.namespace.clone(), s.name.clone(), s.port.unwrap_or(443)))
    })
}

fn calls_service(c: &MutatingWebhookConfiguration) -> bool {
    service_of(c).is_some()
}

fn locate<'a>(
    configurations: &'a [MutatingWebhookConfiguration],
    wanted: Option<&str>,
) -> Located<'a> {
    let ours: Vec<&MutatingWebhookConfiguration> = configurations
        .iter()
        .filter(|c| is_reprise(c))
        .filter(|c| {
            wanted.is_none_or(|ns| service_of(c).is_none_or(|(namespace, ..)| namespace == ns))
        })
        .collect();
    let Some(&configuration) = ours.first() else {
        return Located {
            install: Install::defaults(wanted),
            configuration: None,
            verdict: fail(
                format!(
                    "no MutatingWebhookConfiguration with the webhook {}{}",
                    WEBHOOK_NAMES[0],
                    wanted.map_or(String::new(), |ns| format!(" calling namespace {ns}"))
                ),
                format!(
                    "install Reprise: helm install reprise charts/reprise -n {} --create-namespace",
                    wanted.unwrap_or(DEFAULT_NAMESPACE)
                ),
            ),
        };
    };
    let mut install = Install::defaults(wanted);
    if let Some((namespace, name, port)) = service_of(configuration) {
        install.namespace = namespace;
        install.controller = name;
        install.port = port;
    }
    if let Some(label) = configuration.webhooks.iter().flatten().find_map(|w| {
        let labels = w.namespace_selector.as_ref()?.match_labels.as_ref()?;
        labels
            .iter()
            .find(|(_, v)| v.as_str() == "enabled")
            .map(|(k, _)| k.clone())
    }) {
        install.inject_label = label;
    }
    let name = configuration.name_any();
    let entries = configuration.webhooks.as_ref().map_or(0, Vec::len);
    let verdict = if ours.len() > 1 {
        let names: Vec<String> = ours.iter().map(|c| c.name_any()).collect();
        fail(
            format!(
                "several installations' webhook configurations: {}",
                names.join(", ")
            ),
            "name the one to check with --reprise-namespace, and uninstall the others",
        )
    } else {
        match service_of(configuration) {
            Some(_) => pass(format!(
                "MutatingWebhookConfiguration {name}: {entries} webhooks calling Service {}/{}:{}",
                install.namespace, install.controller, install.port
            )),
            None => pass(format!(
                "MutatingWebhookConfiguration {name}: {entries} webhooks calling a URL (an out-of-cluster controller)"
            )),
        }
    };
    Located {
        install,
        configuration: Some(configuration),
        verdict,
    }
}

/// Every check, by section, from what was read; `now` dates the Lease,
/// `tls_now` the certificate.
fn judge(
    facts: &Facts,
    wanted: Option<&str>,
    now: Timestamp,
    tls_now: UnixTime,
) -> Vec<(&'static str, Vec<Verdict>)> {
    let configurations = match &facts.configurations {
        Ok(c) => c.as_slice(),
        Err(_) => &[],
    };
    let located = locate(configurations, wanted);
    let install = &located.install;
    let mut webhook = vec![match &facts.configurations {
        Ok(_) => located.verdict.clone(),
        Err(e) => fail(
            format!("cannot list MutatingWebhookConfigurations: {e}"),
            RBAC_FIX,
        ),
    }];
    if let Some(c) = located.configuration {
        let bundle = ca_bundle(c, install);
        webhook.push(bundle.0);
        webhook.extend(reachable_and_certified(
            &facts.probe,
            bundle.1.as_deref(),
            c,
            install,
            tls_now,
        ));
    }
    vec![
        ("RetryPolicy CRD", crd(&facts.crd)),
        ("Webhook", webhook),
        (
            "Controller",
            vec![
                deployment(&facts.deployment, install),
                lease(&facts.lease, install, now),
            ],
        ),
        (
            "Sidecars",
            // Without the CRD there are no policies to be in sync with.
            matches!(facts.crd, Ok(Some(_)))
                .then(|| in_sync(&facts.policies, install))
                .into_iter()
                .chain([uninjected(&facts.namespaces, &facts.pods, install)])
                .collect(),
        ),
    ]
}

/// The report: sections of ✔/✘ lines, each ✘ followed by its fix.
fn render(sections: &[(&'static str, Vec<Verdict>)]) -> String {
    let mut out = String::new();
    let mut failed = 0;
    for (title, verdicts) in sections {
        out.push_str(title);
        out.push('\n');
        out.push_str(&"-".repeat(title.chars().count()));
        out.push('\n');
        for v in verdicts {
            // A line may quote what the cluster holds (a pod's name, an
            // error's text): one line each, escaped.
            out.push_str(if v.ok { "✔ " } else { "✘ " });
            out.push_str(&crate::untrusted::escaped(&v.line, false));
            out.push('\n');
            if let Some(fix) = &v.fix {
                failed += 1;
                out.push_str("    fix: ");
                out.push_str(&crate::untrusted::escaped(fix, false));
                out.push('\n');
            }
        }
        out.push('\n');
    }
    if failed == 0 {
        out.push_str("Status check results are ✔\n");
    } else {
        out.push_str(&format!("Status check results are ✘ ({failed} failed)\n"));
    }
    out
}

/// The CRD installed and Established; serving this release's version with
/// every field of this plugin's schema.
fn crd(found: &Result<Option<CustomResourceDefinition>, String>) -> Vec<Verdict> {
    let name = RetryPolicy::crd_name();
    let apply = "kubectl apply --server-side -f charts/reprise/crds/retrypolicy.yaml (from this plugin's release)";
    let crd = match found {
        Err(e) => return vec![fail(format!("cannot read CRD {name}: {e}"), RBAC_FIX)],
        Ok(None) => return vec![fail(format!("CRD {name} is not installed"), apply)],
        Ok(Some(crd)) => crd,
    };
    let established = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
    let mut verdicts = vec![if established {
        pass(format!("CRD {name} is installed and Established"))
    } else {
        fail(
            format!("CRD {name} is installed but not Established"),
            format!("kubectl describe crd {name} (its conditions say why)"),
        )
    }];
    let expected = RetryPolicy::crd();
    let version = &expected.spec.versions[0].name;
    let served = crd
        .spec
        .versions
        .iter()
        .find(|v| &v.name == version && v.served);
    verdicts.push(match served {
        None => fail(
            format!("CRD {name} does not serve reprise.dev/{version}"),
            apply,
        ),
        Some(_) => {
            let (missing, extra) = schema_difference(crd, &expected, version);
            if missing.is_empty() {
                pass(format!(
                    "it serves reprise.dev/{version} with every field this plugin knows{}",
                    if extra.is_empty() {
                        String::new()
                    } else {
                        format!(" ({} fields newer than this plugin)", extra.len())
                    }
                ))
            } else {
                fail(
                    format!(
                        "it serves reprise.dev/{version} from an older release: no {}",
                        shortlist(&missing.into_iter().collect::<Vec<_>>(), 4)
                    ),
                    apply,
                )
            }
        }
    });
    verdicts
}

/// The schema fields of `version` this plugin's CRD has and `installed`
/// lacks, and those `installed` has beyond it.
fn schema_difference(
    installed: &CustomResourceDefinition,
    expected: &CustomResourceDefinition,
    version: &str,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let paths = |crd: &CustomResourceDefinition| {
        let mut out = BTreeSet::new();
        let json = serde_json::to_value(crd).unwrap_or_default();
        if let Some(v) = json["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == version)
        {
            schema_paths(&v["schema"]["openAPIV3Schema"], "", &mut out);
        }
        out
    };
    let (have, want) = (paths(installed), paths(expected));
    (
        want.difference(&have).cloned().collect(),
        have.difference(&want).cloned().collect(),
    )
}

/// Every property path of a structural schema (`spec.retries.attempts`,
/// `status.conditions[].type`).
fn schema_paths(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Some(properties) = schema["properties"].as_object() {
        for (name, sub) in properties {
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            out.insert(path.clone());
            schema_paths(sub, &path, out);
        }
    }
    if schema["items"].is_object() {
        schema_paths(&schema["items"], &format!("{prefix}[]"), out);
    }
    if schema["additionalProperties"].is_object() {
        schema_paths(
            &schema["additionalProperties"],
            &format!("{prefix}{{}}"),
            out,
        );
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for sub in schema[key].as_array().into_iter().flatten() {
            schema_paths(sub, prefix, out);
        }
    }
}

/// Every webhook entry has a caBundle of certificates; also the bundle (the
/// first entry's) to verify the serving chain against.
fn ca_bundle(c: &MutatingWebhookConfiguration, install: &Install) -> (Verdict, Option<Vec<u8>>) {
    let cert_manager = c
        .annotations()
        .get("cert-manager.io/inject-ca-from")
        .cloned();
    let fix = match &cert_manager {
        Some(from) => format!(
            "cert-manager's cainjector fills it from the Certificate {from}: kubectl describe certificate -n {}",
            from.replace('/', " ")
        ),
        None => format!(
            "the controller patches it in at start and every minute: {}",
            install.logs()
        ),
    };
    let webhooks = c.webhooks.as_deref().unwrap_or_default();
    let mut bundle = None;
    for w in webhooks {
        let pem = w
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.clone())
            .unwrap_or_default();
        if pem.is_empty() {
            return (
                fail(format!("webhook {} has no caBundle", w.name), fix),
                None,
            );
        }
        if certificate::count(&pem) == 0 {
            return (
                fail(
                    format!("webhook {}'s caBundle holds no PEM certificate", w.name),
                    fix,
                ),
                None,
            );
        }
        bundle.get_or_insert(pem);
    }
    if webhooks.is_empty() {
        return (
            fail(
                format!(
                    "MutatingWebhookConfiguration {} has no webhooks",
                    c.name_any()
                ),
                "reinstall the chart (helm upgrade --install)",
            ),
            None,
        );
    }
    (pass("every webhook has a caBundle"), bundle)
}

/// The probe's verdicts: the webhook reached through its Service, and the
/// chain it serves valid under `bundle` for the Service's name.
fn reachable_and_certified(
    probe: &Probe,
    bundle: Option<&[u8]>,
    c: &MutatingWebhookConfiguration,
    install: &Install,
    now: UnixTime,
) -> Vec<Verdict> {
    let service = format!("{}/{}", install.namespace, install.controller);
    let scale = format!(
        "kubectl -n {} get pods -l app.kubernetes.io/component=controller; if none runs: kubectl -n {} scale deployment/{} --replicas=2",
        install.namespace, install.namespace, install.controller
    );
    let (status, body) = match probe {
        Probe::NotRun if !calls_service(c) => {
            return vec![pass(
                "the webhook calls a URL: not probed (the plugin probes webhooks behind a Service)",
            )]
        }
        Probe::NotRun => return vec![],
        Probe::Failed(e) => {
            return vec![fail(
                format!("the API server cannot reach the webhook through Service {service}: {e}"),
                scale,
            )]
        }
        Probe::Answered { status, body } => (*status, body),
    };
    if status == 200 && body.contains("BEGIN CERTIFICATE") {
        let reached = pass(format!(
            "the API server reaches the webhook through Service {service}"
        ));
        let Some(bundle) = bundle else {
            return vec![reached];
        };
        let name = install.server_name();
        let cert = match certificate::verify(body, bundle, &name, now) {
            Ok(()) => pass(format!(
                "its serving certificate chains to the caBundle and is valid for {name}"
            )),
            Err(problem) => fail(
                format!("its serving certificate {problem}"),
                problem.fix(install),
            ),
        };
        return vec![reached, cert];
    }
    if status == 404 && body.contains("POST /inject") {
        return vec![
            pass(format!(
                "the API server reaches the webhook through Service {service}"
            )),
            fail(
                "its certificate cannot be checked: the controller predates GET /certificate",
                "upgrade the controller to this plugin's release (helm upgrade)",
            ),
        ];
    }
    // The API server's own answer (a Status) about why it got none.
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|s| s["message"].as_str().map(String::from))
        .unwrap_or_else(|| body.trim().chars().take(200).collect());
    vec![fail(
        format!(
            "the API server cannot reach the webhook through Service {service}: {status} {message}"
        ),
        scale,
    )]
}

/// The controller Deployment has every replica it asks for ready.
fn deployment(found: &Result<Option<Deployment>, String>, install: &Install) -> Verdict {
    let name = format!("{}/{}", install.namespace, install.controller);
    let d = match found {
        Err(e) => return fail(format!("cannot read Deployment {name}: {e}"), RBAC_FIX),
        Ok(None) => {
            return fail(
                format!("no controller Deployment {name}"),
                format!(
                    "install Reprise (helm install reprise charts/reprise -n {} --create-namespace), or name its namespace with --reprise-namespace",
                    install.namespace
                ),
            )
        }
        Ok(Some(d)) => d,
    };
    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = d
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    if wanted == 0 {
        return fail(
            format!("controller Deployment {name} is scaled to 0"),
            format!(
                "kubectl -n {} scale deployment/{} --replicas=2",
                install.namespace, install.controller
            ),
        );
    }
    if ready < wanted {
        return fail(
            format!("controller Deployment {name}: {ready}/{wanted} replicas ready"),
            format!(
                "kubectl -n {} describe deployment/{} and {}",
                install.namespace,
                install.controller,
                install.logs()
            ),
        );
    }
    pass(format!(
        "controller Deployment {name}: {ready}/{wanted} replicas ready"
    ))
}

/// A replica holds the Lease and renewed it lately.
fn lease(found: &Result<Option<Lease>, String>, install: &Install, now: Timestamp) -> Verdict {
    let name = format!("{}/{LEASE_NAME}", install.namespace);
    let start = format!(
        "start a replica (kubectl -n {} scale deployment/{} --replicas=2) and see {}",
        install.namespace,
        install.controller,
        install.logs()
    );
    let spec = match found {
        Err(e) => return fail(format!("cannot read Lease {name}: {e}"), RBAC_FIX),
        Ok(None) => return fail(format!("no Lease {name}: no replica has led yet"), start),
        Ok(Some(l)) => l.spec.clone().unwrap_or_default(),
    };
    let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
        return fail(format!("nobody holds Lease {name}"), start);
    };
    let Some(renewed) = spec.renew_time else {
        return fail(
            format!("{holder} holds Lease {name} but never renewed it"),
            start,
        );
    };
    let age = now.as_second() - renewed.0.as_second();
    let duration = spec
        .lease_duration_seconds
        .map_or(LEASE_DEFAULT_DURATION, i64::from);
    if age > duration {
        return fail(
            format!(
                "{holder} held Lease {name} until it expired ({age}s since its renewal, {duration}s allowed): no leader runs"
            ),
            start,
        );
    }
    pass(format!(
        "{holder} leads (Lease {name} renewed {}s ago)",
        age.max(0)
    ))
}

/// Every accepted policy's selected sidecars run its current generation.
fn in_sync(found: &Result<Vec<RetryPolicy>, String>, install: &Install) -> Verdict {
    let policies = match found {
        Err(e) => return fail(format!("cannot list RetryPolicies: {e}"), RBAC_FIX),
        Ok(p) => p,
    };
    let mut behind = Vec::new();
    let mut unreconciled = Vec::new();
    let (mut synced, mut selected, mut counted) = (0, 0, 0);
    for p in policies {
        let id = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
        let Some(s) = &p.status else {
            unreconciled.push(format!("{id} (no status)"));
            continue;
        };
        let condition = |t: &str| s.conditions.iter().find(|c| c.type_ == t);
        if condition("Accepted").is_some_and(|c| c.status != "True") {
            // Not pushed at all: its own status says why.
            continue;
        }
        if s.observed_generation != p.metadata.generation {
            unreconciled.push(format!(
                "{id} (status of generation {}, policy at {})",
                s.observed_generation.unwrap_or(0),
                p.metadata.generation.unwrap_or(0)
            ));
            continue;
        }
        counted += 1;
        synced += s.sidecars_in_sync;
        selected += s.sidecars;
        if s.sidecars_in_sync < s.sidecars {
            let why = condition("InSync").map_or(String::new(), |c| format!(", {}", c.reason));
            behind.push(format!("{id} {}/{}{why}", s.sidecars_in_sync, s.sidecars));
        }
    }
    if !unreconciled.is_empty() {
        return fail(
            format!(
                "policies the leader has not reconciled: {}",
                shortlist(&unreconciled, 5)
            ),
            format!(
                "the leader reconciles every policy: see the Controller checks and {}",
                install.logs()
            ),
        );
    }
    if !behind.is_empty() {
        return fail(
            format!("sidecars not running their policy: {}", shortlist(&behind, 5)),
            "a sidecar logs why it refused a snapshot (kubectl -n NS logs POD -c reprise-sidecar); kubectl -n NS describe rp NAME shows the InSync condition",
        );
    }
    if counted == 0 {
        return pass("no accepted RetryPolicies yet");
    }
    pass(format!(
        "{counted} policies: {synced}/{selected} selected sidecars run their current generation"
    ))
}

/// No pod without the sidecar in a namespace labelled for injection,
/// except those the webhook leaves alone on purpose.
fn uninjected(
    namespaces: &Result<Vec<Namespace>, String>,
    pods: &BTreeMap<String, Result<Vec<Pod>, String>>,
    install: &Install,
) -> Verdict {
    let label = format!("{}=enabled", install.inject_label);
    let namespaces = match namespaces {
        Err(e) => return fail(format!("cannot list namespaces: {e}"), RBAC_FIX),
        Ok(n) => n,
    };
    let mut found = Vec::new();
    let mut restarts = Vec::new();
    let mut counted = 0;
    for ns in namespaces {
        let name = ns.name_any();
        if !injectable(&name, install) {
            continue;
        }
        counted += 1;
        let listed = match pods.get(&name) {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                return fail(
                    format!("cannot list pods in namespace {name}: {e}"),
                    RBAC_FIX,
                )
            }
            None => continue,
        };
        let missing: Vec<&Pod> = listed.iter().filter(|p| lacks_sidecar(p)).collect();
        if missing.is_empty() {
            continue;
        }
        let names: Vec<String> = missing.iter().map(|p| p.name_any()).collect();
        found.push(format!("{name}: {}", shortlist(&names, 3)));
        let owners: BTreeSet<String> = missing.iter().map(|p| owner(p)).collect();
        let (bare, owned): (Vec<String>, Vec<String>) =
            owners.into_iter().partition(|o| o.starts_with("pod/"));
        if !owned.is_empty() {
            restarts.push(format!(
                "kubectl -n {name} rollout restart {}",
                owned.join(" ")
            ));
        }
        if !bare.is_empty() {
            restarts.push(format!(
                "kubectl -n {name} delete {} and create them again",
                bare.join(" ")
            ));
        }
    }
    if counted == 0 {
        return pass(format!(
            "no namespace is labelled {label}: nothing is injected"
        ));
    }
    if found.is_empty() {
        return pass(format!(
            "every pod in the {counted} namespaces labelled {label} has the sidecar"
        ));
    }
    fail(
        format!("pods without the sidecar in namespaces labelled {label}: {}", found.join("; ")),
        format!(
            "they were created before the label or while the webhook was unreachable; recreate them: {}",
            restarts.join("; ")
        ),
    )
}

/// Whether a pod the webhook should have injected runs without the sidecar.
fn lacks_sidecar(p: &Pod) -> bool {
    let finished = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
    let opted_out = p.labels().get(INJECT).map(String::as_str) == Some("disabled")
        || p.annotations().get(INJECT).map(String::as_str) == Some("false");
    let spec = p.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network) == Some(true);
    let injected = p.annotations().contains_key(INJECTED)
        || spec.is_some_and(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(&s.containers)
                .any(|c| c.name == SIDECAR_NAME)
        });
    !(finished || opted_out || host_network || injected || p.metadata.deletion_timestamp.is_some())
}

/// What to restart for a pod: its Deployment, StatefulSet, DaemonSet, or
/// the pod itself.
fn owner(p: &Pod) -> String {
    let controller = p
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    match controller {
        // A ReplicaSet's name is its Deployment's and a hash.
        Some(o) if o.kind == "ReplicaSet" => match o.name.rsplit_once('-') {
            Some((deployment, _)) => format!("deployment/{deployment}"),
            None => format!("replicaset/{}", o.name),
        },
        Some(o) => format!("{}/{}", o.kind.to_ascii_lowercase(), o.name),
        None => format!("pod/{}", p.name_any()),
    }
}

/// Up to `n` items, then how many more.
fn shortlist(items: &[String], n: usize) -> String {
    let mut out = items.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > n {
        out.push_str(&format!(" and {} more", items.len() - n));
    }
    out
}

#[cfg(test)]
mod tests;
