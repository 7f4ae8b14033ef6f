//! In-Sync counts across controller replicas. Sidecars may hold their stream
//! to any replica, but only the leader writes status: every replica publishes
//! its own per-policy counts in a ConfigMap, and the leader adds them up.
//! (The ConfigMaps are watched once, by the [`Cache`](crate::cache::Cache),
//! which selects them by [`SYNC_COUNTS_LABEL`].)
//!
//! Each ConfigMap stays well under the API server's 1 MiB object limit by
//! construction (`peers/shards.rs`): a replica's report is cut into parts of
//! at most [`shards::PART_BYTES`], each its own ConfigMap with the same
//! label, so a report grows in ConfigMaps, never in bytes per object. What
//! one part holds per policy is bounded too, by the traffic vocabulary.
//! Reports are parsed once per change of their ConfigMap, not per read.

mod dedup;
mod parsed;
pub(crate) mod shards;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use reprise_crds::resource::RetryPolicy;
use serde::{Deserialize, Serialize};

use super::MANAGER;
use crate::cache::{Cache, SYNC_COUNTS_LABEL};
use crate::policy;
use crate::sidecars::{SidecarRegistry, SyncCounts};
use crate::traffic::WindowTotal;

/// Counts older than this are from a replica that is gone.
const STALE_AFTER_SECS: i64 = 30;
/// An unchanged report is refreshed this often, so it never looks stale.
const HEARTBEAT_SECS: i64 = 10;
/// How often a replica recounts its sidecars.
const COUNT_EVERY: Duration = Duration::from_secs(2);
/// The ConfigMap key holding a [`PeerReport`] as JSON.
const REPORT_KEY: &str = "report";

/// The other replicas' reports, as the leader reads them.
#[derive(Clone)]
pub(crate) struct Peers {
    /// Every replica's sync ConfigMap.
    pub(crate) reports: Store<ConfigMap>,
    /// This replica's identity: its own report is not added twice.
    pub(crate) me: String,
    /// The reports, parsed once per version of their ConfigMap.
    parsed: Arc<parsed::Parsed>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// The reports of the replicas other than `me`, in `reports`.
    pub(crate) fn new(reports: Store<ConfigMap>, me: String) -> Self {
        Peers {
            reports,
            me,
            parsed: Arc::default(),
        }
    }

    /// The traffic the other replicas' fresh reports carry, every policy's
    /// at once (one pass over the reports per publication of the status).
    pub(crate) fn all_traffic(&self) -> BTreeMap<String, WindowTotal> {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        fresh_traffic(&self.reports(), now)
    }

    /// `local` plus the fresh counts of the other replicas for `policy`.
    pub(crate) fn add(&self, local: SyncCounts, policy: &RetryPolicy) -> SyncCounts {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        total(local, policy, &self.reports(), now)
    }

    /// Every other replica's report parts, each parsed once.
    pub(crate) fn reports(&self) -> Vec<Arc<PeerReport>> {
        self.parsed.of(&self.reports.state(), &self.me)
    }
}

/// One replica's counts for one policy generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PeerCount {
    /// Generation the counts are for.
    generation: i64,
    /// Sidecars selected.
    selected: i32,
    /// Sidecars that ACKed this generation.
    in_sync: i32,
}

/// What one replica publishes: counts by `namespace/name`, and when.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PeerReport {
    /// Unix seconds of the last refresh.
    heartbeat: i64,
    /// Counts by policy (`namespace/name`).
    counts: BTreeMap<String, PeerCount>,
    /// The traffic its sidecars reported over the window, by policy,
    /// refreshed with the heartbeat (not on every change: the traffic
    /// changes with every request).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    traffic: BTreeMap<String, WindowTotal>,
    /// Its sidecars' streams: a digest of each pod (`namespace/pod`) and
    /// when its stream connected, so that a pod holds one stream across
    /// the replicas (`peers/dedup.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pods: BTreeMap<String, i64>,
}

impl PeerReport {
    /// The report a sync ConfigMap carries, if it carries one.
    pub(crate) fn of(cm: &ConfigMap) -> Option<PeerReport> {
        serde_json::from_str(cm.data.as_ref()?.get(REPORT_KEY)?).ok()
    }

    /// The policies (`namespace/name`) it reports on.
    pub(crate) fn policies(&self) -> impl Iterator<Item = &str> {
        self.counts.keys().map(String::as_str)
    }
}

/// Adds this replica's counts and fresh peer reports for `policy`.
fn total(
    local: SyncCounts,
    policy: &RetryPolicy,
    peers: &[impl std::borrow::Borrow<PeerReport>],
    now: i64,
) -> SyncCounts {
    let id = policy::id(policy);
    let generation = policy::generation(policy);
    peers
        .iter()
        .map(std::borrow::Borrow::borrow)
        .filter(|r: &&PeerReport| now - r.heartbeat <= STALE_AFTER_SECS)
        .filter_map(|r| r.counts.get(&id))
        .fold(local, |mut acc, c| {
            acc.selected += c.selected;
            if c.generation >= generation {
                acc.in_sync += c.in_sync;
            }
            acc
        })
}

