//! Listeners: the outbound proxy (HTTP/1.1 and h2c) and the admin endpoint,
//! with graceful drain on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::admin::Admin;
use crate::proxy::Proxy;

/// How long a new connection may stay silent before its first bytes, and then
/// how long a client gets to send each whole HTTP/1 request head (request line
/// and headers); past it the connection is closed without an answer, so a slow
/// or silent client cannot hold a connection open indefinitely.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the proxy on `listener` until `shutdown` resolves, then stops
/// accepting and gives in-flight requests up to the configured drain timeout.
/// Returns true when every connection finished within it.
pub async fn serve_proxy(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let graceful = GracefulShutdown::new();
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
    // Ends the wait for a new connection's first bytes when the drain starts.
    let (draining, drain_started) = tokio::sync::watch::channel(());
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
                let _ = stream.set_nodelay(true);
                let proxy = Arc::clone(&proxy);
                let builder = Arc::clone(&builder);
                let watcher = graceful.watcher();
                let mut drain_started = drain_started.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        known = protocol_known(&stream) => if !known { return },
                        _ = drain_started.changed() => return,
                    }
                    let service = service_fn(move |req| Arc::clone(&proxy).handle(req));
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(error = %e, "client connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    let _ = draining.send(());
    drop(listener);
    proxy.start_draining();
    let drain = proxy.routes().config.proxy.drain_timeout;
    tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_ok()
}

/// Waits, up to [`HEADER_READ_TIMEOUT`], until the client has sent enough to
/// tell HTTP/1.1 from h2c; false when it sends nothing (or only a prefix of the
/// HTTP/2 preface) in that time, or closes. hyper's header read timeout only
/// starts once the protocol is known, so without this a client that connects
/// and stays silent would hold its connection open forever.
async fn protocol_known(stream: &tokio::net::TcpStream) -> bool {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let wait = async {
        let mut buf = [0u8; PREFACE.len()];
        loop {
            match stream.peek(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) if n == PREFACE.len() || buf[..n] != PREFACE[..n] => return true,
                // A partial preface: peek returns at once while bytes wait, so pause.
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    tokio::time::timeout(HEADER_READ_TIMEOUT, wait)
        .await
        .unwrap_or(false)
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
