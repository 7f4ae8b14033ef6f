//! The listeners: the outbound proxy (HTTP/1.1 and h2c, told apart by their
//! first bytes in [`sniff`]), with the graceful drain of [`drain`] on
//! shutdown, and the admin endpoint ([`admin`]).

pub(crate) mod admin;
pub(crate) mod drain;
mod sniff;

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

pub use self::admin::{Admin, LogLevelSetter};
use self::drain::{reached, ConnDrain, Drain, DrainPhase, ServedBody};
use self::sniff::Protocol;
use crate::clock;
use crate::proxy::Proxy;

/// How long a new connection may stay silent before its first bytes, and then
/// how long a client gets to send each whole HTTP/1 request head (request line
/// and headers); past it the connection is closed without an answer, so a slow
/// or silent client cannot hold a connection open indefinitely.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long, after the drain starts, an idle HTTP/1 keep-alive connection (or
/// an accepted one that has not spoken yet) stays open; for a connection
/// whose last response was still streaming at the signal, counted from that
/// response's end. Its client could not know about the drain (its last
/// response carried no `Connection: close`), so a request it sends in this
/// window is still answered, with `Connection: close`; one second covers a
/// request already on the wire plus a client's usual pause between requests
/// without holding shutdown up for long. Connections still quiet after it are
/// closed. A request that arrives just as they close can still be lost: the
/// window narrows that race, it cannot end it.
pub const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// Most connections taken from the listen backlog when the drain starts (the
/// kernel's default `somaxconn` is 4096; one burst of clients is what matters).
const MAX_BACKLOG_ON_DRAIN: usize = 4096;

/// Serves the proxy on `listener` until `shutdown` resolves, then drains (see
/// [`drain`]): stops accepting, sends `Connection: close` on every HTTP/1
/// response and GOAWAY on HTTP/2, closes quiet HTTP/1 connections after
/// [`DRAIN_IDLE_GRACE`] (at most half the drain timeout). Requests in flight,
/// tunnels and upgraded connections get up to the configured drain timeout.
/// Returns true when all of them finished within it.
pub async fn serve_proxy(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    let config = proxy.config();
    let max_head = config.proxy.max_request_header_bytes;
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
    // Every connection task holds a receiver, so `drain.closed()` also tells
    // when the last connection has finished.
    let (drain, drain_rx) = watch::channel(Drain::SERVING);
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
                spawn_connection(stream, &proxy, &builder, &drain_rx);
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
            Some(Ok((stream, _))) => spawn_connection(stream, &proxy, &builder, &drain_rx),
            _ => break,
        }
    }
    drop(listener);
    drop(drain_rx);
    let timeout = proxy.config().proxy.drain_timeout;
    let grace = DRAIN_IDLE_GRACE.min(timeout / 2);
    let _ = drain.send(Drain {
        phase: DrainPhase::Draining,
        started_ms: clock::now_ms(),
        grace,
    });
    let finished = async {
        tokio::select! {
            () = drain.closed() => {}
            () = tokio::time::sleep(grace) => {
                drain.send_modify(|d| d.phase = DrainPhase::ClosingIdle);
                drain.closed().await;
            }
        }
        proxy.tunnels().idle().await;
    };
    tokio::time::timeout(timeout, finished).await.is_ok()
}

fn spawn_connection(
    stream: TcpStream,
    proxy: &Arc<Proxy>,
    builder: &Arc<auto::Builder<TokioExecutor>>,
    drain: &watch::Receiver<Drain>,
) {
    let _ = stream.set_nodelay(true);
    tokio::spawn(serve_connection(
        stream,
        Arc::clone(proxy),
        Arc::clone(builder),
        drain.clone(),
    ));
}

/// Serves one accepted connection, following the drain.
async fn serve_connection(
    stream: TcpStream,
    proxy: Arc<Proxy>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    mut drain: watch::Receiver<Drain>,
) {
    // Biased: a client whose bytes are already here is served even if the
    // drain has started; a silent one gets the grace window, then is dropped.
    let protocol = tokio::select! {
        biased;
        detected = sniff::detect(&stream) => match detected {
            Some(p) => p,
            None => return,
        },
        () = reached(&mut drain, DrainPhase::ClosingIdle) => return,
    };
    let conn_drain = (protocol == Protocol::Http1).then(|| Arc::new(ConnDrain::default()));
    let responses = conn_drain.clone();
    let service = service_fn(move |req| serve_request(Arc::clone(&proxy), req, responses.clone()));
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(conn);
    // HTTP/2's GOAWAY lets streams in flight finish and tells the client
    // exactly which were not processed, so it goes out at once; HTTP/1 has no
    // such signal for an idle connection, hence the wait for a quiet one.
    let quiet = async {
        reached(&mut drain, DrainPhase::Draining).await;
        if let Some(c) = &conn_drain {
            let d = *drain.borrow();
            c.quiet(d.started_ms, d.grace).await;
        }
    };
    // Biased: the connection is polled before any shutdown, which would
    // otherwise cancel it while hyper is still reading its preface.
    let result = tokio::select! {
        biased;
        result = conn.as_mut() => result,
        () = quiet => {
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

/// Handles one request; while draining, an HTTP/1 response also carries
/// `Connection: close`, after which hyper closes the connection, so the client
/// opens its next request on a new connection (to a pod that is not leaving).
async fn serve_request(
    proxy: Arc<Proxy>,
    req: Request<Incoming>,
    conn: Option<Arc<ConnDrain>>,
) -> Result<Response<ServedBody>, Infallible> {
    let end = conn.as_ref().map(ConnDrain::request);
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
    Ok(response.map(|body| ServedBody::new(body, end)))
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
