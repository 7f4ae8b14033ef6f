//! `kubectl reprise`, the kubectl plugin (the `kubectl-reprise` binary;
//! `docs/src/tasks/troubleshooting.md`). kubectl's conventions (`-n`, `-A`,
//! `-l`, `TYPE/NAME`, `--context`, `--kubeconfig`, `-o json|yaml|wide`)
//! over its verbs, each in its own file:
//!
//! - `stat.rs`: what each RetryPolicy did to its traffic, from
//!   `status.traffic` only.
//! - `diagnose.rs`: a pod's sidecar `/diagnostics`, through the API server's
//!   port-forward to the sidecar's loopback admin port.
//! - `sent.rs`: what the controller last sent to a pod's sidecar, and its
//!   answer, through a port-forward to each controller replica's loopback
//!   debug page.
//! - `check.rs`: the installation, one line per check, each failure with
//!   its fix; `check/certificate.rs` verifies the webhook's serving chain.
//! - `version.rs`: the plugin's version and the images the cluster runs.
//! - `explain`: `reprise-controller explain` ([`super::explain`]).
//! - `completion`: a shell's completion script, from the clap command.
//!
//! `pods.rs` resolves the pods `diagnose` and `sent` read; `table.rs` draws
//! kubectl's tables and ages. Which verb takes `-o` and `-A` is one table
//! ([`flags_for`]): refused where meaningless, never ignored. Each verb
//! fetches, then hands what it fetched to a pure function that renders it,
//! which the tests call on fixture objects; `-o json|yaml` print a kubectl
//! `List` wherever a verb prints several things.

mod check;
mod diagnose;
mod pods;
mod sent;
mod stat;
mod table;
mod version;

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::explain;
use crate::Error;

/// Reprise's kubectl plugin: what retry policies did to their traffic, a
/// pod's recently retried requests, what the controller last sent a pod,
/// which policy applies to a request, and whether the installation is
/// healthy.
#[derive(Debug, Parser)]
#[command(name = "kubectl-reprise", bin_name = "kubectl reprise", version)]
pub struct Args {
    #[command(flatten)]
    global: Global,
    /// What to do.
    #[command(subcommand)]
    verb: Verb,
}

/// kubectl's own flags, accepted before or after the verb.
#[derive(Debug, Default, clap::Args)]
struct Global {
    /// The namespace (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Every namespace (`stat`; `diagnose` and `sent` with -l).
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The kubeconfig file (default: KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Output format: json, yaml or wide (`stat`, `diagnose`); json or
    /// yaml (`sent`, `version`).
    #[arg(short = 'o', long, global = true, value_enum)]
    output: Option<Output>,
}

/// `-o`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Json,
    Yaml,
    Wide,
}

/// The verbs.
#[derive(Debug, Subcommand)]
enum Verb {
    /// What each RetryPolicy did to its traffic over the last window, from
    /// its status: requests per second, first-try and effective success,
    /// retries, recovered, exhausted and skipped requests.
    Stat(stat::Args),
    /// A pod's recently retried requests and their attempts, from its
    /// sidecar's /diagnostics (through a port-forward to its admin port).
    Diagnose(diagnose::Args),
    /// What the controller last sent to a pod's sidecar (a whole snapshot
    /// or a delta, its version, when) and what the sidecar answered, from
    /// the controller replica that holds its stream (through a port-forward).
    Sent(sent::Args),
    /// Which policy applies to a request from a pod, which endpoints are
    /// eligible and on which failures it would be retried (sends nothing).
    Explain(explain::Request),
    /// Checks the installation: CRD, webhook and its certificate,
    /// controller and Lease, sidecars in sync, pods left uninjected. Exit
    /// status 1 when a check fails.
    Check(check::Args),
    /// This plugin's version, and the images the controller and the
    /// injected pods' sidecars run, with how many pods run each.
    Version(version::Args),
    /// Prints a completion script for a shell (for `kubectl-reprise`; see
    /// the troubleshooting page for `kubectl reprise`).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Whether a verb takes `-o` (and which forms) and `-A`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Takes {
    outputs: &'static [Output],
    all_namespaces: AllNamespaces,
}

/// Where `-A` means something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AllNamespaces {
    Yes,
    /// Only beside `-l`: a name is never unique across namespaces.
    WithSelector,
    No,
}

