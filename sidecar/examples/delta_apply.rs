//! What a sidecar spends applying one change of a rolling restart (one
//! endpoint out, one in) to an upstream of 500 endpoints, three ways in one
//! run: as an endpoint patch (the delta of a change that only moves
//! endpoints), as a delta resolved whole (a policy edited with it), and as
//! a whole snapshot line (what every change cost before deltas). Each line
//! goes through [`Subscription::apply_line`], as the push stream feeds it;
//! the lines are encoded beforehand (the controller's work, not the
//! sidecar's). The snapshot: that upstream and four of 12 endpoints, one
//! policy each, as a caller of a large Service in the model cluster
//! (`controller/examples/cluster_scale.rs`) carries.
//!
//!     cargo run --release -p reprise-sidecar --example delta_apply [-- COUNT [ONLY [ENDPOINTS]]]
//!
//! ONLY (`patch`, `whole-delta` or `snapshot`) runs one way, ENDPOINTS
//! (default 500) in the big upstream, for counting what the applies
//! allocate: `valgrind --tool=callgrind --toggle-collect='*apply_line*'`
//! counts only inside them (`malloc`'s calls, divided by COUNT). Results:
//! `e2e/bench/results/2026-12-06-issue45-sidecar-apply.md`.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reprise_crds::retry_rule::RetryRule;
use reprise_crds::snapshot::{
    DeltaLine, Entries, Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream,
};
use reprise_crds::traffic::SidecarLine;
use reprise_sidecar::config::{Running, Subscription, TrustedCa};
use reprise_sidecar::Proxy;

/// Endpoints of the big upstream (the third argument; 500 by default).
static BIG: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

fn big() -> u32 {
    *BIG.get().unwrap_or(&500)
}

fn endpoint(n: u32) -> SnapshotEndpoint {
    SnapshotEndpoint {
        address: format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255),
        port: 8080,
        pod: Some(format!("svc-0-7d9f8c6b5-{n:05}")),
        zone: Some(format!("zone-{}", ["a", "b", "c"][n as usize % 3])),
    }
}

/// The snapshot with the big upstream's endpoints `from..from + big()`.
fn snapshot(from: u32, attempts: i32) -> Snapshot {
    let upstream = |k: u32, endpoints: Vec<SnapshotEndpoint>| SnapshotUpstream {
        name: format!("svc-{k}.ns-000"),
        hosts: vec![format!("svc-{k}"), format!("svc-{k}.ns-000")],
        endpoints,
        addresses: vec![format!("10.96.0.{}:8080", k + 1)],
        ..SnapshotUpstream::default()
    };
    let mut upstreams = vec![upstream(0, (from..from + big()).map(endpoint).collect())];
    for k in 1..5 {
        upstreams.push(upstream(
            k,
            (0..12).map(|i| endpoint(1_000_000 * k + i)).collect(),
        ));
    }
    let policies = (0..5)
        .map(|k| {
            let mut rule = RetryRule::default();
            rule.retries.attempts = if k == 4 { attempts } else { 3 };
            SnapshotPolicy {
                namespace: "ns-000".into(),
                name: format!("p-{k}"),
                generation: 1,
                upstream: format!("svc-{k}.ns-000"),
                rule,
                precedence: 0,
                route: None,
            }
        })
        .collect();
    Entries::from_snapshot(Snapshot::new(upstreams, policies)).to_snapshot()
}

/// `count` lines of a rolling restart, each one endpoint out and one in, as
/// `how` sends them.
fn lines(how: &str, count: u32) -> Vec<Vec<u8>> {
    let mut sent = Entries::from_snapshot(snapshot(0, 2));
    (1..=count)
        .map(|i| {
            // A policy edit with every change in `whole-delta`.
            let attempts = if how == "whole-delta" {
                2 + (i % 2) as i32
            } else {
                2
            };
            let next = snapshot(i, attempts);
            if how == "snapshot" {
                return serde_json::to_vec(&next).expect("json");
            }
            let next = Entries::from_snapshot(next);
            let delta = sent.delta_to(&next);
            sent = next;
            serde_json::to_vec(&DeltaLine { delta }).expect("json")
        })
        .collect()
}

fn subscription(how: &str) -> Subscription {
    let dir =
        std::env::temp_dir().join(format!("reprise-delta-apply-{}-{how}", std::process::id()));
    Subscription {
        controller: "https://controller:15010".parse().expect("uri"),
        server_name: None,
        pod: "caller-0".into(),
        namespace: "ns-000".into(),
        token_path: dir.join("token"),
        ca: TrustedCa::Pem(String::new()),
        snapshot_path: dir.join("snapshot.json"),
        address_map: None,
        report_every: Duration::from_secs(10),
        diagnostics_retained: None,
        deadlines: reprise_crds::policy::DeadlinePolicy::ON,
    }
}

/// Applies `how`'s lines after the first snapshot; each apply's duration.
fn run(how: &str, count: u32) -> Vec<Duration> {
    let sub = subscription(how);
    let first = snapshot(0, 2);
    let proxy = Proxy::new(first.resolve().expect("valid"));
    let mut running = Running::default();
    let first = serde_json::to_vec(&first).expect("json");
    assert!(matches!(
        sub.apply_line(&proxy, &first, &mut running),
        SidecarLine::Ack(a) if a.error.is_none()
    ));
    let lines = lines(how, count);
    let mut took = Vec::with_capacity(lines.len());
    for line in &lines {
        let start = Instant::now();
        let answer = sub.apply_line(&proxy, line, &mut running);
        took.push(start.elapsed());
        assert!(
            matches!(&answer, SidecarLine::Ack(a) if a.error.is_none()),
            "{how}: {answer:?}"
        );
    }
    let _ = std::fs::remove_dir_all(sub.snapshot_path.parent().expect("dir"));
    took
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count: u32 = args.get(1).and_then(|c| c.parse().ok()).unwrap_or(2000);
    if let Some(n) = args.get(3).and_then(|n| n.parse().ok()) {
        let _ = BIG.set(n);
    }
    if let Some(only) = args.get(2) {
        run(only, count);
        return;
    }
    let mut medians = BTreeMap::new();
    println!("| Applied as | median | p99 | mean |");
    println!("|---|---|---|---|");
    for how in ["patch", "whole-delta", "snapshot"] {
        let mut took = run(how, count);
        let mean = took.iter().sum::<Duration>() / took.len() as u32;
        took.sort();
        let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
        println!(
            "| {how} | {:.1} µs | {:.1} µs | {:.1} µs |",
            us(at(0.5)),
            us(at(0.99)),
            us(mean)
        );
        medians.insert(how, at(0.5));
    }
    let patch = medians["patch"].as_secs_f64();
    println!(
        "\nmedian ratios to the patch: whole-delta {:.0}x, snapshot {:.0}x ({count} changes each)",
        medians["whole-delta"].as_secs_f64() / patch,
        medians["snapshot"].as_secs_f64() / patch
    );
}
