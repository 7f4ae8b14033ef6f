//! The `reprise-sidecar` process: arguments, logging, the runtime, where the
//! configuration comes from (a file, or the controller), the listeners, and
//! the exit after the drain. `main.rs` only calls [`main`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::reload;
use crate::config::subscription::{Farewell, Subscription, FAREWELL_TIMEOUT};
use crate::observe::access_log::AccessLog;
use crate::observe::log_output::{BatchedWriter, FlushGuard};
use crate::observe::{Tracing, SERVICE};
use crate::proxy::Proxy;
use crate::server::{self, Admin, LogLevelSetter};
use crate::Error;
use clap::Parser;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload as log_reload, EnvFilter};

#[cfg(test)]
mod reference;

/// Reprise sidecar: an HTTP proxy that retries safely.
#[derive(Debug, Parser)]
#[command(name = "reprise-sidecar", version, about)]
struct Args {
    /// Configuration file (the gateway `upstreams:` format, plus `rules:`).
    /// Without it the sidecar runs in Kubernetes mode and subscribes to the
    /// controller named by REPRISE_CONTROLLER.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Outbound proxy listener.
    #[arg(long, default_value = "127.0.0.1:15001")]
    listen: SocketAddr,
    /// Admin listener (/live, /ready, /config, /metrics). Keep it on localhost.
    #[arg(long, default_value = "127.0.0.1:15000")]
    admin: SocketAddr,
    /// Health listener serving only /live and /ready, for the kubelet's probes
    /// on the pod IP (the admin listener stays on localhost).
    #[arg(long)]
    health: Option<SocketAddr>,
    /// Transparent listener for connections redirected by the
    /// `reprise-sidecar iptables` rules, e.g. 127.0.0.1:15006. With an IPv4
    /// loopback address, [::1] on the same port is served too where the
    /// network namespace has IPv6 (ip6tables redirects there).
    #[arg(long)]
    transparent: Option<SocketAddr>,
    /// Validate the configuration and exit: 0 valid, 2 invalid. Opens no connection.
    #[arg(long)]
    check: bool,
    /// Log format: json (one JSON object per line) or text.
    #[arg(long, default_value = "json", value_parser = ["json", "text"])]
    log_format: String,
    /// A one-shot tool instead of the proxy.
    #[command(subcommand)]
    command: Option<Command>,
}

/// The one-shot tools; without one, the sidecar runs.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Install the nat rules of transparent mode in this network namespace.
    Iptables(crate::capture::IptablesArgs),
}

/// Raises the soft limit on open descriptors to the hard one, as Go's
/// runtime does at start: a proxied connection holds two (the client's and
/// the endpoint's), and the soft default containers often get (1,024) is
/// far below the proxy listener's connection cap. Past the limit, dials
/// fail as `local_resources`.
fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let (Some(soft), hard) = (limit.current, limit.maximum) else {
        return;
    };
    if hard.is_some_and(|hard| hard <= soft) {
        return;
    }
    let raised = rustix::process::Rlimit {
        current: hard,
        maximum: hard,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::debug!(from = soft, to = ?hard, "open descriptor limit raised"),
        Err(e) => tracing::warn!(soft, error = %e, "cannot raise the open descriptor limit"),
    }
}

