//! Measures a three-hop call chain on loopback (`reprise_e2e::chain`: the
//! real sidecar binary before each hop, the e2e app in chain mode) and
//! prints Markdown tables:
//!
//! - `layers`: the last hop failing 0%, 50% and 100% of requests, every
//!   hop's policy at `attempts: 2` (three attempts, each to another of three
//!   apps), with a budget that binds (10%, no floor) and one that does not
//!   (100%), each with `retry_layers: every` and `once`: attempts at the
//!   last hop per client request, first-try success (the last hop's first
//!   attempt), recovered requests and effective success at the client.
//! - `deadline`: the last hop slowed past the first hop's deadline, apps
//!   that do not cancel their calls: attempts started at the last hop after
//!   the first hop's deadline, with propagation and without.
//!
//!   cargo build --release -p reprise-sidecar -p reprise-e2e
//!   target/release/reprise-chain layers --requests 1000
//!   target/release/reprise-chain deadline --requests 40
//!
//! Requests carry `chain.request` and `chain.sent_ms` in their baggage, which
//! the chain's apps forward and the last hop records (`/stats`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use reprise_e2e::chain::{Chain, Leg, Retries, Spec};
use reprise_e2e::hop::{now_ms, Seen};
use reprise_testkit::config::{ProxyConfig, RetryLayers, Rule};

#[derive(Parser, Debug)]
#[command(about = "Attempts across the layers of a three-hop chain, on loopback")]
struct Args {
    /// `layers` or `deadline`.
    experiment: String,
    /// Client requests per row.
    #[arg(long, default_value_t = 1000)]
    requests: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: u64,
}

const HOPS: [&str; 3] = ["front", "orders", "stock"];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.experiment.as_str() {
        "layers" => layers(&args).await,
        "deadline" => deadline(&args).await,
        other => anyhow::bail!("unknown experiment {other:?}: layers or deadline"),
    }
}

/// Each hop's retries: `attempts: 2` on 503, a short backoff (the
/// backoff is not what is measured), each retry to another app.
fn retries(budget_binds: bool, layers: RetryLayers) -> Retries {
    let r = Retries::new()
        .attempts(2)
        .retry_statuses([503])
        .backoff_base_ms(1)
        .backoff_cap_ms(5)
        .retry_layers(layers);
    if budget_binds {
        r.budget_percent(10.0).budget_min_retries_per_second(0)
    } else {
        r.budget_percent(100.0)
    }
}

/// One row's figures.
#[derive(Debug, Default)]
struct Row {
    requests: u64,
    ok: u64,
    last_hop_attempts: u64,
    first_try_ok: u64,
    recovered: u64,
}

/// Sends `n` GETs to `front` through the chain's entry, `concurrency` at a
/// time, each with its id and send time in baggage; returns each id's status.
async fn drive(chain: &Chain, n: u64, concurrency: u64, path: &str) -> BTreeMap<String, u16> {
    let next = Arc::new(AtomicU64::new(0));
    let entry = chain.entry();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let next = Arc::clone(&next);
        let path = path.to_string();
        workers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return got;
                }
                let baggage = format!("chain.request={i},chain.sent_ms={}", now_ms());
                let raw = format!(
                    "GET {path} HTTP/1.1\r\nHost: front\r\nbaggage: {baggage}\r\nConnection: close\r\n\r\n"
                );
                let status = match reprise_testkit::client::exchange(entry, raw.as_bytes()).await {
                    Ok(r) => r.status,
                    Err(_) => 0,
                };
                got.push((i.to_string(), status));
            }
        }));
    }
    let mut out = BTreeMap::new();
    for w in workers {
        if let Ok(got) = w.await {
            out.extend(got);
        }
    }
    out
}

/// The row of `statuses` (by request id) and what the last hop `seen`.
fn row(statuses: &BTreeMap<String, u16>, seen: &[Seen]) -> Row {
    let mut by_id: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
    for s in seen {
        by_id.entry(s.id.as_str()).or_default().push(s);
    }
    let mut r = Row {
        requests: statuses.len() as u64,
        last_hop_attempts: seen.len() as u64,
        ..Row::default()
    };
    for (id, status) in statuses {
        let mut attempts = by_id.get(id.as_str()).cloned().unwrap_or_default();
        attempts.sort_by_key(|s| s.started_ms);
        let first_ok = attempts.first().is_some_and(|s| s.status == Some(200));
        if first_ok {
            r.first_try_ok += 1;
        }
        if *status == 200 {
            r.ok += 1;
            if !first_ok {
                r.recovered += 1;
            }
        }
    }
    r
}

fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        return "-".into();
    }
    format!("{:.1}%", 100.0 * n as f64 / of as f64)
}

async fn layers(args: &Args) -> anyhow::Result<()> {
    println!("| budget | last hop fails | retry_layers | attempts at the last hop per client request | first-try success | recovered | effective success |");
    println!("|---|---|---|---|---|---|---|");
    for budget_binds in [false, true] {
        for fail in [0, 50, 100] {
            for layers in [RetryLayers::Every, RetryLayers::Once] {
                let spec = Spec {
                    hops: HOPS.to_vec(),
                    replicas: 3,
                    leg: Leg::Http1,
                    retries: retries(budget_binds, layers),
                    rules: Vec::new(),
                    fail_percent: fail,
                    delay_ms: 0,
                    proxy: ProxyConfig::new().access_log(false),
                    sidecar_env: Vec::new(),
                    apps_cancel: true,
                };
                let chain = Chain::start(&spec).await?;
                let statuses = drive(&chain, args.requests, args.concurrency, "/work").await;
                let seen = chain.seen(2).await?;
                let r = row(&statuses, &seen);
                println!(
                    "| {} | {fail}% | {} | {:.2} | {} | {} ({}) | {} |",
                    if budget_binds {
                        "10%, no floor (binds)"
                    } else {
                        "100% (does not bind)"
                    },
                    match layers {
                        RetryLayers::Every => "every",
                        RetryLayers::Once => "once",
                    },
                    r.last_hop_attempts as f64 / r.requests.max(1) as f64,
                    pct(r.first_try_ok, r.requests),
                    r.recovered,
                    pct(r.recovered, r.requests),
                    pct(r.ok, r.requests),
                );
            }
        }
    }
    println!();
    println!(
        "{} client requests per row, {} at a time; three apps per hop; HTTP/1.1 between sidecars and apps; backoff 1-5 ms.",
        args.requests, args.concurrency
    );
    Ok(())
}

/// The first hop's deadline in the `deadline` experiment.
const FIRST_DEADLINE_MS: u64 = 1_000;

async fn deadline(args: &Args) -> anyhow::Result<()> {
    println!("| propagation | client requests | attempts at the last hop | of them started after the first hop's deadline | per client request |");
    println!("|---|---|---|---|---|");
    for propagate in [false, true] {
        // The first hop: a 1 s deadline, attempts of 400 ms; the others:
        // attempts of 2 s; the last hop answers after 3 s.
        let rule = |total: Option<u64>, attempt_ms: u64| {
            let r = Rule::new("slow")
                .attempts(2)
                .retry_transport(true)
                .failure_boundary(reprise_testkit::config::FailureBoundary::BeforeHeaders)
                .acknowledge_duplicate_risk(true)
                .attempt_timeout_ms(attempt_ms)
                .backoff_base_ms(1)
                .backoff_cap_ms(5)
                .reuse_endpoints(true);
            match total {
                Some(ms) => r.total_deadline_ms(ms),
                None => r,
            }
        };
        let spec = Spec {
            hops: HOPS.to_vec(),
            replicas: 3,
            leg: Leg::Http1,
            retries: Retries::new().budget_percent(100.0),
            rules: vec![
                vec![rule(Some(FIRST_DEADLINE_MS), 400)],
                vec![rule(None, 2_000)],
                vec![rule(None, 2_000)],
            ],
            fail_percent: 0,
            delay_ms: 3_000,
            proxy: ProxyConfig::new()
                .access_log(false)
                .deadlines(propagate, propagate),
            sidecar_env: Vec::new(),
            apps_cancel: false,
        };
        let chain = Chain::start(&spec).await?;
        let statuses = drive(&chain, args.requests, args.concurrency, "/work").await;
        // What the apps that do not cancel still do after their callers
        // gave up: wait for it to end.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let seen = chain.seen(2).await?;
        let late = seen
            .iter()
            .filter(|s| {
                s.sent_ms
                    .is_some_and(|sent| s.started_ms > sent + FIRST_DEADLINE_MS)
            })
            .count() as u64;
        println!(
            "| {} | {} | {} | {late} | {:.2} |",
            if propagate { "on" } else { "off" },
            statuses.len(),
            seen.len(),
            late as f64 / statuses.len().max(1) as f64,
        );
    }
    println!();
    println!(
        "{} client requests per row, {} at a time; the first hop's deadline {FIRST_DEADLINE_MS} ms (its attempts 400 ms), the others' attempts 2 s, the last hop answers after 3 s; apps that do not cancel their calls (CANCEL_CALLS=false); three apps per hop.",
        args.requests, args.concurrency
    );
    Ok(())
}
