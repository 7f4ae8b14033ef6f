//! The mid-run events and the sidecar processes they act on: the config
//! file's variants, one process per generation (on the test kit's harness),
//! and the schedule: rewrite 1 at 15% of the run, the restart at 25%, SIGHUP
//! at 40%, rewrite 2 at 60%.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use reprise_testkit::config::{
    Config, FailureBoundary, ProxyConfig, Retries, Rule, UpstreamConfig,
};
use reprise_testkit::prometheus::Metrics;
use reprise_testkit::sidecar::{Launch, Running, Stderr};
use tokio::task::JoinHandle;

use super::faults::Endpoint;
use super::load::{plan, run_one, Done, Meth, Pool, RestartClock};
use super::resources::{self, Usage};
use super::verdict::SidecarLogs;
use super::{admin_get, lock, now_ms, scrape, DEADLINE_MS, DRAIN_MS, REPLAY_CAP};

/// Requests sent just before the SIGTERM, held this long by the endpoint (under the 400 ms attempt timeout).
pub(crate) const DRAIN_PROBES: u64 = 30;
pub(crate) const DRAIN_PROBE_HOLD: Duration = Duration::from_millis(300);
/// Drain probes' ids start here (normal requests count from 1).
pub(crate) const PROBE_IDS: u64 = 1_000_000_000;

/// Variant 0 at start; 1 (first rewrite: budget 25%, other backoff and PUT
/// attempt timeout); 2 (second rewrite: connect timeout changed so every
/// endpoint's connection pool is rebuilt, endpoints listed in another order).
pub(crate) fn config_for(eps: &[Arc<Endpoint>], variant: u32) -> Config {
    let mut order: Vec<&Arc<Endpoint>> = eps.iter().collect();
    if variant == 2 {
        order.rotate_left(2);
    }
    let (budget, base, put_timeout, connect) = match variant {
        1 => (25.0, 15, 350, 1000),
        2 => (20.0, 10, 400, 800),
        _ => (20.0, 10, 400, 1000),
    };
    let api = order
        .iter()
        .fold(UpstreamConfig::new("api"), |u, e| {
            u.named_endpoint(e.up.addr, e.name)
        })
        .connect_ms(connect)
        .read_ms(400)
        .consecutive_failures(5)
        .ejection_ms(3000)
        .retries(
            Retries::new()
                .attempts(2)
                .budget_percent(budget)
                .backoff_base_ms(base)
                .backoff_cap_ms(100)
                .buffer_max_bytes(REPLAY_CAP as u64)
                .total_deadline_ms(DEADLINE_MS),
        );
    let puts = Rule::new("puts")
        .methods(["PUT"])
        .acknowledge_duplicate_risk(true)
        .failure_boundary(FailureBoundary::BeforeHeaders)
        .statuses(["gateway"])
        .attempts(2)
        .replay_limit_bytes(REPLAY_CAP as u64)
        .attempt_timeout_ms(put_timeout)
        .total_deadline_ms(DEADLINE_MS)
        .backoff_base_ms(base)
        .backoff_cap_ms(100);
    Config::from(api)
        .rule(puts)
        .proxy(ProxyConfig::new().drain_timeout_ms(DRAIN_MS))
}

/// Replaces the file atomically (write, then rename), as a ConfigMap update does.
pub(crate) fn write_config(path: &Path, config: &Config) -> anyhow::Result<()> {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, config.to_yaml())?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// How each sidecar process starts: same ports, logs per generation.
#[derive(Clone, Debug)]
pub(crate) struct Setup {
    pub launch: Launch,
    pub config: PathBuf,
    pub out: PathBuf,
    pub logs: Arc<SidecarLogs>,
}

impl Setup {
    /// Starts process number `gen`; its stdout goes to `sidecar-GEN.log` and
    /// into the logs' evidence, its stderr to `sidecar-GEN.stderr`.
    pub async fn start(&self, gen: u32) -> anyhow::Result<Process> {
        let logs = Arc::clone(&self.logs);
        let running = self
            .launch
            .clone()
            .stderr(Stderr::File(self.out.join(format!("sidecar-{gen}.stderr"))))
            .stdout_copy(self.out.join(format!("sidecar-{gen}.log")))
            .on_line(move |line| logs.record(line))
            .start()
            .await
            .with_context(|| format!("reprise-sidecar #{gen}; see {}", self.out.display()))?;
        Ok(Process { running, gen })
    }
}

