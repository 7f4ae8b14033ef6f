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
        .header_read_timeout(Duration::from_secs(30))
        .max_buf_size(max_head.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(max_head).unwrap_or(u32::MAX));
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
                let service = service_fn(move |req| Arc::clone(&proxy).handle(req));
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                let conn = graceful.watch(conn.into_owned());
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "client connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    proxy.start_draining();
    let drain = proxy.routes().config.proxy.drain_timeout;
    tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_ok()
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
