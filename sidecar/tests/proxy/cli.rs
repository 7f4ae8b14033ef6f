//! The `reprise-sidecar` binary: `--check`, reload on change and SIGHUP,
//! admin endpoints, the per-request log event, and SIGTERM drain.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{config, Action, Upstream};

const BIN: &str = env!("CARGO_BIN_EXE_reprise-sidecar");

pub(crate) fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reprise-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).expect("write config");
    path
}

pub(crate) fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// The real binary, running from a config file.
pub(crate) struct Running {
    pub(crate) child: Child,
    pub(crate) listen: SocketAddr,
    pub(crate) admin: SocketAddr,
    /// The health-only listener (`--health`).
    pub(crate) health: SocketAddr,
}

impl Running {
    async fn start(config: &std::path::Path) -> Running {
        Running::start_with_env(config, &[]).await
    }

    /// Starts the binary with extra environment variables (e.g. `OTEL_*`).
    pub(crate) async fn start_with_env(config: &std::path::Path, env: &[(&str, &str)]) -> Running {
        let (listen, admin, health) = (free_addr(), free_addr(), free_addr());
        let child = Command::new(BIN)
            .envs(env.iter().copied())
            .args(["--config", config.to_str().expect("utf-8 path")])
            .args([
                "--listen",
                &listen.to_string(),
                "--admin",
                &admin.to_string(),
                "--health",
                &health.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn reprise-sidecar");
        let running = Running {
            child,
            listen,
            admin,
            health,
        };
        // Up to 20 s: under a loaded CI machine (a build and a cluster beside
        // the tests) a start has taken more than 5 s.
        for _ in 0..400 {
            if running
                .get(running.admin, "/ready")
                .await
                .is_some_and(|(s, _)| s == 200)
            {
                return running;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the sidecar never became ready");
    }

    /// A GET over a fresh connection; returns status and body.
    pub(crate) async fn get(&self, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
        self.request(
            addr,
            &format!("GET {path} HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n"),
        )
        .await
    }

    /// A raw HTTP/1.1 request over a fresh connection; returns status and body.
    pub(crate) async fn request(&self, addr: SocketAddr, raw: &str) -> Option<(u16, String)> {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(raw.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text.get(9..12)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((status, body))
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    /// The value of the first `/metrics` line starting with `series`.
    pub(crate) async fn metric(&self, series: &str) -> Option<f64> {
        let (_, text) = self.get(self.admin, "/metrics").await?;
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn check_accepts_the_gateway_example_without_connecting() {
    let out = Command::new(BIN)
        .args([
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/gateway.yaml"),
            "--check",
        ])
        .output()
        .expect("run --check");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid (1 upstream(s), 0 rule(s))"));
}

#[test]
fn check_refuses_an_invalid_file_naming_file_field_and_rule() {
    let path = temp_file("check", "upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n    retries: { attempts: 11, total_deadline_ms: 0 }\n");
    let out = Command::new(BIN)
        .args(["--config", path.to_str().expect("path"), "--check"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let p = path.display();
    assert!(
        stderr.contains(&format!(
            "{p}: upstreams[0].retries.attempts: must be at most 10 (got 11)"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{p}: upstreams[0].retries.total_deadline_ms: must not be 0"
        )),
        "{stderr}"
    );
    let missing = Command::new(BIN)
        .args(["--config", "/nonexistent/reprise.yaml", "--check"])
        .output()
        .expect("run");
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/reprise.yaml: cannot read")
    );
}

#[tokio::test]
async fn reloads_on_change_refuses_bad_files_and_reloads_on_sighup() {
    let api = Upstream::always(Action::Reply(200)).await;
    let web = Upstream::always(Action::Reply(201)).await;
    let path = temp_file("reload", &config(&[&api], ""));
    let sidecar = Running::start(&path).await;
    assert_eq!(
        sidecar.get(sidecar.listen, "/").await.map(|r| r.0),
        Some(200)
    );

    // An invalid file is refused; the running config keeps serving.
    std::fs::write(&path, "upstreams:\n  - name: api\n    endpoints: []\n").expect("write");
    let mut refused = 0.0;
    for _ in 0..40 {
        refused = sidecar
            .metric("reprise_config_reloads_total{result=\"refused\"}")
            .await
            .unwrap_or(0.0);
        if refused >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(refused, 1.0);
    assert_eq!(
        sidecar.get(sidecar.listen, "/").await.map(|r| r.0),
        Some(200),
        "last good config still serves"
    );

    // A valid change is picked up.
    let yaml = format!(
        "{}{}",
        config(&[&api], ""),
        crate::support::upstream_yaml("web", &[&web], "")
    );
    std::fs::write(&path, yaml).expect("write");
    let mut routed = None;
    for _ in 0..40 {
        routed = sidecar
            .request(
                sidecar.listen,
                "GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
            )
            .await
            .map(|r| r.0);
        if routed == Some(201) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(routed, Some(201));
    let (_, json) = sidecar.get(sidecar.admin, "/config").await.expect("config");
    let cfg: serde_json::Value = serde_json::from_str(&json).expect("config is JSON");
    assert_eq!(cfg["upstreams"][1]["name"], "web");

    // SIGHUP forces a reload of the unchanged file.
    let before = sidecar
        .metric("reprise_config_reloads_total{result=\"ok\"}")
        .await
        .expect("metric");
    sidecar.signal("-HUP");
    let mut after = before;
    for _ in 0..40 {
        after = sidecar
            .metric("reprise_config_reloads_total{result=\"ok\"}")
            .await
            .expect("metric");
        if after > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(after, before + 1.0);
}

#[tokio::test]
async fn admin_endpoints_and_one_log_event_per_request() {
    let bad = Upstream::always(Action::Reply(503)).await;
    let good = Upstream::always(Action::Reply(200)).await;
    let path = temp_file(
        "admin",
        &config(
            &[&bad, &good],
            "    retries: { attempts: 1, buffer_max_bytes: 1024 }\n",
        ),
    );
    let mut sidecar = Running::start(&path).await;
    assert_eq!(
        sidecar.get(sidecar.admin, "/live").await.map(|r| r.0),
        Some(200)
    );
    assert_eq!(
        sidecar.get(sidecar.admin, "/nope").await.map(|r| r.0),
        Some(404)
    );
    // The health listener (on the pod IP in Kubernetes) answers probes and
    // Prometheus, and exposes nothing else.
    for (path, status) in [
        ("/live", 200),
        ("/ready", 200),
        ("/metrics", 200),
        ("/config", 404),
        ("/log-level", 404),
    ] {
        assert_eq!(
            sidecar.get(sidecar.health, path).await.map(|r| r.0),
            Some(status),
            "{path} on the health listener"
        );
    }
    // Requests carrying a credential and a body, until one was recovered
    // (endpoint picking is random: the 503 endpoint may go untried a while).
    let mut sent = 0;
    while sent < 6
        || (sent < 40
            && sidecar
                .metric(
                    "reprise_requests_total{upstream=\"api\",outcome=\"recovered\",reason=\"\"}",
                )
                .await
                .unwrap_or(0.0)
                == 0.0)
    {
        let raw = "GET / HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer s3cret-t0ken\r\nContent-Length: 11\r\nConnection: close\r\n\r\nb0dy-marker";
        assert_eq!(
            sidecar.request(sidecar.listen, raw).await.map(|r| r.0),
            Some(200)
        );
        sent += 1;
    }
    let (_, metrics) = sidecar
        .get(sidecar.admin, "/metrics")
        .await
        .expect("metrics");
    for family in [
        "reprise_requests_total",
        "reprise_retries_total",
        "reprise_retry_budget_remaining",
        "reprise_upstream_attempt_duration_seconds_bucket",
        "reprise_replay_buffer_bytes",
        "reprise_endpoint_ejected",
    ] {
        assert!(metrics.contains(family), "{family} missing from\n{metrics}");
    }
    let recovered = sidecar
        .metric("reprise_requests_total{upstream=\"api\",outcome=\"recovered\",reason=\"\"}")
        .await
        .expect("recovered");
    let ok = sidecar
        .metric("reprise_requests_total{upstream=\"api\",outcome=\"ok\",reason=\"\"}")
        .await
        .expect("ok");
    assert_eq!(recovered + ok, f64::from(sent));
    sidecar.signal("-TERM");
    let stdout = sidecar.child.stdout.take().expect("stdout");
    let lines: Vec<String> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .collect();
    for secret in ["s3cret-t0ken", "b0dy-marker"] {
        assert!(
            !lines.iter().any(|l| l.contains(secret)),
            "{secret} leaked into the log"
        );
    }
    let events: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v["target"] == "reprise::request")
        .collect();
    assert_eq!(events.len(), sent as usize, "one event per logical request");
    let recovered_event = events
        .iter()
        .find(|e| e["outcome"] == "recovered")
        .expect("a recovered request");
    assert_eq!(recovered_event["attempts"], 2);
    assert_eq!(recovered_event["max_attempts"], 2);
    assert_eq!(recovered_event["first_error"], "upstream_status_503");
    assert_eq!(recovered_event["rule"], "upstream");
    assert_eq!(
        recovered_event["endpoints"]
            .as_str()
            .map(|s| s.split(',').count()),
        Some(2)
    );
}

#[tokio::test]
async fn the_access_log_follows_the_log_filter_set_at_run_time() {
    let good = Upstream::always(Action::Reply(200)).await;
    let path = temp_file("access-filter", &config(&[&good], ""));
    let mut sidecar = Running::start(&path).await;
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n");
    let set_filter = |spec: &str| {
        format!(
            "PUT /log-level HTTP/1.1\r\nHost: admin\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{spec}",
            spec.len()
        )
    };
    assert_eq!(
        sidecar
            .request(sidecar.listen, &get("/before"))
            .await
            .map(|r| r.0),
        Some(200)
    );
    let off = set_filter("info,reprise::request=off");
    assert_eq!(
        sidecar.request(sidecar.admin, &off).await.map(|r| r.0),
        Some(200)
    );
    assert_eq!(
        sidecar
            .request(sidecar.listen, &get("/while-off"))
            .await
            .map(|r| r.0),
        Some(200)
    );
    let on = set_filter("info");
    assert_eq!(
        sidecar.request(sidecar.admin, &on).await.map(|r| r.0),
        Some(200)
    );
    assert_eq!(
        sidecar
            .request(sidecar.listen, &get("/after"))
            .await
            .map(|r| r.0),
        Some(200)
    );
    sidecar.signal("-TERM");
    let stdout = sidecar.child.stdout.take().expect("stdout");
    let paths: Vec<String> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .filter(|v| v["target"] == "reprise::request")
        .map(|v| v["path"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(paths, ["/before", "/after"]);
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_then_exits_zero() {
    sigterm_drains("drain-mt", &[("TOKIO_WORKER_THREADS", "2")]).await;
}

#[tokio::test]
async fn with_one_worker_the_single_threaded_runtime_proxies_and_drains() {
    // One worker selects tokio's current-thread scheduler (main.rs).
    sigterm_drains("drain-ct", &[("TOKIO_WORKER_THREADS", "1")]).await;
}

async fn sigterm_drains(name: &str, env: &[(&str, &str)]) {
    let slow = Upstream::always(Action::Stall(Duration::from_millis(800))).await;
    let path = temp_file(name, &config(&[&slow], ""));
    let mut sidecar = Running::start_with_env(&path, env).await;
    let listen = sidecar.listen;
    let in_flight = tokio::spawn(async move {
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        String::from_utf8_lossy(&out).to_string()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    sidecar.signal("-TERM");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        tokio::net::TcpStream::connect(listen).await.is_err(),
        "no new connections while draining"
    );
    let response = in_flight.await.expect("task");
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "the in-flight request finished: {response}"
    );
    let status = tokio::task::spawn_blocking(move || sidecar.child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
}
