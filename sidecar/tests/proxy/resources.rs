//! The sidecar out of its own resources: its descriptors used up by idle
//! client connections (the limit lowered with `prlimit`), so that dialling
//! an endpoint fails with `EMFILE`. That is the sidecar's failure, not the
//! endpoints': no retry to another endpoint that would fail the same way,
//! and no ejection.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cli::{config_file, start};
use crate::support::{api, retries, Action, Upstream};

/// The descriptor numbers the process `pid` has open now.
fn open_descriptors(pid: u32) -> Vec<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(Vec::new(), |d| {
        d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    })
}

/// True when every descriptor number below `limit` is taken: the next
/// socket or accept fails with `EMFILE`.
fn exhausted(pid: u32, limit: usize) -> bool {
    open_descriptors(pid)
        .iter()
        .filter(|fd| **fd < limit)
        .count()
        >= limit
}

/// One `GET /` on `conn` (keep-alive): the status and `x-reprise-error`.
async fn get(conn: &mut TcpStream) -> (u16, String) {
    conn.write_all(b"GET / HTTP/1.1\r\nHost: api\r\n\r\n")
        .await
        .expect("request written");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut byte))
            .await
            .expect("an answer within 10 s")
            .expect("read");
        assert_eq!(n, 1, "the connection stays open");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    let status = head[9..12].parse().expect("a status");
    let length: usize = field(&head, "content-length").parse().unwrap_or(0);
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).await.expect("body");
    (status, field(&head, "x-reprise-error"))
}

fn field(head: &str, name: &str) -> String {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .unwrap_or("")
        .trim()
        .to_string()
}

#[tokio::test]
async fn running_out_of_descriptors_is_the_sidecars_failure_not_the_endpoints() {
    if !Path::new("/usr/bin/prlimit").exists() && !Path::new("/bin/prlimit").exists() {
        eprintln!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    let a = Upstream::always(Action::Reply(200)).await;
    let b = Upstream::always(Action::Reply(200)).await;
    let config = config_file(
        "emfile",
        api(&[&a, &b]).retries(retries().attempts(1).backoff_base_ms(1)),
    );
    let mut sidecar = start(&config, &[]).await;
    let pid = sidecar.pid();
    // A keep-alive connection the sidecar accepts while it still can.
    let mut conn = TcpStream::connect(sidecar.listen).await.expect("connect");
    let deadline = Instant::now() + Duration::from_secs(10);
    // Time to accept it (nothing to see from outside before its first request).
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Room for two more descriptors, which idle clients take.
    let limit = open_descriptors(pid).into_iter().max().unwrap_or(0) + 3;
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={limit}:")])
        .status()
        .expect("prlimit runs");
    assert!(status.success(), "prlimit lowered the sidecar's limit");
    let mut idle = Vec::new();
    while !exhausted(pid, limit) && Instant::now() < deadline {
        idle.push(
            TcpStream::connect(sidecar.listen)
                .await
                .expect("the kernel accepts into the backlog"),
        );
        // Until the sidecar has taken it in.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        exhausted(pid, limit),
        "every descriptor in use: {:?} below {limit}",
        open_descriptors(pid)
    );

    // Six requests, more than the five failures that would eject an endpoint.
    for _ in 0..6 {
        let (status, kind) = get(&mut conn).await;
        assert_eq!((status, kind.as_str()), (503, "local_resources"));
    }
    assert_eq!(a.count() + b.count(), 0, "no endpoint was reached");

    // Descriptors back: the same endpoints serve at once, none was ejected.
    drop(idle);
    let raised = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=1024:"])
        .status()
        .expect("prlimit runs");
    assert!(raised.success());
    let (status, _) = get(&mut conn).await;
    assert_eq!(status, 200);
    let metrics = sidecar.metrics().await.expect("a scrape");
    assert_eq!(
        metrics.sum("reprise_endpoint_ejections_total", &[("upstream", "api")]),
        0.0,
        "no endpoint was ejected"
    );
    assert_eq!(
        sidecar
            .metric(
                "reprise_requests_total",
                &[
                    ("upstream", "api"),
                    ("outcome", "skipped"),
                    ("reason", "not_retryable"),
                    ("success", "false")
                ]
            )
            .await,
        Some(6.0),
        "none was retried"
    );
    sidecar.stop(crate::cli::EXIT_WITHIN).await.expect("stops");
}

#[tokio::test]
async fn the_soft_descriptor_limit_is_raised_to_the_hard_one_at_start() {
    if !Path::new("/usr/bin/prlimit").exists() && !Path::new("/bin/prlimit").exists() {
        eprintln!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    let a = Upstream::always(Action::Reply(200)).await;
    let config = config_file("nofile", api(&[&a]));
    // Started under a soft limit of 256 and a hard one of 4,096.
    let mut sidecar = reprise_testkit::sidecar::Launch::new(crate::cli::BIN, &config)
        .wrapped_in("prlimit", &["--nofile=256:4096"])
        .start()
        .await
        .expect("starts");
    let limits =
        std::fs::read_to_string(format!("/proc/{}/limits", sidecar.pid())).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a line for open files");
    assert_eq!(
        line.split_whitespace().skip(3).take(2).collect::<Vec<_>>(),
        ["4096", "4096"],
        "{line}"
    );
    sidecar.stop(crate::cli::EXIT_WITHIN).await.expect("stops");
}
