//! Controller metrics (Prometheus text).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use reprise_sidecar::telemetry::SpanCounters;

/// Counters the controller exposes.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Reconciles run.
    pub reconciles: AtomicU64,
    /// Reconciles that failed.
    pub reconcile_errors: AtomicU64,
    /// Status writes.
    pub status_writes: AtomicU64,
    /// Snapshots pushed.
    pub pushes: AtomicU64,
    /// ACKs received.
    pub acks: AtomicU64,
    /// NACKs received.
    pub nacks: AtomicU64,
    /// Time from sending a snapshot to its ACK.
    pub push_latency: Histogram,
    /// Pods the webhook injected.
    pub injections: AtomicU64,
    /// Pods the webhook left as they were (opted out, already injected).
    pub injection_skips: AtomicU64,
    /// Pods the webhook refused (an invalid override annotation).
    pub injection_refusals: AtomicU64,
}

/// Upper bounds of the push latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A fixed-bucket histogram of durations.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn render(&self, name: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} Time from sending a snapshot to the sidecar's ACK.\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, le) in BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

impl Metrics {
    /// Prometheus text; `connected` is the number of connected sidecars,
    /// `traces` the trace pipeline's counters (`None` while tracing is off).
    pub fn render(&self, connected: usize, traces: Option<&SpanCounters>) -> String {
        let mut out = String::new();
        for (name, kind, help, value) in [
            (
                "reprise_controller_reconciles_total",
                "counter",
                "RetryPolicy reconciles.",
                self.reconciles.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_reconcile_errors_total",
                "counter",
                "Failed reconciles.",
                self.reconcile_errors.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_status_writes_total",
                "counter",
                "Status patches written.",
                self.status_writes.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_pushes_total",
                "counter",
                "Snapshots pushed to sidecars.",
                self.pushes.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_acks_total",
                "counter",
                "Snapshot ACKs received.",
                self.acks.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_nacks_total",
                "counter",
                "Snapshot NACKs received.",
                self.nacks.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_injections_total",
                "counter",
                "Pods the webhook injected with the sidecar.",
                self.injections.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_injection_skips_total",
                "counter",
                "Pods the webhook admitted unchanged (opted out or already injected).",
                self.injection_skips.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_injection_refusals_total",
                "counter",
                "Pods the webhook refused for an invalid override annotation.",
                self.injection_refusals.load(Ordering::Relaxed),
            ),
            (
                "reprise_controller_connected_sidecars",
                "gauge",
                "Sidecars connected to this replica.",
                connected as u64,
            ),
            (
                "reprise_controller_trace_spans_exported_total",
                "counter",
                "Spans the OTLP collector accepted (0 while tracing is off).",
                traces.map_or(0, SpanCounters::exported),
            ),
            (
                "reprise_controller_trace_spans_dropped_total",
                "counter",
                "Spans dropped: export queue full, collector unreachable or export timed out.",
                traces.map_or(0, SpanCounters::dropped),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        self.push_latency
            .render("reprise_controller_push_latency_seconds", &mut out);
        out
    }
}
