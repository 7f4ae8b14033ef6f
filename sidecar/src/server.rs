//! Listeners: the outbound proxy (HTTP/1.1 and h2c) and the admin endpoint,
//! with graceful drain on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use http::header::{HeaderValue, CONNECTION};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::admin::Admin;
use crate::proxy::Proxy;
use crate::response_body::ProxyBody;

/// How long a new connection may stay silent before its first bytes, and then
/// how long a client gets to send each whole HTTP/1 request head (request line
/// and headers); past it the connection is closed without an answer, so a slow
/// or silent client cannot hold a connection open indefinitely.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long, after the drain starts, an idle HTTP/1 keep-alive connection (or
/// an accepted one that has not spoken yet) stays open. Its client could not
/// know about the drain (its last response carried no `Connection: close`), so
/// a request it sends in this window is still answered, with `Connection:
/// close`; one second covers a request already on the wire plus a client's
/// usual pause between requests without holding shutdown up for long.
/// Connections still idle after it are closed. A request that arrives just as
/// they close can still be lost: the window narrows that race, it cannot end it.
pub const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// Most connections taken from the listen backlog when the drain starts (the
/// kernel's default `somaxconn` is 4096; one burst of clients is what matters).
const MAX_BACKLOG_ON_DRAIN: usize = 4096;

/// Where the drain is, as seen by every connection task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    /// Shutdown began: HTTP/1 responses carry `Connection: close`, HTTP/2
    /// connections get GOAWAY.
    Draining,
    /// The grace window is over: HTTP/1 connections close once idle.
    ClosingIdle,
}

/// Serves the proxy on `listener` until `shutdown` resolves, then drains: stops
/// accepting, sends `Connection: close` on every HTTP/1 response and GOAWAY on
/// HTTP/2, keeps idle HTTP/1 connections open for [`DRAIN_IDLE_GRACE`] (at
/// most half the drain timeout) and closes them after that. Requests in flight
/// get up to the configured drain timeout. Returns true when every connection
/// finished within it.
pub async fn serve_proxy(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    let max_head = proxy.routes().config.proxy.max_request_header_bytes;
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(max_head.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(max_head).unwrap_or(u32::MAX));
    let builder = Arc::new(builder);
    // Every connection task holds a receiver, so `phase.closed()` also tells
    // when the last connection has finished.
    let (phase, phase_rx) = watch::channel(Phase::Serving);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and similar: back off briefly, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                spawn_connection(stream, &proxy, &builder, &phase_rx);
            }
            () = &mut shutdown => break,
        }
    }
    // First, so that every response from now on carries `Connection: close`.
    proxy.start_draining();
    // Connections the kernel has completed but this loop has not accepted yet
    // would be reset when the listener closes, their requests lost: take them
    // in (at most a backlog's worth) and serve them like the others.
    for _ in 0..MAX_BACKLOG_ON_DRAIN {
        match listener.accept().now_or_never() {
            Some(Ok((stream, _))) => spawn_connection(stream, &proxy, &builder, &phase_rx),
            _ => break,
        }
    }
    drop(listener);
    drop(phase_rx);
    let _ = phase.send(Phase::Draining);
    let drain = proxy.routes().config.proxy.drain_timeout;
    let grace = DRAIN_IDLE_GRACE.min(drain / 2);
    let finished = async {
        tokio::select! {
            () = phase.closed() => return,
            () = tokio::time::sleep(grace) => {}
        }
        let _ = phase.send(Phase::ClosingIdle);
        phase.closed().await;
    };
    tokio::time::timeout(drain, finished).await.is_ok()
}

fn spawn_connection(
    stream: TcpStream,
    proxy: &Arc<Proxy>,
    builder: &Arc<auto::Builder<TokioExecutor>>,
    phase: &watch::Receiver<Phase>,
) {
    let _ = stream.set_nodelay(true);
    tokio::spawn(serve_connection(
        stream,
        Arc::clone(proxy),
        Arc::clone(builder),
        phase.clone(),
    ));
}

/// Serves one accepted connection, following the drain `phase`.
async fn serve_connection(
    stream: TcpStream,
    proxy: Arc<Proxy>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    mut phase: watch::Receiver<Phase>,
) {
    // Biased: a client whose bytes are already here is served even if the
    // drain has started; a silent one gets the grace window, then is dropped.
    let h2 = tokio::select! {
        biased;
        detected = detect_protocol(&stream) => match detected {
            Some(h2) => h2,
            None => return,
        },
        () = reached(&mut phase, Phase::ClosingIdle) => return,
    };
    let service = service_fn(move |req| serve_request(Arc::clone(&proxy), req));
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(conn);
    // HTTP/2's GOAWAY lets streams in flight finish and tells the client
    // exactly which were not processed, so it goes out at once; HTTP/1 has no
    // such signal for an idle connection, hence the grace window.
    let shut_at = if h2 {
        Phase::Draining
    } else {
        Phase::ClosingIdle
    };
    // Biased: the connection is polled before any shutdown, which would
    // otherwise cancel it while hyper is still reading its preface.
    let result = tokio::select! {
        biased;
        result = conn.as_mut() => result,
        () = reached(&mut phase, shut_at) => {
            // Closes an idle HTTP/1 connection now and a busy one after its
            // response; sends GOAWAY on HTTP/2.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "client connection ended with an error");
    }
}

/// Resolves once the drain has reached `at` (or `serve_proxy` is gone).
async fn reached(phase: &mut watch::Receiver<Phase>, at: Phase) {
    let _ = phase.wait_for(|p| *p >= at).await;
}

/// Handles one request; while draining, an HTTP/1 response also carries
/// `Connection: close`, after which hyper closes the connection, so the client
/// opens its next request on a new connection (to a pod that is not leaving).
async fn serve_request(
    proxy: Arc<Proxy>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let http1 = req.version() <= Version::HTTP_11;
    let connect = req.method() == Method::CONNECT;
    let mut response = Arc::clone(&proxy).handle(req).await?;
    // An upgrade or an established tunnel takes over the connection: it must
    // not be told to close. HTTP/2 has no Connection header (RFC 9113 §8.2.2).
    let takes_over = response.status() == StatusCode::SWITCHING_PROTOCOLS
        || (connect && response.status().is_success());
    if http1 && !takes_over && proxy.is_draining() {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(response)
}

/// Waits, up to [`HEADER_READ_TIMEOUT`], until the client has sent enough to
/// tell HTTP/1.1 from h2c: `Some(true)` for h2c (the whole HTTP/2 preface),
/// `Some(false)` for HTTP/1; `None` when it sends nothing (or only a prefix of
/// the preface) in that time, or closes. hyper's header read timeout only
/// starts once the protocol is known, so without this a client that connects
/// and stays silent would hold its connection open forever.
async fn detect_protocol(stream: &TcpStream) -> Option<bool> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let wait = async {
        let mut buf = [0u8; PREFACE.len()];
        loop {
            match stream.peek(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) if n == PREFACE.len() => return Some(buf == PREFACE),
                Ok(n) if buf[..n] != PREFACE[..n] => return Some(false),
                // A partial preface: peek returns at once while bytes wait, so pause.
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    tokio::time::timeout(HEADER_READ_TIMEOUT, wait)
        .await
        .ok()
        .flatten()
}

/// Serves the admin endpoint on `listener` forever.
pub async fn serve_admin(listener: TcpListener, admin: Admin) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| admin.clone().handle(req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
