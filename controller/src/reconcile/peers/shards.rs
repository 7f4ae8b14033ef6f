//! A replica's report cut into ConfigMaps of at most [`PART_BYTES`]: the
//! counts and the traffic of as many policies as fit go in the first
//! (`reprise-sync-<replica>`), the rest in `reprise-sync-<replica>-1`, `-2`,
//! ..., each a whole report with its own heartbeat, which the leader adds
//! up as it adds replicas. So no ConfigMap nears the API server's 1 MiB
//! object limit however many policies a replica reports on: a report grows
//! in parts, never in bytes per part.
//!
//! What one policy takes in a part is bounded: the traffic keeps only the
//! vocabulary's names (`reprise_crds::traffic`), and of the failure kinds
//! only the [`PUBLISHED_FAILURE_KINDS`] most counted (the status names the
//! top one). `docs/src/operations/scale.md` gives the worst case.
//!
//! When policies move from one part to another between two publications,
//! the leader may add one policy's traffic twice (or miss it) until the
//! parts it reads are of one publication: at most one publication's worth.

use std::collections::BTreeMap;

use super::PeerReport;
use crate::traffic::WindowTotal;

/// Largest part: a quarter of the API server's object limit, so a part
/// with its metadata stays far from it.
pub(crate) const PART_BYTES: usize = 256 * 1024;

/// Failure kinds of a policy a replica publishes: the most counted.
pub(crate) const PUBLISHED_FAILURE_KINDS: usize = 8;

/// `all`, as a replica publishes it: each policy's failure kinds cut to
/// the [`PUBLISHED_FAILURE_KINDS`] most counted.
pub(super) fn published(mut all: BTreeMap<String, WindowTotal>) -> BTreeMap<String, WindowTotal> {
    for t in all.values_mut() {
        let failures = &mut t.counts.failures;
        if failures.len() > PUBLISHED_FAILURE_KINDS {
            let mut kinds: Vec<(String, u64)> = std::mem::take(failures).into_iter().collect();
            kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            kinds.truncate(PUBLISHED_FAILURE_KINDS);
            *failures = kinds.into_iter().collect();
        }
    }
    all
}

/// The ConfigMap name of part `i` of the report named `base`.
pub(super) fn part_name(base: &str, i: usize) -> String {
    if i == 0 {
        base.to_string()
    } else {
        format!("{base}-{i}")
    }
}

/// A part with nothing in it, written over a part no longer needed.
pub(super) fn empty(heartbeat: i64) -> String {
    encode(&PeerReport {
        heartbeat,
        ..PeerReport::default()
    })
}

/// `report` cut into parts, each encoded in at most `budget` bytes (one
/// policy's entries larger than that alone, which the vocabulary rules out,
/// would get a part of its own). Always at least one part.
pub(super) fn split(report: &PeerReport, budget: usize) -> Vec<String> {
    let frame = encode(&PeerReport {
        heartbeat: report.heartbeat,
        ..PeerReport::default()
    })
    .len()
        // `"traffic":{}` is left out when empty, and the commas.
        + r#","traffic":{},"pods":{}"#.len();
    let mut parts = Vec::new();
    let mut part = PeerReport {
        heartbeat: report.heartbeat,
        ..PeerReport::default()
    };
    let mut size = frame;
    let mut flush = |part: &mut PeerReport, size: &mut usize| {
        if !part.counts.is_empty() || !part.traffic.is_empty() || !part.pods.is_empty() {
            parts.push(encode(part));
        }
        part.counts.clear();
        part.traffic.clear();
        part.pods.clear();
        *size = frame;
    };
    for (id, count) in &report.counts {
        let n = entry_len(id, count);
        if size + n > budget {
            flush(&mut part, &mut size);
        }
        part.counts.insert(id.clone(), *count);
        size += n;
    }
    for (id, traffic) in &report.traffic {
        let n = entry_len(id, traffic);
        if size + n > budget {
            flush(&mut part, &mut size);
        }
        part.traffic.insert(id.clone(), traffic.clone());
        size += n;
    }
    for (pod, since) in &report.pods {
        let n = entry_len(pod, since);
        if size + n > budget {
            flush(&mut part, &mut size);
        }
        part.pods.insert(pod.clone(), *since);
        size += n;
    }
    flush(&mut part, &mut size);
    if parts.is_empty() {
        parts.push(encode(&part));
    }
    parts
}

/// Bytes `"id":value,` takes in a report.
fn entry_len(id: &str, value: &impl serde::Serialize) -> usize {
    let key = serde_json::to_string(id).map_or(0, |k| k.len());
    let value = serde_json::to_string(value).map_or(0, |v| v.len());
    key + 1 + value + 1
}