/// One sidecar process.
#[derive(Debug)]
pub(crate) struct Process {
    running: Running,
    pub gen: u32,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.running.pid()
    }

    /// SIGTERM, then waits (bounded) for the exit; returns the exit code and how long it took.
    pub async fn stop(mut self) -> anyhow::Result<(Option<i32>, Duration)> {
        let limit = Duration::from_millis(DRAIN_MS) + Duration::from_secs(15);
        let exit = self
            .running
            .stop(limit)
            .await
            .with_context(|| format!("reprise-sidecar #{}", self.gen))?;
        Ok((exit.code, exit.took))
    }
}

#[derive(Debug, Default)]
pub(crate) struct EventLog {
    pub lines: Vec<String>,
    pub failures: Vec<String>,
    /// Metrics of each sidecar process, scraped just before its SIGTERM.
    pub metrics: Vec<Metrics>,
    pub exits: Vec<(u32, Option<i32>, Duration)>,
    pub sigterm_ms: u64,
    pub ready_again_ms: u64,
    /// Requests sent just before SIGTERM and held by the endpoints, so they are in flight during the drain.
    pub probes: Vec<Done>,
}

/// What the events act on.
pub(crate) struct Context {
    pub setup: Setup,
    pub eps: Vec<Arc<Endpoint>>,
    pub restart: Arc<RestartClock>,
    /// The pid the sampler reads (0 while no process serves).
    pub pid: Arc<AtomicU32>,
    pub samples: Arc<Mutex<Vec<Usage>>>,
    pub duration_ms: u64,
    pub pool: Pool,
}

type Outcome = anyhow::Result<(Process, EventLog)>;

/// The events task, running beside the traffic.
#[derive(Debug)]
pub(crate) struct Events {
    task: Option<JoinHandle<Outcome>>,
    done: Option<(Process, EventLog)>,
}

impl Events {
    /// Runs the events on `ctx`, starting with process `first`.
    pub fn spawn(ctx: Context, first: Process) -> Events {
        Events {
            task: Some(tokio::spawn(run_events(ctx, first))),
            done: None,
        }
    }

    /// Collects the task's result once it has finished; its error, if any.
    pub async fn check(&mut self) -> anyhow::Result<()> {
        if self.task.as_ref().is_some_and(JoinHandle::is_finished) {
            if let Some(task) = self.task.take() {
                self.done = Some(task.await.context("events task")??);
            }
        }
        Ok(())
    }

    /// Waits for the task; the process running at the end and the log.
    pub async fn finish(self) -> Outcome {
        match (self.done, self.task) {
            (Some(done), _) => Ok(done),
            (None, Some(task)) => task.await.context("events task")?,
            (None, None) => bail!("events task lost"),
        }
    }
}

fn reloads(m: &Metrics, result: &str) -> f64 {
    m.get("reprise_config_reloads_total", &[("result", result)])
        .unwrap_or(0.0)
}

