//! The `reprise-sidecar` binary: `--check`, reload on change and SIGHUP,
//! admin endpoints, the per-request log event, and SIGTERM drain.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reprise_testkit::client;
use reprise_testkit::sidecar::{check, write_temp, Launch, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{api, retries, Action, Config, Upstream, UpstreamConfig};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_reprise-sidecar");

/// Longest the process may take to exit after SIGTERM (the default drain is
/// 15 s; with nothing in flight it ends after the 1 s idle grace).
pub(crate) const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// `config` written to a file of its own for `label`.
pub(crate) fn config_file(label: &str, config: impl Into<Config>) -> PathBuf {
    write_temp(label, &config.into().to_yaml())
}

/// The binary from `config` with extra environment variables (e.g. `OTEL_*`),
/// once it is ready.
pub(crate) async fn start(config: &Path, env: &[(&str, &str)]) -> Running {
    Launch::new(BIN, config)
        .envs(env)
        .start()
        .await
        .expect("the sidecar starts and becomes ready")
}

/// The status of `GET path` with `Host: host` on a fresh connection.
pub(crate) async fn status(addr: SocketAddr, host: &str, path: &str) -> Option<u16> {
    client::get(addr, host, path).await.ok().map(|r| r.status)
}

#[test]
fn check_accepts_the_gateway_example_without_connecting() {
    let out = check(
        Path::new(BIN),
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/gateway.yaml"
        )),
    );
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
    // Literal YAML: the test is about what the parser says of this text.
    let path = write_temp("check", "upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n    retries: { attempts: 11, total_deadline_ms: 0 }\n");
    let out = check(Path::new(BIN), &path);
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
    let missing = check(Path::new(BIN), Path::new("/nonexistent/reprise.yaml"));
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/reprise.yaml: cannot read")
    );
}

