//! The end-to-end tests' application image (`reprise.local/e2e-app:dev`,
//! built by `e2e/images.sh`). One binary plays both sides:
//!
//! - **Server** (every path but the three below): answers `200 hello from
//!   $POD_NAME ($POD_IP)`; when `$POD_NAME` equals `$FLAKY_POD`, a random
//!   `$FLAKY_PERCENT`% of requests get `503` instead. `/unavailable` gets
//!   `503` from every pod, for requests that exhaust their retries. On SIGTERM it keeps
//!   answering (with `Connection: close`), and accepting, for `$DRAIN_MS`
//!   (default 5000: endpoint removal reaches every sidecar within that even
//!   on a loaded 2-core machine) and
//!   exits, as a well-behaved server does while its endpoint is withdrawn.
//!   With `$TLS_CERT_FILE` and `$TLS_KEY_FILE` (PEM) it serves HTTPS instead
//!   of plain HTTP on the same port, offering ALPN `h2` and `http/1.1`; a pod
//!   template picks its pod's own pair with `$(POD_NAME)` in those values.
//!   With TLS and `$GRPC_PORT` it also serves gRPC over TLS there: the test
//!   kit's tonic server (`reprise.test.Echo/Say`, answering `TEXT from
//!   $POD_NAME`) on loopback behind the same certificate; on `$FLAKY_POD`
//!   every other call gets `UNAVAILABLE`. Without TLS, `$GRPC_PORT` serves
//!   the same in clear text (h2c).
//! - **Client**: `GET /drive?url=http://api/&n=100[&interval_ms=10][&timeout_s=120]`
//!   sends `n` GETs one after another, through `$HTTP_PROXY` when it is set
//!   (the injected sidecar), and answers with JSON counts: `ok`, `failed`,
//!   `statuses`, `errors`, the `bodies` seen and the `x-reprise-error`
//!   values of the failures (`reprise_errors`). Bounded: `n` ≤ 100 000 and
//!   the whole run stops at `timeout_s` (≤ 600). With `&chain_tag=T` each
//!   request carries `baggage: chain.request=T-N,chain.sent_ms=<Unix ms>`
//!   and the summary each one's status (`by_id`).
//! - **gRPC client**: `GET /drive-grpc?target=api-grpc:443&n=100[&timeout_s=120]`
//!   makes `n` `Say` calls over h2c to `$HTTP_PROXY` (the sidecar) with that
//!   `:authority`, and answers with JSON counts: `ok`, `failed`, `codes`, the
//!   `bodies` (which pod answered) and `tls_certificate` (failures whose
//!   `grpc-message` names that kind). Bounded like `/drive`.
//! - **Gateway API conformance backend** (what `echo-basic` does for the
//!   upstream conformance tests, ported here: its module is not served to
//!   this machine): `?delay=300ms` on any server path waits that long before
//!   answering; `/retry/...?uuid=U&succeedAfter=N[&responseCode=C][&delayRetry=D]`
//!   fails the first `N` requests of `U` on this pod (status `C`, else a TCP
//!   reset), each after `D`, then answers as any path does. Durations are Go's
//!   (`100ms`, `1s`, `1m`), at most 60 s; at most 10 000 `uuid`s are kept.
//! - `GET /served`: `{"requests": N}`, the requests this pod answered as a
//!   server (every path but these four), for counting attempts at the pods.
//! - `GET /healthz`: `200`, for probes.
//! - **Chain mode** (`$NEXT_HOP`, a host such as `orders`): every other
//!   request is a call to the next hop through `$HTTP_PROXY` (the sidecar),
//!   made as an OpenTelemetry-instrumented application makes it: the
//!   request's `traceparent` and `baggage` extracted and injected with
//!   OpenTelemetry's propagators, the call cancelled when the request's
//!   connection closes (`reprise_e2e::hop`; `$CANCEL_CALLS=false`, or a
//!   request's `?cancel_calls=false`: an app that lets it run on). It
//!   answers with what the next hop answered.
//! - **Last hop** (no `$NEXT_HOP`): `?delay_ms=N` (at most 600 000; default
//!   `$DELAY_MS`) waits before answering, and `?fail_percent=` (default
//!   `$FAIL_PERCENT`) answers 503 to that share of requests on every pod; a gRPC request (`content-type:
//!   application/grpc`) gets one `Echo` message (`hi from $POD_NAME`) and
//!   `grpc-status: 0`, or `UNAVAILABLE` when it fails.
//! - `GET /stats`: what the server did, as JSON: requests `started`,
//!   `finished` and `cancelled` (the caller went away first), the chain's
//!   `calls` and `calls_cancelled`, and at the last hop each request that
//!   came with a `chain.request` baggage entry (`seen`).
//!
//! - **One-shot client**: with `$DRIVE` set (a `/drive` query, e.g.
//!   `url=http://api/&n=100`), it runs that drive at start, prints the JSON
//!   summary and exits (0 when every request succeeded): a Job's or a test
//!   pod's life, shorter than the sidecar's report interval. With
//!   `$READY_ADDR` (`127.0.0.1:15000`, the sidecar's admin port) it waits
//!   for the sidecar's `/ready` first.
//!
//! `PORT` (default 8080) is the listening port, on every address.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::Rng;
use reprise_e2e::hop;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug)]
struct State {
    name: String,
    ip: String,
    fail_percent: u32,
    draining: AtomicBool,
    /// Chain mode: where calls go.
    next: Option<hop::Next>,
    /// The last hop's wait before answering (`$DELAY_MS`), unless the
    /// request's `?delay_ms=` says otherwise.
    delay_ms: u64,
    counts: Arc<hop::Counts>,
    /// The conformance backend's attempts per `uuid`.
    attempts: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Requests answered as a server (`/served` reads it).
    served: std::sync::atomic::AtomicU64,
}

