//! Controller metrics (Prometheus text).

use std::sync::atomic::{AtomicU64, Ordering};

use reprise_telemetry::prometheus::{Exposition, Family, Histogram, Kind};
use reprise_telemetry::SpanCounters;

/// Counters the controller exposes.
#[derive(Debug)]
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
    pub push_latency: PushLatency,
    /// Pods the webhook injected.
    pub injections: AtomicU64,
    /// Pods the webhook left as they were (opted out, already injected).
    pub injection_skips: AtomicU64,
    /// Pods the webhook refused (an invalid override annotation).
    pub injection_refusals: AtomicU64,
}

/// Upper bounds of the push latency histogram, in seconds.
const PUSH_LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Time from sending a snapshot to its ACK.
pub type PushLatency = Histogram<12>;

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: AtomicU64::new(0),
            reconcile_errors: AtomicU64::new(0),
            status_writes: AtomicU64::new(0),
            pushes: AtomicU64::new(0),
            acks: AtomicU64::new(0),
            nacks: AtomicU64::new(0),
            push_latency: Histogram::new(PUSH_LATENCY_BUCKETS),
            injections: AtomicU64::new(0),
            injection_skips: AtomicU64::new(0),
            injection_refusals: AtomicU64::new(0),
        }
    }
}

/// Every family the controller exposes, in exposition order.
const FAMILIES: &[Family] = &[
    counter(
        "reprise_controller_reconciles_total",
        "RetryPolicy reconciles.",
    ),
    counter(
        "reprise_controller_reconcile_errors_total",
        "Failed reconciles.",
    ),
    counter(
        "reprise_controller_status_writes_total",
        "Status patches written.",
    ),
    counter(
        "reprise_controller_pushes_total",
        "Snapshots pushed to sidecars.",
    ),
    counter("reprise_controller_acks_total", "Snapshot ACKs received."),
    counter("reprise_controller_nacks_total", "Snapshot NACKs received."),
    counter(
        "reprise_controller_injections_total",
        "Pods the webhook injected with the sidecar.",
    ),
    counter(
        "reprise_controller_injection_skips_total",
        "Pods the webhook admitted unchanged (opted out or already injected).",
    ),
    counter(
        "reprise_controller_injection_refusals_total",
        "Pods the webhook refused for an invalid override annotation.",
    ),
    Family {
        name: "reprise_controller_connected_sidecars",
        kind: Kind::Gauge,
        help: "Sidecars connected to this replica.",
    },
    counter(
        "reprise_controller_trace_spans_exported_total",
        "Spans the OTLP collector accepted (0 while tracing is off).",
    ),
    counter(
        "reprise_controller_trace_spans_dropped_total",
        "Spans dropped: export queue full, collector unreachable or export timed out.",
    ),
    Family {
        name: "reprise_controller_push_latency_seconds",
        kind: Kind::Histogram,
        help: "Time from sending a snapshot to the sidecar's ACK.",
    },
];

const fn counter(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Counter,
        help,
    }
}

impl Metrics {
    /// Prometheus text; `connected` is the number of connected sidecars,
    /// `traces` the trace pipeline's counters (`None` while tracing is off).
    pub fn render(&self, connected: usize, traces: Option<&SpanCounters>) -> String {
        let mut out = Exposition::new(FAMILIES);
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (name, value) in [
            (
                "reprise_controller_reconciles_total",
                load(&self.reconciles),
            ),
            (
                "reprise_controller_reconcile_errors_total",
                load(&self.reconcile_errors),
            ),
            (
                "reprise_controller_status_writes_total",
                load(&self.status_writes),
            ),
            ("reprise_controller_pushes_total", load(&self.pushes)),
            ("reprise_controller_acks_total", load(&self.acks)),
            ("reprise_controller_nacks_total", load(&self.nacks)),
            (
                "reprise_controller_injections_total",
                load(&self.injections),
            ),
            (
                "reprise_controller_injection_skips_total",
                load(&self.injection_skips),
            ),
            (
                "reprise_controller_injection_refusals_total",
                load(&self.injection_refusals),
            ),
            ("reprise_controller_connected_sidecars", connected as u64),
            (
                "reprise_controller_trace_spans_exported_total",
                traces.map_or(0, SpanCounters::exported),
            ),
            (
                "reprise_controller_trace_spans_dropped_total",
                traces.map_or(0, SpanCounters::dropped),
            ),
        ] {
            out.sample(name, &[], value);
        }
        self.push_latency
            .render(&mut out, "reprise_controller_push_latency_seconds", &[]);
        out.finish()
    }
}
