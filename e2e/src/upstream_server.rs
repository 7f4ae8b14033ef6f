//! Upstream HTTP servers for the demo and end-to-end tests: the test kit's
//! upstream with a script that fails a share of requests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::Rng;
use reprise_testkit::upstream::{Action, Upstream};

/// A running upstream and the requests it answered. Dropping it closes it.
#[derive(Debug)]
pub struct UpstreamServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Requests received.
    pub requests: Arc<AtomicU64>,
    _upstream: Upstream,
}

/// Starts an HTTP/1.1 + h2c server on `bind` that answers 503 to a random
/// `fail_percent` of requests and 200 (`hello from NAME`) to the rest.
pub async fn start(
    bind: SocketAddr,
    name: &'static str,
    fail_percent: u32,
) -> std::io::Result<UpstreamServer> {
    let requests = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&requests);
    let upstream = Upstream::builder()
        .bind(bind)
        // Demos and cluster tests run for minutes; nothing reads the bodies.
        .keep_bodies(false)
        .start(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
            if rand::rng().random_range(0..100) < fail_percent {
                Action::text(503, format!("{name}: unavailable\n"))
            } else {
                Action::text(200, format!("hello from {name}\n"))
            }
        })
        .await?;
    Ok(UpstreamServer {
        addr: upstream.addr,
        requests,
        _upstream: upstream,
    })
}