async fn wait_reloads(admin: std::net::SocketAddr, want_ok: f64) -> anyhow::Result<Metrics> {
    for _ in 0..100 {
        if let Ok(m) = scrape(admin).await {
            if reloads(&m, "ok") >= want_ok || reloads(&m, "refused") > 0.0 {
                return Ok(m);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("no reload counted within 5 s (wanted reprise_config_reloads_total{{result=\"ok\"}} >= {want_ok})")
}

/// A reload the process must count as ok.
async fn reloaded(admin: std::net::SocketAddr, want_ok: f64) -> anyhow::Result<()> {
    let m = wait_reloads(admin, want_ok).await?;
    if reloads(&m, "refused") > 0.0 {
        bail!("refused");
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Rewrite(u32),
    Restart,
    Hangup,
}

/// Runs the events at their shares of the duration. Returns the sidecar
/// running at the end. Fails only when no sidecar could be started again.
async fn run_events(ctx: Context, first: Process) -> Outcome {
    let mut log = EventLog::default();
    let at = |f: f64| (ctx.duration_ms as f64 * f) as u64;
    let schedule = [
        (at(0.15), Event::Rewrite(1)),
        (at(0.25), Event::Restart),
        (at(0.40), Event::Hangup),
        (at(0.60), Event::Rewrite(2)),
    ];
    let admin = ctx.setup.launch.admin_addr();
    let mut current = Some(first);
    // Reloads counted by the running process.
    let mut expected_ok = 0.0;
    for (when, event) in schedule {
        tokio::time::sleep(Duration::from_millis(when.saturating_sub(now_ms()))).await;
        let t = now_ms() as f64 / 1000.0;
        let result: anyhow::Result<String> = match event {
            Event::Rewrite(variant) => {
                write_config(&ctx.setup.config, &config_for(&ctx.eps, variant))?;
                expected_ok += 1.0;
                match reloaded(admin, expected_ok).await {
                    Ok(()) => {
                        let cfg = admin_get(admin, "/config").await?.text();
                        let marker = if variant == 1 { "25.0" } else { "20.0" };
                        if cfg.contains(marker) {
                            Ok(format!(
                                "file rewritten (variant {variant}), reloaded; /config shows budget {marker}"
                            ))
                        } else {
                            Err(anyhow::anyhow!("/config does not show budget {marker}"))
                        }
                    }
                    Err(e) => Err(e),
                }
            }
            Event::Hangup => {
                current
                    .as_ref()
                    .context("no sidecar")?
                    .running
                    .signal("HUP")?;
                expected_ok += 1.0;
                reloaded(admin, expected_ok)
                    .await
                    .map(|()| "SIGHUP sent, forced reload counted".to_string())
            }
            Event::Restart => {
                let old = current.take().context("no sidecar")?;
                let (new, detail) = restart(&ctx, old, &mut log).await?;
                current = Some(new);
                expected_ok = 0.0;
                Ok(detail)
            }
        };
        match result {
            Ok(detail) => log.lines.push(format!("{t:>6.1} s  {detail}")),
            Err(e) => {
                log.failures.push(format!("{event:?} at {t:.1} s: {e:#}"));
                log.lines
                    .push(format!("{t:>6.1} s  {event:?}: FAILED: {e:#}"));
            }
        }
    }
    Ok((current.context("no sidecar")?, log))
}

/// Stops `old` with drain probes in flight and starts the next process on
/// the same ports; returns it and the event's line.
async fn restart(
    ctx: &Context,
    old: Process,
    log: &mut EventLog,
) -> anyhow::Result<(Process, String)> {
    if let Some(s) = resources::sample(old.pid(), old.gen) {
        lock(&ctx.samples).push(s);
    }
    if let Ok(m) = scrape(ctx.setup.launch.admin_addr()).await {
        log.metrics.push(m);
    }
    let gen = old.gen;
    // No periodic samples from here until the next process serves
    // (they would catch the probes, or a process that is exiting).
    ctx.pid.store(0, Ordering::SeqCst);
    // Drain probes: requests each endpoint holds for DRAIN_PROBE_HOLD,
    // sent so that they are in flight when SIGTERM arrives.
    let listen = ctx.setup.launch.listen_addr();
    let probes: Vec<_> = (0..DRAIN_PROBES)
        .map(|k| {
            let mut p = plan(PROBE_IDS + k);
            p.method = [Meth::Get, Meth::Post, Meth::Put][(k % 3) as usize];
            p.delay_ms = DRAIN_PROBE_HOLD.as_millis() as u64;
            if p.method == Meth::Get {
                p.body = Bytes::new();
            }
            tokio::spawn(run_one(
                ctx.pool.clone(),
                listen,
                p,
                Arc::clone(&ctx.restart),
            ))
        })
        .collect();
    tokio::time::sleep(DRAIN_PROBE_HOLD / 3).await;
    let sigterm = now_ms();
    ctx.restart.sigterm_ms.store(sigterm, Ordering::SeqCst);
    log.sigterm_ms = sigterm;
    let (code, took) = old.stop().await?;
    log.exits.push((gen, code, took));
    let exited = now_ms();
    let new = ctx.setup.start(gen + 1).await?;
    let ready = now_ms();
    ctx.restart.ready_ms.store(ready, Ordering::SeqCst);
    ctx.restart.generation.store(gen + 1, Ordering::SeqCst);
    log.ready_again_ms = ready;
    ctx.pid.store(new.pid(), Ordering::SeqCst);
    for probe in probes {
        if let Ok(done) = probe.await {
            log.probes.push(done);
        }
    }
    let detail = format!(
        "{DRAIN_PROBES} drain probes sent; SIGTERM to #{gen} at {:.3} s, exit {} after {} ms; #{} ready {} ms later (listener down {} ms)",
        sigterm as f64 / 1000.0,
        code.map_or("signal".to_string(), |c| c.to_string()),
        took.as_millis(),
        gen + 1,
        ready - exited,
        ready - sigterm
    );
    Ok((new, detail))
}
