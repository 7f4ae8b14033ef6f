//! The process harness for the real `reprise-sidecar` binary.
//!
//! Contract: a [`Launch`] holds what a start needs: the binary (the caller
//! names it: `env!("CARGO_BIN_EXE_reprise-sidecar")` in the sidecar's own
//! tests, [`binary`] elsewhere), the config file, the listen, admin and
//! health addresses (free loopback ports unless set), extra environment and
//! where stderr goes. [`Launch::start`] spawns it with `--config`, `--listen`,
//! `--admin` and `--health`, reads its stdout in the background (one line
//! each: kept in memory, copied to a file, or handed to a callback), and
//! returns once `/ready` answers 200 on the admin listener; it fails when the
//! process exits first or [`READY_WITHIN`] passes. [`Running::stop`] sends
//! SIGTERM and waits, bounded, for the exit and the last log line. A
//! [`Running`] dropped while the process lives kills it.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::client;
use crate::http1::Response;
use crate::prometheus::Metrics;

/// Longest a start waits for `/ready`; a loaded CI machine has taken more
/// than 5 s.
pub const READY_WITHIN: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

/// The ports [`free_addr`] hands out: below the kernel's ephemeral range
/// (32768 and up by default), so that no outgoing connection and no
/// `bind(…:0)` of another test takes one between the check and the child's
/// bind, and below Kubernetes' NodePorts (30000 and up).
const HANDED_OUT: std::ops::Range<u16> = 20000..30000;

/// The next candidate port of this process; starts at an offset drawn from
/// the process id so that test binaries run side by side rarely meet.
static NEXT_PORT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

/// A free port on 127.0.0.1 for a process started later. A port bound with
/// `:0` and released is the kernel's next ephemeral pick for anyone, so
/// parallel tests (and their clients' connections) used to take each other's
/// ports before the child bound them: a sidecar then exited at start. Ports
/// come from [`HANDED_OUT`] instead, each at most once per process, checked
/// free when handed out (a race with another process remains possible, and
/// loud).
pub fn free_addr() -> SocketAddr {
    use std::sync::atomic::Ordering;
    let span = u32::from(HANDED_OUT.end - HANDED_OUT.start);
    let _ = NEXT_PORT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(2_654_435_761) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let n = NEXT_PORT.fetch_add(1, Ordering::Relaxed) % span;
        let port = HANDED_OUT.start + u16::try_from(n).expect("below the span");
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().expect("its address");
        }
    }
    panic!("no free port on 127.0.0.1 in {HANDED_OUT:?}")
}

/// The built binary `name` of this workspace: next to the current executable
/// (`target/<profile>/`), or one folder up from a test executable
/// (`target/<profile>/deps/`).
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("the current executable")?;
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "{name} not found next to {}: build it first (cargo build -p reprise-sidecar)",
        exe.display()
    )
}

/// Writes `text` to `config.yaml` in a folder of its own for `label` (and this
/// process) under the temporary directory; returns the file's path.
pub fn write_temp(label: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reprise-test-{}-{label}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temporary folder");
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).expect("write the config file");
    path
}

/// Runs `bin --config config --check` to its end.
pub fn check(bin: &Path, config: &Path) -> Output {
    Command::new(bin)
        .arg("--config")
        .arg(config)
        .arg("--check")
        .output()
        .expect("run reprise-sidecar --check")
}

/// Where the process's stderr goes.
#[derive(Clone, Debug)]
pub enum Stderr {
    /// Discarded.
    Null,
    /// This process's stderr.
    Inherit,
    /// A file, created (or truncated).
    File(PathBuf),
}

type LineSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How to start the sidecar.
#[derive(Clone)]
pub struct Launch {
    bin: PathBuf,
    config: PathBuf,
    listen: SocketAddr,
    admin: SocketAddr,
    health: Option<SocketAddr>,
    env: Vec<(String, String)>,
    stderr: Stderr,
    stdout_copy: Option<PathBuf>,
    on_line: Option<LineSink>,
    /// A program (and its arguments) that runs the binary, e.g. `prlimit`.
    wrapper: Option<(String, Vec<String>)>,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("bin", &self.bin)
            .field("config", &self.config)
            .field("listen", &self.listen)
            .field("admin", &self.admin)
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

impl Launch {
    /// `bin` with `config`, on free loopback ports, stderr discarded, stdout
    /// lines kept in memory.
    pub fn new(bin: impl Into<PathBuf>, config: impl Into<PathBuf>) -> Launch {
        Launch {
            bin: bin.into(),
            config: config.into(),
            listen: free_addr(),
            admin: free_addr(),
            health: Some(free_addr()),
            env: Vec::new(),
            stderr: Stderr::Null,
            stdout_copy: None,
            on_line: None,
            wrapper: None,
        }
    }

    /// Runs the binary as `program args... BIN ...`: a program that sets
    /// something up and then executes it in its place (so the process id
    /// stays the sidecar's), such as `prlimit --nofile=256:4096`.
    pub fn wrapped_in(mut self, program: &str, args: &[&str]) -> Launch {
        self.wrapper = Some((
            program.to_string(),
            args.iter().map(|a| a.to_string()).collect(),
        ));
        self
    }

    field_setters! {
        /// The proxy listener (`--listen`).
        listen: SocketAddr,
        /// The admin listener (`--admin`).
        admin: SocketAddr,
        /// The health-only listener (`--health`), or none.
        health: Option<SocketAddr>,
        /// Where stderr goes.
        stderr: Stderr,
    }

