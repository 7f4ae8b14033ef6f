//! Upstream HTTP servers for the demo and end-to-end tests.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::Rng;

/// A running upstream and the requests it answered.
#[derive(Debug)]
pub struct UpstreamServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Requests received.
    pub requests: Arc<AtomicU64>,
}

/// Starts an HTTP/1.1 + h2c server on `bind` that answers 503 to a random
/// `fail_percent` of requests and 200 (`hello from NAME`) to the rest.
pub async fn start(
    bind: SocketAddr,
    name: &'static str,
    fail_percent: u32,
) -> std::io::Result<UpstreamServer> {
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let requests = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&requests);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let service = service_fn(move |_req: http::Request<Incoming>| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    let fail = rand::rng().random_range(0..100) < fail_percent;
                    async move {
                        let (status, body) = if fail {
                            (503, format!("{name}: unavailable\n"))
                        } else {
                            (200, format!("hello from {name}\n"))
                        };
                        let mut resp = http::Response::new(Full::new(Bytes::from(body)));
                        *resp.status_mut() =
                            http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(UpstreamServer { addr, requests })
}