/// What fresh `peers` reported of each policy's traffic, added up.
fn fresh_traffic(
    peers: &[impl std::borrow::Borrow<PeerReport>],
    now: i64,
) -> BTreeMap<String, WindowTotal> {
    let mut all: BTreeMap<String, WindowTotal> = BTreeMap::new();
    for r in peers.iter().map(std::borrow::Borrow::borrow) {
        if now - r.heartbeat > STALE_AFTER_SECS {
            continue;
        }
        for (policy, t) in &r.traffic {
            all.entry(policy.clone()).or_default().add(t);
        }
    }
    all
}

/// Whether `cm` is another replica's than `me`'s.
fn of_other(cm: &ConfigMap, me: &str) -> bool {
    cm.labels()
        .get(SYNC_COUNTS_LABEL)
        .is_some_and(|owner| owner != me)
}

/// Publishes this replica's counts every few seconds while it runs.
pub(crate) async fn publish(
    client: Client,
    namespace: String,
    me: String,
    cache: Cache,
    registry: Arc<SidecarRegistry>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let name = format!("reprise-sync-{}", sanitize(&me));
    let mut last: Option<(BTreeMap<String, PeerCount>, i64)> = None;
    // Parts written last time: a part no longer needed is emptied once.
    let mut parts_written = 1;
    let peers = cache
        .peers
        .as_ref()
        .map(|watched| Peers::new(watched.store.clone(), me.clone()));
    loop {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        // A pod holds one stream across the replicas: the older closes.
        if let Some(peers) = &peers {
            let closed = dedup::close_replaced(&registry, &peers.reports(), now);
            if closed > 0 {
                tracing::info!(
                    closed,
                    "streams of pods connected anew to another replica closed"
                );
            }
        }
        let counts: BTreeMap<String, PeerCount> = cache
            .policies()
            .iter()
            .map(|p| {
                let c = registry.counts(p, &|ns: &str| cache.namespace_labels(ns));
                let count = PeerCount {
                    generation: policy::generation(p),
                    selected: c.selected,
                    in_sync: c.in_sync,
                };
                (policy::id(p), count)
            })
            .filter(|(_, c)| c.selected > 0)
            .collect();
        let due = last
            .as_ref()
            .is_none_or(|(prev, at)| *prev != counts || now - at >= HEARTBEAT_SECS);
        if due {
            let report = PeerReport {
                heartbeat: now,
                counts: counts.clone(),
                traffic: shards::published(registry.traffic().all(now)),
                pods: dedup::published(&registry),
            };
            let parts = shards::split(&report, shards::PART_BYTES);
            let written = parts.len();
            let empty = shards::empty(now);
            let mut failed = None;
            for (i, part) in parts
                .iter()
                .chain(std::iter::repeat(&empty))
                .take(written.max(parts_written))
                .enumerate()
            {
                let name = shards::part_name(&name, i);
                let cm = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": { "name": name, "labels": { SYNC_COUNTS_LABEL: me } },
                    "data": { REPORT_KEY: part },
                });
                if let Err(e) = api
                    .patch(
                        &name,
                        &PatchParams::apply(MANAGER).force(),
                        &Patch::Apply(&cm),
                    )
                    .await
                {
                    failed = Some(e);
                }
            }
            match failed {
                None => {
                    last = Some((counts, now));
                    parts_written = written;
                }
                Some(e) => tracing::warn!(error = %e, "cannot publish sync counts"),
            }
        }
        tokio::time::sleep(COUNT_EVERY).await;
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn fresh_peers_add_up_and_stale_ones_do_not() {
        let p = fixtures::policy().named("reads").generation(4).build();
        let report = |heartbeat, generation, selected, in_sync| PeerReport {
            heartbeat,
            counts: BTreeMap::from([(
                "shop/reads".to_string(),
                PeerCount {
                    generation,
                    selected,
                    in_sync,
                },
            )]),
            ..PeerReport::default()
        };
        let peers = [
            report(100, 4, 3, 3),
            report(95, 3, 2, 2),
            report(10, 4, 5, 5),
        ];
        let t = total(
            SyncCounts {
                selected: 1,
                in_sync: 1,
                ..Default::default()
            },
            &p,
            &peers,
            100,
        );
        // Local 1/1, fresh peer 3/3, peer on the old generation 0/2, stale peer ignored.
        assert_eq!(
            t,
            SyncCounts {
                selected: 6,
                in_sync: 4,
                ..Default::default()
            }
        );
    }

    #[test]
    fn fresh_peers_traffic_adds_up_and_stale_traffic_does_not() {
        let report = |heartbeat, requests| PeerReport {
            heartbeat,
            counts: BTreeMap::new(),
            traffic: BTreeMap::from([(
                "shop/reads".to_string(),
                WindowTotal {
                    counts: reprise_crds::traffic::TrafficCounts {
                        requests,
                        ..Default::default()
                    },
                    sidecars: 2,
                },
            )]),
            ..PeerReport::default()
        };
        let peers = [report(100, 10), report(95, 5), report(10, 1000)];
        let all = fresh_traffic(&peers, 100);
        let t = &all["shop/reads"];
        assert_eq!((t.counts.requests, t.sidecars), (15, 4));
        assert!(!all.contains_key("shop/other"));
        assert!(fresh_traffic(&peers[2..], 100).is_empty());
    }
}
