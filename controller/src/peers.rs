//! In-Sync counts across controller replicas. Sidecars may hold their stream
//! to any replica, but only the leader writes status: every replica publishes
//! its own per-policy counts in a ConfigMap, and the leader adds them up.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use reprise_crds::resource::RetryPolicy;
use serde::{Deserialize, Serialize};

use crate::sidecars::SidecarRegistry;
use crate::status::SyncCounts;

/// Label on every replica's sync ConfigMap.
pub const LABEL: &str = "reprise.dev/sync-counts";
/// Counts older than this are from a replica that is gone.
pub const STALE_AFTER_SECS: i64 = 30;

/// One replica's counts for one policy generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerCount {
    /// Generation the counts are for.
    pub generation: i64,
    /// Sidecars selected.
    pub selected: i32,
    /// Sidecars that ACKed this generation.
    pub in_sync: i32,
}

/// What one replica publishes: counts by `namespace/name`, and when.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerReport {
    /// Unix seconds of the last refresh.
    pub heartbeat: i64,
    /// Counts by policy.
    pub counts: BTreeMap<String, PeerCount>,
}

/// Adds this replica's counts and fresh peer reports for `policy`.
pub fn total(
    local: SyncCounts,
    policy: &RetryPolicy,
    peers: &[PeerReport],
    now: i64,
) -> SyncCounts {
    let id = format!(
        "{}/{}",
        policy.namespace().unwrap_or_default(),
        policy.name_any()
    );
    let generation = policy.metadata.generation.unwrap_or(0);
    peers
        .iter()
        .filter(|r| now - r.heartbeat <= STALE_AFTER_SECS)
        .filter_map(|r| r.counts.get(&id))
        .fold(local, |mut acc, c| {
            acc.selected += c.selected;
            if c.generation >= generation {
                acc.in_sync += c.in_sync;
            }
            acc
        })
}

/// Reports of other replicas, from a store of sync ConfigMaps.
pub fn reports(store: &Store<ConfigMap>, me: &str) -> Vec<PeerReport> {
    store
        .state()
        .iter()
        .filter(|cm| cm.labels().get(LABEL).is_some_and(|owner| owner != me))
        .filter_map(|cm| serde_json::from_str(cm.data.as_ref()?.get("report")?).ok())
        .collect()
}

/// Publishes this replica's counts every few seconds while it runs.
pub async fn publish(
    client: Client,
    namespace: String,
    me: String,
    policies: Store<RetryPolicy>,
    registry: Arc<SidecarRegistry>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let name = format!("reprise-sync-{}", sanitize(&me));
    let mut last: Option<(HashMap<String, PeerCount>, i64)> = None;
    loop {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let counts: BTreeMap<String, PeerCount> = policies
            .state()
            .iter()
            .map(|p| {
                let c = registry.counts(p);
                let id = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
                (
                    id,
                    PeerCount {
                        generation: p.metadata.generation.unwrap_or(0),
                        selected: c.selected,
                        in_sync: c.in_sync,
                    },
                )
            })
            .filter(|(_, c)| c.selected > 0)
            .collect();
        let flat: HashMap<String, PeerCount> = counts.clone().into_iter().collect();
        let due = last
            .as_ref()
            .is_none_or(|(prev, at)| *prev != flat || now - at >= 10);
        if due {
            let report = PeerReport {
                heartbeat: now,
                counts,
            };
            let cm = serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": name, "labels": { LABEL: me } },
                "data": { "report": serde_json::to_string(&report).unwrap_or_default() },
            });
            match api
                .patch(
                    &name,
                    &PatchParams::apply("reprise-controller").force(),
                    &Patch::Apply(&cm),
                )
                .await
            {
                Ok(_) => last = Some((flat, now)),
                Err(e) => tracing::warn!(error = %e, "cannot publish sync counts"),
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
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
    use reprise_crds::resource::{RetryPolicySpec, TargetRef};

    use super::*;

    #[test]
    fn fresh_peers_add_up_and_stale_ones_do_not() {
        let mut p = RetryPolicy::new(
            "reads",
            RetryPolicySpec {
                target_ref: TargetRef {
                    name: "api".into(),
                    port: None,
                },
                pod_selector: None,
                rule: Default::default(),
            },
        );
        p.metadata.namespace = Some("shop".into());
        p.metadata.generation = Some(4);
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
                in_sync: 4
            }
        );
    }
}
