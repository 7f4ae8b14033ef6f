//! What a sidecar tells the controller about the traffic each policy saw:
//! counts since its last report ([`TrafficCounts`]), one [`TrafficReport`]
//! line on the push stream every [`REPORT_SECS`] when anything happened, and
//! only to a controller that announced [`CAPABILITY_TRAFFIC`] (an older one
//! closes the stream on a line it cannot read).
//!
//! Success is the final answer the client got: an HTTP status under 500
//! other than 429 and, for gRPC, `grpc-status` `OK`; a local failure (no
//! endpoint, a refused certificate) is a failure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod check;
mod unknown;

pub use check::{
    is_failure_kind, Dropped, EXHAUSTED_REASONS, FAILURE_KINDS, MAX_COUNT, MAX_FAILURE_KINDS,
    RECORD_LAG, SKIP_REASONS,
};
pub use unknown::UnknownFields;

/// The capability a controller announces in its `101 Switching Protocols`
/// (in [`CAPABILITIES_HEADER`](crate::protocol::CAPABILITIES_HEADER)) when
/// it reads traffic reports.
pub const CAPABILITY_TRAFFIC: &str = "traffic";

/// Seconds between a sidecar's reports.
pub const REPORT_SECS: u64 = 10;

/// Upper bounds, in milliseconds, of the latency buckets of
/// [`TrafficCounts::latency`] (time to the final response's headers); the
/// last bucket counts everything above the last bound.
pub const LATENCY_BOUNDS_MS: [u64; 15] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000,
];

/// One report line: counts by policy (`namespace/name`), since the last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficReport {
    /// Counts by policy.
    pub traffic: BTreeMap<String, TrafficCounts>,
    /// The sidecar's last report: it is stopping (SIGTERM, drain). A
    /// controller takes it even within the report interval.
    #[serde(default, rename = "final", skip_serializing_if = "std::ops::Not::not")]
    pub last: bool,
    /// Fields this build does not know (a newer sidecar's): read, never
    /// kept, and counted by [`TrafficReport::check`].
    #[serde(flatten, skip_serializing)]
    pub unknown: UnknownFields,
}

/// What one policy's requests came to over some time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficCounts {
    /// Requests the policy's rule matched, finished.
    #[serde(default)]
    pub requests: u64,
    /// Of them, answered on the first attempt with a success.
    #[serde(default)]
    pub first_try_success: u64,
    /// Of them, whose final answer was a success.
    #[serde(default)]
    pub success: u64,
    /// Retries and hedges sent.
    #[serde(default)]
    pub retries: u64,
    /// Requests a retry recovered.
    #[serde(default)]
    pub recovered: u64,
    /// Requests whose retries ran out, by reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exhausted: BTreeMap<String, u64>,
    /// Requests that failed and were not retried, by reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skipped: BTreeMap<String, u64>,
    /// Retries the budget refused.
    #[serde(default)]
    pub budget_refusals: u64,
    /// Failed attempts by failure kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures: BTreeMap<String, u64>,
    /// Final responses by latency bucket ([`LATENCY_BOUNDS_MS`], then one
    /// for the rest); empty when there were none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency: Vec<u64>,
    /// Fields this build does not know (a newer sidecar's): read, never
    /// kept, and counted by [`TrafficReport::check`].
    #[serde(flatten, skip_serializing)]
    pub unknown: UnknownFields,
}

impl TrafficCounts {
    /// True when nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.requests == 0 && self.retries == 0 && self.budget_refusals == 0
    }

    /// Adds `other` in (saturating: sums never wrap).
    pub fn add(&mut self, other: &TrafficCounts) {
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        add(&mut self.requests, other.requests);
        add(&mut self.first_try_success, other.first_try_success);
        add(&mut self.success, other.success);
        add(&mut self.retries, other.retries);
        add(&mut self.recovered, other.recovered);
        add(&mut self.budget_refusals, other.budget_refusals);
        for (into, from) in [
            (&mut self.exhausted, &other.exhausted),
            (&mut self.skipped, &other.skipped),
            (&mut self.failures, &other.failures),
        ] {
            for (k, v) in from {
                add(into.entry(k.clone()).or_default(), *v);
            }
        }
        if self.latency.len() < other.latency.len() {
            self.latency.resize(other.latency.len(), 0);
        }
        for (into, v) in self.latency.iter_mut().zip(&other.latency) {
            add(into, *v);
        }
    }

    /// The latency (ms) below which `q` of the final responses fell: the
    /// upper bound of the bucket holding that rank (an upper estimate; the
    /// open last bucket reports its lower bound). `None` without responses.
    pub fn latency_quantile_ms(&self, q: f64) -> Option<u64> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        // The rank, 1-based: the q-th share of the responses, at least the first.
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, n) in self.latency.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(
                    LATENCY_BOUNDS_MS
                        .get(i)
                        .copied()
                        .unwrap_or(LATENCY_BOUNDS_MS[LATENCY_BOUNDS_MS.len() - 1]),
                );
            }
        }
        None
    }

    /// The failure kind counted most (ties: the first by name).
    pub fn top_failure(&self) -> Option<&str> {
        let mut top: Option<(&str, u64)> = None;
        for (k, &v) in &self.failures {
            if top.is_none_or(|(_, n)| v > n) {
                top = Some((k, v));
            }
        }
        top.map(|(k, _)| k)
    }
}

