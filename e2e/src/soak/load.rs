//! Client traffic: the request mix, one send and its classification, the
//! resend after the restart, and the paced loop that sends everything.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rand::Rng;
use reprise_testkit::upstream::digest;
use tokio::net::TcpStream;

use super::args::Args;
use super::events::Events;
use super::{lock, now_ms};

pub(crate) const BIG_BODY: usize = 65_536;
/// Longest a client request (with body) may take before it counts as lost.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
pub(crate) const MAX_IN_FLIGHT: usize = 4_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Meth {
    Get,
    Post,
    Put,
}

impl Meth {
    pub fn as_str(self) -> &'static str {
        match self {
            Meth::Get => "GET",
            Meth::Post => "POST",
            Meth::Put => "PUT",
        }
    }

    /// Attempts the policy allows: two retries for GET (the upstream's block) and
    /// PUT (rule `puts`), none for POST.
    pub fn max_attempts(self) -> usize {
        match self {
            Meth::Get | Meth::Put => 3,
            Meth::Post => 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnMode {
    /// A keep-alive connection from the client's pool.
    Pooled,
    /// A new connection with `Connection: close`.
    Fresh,
}

#[derive(Clone, Debug)]
pub(crate) struct Planned {
    pub id: u64,
    pub method: Meth,
    pub body: Bytes,
    pub resp_size: usize,
    pub conn: ConnMode,
    /// Asks the endpoint to take this long (drain probes).
    pub delay_ms: u64,
}

pub(crate) fn plan(id: u64) -> Planned {
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
pub(crate) enum ErrKind {
    Refused,
    Closed,
    Reset,
    Timeout,
    Other,
}

#[derive(Clone, Debug)]
pub(crate) enum BodyCheck {
    Complete,
    /// The body arrived whole but is not this request's answer.
    Mismatch,
    /// The body failed after the headers.
    Cut,
}

/// What the client saw for one send.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub t_start: u64,
    pub t_end: u64,
    pub status: Option<u16>,
    pub reprise_error: Option<String>,
    pub body: Option<BodyCheck>,
    pub error: Option<(ErrKind, String)>,
}

#[derive(Clone, Debug)]
pub(crate) struct Done {
    pub id: u64,
    pub method: Meth,
    pub body_len: usize,
    pub conn: ConnMode,
    pub first: Seen,
    /// The resend after the sidecar came back, when the first send was refused during the restart.
    pub resent: Option<Seen>,
}

impl Done {
    pub fn last(&self) -> &Seen {
        self.resent.as_ref().unwrap_or(&self.first)
    }
}

pub(crate) type Pool = Client<HttpConnector, Full<Bytes>>;

/// The restart as the clients see it.
#[derive(Debug, Default)]
pub(crate) struct RestartClock {
    pub sigterm_ms: AtomicU64,
    pub ready_ms: AtomicU64,
    pub generation: AtomicU32,
}

async fn send(pool: &Pool, listen: SocketAddr, p: &Planned) -> Seen {
    let t_start = now_ms();
    let req = http::Request::builder()
        .method(p.method.as_str())
        .header("host", "api")
        .header("x-soak-id", p.id.to_string())
        .header("x-soak-sum", format!("{:x}", digest(&p.body)))
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
pub(crate) async fn run_one(
    pool: Pool,
    listen: SocketAddr,
    p: Planned,
    restart: Arc<RestartClock>,
) -> Done {
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

/// The client's connection pool.
pub(crate) fn pool() -> Pool {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(64)
        .pool_timer(TokioTimer::new())
        .build_http()
}

/// What the traffic loop saw.
#[derive(Debug)]
pub(crate) struct Traffic {
    pub results: Vec<Done>,
    /// Requests not sent because [`MAX_IN_FLIGHT`] were in flight.
    pub saturated: u64,
    /// The latest a request left after its due time.
    pub max_lag: Duration,
}

/// Sends `secs * rate` requests, request i due at i / rate, then waits
/// (bounded) for the last answers. Stops early with the events' error when
/// they fail: a failed restart leaves no sidecar to send to.
pub(crate) async fn drive(
    args: &Args,
    listen: SocketAddr,
    pool: &Pool,
    restart: &Arc<RestartClock>,
    events: &mut Events,
) -> anyhow::Result<Traffic> {
    let total = args.secs * args.rate;
    let period_ns = 1_000_000_000 / args.rate;
    let started = tokio::time::Instant::now();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let results: Arc<Mutex<Vec<Done>>> = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut saturated = 0u64;
    let mut max_lag = Duration::ZERO;
    for i in 0..total {
        if i % args.rate == 0 {
            events.check().await?;
        }
        let due = started + Duration::from_nanos(i * period_ns);
        tokio::time::sleep_until(due).await;
        max_lag = max_lag.max(tokio::time::Instant::now().saturating_duration_since(due));
        while tasks.try_join_next().is_some() {}
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            saturated += 1;
            continue;
        };
        let (pool, restart, sink) = (pool.clone(), Arc::clone(restart), Arc::clone(&results));
        let p = plan(i + 1);
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
    let results = std::mem::take(&mut *lock(&results));
    Ok(Traffic {
        results,
        saturated,
        max_lag,
    })
}
