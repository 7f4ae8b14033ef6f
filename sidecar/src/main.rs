//! `reprise-sidecar`: runs the proxy from a configuration file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use reprise_sidecar::admin::{Admin, LogLevelSetter};
use reprise_sidecar::proxy::Proxy;
use reprise_sidecar::{reload, server};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload as log_reload, EnvFilter};

/// Reprise sidecar: an HTTP proxy that retries safely.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Configuration file (the gateway `upstreams:` format, plus `rules:`).
    #[arg(long)]
    config: PathBuf,
    /// Outbound proxy listener.
    #[arg(long, default_value = "127.0.0.1:15001")]
    listen: SocketAddr,
    /// Admin listener (/live, /ready, /config, /metrics). Keep it on localhost.
    #[arg(long, default_value = "127.0.0.1:15000")]
    admin: SocketAddr,
    /// Validate the configuration and exit: 0 valid, 2 invalid. Opens no connection.
    #[arg(long)]
    check: bool,
    /// Log format: json (one JSON object per line) or text.
    #[arg(long, default_value = "json", value_parser = ["json", "text"])]
    log_format: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.check {
        return check(&args.config);
    }
    let (set_log_level, _log_flush) = init_logging(&args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("reprise-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, set_log_level)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("reprise-sidecar: {e:#}");
            tracing::error!(error = %format!("{e:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    match reprise_crds::file::load(path) {
        Ok(cfg) => {
            println!(
                "{}: valid ({} upstream(s), {} rule(s))",
                path.display(),
                cfg.upstreams.len(),
                cfg.rules.len()
            );
            ExitCode::SUCCESS
        }
        Err(reprise_crds::Error::Invalid { path, source }) => {
            for e in source.0 {
                eprintln!("{path}: {e}");
            }
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// Logs go through a bounded in-memory queue drained by a dedicated thread, so a
/// slow or blocked stdout never stalls the proxy: when the queue is full, lines
/// are dropped instead. The guard flushes what is queued at exit.
fn init_logging(format: &str) -> (LogLevelSetter, tracing_appender::non_blocking::WorkerGuard) {
    let filter = EnvFilter::try_from_env("REPRISE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = log_reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(64 * 1024)
        .finish(std::io::stdout());
    if format == "text" {
        registry
            .with(tracing_subscriber::fmt::layer().with_writer(writer))
            .init();
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_writer(writer),
            )
            .init();
    }
    let setter: LogLevelSetter = Arc::new(move |spec: &str| {
        let filter = EnvFilter::try_new(spec).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    });
    (setter, guard)
}

async fn run(args: Args, set_log_level: LogLevelSetter) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(&args.config)
        .with_context(|| format!("{}: cannot read", args.config.display()))?;
    let config = match reprise_crds::file::parse(
        &String::from_utf8_lossy(&bytes),
        &args.config.display().to_string(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(2));
        }
    };
    let proxy = Proxy::new(config);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let admin_listener = tokio::net::TcpListener::bind(args.admin)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", args.admin))?;
    tracing::info!(listen = %args.listen, admin = %args.admin, config = %args.config.display(), "reprise-sidecar serving");
    tokio::spawn(server::serve_admin(
        admin_listener,
        Admin {
            proxy: Arc::clone(&proxy),
            set_log_level: Some(set_log_level),
        },
    ));
    tokio::spawn(reload::watch(
        args.config.clone(),
        Arc::clone(&proxy),
        bytes,
    ));
    let drained = server::serve_proxy(listener, Arc::clone(&proxy), shutdown_signal()).await;
    tracing::info!(drained, "reprise-sidecar stopped");
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
    }
}