/// `uuid`s the retry simulation keeps at most (then it starts again).
const MAX_UUIDS: usize = 10_000;

/// A Go duration (`300ms`, `1s`, `1m30s`, `1.5s`), at most 60 s.
fn go_duration(s: &str) -> Option<Duration> {
    let mut total = 0.0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let (unit, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else {
            return None;
        };
        rest = &rest[len..];
        total += value * unit;
    }
    (total <= 60.0).then(|| Duration::from_secs_f64(total))
}

/// The value of the query parameter `name` in `query`, decoded.
fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v))
    })
}

/// What the conformance backend's retry simulation does with a request.
enum Simulated {
    /// Answer normally.
    Answer,
    /// Fail with this status.
    Status(u16),
    /// Reset the connection.
    Reset,
}

/// The retry simulation (`/retry/...`): the first `succeedAfter` requests
/// of a `uuid` fail, each after `delayRetry`.
async fn simulate(state: &State, query: &str) -> Result<Simulated, String> {
    let uuid = param(query, "uuid").ok_or("uuid is required")?;
    let succeed_after: u64 = param(query, "succeedAfter")
        .and_then(|v| v.parse().ok())
        .ok_or("succeedAfter is required")?;
    let fail = {
        let mut attempts = state.attempts.lock().unwrap_or_else(|e| e.into_inner());
        if attempts.len() >= MAX_UUIDS && !attempts.contains_key(&uuid) {
            attempts.clear();
        }
        let n = attempts.entry(uuid).or_default();
        let fail = *n < succeed_after;
        if fail {
            *n += 1;
        }
        fail
    };
    if !fail {
        return Ok(Simulated::Answer);
    }
    if let Some(d) = param(query, "delayRetry") {
        tokio::time::sleep(go_duration(&d).ok_or("delayRetry: not a duration")?).await;
    }
    Ok(
        match param(query, "responseCode").and_then(|c| c.parse().ok()) {
            Some(code) => Simulated::Status(code),
            None => Simulated::Reset,
        },
    )
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let one_shot = env("DRIVE");
    if !one_shot.is_empty() {
        // `$READY_ADDR` (the sidecar's admin address): its /ready first, so
        // the calls go out once the sidecar has its configuration.
        if let Ok(admin) = env("READY_ADDR").parse::<SocketAddr>() {
            wait_ready(admin, Duration::from_secs(30)).await;
        }
        let summary = drive(&one_shot).await?;
        println!("{summary}");
        let failed = serde_json::from_str::<serde_json::Value>(&summary)
            .map(|s| s["failed"].as_u64().unwrap_or(1))
            .unwrap_or(1);
        std::process::exit(i32::from(failed > 0));
    }
    let port: u16 = env("PORT").parse().unwrap_or(8080);
    let name = env("POD_NAME");
    let flaky = !name.is_empty() && env("FLAKY_POD") == name;
    let next = match env("NEXT_HOP") {
        host if host.is_empty() => None,
        host => Some(hop::Next {
            host,
            sidecar: proxy_addr()
                .ok_or_else(|| anyhow::anyhow!("NEXT_HOP needs HTTP_PROXY (the sidecar)"))?,
            detached: env("CANCEL_CALLS") == "false",
        }),
    };
    let state = Arc::new(State {
        ip: env("POD_IP"),
        fail_percent: if flaky {
            env("FLAKY_PERCENT").parse().unwrap_or(50).min(100)
        } else {
            env("FAIL_PERCENT").parse().unwrap_or(0).min(100)
        },
        name,
        draining: AtomicBool::new(false),
        next,
        delay_ms: env("DELAY_MS").parse().unwrap_or(0),
        counts: Arc::default(),
        attempts: std::sync::Mutex::default(),
        served: std::sync::atomic::AtomicU64::new(0),
    });
    let drain = Duration::from_millis(env("DRAIN_MS").parse().unwrap_or(5000));
    let tls = tls_acceptor()?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))).await?;
    eprintln!(
        "reprise-e2e-app listening on :{port} (pod {:?}, failing {}%, {}, next hop {:?})",
        state.name,
        state.fail_percent,
        if tls.is_some() { "https" } else { "http" },
        state.next.as_ref().map(|n| n.host.as_str())
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Its own task: the listener keeps accepting through the drain. (Dropped
    // at SIGTERM, it refused new connections at once, and a client whose
    // keep-alive connection got `Connection: close` had nowhere to go until
    // its proxy heard that the endpoint was gone.)
    let state_for_accept = Arc::clone(&state);
    let tls_for_accept = tls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let state = Arc::clone(&state_for_accept);
            let tls = tls_for_accept.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(Arc::clone(&state), req));
                let server = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    // A failed handshake (a client that does not trust this
                    // pod's certificate) just ends the connection.
                    Some(tls) => {
                        if let Ok(stream) = tls.accept(stream).await {
                            let _ = server.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                    None => {
                        let _ = server.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
            });
        }
    });
    if let Ok(grpc_port) = env("GRPC_PORT").parse::<u16>() {
        match tls.clone() {
            Some(tls) => grpc_over_tls(grpc_port, tls, &state.name, state.fail_percent > 0).await?,
            // In clear text the tonic server listens on the port itself (h2c).
            None => {
                let flaky = state.fail_percent > 0;
                let _server = reprise_testkit::grpc::GrpcServer::start_on(
                    SocketAddr::from(([0, 0, 0, 0], grpc_port)),
                    &state.name,
                    move |n| grpc_answer(flaky, n),
                )
                .await;
                eprintln!("reprise-e2e-app: gRPC (h2c) on :{grpc_port}");
            }
        }
    }
    term.recv().await;
    eprintln!("SIGTERM: draining for {drain:?}");
    state.draining.store(true, Ordering::Relaxed);
    // Keep serving while the endpoint is withdrawn everywhere.
    tokio::time::sleep(drain).await;
    Ok(())
}