/// A line a sidecar sends on the push stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SidecarLine {
    /// Its answer to a snapshot.
    Ack(crate::protocol::Ack),
    /// Its traffic since the last report.
    Traffic(TrafficReport),
    /// A delta did not apply: it asks for its whole snapshot again.
    Resync {
        /// What it runs and why.
        resync: crate::protocol::Resync,
    },
}

/// The latency bucket of `ms`, an index into [`TrafficCounts::latency`].
pub fn latency_bucket(ms: u64) -> usize {
    LATENCY_BOUNDS_MS.partition_point(|&bound| bound < ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_maps_and_buckets_included() {
        let mut a = TrafficCounts {
            requests: 3,
            success: 2,
            exhausted: [("budget".to_string(), 1)].into(),
            latency: vec![1, 2],
            ..TrafficCounts::default()
        };
        let b = TrafficCounts {
            requests: 2,
            success: 2,
            exhausted: [("budget".to_string(), 2), ("attempts".to_string(), 1)].into(),
            latency: vec![0, 1, 4],
            ..TrafficCounts::default()
        };
        a.add(&b);
        assert_eq!((a.requests, a.success), (5, 4));
        assert_eq!(a.exhausted["budget"], 3);
        assert_eq!(a.exhausted["attempts"], 1);
        assert_eq!(a.latency, vec![1, 3, 4]);
    }

    #[test]
    fn buckets_and_quantiles_read_the_bounds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 0);
        assert_eq!(latency_bucket(2), 1);
        assert_eq!(latency_bucket(3), 2);
        assert_eq!(latency_bucket(60_000), 14);
        assert_eq!(latency_bucket(60_001), 15);
        let mut c = TrafficCounts {
            latency: vec![0; 16],
            ..TrafficCounts::default()
        };
        c.latency[3] = 98; // 10 ms
        c.latency[7] = 2; // 200 ms
        assert_eq!(c.latency_quantile_ms(0.5), Some(10));
        assert_eq!(c.latency_quantile_ms(0.99), Some(200));
        assert_eq!(TrafficCounts::default().latency_quantile_ms(0.5), None);
    }

    #[test]
    fn the_top_failure_is_the_most_counted() {
        let c = TrafficCounts {
            failures: [
                ("connect_refused".to_string(), 2),
                ("upstream_status_503".to_string(), 5),
            ]
            .into(),
            ..TrafficCounts::default()
        };
        assert_eq!(c.top_failure(), Some("upstream_status_503"));
        assert_eq!(TrafficCounts::default().top_failure(), None);
    }

    #[test]
    fn a_report_line_reads_back_and_is_not_an_ack() {
        let report = TrafficReport {
            traffic: [(
                "shop/reads".to_string(),
                TrafficCounts {
                    requests: 1,
                    ..TrafficCounts::default()
                },
            )]
            .into(),
            ..TrafficReport::default()
        };
        let line = serde_json::to_string(&report).expect("json");
        assert_eq!(
            serde_json::from_str::<TrafficReport>(&line).expect("back"),
            report
        );
        assert!(serde_json::from_str::<crate::protocol::Ack>(&line).is_err());
        assert_eq!(
            serde_json::from_str::<SidecarLine>(&line).expect("a line"),
            SidecarLine::Traffic(report)
        );
        assert!(matches!(
            serde_json::from_str::<SidecarLine>(r#"{"version":"v1"}"#),
            Ok(SidecarLine::Ack(_))
        ));
        assert!(serde_json::from_str::<SidecarLine>(r#"{"other":1}"#).is_err());
    }
}
