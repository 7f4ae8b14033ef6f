//! The standalone demo: `reprise-sidecar` in front of a 50%-flaky endpoint and
//! a healthy one. Sends requests through it and prints what the retries did.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use reprise_e2e::upstream_server;
use reprise_testkit::client;
use reprise_testkit::prometheus::Metrics;
use reprise_testkit::sidecar::{self, Launch, Stderr};

const REQUESTS: usize = 300;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flaky = upstream_server::start("127.0.0.1:0".parse()?, "flaky", 50).await?;
    let healthy = upstream_server::start("127.0.0.1:0".parse()?, "healthy", 0).await?;
    let dir = std::env::temp_dir().join(format!("reprise-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("reprise.yaml");
    // The configuration file as a user writes it (`docs/src/tasks/standalone.md`,
    // "The configuration file"), on loopback, with a budget sized for a pool where a quarter of
    // first attempts fail. Literal text: the demo prints it.
    let yaml = format!(
        "upstreams:\n  - name: api\n    endpoints:\n      - {{ address: 127.0.0.1, port: {}, name: flaky }}\n      - {{ address: 127.0.0.1, port: {}, name: healthy }}\n    retries:\n      attempts: 2\n      buffer_max_bytes: 16384\n      total_deadline_ms: 10000\n      budget_percent: 40\n",
        flaky.addr.port(),
        healthy.addr.port()
    );
    std::fs::write(&config, &yaml)?;
    println!("== config ({})\n{yaml}", config.display());

    let bin = sidecar::binary("reprise-sidecar").context("build it first (e2e/demo.sh does)")?;
    // Keep one recovered request's log event to show; the rest is dropped.
    let recovered: Arc<Mutex<Option<String>>> = Arc::default();
    let keep = Arc::clone(&recovered);
    let mut running = Launch::new(&bin, &config)
        .health(None)
        .stderr(Stderr::Inherit)
        .on_line(move |line| {
            let mut kept = keep.lock().unwrap_or_else(PoisonError::into_inner);
            if kept.is_none() && line.contains("\"outcome\":\"recovered\"") {
                *kept = Some(line.to_string());
            }
        })
        .start()
        .await?;
    let (listen, admin) = (running.listen, running.admin);
    println!("== reprise-sidecar listening on {listen} (admin {admin})\n");

    let started = Instant::now();
    let mut ok = 0;
    let mut failed = 0;
    for i in 0..REQUESTS {
        let status = client::get(listen, "api", "/").await?.status;
        if status == 200 {
            ok += 1;
        } else {
            failed += 1;
        }
        if (i + 1) % 100 == 0 {
            println!(
                "  sent {:>4} requests: {ok} succeeded, {failed} failed",
                i + 1
            );
        }
    }
    let elapsed = started.elapsed();

    let metrics = running.metrics().await?;
    let outcome = |outcome: &str| {
        metrics.sum(
            "reprise_requests_total",
            &[("upstream", "api"), ("outcome", outcome)],
        )
    };
    let retries = metrics.sum("reprise_retries_total", &[]);
    println!("\n== results ({REQUESTS} requests in {:.2?})", elapsed);
    println!("  (a 40% budget needs 3 requests in the window before the first retry, so the");
    println!("   very first failures can be exhausted by the budget: that is the formula working)");
    println!(
        "  client saw        : {ok} x 200, {failed} failures ({:.2}% success)",
        100.0 * ok as f64 / REQUESTS as f64
    );
    println!("  retries           : {retries}");
    println!("  ok (first attempt): {}", outcome("ok"));
    println!("  recovered         : {}", outcome("recovered"));
    println!(
        "  exhausted         : {}{}",
        outcome("exhausted"),
        reasons(&metrics, "exhausted")
    );
    println!(
        "  skipped           : {}{}",
        outcome("skipped"),
        reasons(&metrics, "skipped")
    );
    let (flaky_n, healthy_n) = (
        flaky.requests.load(Ordering::Relaxed),
        healthy.requests.load(Ordering::Relaxed),
    );
    println!(
        "  upstream attempts : flaky {flaky_n}, healthy {healthy_n} ({:.3} per client request)",
        (flaky_n + healthy_n) as f64 / REQUESTS as f64
    );

    let exit = running.stop(Duration::from_secs(30)).await?;
    if let Some(line) = recovered
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        println!("\n== one recovered request, as the sidecar logged it\n{line}");
    }
    println!(
        "\n== reprise-sidecar stopped (exit {})",
        exit.code
            .map_or("by a signal".to_string(), |c| c.to_string())
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// ` (reason n, ...)` for the `outcome` series of upstream `api`, or nothing.
fn reasons(metrics: &Metrics, outcome: &str) -> String {
    let parts: Vec<String> = metrics
        .family("reprise_requests_total")
        .filter(|s| s.has_labels(&[("upstream", "api"), ("outcome", outcome)]))
        .map(|s| format!("{} {}", s.label("reason").unwrap_or_default(), s.value))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}
