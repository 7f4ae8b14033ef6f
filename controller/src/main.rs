//! `reprise-controller`: reconciles RetryPolicy resources and pushes validated
//! configuration to sidecars. Parses the command line, sets up logs and
//! traces for `run`, and hands over to the library.

use anyhow::Context;
use clap::Parser;
use reprise_controller::cli::{self, Args, Command, RunArgs};
use reprise_controller::telemetry::{self, Tracing};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Crd => Ok(cli::crd::print()?),
        Command::Explain(args) => cli::explain::print(args).await,
        Command::Selftest(args) => cli::selftest::print(args).await,
        Command::Run(args) => run(*args).await,
    }
}

/// `reprise-controller run`: JSON logs filtered by `REPRISE_LOG`, spans over
/// OTLP when configured, until SIGTERM or SIGINT.
async fn run(args: RunArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(reprise_crds::sidecar_env::LOG)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let traces = Tracing::from_env(telemetry::SERVICE).context("OpenTelemetry tracing")?;
    let client = cli::client().await?;
    let options = args.options(traces.clone())?;
    tracing::info!(tracing = traces.is_on(), "reprise-controller starting");
    let result = tokio::select! {
        r = reprise_controller::run::run(client, options) => r,
        () = shutdown_signal() => Ok(()),
    };
    // Spans of the last reconciles and pushes are worth a short wait, never a hung exit.
    if !traces.shutdown(telemetry::FLUSH_TIMEOUT).await {
        tracing::warn!("queued spans did not reach the collector in time; they are lost");
    }
    result?;
    tracing::info!("reprise-controller stopped");
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