/// The one table of what each verb takes.
fn takes(verb: &Verb) -> (&'static str, Takes) {
    use AllNamespaces::{No, WithSelector, Yes};
    const DATA: &[Output] = &[Output::Json, Output::Yaml];
    const ALL: &[Output] = &[Output::Json, Output::Yaml, Output::Wide];
    let (name, outputs, all_namespaces) = match verb {
        Verb::Stat(_) => ("stat", ALL, Yes),
        Verb::Diagnose(_) => ("diagnose", ALL, WithSelector),
        Verb::Sent(_) => ("sent", DATA, WithSelector),
        Verb::Explain(_) => ("explain", &[][..], No),
        Verb::Check(_) => ("check", &[][..], No),
        Verb::Version(_) => ("version", DATA, No),
        Verb::Completion { .. } => ("completion", &[][..], No),
    };
    (
        name,
        Takes {
            outputs,
            all_namespaces,
        },
    )
}

/// Refuses `-o` and `-A` where `verb` has no use for them, naming what it
/// does take.
fn flags_for(verb: &Verb, g: &Global) -> Result<(), Error> {
    let (name, takes) = takes(verb);
    if let Some(output) = g.output {
        if !takes.outputs.contains(&output) {
            let forms: Vec<String> = takes
                .outputs
                .iter()
                .map(|o| format!("{o:?}").to_lowercase())
                .collect();
            return Err(Error::Usage(if forms.is_empty() {
                format!("{name} prints text only: drop -o")
            } else {
                format!(
                    "{name} takes -o {}, not -o {}",
                    forms.join("|"),
                    format!("{output:?}").to_lowercase()
                )
            }));
        }
    }
    if g.all_namespaces && takes.all_namespaces == AllNamespaces::No {
        return Err(Error::Usage(format!("{name} takes no -A")));
    }
    Ok(())
}

/// Runs the verb `args` names; `Ok(false)` when it found something wrong
/// (a failed check, a pod that could not be read), which the binary turns
/// into exit status 1.
pub async fn run(args: Args) -> Result<bool, Error> {
    let g = &args.global;
    flags_for(&args.verb, g)?;
    if let Verb::Completion { shell } = args.verb {
        // Needs no cluster: before the client, which may find no kubeconfig.
        print!("{}", completion(shell));
        return Ok(true);
    }
    let client = client(g).await?;
    let namespace = g
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let scope = (!g.all_namespaces).then_some(namespace.as_str());
    match args.verb {
        Verb::Stat(a) => {
            show(&stat::run(client, scope, &a, g.output).await?);
            Ok(true)
        }
        Verb::Diagnose(a) => {
            let pods = pods::resolve(&client, scope, &a.pods.named(g.all_namespaces)?).await?;
            let (text, failed) = diagnose::run(client, &pods, &a, g.output).await?;
            Ok(show_with_failures(&text, &failed))
        }
        Verb::Sent(a) => {
            let pods = pods::resolve(&client, scope, &a.pods.named(g.all_namespaces)?).await?;
            let (text, failed) = sent::run(client, &pods, &a, g.output).await?;
            Ok(show_with_failures(&text, &failed))
        }
        Verb::Explain(request) => {
            show(&explain::answer_from(client, namespace, request).await?);
            Ok(true)
        }
        Verb::Check(a) => {
            let (text, ok) = check::run(client, &a).await;
            show(&text);
            Ok(ok)
        }
        Verb::Version(a) => {
            show(&version::run(client, &a, g.output).await?);
            Ok(true)
        }
        Verb::Completion { .. } => Ok(true),
    }
}

/// The completion script for `shell`.
fn completion(shell: clap_complete::Shell) -> String {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Args::command(), "kubectl-reprise", &mut script);
    String::from_utf8_lossy(&script).into_owned()
}

/// Prints `text`, then each failure on stderr as kubectl prints its own;
/// whether there were none.
fn show_with_failures(text: &str, failed: &[Error]) -> bool {
    show(text);
    for e in failed {
        eprintln!("error: {}", error_line(e));
    }
    failed.is_empty()
}

/// Prints `text` with its control characters escaped but its line breaks:
/// everything a verb prints may hold what a pod wrote (a report key, a
/// NACK's message, a fake sidecar's diagnostics) or a status it shaped.
fn show(text: &str) {
    print!("{}", crate::untrusted::escaped(text, true));
}

/// An error as the binary prints it, on one line, escaped: an error may
/// quote what a pod's admin port or the API server answered.
pub fn error_line(e: &Error) -> String {
    crate::untrusted::escaped(&e.to_string(), false)
}