/// gRPC over TLS on `port`: the test kit's tonic server on loopback, and
/// in front of it the pod's TLS, each connection's bytes relayed to it.
async fn grpc_over_tls(
    port: u16,
    tls: tokio_rustls::TlsAcceptor,
    name: &str,
    flaky: bool,
) -> anyhow::Result<()> {
    use reprise_testkit::grpc::GrpcServer;
    let server = GrpcServer::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), name, move |n| {
        grpc_answer(flaky, n)
    })
    .await;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))).await?;
    eprintln!("reprise-e2e-app: gRPC over TLS on :{port}");
    tokio::spawn(async move {
        let backend = server.addr;
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = tls.accept(stream).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut stream, &mut plain).await;
            });
        }
    });
    Ok(())
}

/// On the flaky pod every other call gets `UNAVAILABLE`.
fn grpc_answer(flaky: bool, n: usize) -> reprise_testkit::grpc::GrpcAction {
    use reprise_testkit::grpc::GrpcAction;
    if flaky && n.is_multiple_of(2) {
        GrpcAction::TrailersOnly(tonic::Code::Unavailable, None)
    } else {
        GrpcAction::Ok
    }
}

/// Waits (at most `within`) until `GET /ready` at `admin` answers 200.
async fn wait_ready(admin: SocketAddr, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(mut s) = tokio::net::TcpStream::connect(admin).await {
            let _ = s
                .write_all(b"GET /ready HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n\r\n")
                .await;
            let mut head = [0u8; 12];
            if s.read_exact(&mut head).await.is_ok() && head.ends_with(b" 200") {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{admin}/ready did not answer 200 within {within:?}: driving anyway");
}

/// `/drive-grpc`: makes the calls and returns the JSON summary.
async fn drive_grpc(query: &str) -> anyhow::Result<String> {
    let mut target = String::new();
    let (mut n, mut timeout_s) = (1u64, 120u64);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "target" => target = percent_decode(v),
            "n" => n = v.parse()?,
            "timeout_s" => timeout_s = v.parse()?,
            _ => anyhow::bail!("unknown parameter {k}"),
        }
    }
    anyhow::ensure!(n <= 100_000, "n must be at most 100000");
    anyhow::ensure!(timeout_s <= 600, "timeout_s must be at most 600");
    let proxy = std::env::var("HTTP_PROXY")
        .or_else(|_| std::env::var("http_proxy"))
        .map_err(|_| anyhow::anyhow!("no HTTP_PROXY: /drive-grpc calls through the sidecar"))?;
    let sidecar: SocketAddr = proxy
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()?;
    let channel = tokio::time::timeout(
        Duration::from_secs(10),
        reprise_testkit::grpc::channel(sidecar, &target),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no h2c connection to {sidecar} in 10 s"))?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(timeout_s);
    let (mut ok, mut failed, mut sent, mut tls_certificate) = (0u64, 0u64, 0u64, 0u64);
    let mut codes = BTreeMap::<String, u64>::new();
    let mut bodies = BTreeMap::<String, u64>::new();
    let mut first_failures = Vec::new();
    while sent < n && Instant::now() < deadline {
        sent += 1;
        let one = tokio::time::timeout(
            Duration::from_secs(10),
            reprise_testkit::grpc::say(&channel, "hi", &[]),
        )
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer in 10 s")));
        match one {
            Ok(echo) => {
                ok += 1;
                *codes.entry("OK".into()).or_default() += 1;
                // "hi from api-0" -> "api-0"
                let who = echo.text.rsplit(' ').next().unwrap_or("?").to_string();
                *bodies.entry(who).or_default() += 1;
            }
            Err(status) => {
                failed += 1;
                *codes.entry(format!("{:?}", status.code())).or_default() += 1;
                if status.message().contains("tls_certificate") {
                    tls_certificate += 1;
                }
                if first_failures.len() < 5 {
                    first_failures.push(format!("{:?}: {}", status.code(), status.message()));
                }
            }
        }
    }
    Ok(serde_json::json!({
        "target": target,
        "sidecar": sidecar.to_string(),
        "requested": n,
        "sent": sent,
        "ok": ok,
        "failed": failed,
        "codes": codes,
        "bodies": bodies,
        "tls_certificate": tls_certificate,
        "first_failures": first_failures,
        "duration_ms": start.elapsed().as_millis() as u64,
    })
    .to_string())
}

/// The TLS acceptor when `$TLS_CERT_FILE` and `$TLS_KEY_FILE` are set.
fn tls_acceptor() -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (cert, key) = (env("TLS_CERT_FILE"), env("TLS_KEY_FILE"));
    if cert.is_empty() && key.is_empty() {
        return Ok(None);
    }
    anyhow::ensure!(
        !cert.is_empty() && !key.is_empty(),
        "TLS_CERT_FILE and TLS_KEY_FILE go together"
    );
    let chain = CertificateDer::pem_file_iter(&cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("{cert}: {e}"))?;
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    // Both, as a real server would: the sidecar's `protocol: auto` picks by ALPN.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
}

