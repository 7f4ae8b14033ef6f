//! `reprise-controller`: reconciles RetryPolicy resources and pushes validated
//! configuration to sidecars.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use reprise_controller::leader::LeaseSettings;
use reprise_controller::run::{self, Options};

/// Reprise controller.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the RetryPolicy CustomResourceDefinition as YAML.
    Crd,
    /// Request tester: which policy applies to a request, which endpoints are
    /// eligible and on which failures it would be retried. Sends no traffic.
    Explain {
        /// Client namespace.
        #[arg(long, short = 'n', default_value = "default")]
        namespace: String,
        /// Client pod whose labels select policies.
        #[arg(long)]
        pod: Option<String>,
        /// Labels of a hypothetical client pod (key=value, repeatable).
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Header `name: value` (repeatable).
        #[arg(long = "header", short = 'H')]
        headers: Vec<String>,
        /// Method.
        method: String,
        /// URL, e.g. http://api/v1/items.
        url: String,
    },

    /// Run the controller (in cluster, or out of cluster with KUBECONFIG).
    Run {
        /// Push stream listener (TLS).
        #[arg(long, default_value = "0.0.0.0:15010")]
        push_addr: SocketAddr,
        /// Metrics and health listener.
        #[arg(long, default_value = "127.0.0.1:15020")]
        metrics_addr: SocketAddr,
        /// Directory holding ca.crt, tls.crt and tls.key (generated when absent).
        #[arg(long, default_value = "/var/run/reprise/tls")]
        tls_dir: PathBuf,
        /// Name for a generated serving certificate (repeatable).
        #[arg(long = "tls-san", default_values_t = ["localhost".to_string(), "reprise-controller.reprise-system.svc".to_string()])]
        tls_sans: Vec<String>,
        /// Elect a leader with a Lease so several replicas can run.
        #[arg(long)]
        leader_election: bool,
        /// Namespace of the Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "reprise-system")]
        lease_namespace: String,
        /// This replica's identity in the Lease.
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::Crd => print!("{}", reprise_controller::crd::crd_yaml()?),
        Command::Explain {
            namespace,
            pod,
            labels,
            headers,
            method,
            url,
        } => {
            let client = kube::Client::try_default()
                .await
                .context("no Kubernetes configuration (in cluster or KUBECONFIG)")?;
            let question = reprise_controller::explain::Question {
                namespace,
                pod,
                labels: labels
                    .iter()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                method: method.to_ascii_uppercase(),
                url,
                headers: headers
                    .iter()
                    .filter_map(|h| h.split_once(':'))
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .collect(),
            };
            print!(
                "{}",
                reprise_controller::explain::explain(client, &question).await?
            );
        }

        Command::Run {
            push_addr,
            metrics_addr,
            tls_dir,
            tls_sans,
            leader_election,
            lease_namespace,
            identity,
        } => {
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("REPRISE_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            let client = kube::Client::try_default()
                .await
                .context("no Kubernetes configuration (in cluster or KUBECONFIG)")?;
            let identity =
                identity.unwrap_or_else(|| format!("reprise-controller-{}", std::process::id()));
            let lease = leader_election.then(|| LeaseSettings {
                name: "reprise-controller".into(),
                namespace: lease_namespace,
                identity,
                duration: Duration::from_secs(15),
                renew_every: Duration::from_secs(5),
            });
            run::run(
                client,
                Options {
                    push_addr,
                    metrics_addr,
                    tls_dir,
                    tls_sans,
                    lease,
                },
            )
            .await?;
        }
    }
    Ok(())
}
