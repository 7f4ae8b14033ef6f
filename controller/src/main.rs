//! `reprise-controller`: reconciles RetryPolicy resources and pushes validated
//! configuration to sidecars.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use reprise_controller::injection::InjectionConfig;
use reprise_controller::leader::LeaseSettings;
use reprise_controller::run::{self, Options, WebhookOptions};
use reprise_controller::telemetry::{self, Tracing};

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
    /// Checks an installation: the CRD is served, a controller holds the
    /// Lease, the webhook has a caBundle. Exit status 1 when a check fails.
    Selftest {
        /// The controller's namespace.
        #[arg(
            long,
            short = 'n',
            env = "POD_NAMESPACE",
            default_value = "reprise-system"
        )]
        namespace: String,
        /// MutatingWebhookConfiguration to check.
        #[arg(long)]
        webhook_configuration: Option<String>,
    },
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
        /// The controller's namespace: its Lease, peer ConfigMaps and TLS Secret live there.
        #[arg(
            long,
            alias = "lease-namespace",
            env = "POD_NAMESPACE",
            default_value = "reprise-system"
        )]
        namespace: String,
        /// Keep the CA and serving certificate in this Secret (created when
        /// absent), shared by every replica, instead of --tls-dir.
        #[arg(long)]
        tls_secret: Option<String>,
        /// Serve the sidecar-injecting webhook (HTTPS, path /inject) here.
        #[arg(long, requires = "injection_config")]
        webhook_addr: Option<SocketAddr>,
        /// What injected sidecars look like (YAML; the chart's injection ConfigMap).
        #[arg(long)]
        injection_config: Option<PathBuf>,
        /// MutatingWebhookConfiguration whose caBundle to keep set to the
        /// controller's CA (leave out when cert-manager injects it).
        #[arg(long)]
        webhook_configuration: Option<String>,
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

        Command::Selftest {
            namespace,
            webhook_configuration,
        } => {
            let client = kube::Client::try_default()
                .await
                .context("no Kubernetes configuration (in cluster or KUBECONFIG)")?;
            let checks = reprise_controller::selftest::run(
                client,
                &namespace,
                webhook_configuration.as_deref(),
                Duration::from_secs(30),
            )
            .await;
            let mut failed = 0;
            for c in &checks {
                match &c.result {
                    Ok(detail) => println!("ok   {}: {detail}", c.name),
                    Err(why) => {
                        failed += 1;
                        println!("FAIL {}: {why}", c.name);
                    }
                }
            }
            if failed > 0 {
                anyhow::bail!("{failed} of {} checks failed", checks.len());
            }
        }

        Command::Run {
            push_addr,
            metrics_addr,
            tls_dir,
            tls_sans,
            leader_election,
            namespace,
            identity,
            tls_secret,
            webhook_addr,
            injection_config,
            webhook_configuration,
        } => {
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env(reprise_crds::sidecar_env::LOG)
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            let traces = Tracing::from_env(telemetry::SERVICE).context("OpenTelemetry tracing")?;
            let client = kube::Client::try_default()
                .await
                .context("no Kubernetes configuration (in cluster or KUBECONFIG)")?;
            let webhook = match webhook_addr {
                Some(addr) => {
                    let path =
                        injection_config.context("--webhook-addr needs --injection-config")?;
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("{}", path.display()))?;
                    let injection = InjectionConfig::from_yaml(&text)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    Some(WebhookOptions {
                        addr,
                        injection,
                        configuration: webhook_configuration,
                    })
                }
                None => None,
            };
            let identity =
                identity.unwrap_or_else(|| format!("reprise-controller-{}", std::process::id()));
            let lease = leader_election.then(|| LeaseSettings {
                name: "reprise-controller".into(),
                namespace: namespace.clone(),
                identity,
                duration: Duration::from_secs(15),
                renew_every: Duration::from_secs(5),
            });
            let options = Options {
                push_addr,
                metrics_addr,
                tls_dir,
                tls_sans,
                lease,
                tls_secret,
                namespace,
                webhook,
                tracing: traces.clone(),
            };
            tracing::info!(tracing = traces.is_on(), "reprise-controller starting");
            let result = tokio::select! {
                r = run::run(client, options) => r,
                () = shutdown_signal() => Ok(()),
            };
            // Spans of the last reconciles and pushes are worth a short wait, never a hung exit.
            if !traces.shutdown(telemetry::FLUSH_TIMEOUT).await {
                tracing::warn!("queued spans did not reach the collector in time; they are lost");
            }
            result?;
            tracing::info!("reprise-controller stopped");
        }
    }
    Ok(())
}

/// SIGTERM (the kubelet stopping the pod) or SIGINT. Without a handler the
/// controller, as PID 1 in its container, would ignore SIGTERM and wait for
/// SIGKILL, losing its queued spans.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGTERM; SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("SIGINT: stopping");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
}
