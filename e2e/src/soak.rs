//! The soak test (`e2e/soak/run.sh`): mixed traffic at a fixed rate through the
//! real `reprise-sidecar` binary for a fixed time, in front of three loopback
//! endpoints whose faults change over time; the sidecar's configuration is
//! rewritten twice, reloaded once with SIGHUP, and the sidecar is restarted
//! once. At the end every request gets a verdict (success, failure the policy
//! allowed, or unexpected), POSTs delivered twice are counted, and the
//! sidecar's RSS and open file descriptors are compared with their values after
//! warm-up. Exits 1 when any check fails, 2 when the harness could not run.
//!
//! The parts: [`args`] (the command line), [`faults`] (the schedule and the
//! endpoints, on the test kit's upstream), [`load`] (client traffic),
//! [`events`] (rewrites, SIGHUP, the restart), [`resources`] (RSS and fd
//! samples), [`verdict`] (one request's verdict and the evidence it reads),
//! [`report`] (count, judge, format). This module holds the policy settings
//! they share, the clock, and the run.
//!
//! Everything runs on 127.0.0.1; every loop is bounded in count and in time.

mod args;
mod events;
mod faults;
mod load;
mod report;
mod resources;
mod verdict;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use reprise_testkit::http1::Response;
use reprise_testkit::prometheus::Metrics;
use reprise_testkit::sidecar::{self, free_addr, Launch};
use reprise_testkit::upstream::Deliveries;

use self::events::{EventLog, Events, Setup};
use self::faults::{Endpoint, Role};
use self::report::Report;

/// Bodies above this are not buffered by the PUT rule (`replay_limit_bytes`).
const REPLAY_CAP: usize = 16_384;
/// The policies' total deadline.
const DEADLINE_MS: u64 = 2_000;
/// The sidecar's drain timeout.
const DRAIN_MS: u64 = 5_000;
/// Longest one admin request may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

static T0: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the soak started.
fn now_ms() -> u64 {
    T0.get().map_or(0, |t| t.elapsed().as_millis() as u64)
}

/// `at` as milliseconds since the soak started.
fn ms_at(at: Instant) -> u64 {
    T0.get()
        .map_or(0, |t| at.saturating_duration_since(*t).as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `GET path` on the admin listener at `admin`, bounded by [`ADMIN_TIMEOUT`].
async fn admin_get(admin: std::net::SocketAddr, path: &str) -> anyhow::Result<Response> {
    tokio::time::timeout(
        ADMIN_TIMEOUT,
        reprise_testkit::client::get(admin, "admin", path),
    )
    .await
    .with_context(|| format!("{path}: no answer within {ADMIN_TIMEOUT:?}"))?
}

/// A `/metrics` scrape of the sidecar at `admin`.
async fn scrape(admin: std::net::SocketAddr) -> anyhow::Result<Metrics> {
    let r = admin_get(admin, "/metrics").await?;
    if r.status != 200 {
        bail!("/metrics answered {}", r.status);
    }
    Ok(Metrics::parse(&r.text())?)
}

/// Runs the soak; the exit code is the verdict.
#[tokio::main]
pub async fn main() -> ExitCode {
    let args = args::Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("reprise-soak: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: args::Args) -> anyhow::Result<bool> {
    let _ = T0.set(Instant::now());
    let out = args.out();
    std::fs::create_dir_all(&out)?;
    let duration_ms = args.secs * 1000;
    let warmup_ms = (duration_ms / 20).clamp(10_000, 30_000);

    let deliveries = Deliveries::default();
    let eps = vec![
        Endpoint::start("a-503", Role::Status503, &deliveries).await?,
        Endpoint::start("b-churn", Role::Churn, &deliveries).await?,
        Endpoint::start("c-transport", Role::Transport, &deliveries).await?,
    ];
    let config = out.join("reprise.yaml");
    events::write_config(&config, &events::config_for(&eps, 0))?;
    let bin =
        sidecar::binary("reprise-sidecar").context("build it first (e2e/soak/run.sh does)")?;
    let check = sidecar::check(&bin, &config);
    if !check.status.success() {
        bail!(
            "the soak configuration is refused:\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let setup = Setup {
        launch: Launch::new(&bin, &config)
            .listen(free_addr())
            .admin(free_addr())
            .health(None),
        config: config.clone(),
        out: out.clone(),
        logs: Arc::default(),
    };
    let listen = setup.launch.listen_addr();
    let first = setup.start(1).await?;
    println!(
        "== reprise-soak: {} s at {} req/s through reprise-sidecar on {} (admin {}); endpoints {}; logs in {}",
        args.secs,
        args.rate,
        listen,
        setup.launch.admin_addr(),
        eps.iter()
            .map(|e| format!("{} {}", e.name, e.up.addr))
            .collect::<Vec<_>>()
            .join(", "),
        out.display()
    );

    let churn_task = tokio::spawn(faults::churn(Arc::clone(&eps[1]), duration_ms));
    let restart = Arc::new(load::RestartClock::default());
    restart.generation.store(1, Ordering::SeqCst);
    let current_pid = Arc::new(AtomicU32::new(first.pid()));
    let samples: Arc<Mutex<Vec<resources::Usage>>> = Arc::default();
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = resources::spawn_sampler(
        Arc::clone(&current_pid),
        Arc::clone(&restart),
        Arc::clone(&samples),
        Arc::clone(&stop_sampling),
        duration_ms,
    );

    let pool = load::pool();
    let mut events = Events::spawn(
        events::Context {
            setup: setup.clone(),
            eps: eps.clone(),
            restart: Arc::clone(&restart),
            pid: Arc::clone(&current_pid),
            samples: Arc::clone(&samples),
            duration_ms,
            pool: pool.clone(),
        },
        first,
    );
    let traffic = load::drive(&args, listen, &pool, &restart, &mut events).await?;
    let traffic_end_ms = now_ms();
    let (last, mut event_log) = events.finish().await?;
    let churn_result = churn_task.await.context("churn task")?;
    stop_sampling.store(true, Ordering::SeqCst);
    sampler.abort();
    if let Some(s) = resources::sample(last.pid(), last.gen) {
        lock(&samples).push(s);
    }
    finish(&setup, last, &mut event_log, churn_result).await;
    for e in &eps {
        e.up.close();
    }

    let samples = lock(&samples).clone();
    let report = Report {
        secs: args.secs,
        rate: args.rate,
        eps: &eps,
        deliveries: &deliveries,
        results: &traffic.results,
        samples: &samples,
        events: &event_log,
        logs: &setup.logs,
        saturated: traffic.saturated,
        max_lag: traffic.max_lag,
        warmup_ms,
        traffic_end_ms,
    };
    let (text, pass) = report.render();
    println!("{text}");
    if let Some(path) = &args.summary {
        std::fs::write(path, &text)?;
    }
    Ok(pass)
}

/// The last process's metrics and exit, and the churn task's result, into the event log.
async fn finish(
    setup: &Setup,
    last: events::Process,
    log: &mut EventLog,
    churn: anyhow::Result<()>,
) {
    match scrape(setup.launch.admin_addr()).await {
        Ok(m) => log.metrics.push(m),
        Err(_) => log.failures.push("final /metrics scrape failed".into()),
    }
    let gen = last.gen;
    match last.stop().await {
        Ok((code, took)) => log.exits.push((gen, code, took)),
        Err(e) => log.failures.push(format!("{e:#}")),
    }
    if let Err(e) = churn {
        log.failures.push(format!("churn: {e:#}"));
    }
}
