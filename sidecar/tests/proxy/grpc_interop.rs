//! gRPC with an implementation nobody on this project wrote: Python's
//! `grpcio` (gRPC's C core) as client and server, through the sidecar by
//! `:authority` and through `http_proxy` (grpc core then opens a CONNECT
//! tunnel, which the sidecar unwraps). The Python comes from
//! `e2e/python-grpc.sh` (`REPRISE_GRPC_PYTHON`, set by the test command);
//! without it the tests say so and pass, except under CI, where they fail.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::{Retries, Sidecar, UpstreamConfig};

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proxy/grpc_interop");

/// The Python with grpcio, or `None` (and a note) when this machine has none.
fn python() -> Option<PathBuf> {
    match std::env::var_os("REPRISE_GRPC_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var_os("CI").is_some() => {
            panic!(
                "REPRISE_GRPC_PYTHON is unset under CI: run e2e/python-grpc.sh (e2e/test.sh does)"
            )
        }
        None => {
            eprintln!("skipped: set REPRISE_GRPC_PYTHON=$(bash e2e/python-grpc.sh) to run the grpcio tests");
            None
        }
    }
}

/// A grpcio server; its calls' metadata as it printed them.
struct PyServer {
    child: Child,
    addr: SocketAddr,
    calls: Arc<Mutex<Vec<Value>>>,
}

impl PyServer {
    fn start(py: &Path, name: &str, script: &str) -> PyServer {
        let mut child = Command::new(py)
            .arg(format!("{SCRIPTS}/server.py"))
            .args([name, script])
            .current_dir(SCRIPTS)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the grpcio server");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let port: u16 = lines
            .next()
            .and_then(Result::ok)
            .and_then(|l| l.trim().parse().ok())
            .expect("the grpcio server prints its port");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&calls);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    sink.lock().expect("calls").push(v);
                }
            }
        });
        PyServer {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            calls,
        }
    }

    fn calls(&self) -> Vec<Value> {
        self.calls.lock().expect("calls").clone()
    }
}

impl Drop for PyServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the grpcio client (on a blocking thread: the sidecar under test runs
/// on this runtime) and returns one result per call.
async fn client(
    py: &Path,
    target: &str,
    method: &str,
    count: u32,
    authority: Option<&str>,
    proxy: Option<SocketAddr>,
) -> Vec<Value> {
    let mut cmd = Command::new(py);
    cmd.arg(format!("{SCRIPTS}/client.py"))
        .args([target, method, &count.to_string()])
        .args(authority)
        .current_dir(SCRIPTS)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("grpc_proxy")
        .env_remove("no_proxy")
        .env_remove("no_grpc_proxy");
    if let Some(p) = proxy {
        cmd.env("http_proxy", format!("http://{p}"));
    }
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || cmd.output().expect("run the grpcio client")),
    )
    .await
    .expect("the client finished in time")
    .expect("no panic");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A sidecar in front of `server`: upstream `echo`, h2c, one retry of POST
/// with the body replayed, back to the same endpoint.
async fn sidecar(server: &PyServer) -> Sidecar {
    let retries = Retries::new()
        .attempts(1)
        .retry_post(true)
        .buffer_max_bytes(64 * 1024)
        .reuse_endpoints(true)
        .budget_min_retries_per_second(1000);
    Sidecar::start(
        UpstreamConfig::new("echo")
            .endpoint(server.addr)
            .h2c()
            .retries(retries),
    )
    .await
}

fn codes(results: &[Value]) -> Vec<&str> {
    results
        .iter()
        .map(|r| r["code"].as_str().unwrap_or("?"))
        .collect()
}

#[tokio::test]
async fn grpcio_through_authority_routing_is_retried_on_unavailable() {
    let Some(py) = python() else { return };
    let server = PyServer::start(&py, "py", "unavailable");
    let sidecar = sidecar(&server).await;
    let target = sidecar.addr.to_string();
    let results = client(&py, &target, "Say", 5, Some("echo"), None).await;
    assert_eq!(codes(&results), ["OK"; 5], "{results:?}");
    assert_eq!(results[0]["messages"][0], "hi 0 from py");
    let calls = server.calls();
    assert_eq!(calls.len(), 6, "one retry: {calls:?}");
    assert_eq!(calls[1]["metadata"]["grpc-previous-rpc-attempts"], "1");
    let streamed = client(&py, &target, "Stream", 1, Some("echo"), None).await;
    assert_eq!(streamed[0]["code"], "OK");
    assert_eq!(streamed[0]["messages"].as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn grpcio_through_http_proxy_connect_is_retried_on_unavailable() {
    let Some(py) = python() else { return };
    let server = PyServer::start(&py, "py", "ok,unavailable");
    let sidecar = sidecar(&server).await;
    let results = client(&py, "echo:50051", "Say", 3, None, Some(sidecar.addr)).await;
    assert_eq!(codes(&results), ["OK"; 3], "{results:?}");
    let calls = server.calls();
    assert_eq!(calls.len(), 4, "the second call was retried: {calls:?}");
    assert_eq!(calls[2]["metadata"]["grpc-previous-rpc-attempts"], "1");
    assert_eq!(sidecar.outcomes("echo", "recovered"), 1);
}

#[tokio::test]
async fn grpcio_sees_a_local_failure_as_unavailable_with_its_kind() {
    let Some(py) = python() else { return };
    let server = PyServer::start(&py, "py", "");
    let sidecar = sidecar(&server).await;
    let results = client(
        &py,
        &sidecar.addr.to_string(),
        "Say",
        1,
        Some("nowhere"),
        None,
    )
    .await;
    assert_eq!(codes(&results), ["UNAVAILABLE"], "{results:?}");
    assert_eq!(results[0]["details"], "unknown_upstream");
    assert!(server.calls().is_empty());
}
