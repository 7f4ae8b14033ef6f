//! Clients in the app namespace with no proxy settings: Python's
//! `http.client` and raw sockets (`probe.py`), Node's global `fetch`
//! (`fetch.mjs`), and grpcio (the gRPC interoperability tests' client).
//! Each prints one JSON line per result, returned parsed.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::helper::Helper;
use crate::lab::{wait_for, Lab};

const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/transparent");
const GRPC_SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proxy/grpc_interop");
/// Longest one client run may take (each of its operations has 10 s).
const CLIENT_WITHIN: Duration = Duration::from_secs(60);

/// Runs `cmd` to its end within [`CLIENT_WITHIN`] (killed past it); its
/// stdout lines that are JSON.
fn json_lines(mut cmd: Command) -> Vec<Value> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let status = wait_for(CLIENT_WITHIN, || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{cmd:?} did not finish within {CLIENT_WITHIN:?}");
    }
    let text = reader.join().expect("the reader");
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn one(lines: Vec<Value>, what: &str) -> Value {
    lines
        .into_iter()
        .last()
        .unwrap_or_else(|| panic!("{what} printed no JSON line"))
}

/// `probe.py ARGS` as root in the app namespace.
pub fn probe(lab: &Lab, args: &[&str]) -> Value {
    let mut cmd = lab.app("python3");
    cmd.arg(format!("{HERE}/probe.py")).args(args);
    one(json_lines(cmd), "probe.py")
}

/// `probe.py ARGS` as `uid` in the app namespace.
pub fn probe_as(lab: &Lab, uid: u32, args: &[&str]) -> Value {
    let script = format!("{HERE}/probe.py");
    let mut argv = vec!["/usr/bin/env", "python3", &script];
    argv.extend_from_slice(args);
    let mut helper = Helper::exec(lab, &lab.app, uid, &argv);
    assert!(
        helper.wait(CLIENT_WITHIN).is_some(),
        "probe.py as uid {uid} finished"
    );
    // The reader thread may still hold the last line for a moment.
    let line = wait_for(Duration::from_secs(5), || {
        helper.lines().into_iter().rfind(|l| l.starts_with('{'))
    })
    .expect("probe.py printed a JSON line");
    serde_json::from_str(&line).expect("JSON")
}

/// `GET url` with Python in the app namespace: (status, body).
pub fn get(lab: &Lab, url: &str) -> (u64, String) {
    let v = probe(lab, &["get", url]);
    (
        v["status"]
            .as_u64()
            .unwrap_or_else(|| panic!("GET {url}: {v}")),
        v["body"].as_str().unwrap_or_default().to_string(),
    )
}

/// The Node binary, or `None` (and a note) without one; under CI a failure.
fn node() -> Option<PathBuf> {
    let found = ["/usr/bin/node", "/usr/local/bin/node"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "node is missing under CI (the Node fetch client needs it)"
        );
        eprintln!("skipped: no node at /usr/bin/node for the Node fetch client");
    }
    found
}

/// `fetch(url)` `count` times with Node in the app namespace, or `None`
/// without Node.
pub fn node_fetch(lab: &Lab, url: &str, count: u32) -> Option<Value> {
    let node = node()?;
    let mut cmd = lab.app(node);
    cmd.arg(format!("{HERE}/fetch.mjs"))
        .args([url, &count.to_string()]);
    Some(one(json_lines(cmd), "fetch.mjs"))
}

/// The Python with grpcio, or `None` (and a note) when this machine has none;
/// under CI a failure (as in the gRPC interoperability tests).
fn grpc_python() -> Option<PathBuf> {
    match std::env::var_os("REPRISE_GRPC_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var_os("CI").is_some() => {
            panic!(
                "REPRISE_GRPC_PYTHON is unset under CI: run e2e/python-grpc.sh (e2e/test.sh does)"
            )
        }
        None => {
            eprintln!("skipped: set REPRISE_GRPC_PYTHON=$(bash e2e/python-grpc.sh) to run the grpcio client");
            None
        }
    }
}

/// grpcio's client calling `method` `count` times on `target` (no
/// authority override, no proxy), or `None` without grpcio.
pub fn grpc(lab: &Lab, target: &str, method: &str, count: u32) -> Option<Vec<Value>> {
    let py = grpc_python()?;
    let mut cmd = lab.app(py);
    cmd.arg(format!("{GRPC_SCRIPTS}/client.py"))
        .args([target, method, &count.to_string()])
        .current_dir(GRPC_SCRIPTS);
    Some(json_lines(cmd))
}