/// The error a handler returns to have the connection reset (the
/// conformance backend's TCP failure mode).
#[derive(Debug)]
struct ResetConnection;

impl std::fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reset by the retry simulation")
    }
}

impl std::error::Error for ResetConnection {}

async fn handle(
    state: Arc<State>,
    req: http::Request<Incoming>,
) -> Result<http::Response<hop::Body>, ResetConnection> {
    let query = req.uri().query().unwrap_or("").to_string();
    let path = req.uri().path().to_string();
    let conformance = !matches!(
        path.as_str(),
        "/healthz" | "/drive" | "/drive-grpc" | "/served" | "/stats"
    );
    if path == "/served" {
        let n = state.served.load(Ordering::Relaxed);
        return Ok(respond(
            &state,
            200,
            format!("{{\"requests\":{n}}}"),
            "application/json",
        ));
    }
    if conformance {
        state.served.fetch_add(1, Ordering::Relaxed);
    }
    if conformance && path.starts_with("/retry/") {
        match simulate(&state, &query).await {
            Ok(Simulated::Answer) => {}
            Ok(Simulated::Status(code)) => {
                return Ok(respond(
                    &state,
                    code,
                    format!("{}: failed ({code})\n", state.name),
                    "text/plain",
                ))
            }
            // hyper closes the connection on a service error; with
            // SO_LINGER 0 unavailable here, the peer sees it end without a
            // response, which a proxy takes as a reset.
            Ok(Simulated::Reset) => return Err(ResetConnection),
            Err(e) => return Ok(respond(&state, 400, format!("{e}\n"), "text/plain")),
        }
    }
    if conformance {
        if let Some(d) = param(&query, "delay") {
            match go_duration(&d) {
                Some(d) => tokio::time::sleep(d).await,
                None => {
                    return Ok(respond(
                        &state,
                        400,
                        "delay: not a duration\n".into(),
                        "text/plain",
                    ))
                }
            }
        }
    }
    let (status, body, content_type) = match path.as_str() {
        "/healthz" => (200, "ok\n".to_string(), "text/plain"),
        "/stats" => (200, state.counts.json().to_string(), "application/json"),
        "/drive" => match drive(&query).await {
            Ok(json) => (200, json, "application/json"),
            Err(e) => (400, format!("{e}\n"), "text/plain"),
        },
        "/drive-grpc" => match drive_grpc(&query).await {
            Ok(json) => (200, json, "application/json"),
            Err(e) => (400, format!("{e}\n"), "text/plain"),
        },
        _ => {
            let guard = state.counts.request();
            let mut resp = match &state.next {
                Some(next) => {
                    // `?cancel_calls=false` makes this request's hops ones
                    // that let their calls run on.
                    let mut next = next.clone();
                    if query.split('&').any(|p| p == "cancel_calls=false") {
                        next.detached = true;
                    }
                    hop::forward(req, &next, &state.counts).await
                }
                None => last_hop(&state, &req, &query).await,
            };
            guard.finish();
            closing(&state, &mut resp);
            return Ok(resp);
        }
    };
    Ok(respond(&state, status, body, content_type))
}

