//! The binary's listeners as a careless operator or a flood meets them: an
//! admin listener off loopback is warned about, and the health listener
//! (on the pod's IP in Kubernetes) closes connections over its cap at once.

use std::net::SocketAddr;
use std::time::Duration;

use reprise_sidecar::server::ADMIN_MAX_CONNECTIONS;
use reprise_testkit::sidecar::{free_addr, Launch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use reprise_testkit::prometheus::Metrics;

use crate::cli::{config_file, start, status, EXIT_WITHIN};
use crate::support::{api, Action, Config, ProxyConfig, Sidecar, Upstream};

const BIN: &str = env!("CARGO_BIN_EXE_reprise-sidecar");

/// True when a new connection to `addr` is closed at once: its reset can
/// come before the connect has even returned, or on the first read.
async fn closed_at_once(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return true;
    };
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
    matches!(read, Ok(Ok(0) | Err(_)))
}

/// Log lines warning that the admin listener is not on loopback.
fn warnings(lines: &[String]) -> Vec<&String> {
    lines
        .iter()
        .filter(|l| l.contains("\"WARN\"") && l.contains("admin listener is not on loopback"))
        .collect()
}

#[tokio::test]
async fn an_admin_listener_off_loopback_is_warned_about() {
    let up = Upstream::always(Action::Reply(200)).await;
    let path = config_file("admin-exposed", api(&[&up]));
    let exposed = SocketAddr::from(([0, 0, 0, 0], free_addr().port()));
    let mut sidecar = Launch::new(BIN, &path)
        .admin(exposed)
        .start()
        .await
        .expect("the sidecar starts");
    sidecar.stop(EXIT_WITHIN).await.expect("exit");
    assert_eq!(warnings(&sidecar.lines()).len(), 1, "{:?}", sidecar.lines());
    // On loopback (the default): no warning.
    let mut quiet = start(&path, &[]).await;
    quiet.stop(EXIT_WITHIN).await.expect("exit");
    assert!(warnings(&quiet.lines()).is_empty(), "{:?}", quiet.lines());
}

#[tokio::test]
async fn the_health_listener_closes_connections_over_its_cap_and_counts_them() {
    let up = Upstream::always(Action::Reply(200)).await;
    let path = config_file("health-cap", api(&[&up]));
    let sidecar = start(&path, &[]).await;
    let health = sidecar.health.expect("a health listener");
    let mut held = Vec::new();
    for _ in 0..ADMIN_MAX_CONNECTIONS {
        held.push(TcpStream::connect(health).await.expect("connect"));
    }
    let open = [("listener", "health")];
    let counted = sidecar
        .wait_for_metric(
            "reprise_connections_open",
            &open,
            Duration::from_secs(5),
            |v| v >= ADMIN_MAX_CONNECTIONS as f64,
        )
        .await;
    assert_eq!(counted, Some(ADMIN_MAX_CONNECTIONS as f64));
    assert!(
        closed_at_once(health).await,
        "the connection over the cap is closed at once"
    );
    assert_eq!(
        sidecar
            .metric("reprise_connections_refused_total", &open)
            .await,
        Some(1.0)
    );
    // The proxy and the admin listener are not touched by it.
    assert_eq!(status(sidecar.listen, "api", "/").await, Some(200));
    assert_eq!(
        sidecar.admin_get("/ready").await.ok().map(|r| r.status),
        Some(200)
    );
    // Closing the held ones frees the listener.
    drop(held);
    let freed = sidecar
        .wait_for_metric(
            "reprise_connections_open",
            &open,
            Duration::from_secs(5),
            |v| v == 0.0,
        )
        .await;
    assert_eq!(freed, Some(0.0));
    assert_eq!(status(health, "api", "/live").await, Some(200));
}

/// Series `name{listener}` on `proxy`'s `/metrics` page.
fn connections(proxy: &reprise_sidecar::Proxy, name: &str, listener: &str) -> Option<f64> {
    let text = reprise_sidecar::server::metrics_text(proxy);
    Metrics::parse(&text)
        .expect("Prometheus text")
        .get(name, &[("listener", listener)])
}

#[tokio::test]
async fn the_proxy_listener_closes_connections_over_proxy_max_connections() {
    let up = Upstream::always(Action::Reply(200)).await;
    let config = Config::new()
        .upstream(api(&[&up]))
        .proxy(ProxyConfig::new().max_connections(2));
    let sidecar = Sidecar::start(config).await;
    let open = |proxy| connections(proxy, "reprise_connections_open", "proxy");
    let mut held = vec![
        TcpStream::connect(sidecar.addr).await.expect("connect"),
        TcpStream::connect(sidecar.addr).await.expect("connect"),
    ];
    for _ in 0..100 {
        if open(&sidecar.proxy) == Some(2.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open(&sidecar.proxy), Some(2.0));
    assert!(
        closed_at_once(sidecar.addr).await,
        "the third connection is closed at once"
    );
    assert_eq!(
        connections(&sidecar.proxy, "reprise_connections_refused_total", "proxy"),
        Some(1.0)
    );
    // A held one still serves; once one closes, a new one is taken.
    held[0]
        .write_all(b"GET / HTTP/1.1\r\nHost: api\r\n\r\n")
        .await
        .expect("write");
    let mut head = [0u8; 12];
    held[0].read_exact(&mut head).await.expect("a response");
    assert_eq!(&head, b"HTTP/1.1 200");
    held.pop();
    for _ in 0..100 {
        if open(&sidecar.proxy) == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status(sidecar.addr, "api", "/").await, Some(200));
}