fn encode(report: &PeerReport) -> String {
    serde_json::to_string(report).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::peers::PeerCount;
    use reprise_crds::traffic::{
        TrafficCounts, EXHAUSTED_REASONS, LATENCY_BOUNDS_MS, SKIP_REASONS,
    };

    /// The largest id a report can carry: a route rule's
    /// (`HTTPRoute:namespace/name#rule`), names at their longest.
    fn longest_id(i: usize) -> String {
        let ns = "n".repeat(63);
        let name = format!("{i:0>253}");
        format!("HTTPRoute:{ns}/{name}#{}", "r".repeat(253))
    }

    /// One policy's traffic at its largest: every name of the vocabulary,
    /// the longest failure kinds, every count at its largest.
    fn largest_traffic() -> WindowTotal {
        let max = u64::MAX;
        let failures: BTreeMap<String, u64> = (0..PUBLISHED_FAILURE_KINDS + 4)
            .map(|i| {
                let kinds = [
                    "grpc_status_resource_exhausted",
                    "grpc_status_failed_precondition",
                    "grpc_status_deadline_exceeded",
                    "grpc_status_permission_denied",
                    "grpc_status_invalid_argument",
                    "grpc_status_unauthenticated",
                    "grpc_status_already_exists",
                    "grpc_status_unimplemented",
                    "grpc_status_out_of_range",
                    "grpc_status_unavailable",
                    "grpc_status_data_loss",
                    "grpc_status_cancelled",
                ];
                (kinds[i].to_string(), max)
            })
            .collect();
        WindowTotal {
            counts: TrafficCounts {
                requests: max,
                first_try_success: max,
                success: max,
                retries: max,
                recovered: max,
                exhausted: EXHAUSTED_REASONS
                    .iter()
                    .map(|r| (r.to_string(), max))
                    .collect(),
                skipped: SKIP_REASONS.iter().map(|r| (r.to_string(), max)).collect(),
                budget_refusals: max,
                failures,
                latency: vec![max; LATENCY_BOUNDS_MS.len() + 1],
                ..TrafficCounts::default()
            },
            sidecars: max,
        }
    }

    #[test]
    fn the_worst_case_fits_each_part_well_under_the_object_limit() {
        let entries = 2_000;
        let report = PeerReport {
            heartbeat: i64::MAX,
            counts: (0..entries)
                .map(|i| {
                    let count = PeerCount {
                        generation: i64::MAX,
                        selected: i32::MAX,
                        in_sync: i32::MAX,
                    };
                    (longest_id(i), count)
                })
                .collect(),
            traffic: published(
                (0..entries)
                    .map(|i| (longest_id(i), largest_traffic()))
                    .collect(),
            ),
            // A replica's every pod: a digest and when it connected.
            pods: (0..10_000)
                .map(|i| {
                    (
                        super::super::dedup::digest("n".repeat(63).as_str(), &format!("{i:0>253}")),
                        i64::MAX,
                    )
                })
                .collect(),
        };
        let one_pod = report
            .pods
            .iter()
            .next()
            .map_or(0, |(k, v)| entry_len(k, v));
        let one_count = entry_len(&longest_id(0), &report.counts[&longest_id(0)]);
        let one_traffic = entry_len(&longest_id(0), &report.traffic[&longest_id(0)]);
        let parts = split(&report, PART_BYTES);
        let largest = parts.iter().map(String::len).max().unwrap_or(0);
        println!(
            "worst case: {one_count} bytes of counts and {one_traffic} of traffic per policy, {one_pod} per pod; \
             {entries} policies and 10,000 pods in {} parts of at most {largest} bytes",
            parts.len()
        );
        assert!(largest <= PART_BYTES, "{largest}");
        assert_eq!(
            report.traffic[&longest_id(0)].counts.failures.len(),
            PUBLISHED_FAILURE_KINDS
        );
        // Nothing lost or doubled: the parts add up to the report.
        let back: Vec<PeerReport> = parts
            .iter()
            .map(|p| serde_json::from_str(p).expect("a report"))
            .collect();
        let counts: usize = back.iter().map(|p| p.counts.len()).sum();
        let traffic: usize = back.iter().map(|p| p.traffic.len()).sum();
        let pods: usize = back.iter().map(|p| p.pods.len()).sum();
        assert_eq!((counts, traffic, pods), (entries, entries, 10_000));
        assert!(back.iter().all(|p| p.heartbeat == i64::MAX));
    }

    #[test]
    fn a_small_report_is_one_part_and_an_empty_one_too() {
        let report = PeerReport {
            heartbeat: 7,
            counts: [("shop/reads".to_string(), PeerCount::default())].into(),
            ..PeerReport::default()
        };
        assert_eq!(split(&report, PART_BYTES), [encode(&report)]);
        assert_eq!(split(&PeerReport::default(), PART_BYTES).len(), 1);
        assert_eq!(part_name("reprise-sync-a", 0), "reprise-sync-a");
        assert_eq!(part_name("reprise-sync-a", 2), "reprise-sync-a-2");
    }
}
