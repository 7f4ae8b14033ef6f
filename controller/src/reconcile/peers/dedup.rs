//! One stream per pod across the replicas. A sidecar holds one stream, to
//! one replica; but a pod may open one to each (a hostile one to have its
//! reports counted on each, a sidecar whose old connection has not yet
//! been noticed gone), and the leader adds the replicas' counts. So each
//! replica publishes a digest of each pod it holds a stream of, and when
//! it connected; a replica that sees one of its pods connected later to
//! another replica closes its own, older stream. Within a heartbeat and a
//! watch event of a pod's second stream, its first is gone, and with it
//! that pod's place in the first replica's counts.
//!
//! The digests are SHA-256 of `namespace/pod`, cut to 64 bits: no pod can
//! choose a name whose digest is another's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{PeerReport, STALE_AFTER_SECS};
use crate::sidecars::SidecarRegistry;

/// The digest of pod `namespace/pod` as replicas publish it.
pub(super) fn digest(namespace: &str, pod: &str) -> String {
    let d = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{namespace}/{pod}").as_bytes(),
    );
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// This replica's streams as it publishes them: digest → connected at.
pub(super) fn published(registry: &SidecarRegistry) -> BTreeMap<String, i64> {
    registry
        .streams()
        .into_iter()
        .map(|(ns, pod, at)| (digest(&ns, &pod), at))
        .collect()
}

/// Closes the streams of `registry` whose pod a fresh report of `peers`
/// holds since later; how many.
pub(super) fn close_replaced(
    registry: &SidecarRegistry,
    peers: &[Arc<PeerReport>],
    now: i64,
) -> usize {
    let mut newest: HashMap<&str, i64> = HashMap::new();
    for r in peers
        .iter()
        .filter(|r| now - r.heartbeat <= STALE_AFTER_SECS)
    {
        for (pod, at) in &r.pods {
            let e = newest.entry(pod.as_str()).or_insert(*at);
            *e = (*e).max(*at);
        }
    }
    if newest.is_empty() {
        return 0;
    }
    let mut closed = 0;
    for (ns, pod, at) in registry.streams() {
        if newest
            .get(digest(&ns, &pod).as_str())
            .is_some_and(|theirs| *theirs > at)
        {
            registry.close(&ns, &pod);
            closed += 1;
        }
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[tokio::test]
    async fn a_pod_connected_anew_to_another_replica_loses_its_stream_here() {
        let registry = SidecarRegistry::default();
        let older = registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 1);
        let other = registry.connect("shop", "web-1", BTreeMap::new(), BTreeSet::new(), 2);
        let here = registry.streams();
        let at = here[0].2;
        let report = |heartbeat: i64, pods: &[(&str, i64)]| {
            Arc::new(PeerReport {
                heartbeat,
                pods: pods
                    .iter()
                    .map(|(p, at)| (digest("shop", p), *at))
                    .collect(),
                ..PeerReport::default()
            })
        };
        // A peer holds web-0 since before: nothing to close here.
        assert_eq!(
            close_replaced(&registry, &[report(at, &[("web-0", at - 5)])], at),
            0
        );
        // A stale peer: nothing either.
        assert_eq!(
            close_replaced(&registry, &[report(at - 100, &[("web-0", at + 1)])], at),
            0
        );
        // A fresh peer holds web-0 since later: this replica's stream closes.
        assert_eq!(
            close_replaced(&registry, &[report(at, &[("web-0", at + 1)])], at),
            1
        );
        assert!(older.is_closed());
        assert!(!other.is_closed());
        assert_eq!(published(&registry).len(), 2);
        assert_ne!(digest("shop", "web-0"), digest("shop", "web-1"));
        assert_eq!(digest("shop", "web-0").len(), 16);
    }
}
