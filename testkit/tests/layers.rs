//! The floors of every library crate, top to bottom: a module may name
//! modules on floors below its own, and nothing on its own floor or above
//! (`reprise_testkit::layers` says how the edges are read). A failure names
//! the file, the line and the arrow; `docs/src/concepts/architecture.md` draws the same
//! floors.
//!
//! To see a crate's edges as they are: `REPRISE_LAYERS_PRINT=1 cargo test
//! -p reprise-testkit --test layers -- --nocapture`.

use std::path::PathBuf;

use reprise_testkit::layers;

/// The sidecar, from the process down to the words every floor shares.
const SIDECAR: &[&[&str]] = &[
    // The process: flags, mode, listeners and sources wired together.
    &["run"],
    // Where configuration comes from; the `iptables` subcommand.
    &["config", "capture"],
    // Listeners and connections: sniffing, HTTP/1 and h2c servers, tunnels,
    // drain, the admin and health endpoints.
    &["server"],
    // One request's phases: route, admit, prepare, forward, respond.
    &["proxy"],
    // The retry loop: attempts, gates, hedging, budget, replay.
    &["retry"],
    // Endpoints, the picker and the clients that dial them.
    &["balance"],
    // HTTP/1.1 on the wire, without I/O.
    &["http1"],
    // Metrics, the access log, log output, spans.
    &["observe"],
    // The vocabulary: bodies, the attempt's request, failure kinds,
    // outcomes and reports.
    &["exchange"],
    // Leaves: the clock, randomness, the socket.
    &["clock", "random", "socket"],
];

/// The controller: pure policy and the shared state at the bottom, the
/// process and its command line on top.
const CONTROLLER: &[&[&str]] = &[
    // The command line: `run`'s flags into its Options, the one-shot tools
    // (crd, explain, selftest), the kubectl plugin.
    &["cli"],
    // The process: every part wired together, the reconciler run while
    // this replica leads.
    &["run"],
    // The injection webhook: the sidecar added to new Pods.
    &["inject"],
    // The push server: snapshot streams, ACKs, snapshots from the cache.
    &["push"],
    // The reconciler: status, Events, triggers, the peers' sync counts.
    &["reconcile"],
    // Observability: the counters and their listener, the spans.
    &["metrics", "telemetry"],
    // What every reader shares: the watched cluster, the connected
    // sidecars and what each ACKed.
    &["cache", "sidecars"],
    // Leaves: what a policy means (pure), the error type, TLS, the Lease,
    // the sidecars' traffic reports over a window, text from pods as shown.
    &["policy", "error", "tls", "leader", "traffic", "untrusted"],
    // What every listener holds a connection to (TLS's accept loop too).
    &["listen"],
];

/// The model both processes share: the snapshot on top, plain values below.
const CRDS: &[&[&str]] = &[
    &["snapshot"],
    &["resource"],
    &["retry_rule"],
    &["file"],
    &["config"],
    &["policy", "cel_match", "matching"],
    // What a sidecar reports of its traffic (an ACK is one of its lines).
    &["traffic"],
    &["grpc", "protocol", "sidecar_env", "tls"],
    &["validation"],
];

const TELEMETRY: &[&[&str]] = &[
    &["pipeline", "prometheus", "propagation"],
    // The export task; TLS to the collector (its files, the connector);
    // the tracer whose spans no sampler drops.
    &["batch", "tls", "forced"],
    &["settings"],
];

const TESTKIT: &[&[&str]] = &[
    &["sidecar", "grpc", "layers", "tls", "dns", "docs"],
    &["upstream", "client", "prometheus"],
    &["config", "http1"],
];

/// The end-to-end kit: independent parts the tests, demo and benchmarks
/// use; the loopback chain above the hop it runs.
const E2E: &[&[&str]] = &[
    &["chain"],
    &[
        "bench",
        "cluster",
        "docs",
        "hop",
        "jaeger",
        "soak",
        "upstream_server",
    ],
];

fn check(krate: &str, floors: &[&[&str]]) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
    if std::env::var_os("REPRISE_LAYERS_PRINT").is_some() {
        let (_, edges) = layers::edges(&src).expect("the crate's sources");
        for e in edges {
            println!("{krate}: {} -> {} ({}:{})", e.from, e.to, e.file, e.line);
        }
    }
    let violations = layers::check(&src, floors);
    assert!(
        violations.is_empty(),
        "{krate}/src breaks its floors (testkit/tests/layers.rs):\n{}",
        violations
            .iter()
            .map(|v| format!("  {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn sidecar() {
    check("sidecar", SIDECAR);
}

#[test]
fn controller() {
    check("controller", CONTROLLER);
}

#[test]
fn crds() {
    check("crds", CRDS);
}

#[test]
fn telemetry() {
    check("telemetry", TELEMETRY);
}

#[test]
fn testkit() {
    check("testkit", TESTKIT);
}

#[test]
fn e2e() {
    check("e2e", E2E);
}