/// `value` printed as `-o json` or `-o yaml` ask; `None` for the text forms,
/// which each verb draws its own way.
fn as_data(value: &impl serde::Serialize, output: Option<Output>) -> Option<Result<String, Error>> {
    match output? {
        // serde_json escapes C0 controls itself, not C1 ones (U+009B is a
        // CSI to some terminals): they can only be in strings, where
        // `\u009b` is the same character.
        Output::Json => Some(
            serde_json::to_string_pretty(value)
                .map(|s| {
                    let mut out = String::with_capacity(s.len() + 1);
                    for c in s.chars() {
                        if c.is_control() && c != '\n' {
                            out.push_str(&format!("\\u{:04x}", u32::from(c)));
                        } else {
                            out.push(c);
                        }
                    }
                    out + "\n"
                })
                .map_err(Error::Json),
        ),
        Output::Yaml => Some(serde_yaml::to_string(value).map_err(Error::Yaml)),
        Output::Wide => None,
    }
}

/// `items` as `-o json|yaml` print them: a kubectl `List`, so that
/// `jq '.items[]'` and `yq` work as they do on `kubectl get -o json`;
/// `None` for the text forms. The items are built only when printed.
fn as_list(
    items: impl FnOnce() -> Vec<serde_json::Value>,
    output: Option<Output>,
) -> Option<Result<String, Error>> {
    if !matches!(output, Some(Output::Json | Output::Yaml)) {
        return None;
    }
    as_data(
        &serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": { "resourceVersion": "" },
            "items": items(),
        }),
        output,
    )
}

/// One item of a [`as_list`] `List`: `kind` of `api_version`, named by
/// `id` (`namespace/name`), with `fields` (an object) beside its metadata.
/// The verbs' own kinds (`SidecarDiagnostics`, `SidecarPush`) are not
/// objects the API server stores, only shaped like them.
fn list_item(
    api_version: &str,
    kind: &str,
    id: &str,
    fields: serde_json::Value,
) -> serde_json::Value {
    let (namespace, name) = id.split_once('/').unwrap_or(("", id));
    let mut item = serde_json::json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": { "namespace": namespace, "name": name },
    });
    if let (Some(item), serde_json::Value::Object(fields)) = (item.as_object_mut(), fields) {
        for (k, v) in fields {
            item.entry(k).or_insert(v);
        }
    }
    item
}

