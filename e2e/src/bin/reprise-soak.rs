//! The soak test (`e2e/soak/run.sh`): mixed traffic at a fixed rate through the
//! real `reprise-sidecar` binary for a fixed time, in front of three loopback
//! endpoints whose faults change over time; the sidecar's configuration is
//! rewritten twice, reloaded once with SIGHUP, and the sidecar is restarted
//! once. At the end every request gets a verdict (success, failure the policy
//! allowed, or unexpected), POSTs delivered twice are counted, and the
//! sidecar's RSS and open file descriptors are compared with their values after
//! warm-up. Exits 1 when any check fails.
//!
//! Everything runs on 127.0.0.1; every loop is bounded in count and in time.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// ---------------------------------------------------------------------------
// Settings

/// Length of one fault cycle; the first `CALM_MS` of each cycle have no faults.
const CYCLE_MS: u64 = 60_000;
const CALM_MS: u64 = 10_000;
/// The churn endpoint's listener is closed during these parts of each cycle.
const B_DOWN: [(u64, u64); 2] = [(20_000, 23_000), (40_000, 45_000)];
/// A stalled attempt waits this long (the attempt timeout is 400 ms) and closes.
const STALL: Duration = Duration::from_millis(1_500);
/// Bodies above this are not buffered by the PUT rule (`replay_limit_bytes`).
const REPLAY_CAP: usize = 16_384;
const BIG_BODY: usize = 65_536;
const DRAIN_MS: u64 = 5_000;
/// Longest a client request (with body) may take before it counts as lost.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
const MAX_IN_FLIGHT: usize = 4_000;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// An attempt the churn endpoint never saw is explained by its downtime when
/// the request overlapped a down interval widened by this much.
const DOWN_SLACK_MS: u64 = 1_000;
/// Requests sent just before the SIGTERM, held this long by the endpoint (under the 400 ms attempt timeout).
const DRAIN_PROBES: u64 = 30;
const DRAIN_PROBE_HOLD: Duration = Duration::from_millis(300);
const PROBE_IDS: u64 = 1_000_000_000;
/// The policies' total deadline; an answer later than this plus the slack is unexpected.
const DEADLINE_MS: u64 = 2_000;
const LATE_SLACK_MS: u64 = 1_500;
const RSS_GROWTH_MAX: f64 = 0.20;
const FD_GROWTH_MAX: i64 = 20;
/// Upstream-side bounds.
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 1024 * 1024;
const MAX_REQUESTS_PER_CONN: usize = 1_000_000;
const MAX_ACCEPTS: usize = 10_000_000;
const UPSTREAM_IDLE: Duration = Duration::from_secs(120);

static T0: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the soak started.
fn now_ms() -> u64 {
    T0.get().map_or(0, |t| t.elapsed().as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// The fault schedule

/// Faults in force at one moment (percentages of requests).
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    a_503: u32,
    c_reset: u32,
    c_abort: u32,
    c_stall: u32,
    b_down: bool,
}

impl Faults {
    fn any(&self) -> bool {
        self.a_503 > 0 || self.c_reset > 0 || self.c_abort > 0 || self.c_stall > 0 || self.b_down
    }
}

/// Cycle k (60 s): 10 s calm, then faults whose strength rotates light, storm,
/// medium: endpoint a answers 503 to 20%, 90% or 50% of its requests; endpoint c
/// resets before headers, aborts mid-body or stalls (8%, 15% or 8% in all);
/// endpoint b's listener is closed from 20 s to 23 s and from 40 s to 45 s.
fn faults_at(t: u64) -> Faults {
    let k = (t / CYCLE_MS) % 3;
    let s = t % CYCLE_MS;
    if s < CALM_MS {
        return Faults::default();
    }
    let storm = k == 1;
    Faults {
        a_503: [20, 90, 50][k as usize],
        c_reset: if storm { 8 } else { 4 },
        c_abort: if storm { 3 } else { 2 },
        c_stall: if storm { 4 } else { 2 },
        b_down: B_DOWN.iter().any(|(from, to)| (*from..*to).contains(&s)),
    }
}

// ---------------------------------------------------------------------------
// Upstream endpoints: raw HTTP/1.1 so they can fail the way real servers do

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Answers 503 to a share of requests.
    Status503,
    /// Killed and restarted on the same port.
    Churn,
    /// Resets before headers, aborts mid-body, stalls.
    Transport,
}

/// What an endpoint did with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Act {
    Ok,
    S503,
    Reset,
    Abort,
    Stall,
}

impl Act {
    fn name(self) -> &'static str {
        match self {
            Act::Ok => "200",
            Act::S503 => "503",
            Act::Reset => "reset before headers",
            Act::Abort => "abort mid-body",
            Act::Stall => "stall",
        }
    }
}

/// One request as an endpoint received it.
#[derive(Clone, Debug)]
struct Rec {
    id: u64,
    method: String,
    t_ms: u64,
    act: Act,
    /// The whole answer was written (false: a fault, or killed while answering).
    done: bool,
    /// The body's checksum matched the client's `x-soak-sum`.
    body_ok: bool,
    /// `x-reprise-attempt`, 0 when absent.
    attempt: u32,
}

impl Rec {
    /// True when this delivery was a healthy, complete answer.
    fn healthy(&self) -> bool {
        self.act == Act::Ok && self.done
    }
}

#[derive(Debug)]
struct Endpoint {
    name: &'static str,
    role: Role,
    addr: SocketAddr,
    log: Mutex<Vec<Rec>>,
    accepted: AtomicU64,
    conns: Mutex<Vec<tokio::task::AbortHandle>>,
    accept_task: Mutex<Option<tokio::task::AbortHandle>>,
    /// Intervals (ms) during which the listener was closed; `u64::MAX` while down.
    down: Mutex<Vec<(u64, u64)>>,
}