fn respond(
    state: &State,
    status: u16,
    body: String,
    content_type: &'static str,
) -> http::Response<hop::Body> {
    let mut resp = hop::text(status, body);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    closing(state, &mut resp);
    resp
}

/// `Connection: close` on every answer while draining.
fn closing(state: &State, resp: &mut http::Response<hop::Body>) {
    if state.draining.load(Ordering::Relaxed) {
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
}

/// The last hop's answer: after `?delay_ms=`, a failure for a share of
/// requests, else hello; a gRPC request's answer is gRPC.
async fn last_hop(
    state: &State,
    req: &http::Request<Incoming>,
    query: &str,
) -> http::Response<hop::Body> {
    let seen = state.counts.saw(req.headers());
    let resp = last_hop_answer(state, req, query).await;
    state.counts.answered(seen, resp.status().as_u16());
    resp
}

async fn last_hop_answer(
    state: &State,
    req: &http::Request<Incoming>,
    query: &str,
) -> http::Response<hop::Body> {
    let delay_ms = query
        .split('&')
        .find_map(|p| p.strip_prefix("delay_ms="))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(state.delay_ms)
        .min(600_000);
    if delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    let fail_percent = query
        .split('&')
        .find_map(|p| p.strip_prefix("fail_percent="))
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(state.fail_percent, |p| p.min(100));
    let fail =
        req.uri().path() == "/unavailable" || rand::rng().random_range(0..100) < fail_percent;
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        return grpc_hop_answer(&state.name, fail);
    }
    if fail {
        hop::text(503, format!("{}: unavailable\n", state.name))
    } else {
        hop::text(200, format!("hello from {} ({})\n", state.name, state.ip))
    }
}

