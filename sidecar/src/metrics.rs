//! Prometheus metrics. Hot-path counters are atomics; per-reason maps are only
//! touched when an attempt fails.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::outcome::Outcome;

/// Upper bounds of the attempt latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Metrics of one upstream; kept across reloads while the upstream exists.
#[derive(Debug, Default)]
pub struct UpstreamMetrics {
    ok: AtomicU64,
    recovered: AtomicU64,
    outcomes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    retries: Mutex<BTreeMap<String, u64>>,
    /// Retries the budget refused.
    pub budget_refusals: AtomicU64,
    /// Speculative duplicates sent.
    pub hedges: AtomicU64,
    /// Response bodies that failed after headers were sent to the client.
    pub mid_stream_errors: AtomicU64,
    attempt_latency: Histogram,
}

/// Process-wide metrics.
#[derive(Debug, Default)]
pub struct ProxyMetrics {
    /// Logical requests being handled now (each counted once, however many attempts).
    pub in_flight: AtomicU64,
    /// Successful configuration loads.
    pub reloads_ok: AtomicU64,
    /// Refused configuration loads.
    pub reloads_failed: AtomicU64,
    /// Requests for a host that names no upstream.
    pub unknown_upstream: AtomicU64,
}

#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl UpstreamMetrics {
    /// Counts a finished logical request.
    pub fn record_outcome(&self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Recovered => {
                self.recovered.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                let mut map = self.outcomes.lock().unwrap_or_else(|e| e.into_inner());
                *map.entry((other.name(), other.reason())).or_default() += 1;
            }
        }
    }

    /// Counts a retry issued after a failure of `kind`.
    pub fn record_retry(&self, kind: &str) {
        let mut map = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(kind) {
            Some(n) => *n += 1,
            None => {
                map.insert(kind.to_string(), 1);
            }
        }
    }

    /// Records one attempt's time to response headers (or failure).
    pub fn record_attempt(&self, elapsed: Duration) {
        self.attempt_latency.observe(elapsed);
    }

    /// Retries issued so far, by failure kind.
    pub fn retries_by_kind(&self) -> BTreeMap<String, u64> {
        self.retries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests finished so far with `outcome` name (e.g. `recovered`).
    pub fn outcome_count(&self, name: &str) -> u64 {
        match name {
            "ok" => self.ok.load(Ordering::Relaxed),
            "recovered" => self.recovered.load(Ordering::Relaxed),
            _ => self
                .outcomes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|((n, _), _)| *n == name)
                .map(|(_, v)| v)
                .sum(),
        }
    }

    /// Adds this upstream's series to `out`, grouped by family.
    pub fn render(&self, upstream: &str, out: &mut Families) {
        let ok = self.ok.load(Ordering::Relaxed);
        let rec = self.recovered.load(Ordering::Relaxed);
        let f = out.family("reprise_requests_total");
        let _ = writeln!(
            f,
            "reprise_requests_total{{upstream=\"{upstream}\",outcome=\"ok\",reason=\"\"}} {ok}"
        );
        let _ = writeln!(f, "reprise_requests_total{{upstream=\"{upstream}\",outcome=\"recovered\",reason=\"\"}} {rec}");
        for ((name, reason), n) in self
            .outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                f,
                "reprise_requests_total{{upstream=\"{upstream}\",outcome=\"{name}\",reason=\"{reason}\"}} {n}"
            );
        }
        let f = out.family("reprise_retries_total");
        for (kind, n) in self
            .retries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                f,
                "reprise_retries_total{{upstream=\"{upstream}\",kind=\"{kind}\"}} {n}"
            );
        }
        out.sample(
            "reprise_retry_budget_refusals_total",
            upstream,
            self.budget_refusals.load(Ordering::Relaxed),
        );
        out.sample(
            "reprise_hedges_total",
            upstream,
            self.hedges.load(Ordering::Relaxed),
        );
        out.sample(
            "reprise_response_body_errors_total",
            upstream,
            self.mid_stream_errors.load(Ordering::Relaxed),
        );
        self.attempt_latency.render(
            "reprise_upstream_attempt_duration_seconds",
            upstream,
            out.family("reprise_upstream_attempt_duration_seconds"),
        );
    }
}