impl Endpoint {
    async fn start(name: &'static str, role: Role) -> std::io::Result<Arc<Self>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let ep = Arc::new(Endpoint {
            name,
            role,
            addr: listener.local_addr()?,
            log: Mutex::default(),
            accepted: AtomicU64::new(0),
            conns: Mutex::default(),
            accept_task: Mutex::default(),
            down: Mutex::default(),
        });
        ep.listen(listener);
        Ok(ep)
    }

    fn listen(self: &Arc<Self>, listener: TcpListener) {
        let ep = Arc::clone(self);
        let task = tokio::spawn(async move {
            for _ in 0..MAX_ACCEPTS {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                ep.accepted.fetch_add(1, Ordering::Relaxed);
                let _ = stream.set_nodelay(true);
                let conn = tokio::spawn(serve_conn(Arc::clone(&ep), stream));
                let mut conns = lock(&ep.conns);
                conns.retain(|h| !h.is_finished());
                conns.push(conn.abort_handle());
            }
        });
        *lock(&self.accept_task) = Some(task.abort_handle());
    }

    /// Closes the listener and every connection, like a killed process.
    fn kill(&self) {
        if let Some(t) = lock(&self.accept_task).take() {
            t.abort();
        }
        for c in lock(&self.conns).drain(..) {
            c.abort();
        }
    }

    fn is_up(&self) -> bool {
        lock(&self.accept_task).is_some()
    }

    /// Opens the listener again on the same port.
    async fn revive(self: &Arc<Self>) -> anyhow::Result<()> {
        for _ in 0..50 {
            match TcpListener::bind(self.addr).await {
                Ok(l) => {
                    self.listen(l);
                    return Ok(());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        bail!("{}: cannot listen on {} again", self.name, self.addr)
    }

    /// True when the listener was down at some moment in `[from, to]` (widened by the slack).
    fn was_down(&self, from: u64, to: u64) -> bool {
        let from = from.saturating_sub(DOWN_SLACK_MS);
        let to = to.saturating_add(DOWN_SLACK_MS);
        lock(&self.down).iter().any(|(d, u)| *d <= to && *u >= from)
    }

    fn choose(&self, f: Faults) -> Act {
        let roll = rand::rng().random_range(0..100u32);
        match self.role {
            Role::Churn => Act::Ok,
            Role::Status503 if roll < f.a_503 => Act::S503,
            Role::Status503 => Act::Ok,
            Role::Transport if roll < f.c_reset => Act::Reset,
            Role::Transport if roll < f.c_reset + f.c_abort => Act::Abort,
            Role::Transport if roll < f.c_reset + f.c_abort + f.c_stall => Act::Stall,
            Role::Transport => Act::Ok,
        }
    }
}

/// The churn endpoint follows the schedule: every 100 ms, closes or reopens its
/// listener. Ends at `until_ms`.
async fn churn(ep: Arc<Endpoint>, until_ms: u64) -> anyhow::Result<()> {
    let ticks = until_ms / 100 + 10;
    for _ in 0..ticks {
        let now = now_ms();
        if now >= until_ms {
            break;
        }
        let want_down = faults_at(now).b_down;
        if want_down && ep.is_up() {
            ep.kill();
            lock(&ep.down).push((now, u64::MAX));
        } else if !want_down && !ep.is_up() {
            ep.revive().await?;
            if let Some(last) = lock(&ep.down).last_mut() {
                last.1 = now_ms();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !ep.is_up() {
        ep.revive().await?;
        if let Some(last) = lock(&ep.down).last_mut() {
            last.1 = now_ms();
        }
    }
    Ok(())
}

struct UpReq {
    method: String,
    id: u64,
    sum: Option<u64>,
    resp_size: usize,
    attempt: u32,
    delay_ms: u64,
    body: Vec<u8>,
}

async fn serve_conn(ep: Arc<Endpoint>, mut stream: TcpStream) {
    let mut buf = Vec::with_capacity(8192);
    for _ in 0..MAX_REQUESTS_PER_CONN {
        let req =
            match tokio::time::timeout(UPSTREAM_IDLE, read_request(&mut stream, &mut buf)).await {
                Ok(Ok(Some(r))) => r,
                _ => return,
            };
        // Processing time: what the client asked for (drain probes), and on the
        // churn endpoint a few ms so that a kill can catch answers in progress.
        let delay = if ep.role == Role::Churn {
            req.delay_ms + rand::rng().random_range(0..20)
        } else {
            req.delay_ms
        };
        let t_ms = now_ms();
        let act = ep.choose(faults_at(t_ms));
        let body_ok = req.sum.is_none_or(|s| s == fnv1a(&req.body));
        let idx = {
            let mut log = lock(&ep.log);
            log.push(Rec {
                id: req.id,
                method: req.method.clone(),
                t_ms,
                act,
                done: false,
                body_ok,
                attempt: req.attempt,
            });
            log.len() - 1
        };
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        match act {
            Act::Ok | Act::S503 => {
                let (status, line) = if act == Act::Ok {
                    ("200 OK", format!("ok {} {}\n", req.id, ep.name))
                } else {
                    (
                        "503 Service Unavailable",
                        format!("unavailable {} {}\n", req.id, ep.name),
                    )
                };
                let mut body = line.into_bytes();
                if act == Act::Ok && req.resp_size > body.len() {
                    body.resize(req.resp_size, b'.');
                }
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nx-soak-endpoint: {}\r\n\r\n",
                    body.len(),
                    ep.name
                );
                let mut out = head.into_bytes();
                out.extend_from_slice(&body);
                if stream.write_all(&out).await.is_err() || stream.flush().await.is_err() {
                    return;
                }
                lock(&ep.log)[idx].done = true;
            }
            Act::Reset => {
                let _ = stream.set_zero_linger();
                return;
            }
            Act::Abort => {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4096\r\n\r\npartial body, then a reset")
                    .await;
                let _ = stream.flush().await;
                tokio::time::sleep(Duration::from_millis(10)).await;
                let _ = stream.set_zero_linger();
                return;
            }
            Act::Stall => {
                tokio::time::sleep(STALL).await;
                return;
            }
        }
    }
}

async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 16 * 1024];
    let n = s.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

/// Reads one request (head and body, Content-Length or chunked); `None` on a clean close.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<UpReq>> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(bad("head too large"));
        }
        if read_more(s, buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(bad("eof in head"))
            };
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let mut lines = head.split("\r\n");
    let method = lines
        .next()
        .and_then(|l| l.split(' ').next())
        .unwrap_or("")
        .to_string();
    let (mut length, mut chunked, mut id, mut sum, mut resp_size, mut attempt, mut delay_ms) =
        (0usize, false, 0u64, None, 0usize, 0u32, 0u64);
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = v.parse().map_err(|_| bad("content-length"))?,
            "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
            "x-soak-id" => id = v.parse().unwrap_or(0),
            "x-soak-sum" => sum = u64::from_str_radix(v, 16).ok(),
            "x-soak-resp" => resp_size = v.parse().unwrap_or(0),
            "x-reprise-attempt" => attempt = v.parse().unwrap_or(0),
            "x-soak-delay-ms" => delay_ms = v.parse::<u64>().unwrap_or(0).min(2_000),
            _ => {}
        }
    }
    let body = if chunked {
        read_chunked(s, buf).await?
    } else {
        if length > MAX_BODY {
            return Err(bad("body too large"));
        }
        while buf.len() < length {
            if read_more(s, buf).await? == 0 {
                return Err(bad("eof in body"));
            }
        }
        buf.drain(..length).collect()
    };
    Ok(Some(UpReq {
        method,
        id,
        sum,
        resp_size,
        attempt,
        delay_ms,
        body,
    }))
}

async fn read_chunked(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    // Each round consumes one chunk; the body limit bounds the rounds.
    for _ in 0..=MAX_BODY {
        let line_end = loop {
            if let Some(i) = find(buf, b"\r\n") {
                break i;
            }
            if buf.len() > MAX_HEAD || read_more(s, buf).await? == 0 {
                return Err(bad("chunk size line"));
            }
        };
        let text = String::from_utf8_lossy(&buf[..line_end]).to_string();
        let size = usize::from_str_radix(text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("chunk size"))?;
        buf.drain(..line_end + 2);
        if size == 0 {
            // Trailers, then an empty line.
            for _ in 0..64 {
                let end = loop {
                    if let Some(i) = find(buf, b"\r\n") {
                        break i;
                    }
                    if buf.len() > MAX_HEAD || read_more(s, buf).await? == 0 {
                        return Err(bad("trailers"));
                    }
                };
                buf.drain(..end + 2);
                if end == 0 {
                    return Ok(body);
                }
            }
            return Err(bad("too many trailers"));
        }
        if body.len() + size > MAX_BODY {
            return Err(bad("body too large"));
        }
        while buf.len() < size + 2 {
            if read_more(s, buf).await? == 0 {
                return Err(bad("eof in chunk"));
            }
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
    Err(bad("too many chunks"))
}

fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

// ---------------------------------------------------------------------------
// The sidecar process

/// One request event from the sidecar's access log.
#[derive(Clone, Debug, Default)]
struct LogEntry {
    outcome: String,
    reason: String,
    attempts: u32,
    endpoints: String,
    status: u16,
    /// Access-log events seen for this id (a resend makes a second one only
    /// if the first send reached the sidecar).
    lines: u32,
}

#[derive(Debug, Default)]
struct SidecarLogs {
    by_id: Mutex<HashMap<u64, LogEntry>>,
    request_lines: AtomicU64,
    /// `LEVEL message` of every warn/error line, counted.
    notable: Mutex<BTreeMap<String, u64>>,
}

#[derive(Debug)]
struct Sidecar {
    child: Child,
    pid: u32,
    gen: u32,
    reader: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone, Debug)]
struct SidecarSetup {
    bin: PathBuf,
    config: PathBuf,
    listen: SocketAddr,
    admin: SocketAddr,
    out: PathBuf,
    logs: Arc<SidecarLogs>,
}

impl SidecarSetup {
    async fn start(&self, gen: u32) -> anyhow::Result<Sidecar> {
        let log_path = self.out.join(format!("sidecar-{gen}.log"));
        let stderr = std::fs::File::create(self.out.join(format!("sidecar-{gen}.stderr")))?;
        let mut child = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .args(["--listen", &self.listen.to_string()])
            .args(["--admin", &self.admin.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let stdout = child.stdout.take().context("sidecar stdout")?;
        let logs = Arc::clone(&self.logs);
        let mut file = std::io::BufWriter::new(std::fs::File::create(&log_path)?);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(file, "{line}");
                record_log_line(&logs, &line);
            }
            let _ = file.flush();
        });
        let pid = child.id();
        let mut sidecar = Sidecar {
            child,
            pid,
            gen,
            reader: Some(reader),
        };
        for _ in 0..200 {
            if admin_get(self.admin, "/ready")
                .await
                .is_ok_and(|(s, _)| s == 200)
            {
                return Ok(sidecar);
            }
            if let Ok(Some(status)) = sidecar.child.try_wait() {
                bail!(
                    "reprise-sidecar #{gen} exited at start ({status}); see {}",
                    self.out.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = sidecar.child.kill();
        bail!(
            "reprise-sidecar #{gen} did not become ready on {}",
            self.admin
        )
    }
}

impl Sidecar {
    /// SIGTERM, then waits (bounded) for the exit; returns the exit code and how long it took.
    async fn stop(mut self) -> anyhow::Result<(Option<i32>, Duration)> {
        let started = Instant::now();
        signal(self.pid, "TERM")?;
        let limit = Duration::from_millis(DRAIN_MS) + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                bail!(
                    "reprise-sidecar #{} did not exit within {limit:?} of SIGTERM",
                    self.gen
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let took = started.elapsed();
        if let Some(r) = self.reader.take() {
            let _ = tokio::task::spawn_blocking(move || r.join()).await;
        }
        Ok((status.code(), took))
    }
}

fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -{sig} {pid} failed");
    }
    Ok(())
}

fn record_log_line(logs: &SidecarLogs, line: &str) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        *lock(&logs.notable)
            .entry("(not JSON) ".to_string() + line.get(..80).unwrap_or(line))
            .or_default() += 1;
        return;
    };
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    if s("target") == "reprise::request" {
        logs.request_lines.fetch_add(1, Ordering::Relaxed);
        let Some(id) = s("path")
            .strip_prefix("/r/")
            .and_then(|i| i.parse::<u64>().ok())
        else {
            return;
        };
        let mut by_id = lock(&logs.by_id);
        let lines = by_id.get(&id).map_or(0, |e| e.lines) + 1;
        by_id.insert(
            id,
            LogEntry {
                outcome: s("outcome"),
                reason: s("reason"),
                attempts: n("attempts") as u32,
                endpoints: s("endpoints"),
                status: n("status") as u16,
                lines,
            },
        );
        return;
    }
    let level = s("level");
    if level == "WARN" || level == "ERROR" {
        let msg = s("message");
        *lock(&logs.notable)
            .entry(format!("{level} {msg}"))
            .or_default() += 1;
    }
}

