//! Connected sidecars and what each has ACKed, turned into per-policy sync counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use reprise_crds::resource::RetryPolicy;

/// One connected sidecar.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SidecarState {
    /// Pod labels, for policy selection.
    pub labels: BTreeMap<String, String>,
    /// Version last sent.
    pub sent: Option<String>,
    /// Version last ACKed.
    pub acked: Option<String>,
    /// `namespace/name` → generation of every policy in the ACKed snapshot.
    pub acked_policies: HashMap<String, i64>,
    /// Error of the last NACK, if the last answer was a NACK.
    pub nack: Option<String>,
}

/// Every sidecar connected to this replica, by `namespace/pod`.
#[derive(Debug, Default)]
pub struct SidecarRegistry {
    sidecars: Mutex<HashMap<(String, String), SidecarState>>,
}

impl SidecarRegistry {
    /// Registers a connection for a pod.
    pub fn connect(&self, namespace: &str, pod: &Pod) {
        let mut map = self.sidecars.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(
            (namespace.to_string(), pod.name_any()),
            SidecarState {
                labels: pod.labels().clone(),
                ..Default::default()
            },
        );
    }

    /// Forgets a pod's connection.
    pub fn disconnect(&self, namespace: &str, pod: &str) {
        let mut map = self.sidecars.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&(namespace.to_string(), pod.to_string()));
    }

    /// Records what was sent.
    pub fn sent(&self, namespace: &str, pod: &str, version: &str) {
        self.update(namespace, pod, |s| s.sent = Some(version.to_string()));
    }

    /// Records an ACK of `version` whose policies are `policies`.
    pub fn ack(&self, namespace: &str, pod: &str, version: &str, policies: HashMap<String, i64>) {
        self.update(namespace, pod, |s| {
            s.acked = Some(version.to_string());
            s.acked_policies = policies;
            s.nack = None;
        });
    }

    /// Records a NACK.
    pub fn nack(&self, namespace: &str, pod: &str, error: &str) {
        self.update(namespace, pod, |s| s.nack = Some(error.to_string()));
    }

    /// Connected sidecars.
    pub fn connected(&self) -> usize {
        self.sidecars
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Sidecars `policy` selects, and how many ACKed its current generation.
    pub fn counts(&self, policy: &RetryPolicy) -> crate::status::SyncCounts {
        let ns = policy.namespace().unwrap_or_default();
        let id = format!("{ns}/{}", policy.name_any());
        let generation = policy.metadata.generation.unwrap_or(0);
        let map = self.sidecars.lock().unwrap_or_else(|e| e.into_inner());
        let mut counts = crate::status::SyncCounts::default();
        for ((pod_ns, _), s) in map.iter() {
            if *pod_ns != ns || !crate::selection::selects(policy, &s.labels) {
                continue;
            }
            counts.selected += 1;
            if s.acked_policies.get(&id).is_some_and(|g| *g >= generation) {
                counts.in_sync += 1;
            }
        }
        counts
    }

    fn update(&self, namespace: &str, pod: &str, f: impl FnOnce(&mut SidecarState)) {
        let mut map = self.sidecars.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get_mut(&(namespace.to_string(), pod.to_string())) {
            f(s);
        }
    }
}