/// Runs the sidecar with the process arguments; the exit code says how it ended.
pub fn main() -> ExitCode {
    let mut args = Args::parse();
    if let Some(Command::Iptables(a)) = args.command.take() {
        return crate::capture::main(a);
    }
    if args.check {
        let Some(config) = &args.config else {
            eprintln!("reprise-sidecar: --check needs --config FILE");
            return ExitCode::from(2);
        };
        return check(config);
    }
    let (set_log_level, access_log, _log_flush) = match init_logging(&args.log_format) {
        Ok(logging) => logging,
        Err(e) => {
            eprintln!("reprise-sidecar: cannot start the log writer: {e}");
            return ExitCode::FAILURE;
        }
    };
    let workers = worker_threads();
    let runtime = match build_runtime(workers) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("reprise-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    raise_descriptor_limit();
    tracing::info!(
        workers,
        scheduler = if workers == 1 {
            "current_thread"
        } else {
            "multi_thread"
        },
        "runtime"
    );
    let ran = runtime.block_on(run(args, set_log_level, access_log));
    // A blocking task stuck in a system call (a file on a hung network
    // mount) must not hold the exit after the drain.
    runtime.shutdown_timeout(BLOCKING_EXIT_WAIT);
    match ran {
        Ok(code) => code,
        Err(e) => {
            let why = error_chain(&e);
            eprintln!("reprise-sidecar: {why}");
            tracing::error!(error = %why, "exiting");
            ExitCode::FAILURE
        }
    }
}

/// Longest the exit waits for tasks of the blocking pool (a configuration
/// check) still running after the drain.
const BLOCKING_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Worker threads: `TOKIO_WORKER_THREADS` when set, else the CPUs this process
/// may use (the standard library counts the cgroup CPU quota, so a pod limited
/// to one CPU gets 1).
fn worker_threads() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Tasks the single-threaded scheduler polls between its looks for new I/O
/// and timer events while tasks are ready (tokio's default is 61). A
/// proxied request is a few short polls, so at 61 a busy sidecar called
/// `epoll_wait` often and read each socket as soon as a few frames were
/// there; at 250 it makes fewer system calls and spends less CPU per
/// request, and larger intervals gained nothing more. A ready socket waits
/// at most 250 short polls, and only while the sidecar is busy (an idle
/// runtime parks in `epoll_wait` at once, as before), and the tail latency
/// at a fixed rate did not grow (measured:
/// `e2e/bench/results/2026-12-03-issue18-bodies-and-h2c.md`).
const EVENT_INTERVAL: u32 = 250;

/// With one worker, the single-threaded scheduler: every task runs on the
/// thread that polls the listener, with no cross-thread wake-ups or work
/// stealing, which proxies more requests per CPU-second than the
/// multi-threaded scheduler with one worker (linkerd2-proxy makes the same
/// choice for one core).
fn build_runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
            .event_interval(EVENT_INTERVAL)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
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
/// are dropped instead. The guard flushes what is queued at exit. With JSON
/// logs, access log lines skip the formatter and are written to the same queue.
fn init_logging(format: &str) -> std::io::Result<(LogLevelSetter, AccessLog, FlushGuard)> {
    let filter = EnvFilter::try_from_env(reprise_crds::sidecar_env::LOG)
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = log_reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let (writer, guard) = BatchedWriter::spawn(std::io::stdout())?;
    let access_log = if format == "text" {
        registry
            .with(tracing_subscriber::fmt::layer().with_writer(writer))
            .init();
        AccessLog::Event
    } else {
        let access_log = AccessLog::Json(writer.clone());
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_writer(writer),
            )
            .init();
        access_log
    };
    let setter: LogLevelSetter = Arc::new(move |spec: &str| {
        let filter = EnvFilter::try_new(spec).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    });
    Ok((setter, access_log, guard))
}

/// Longest the exit waits for queued spans to reach the collector.
const TRACE_FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