/// A client as kubectl would make one: `--kubeconfig` (else KUBECONFIG or
/// ~/.kube/config, else the pod's service account) and `--context`.
async fn client(g: &Global) -> Result<Client, Error> {
    let options = KubeConfigOptions {
        context: g.context.clone(),
        ..Default::default()
    };
    let config = match &g.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(Error::Kubeconfig)?
        }
        None if g.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(Error::Kubeconfig)?,
        None => Config::infer().await.map_err(Error::InferConfig)?,
    };
    Client::try_from(config).map_err(Error::Kube)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("kubectl-reprise").chain(args.iter().copied()))
    }

    #[test]
    fn kubectl_flags_go_before_or_after_the_verb() {
        let a = parse(&["-n", "shop", "stat", "rp/reads", "-o", "json"]).expect("parses");
        assert_eq!(a.global.namespace.as_deref(), Some("shop"));
        assert_eq!(a.global.output, Some(Output::Json));
        assert!(matches!(&a.verb, Verb::Stat(s) if s.target.as_deref() == Some("rp/reads")));
        let a = parse(&[
            "stat",
            "-A",
            "--context",
            "kind",
            "--kubeconfig",
            "/tmp/k",
            "-o",
            "wide",
        ])
        .expect("parses");
        assert!(a.global.all_namespaces);
        assert_eq!(a.global.context.as_deref(), Some("kind"));
        assert_eq!(a.global.kubeconfig, Some(PathBuf::from("/tmp/k")));
        assert_eq!(a.global.output, Some(Output::Wide));
        assert!(matches!(&a.verb, Verb::Stat(s) if s.target.is_none()));
    }

    #[test]
    fn outputs_other_than_json_yaml_and_wide_are_refused() {
        let e = parse(&["stat", "-o", "name"]).expect_err("refused");
        assert!(
            e.to_string().contains("possible values: json, yaml, wide"),
            "{e}"
        );
    }

    #[test]
    fn diagnose_takes_its_filters_and_explain_the_controllers_arguments() {
        let a = parse(&[
            "diagnose",
            "web-1",
            "--upstream",
            "api.shop",
            "--outcome",
            "exhausted",
            "--limit",
            "5",
            "-n",
            "shop",
        ])
        .expect("parses");
        let Verb::Diagnose(d) = &a.verb else {
            panic!("{a:?}")
        };
        assert_eq!(d.pods.target.as_deref(), Some("web-1"));
        assert_eq!(
            d.query_path(),
            "/diagnostics?upstream=api.shop&outcome=exhausted&limit=5"
        );
        let a = parse(&[
            "explain",
            "--pod",
            "web-1",
            "-H",
            "x-tenant: a",
            "GET",
            "http://api/v1/items",
        ])
        .expect("parses");
        assert!(matches!(a.verb, Verb::Explain(_)), "{a:?}");
        assert!(parse(&["explain", "GET"]).is_err(), "the URL is required");
    }

    #[test]
    fn json_and_yaml_print_control_characters_escaped() {
        let hostile = serde_json::json!({"key": "a\u{1b}]52;c;aGk=\u{7}b\u{9b}"});
        for output in [Output::Json, Output::Yaml] {
            let printed = as_data(&hostile, Some(output))
                .expect("data")
                .expect("printed");
            assert!(
                !printed.chars().any(|c| c.is_control() && c != '\n'),
                "{output:?}: {printed:?}"
            );
            let back: serde_json::Value = match output {
                Output::Json => serde_json::from_str(&printed).expect("JSON"),
                _ => serde_yaml::from_str(&printed).expect("YAML"),
            };
            assert_eq!(back, hostile, "{output:?}: the same text, escaped");
        }
    }

    #[test]
    fn each_verb_takes_the_output_forms_and_namespaces_its_table_says() {
        // (command line, refusal's words or None when taken)
        let table: &[(&[&str], Option<&str>)] = &[
            (&["stat", "-o", "wide"], None),
            (&["stat", "-A", "-o", "json"], None),
            (&["diagnose", "web-1", "-o", "wide"], None),
            (&["diagnose", "-l", "app=web", "-A"], None),
            (&["sent", "deploy/web", "-o", "yaml"], None),
            (
                &["sent", "web-1", "-o", "wide"],
                Some("sent takes -o json|yaml, not -o wide"),
            ),
            (&["version", "-o", "json"], None),
            (&["version", "-A"], Some("version takes no -A")),
            (
                &["check", "-o", "json"],
                Some("check prints text only: drop -o"),
            ),
            (&["check", "-A"], Some("check takes no -A")),
            (
                &["explain", "-o", "yaml", "GET", "http://api/"],
                Some("explain prints text only"),
            ),
            (
                &["completion", "bash", "-A"],
                Some("completion takes no -A"),
            ),
        ];
        for (line, refused) in table {
            let a = parse(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            match (flags_for(&a.verb, &a.global), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(words)) => {
                    assert!(e.to_string().contains(words), "{line:?}: {e}");
                }
                (got, want) => panic!("{line:?}: got {got:?}, want refused: {want:?}"),
            }
        }
    }

    #[test]
    fn pods_are_named_alike_by_diagnose_and_sent() {
        for verb in ["diagnose", "sent"] {
            let a = parse(&[verb, "-l", "app=web", "-A"]).expect("parses");
            let named = match &a.verb {
                Verb::Diagnose(d) => d.pods.named(a.global.all_namespaces),
                Verb::Sent(s) => s.pods.named(a.global.all_namespaces),
                v => panic!("{v:?}"),
            };
            assert_eq!(named.expect(verb), pods::Named::Selector("app=web".into()));
            let a = parse(&[verb, "sts/db"]).expect("parses");
            let named = match &a.verb {
                Verb::Diagnose(d) => d.pods.named(false),
                Verb::Sent(s) => s.pods.named(false),
                v => panic!("{v:?}"),
            };
            assert_eq!(
                named.expect(verb),
                pods::Named::Workload(pods::Workload::StatefulSet, "db".into())
            );
        }
    }

    #[test]
    fn completion_scripts_name_every_verb() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let script = completion(shell);
            for verb in [
                "stat",
                "diagnose",
                "sent",
                "explain",
                "check",
                "version",
                "completion",
            ] {
                assert!(script.contains(verb), "{shell}: {verb} missing");
            }
            assert!(script.contains("kubectl-reprise"), "{shell}");
        }
    }

    #[test]
    fn a_list_is_what_kubectl_prints_and_its_items_keep_their_fields() {
        let printed = as_list(
            || {
                vec![list_item(
                    "reprise.dev/v1alpha1",
                    "SidecarPush",
                    "shop/web-0",
                    serde_json::json!({"acked": "a1", "metadata": "not replaced"}),
                )]
            },
            Some(Output::Json),
        )
        .expect("data")
        .expect("printed");
        let v: serde_json::Value = serde_json::from_str(&printed).expect("JSON");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["kind"], "List");
        assert_eq!(
            v["items"][0],
            serde_json::json!({"apiVersion": "reprise.dev/v1alpha1", "kind": "SidecarPush",
                "metadata": {"namespace": "shop", "name": "web-0"}, "acked": "a1"})
        );
        assert!(as_list(Vec::new, Some(Output::Wide)).is_none());
        assert!(as_list(Vec::new, None).is_none());
    }
}
