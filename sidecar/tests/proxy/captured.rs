//! The transparent listener without redirect rules: a connection made to it
//! directly has no original destination other than the listener itself, and
//! is reset at once (no loops). The captured paths themselves need the
//! rules, in a network namespace: `sidecar/tests/transparent.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reprise_sidecar::{serve, Listeners, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{api, Action, Upstream};

#[tokio::test]
async fn a_direct_connection_to_the_transparent_listener_is_reset() {
    let up = Upstream::always(Action::Reply(200)).await;
    let proxy = Proxy::new(reprise_testkit::config::Config::from(api(&[&up])).resolve());
    let explicit = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let transparent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = transparent.local_addr().expect("addr");
    let listeners = Listeners {
        proxy: explicit,
        transparent: vec![transparent],
        others: Vec::new(),
    };
    let served = tokio::spawn(serve(listeners, Arc::clone(&proxy), std::future::pending()));
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream
        .write_all(b"GET / HTTP/1.1\r\nHost: api\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(
        matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
            || matches!(read, Ok(0)),
        "{read:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1), "at once");
    assert!(up.received().is_empty(), "nothing reached the upstream");
    let metrics = reprise_sidecar::server::metrics_text(&proxy);
    let refused = |reason: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "reprise_captured_refused_total{{reason=\"{reason}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // With connection tracking loaded the "original" destination is the
    // listener itself (a loop); without it there is none.
    assert_eq!(
        refused("loop") + refused("no_original_destination"),
        1,
        "{metrics}"
    );
    served.abort();
}
