//! The command line (`docs/src/concepts/controller.md`; every flag in
//! `docs/src/reference/cli-controller.md`, generated from these types): `run` starts the controller; `crd`, `explain` and `selftest`
//! are one-shot tools, each in its own file; `plugin` is the second binary,
//! `kubectl-reprise` (`docs/src/tasks/troubleshooting.md`), which shares `explain`.

pub mod crd;
pub mod explain;
pub mod plugin;
#[cfg(test)]
mod reference;
pub mod selftest;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::inject::{InjectionConfig, WebhookLimits};
use crate::leader::{LeaseSettings, LEASE_NAME};
use crate::listen::Limits;
use crate::run::{Options, TlsSource, WebhookOptions};
use crate::telemetry::Tracing;

/// Reprise controller.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the RetryPolicy CustomResourceDefinition as YAML.
    Crd,
    /// Checks an installation: the CRD is served, a controller holds the
    /// Lease, the webhook has a caBundle. Exit status 1 when a check fails.
    Selftest(selftest::Args),
    /// Request tester: which policy applies to a request, which endpoints are
    /// eligible and on which failures it would be retried. Sends no traffic.
    Explain(explain::Args),

    /// Run the controller (in cluster, or out of cluster with KUBECONFIG).
    Run(Box<RunArgs>),
}

/// `--namespace`, the controller's own namespace, as `run` and `selftest`
/// take it.
#[derive(Debug, clap::Args)]
pub struct ControllerNamespace {
    /// The controller's namespace: its Lease, peer ConfigMaps and TLS Secret live there.
    #[arg(
        long,
        short = 'n',
        alias = "lease-namespace",
        env = "POD_NAMESPACE",
        default_value = "reprise-system"
    )]
    namespace: String,
}

// The subcommand's help is the doc comment of `Command::Run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Push stream listener (TLS).
    #[arg(long, default_value = "0.0.0.0:15010")]
    push_addr: SocketAddr,
    /// Metrics and health listener; its /debug/sidecars pages (what each
    /// connected sidecar was last sent) answer loopback connections only.
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
    #[command(flatten)]
    namespace: ControllerNamespace,
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
    /// Time for a TLS handshake and for each request head, on every
    /// listener (an idle keep-alive connection closes after it too).
    #[arg(long, default_value = "10s", value_parser = duration)]
    header_timeout: Duration,
    /// Time the webhook's and the metrics listener's connections may go
    /// without a byte moving.
    #[arg(long, default_value = "60s", value_parser = duration)]
    idle_timeout: Duration,
    /// Time a push stream may go without a byte moving (its heartbeats
    /// move every 15 s).
    #[arg(long, default_value = "45s", value_parser = duration)]
    push_idle_timeout: Duration,
    /// Connections the push listener holds at once.
    #[arg(long, default_value_t = 65_536)]
    push_max_connections: usize,
    /// Connections the push listener holds at once from one address
    /// (raise it where many pods' sidecars share one: host network, a NAT
    /// before an out-of-cluster controller; 0: no cap per address).
    #[arg(long, default_value_t = 256)]
    push_max_connections_per_source: usize,
    /// Connections the metrics listener holds at once.
    #[arg(long, default_value_t = 64)]
    metrics_max_connections: usize,
    /// Connections the webhook holds at once.
    #[arg(long, default_value_t = 64)]
    webhook_max_connections: usize,
    /// Request bodies the webhook reads at once (each up to 3 MiB).
    #[arg(long, default_value_t = 8)]
    webhook_max_pending_bodies: usize,
    /// A webhook request's whole time, its body's included: the webhook
    /// configuration's timeoutSeconds (the API server gives up then).
    #[arg(long, default_value = "10s", value_parser = duration)]
    webhook_timeout: Duration,
}

/// A duration as the flags take it: `500ms`, `10s`, `2m`.
fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: a whole number and a unit (ms, s, m), e.g. 10s"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(format!("{text:?}: the unit must be ms, s or m")),
    };
    if d.is_zero() {
        return Err(format!("{text:?}: must be more than zero"));
    }
    Ok(d)
}

impl RunArgs {
    /// How the controller runs with these arguments; `tracing` records its
    /// spans. Reads the injection config file.
    pub fn options(self, tracing: Tracing) -> anyhow::Result<Options> {
        let webhook = match self.webhook_addr {
            Some(addr) => {
                let path = self
                    .injection_config
                    .context("--webhook-addr needs --injection-config")?;
                Some(WebhookOptions {
                    addr,
                    injection: InjectionConfig::load(&path)?,
                    configuration: self.webhook_configuration,
                    limits: WebhookLimits {
                        listener: Limits {
                            max_connections: self.webhook_max_connections,
                            max_per_source: None,
                            header_timeout: self.header_timeout,
                            idle_timeout: self.idle_timeout,
                        },
                        pending_bodies: self.webhook_max_pending_bodies.max(1),
                        request_timeout: self.webhook_timeout,
                    },
                })
            }
            None => None,
        };
        let namespace = self.namespace.namespace;
        let lease = self.leader_election.then(|| LeaseSettings {
            name: LEASE_NAME.into(),
            namespace: namespace.clone(),
            identity: self
                .identity
                .unwrap_or_else(|| format!("reprise-controller-{}", std::process::id())),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        });
        let tls = match self.tls_secret {
            Some(name) => TlsSource::Secret(name),
            None => TlsSource::Dir(self.tls_dir),
        };
        Ok(Options {
            push_addr: self.push_addr,
            push_limits: Limits {
                max_connections: self.push_max_connections,
                max_per_source: (self.push_max_connections_per_source > 0)
                    .then_some(self.push_max_connections_per_source),
                header_timeout: self.header_timeout,
                idle_timeout: self.push_idle_timeout,
            },
            metrics_addr: self.metrics_addr,
            metrics_limits: Limits {
                max_connections: self.metrics_max_connections,
                max_per_source: None,
                header_timeout: self.header_timeout,
                idle_timeout: self.idle_timeout,
            },
            tls,
            tls_sans: self.tls_sans,
            lease,
            namespace,
            webhook,
            tracing,
            // Events name the pod that recorded them.
            reporter_instance: std::env::var("POD_NAME").ok(),
        })
    }
}

/// A client from the in-cluster configuration or `KUBECONFIG`.
pub async fn client() -> anyhow::Result<kube::Client> {
    kube::Client::try_default()
        .await
        .context("no Kubernetes configuration (in cluster or KUBECONFIG)")
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn durations_read_with_their_unit_and_bad_ones_say_why() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["10", "s", "1.5s", "0s", "10h", "-1s"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }
}
