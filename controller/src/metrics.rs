//! Controller metrics (Prometheus text).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

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
}

impl Metrics {
    /// Prometheus text; `connected` is the number of connected sidecars.
    pub fn render(&self, connected: usize) -> String {
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
                "reprise_controller_connected_sidecars",
                "gauge",
                "Sidecars connected to this replica.",
                connected as u64,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        out
    }
}
