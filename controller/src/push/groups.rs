//! Sidecars alike share one snapshot: a group per namespace, label set and
//! announced capabilities (what a snapshot depends on). A change is
//! computed once per group it may affect, published to that group's
//! streams only when its version changed, and each line is encoded once per
//! group: the whole snapshot once, a delta once per version it starts from.
//! Groups live while a stream holds them.
//!
//! One task ([`PushServer::publish`](super::PushServer)) turns batches of
//! changes into publications: it waits [`DEBOUNCE`] after a change, so that
//! a burst (a rolling restart, a Service and its EndpointSlices) is one
//! publication, asks the source which namespaces changed, and refreshes the
//! groups there. A stream of a group nothing changed for is never woken.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use reprise_crds::protocol::CAPABILITY_DELTA;
use reprise_crds::snapshot::{DeltaLine, Entries, Snapshot};
use tokio::sync::watch;

use super::auth::Identity;
use super::source::{Changed, SnapshotSource};

/// Changes closer together than this are published once.
pub(super) const DEBOUNCE: Duration = Duration::from_millis(50);

/// Deltas kept encoded per publication, by the version they start from:
/// alike sidecars are nearly always one or two versions behind.
const DELTAS_KEPT: usize = 4;

/// Namespace, sorted labels and announced capabilities.
type GroupKey = (String, Vec<(String, String)>, Vec<String>);

/// The live groups.
#[derive(Default)]
pub(super) struct Groups {
    live: Mutex<HashMap<GroupKey, Weak<Group>>>,
}

/// Sidecars alike, and what they are to run.
pub(super) struct Group {
    /// One of them: what the source computes the snapshot for.
    id: Identity,
    /// Their snapshot, published.
    tx: watch::Sender<Arc<Published>>,
}

/// One version of a group's snapshot, with its lines encoded on demand.
pub(super) struct Published {
    /// The version sidecars ACK: the entries' for sidecars that take
    /// deltas, the content hash of the whole snapshot for older ones.
    pub(super) version: String,
    /// The entries, to compute deltas between publications.
    entries: Entries,
    /// Their version, whatever `version` is.
    entries_version: String,
    /// Its policies, `namespace/name` → generation, for the sync counts.
    pub(super) policies: Arc<HashMap<String, i64>>,
    /// The whole snapshot's line.
    full: OnceLock<Bytes>,
    /// Delta lines to this version, by the version they start from.
    deltas: Mutex<Vec<(String, Bytes)>>,
}

impl Groups {
    /// The group of `id`, created (its snapshot computed) if none lives.
    /// Computed under the lock, so that the publisher, which looks for the
    /// groups a change affects under it too, cannot miss a group whose
    /// snapshot predates the change.
    pub(super) fn join(&self, id: &Identity, source: &dyn SnapshotSource) -> Arc<Group> {
        let key = key(id);
        let mut live = self.lock();
        if let Some(g) = live.get(&key).and_then(Weak::upgrade) {
            return g;
        }
        let group = Arc::new(Group {
            id: Identity {
                pod: String::new(),
                ..id.clone()
            },
            tx: watch::channel(Arc::new(Published::compute(id, source))).0,
        });
        live.insert(key, Arc::downgrade(&group));
        group
    }

    /// The live groups `changed` may affect (and forgets the dead ones).
    pub(super) fn affected(&self, changed: &Changed) -> Vec<Arc<Group>> {
        let mut live = self.lock();
        live.retain(|_, g| g.strong_count() > 0);
        live.iter()
            .filter(|((ns, _, _), _)| changed.includes(ns))
            .filter_map(|(_, g)| g.upgrade())
            .collect()
    }

    /// How many groups live.
    pub(super) fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|g| g.strong_count() > 0)
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GroupKey, Weak<Group>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Group {
    /// Follows the group's publications.
    pub(super) fn subscribe(&self) -> watch::Receiver<Arc<Published>> {
        self.tx.subscribe()
    }

    /// Computes the snapshot again and publishes it if its version
    /// changed; true when it did.
    pub(super) fn refresh(&self, source: &dyn SnapshotSource) -> bool {
        let entries = Published::entries(&self.id, source);
        // Compared before anything is encoded: most groups a change may
        // affect are not affected.
        if self.tx.borrow().entries_version == entries.version() {
            return false;
        }
        self.tx
            .send_replace(Arc::new(Published::new(&self.id, entries)));
        true
    }
}

impl Published {
    /// `id`'s snapshot, as its capabilities let it be sent.
    fn compute(id: &Identity, source: &dyn SnapshotSource) -> Self {
        Published::new(id, Published::entries(id, source))
    }

    /// `id`'s entries, as its capabilities let them be sent.
    fn entries(id: &Identity, source: &dyn SnapshotSource) -> Entries {
        let mut entries = source.entries_for(id);
        let withheld = entries.for_capabilities(&id.capabilities);
        if !withheld.is_empty() {
            tracing::debug!(namespace = %id.namespace, ?withheld, "upstreams withheld from sidecars that do not announce what they need (TLS, DNS names): upgrade them");
        }
        entries
    }