#[tokio::test]
async fn reloads_on_change_refuses_bad_files_and_reloads_on_sighup() {
    let up = Upstream::always(Action::Reply(200)).await;
    let web = Upstream::always(Action::Reply(201)).await;
    let path = config_file("reload", api(&[&up]));
    let sidecar = start(&path, &[]).await;
    assert_eq!(status(sidecar.listen, "api", "/").await, Some(200));

    // An invalid file is refused; the running config keeps serving. (Literal
    // YAML: an empty endpoint list is what the test feeds the reload.)
    std::fs::write(&path, "upstreams:\n  - name: api\n    endpoints: []\n").expect("write");
    let refused = sidecar
        .wait_for_metric(
            "reprise_config_reloads_total",
            &[("result", "refused")],
            Duration::from_secs(4),
            |v| v >= 1.0,
        )
        .await
        .unwrap_or(0.0);
    assert_eq!(refused, 1.0);
    assert_eq!(
        status(sidecar.listen, "api", "/").await,
        Some(200),
        "last good config still serves"
    );

    // A valid change is picked up.
    Config::new()
        .upstream(api(&[&up]))
        .upstream(UpstreamConfig::new("web").endpoint(web.addr))
        .write(&path)
        .expect("write");
    let mut routed = None;
    for _ in 0..40 {
        routed = status(sidecar.listen, "web", "/").await;
        if routed == Some(201) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(routed, Some(201));
    let json = sidecar.admin_get("/config").await.expect("config").text();
    let cfg: serde_json::Value = serde_json::from_str(&json).expect("config is JSON");
    assert_eq!(cfg["upstreams"][1]["name"], "web");

    // SIGHUP forces a reload of the unchanged file.
    let ok = [("result", "ok")];
    let before = sidecar
        .metric("reprise_config_reloads_total", &ok)
        .await
        .expect("metric");
    sidecar.signal("HUP").expect("SIGHUP");
    let after = sidecar
        .wait_for_metric(
            "reprise_config_reloads_total",
            &ok,
            Duration::from_secs(2),
            |v| v > before,
        )
        .await
        .expect("metric");
    assert_eq!(after, before + 1.0);
}

#[tokio::test]
async fn admin_endpoints_and_one_log_event_per_request() {
    let bad = Upstream::always(Action::Reply(503)).await;
    let good = Upstream::always(Action::Reply(200)).await;
    let path = config_file(
        "admin",
        api(&[&bad, &good]).retries(retries().attempts(1).buffer_max_bytes(1024)),
    );
    let mut sidecar = start(&path, &[]).await;
    let admin = |path: &'static str| sidecar.admin_get(path);
    assert_eq!(admin("/live").await.ok().map(|r| r.status), Some(200));
    assert_eq!(admin("/nope").await.ok().map(|r| r.status), Some(404));
    // The health listener (on the pod IP in Kubernetes) answers probes and
    // Prometheus, and exposes nothing else.
    let health = sidecar.health.expect("a health listener");
    for (path, code) in [
        ("/live", 200),
        ("/ready", 200),
        ("/metrics", 200),
        ("/config", 404),
        ("/log-level", 404),
    ] {
        assert_eq!(
            status(health, "api", path).await,
            Some(code),
            "{path} on the health listener"
        );
    }
    // Requests carrying a credential and a body, until one was recovered
    // (endpoint picking is random: the 503 endpoint may go untried a while).
    let recovered = [
        ("upstream", "api"),
        ("outcome", "recovered"),
        ("reason", ""),
        ("success", "true"),
    ];
    let mut sent = 0;
    while sent < 6
        || (sent < 40
            && sidecar
                .metric("reprise_requests_total", &recovered)
                .await
                .unwrap_or(0.0)
                == 0.0)
    {
        let raw = "GET / HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer s3cret-t0ken\r\nContent-Length: 11\r\nConnection: close\r\n\r\nb0dy-marker";
        assert_eq!(
            client::exchange(sidecar.listen, raw.as_bytes())
                .await
                .ok()
                .map(|r| r.status),
            Some(200)
        );
        sent += 1;
    }
    let text = sidecar.admin_get("/metrics").await.expect("metrics").text();
    let metrics = reprise_testkit::prometheus::Metrics::parse(&text).expect("Prometheus text");
    for family in [
        "reprise_requests_total",
        "reprise_retries_total",
        "reprise_retry_budget_remaining",
        "reprise_upstream_attempt_duration_seconds_bucket",
        "reprise_replay_buffer_bytes",
        "reprise_endpoint_ejected",
    ] {
        assert!(metrics.has(family), "{family} missing from\n{text}");
    }
    let recovered = metrics
        .get("reprise_requests_total", &recovered)
        .expect("recovered");
    let ok = metrics
        .get(
            "reprise_requests_total",
            &[
                ("upstream", "api"),
                ("outcome", "ok"),
                ("reason", ""),
                ("success", "true"),
            ],
        )
        .expect("ok");
    assert_eq!(recovered + ok, f64::from(sent));
    sidecar.stop(EXIT_WITHIN).await.expect("exit after SIGTERM");
    let lines = sidecar.lines();
    for secret in ["s3cret-t0ken", "b0dy-marker"] {
        assert!(
            !lines.iter().any(|l| l.contains(secret)),
            "{secret} leaked into the log"
        );
    }
    let events = sidecar.events("reprise::request");
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
    let path = config_file("access-filter", api(&[&good]));
    let mut sidecar = start(&path, &[]).await;
    let set_filter = |spec: &'static str| sidecar.admin_put("/log-level", spec);
    assert_eq!(status(sidecar.listen, "api", "/before").await, Some(200));
    let off = set_filter("info,reprise::request=off").await;
    assert_eq!(off.ok().map(|r| r.status), Some(200));
    assert_eq!(status(sidecar.listen, "api", "/while-off").await, Some(200));
    let on = set_filter("info").await;
    assert_eq!(on.ok().map(|r| r.status), Some(200));
    assert_eq!(status(sidecar.listen, "api", "/after").await, Some(200));
    sidecar.stop(EXIT_WITHIN).await.expect("exit after SIGTERM");
    let paths: Vec<String> = sidecar
        .events("reprise::request")
        .iter()
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
    let path = config_file(name, api(&[&slow]));
    let mut sidecar = start(&path, env).await;
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
    sidecar.signal("TERM").expect("SIGTERM");
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
    let status = sidecar.wait(EXIT_WITHIN).await.expect("exit");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn with_the_access_log_on_an_http1_grpc_timeout_field_is_passed_on_untouched() {
    // A gRPC deadline is only a gRPC request's: the arrival time the access
    // log reads must not turn an HTTP/1 request's `grpc-timeout` into one
    // (each attempt would carry the time left instead).
    let up = Upstream::always(Action::Reply(200)).await;
    let path = config_file(
        "grpc-timeout-log",
        api(&[&up]).retries(retries().attempts(1)),
    );
    let mut sidecar = start(&path, &[]).await;
    let r = client::send(
        sidecar.listen,
        "GET",
        "api",
        "/deadline",
        b"",
        &[("grpc-timeout", "5S")],
    )
    .await;
    assert_eq!(r.status, 200);
    let got = &up.received()[0];
    assert!(got.attempt.is_some(), "retryable: {:?}", got.headers);
    assert_eq!(got.header("grpc-timeout"), Some("5S"));
    sidecar.stop(EXIT_WITHIN).await.expect("exit after SIGTERM");
    let logged = sidecar.events("reprise::request");
    assert_eq!(logged.len(), 1, "the access log was on: {logged:?}");
}