async fn run(
    args: Args,
    set_log_level: LogLevelSetter,
    access_log: AccessLog,
) -> Result<ExitCode, Error> {
    let traces = match trace_retried()? {
        TraceRetried::Always => Tracing::from_env(SERVICE)?,
        TraceRetried::Sampled => Tracing::from_env(SERVICE)?.without_forcing(),
    };
    let (proxy, source) = match &args.config {
        Some(path) => {
            // The rule `--check` and the reloads read by: a file that cannot
            // be read is an error (exit 1), one that is refused exits 2.
            let file = match reprise_crds::file::read(path) {
                Ok(f) => f,
                Err(e @ reprise_crds::Error::Read { .. }) => return Err(e.into()),
                Err(e) => {
                    eprintln!("{e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let config = match reprise_crds::file::parse(&file.text, &path.display().to_string()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return Ok(ExitCode::from(2));
                }
            };
            (
                Proxy::with_telemetry(config, traces.clone(), access_log.clone()),
                Source::File(path.clone(), file),
            )
        }
        None => {
            let subscription = Subscription::from_env()?.ok_or(Error::NoConfigSource)?;
            // Serve the last good snapshot from disk while the controller is away.
            let (proxy, saved) = match subscription.load_saved() {
                Some((snapshot, config)) => {
                    tracing::info!(version = %snapshot.version, "serving the saved snapshot until the controller answers");
                    (
                        Proxy::with_telemetry(config, traces.clone(), access_log.clone()),
                        Some(snapshot),
                    )
                }
                None => {
                    // Nothing to route until the first snapshot: not ready.
                    let mut empty = reprise_crds::snapshot::Snapshot::new(Vec::new(), Vec::new())
                        .resolve()
                        .map_err(|source| reprise_crds::Error::Invalid {
                            path: "the empty snapshot".into(),
                            source,
                        })?;
                    subscription.adjust(&mut empty);
                    let proxy = Proxy::with_telemetry(empty, traces.clone(), access_log.clone());
                    proxy.set_ready(false);
                    (proxy, None)
                }
            };
            (proxy, Source::Controller(Box::new(subscription), saved))
        }
    };
    let bind = |addr: SocketAddr, what: &'static str| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, what, source })
    };
    let listener = bind(args.listen, "proxy").await?;
    let admin_listener = bind(args.admin, "admin").await?;
    if !args.admin.ip().is_loopback() {
        // The health listener is the one meant for the network.
        tracing::warn!(admin = %args.admin, "the admin listener is not on loopback: anyone who can reach it reads /config and changes the log level; keep it on 127.0.0.1 and use --health for probes and scrapes");
    }
    let mut transparent = Vec::new();
    if let Some(addr) = args.transparent {
        transparent.push(bind(addr, "transparent").await?);
        if addr.ip() == std::net::Ipv4Addr::LOCALHOST {
            let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port()));
            match tokio::net::TcpListener::bind(v6).await {
                Ok(l) => transparent.push(l),
                // No IPv6 in this network namespace: nothing to redirect there.
                Err(e) => tracing::info!(addr = %v6, error = %e, "no IPv6 transparent listener"),
            }
        }
    }
    let transparent_addrs: Vec<String> = transparent
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .collect();
    tracing::info!(listen = %args.listen, admin = %args.admin, transparent = ?transparent_addrs, tracing = traces.is_on(), "reprise-sidecar serving");
    tokio::spawn(server::serve_admin(
        admin_listener,
        Admin {
            proxy: Arc::clone(&proxy),
            set_log_level: Some(set_log_level),
            health_only: false,
        },
    ));
    if let Some(addr) = args.health {
        let health_listener = bind(addr, "health").await?;
        tokio::spawn(server::serve_admin(
            health_listener,
            Admin {
                proxy: Arc::clone(&proxy),
                set_log_level: None,
                health_only: true,
            },
        ));
    }
    let mut farewell = None;
    match source {
        Source::File(path, file) => {
            tokio::spawn(reload::watch(path, Arc::clone(&proxy), file));
        }
        Source::Controller(subscription, saved) => {
            let f = Farewell::default();
            tokio::spawn(subscription.run_until_farewell(Arc::clone(&proxy), saved, f.clone()));
            farewell = Some(f);
        }
    }
    let listeners = server::Listeners {
        proxy: listener,
        transparent,
        others: std::iter::once(args.admin).chain(args.health).collect(),
    };
    let drained = server::serve(listeners, Arc::clone(&proxy), shutdown_signal()).await;
    // What the drained requests came to, before the process is gone.
    if let Some(farewell) = farewell {
        let said = farewell.say(FAREWELL_TIMEOUT).await;
        tracing::info!(said, "final traffic report");
    }
    if !traces.shutdown(TRACE_FLUSH_TIMEOUT).await {
        tracing::warn!("queued spans did not reach the collector in time; they are lost");
    }
    tracing::info!(drained, "reprise-sidecar stopped");
    Ok(ExitCode::SUCCESS)
}

/// Whether a retried request's spans are exported when the sampler dropped
/// its trace (`REPRISE_TRACE_RETRIED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TraceRetried {
    /// `always` (the default): every request with more than one attempt.
    Always,
    /// `sampled`: only as the sampler decided.
    Sampled,
}

/// The variable that chooses [`TraceRetried`].
const TRACE_RETRIED: &str = "REPRISE_TRACE_RETRIED";

/// `REPRISE_TRACE_RETRIED`; anything but `always` or `sampled` is refused.
fn trace_retried() -> Result<TraceRetried, Error> {
    match std::env::var(TRACE_RETRIED).ok().as_deref().map(str::trim) {
        None | Some("") | Some("always") => Ok(TraceRetried::Always),
        Some("sampled") => Ok(TraceRetried::Sampled),
        Some(other) => Err(Error::Environment {
            variable: TRACE_RETRIED,
            rule: format!("must be always or sampled (got {other:?})"),
            source: None,
        }),
    }
}

/// Where the configuration comes from.
enum Source {
    /// A file, watched for changes, as the start read it.
    File(PathBuf, reprise_crds::file::FileText),
    /// The controller's snapshot stream.
    Controller(Box<Subscription>, Option<reprise_crds::snapshot::Snapshot>),
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

/// `e` and its sources, outermost first, as one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        line.push_str(": ");
        line.push_str(&s.to_string());
        source = s.source();
    }
    line
}
