//! The standalone demo: `reprise-sidecar` in front of a 50%-flaky endpoint and
//! a healthy one. Sends requests through it and prints what the retries did.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use reprise_e2e::upstream_server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const REQUESTS: usize = 300;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flaky = upstream_server::start("127.0.0.1:0".parse()?, "flaky", 50).await?;
    let healthy = upstream_server::start("127.0.0.1:0".parse()?, "healthy", 0).await?;
    let dir = std::env::temp_dir().join(format!("reprise-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("reprise.yaml");
    // The gateway document's example, on loopback, with a budget sized for a
    // pool where a quarter of first attempts fail.
    let yaml = format!(
        "upstreams:\n  - name: api\n    endpoints:\n      - {{ address: 127.0.0.1, port: {}, name: flaky }}\n      - {{ address: 127.0.0.1, port: {}, name: healthy }}\n    retries:\n      attempts: 2\n      buffer_max_bytes: 16384\n      total_deadline_ms: 10000\n      budget_percent: 40\n",
        flaky.addr.port(),
        healthy.addr.port()
    );
    std::fs::write(&config, &yaml)?;
    println!("== config ({})\n{yaml}", config.display());

    let exe = std::env::current_exe()?;
    let sidecar_bin = exe.with_file_name("reprise-sidecar");
    if !sidecar_bin.exists() {
        bail!(
            "{} not found: build it first (e2e/demo.sh does)",
            sidecar_bin.display()
        );
    }
    let listen = free_addr()?;
    let admin = free_addr()?;
    let mut child = Command::new(&sidecar_bin)
        .args(["--config", &config.display().to_string()])
        .args([
            "--listen",
            &listen.to_string(),
            "--admin",
            &admin.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", sidecar_bin.display()))?;
    let ready = async {
        for _ in 0..100 {
            if get(admin, "/ready").await.is_ok_and(|(s, _)| s == 200) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    if !ready.await {
        let _ = child.kill();
        bail!("reprise-sidecar did not become ready on {admin}");
    }
    println!("== reprise-sidecar listening on {listen} (admin {admin})\n");
    // Keep reading the sidecar's log so it never fills the pipe; keep one
    // recovered request's event to show.
    let stdout = child.stdout.take().context("sidecar stdout")?;
    let log_reader = std::thread::spawn(move || {
        let mut recovered = None;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if recovered.is_none() && line.contains("\"outcome\":\"recovered\"") {
                recovered = Some(line);
            }
        }
        recovered
    });

    let started = Instant::now();
    let mut ok = 0;
    let mut failed = 0;
    for i in 0..REQUESTS {
        let (status, _) = get(listen, "/").await?;
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

    let (_, metrics) = get(admin, "/metrics").await?;
    let sum = |prefix: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            + 0.0
    };
    let reasons = |outcome: &str| -> String {
        let tag = format!("outcome=\"{outcome}\",reason=\"");
        let parts: Vec<String> = metrics
            .lines()
            .filter(|l| l.starts_with("reprise_requests_total{") && l.contains(&tag))
            .filter_map(|l| {
                let reason = l.split(&tag).nth(1)?.split('"').next()?;
                Some(format!("{reason} {}", l.rsplit(' ').next()?))
            })
            .collect();
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        }
    };
    let retries = sum("reprise_retries_total{");
    println!("\n== results ({REQUESTS} requests in {:.2?})", elapsed);
    println!("  (a 40% budget needs 3 requests in the window before the first retry, so the");
    println!("   very first failures can be exhausted by the budget: that is the formula working)");
    println!(
        "  client saw        : {ok} x 200, {failed} failures ({:.2}% success)",
        100.0 * ok as f64 / REQUESTS as f64
    );
    println!("  retries           : {retries}");
    println!(
        "  ok (first attempt): {}",
        sum("reprise_requests_total{upstream=\"api\",outcome=\"ok\"")
    );
    println!(
        "  recovered         : {}",
        sum("reprise_requests_total{upstream=\"api\",outcome=\"recovered\"")
    );
    println!(
        "  exhausted         : {}{}",
        sum("reprise_requests_total{upstream=\"api\",outcome=\"exhausted\""),
        reasons("exhausted")
    );
    println!(
        "  skipped           : {}{}",
        sum("reprise_requests_total{upstream=\"api\",outcome=\"skipped\""),
        reasons("skipped")
    );
    println!(
        "  upstream attempts : flaky {}, healthy {} ({:.3} per client request)",
        flaky.requests.load(Ordering::Relaxed),
        healthy.requests.load(Ordering::Relaxed),
        (flaky.requests.load(Ordering::Relaxed) + healthy.requests.load(Ordering::Relaxed)) as f64
            / REQUESTS as f64
    );

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait()?;
    if let Ok(Some(line)) = log_reader.join() {
        println!("\n== one recovered request, as the sidecar logged it\n{line}");
    }
    println!("\n== reprise-sidecar stopped ({status})");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.get(9..12).context("short response")?.parse()?;
    Ok((
        status,
        text.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    ))
}