/// GET on the admin listener; (status, body).
async fn admin_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let io = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        anyhow::Ok(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(5), io).await??;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.get(9..12).context("short response")?.parse()?;
    Ok((
        status,
        text.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    ))
}

/// The counters of one metrics scrape: `name{labels}` -> value.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn reloads_ok(m: &BTreeMap<String, f64>) -> f64 {
    m.get("reprise_config_reloads_total{result=\"ok\"}")
        .copied()
        .unwrap_or(0.0)
}

fn reloads_refused(m: &BTreeMap<String, f64>) -> f64 {
    m.get("reprise_config_reloads_total{result=\"refused\"}")
        .copied()
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------
// The configuration file

/// Variant 0 at start; 1 (first rewrite: budget 25%, other backoff and PUT
/// attempt timeout); 2 (second rewrite: connect timeout changed so every
/// endpoint's connection pool is rebuilt, endpoints listed in another order).
fn config_yaml(eps: &[Arc<Endpoint>], variant: u32) -> String {
    let mut order: Vec<&Arc<Endpoint>> = eps.iter().collect();
    if variant == 2 {
        order.rotate_left(2);
    }
    let endpoints: String = order
        .iter()
        .map(|e| {
            format!(
                "      - {{ address: 127.0.0.1, port: {}, name: {} }}\n",
                e.addr.port(),
                e.name
            )
        })
        .collect();
    let (budget, base, put_timeout, connect) = match variant {
        1 => (25, 15, 350, 1000),
        2 => (20, 10, 400, 800),
        _ => (20, 10, 400, 1000),
    };
    format!(
        "# reprise-soak, variant {variant}
upstreams:
  - name: api
    endpoints:
{endpoints}    timeouts: {{ connect_ms: {connect}, read_ms: 400 }}
    passive_health: {{ consecutive_failures: 5, ejection_ms: 3000 }}
    retries:
      attempts: 2
      budget_percent: {budget}
      backoff_base_ms: {base}
      backoff_cap_ms: 100
      buffer_max_bytes: {REPLAY_CAP}
      total_deadline_ms: {DEADLINE_MS}
rules:
  - id: puts
    methods: [PUT]
    acknowledge_duplicate_risk: true
    failure_boundary: before_headers
    statuses: [gateway]
    attempts: 2
    replay_limit_bytes: {REPLAY_CAP}
    attempt_timeout_ms: {put_timeout}
    total_deadline_ms: {DEADLINE_MS}
    backoff_base_ms: {base}
    backoff_cap_ms: 100
proxy:
  drain_timeout_ms: {DRAIN_MS}
"
    )
}

/// Replaces the file atomically (write, then rename), as a ConfigMap update does.
fn write_config(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Client traffic

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Meth {
    Get,
    Post,
    Put,
}

impl Meth {
    fn as_str(self) -> &'static str {
        match self {
            Meth::Get => "GET",
            Meth::Post => "POST",
            Meth::Put => "PUT",
        }
    }

    /// Attempts the policy allows: two retries for GET (the upstream's block) and
    /// PUT (rule `puts`), none for POST.
    fn max_attempts(self) -> usize {
        match self {
            Meth::Get | Meth::Put => 3,
            Meth::Post => 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnMode {
    /// A keep-alive connection from the client's pool.
    Pooled,
    /// A new connection with `Connection: close`.
    Fresh,
}

#[derive(Clone, Debug)]
struct Planned {
    id: u64,
    method: Meth,
    body: Bytes,
    resp_size: usize,
    conn: ConnMode,
    /// Asks the endpoint to take this long (drain probes).
    delay_ms: u64,
}

fn plan(id: u64) -> Planned {
    let mut rng = rand::rng();
    let method = match rng.random_range(0..100) {
        0..55 => Meth::Get,
        55..75 => Meth::Post,
        _ => Meth::Put,
    };
    let body_len = match (method, rng.random_range(0..100)) {
        (Meth::Get, _) => 0,
        (_, 0..15) => 0,
        (_, 15..95) => rng.random_range(16..2048),
        _ => BIG_BODY,
    };
    let body: Vec<u8> = (0..body_len)
        .map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789"[(i + id as usize) % 36])
        .collect();
    let resp_size = if rng.random_range(0..10) == 0 {
        16_384
    } else {
        0
    };
    let conn = if rng.random_range(0..100) < 15 {
        ConnMode::Fresh
    } else {
        ConnMode::Pooled
    };
    Planned {
        id,
        method,
        body: Bytes::from(body),
        resp_size,
        conn,
        delay_ms: 0,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ErrKind {
    Refused,
    Closed,
    Reset,
    Timeout,
    Other,
}

#[derive(Clone, Debug)]
enum BodyCheck {
    Complete,
    /// The body arrived whole but is not this request's answer.
    Mismatch,
    /// The body failed after the headers.
    Cut,
}

/// What the client saw for one send.
#[derive(Clone, Debug)]
struct Seen {
    t_start: u64,
    t_end: u64,
    status: Option<u16>,
    reprise_error: Option<String>,
    body: Option<BodyCheck>,
    error: Option<(ErrKind, String)>,
}

#[derive(Clone, Debug)]
struct Done {
    id: u64,
    method: Meth,
    body_len: usize,
    conn: ConnMode,
    first: Seen,
    /// The resend after the sidecar came back, when the first send was refused during the restart.
    resent: Option<Seen>,
}

impl Done {
    fn last(&self) -> &Seen {
        self.resent.as_ref().unwrap_or(&self.first)
    }
}

type Pool = Client<HttpConnector, Full<Bytes>>;

/// The restart as the clients see it.
#[derive(Debug, Default)]
struct RestartClock {
    sigterm_ms: AtomicU64,
    ready_ms: AtomicU64,
    generation: AtomicU32,
}

async fn send(pool: &Pool, listen: SocketAddr, p: &Planned) -> Seen {
    let t_start = now_ms();
    let req = http::Request::builder()
        .method(p.method.as_str())
        .header("host", "api")
        .header("x-soak-id", p.id.to_string())
        .header("x-soak-sum", format!("{:x}", fnv1a(&p.body)))
        .header("x-soak-resp", p.resp_size.to_string())
        .header("x-soak-delay-ms", p.delay_ms.to_string());
    let result = tokio::time::timeout(CLIENT_TIMEOUT, async {
        let response = match p.conn {
            ConnMode::Pooled => {
                let req = req
                    .uri(format!("http://{listen}/r/{}", p.id))
                    .body(Full::new(p.body.clone()))
                    .map_err(|e| (ErrKind::Other, e.to_string()))?;
                pool.request(req)
                    .await
                    .map_err(|e| classify_pool_error(&e))?
            }
            ConnMode::Fresh => {
                let stream = TcpStream::connect(listen).await.map_err(|e| {
                    let kind = if e.kind() == std::io::ErrorKind::ConnectionRefused {
                        ErrKind::Refused
                    } else {
                        ErrKind::Other
                    };
                    (kind, e.to_string())
                })?;
                let _ = stream.set_nodelay(true);
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .map_err(|e| classify_hyper_error(&e))?;
                tokio::spawn(conn);
                let req = req
                    .uri(format!("/r/{}", p.id))
                    .header("connection", "close")
                    .body(Full::new(p.body.clone()))
                    .map_err(|e| (ErrKind::Other, e.to_string()))?;
                sender
                    .send_request(req)
                    .await
                    .map_err(|e| classify_hyper_error(&e))?
            }
        };
        let status = response.status().as_u16();
        let reprise_error = response
            .headers()
            .get("x-reprise-error")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = match response.into_body().collect().await {
            Ok(b) => {
                let b = b.to_bytes();
                let ok = if status == 200 {
                    let prefix = format!("ok {} ", p.id);
                    b.starts_with(prefix.as_bytes()) && (p.resp_size == 0 || b.len() == p.resp_size)
                } else {
                    true
                };
                if ok {
                    BodyCheck::Complete
                } else {
                    BodyCheck::Mismatch
                }
            }
            Err(_) => BodyCheck::Cut,
        };
        Ok::<_, (ErrKind, String)>((status, reprise_error, body))
    })
    .await;
    let t_end = now_ms();
    match result {
        Ok(Ok((status, reprise_error, body))) => Seen {
            t_start,
            t_end,
            status: Some(status),
            reprise_error,
            body: Some(body),
            error: None,
        },
        Ok(Err(e)) => Seen {
            t_start,
            t_end,
            status: None,
            reprise_error: None,
            body: None,
            error: Some(e),
        },
        Err(_) => Seen {
            t_start,
            t_end,
            status: None,
            reprise_error: None,
            body: None,
            error: Some((ErrKind::Timeout, format!("no answer in {CLIENT_TIMEOUT:?}"))),
        },
    }
}

fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    for _ in 0..16 {
        let e = source?;
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        source = e.source();
    }
    None
}

fn classify_pool_error(e: &hyper_util::client::legacy::Error) -> (ErrKind, String) {
    let text = format!("{e:?}");
    if e.is_connect() {
        let kind = if io_kind(e) == Some(std::io::ErrorKind::ConnectionRefused) {
            ErrKind::Refused
        } else {
            ErrKind::Other
        };
        return (kind, text);
    }
    let mut source = std::error::Error::source(e);
    for _ in 0..16 {
        let Some(s) = source else { break };
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            return classify_hyper_error(h);
        }
        source = s.source();
    }
    (ErrKind::Other, text)
}

fn classify_hyper_error(e: &hyper::Error) -> (ErrKind, String) {
    let kind = if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        ErrKind::Closed
    } else if matches!(
        io_kind(e),
        Some(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)
    ) {
        ErrKind::Reset
    } else {
        ErrKind::Other
    };
    (kind, format!("{e:?}"))
}

/// Sends one planned request; a send refused while the sidecar restarts is
/// sent again once it is back.
async fn run_one(pool: Pool, listen: SocketAddr, p: Planned, restart: Arc<RestartClock>) -> Done {
    let gen_at_start = restart.generation.load(Ordering::SeqCst);
    let first = send(&pool, listen, &p).await;
    let mut resent = None;
    let sigterm = restart.sigterm_ms.load(Ordering::SeqCst);
    let ready = restart.ready_ms.load(Ordering::SeqCst);
    let in_window =
        sigterm > 0 && first.t_end >= sigterm && (ready < sigterm || first.t_start <= ready);
    // Sent again once the sidecar is back: a send refused while it was down, and
    // a send started after SIGTERM whose connection closed with no answer (an
    // idle keep-alive connection the drain closed). The verdict checks that
    // neither first send reached the sidecar or an endpoint.
    let resend = match &first.error {
        Some((ErrKind::Refused, _)) => in_window,
        Some((ErrKind::Closed | ErrKind::Reset, _)) => in_window && first.t_start >= sigterm,
        _ => false,
    };
    {
        if resend {
            // Wait (bounded) for the next sidecar, then send again.
            for _ in 0..1200 {
                if restart.generation.load(Ordering::SeqCst) > gen_at_start
                    && restart.ready_ms.load(Ordering::SeqCst) >= sigterm
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Clients come back spread over a second, not all at once.
            let jitter = rand::rng().random_range(0..1000);
            tokio::time::sleep(Duration::from_millis(jitter)).await;
            resent = Some(send(&pool, listen, &p).await);
        }
    }
    Done {
        id: p.id,
        method: p.method,
        body_len: p.body.len(),
        conn: p.conn,
        first,
        resent,
    }
}

// ---------------------------------------------------------------------------
// Samples of the sidecar's resources

#[derive(Clone, Copy, Debug)]
struct Sample {
    t_ms: u64,
    gen: u32,
    rss_kib: u64,
    fds: i64,
    threads: u64,
}

fn sample(pid: u32, gen: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as i64;
    Some(Sample {
        t_ms: now_ms(),
        gen,
        rss_kib: field("VmRSS:")?,
        fds,
        threads: field("Threads:")?,
    })
}

// ---------------------------------------------------------------------------
// Verdicts

#[derive(Clone, Debug)]
enum Verdict {
    Success,
    Allowed(String),
    Unexpected(String),
}

struct Evidence<'a> {
    eps: &'a [Arc<Endpoint>],
    recs: &'a HashMap<u64, Vec<(usize, Rec)>>,
    logs: &'a HashMap<u64, LogEntry>,
}

/// A request the client saw fail is allowed to fail when the policy explains it:
///
/// 1. the client got an answer (a status, or headers and a body cut mid-way);
/// 2. the sidecar logged the request with that status, and no endpoint gave
///    it a complete healthy answer;
/// 3. every attempt the sidecar made (the log's `endpoints`) met an injected
///    fault: the endpoint recorded a 503, reset, stall, mid-body abort or a
///    kill while answering for this request id, or the attempt went to the
///    churn endpoint while its listener was closed (the request overlapped a
///    down interval, +-1 s);
/// 4. no more attempts than the policy allows (3 for GET and PUT, 1 for POST);
/// 5. the sidecar's outcome is one the policy permits for the method: GET and
///    PUT `exhausted` (attempts, budget, deadline, no_alternate), PUT over the
///    replay cap `skipped/body_consumed`, POST `skipped/method`; a body cut
///    after the headers needs an injected abort as the last delivery (bodies
///    are never retried once headers went out).
///
/// Anything else is unexpected.
fn verdict(d: &Done, ev: &Evidence<'_>) -> Verdict {
    let seen = d.last();
    let empty = Vec::new();
    let recs = ev.recs.get(&d.id).unwrap_or(&empty);
    if let Some(again) = &d.resent {
        // The first send must have reached nothing, or the resend duplicated it.
        if recs.iter().any(|(_, r)| r.t_ms < again.t_start) {
            return Verdict::Unexpected(
                "first send (failed during the restart) reached an endpoint; the resend duplicated it"
                    .into(),
            );
        }
        if ev.logs.get(&d.id).is_some_and(|l| l.lines > 1) {
            return Verdict::Unexpected(
                "first send (failed during the restart) was logged by the sidecar; the resend duplicated it"
                    .into(),
            );
        }
    }
    if recs.iter().any(|(_, r)| !r.body_ok) {
        return Verdict::Unexpected("request body arrived corrupted at an endpoint".into());
    }
    if d.method == Meth::Post && recs.len() > 1 {
        return Verdict::Unexpected(format!("POST delivered {} times", recs.len()));
    }
    if recs.len() > d.method.max_attempts() {
        return Verdict::Unexpected(format!(
            "{} delivered {} times (policy allows {})",
            d.method.as_str(),
            recs.len(),
            d.method.max_attempts()
        ));
    }
    if d.method != Meth::Post {
        let mut at: Vec<usize> = recs.iter().map(|(i, _)| *i).collect();
        at.sort_unstable();
        if at.windows(2).any(|w| w[0] == w[1]) {
            return Verdict::Unexpected(
                "retried on an endpoint it had already tried (reuse_endpoints is off)".into(),
            );
        }
    }
    let took = seen.t_end.saturating_sub(seen.t_start);
    if d.id < PROBE_IDS && seen.error.is_none() && took > DEADLINE_MS + LATE_SLACK_MS {
        return Verdict::Unexpected(format!(
            "answered after {took} ms; the total deadline is {DEADLINE_MS} ms"
        ));
    }
    let (Some(status), Some(body)) = (seen.status, seen.body.as_ref()) else {
        let (kind, text) = seen
            .error
            .clone()
            .unwrap_or((ErrKind::Other, String::new()));
        return Verdict::Unexpected(format!("no answer ({kind:?}): {}", short(&text)));
    };
    if (200..300).contains(&status) {
        match body {
            BodyCheck::Complete => return Verdict::Success,
            BodyCheck::Mismatch => {
                return Verdict::Unexpected("200 with another request's body".into())
            }
            BodyCheck::Cut => {
                let last = recs.iter().max_by_key(|(_, r)| r.t_ms);
                return match last {
                    Some((_, r)) if r.act == Act::Abort => {
                        Verdict::Allowed("body aborted mid-stream".into())
                    }
                    _ => Verdict::Unexpected("body cut without an injected abort".into()),
                };
            }
        }
    }
    let Some(log) = ev.logs.get(&d.id) else {
        return Verdict::Unexpected(format!("{status} without an access-log line"));
    };
    if log.status != status {
        return Verdict::Unexpected(format!(
            "client saw {status}, sidecar logged {}",
            log.status
        ));
    }
    if let Some((i, r)) = recs.iter().find(|(_, r)| r.healthy()) {
        return Verdict::Unexpected(format!(
            "client saw {status} but {} answered 200 at {} ms",
            ev.eps[*i].name, r.t_ms
        ));
    }
    if log.attempts as usize > d.method.max_attempts() {
        return Verdict::Unexpected(format!("{} attempts logged", log.attempts));
    }
    for name in log.endpoints.split(',').filter(|n| !n.is_empty()) {
        let Some(i) = ev.eps.iter().position(|e| e.name == name) else {
            return Verdict::Unexpected(format!("unknown endpoint {name} in the log"));
        };
        let here = recs.iter().any(|(j, _)| *j == i);
        if !here && !ev.eps[i].was_down(seen.t_start, seen.t_end) {
            return Verdict::Unexpected(format!(
                "attempt at {name} failed, but {name} recorded nothing and was up"
            ));
        }
    }
    if seen.reprise_error.is_none() {
        // The upstream's own answer, passed on: it must be the injected 503.
        let last = recs.iter().max_by_key(|(_, r)| r.t_ms);
        if !matches!(last, Some((_, r)) if r.act == Act::S503) || status != 503 {
            return Verdict::Unexpected(format!("{status} from upstream without an injected 503"));
        }
    }
    let outcome = format!("{}:{}", log.outcome, log.reason);
    let permitted = match d.method {
        Meth::Get => log.outcome == "exhausted",
        Meth::Put => {
            log.outcome == "exhausted"
                || (outcome == "skipped:body_consumed" && d.body_len > REPLAY_CAP)
        }
        Meth::Post => outcome == "skipped:method",
    };
    if permitted {
        Verdict::Allowed(outcome)
    } else {
        Verdict::Unexpected(format!("outcome {outcome} for {}", d.method.as_str()))
    }
}

fn short(s: &str) -> String {
    s.chars().take(160).collect()
}

// ---------------------------------------------------------------------------
// The run

struct Args {
    secs: u64,
    rate: u64,
    out: PathBuf,
    summary: Option<PathBuf>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        secs: 600,
        rate: 200,
        out: std::env::temp_dir().join(format!("reprise-soak-{}", std::process::id())),
        summary: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--duration" => args.secs = value()?.parse()?,
            "--rate" => args.rate = value()?.parse()?,
            "--out" => args.out = PathBuf::from(value()?),
            "--summary" => args.summary = Some(PathBuf::from(value()?)),
            _ => bail!("usage: reprise-soak [--duration SECS] [--rate REQ_PER_S] [--out DIR] [--summary FILE]"),
        }
    }
    if args.secs < 30 || args.rate == 0 || args.rate > 2_000 {
        bail!("--duration must be at least 30 and --rate within 1..=2000");
    }
    Ok(args)
}

#[derive(Debug, Default)]
struct EventLog {
    lines: Vec<String>,
    failures: Vec<String>,
    /// Metrics of each sidecar process, scraped just before its SIGTERM.
    metrics: Vec<BTreeMap<String, f64>>,
    exits: Vec<(u32, Option<i32>, Duration)>,
    sigterm_ms: u64,
    ready_again_ms: u64,
    /// Requests sent just before SIGTERM and held by the endpoints, so they are in flight during the drain.
    probes: Vec<Done>,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("reprise-soak: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<bool> {
    let args = parse_args()?;
    let _ = T0.set(Instant::now());
    std::fs::create_dir_all(&args.out)?;
    let duration_ms = args.secs * 1000;
    let warmup_ms = (duration_ms / 20).clamp(10_000, 30_000);

    let eps = vec![
        Endpoint::start("a-503", Role::Status503).await?,
        Endpoint::start("b-churn", Role::Churn).await?,
        Endpoint::start("c-transport", Role::Transport).await?,
    ];
    let config = args.out.join("reprise.yaml");
    write_config(&config, &config_yaml(&eps, 0))?;
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("reprise-sidecar");
    if !bin.exists() {
        bail!(
            "{} not found: build it first (e2e/soak/run.sh does)",
            bin.display()
        );
    }
    let check = Command::new(&bin)
        .arg("--config")
        .arg(&config)
        .arg("--check")
        .output()?;
    if !check.status.success() {
        bail!(
            "the soak configuration is refused:\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let setup = SidecarSetup {
        bin,
        config: config.clone(),
        listen: free_addr()?,
        admin: free_addr()?,
        out: args.out.clone(),
        logs: Arc::default(),
    };
    let sidecar = setup.start(1).await?;
    println!(
        "== reprise-soak: {} s at {} req/s through reprise-sidecar on {} (admin {}); endpoints {}; logs in {}",
        args.secs,
        args.rate,
        setup.listen,
        setup.admin,
        eps.iter()
            .map(|e| format!("{} {}", e.name, e.addr))
            .collect::<Vec<_>>()
            .join(", "),
        args.out.display()
    );

    let churn_task = tokio::spawn(churn(Arc::clone(&eps[1]), duration_ms));
    let restart = Arc::new(RestartClock::default());
    restart.generation.store(1, Ordering::SeqCst);
    let current_pid = Arc::new(AtomicU32::new(sidecar.pid));
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (pid, restart, samples, stop) = (
            Arc::clone(&current_pid),
            Arc::clone(&restart),
            Arc::clone(&samples),
            Arc::clone(&stop_sampling),
        );
        tokio::spawn(async move {
            let rounds = duration_ms / SAMPLE_EVERY.as_millis() as u64 + 5;
            for _ in 0..rounds {
                tokio::time::sleep(SAMPLE_EVERY).await;
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                // The pid first: the events task stores the generation before the pid.
                let pid = pid.load(Ordering::SeqCst);
                let gen = restart.generation.load(Ordering::SeqCst);
                if let Some(s) = sample(pid, gen) {
                    lock(&samples).push(s);
                }
            }
        })
    };

    // Mid-run events: two rewrites, one SIGHUP, one restart.
    let pool: Pool = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(64)
        .pool_timer(TokioTimer::new())
        .build_http();
    let events = {
        let pool = pool.clone();
        let (setup, eps, restart, pid, samples) = (
            setup.clone(),
            eps.clone(),
            Arc::clone(&restart),
            Arc::clone(&current_pid),
            Arc::clone(&samples),
        );
        tokio::spawn(async move {
            run_events(
                sidecar,
                setup,
                eps,
                restart,
                pid,
                samples,
                duration_ms,
                pool,
            )
            .await
        })
    };

    // Traffic: request i is due at i / rate; bounded by count.
    let total = args.secs * args.rate;
    let period_ns = 1_000_000_000 / args.rate;
    let started = tokio::time::Instant::now();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let results: Arc<Mutex<Vec<Done>>> = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut saturated = 0u64;
    let mut max_lag = Duration::ZERO;
    let mut events = Some(events);
    let mut events_out = None;
    for i in 0..total {
        // A failed restart leaves no sidecar: stop early rather than send into nothing.
        if i % args.rate == 0 && events.as_ref().is_some_and(|e| e.is_finished()) {
            if let Some(e) = events.take() {
                events_out = Some(e.await.context("events task")??);
            }
        }
        let due = started + Duration::from_nanos(i * period_ns);
        tokio::time::sleep_until(due).await;
        max_lag = max_lag.max(tokio::time::Instant::now().saturating_duration_since(due));
        while tasks.try_join_next().is_some() {}
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            saturated += 1;
            continue;
        };
        let (pool, restart, sink) = (pool.clone(), Arc::clone(&restart), Arc::clone(&results));
        let p = plan(i + 1);
        let listen = setup.listen;
        tasks.spawn(async move {
            let done = run_one(pool, listen, p, restart).await;
            lock(&sink).push(done);
            drop(permit);
        });
        if (i + 1) % (args.rate * 60) == 0 {
            let r = lock(&results);
            let ok = r
                .iter()
                .filter(|d| d.last().status.is_some_and(|s| s == 200))
                .count();
            println!(
                "  t={:>4} s  sent {:>7}  answered {:>7}  200 {:>7}",
                now_ms() / 1000,
                i + 1,
                r.len(),
                ok
            );
        }
    }
    // Let the last requests finish (each is bounded by the client timeout and one resend).
    let drain_until = tokio::time::Instant::now() + CLIENT_TIMEOUT * 3;
    while !tasks.is_empty() {
        if tokio::time::timeout_at(drain_until, tasks.join_next())
            .await
            .is_err()
        {
            tasks.abort_all();
            break;
        }
    }
    let traffic_end_ms = now_ms();
    let (sidecar, mut event_log) = match (events_out, events) {
        (Some(out), _) => out,
        (None, Some(e)) => e.await.context("events task")??,
        (None, None) => bail!("events task lost"),
    };
    let churn_result = churn_task.await.context("churn task")?;
    stop_sampling.store(true, Ordering::SeqCst);
    sampler.abort();
    if let Some(s) = sample(sidecar.pid, sidecar.gen) {
        lock(&samples).push(s);
    }
    if let Ok((200, text)) = admin_get(setup.admin, "/metrics").await {
        event_log.metrics.push(parse_metrics(&text));
    } else {
        event_log
            .failures
            .push("final /metrics scrape failed".into());
    }
    let last_gen = sidecar.gen;
    match sidecar.stop().await {
        Ok((code, took)) => event_log.exits.push((last_gen, code, took)),
        Err(e) => event_log.failures.push(format!("{e:#}")),
    }
    if let Err(e) = churn_result {
        event_log.failures.push(format!("churn: {e:#}"));
    }
    for e in &eps {
        e.kill();
    }

    let results = std::mem::take(&mut *lock(&results));
    let samples = lock(&samples).clone();
    let report = Report {
        args: &args,
        eps: &eps,
        results: &results,
        samples: &samples,
        events: &event_log,
        logs: &setup.logs,
        saturated,
        max_lag,
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

fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

async fn wait_reloads(admin: SocketAddr, want_ok: f64) -> anyhow::Result<BTreeMap<String, f64>> {
    for _ in 0..100 {
        if let Ok((200, text)) = admin_get(admin, "/metrics").await {
            let m = parse_metrics(&text);
            if reloads_ok(&m) >= want_ok || reloads_refused(&m) > 0.0 {
                return Ok(m);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("no reload counted within 5 s (wanted reprise_config_reloads_total{{result=\"ok\"}} >= {want_ok})")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Rewrite(u32),
    Restart,
    Hangup,
}

/// Runs the mid-run events at fixed shares of the duration: rewrite 1 at 15%,
/// the restart at 25%, SIGHUP at 40%, rewrite 2 at 60%. Returns the sidecar
/// running at the end. Fails only when no sidecar could be started again.
#[allow(clippy::too_many_arguments)]
async fn run_events(
    sidecar: Sidecar,
    setup: SidecarSetup,
    eps: Vec<Arc<Endpoint>>,
    restart: Arc<RestartClock>,
    pid: Arc<AtomicU32>,
    samples: Arc<Mutex<Vec<Sample>>>,
    duration_ms: u64,
    pool: Pool,
) -> anyhow::Result<(Sidecar, EventLog)> {
    let mut log = EventLog::default();
    let at = |f: f64| (duration_ms as f64 * f) as u64;
    let schedule = [
        (at(0.15), Event::Rewrite(1)),
        (at(0.25), Event::Restart),
        (at(0.40), Event::Hangup),
        (at(0.60), Event::Rewrite(2)),
    ];
    let mut current = Some(sidecar);
    // Reloads counted by the running process.
    let mut expected_ok = 0.0;
    for (when, event) in schedule {
        tokio::time::sleep(Duration::from_millis(when.saturating_sub(now_ms()))).await;
        let t = now_ms() as f64 / 1000.0;
        let result: anyhow::Result<String> = match event {
            Event::Rewrite(variant) => {
                write_config(&setup.config, &config_yaml(&eps, variant))?;
                expected_ok += 1.0;
                match wait_reloads(setup.admin, expected_ok).await {
                    Ok(m) if reloads_refused(&m) > 0.0 => Err(anyhow::anyhow!("refused")),
                    Ok(_) => {
                        let (_, cfg) = admin_get(setup.admin, "/config").await?;
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
                signal(current.as_ref().map_or(0, |s| s.pid), "HUP")?;
                expected_ok += 1.0;
                match wait_reloads(setup.admin, expected_ok).await {
                    Ok(m) if reloads_refused(&m) > 0.0 => Err(anyhow::anyhow!("refused")),
                    Ok(_) => Ok("SIGHUP sent, forced reload counted".to_string()),
                    Err(e) => Err(e),
                }
            }
            Event::Restart => {
                let old = current.take().context("no sidecar")?;
                if let Some(s) = sample(old.pid, old.gen) {
                    lock(&samples).push(s);
                }
                if let Ok((200, text)) = admin_get(setup.admin, "/metrics").await {
                    log.metrics.push(parse_metrics(&text));
                }
                let gen = old.gen;
                // No periodic samples from here until the next process serves
                // (they would catch the probes, or a process that is exiting).
                pid.store(0, Ordering::SeqCst);
                // Drain probes: requests each endpoint holds for DRAIN_PROBE_HOLD,
                // sent so that they are in flight when SIGTERM arrives.
                let probes: Vec<_> = (0..DRAIN_PROBES)
                    .map(|k| {
                        let mut p = plan(PROBE_IDS + k);
                        p.method = [Meth::Get, Meth::Post, Meth::Put][(k % 3) as usize];
                        p.delay_ms = DRAIN_PROBE_HOLD.as_millis() as u64;
                        if p.method == Meth::Get {
                            p.body = Bytes::new();
                        }
                        tokio::spawn(run_one(pool.clone(), setup.listen, p, Arc::clone(&restart)))
                    })
                    .collect();
                tokio::time::sleep(DRAIN_PROBE_HOLD / 3).await;
                let sigterm = now_ms();
                restart.sigterm_ms.store(sigterm, Ordering::SeqCst);
                log.sigterm_ms = sigterm;
                let (code, took) = old.stop().await?;
                log.exits.push((gen, code, took));
                let exited = now_ms();
                let new = setup.start(gen + 1).await?;
                let ready = now_ms();
                restart.ready_ms.store(ready, Ordering::SeqCst);
                restart.generation.store(gen + 1, Ordering::SeqCst);
                log.ready_again_ms = ready;
                pid.store(new.pid, Ordering::SeqCst);
                current = Some(new);
                for probe in probes {
                    if let Ok(done) = probe.await {
                        log.probes.push(done);
                    }
                }
                expected_ok = 0.0;
                Ok(format!(
                    "{DRAIN_PROBES} drain probes sent; SIGTERM to #{gen} at {:.3} s, exit {} after {} ms; #{} ready {} ms later (listener down {} ms)",
                    sigterm as f64 / 1000.0,
                    code.map_or("signal".to_string(), |c| c.to_string()),
                    took.as_millis(),
                    gen + 1,
                    ready - exited,
                    ready - sigterm
                ))
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

// ---------------------------------------------------------------------------
// The summary

struct Report<'a> {
    args: &'a Args,
    eps: &'a [Arc<Endpoint>],
    results: &'a [Done],
    samples: &'a [Sample],
    events: &'a EventLog,
    logs: &'a SidecarLogs,
    saturated: u64,
    max_lag: Duration,
    warmup_ms: u64,
    traffic_end_ms: u64,
}

#[derive(Default)]
struct Row {
    sent: u64,
    ok: u64,
    allowed: u64,
    unexpected: u64,
}

/// The sample with the median RSS and, separately, the median fd count, of up to three samples.
fn median3<'a>(samples: impl Iterator<Item = &'a &'a Sample>) -> Option<Sample> {
    let list: Vec<Sample> = samples.map(|s| **s).collect();
    let mid = list.len().checked_sub(1)? / 2;
    let mut rss: Vec<u64> = list.iter().map(|s| s.rss_kib).collect();
    let mut fds: Vec<i64> = list.iter().map(|s| s.fds).collect();
    rss.sort_unstable();
    fds.sort_unstable();
    let t_ms = list.iter().map(|s| s.t_ms).max()?;
    Some(Sample {
        t_ms,
        gen: list[0].gen,
        rss_kib: rss[mid],
        fds: fds[mid],
        threads: list[0].threads,
    })
}

fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        "-".into()
    } else {
        format!("{:.2}%", 100.0 * n as f64 / of as f64)
    }
}

fn join_counts<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Report<'_> {
    fn render(&self) -> (String, bool) {
        let mut out = String::new();
        let mut fails: Vec<String> = self.events.failures.clone();
        macro_rules! line {
            ($($t:tt)*) => {{ out.push_str(&format!($($t)*)); out.push('\n'); }};
        }
        let recs: HashMap<u64, Vec<(usize, Rec)>> = {
            let mut m: HashMap<u64, Vec<(usize, Rec)>> = HashMap::new();
            for (i, e) in self.eps.iter().enumerate() {
                for r in lock(&e.log).iter() {
                    m.entry(r.id).or_default().push((i, r.clone()));
                }
            }
            m
        };
        let logs = lock(&self.logs.by_id).clone();
        let ev = Evidence {
            eps: self.eps,
            recs: &recs,
            logs: &logs,
        };

        let mut rows: BTreeMap<Meth, Row> = BTreeMap::new();
        let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
        let mut allowed: BTreeMap<String, u64> = BTreeMap::new();
        let mut unexpected: BTreeMap<String, u64> = BTreeMap::new();
        let mut examples: Vec<String> = Vec::new();
        let mut calm_failures = 0u64;
        let mut latencies: Vec<u64> = Vec::new();
        let (mut pooled, mut fresh, mut over_cap, mut with_body) = (0u64, 0u64, 0u64, 0u64);
        let sigterm = self.events.sigterm_ms;
        let ready = self.events.ready_again_ms;
        let (mut in_flight_at_term, mut lost_at_term) = (0u64, 0u64);
        let (mut refused, mut refused_ok, mut other_in_window) = (0u64, 0u64, 0u64);
        let (mut closed_by_drain, mut closed_ok) = (0u64, 0u64);
        let mut examples_drain: Vec<String> = Vec::new();
        for d in self.results {
            let row = rows.entry(d.method).or_default();
            row.sent += 1;
            match d.conn {
                ConnMode::Pooled => pooled += 1,
                ConnMode::Fresh => fresh += 1,
            }
            if d.body_len > 0 {
                with_body += 1;
            }
            if d.body_len > REPLAY_CAP {
                over_cap += 1;
            }
            let v = verdict(d, &ev);
            let seen = d.last();
            if !matches!(v, Verdict::Success) {
                let key = match (seen.status, &seen.body, &seen.error) {
                    (Some(s), Some(BodyCheck::Cut), _) => format!("{s} + body cut"),
                    (Some(s), _, _) => match &seen.reprise_error {
                        Some(k) => format!("{s} {k}"),
                        None => format!("{s} (upstream's)"),
                    },
                    (None, _, Some((k, _))) => format!("no answer: {k:?}"),
                    _ => "no answer".into(),
                };
                *by_status.entry(key).or_default() += 1;
                if !faults_at(seen.t_start).any() && !faults_at(seen.t_end).any() {
                    calm_failures += 1;
                }
            }
            match &v {
                Verdict::Success => {
                    row.ok += 1;
                    latencies.push(seen.t_end - seen.t_start);
                }
                Verdict::Allowed(why) => {
                    row.allowed += 1;
                    *allowed
                        .entry(format!("{} {why}", d.method.as_str()))
                        .or_default() += 1;
                }
                Verdict::Unexpected(why) => {
                    row.unexpected += 1;
                    let class = why.split(':').next().unwrap_or(why).to_string();
                    *unexpected
                        .entry(format!("{} {class}", d.method.as_str()))
                        .or_default() += 1;
                    if examples.len() < 12 {
                        examples.push(format!(
                            "id {} {} at {:.3} s ({:?}, body {} B): {why}",
                            d.id,
                            d.method.as_str(),
                            seen.t_start as f64 / 1000.0,
                            d.conn,
                            d.body_len
                        ));
                    }
                }
            }
            // The restart.
            if sigterm > 0 {
                let f = &d.first;
                let refused_here = matches!(f.error, Some((ErrKind::Refused, _)));
                if refused_here && d.resent.is_some() {
                    refused += 1;
                    if matches!(v, Verdict::Success) {
                        refused_ok += 1;
                    }
                } else if d.resent.is_some() {
                    closed_by_drain += 1;
                    if matches!(v, Verdict::Success) {
                        closed_ok += 1;
                    }
                    if examples_drain.len() < 5 {
                        examples_drain.push(format!(
                            "id {} {} ({:?}) sent at {:.3} s, SIGTERM at {:.3} s: {}",
                            d.id,
                            d.method.as_str(),
                            d.conn,
                            f.t_start as f64 / 1000.0,
                            sigterm as f64 / 1000.0,
                            f.error.as_ref().map_or(String::new(), |(_, t)| short(t))
                        ));
                    }
                } else if f.t_start < sigterm && f.t_end >= sigterm {
                    in_flight_at_term += 1;
                    if f.error.is_some() {
                        lost_at_term += 1;
                    }
                } else if f.t_start >= sigterm && f.t_start <= ready && f.error.is_some() {
                    other_in_window += 1;
                }
            }
        }
        let total: u64 = rows.values().map(|r| r.sent).sum();
        let sum = |f: fn(&Row) -> u64| rows.values().map(f).sum::<u64>();
        let (ok, allowed_n, unexpected_n) =
            (sum(|r| r.ok), sum(|r| r.allowed), sum(|r| r.unexpected));

        // Deliveries at the endpoints.
        let mut post_dups = 0u64;
        let mut put_multi = 0u64;
        let mut get_multi = 0u64;
        let mut put_multi_after_write = 0u64;
        for list in recs.values() {
            if list.len() < 2 {
                continue;
            }
            match list[0].1.method.as_str() {
                "POST" => post_dups += 1,
                "PUT" => {
                    put_multi += 1;
                    if list.iter().any(|(_, r)| {
                        matches!(r.act, Act::Reset | Act::Stall) || (r.act == Act::Ok && !r.done)
                    }) {
                        put_multi_after_write += 1;
                    }
                }
                _ => get_multi += 1,
            }
        }

        line!("== Reprise soak: {} s at {} req/s through the real reprise-sidecar (release), 3 endpoints on 127.0.0.1", self.args.secs, self.args.rate);
        line!("   faults per 60 s cycle: 0-10 s calm; then a-503 answers 503 to 20% / 90% / 50% (cycles rotate),");
        line!("   c-transport resets before headers, aborts mid-body or stalls 1.5 s (8% / 15% / 8%), b-churn's");
        line!("   listener and connections are closed 20-23 s and 40-45 s. Policy: 2 retries (GET by the upstream's");
        line!("   block, PUT by rule `puts` with acknowledge_duplicate_risk), POST never retried, budget 20%,");
        line!("   attempt timeout 400 ms, deadline 2 s, replay cap {REPLAY_CAP} B, drain {DRAIN_MS} ms.");
        line!("");
        line!("-- events");
        for l in &self.events.lines {
            line!("   {l}");
        }
        line!("");
        line!("-- requests (verdict per request; see `verdict` in e2e/src/bin/reprise-soak.rs)");
        line!("   A failure is allowed when the client got an answer within the deadline, no endpoint gave the request");
        line!("   a complete healthy answer, every attempt the sidecar logged for it met an injected fault (the endpoint");
        line!("   recorded a 503/reset/stall/abort/kill for that request id, or b-churn's listener was closed at the time),");
        line!("   it made no more attempts than the policy allows, and the sidecar's outcome is one the policy permits:");
        line!("   GET/PUT exhausted (attempts, budget, deadline), PUT over the replay cap skipped:body_consumed, POST");
        line!("   skipped:method, any method: body aborted by the endpoint after the headers. Anything else is unexpected.");
        line!(
            "   {:<8} {:>8} {:>10} {:>10} {:>22} {:>12}",
            "method",
            "sent",
            "2xx",
            "failed",
            "allowed by policy",
            "unexpected"
        );
        for (m, r) in &rows {
            line!(
                "   {:<8} {:>8} {:>10} {:>10} {:>22} {:>12}",
                m.as_str(),
                r.sent,
                r.ok,
                r.allowed + r.unexpected,
                r.allowed,
                r.unexpected
            );
        }
        line!(
            "   {:<8} {:>8} {:>10} {:>10} {:>22} {:>12}",
            "total",
            total,
            ok,
            allowed_n + unexpected_n,
            allowed_n,
            unexpected_n
        );
        line!(
            "   success {} of requests sent ({} if allowed failures are counted as policy working)",
            pct(ok, total),
            pct(ok + allowed_n, total)
        );
        latencies.sort_unstable();
        let q = |p: f64| {
            latencies
                .get(((latencies.len() as f64 - 1.0) * p) as usize)
                .copied()
                .unwrap_or(0)
        };
        line!(
            "   2xx latency: p50 {} ms, p99 {} ms, max {} ms",
            q(0.5),
            q(0.99),
            q(1.0)
        );
        line!("   connections: {pooled} on keep-alive, {fresh} on a fresh connection; bodies: {with_body} with a body, {over_cap} over the replay cap ({BIG_BODY} B)");
        line!(
            "   pacing: max lag {} ms; not sent because {MAX_IN_FLIGHT} were in flight: {}",
            self.max_lag.as_millis(),
            self.saturated
        );
        line!("   failures by answer: {}", join_counts(&by_status));
        line!("   allowed, by sidecar outcome: {}", join_counts(&allowed));
        line!("   unexpected: {}", join_counts(&unexpected));
        for e in &examples {
            line!("     {e}");
        }
        line!("   failures that started and ended in a calm period (no fault injected anywhere): {calm_failures}");
        line!("");
        line!("-- restart (SIGTERM, exit, start again on the same port)");
        for (gen, code, took) in &self.events.exits {
            line!(
                "   sidecar #{gen}: exit code {} after {} ms",
                code.map_or("none (signal)".into(), |c| c.to_string()),
                took.as_millis()
            );
            if *code != Some(0) {
                fails.push(format!("sidecar #{gen} exited with {code:?}"));
            }
        }
        line!("   in flight at SIGTERM: {in_flight_at_term}; lost to restart (no answer): {lost_at_term}");
        line!("   refused while the sidecar was down, sent again once it was up: {refused} ({refused_ok} then succeeded)");
        line!("   sent after SIGTERM on a keep-alive connection the drain closed unread (no answer, never logged or delivered), sent again: {closed_by_drain} ({closed_ok} then succeeded)");
        for e in &examples_drain {
            line!("     {e}");
        }
        line!("   other connection errors between SIGTERM and ready: {other_in_window}");
        {
            let probes = &self.events.probes;
            let (mut p_ok, mut p_allowed, mut p_lost, mut p_unexpected, mut p_in_flight) =
                (0, 0, 0, 0, 0);
            for d in probes {
                if d.first.t_start < sigterm && d.first.t_end >= sigterm {
                    p_in_flight += 1;
                }
                if d.first.error.is_some() {
                    p_lost += 1;
                }
                match verdict(d, &ev) {
                    Verdict::Success => p_ok += 1,
                    Verdict::Allowed(_) => p_allowed += 1,
                    Verdict::Unexpected(why) => {
                        p_unexpected += 1;
                        line!("     drain probe id {} {}: {why}", d.id, d.method.as_str());
                    }
                }
            }
            line!(
                "   drain probes (held {} ms by the endpoint, SIGTERM {} ms after sending): {} sent, {p_in_flight} in flight at SIGTERM; 2xx {p_ok}, allowed failures {p_allowed}, unexpected {p_unexpected}, lost (no answer) {p_lost}",
                DRAIN_PROBE_HOLD.as_millis(),
                (DRAIN_PROBE_HOLD / 3).as_millis(),
                probes.len()
            );
            if sigterm > 0 && probes.len() as u64 != DRAIN_PROBES {
                fails.push(format!(
                    "only {} of {DRAIN_PROBES} drain probes finished",
                    probes.len()
                ));
            }
            if p_lost + p_unexpected > 0 {
                fails.push(format!(
                    "drain probes: {p_lost} lost, {p_unexpected} unexpected"
                ));
            }
        }
        line!("");
        line!("-- deliveries at the endpoints");
        for e in self.eps {
            let log = lock(&e.log);
            let mut acts: BTreeMap<&'static str, u64> = BTreeMap::new();
            let mut killed = 0;
            for r in log.iter() {
                *acts.entry(r.act.name()).or_default() += 1;
                if r.act == Act::Ok && !r.done {
                    killed += 1;
                }
            }
            let down = lock(&e.down);
            let down_ms: u64 = down
                .iter()
                .map(|(d, u)| u.min(&self.traffic_end_ms).saturating_sub(*d))
                .sum();
            line!(
                "   {:<12} {:>7} requests on {:>6} connections: {}{}",
                e.name,
                log.len(),
                e.accepted.load(Ordering::Relaxed),
                join_counts(&acts),
                if e.role == Role::Churn {
                    format!("; killed while answering {killed}; listener closed {} times, {:.1} s in all", down.len(), down_ms as f64 / 1000.0)
                } else {
                    String::new()
                }
            );
        }
        line!("   POST delivered more than once: {post_dups} (must be 0)");
        line!("   PUT delivered more than once: {put_multi} ({put_multi_after_write} after an attempt that may have been processed; allowed: rule `puts` acknowledges the risk)");
        line!("   GET delivered more than once: {get_multi}");
        let retried: u64 = self
            .eps
            .iter()
            .map(|e| lock(&e.log).iter().filter(|r| r.attempt >= 2).count() as u64)
            .sum();
        let post_marked: u64 = self
            .eps
            .iter()
            .map(|e| {
                lock(&e.log)
                    .iter()
                    .filter(|r| r.method == "POST" && r.attempt > 0)
                    .count() as u64
            })
            .sum();
        line!("   deliveries marked as a retry (x-reprise-attempt >= 2): {retried}; POSTs carrying x-reprise-attempt: {post_marked}");
        if post_dups > 0 {
            fails.push(format!("{post_dups} POST(s) delivered more than once"));
        }
        line!("");
        line!("-- sidecar's own counts (metrics of both processes, added; #1 scraped just before its SIGTERM)");
        let mut metrics: BTreeMap<String, f64> = BTreeMap::new();
        for m in &self.events.metrics {
            for (k, v) in m {
                *metrics.entry(k.clone()).or_default() += v;
            }
        }
        let family = |prefix: &str, label: &str| -> String {
            let parts: Vec<String> = metrics
                .iter()
                .filter(|(k, v)| k.starts_with(prefix) && **v > 0.0)
                .map(|(k, v)| {
                    let labels = k
                        .split_once('{')
                        .map_or("", |(_, l)| l.trim_end_matches('}'));
                    let pick: Vec<&str> = labels
                        .split(',')
                        .filter(|l| label.split('|').any(|want| l.starts_with(want)))
                        .map(|l| l.split_once('=').map_or(l, |(_, v)| v).trim_matches('"'))
                        .filter(|l| !l.is_empty())
                        .collect();
                    format!("{} {v}", pick.join(":"))
                })
                .collect();
            if parts.is_empty() {
                "none".into()
            } else {
                parts.join(", ")
            }
        };
        line!(
            "   requests: {}",
            family("reprise_requests_total{", "outcome|reason")
        );
        line!(
            "   retries by failed attempt: {}",
            family("reprise_retries_total{", "kind")
        );
        line!(
            "   budget refusals: {}; response body errors: {}; ejections: {}",
            family("reprise_retry_budget_refusals_total{", "upstream"),
            family("reprise_response_body_errors_total{", "upstream"),
            family("reprise_endpoint_ejections_total{", "pod|endpoint")
        );
        line!(
            "   config reloads: {}",
            family("reprise_config_reloads_total{", "result")
        );
        line!(
            "   access-log request events read: {}; warn/error lines: {}",
            self.logs.request_lines.load(Ordering::Relaxed),
            join_counts(&lock(&self.logs.notable))
        );
        line!("");
        line!("-- sidecar resources (sampled every {} s after a {} s warm-up of each process; start = median of the first 3 samples, end = median of the last 3)", SAMPLE_EVERY.as_secs(), self.warmup_ms / 1000);
        line!(
            "   {:<10} {:>7} {:>10} {:>10} {:>10} {:>9} {:>6} {:>6} {:>6} {:>7} {:>8}",
            "process",
            "samples",
            "RSS start",
            "RSS max",
            "RSS end",
            "growth",
            "fd st",
            "fd max",
            "fd end",
            "growth",
            "threads"
        );
        let gens: Vec<(u32, u64)> = {
            let mut g = vec![(1u32, 0u64)];
            if self.events.ready_again_ms > 0 {
                g.push((2, self.events.ready_again_ms));
            }
            g
        };
        for (gen, started) in gens {
            let all: Vec<&Sample> = self.samples.iter().filter(|s| s.gen == gen).collect();
            let after: Vec<&Sample> = all
                .iter()
                .copied()
                .filter(|s| s.t_ms >= started + self.warmup_ms)
                .collect();
            let (Some(first), Some(last)) = (
                median3(after.iter().take(3)),
                median3(after.iter().rev().take(3)),
            ) else {
                line!("   #{gen:<9} {:>7} (no sample after warm-up)", all.len());
                continue;
            };
            let rss_max = after.iter().map(|s| s.rss_kib).max().unwrap_or(0);
            let fd_max = after.iter().map(|s| s.fds).max().unwrap_or(0);
            let thr_max = after.iter().map(|s| s.threads).max().unwrap_or(0);
            let (first, last) = (&first, &last);
            let growth = (last.rss_kib as f64 - first.rss_kib as f64) / first.rss_kib.max(1) as f64;
            let fd_growth = last.fds - first.fds;
            line!(
                "   #{gen:<9} {:>7} {:>7.1} MiB {:>6.1} MiB {:>6.1} MiB {:>+8.1}% {:>6} {:>6} {:>6} {:>+7} {:>8}",
                after.len(),
                first.rss_kib as f64 / 1024.0,
                rss_max as f64 / 1024.0,
                last.rss_kib as f64 / 1024.0,
                growth * 100.0,
                first.fds,
                fd_max,
                last.fds,
                fd_growth,
                thr_max
            );
            line!(
                "   {:<10} (samples from {:.0} s to {:.0} s)",
                "",
                after.first().map_or(0, |s| s.t_ms) as f64 / 1000.0,
                after.last().map_or(0, |s| s.t_ms) as f64 / 1000.0
            );
            if growth > RSS_GROWTH_MAX {
                fails.push(format!(
                    "sidecar #{gen}: RSS grew {:.1}% after warm-up (limit {:.0}%)",
                    growth * 100.0,
                    RSS_GROWTH_MAX * 100.0
                ));
            }
            if fd_growth > FD_GROWTH_MAX {
                fails.push(format!("sidecar #{gen}: open fds grew by {fd_growth} after warm-up (limit {FD_GROWTH_MAX})"));
            }
        }
        line!(
            "   every sample: {}",
            self.samples
                .iter()
                .map(|s| format!("{}s:#{}:{}K/{}fd", s.t_ms / 1000, s.gen, s.rss_kib, s.fds))
                .collect::<Vec<_>>()
                .join(" ")
        );
        if unexpected_n > 0 {
            fails.push(format!("{unexpected_n} request(s) failed unexpectedly"));
        }
        if lost_at_term > 0 {
            fails.push(format!(
                "{lost_at_term} request(s) in flight at SIGTERM lost"
            ));
        }
        if self.saturated > 0 {
            fails.push(format!(
                "{} request(s) not sent: {MAX_IN_FLIGHT} already in flight",
                self.saturated
            ));
        }
        line!("");
        if fails.is_empty() {
            line!("== PASS");
        } else {
            line!("== FAIL");
            for f in &fails {
                line!("   - {f}");
            }
        }
        (out, fails.is_empty())
    }
}