/// A unary gRPC answer: one `Echo { text: "hi from NAME" }` message and
/// `grpc-status: 0`, or a Trailers-Only `UNAVAILABLE`.
fn grpc_hop_answer(name: &str, fail: bool) -> http::Response<hop::Body> {
    use http_body_util::BodyExt;
    let mut resp = if fail {
        let mut r =
            http::Response::new(http_body_util::Empty::new().map_err(|e| match e {}).boxed());
        r.headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("14"));
        r
    } else {
        // Echo's field 1 (a string): tag, length, bytes; then the gRPC
        // frame: uncompressed, length, message.
        let text = format!("hi from {name}");
        let mut message = vec![0x0a, text.len() as u8];
        message.extend_from_slice(text.as_bytes());
        let mut frame = vec![0u8];
        frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
        frame.extend_from_slice(&message);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let frames = [
            hyper::body::Frame::data(Bytes::from(frame)),
            hyper::body::Frame::trailers(trailers),
        ];
        http::Response::new(
            http_body_util::StreamBody::new(futures_util::stream::iter(
                frames.into_iter().map(Ok::<_, Infallible>),
            ))
            .boxed(),
        )
    };
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// `$HTTP_PROXY`'s address, when it is `http://IP:PORT`.
fn proxy_addr() -> Option<SocketAddr> {
    std::env::var("HTTP_PROXY")
        .or_else(|_| std::env::var("http_proxy"))
        .ok()?
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .ok()
}