    /// An environment variable for the process.
    pub fn env(mut self, name: &str, value: &str) -> Launch {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// Environment variables for the process.
    pub fn envs(self, vars: &[(&str, &str)]) -> Launch {
        vars.iter().fold(self, |l, (k, v)| l.env(k, v))
    }

    /// Also copies every stdout line to `path`.
    pub fn stdout_copy(mut self, path: impl Into<PathBuf>) -> Launch {
        self.stdout_copy = Some(path.into());
        self
    }

    /// Hands every stdout line to `sink` (on the reader thread) instead of
    /// keeping it in memory: a long run's log would not fit.
    pub fn on_line(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> Launch {
        self.on_line = Some(Arc::new(sink));
        self
    }

    /// The proxy listener's address.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// Starts the process and waits until it is ready.
    pub async fn start(&self) -> anyhow::Result<Running> {
        let mut cmd = match &self.wrapper {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&self.bin);
                cmd
            }
            None => Command::new(&self.bin),
        };
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("--config")
            .arg(&self.config)
            .args(["--listen", &self.listen.to_string()])
            .args(["--admin", &self.admin.to_string()]);
        if let Some(health) = self.health {
            cmd.args(["--health", &health.to_string()]);
        }
        cmd.stdout(Stdio::piped()).stderr(match &self.stderr {
            Stderr::Null => Stdio::null(),
            Stderr::Inherit => Stdio::inherit(),
            Stderr::File(path) => Stdio::from(
                std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?,
            ),
        });
        let copy = match &self.stdout_copy {
            Some(path) => Some(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?,
            )),
            None => None,
        };
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let stdout = child.stdout.take().context("the sidecar's stdout")?;
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let reader = {
            let (lines, sink) = (Arc::clone(&lines), self.on_line.clone());
            std::thread::spawn(move || read_lines(stdout, copy, sink, &lines))
        };
        let mut running = Running {
            child,
            listen: self.listen,
            admin: self.admin,
            health: self.health,
            lines,
            reader: Some(reader),
        };
        running.wait_ready().await?;
        Ok(running)
    }
}

/// Reads `stdout` to its end (the process's exit), line by line.
fn read_lines(
    stdout: std::process::ChildStdout,
    mut copy: Option<std::io::BufWriter<std::fs::File>>,
    sink: Option<LineSink>,
    lines: &Mutex<Vec<String>>,
) {
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(file) = copy.as_mut() {
            let _ = writeln!(file, "{line}");
        }
        match &sink {
            Some(sink) => sink(&line),
            None => lines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(line),
        }
    }
    if let Some(mut file) = copy {
        let _ = file.flush();
    }
}

/// How the process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// From the signal (or the wait) to the exit.
    pub took: Duration,
}

/// A running `reprise-sidecar`.
#[derive(Debug)]
pub struct Running {
    child: Child,
    /// The proxy listener.
    pub listen: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
    /// The health-only listener, if any.
    pub health: Option<SocketAddr>,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let rounds = READY_WITHIN.as_millis() / POLL.as_millis();
        for _ in 0..rounds {
            if self
                .admin_get("/ready")
                .await
                .is_ok_and(|r| r.status == 200)
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("reprise-sidecar exited before it was ready ({status})");
            }
            tokio::time::sleep(POLL).await;
        }
        let _ = self.child.kill();
        bail!(
            "reprise-sidecar was not ready on {} within {READY_WITHIN:?}",
            self.admin
        )
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`TERM`, `HUP`, ...).
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed");
        }
        Ok(())
    }

    /// `GET path` on the admin listener.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<Response> {
        client::get(self.admin, "admin", path).await
    }

    /// `PUT path` with `body` on the admin listener.
    pub async fn admin_put(&self, path: &str, body: &str) -> anyhow::Result<Response> {
        client::put(self.admin, "admin", path, body).await
    }

    /// A `/metrics` scrape.
    pub async fn metrics(&self) -> anyhow::Result<Metrics> {
        let r = self.admin_get("/metrics").await?;
        if r.status != 200 {
            bail!("/metrics answered {}", r.status);
        }
        Ok(Metrics::parse(&r.text())?)
    }

    /// Series `name` with exactly `labels` in a fresh scrape; `None` when the
    /// scrape fails or lacks it.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.metrics().await.ok()?.get(name, labels)
    }

    /// Scrapes every 50 ms until series `name{labels}` satisfies `done` or
    /// `within` passes; returns the last value seen.
    pub async fn wait_for_metric(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        within: Duration,
        done: impl Fn(f64) -> bool,
    ) -> Option<f64> {
        let started = Instant::now();
        let mut last = None;
        for _ in 0..=within.as_millis() / POLL.as_millis() {
            if let Some(v) = self.metric(name, labels).await {
                last = Some(v);
                if done(v) {
                    break;
                }
            }
            if started.elapsed() >= within {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        last
    }

    /// Stdout lines so far (none when a line sink was set).
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The JSON log events so far whose `target` is `target`.
    pub fn events(&self, target: &str) -> Vec<serde_json::Value> {
        self.lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == target)
            .collect()
    }

    /// Waits up to `within` for the process to exit (killing it after that),
    /// then for its last stdout line.
    pub async fn wait(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        let started = Instant::now();
        let rounds = within.as_millis() / 20 + 1;
        let mut status = None;
        for _ in 0..rounds {
            status = self.child.try_wait()?;
            if status.is_some() || started.elapsed() > within {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(status) = status else {
            let _ = self.child.kill();
            bail!("reprise-sidecar did not exit within {within:?}");
        };
        if let Some(reader) = self.reader.take() {
            let _ = tokio::task::spawn_blocking(move || reader.join()).await;
        }
        Ok(status)
    }

    /// SIGTERM, then [`Running::wait`].
    pub async fn stop(&mut self, within: Duration) -> anyhow::Result<Exit> {
        let started = Instant::now();
        self.signal("TERM")?;
        let status = self.wait(within).await?;
        Ok(Exit {
            code: status.code(),
            took: started.elapsed(),
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
