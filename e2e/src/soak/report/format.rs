//! Step three of the summary: the text, from the counts and the failed checks.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::count::Counts;
use super::Report;
use crate::soak::events::DRAIN_PROBE_HOLD;
use crate::soak::load::{BIG_BODY, MAX_IN_FLIGHT};
use crate::soak::resources::SAMPLE_EVERY;
use crate::soak::{lock, DRAIN_MS, REPLAY_CAP};

/// The sidecar's own counts, a line each: (what, metric, labels shown).
const METRIC_LINES: &[&[(&str, &str, &str)]] = &[
    &[("requests", "reprise_requests_total", "outcome|reason")],
    &[("retries by failed attempt", "reprise_retries_total", "kind")],
    &[
        (
            "budget refusals",
            "reprise_retry_budget_refusals_total",
            "upstream",
        ),
        (
            "response body errors",
            "reprise_response_body_errors_total",
            "upstream",
        ),
        (
            "ejections",
            "reprise_endpoint_ejections_total",
            "pod|endpoint",
        ),
    ],
    &[("config reloads", "reprise_config_reloads_total", "result")],
];

fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        "-".into()
    } else {
        format!("{:.2}%", 100.0 * n as f64 / of as f64)
    }
}

fn join_counts<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The non-zero series of metric `name` (both processes added), each shown
/// by the values of its labels whose names start with one of `labels`
/// (`a|b`), joined by `:`.
fn family(c: &Counts, name: &str, labels: &str) -> String {
    let parts: Vec<String> = c
        .metrics
        .values()
        .filter(|s| s.name == name && s.value > 0.0)
        .map(|s| {
            let pick: Vec<&str> = s
                .labels
                .iter()
                .filter(|(k, _)| labels.split('|').any(|want| k.starts_with(want)))
                .map(|(_, v)| v.as_str())
                .filter(|v| !v.is_empty())
                .collect();
            format!("{} {}", pick.join(":"), s.value)
        })
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// Appends one formatted line to `out`.
macro_rules! line {
    ($out:expr, $($t:tt)*) => {{
        $out.push_str(&format!($($t)*));
        $out.push('\n');
    }};
}

/// The summary: its sections in order, each followed by a blank line but the
/// last.
pub(super) fn format(r: &Report<'_>, c: &Counts, fails: &[String]) -> String {
    let mut out = String::new();
    header(&mut out, r);
    requests(&mut out, r, c);
    restart(&mut out, r, c);
    deliveries(&mut out, c);
    sidecar_counts(&mut out, r, c);
    resources(&mut out, r, c);
    verdict(&mut out, fails);
    out
}

/// The run and its faults and policy, in words, and the events.
fn header(out: &mut String, r: &Report<'_>) {
    line!(out, "== Reprise soak: {} s at {} req/s through the real reprise-sidecar (release), 3 endpoints on 127.0.0.1", r.secs, r.rate);
    line!(out, "   faults per 60 s cycle: 0-10 s calm; then a-503 answers 503 to 20% / 90% / 50% (cycles rotate),");
    line!(out, "   c-transport resets before headers, aborts mid-body or stalls 1.5 s (8% / 15% / 8%), b-churn's");
    line!(out, "   listener and connections are closed 20-23 s and 40-45 s. Policy: 2 retries (GET by the upstream's");
    line!(out, "   block, PUT by rule `puts` with acknowledge_duplicate_risk), POST never retried, budget 20%,");
    line!(
        out,
        "   attempt timeout 400 ms, deadline 2 s, replay cap {REPLAY_CAP} B, drain {DRAIN_MS} ms."
    );
    line!(out, "");
    line!(out, "-- events");
    for l in &r.events.lines {
        line!(out, "   {l}");
    }
    line!(out, "");
}

/// The client's side: every request's verdict, latency, connections and pacing.
fn requests(out: &mut String, r: &Report<'_>, c: &Counts) {
    line!(
        out,
        "-- requests (verdict per request; see `verdict` in e2e/src/soak/verdict.rs)"
    );
    line!(out, "   A failure is allowed when the client got an answer within the deadline, no endpoint gave the request");
    line!(out, "   a complete healthy answer, every attempt the sidecar logged for it met an injected fault (the endpoint");
    line!(out, "   recorded a 503/reset/stall/abort/kill for that request id, or b-churn's listener was closed at the time),");
    line!(out, "   it made no more attempts than the policy allows, and the sidecar's outcome is one the policy permits:");
    line!(out, "   GET/PUT exhausted (attempts, budget, deadline), PUT over the replay cap skipped:body_consumed, POST");
    line!(out, "   skipped:method, any method: body aborted by the endpoint after the headers. Anything else is unexpected.");
    verdict_table(out, c);
    let q = |p: f64| {
        c.latencies
            .get(((c.latencies.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    line!(
        out,
        "   2xx latency: p50 {} ms, p99 {} ms, max {} ms",
        q(0.5),
        q(0.99),
        q(1.0)
    );
    line!(out, "   connections: {} on keep-alive, {} on a fresh connection; bodies: {} with a body, {} over the replay cap ({BIG_BODY} B)", c.pooled, c.fresh, c.with_body, c.over_cap);
    line!(
        out,
        "   pacing: max lag {} ms; not sent because {MAX_IN_FLIGHT} were in flight: {}",
        r.max_lag.as_millis(),
        r.saturated
    );
    line!(out, "   failures by answer: {}", join_counts(&c.by_status));
    line!(
        out,
        "   allowed, by sidecar outcome: {}",
        join_counts(&c.allowed)
    );
    line!(out, "   unexpected: {}", join_counts(&c.unexpected));
    for e in &c.examples {
        line!(out, "     {e}");
    }
    line!(
        out,
        "   failures that started and ended in a calm period (no fault injected anywhere): {}",
        c.calm_failures
    );
    line!(out, "");
}

/// The verdicts by method, their total, and the share of successes.
fn verdict_table(out: &mut String, c: &Counts) {
    line!(
        out,
        "   {:<8} {:>8} {:>10} {:>10} {:>22} {:>12}",
        "method",
        "sent",
        "2xx",
        "failed",
        "allowed by policy",
        "unexpected"
    );
    for (m, row) in &c.rows {
        line!(
            out,
            "   {:<8} {:>8} {:>10} {:>10} {:>22} {:>12}",
            m.as_str(),
            row.sent,
            row.ok,
            row.allowed + row.unexpected,
            row.allowed,
            row.unexpected
        );
    }
    let (total, ok, allowed, unexpected) = (
        c.sum(|r| r.sent),
        c.sum(|r| r.ok),
        c.sum(|r| r.allowed),
        c.sum(|r| r.unexpected),
    );
    line!(
        out,
        "   {:<8} {:>8} {:>10} {:>10} {:>22} {:>12}",
        "total",
        total,
        ok,
        allowed + unexpected,
        allowed,
        unexpected
    );
    line!(
        out,
        "   success {} of requests sent ({} if allowed failures are counted as policy working)",
        pct(ok, total),
        pct(ok + allowed, total)
    );
}

/// The restart: exits, requests in flight or refused around it, drain probes.
fn restart(out: &mut String, r: &Report<'_>, c: &Counts) {
    line!(
        out,
        "-- restart (SIGTERM, exit, start again on the same port)"
    );
    for (gen, code, took) in &r.events.exits {
        line!(
            out,
            "   sidecar #{gen}: exit code {} after {} ms",
            code.map_or("none (signal)".into(), |c| c.to_string()),
            took.as_millis()
        );
    }
    line!(
        out,
        "   in flight at SIGTERM: {}; lost to restart (no answer): {}",
        c.in_flight_at_term,
        c.lost_at_term
    );
    line!(
        out,
        "   refused while the sidecar was down, sent again once it was up: {} ({} then succeeded)",
        c.refused,
        c.refused_ok
    );
    line!(out, "   sent after SIGTERM on a keep-alive connection the drain closed unread (no answer, never logged or delivered), sent again: {} ({} then succeeded)", c.closed_by_drain, c.closed_ok);
    for e in &c.examples_drain {
        line!(out, "     {e}");
    }
    line!(
        out,
        "   other connection errors between SIGTERM and ready: {}",
        c.other_in_window
    );
    let p = &c.probes;
    for note in &p.notes {
        line!(out, "     {note}");
    }
    line!(out,
        "   drain probes (held {} ms by the endpoint, SIGTERM {} ms after sending): {} sent, {} in flight at SIGTERM; 2xx {}, allowed failures {}, unexpected {}, lost (no answer) {}",
        DRAIN_PROBE_HOLD.as_millis(),
        (DRAIN_PROBE_HOLD / 3).as_millis(),
        p.sent,
        p.in_flight,
        p.ok,
        p.allowed,
        p.unexpected,
        p.lost
    );
    line!(out, "");
}

/// What the endpoints received, and the duplicates among it.
fn deliveries(out: &mut String, c: &Counts) {
    line!(out, "-- deliveries at the endpoints");
    for e in &c.endpoints {
        line!(out,
            "   {:<12} {:>7} requests on {:>6} connections: {}{}",
            e.name,
            e.requests,
            e.connections,
            join_counts(&e.acts),
            match e.churn {
                Some((killed, times, down_ms)) => format!("; killed while answering {killed}; listener closed {times} times, {:.1} s in all", down_ms as f64 / 1000.0),
                None => String::new(),
            }
        );
    }
    line!(
        out,
        "   POST delivered more than once: {} (must be 0)",
        c.post_dups
    );
    line!(out, "   PUT delivered more than once: {} ({} after an attempt that may have been processed; allowed: rule `puts` acknowledges the risk)", c.put_multi, c.put_multi_after_write);
    line!(out, "   GET delivered more than once: {}", c.get_multi);
    line!(out, "   deliveries marked as a retry (x-reprise-attempt >= 2): {}; POSTs carrying x-reprise-attempt: {}", c.retried, c.post_marked);
    line!(out, "");
}

/// The sidecar's metrics and log lines.
fn sidecar_counts(out: &mut String, r: &Report<'_>, c: &Counts) {
    line!(out, "-- sidecar's own counts (metrics of both processes, added; #1 scraped just before its SIGTERM)");
    // Each line: `label: series` parts, each part named by the labels listed.
    for parts in METRIC_LINES {
        let text: Vec<String> = parts
            .iter()
            .map(|(label, name, labels)| format!("{label}: {}", family(c, name, labels)))
            .collect();
        line!(out, "   {}", text.join("; "));
    }
    line!(
        out,
        "   access-log request events read: {}; warn/error lines: {}",
        r.logs.request_lines.load(Ordering::Relaxed),
        join_counts(&lock(&r.logs.notable))
    );
    line!(out, "");
}

/// The sidecar's memory, descriptors and threads over the run.
fn resources(out: &mut String, r: &Report<'_>, c: &Counts) {
    line!(out, "-- sidecar resources (sampled every {} s after a {} s warm-up of each process; start = median of the first 3 samples, end = median of the last 3)", SAMPLE_EVERY.as_secs(), r.warmup_ms / 1000);
    line!(
        out,
        "   {:<10} {:>7} {:>10} {:>10} {:>10} {:>9} {:>6} {:>6} {:>6} {:>7} {:>8}",
        "process",
        "samples",
        "RSS start",
        "RSS max",
        "RSS end",
        "growth",
        "fd st",
        "fd max",
        "fd end",
        "growth",
        "threads"
    );
    for u in &c.usage {
        let gen = u.gen;
        let (Some(first), Some(last), Some(growth), Some(fd_growth)) =
            (u.first, u.last, u.growth(), u.fd_growth())
        else {
            line!(out, "   #{gen:<9} {:>7} (no sample after warm-up)", u.all);
            continue;
        };
        line!(out,
            "   #{gen:<9} {:>7} {:>7.1} MiB {:>6.1} MiB {:>6.1} MiB {:>+8.1}% {:>6} {:>6} {:>6} {:>+7} {:>8}",
            u.after.len(),
            first.rss_kib as f64 / 1024.0,
            u.max(|s| s.rss_kib) as f64 / 1024.0,
            last.rss_kib as f64 / 1024.0,
            growth * 100.0,
            first.fds,
            u.max(|s| s.fds),
            last.fds,
            fd_growth,
            u.max(|s| s.threads)
        );
        line!(
            out,
            "   {:<10} (samples from {:.0} s to {:.0} s)",
            "",
            u.after.first().map_or(0, |s| s.t_ms) as f64 / 1000.0,
            u.after.last().map_or(0, |s| s.t_ms) as f64 / 1000.0
        );
    }
    line!(
        out,
        "   every sample: {}",
        r.samples
            .iter()
            .map(|s| format!("{}s:#{}:{}K/{}fd", s.t_ms / 1000, s.gen, s.rss_kib, s.fds))
            .collect::<Vec<_>>()
            .join(" ")
    );
    line!(out, "");
}

/// PASS, or FAIL and every failed check.
fn verdict(out: &mut String, fails: &[String]) {
    if fails.is_empty() {
        line!(out, "== PASS");
    } else {
        line!(out, "== FAIL");
        for f in fails {
            line!(out, "   - {f}");
        }
    }
}