    /// The publication of `entries` for sidecars like `id`.
    fn new(id: &Identity, entries: Entries) -> Self {
        let policies = Arc::new(
            entries
                .policies
                .values()
                .map(|p| {
                    (
                        format!("{}/{}", p.policy.namespace, p.policy.name),
                        p.policy.generation,
                    )
                })
                .collect(),
        );
        let full = OnceLock::new();
        let entries_version = entries.version();
        let version = if id.capabilities.contains(CAPABILITY_DELTA) {
            entries_version.clone()
        } else {
            // Older sidecars check the content hash of the whole snapshot:
            // encode it now, as they will all need it.
            let s = entries.to_snapshot();
            let s = Snapshot::new(s.upstreams, s.policies);
            let _ = full.set(line(&s));
            s.version
        };
        Published {
            version,
            entries,
            entries_version,
            policies,
            full,
            deltas: Mutex::default(),
        }
    }

    /// The whole snapshot's line.
    pub(super) fn full_line(&self) -> Bytes {
        self.full
            .get_or_init(|| line(&self.entries.to_snapshot()))
            .clone()
    }

    /// The line of the delta from `base` to this version.
    pub(super) fn delta_line(&self, base: &Published) -> Bytes {
        let mut deltas = self.deltas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, line)) = deltas.iter().find(|(v, _)| *v == base.version) {
            return line.clone();
        }
        let encoded = line(&DeltaLine {
            delta: base.entries.delta_to(&self.entries),
        });
        if deltas.len() == DELTAS_KEPT {
            deltas.remove(0);
        }
        deltas.push((base.version.clone(), encoded.clone()));
        encoded
    }
}

/// A JSON line.
fn line<T: serde::Serialize>(value: &T) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn key(id: &Identity) -> GroupKey {
    (
        id.namespace.clone(),
        id.labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        id.capabilities.iter().cloned().collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use reprise_crds::snapshot::{SnapshotEndpoint, SnapshotUpstream};

    use super::*;

    /// One upstream per namespace, its endpoint ports set by the test.
    #[derive(Default)]
    struct PerNamespace(Mutex<HashMap<String, Vec<u16>>>, Mutex<u32>);

    impl SnapshotSource for PerNamespace {
        fn snapshot_for(&self, id: &Identity) -> Snapshot {
            *self.1.lock().expect("lock") += 1;
            let ports = self.0.lock().expect("lock").get(&id.namespace).cloned();
            let upstream = SnapshotUpstream {
                name: format!("api.{}", id.namespace),
                endpoints: ports
                    .unwrap_or_default()
                    .into_iter()
                    .map(|port| SnapshotEndpoint {
                        address: "10.0.0.1".into(),
                        port,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            Snapshot::new(vec![upstream], vec![])
        }

        fn changes(&self) -> watch::Receiver<u64> {
            watch::channel(0).1
        }
    }

    fn id(namespace: &str, app: &str, caps: &[&str]) -> Identity {
        Identity {
            namespace: namespace.into(),
            pod: format!("{app}-1"),
            labels: BTreeMap::from([("app".to_string(), app.to_string())]),
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn alike_sidecars_share_a_group_and_only_changed_namespaces_are_computed_again() {
        let source = PerNamespace::default();
        source.0.lock().expect("lock").insert("a".into(), vec![1]);
        let groups = Groups::default();
        let a1 = groups.join(&id("a", "web", &["delta"]), &source);
        let a2 = groups.join(&id("a", "web", &["delta"]), &source);
        assert!(Arc::ptr_eq(&a1, &a2), "one group, computed once");
        let b = groups.join(&id("b", "web", &["delta"]), &source);
        let a_old = groups.join(&id("a", "web", &[]), &source);
        assert_eq!(groups.len(), 3);
        assert_eq!(*source.1.lock().expect("lock"), 3);

        let mut rx_a = a1.subscribe();
        let mut rx_b = b.subscribe();
        rx_a.borrow_and_update();
        rx_b.borrow_and_update();
        let before = Arc::clone(&rx_a.borrow());
        source
            .0
            .lock()
            .expect("lock")
            .insert("a".into(), vec![1, 2]);
        let affected = groups.affected(&Changed::Namespaces(["a".to_string()].into()));
        assert_eq!(affected.len(), 2, "a's two groups, not b's");
        assert!(affected.iter().all(|g| g.refresh(&source)));
        assert!(rx_a.has_changed().expect("open"));
        assert!(!rx_b.has_changed().expect("open"), "b is not woken");
        // Refreshing with nothing changed publishes nothing.
        assert!(!b.refresh(&source));
        assert!(!rx_b.has_changed().expect("open"));

        let after = Arc::clone(&rx_a.borrow_and_update());
        let delta = after.delta_line(&before);
        assert!(delta.starts_with(reprise_crds::snapshot::DELTA_PREFIX));
        assert_eq!(
            delta.as_ptr(),
            after.delta_line(&before).as_ptr(),
            "encoded once"
        );
        let line: DeltaLine = serde_json::from_slice(&delta).expect("delta");
        assert_eq!(line.delta.endpoints.len(), 1);
        assert_eq!(line.delta.endpoints[0].added.len(), 1);
        assert_eq!(line.delta.version, after.version);
        // An older sidecar's group is versioned by the whole snapshot's hash.
        let old = Arc::clone(&a_old.subscribe().borrow());
        let whole: Snapshot = serde_json::from_slice(&old.full_line()).expect("snapshot");
        assert_eq!(old.version, whole.content_hash());
        assert_ne!(old.version, after.version);

        drop((a1, a2, a_old, rx_a, affected));
        assert_eq!(groups.affected(&Changed::All).len(), 1, "only b lives");
        assert_eq!(groups.len(), 1);
    }
}