/// Rendered samples grouped by family, so each family's lines stay together as
/// the Prometheus text format requires.
#[derive(Debug, Default)]
pub struct Families(BTreeMap<&'static str, String>);

impl Families {
    /// The buffer of family `name`.
    pub fn family(&mut self, name: &'static str) -> &mut String {
        self.0.entry(name).or_default()
    }

    /// Adds `name{upstream="..."} value`.
    pub fn sample(&mut self, name: &'static str, upstream: &str, value: impl std::fmt::Display) {
        let _ = writeln!(
            self.family(name),
            "{name}{{upstream=\"{upstream}\"}} {value}"
        );
    }

    /// The exposition text, families in [`FAMILIES`] order with HELP and TYPE.
    pub fn finish(mut self) -> String {
        let mut out = String::with_capacity(4096);
        for (name, kind, help) in FAMILIES {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            if let Some(body) = self.0.remove(name) {
                out.push_str(&body);
            }
        }
        out
    }
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn render(&self, name: &str, upstream: &str, out: &mut String) {
        let mut cumulative = 0;
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{upstream=\"{upstream}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{upstream=\"{upstream}\",le=\"+Inf\"}} {count}"
        );
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{upstream=\"{upstream}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{upstream=\"{upstream}\"}} {count}");
    }
}

/// `# HELP` and `# TYPE` lines for every family, in one place so names stay stable.
pub const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "reprise_requests_total",
        "counter",
        "Logical requests by upstream, outcome (ok, recovered, exhausted, skipped) and reason.",
    ),
    (
        "reprise_retries_total",
        "counter",
        "Retries issued, by the error kind of the failed attempt.",
    ),
    (
        "reprise_retry_budget_refusals_total",
        "counter",
        "Retries refused by the upstream's retry budget.",
    ),
    (
        "reprise_retry_budget_remaining",
        "gauge",
        "Retries the upstream's budget still allows in the current window.",
    ),
    (
        "reprise_hedges_total",
        "counter",
        "Speculative duplicate attempts sent.",
    ),
    (
        "reprise_response_body_errors_total",
        "counter",
        "Response bodies that failed mid-stream (never retried).",
    ),
    (
        "reprise_upstream_attempt_duration_seconds",
        "histogram",
        "Time from sending an attempt to its response headers or failure.",
    ),
    (
        "reprise_endpoint_in_flight",
        "gauge",
        "Attempts waiting on each endpoint.",
    ),
    (
        "reprise_endpoint_ejected",
        "gauge",
        "1 while passive health has the endpoint ejected.",
    ),
    (
        "reprise_endpoint_ejections_total",
        "counter",
        "Times passive health ejected the endpoint.",
    ),
    (
        "reprise_requests_in_flight",
        "gauge",
        "Logical requests being handled, each counted once.",
    ),
    (
        "reprise_replay_buffer_bytes",
        "gauge",
        "Bytes held by request replay buffers.",
    ),
    (
        "reprise_replay_buffer_limit_bytes",
        "gauge",
        "Reservation all replay buffers share.",
    ),
    (
        "reprise_config_reloads_total",
        "counter",
        "Configuration loads by result (ok, refused).",
    ),
    (
        "reprise_unknown_upstream_total",
        "counter",
        "Requests for a host that names no upstream.",
    ),
    (
        "reprise_trace_spans_exported_total",
        "counter",
        "Spans the OTLP collector accepted (0 while tracing is off).",
    ),
    (
        "reprise_trace_spans_dropped_total",
        "counter",
        "Spans dropped: export queue full, collector unreachable or export timed out.",
    ),
];
