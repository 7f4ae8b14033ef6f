//! `kubectl reprise`, the kubectl plugin (the `kubectl-reprise` binary;
//! `docs/src/tasks/troubleshooting.md`). kubectl's conventions (`-n`, `-A`,
//! `--context`, `--kubeconfig`, `-o json|yaml|wide`) over five verbs, each in
//! its own file:
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
//! - `explain`: `reprise-controller explain` ([`super::explain`]).
//!
//! `table.rs` draws kubectl's tables and ages. Each verb fetches, then hands
//! what it fetched to a pure function that renders it, which the tests call
//! on fixture objects.

mod check;
mod diagnose;
mod sent;
mod stat;
mod table;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
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
    /// Every namespace (`stat`).
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The kubeconfig file (default: KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Output format (`stat`, `diagnose`, `sent`).
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
}

/// Runs the verb `args` names; `Ok(false)` when it found something wrong
/// (a failed check), which the binary turns into exit status 1.
pub async fn run(args: Args) -> Result<bool, Error> {
    let g = &args.global;
    let client = client(g).await?;
    let namespace = g
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    match args.verb {
        Verb::Stat(a) => {
            let scope = (!g.all_namespaces).then_some(namespace.as_str());
            show(&stat::run(client, scope, &a, g.output).await?);
            Ok(true)
        }
        Verb::Diagnose(a) => {
            show(&diagnose::run(client, &namespace, &a, g.output).await?);
            Ok(true)
        }
        Verb::Sent(a) => {
            show(&sent::run(client, &namespace, &a, g.output).await?);
            Ok(true)
        }
        Verb::Explain(request) => {
            text_only("explain", g)?;
            show(&explain::answer_from(client, namespace, request).await?);
            Ok(true)
        }
        Verb::Check(a) => {
            text_only("check", g)?;
            let (text, ok) = check::run(client, &a).await;
            show(&text);
            Ok(ok)
        }
    }
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

/// Refuses `-o` and `-A` for verbs that print text about one thing.
fn text_only(verb: &str, g: &Global) -> Result<(), Error> {
    if g.output.is_some() {
        return Err(Error::Usage(format!("{verb} prints text only: drop -o")));
    }
    if g.all_namespaces {
        return Err(Error::Usage(format!("{verb} takes no -A")));
    }
    Ok(())
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
        assert_eq!(d.pod, "web-1");
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
    fn check_refuses_output_formats() {
        let g = Global {
            output: Some(Output::Json),
            ..Default::default()
        };
        assert!(text_only("check", &g).is_err());
        assert!(text_only("check", &Global::default()).is_ok());
    }
}