/// `/drive`: sends the requests and returns the JSON summary.
async fn drive(query: &str) -> anyhow::Result<String> {
    let mut url = String::new();
    let mut chain_tag = None;
    let (mut n, mut interval_ms, mut timeout_s) = (1u64, 0u64, 120u64);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "url" => url = percent_decode(v),
            "n" => n = v.parse()?,
            "interval_ms" => interval_ms = v.parse()?,
            "timeout_s" => timeout_s = v.parse()?,
            "chain_tag" => chain_tag = Some(percent_decode(v)),
            _ => anyhow::bail!("unknown parameter {k}"),
        }
    }
    anyhow::ensure!(
        chain_tag.as_deref().is_none_or(
            |t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        ),
        "chain_tag must be letters, digits and dashes"
    );
    anyhow::ensure!(n <= 100_000, "n must be at most 100000");
    anyhow::ensure!(timeout_s <= 600, "timeout_s must be at most 600");
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("url must start with http://"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let host = authority.split(':').next().unwrap_or(authority).to_string();
    // Like curl: absolute-form to $HTTP_PROXY when set, else straight to the host.
    let proxy = std::env::var("HTTP_PROXY")
        .or_else(|_| std::env::var("http_proxy"))
        .ok()
        .filter(|p| !p.is_empty());
    let (connect_to, target) = match &proxy {
        Some(p) => (
            p.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
            url.clone(),
        ),
        None => (
            if authority.contains(':') {
                authority.to_string()
            } else {
                format!("{authority}:80")
            },
            path.to_string(),
        ),
    };
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: reprise-e2e-app\r\nConnection: close\r\n\r\n"
    );
    let start = Instant::now();
    let deadline = start + Duration::from_secs(timeout_s);
    let (mut ok, mut failed, mut sent) = (0u64, 0u64, 0u64);
    let mut statuses = BTreeMap::<String, u64>::new();
    let mut errors = BTreeMap::<String, u64>::new();
    let mut bodies = BTreeMap::<String, u64>::new();
    let mut reprise_errors = BTreeMap::<String, u64>::new();
    let mut first_failures = Vec::new();
    let mut by_id = BTreeMap::<String, u16>::new();
    while sent < n && Instant::now() < deadline {
        sent += 1;
        // With a tag, each request names itself and its send time in its
        // baggage, for the chain's last hop to record (`/stats`).
        let tagged;
        let (request, id) = match &chain_tag {
            Some(tag) => {
                let id = format!("{tag}-{sent}");
                tagged = request.replacen(
                    "\r\n\r\n",
                    &format!(
                        "\r\nbaggage: chain.request={id},chain.sent_ms={}\r\n\r\n",
                        hop::now_ms()
                    ),
                    1,
                );
                (tagged.as_str(), Some(id))
            }
            None => (request.as_str(), None),
        };
        let one = tokio::time::timeout(
            Duration::from_secs(10),
            once(&connect_to, request.as_bytes()),
        )
        .await
        .unwrap_or_else(|_| Err("timeout".to_string()));
        if let Some(id) = id {
            by_id.insert(id, one.as_ref().map_or(0, |(status, _, _)| *status));
        }
        match one {
            Ok((status, body, reprise_error)) => {
                if let Some(kind) = reprise_error {
                    *reprise_errors.entry(kind).or_default() += 1;
                }
                *statuses.entry(status.to_string()).or_default() += 1;
                if status == 200 {
                    ok += 1;
                    // "hello from api-1 (10.244.0.7)" -> "api-1"
                    let who = body
                        .trim()
                        .strip_prefix("hello from ")
                        .and_then(|s| s.split(' ').next())
                        .unwrap_or("?")
                        .to_string();
                    *bodies.entry(who).or_default() += 1;
                } else {
                    failed += 1;
                    if first_failures.len() < 5 {
                        first_failures.push(format!("{status}: {}", body.trim()));
                    }
                }
            }
            Err(e) => {
                failed += 1;
                if first_failures.len() < 5 {
                    first_failures.push(e.clone());
                }
                *errors.entry(e).or_default() += 1;
            }
        }
        if interval_ms > 0 {
            tokio::time::sleep(Duration::from_millis(interval_ms)).await;
        }
    }
    Ok(serde_json::json!({
        "url": url,
        "host": host,
        "proxy": proxy,
        "requested": n,
        "sent": sent,
        "ok": ok,
        "failed": failed,
        "statuses": statuses,
        "errors": errors,
        "bodies": bodies,
        "reprise_errors": reprise_errors,
        "first_failures": first_failures,
        "by_id": by_id,
        "duration_ms": start.elapsed().as_millis() as u64,
    })
    .to_string())
}

/// One GET on a new connection; the status, body and `x-reprise-error`
/// header, or an error kind.
async fn once(connect_to: &str, request: &[u8]) -> Result<(u16, String, Option<String>), String> {
    let mut s = tokio::net::TcpStream::connect(connect_to)
        .await
        .map_err(|e| format!("connect: {}", e.kind()))?;
    s.write_all(request)
        .await
        .map_err(|e| format!("write: {}", e.kind()))?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .await
        .map_err(|e| format!("read: {}", e.kind()))?;
    let text = String::from_utf8_lossy(&out);
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "no status line".to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let reprise_error = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("x-reprise-error")
            .then(|| value.trim().to_string())
    });
    Ok((status, body.to_string(), reprise_error))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
