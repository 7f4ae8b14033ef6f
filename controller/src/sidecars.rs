//! The sidecars connected to this replica and what each has ACKed, turned
//! into per-policy sync counts. The push server records into the
//! [`SidecarRegistry`]: a sidecar is in it while its stream's registration
//! lives (`push/stream.rs`), with the versions sent to it and ACKed. The
//! reconciler (the `InSync` condition), the sync-count publisher (peers) and
//! the `reprise_controller_connected_sidecars` and `_sidecars_out_of_sync`
//! gauges read it. It is its own module, below all of them, so that the
//! reconciler and the metrics reach it without depending on the push server.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use kube::ResourceExt;
use reprise_crds::resource::RetryPolicy;

use crate::policy::{self, selection};
use crate::traffic::{Pace, TrafficBook};
use reprise_crds::traffic::TrafficReport;

/// Longest NACK message kept (and shown on the debug page); a sidecar's
/// error names a policy and a field, far shorter.
pub const MAX_NACK_BYTES: usize = 4096;

/// Sidecars selected by a policy and how many run its current generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SyncCounts {
    /// Connected sidecars whose pod the policy selects.
    pub(crate) selected: i32,
    /// Of those, how many ACKed a snapshot with this generation.
    pub(crate) in_sync: i32,
    /// Of those, how many (on this replica) did not announce a capability
    /// the policy's target needs, so their snapshots leave it out.
    pub(crate) outdated: i32,
}

/// One connected sidecar.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SidecarState {
    /// Pod labels, for policy selection.
    pub labels: BTreeMap<String, String>,
    /// What its subscription announced it understands (`tls`, `dns`).
    pub capabilities: BTreeSet<String>,
    /// Version last sent.
    pub sent: Option<String>,
    /// Policies in the snapshot last sent (`namespace/name` → generation).
    pub sent_policies: HashMap<String, i64>,
    /// Version last ACKed.
    pub acked: Option<String>,
    /// Policies in the ACKed snapshot.
    pub acked_policies: HashMap<String, i64>,
    /// Policies an ACK took out of the pod's snapshot since its last
    /// report: the sidecar reports what they counted before the change
    /// once more, in its next report.
    pub retired_policies: BTreeSet<String>,
    /// Error of the last NACK, if the last answer was a NACK.
    pub nack: Option<String>,
    /// Which connection owns this entry (a reconnect replaces it).
    pub connection: u64,
    /// When the snapshot last sent was sent.
    pub sent_at: Option<std::time::Instant>,
    /// The line last sent, as sent: a whole snapshot or a delta (shared
    /// with every sidecar of its group). `None` when nothing was sent on
    /// this connection (it resumed the version it runs).
    pub sent_line: Option<bytes::Bytes>,
    /// The sidecar sent its final report on this connection: it is
    /// stopping, and reports after it are refused.
    pub reported_final: bool,
    /// Closes this connection's stream (a newer one of the pod replaced it).
    pub closer: Closer,
    /// When it connected (Unix seconds).
    pub connected_at: i64,
}

/// Ends one connection's stream from elsewhere: a pod holds one stream to a
/// replica, and its reconnect closes the older one at once.
#[derive(Clone, Debug)]
pub struct Closer(std::sync::Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Closer {
    fn default() -> Self {
        Closer(std::sync::Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl PartialEq for Closer {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Closer {
    /// Ends the stream.
    pub fn close(&self) {
        self.0.send_replace(true);
    }

    /// Resolves once the stream is to end.
    pub async fn closed(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|closed| *closed).await;
    }

    /// Whether the stream is to end.
    pub fn is_closed(&self) -> bool {
        *self.0.borrow()
    }
}

/// Every sidecar connected to this replica, by `namespace/pod`.
#[derive(Debug)]
pub struct SidecarRegistry {
    sidecars: Mutex<HashMap<(String, String), SidecarState>>,
    /// What they report of their policies' traffic.
    traffic: TrafficBook,
    /// Each pod's report pace, kept across its reconnects (a pod absent
    /// here has a rested pace).
    paces: Mutex<HashMap<(String, String), Pace>>,
    /// Sidecars report this often (`REPORT_SECS`, shorter in tests).
    report_interval: std::time::Duration,
    /// Measures the paces.
    clock: tokio::time::Instant,
}

impl Default for SidecarRegistry {
    fn default() -> Self {
        Self::with_report_interval(std::time::Duration::from_secs(
            reprise_crds::traffic::REPORT_SECS,
        ))
    }
}

/// What became of a traffic report ([`SidecarRegistry::record_traffic`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Recorded; `unknown_policies` of its policies were never sent to the
    /// pod and were dropped.
    Recorded {
        /// Policies dropped.
        unknown_policies: u64,
    },
    /// Sooner than the pod's pace allows: dropped.
    TooSoon,
    /// After the final report of its connection: dropped.
    AfterFinal,
    /// The pod has no stream here (it ended meanwhile): dropped.
    NotConnected,
}

impl SidecarRegistry {
    /// A registry for sidecars that report every `interval`.
    pub fn with_report_interval(interval: std::time::Duration) -> Self {
        SidecarRegistry {
            sidecars: Mutex::default(),
            traffic: TrafficBook::default(),
            paces: Mutex::default(),
            report_interval: interval,
            clock: tokio::time::Instant::now(),
        }
    }

    /// The traffic the sidecars connected here reported, by policy.
    pub fn traffic(&self) -> &TrafficBook {
        &self.traffic
    }

    /// Takes the traffic `namespace/pod` reported at `now` (Unix seconds),
    /// checked already ([`TrafficReport::check`]), when the pod's pace
    /// allows it, for the policies it was sent; names it was not sent are
    /// dropped, so a sidecar cannot grow the book with policies of its own
    /// making.
    pub(crate) fn record_traffic(
        &self,
        namespace: &str,
        pod: &str,
        mut report: TrafficReport,
        now: i64,
    ) -> Taken {
        let key = (namespace.to_string(), pod.to_string());
        let unknown_policies = {
            let mut sidecars = self.lock();
            let connected = sidecars.len();
            let Some(s) = sidecars.get_mut(&key) else {
                return Taken::NotConnected;
            };
            if s.reported_final {
                return Taken::AfterFinal;
            }
            if !self.pace(&key, report.last, connected) {
                return Taken::TooSoon;
            }
            s.reported_final = report.last;
            let before = report.traffic.len();
            report.traffic.retain(|id, _| {
                s.sent_policies.contains_key(id)
                    || s.acked_policies.contains_key(id)
                    || s.retired_policies.contains(id)
            });
            s.retired_policies.clear();
            (before - report.traffic.len()) as u64
        };
        if !report.traffic.is_empty() {
            self.traffic
                .record(&format!("{namespace}/{pod}"), &report, now);
        }
        Taken::Recorded { unknown_policies }
    }

    /// Whether `key`'s pace takes a report (`last`: its final one) now;
    /// forgets rested paces once they outnumber the `connected` sidecars.
    fn pace(&self, key: &(String, String), last: bool, connected: usize) -> bool {
        let now = u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX);
        let every = u64::try_from(self.report_interval.as_millis()).unwrap_or(u64::MAX);
        let mut paces = self.paces.lock().unwrap_or_else(|e| e.into_inner());
        if paces.len() > 2 * connected + 64 {
            paces.retain(|_, p| !p.is_rested(now, every));
        }
        if let Some(p) = paces.get_mut(key) {
            return p.take(now, every, last);
        }
        let mut p = Pace::default();
        let taken = p.take(now, every, last);
        paces.insert(key.clone(), p);
        taken
    }

    /// Registers connection `connection` for a pod, replacing an older one,
    /// whose stream is closed; returns what closes the new one's.
    pub(crate) fn connect(
        &self,
        namespace: &str,
        pod: &str,
        labels: BTreeMap<String, String>,
        capabilities: BTreeSet<String>,
        connection: u64,
    ) -> Closer {
        let closer = Closer::default();
        let replaced = self.lock().insert(
            (namespace.to_string(), pod.to_string()),
            SidecarState {
                labels,
                capabilities,
                connection,
                closer: closer.clone(),
                connected_at: k8s_openapi::jiff::Timestamp::now().as_second(),
                ..Default::default()
            },
        );
        if let Some(old) = replaced.filter(|old| old.connection != connection) {
            old.closer.close();
        }
        closer
    }

    /// Every connected pod, with when its stream connected (Unix seconds).
    pub(crate) fn streams(&self) -> Vec<(String, String, i64)> {
        self.lock()
            .iter()
            .map(|((ns, pod), s)| (ns.clone(), pod.clone(), s.connected_at))
            .collect()
    }

    /// Closes the stream of `namespace/pod` (a newer one is held elsewhere).
    pub(crate) fn close(&self, namespace: &str, pod: &str) {
        if let Some(s) = self.lock().get(&(namespace.to_string(), pod.to_string())) {
            s.closer.close();
        }
    }

    /// Forgets a pod's connection, unless a newer connection replaced it.
    /// Returns the policies that pod had ACKed (their sync counts changed).
    pub(crate) fn disconnect(&self, namespace: &str, pod: &str, connection: u64) -> Vec<String> {
        let mut map = self.lock();
        let key = (namespace.to_string(), pod.to_string());
        if map.get(&key).is_some_and(|s| s.connection == connection) {
            return map
                .remove(&key)
                .map(|s| s.acked_policies.into_keys().collect())
                .unwrap_or_default();
        }
        Vec::new()
    }

    /// Records that `version` runs without a push (a sidecar resumed it).
    pub(crate) fn sent(
        &self,
        namespace: &str,
        pod: &str,
        version: &str,
        policies: HashMap<String, i64>,
    ) {
        self.pushed(namespace, pod, version, policies, None);
    }

    /// Records what was sent: `line` (a whole snapshot or a delta) bringing
    /// the sidecar to `version`.
    pub(crate) fn pushed(
        &self,
        namespace: &str,
        pod: &str,
        version: &str,
        policies: HashMap<String, i64>,
        line: Option<bytes::Bytes>,
    ) {
        if let Some(s) = self
            .lock()
            .get_mut(&(namespace.to_string(), pod.to_string()))
        {
            s.sent = Some(version.to_string());
            s.sent_policies = policies;
            s.sent_at = Some(std::time::Instant::now());
            s.sent_line = line;
        }
    }

    /// What was last sent to `namespace/pod` and what it answered, for the
    /// debug page (`GET /debug/sidecars/NAMESPACE/POD` on the metrics
    /// listener; `kubectl reprise sent`). `None` when it is not connected
    /// to this replica.
    pub fn sent_page(&self, namespace: &str, pod: &str) -> Option<serde_json::Value> {
        let s = self.get(namespace, pod)?;
        let line = s.sent_line.as_deref().map(|l| l.trim_ascii_end());
        let kind = match line {
            None if s.sent.is_some() => "resumed",
            None => "nothing",
            Some(l) if l.starts_with(reprise_crds::snapshot::DELTA_PREFIX) => "delta",
            Some(_) => "whole",
        };
        let mut policies: Vec<(&String, &i64)> = s.sent_policies.iter().collect();
        policies.sort();
        Some(serde_json::json!({
            "namespace": namespace,
            "pod": pod,
            "connection": s.connection,
            "labels": s.labels,
            "capabilities": s.capabilities,
            "sent": {
                "version": s.sent,
                "secondsAgo": s.sent_at.map(|t| (t.elapsed().as_secs_f64() * 10.0).round() / 10.0),
                "kind": kind,
                "bytes": line.map(<[u8]>::len),
                "policies": policies.into_iter().map(|(id, g)| serde_json::json!({"policy": id, "generation": g})).collect::<Vec<_>>(),
                "line": line.and_then(|l| serde_json::from_slice::<serde_json::Value>(l).ok()),
            },
            "acked": s.acked,
            "inSync": s.sent.is_some() && s.acked == s.sent,
            "nack": s.nack,
        }))
    }

    /// Every sidecar connected to this replica, with the versions sent and
    /// ACKed (`GET /debug/sidecars`).
    pub fn sent_list(&self) -> serde_json::Value {
        let mut rows: Vec<serde_json::Value> = self
            .lock()
            .iter()
            .map(|((namespace, pod), s)| {
                serde_json::json!({
                    "namespace": namespace,
                    "pod": pod,
                    "sent": s.sent,
                    "acked": s.acked,
                    "inSync": s.sent.is_some() && s.acked == s.sent,
                })
            })
            .collect();
        rows.sort_by(|a, b| {
            (a["namespace"].as_str(), a["pod"].as_str())
                .cmp(&(b["namespace"].as_str(), b["pod"].as_str()))
        });
        serde_json::json!({ "sidecars": rows })
    }

    /// Time from sending the current snapshot to now (for the push latency metric).
    pub(crate) fn since_sent(&self, namespace: &str, pod: &str) -> Option<std::time::Duration> {
        self.lock()
            .get(&(namespace.to_string(), pod.to_string()))
            .and_then(|s| s.sent_at)
            .map(|t| t.elapsed())
    }

    /// Records an ACK of `version`; returns the policies whose sync may have
    /// changed (none for an ACK of what was ACKed already), or `None` for a
    /// stale ACK (not the version last sent).
    pub(crate) fn ack(&self, namespace: &str, pod: &str, version: &str) -> Option<Vec<String>> {
        let mut map = self.lock();
        let s = map.get_mut(&(namespace.to_string(), pod.to_string()))?;
        if s.sent.as_deref() != Some(version) {
            return None;
        }
        if s.acked.as_deref() == Some(version)
            && s.acked_policies == s.sent_policies
            && s.nack.is_none()
        {
            // The same ACK again: nothing the reconciler counts changed.
            return Some(Vec::new());
        }
        let mut touched: Vec<String> = s.acked_policies.keys().cloned().collect();
        touched.extend(s.sent_policies.keys().cloned());
        touched.sort();
        touched.dedup();
        s.acked = Some(version.to_string());
        let retired: Vec<String> = s
            .acked_policies
            .keys()
            .filter(|id| !s.sent_policies.contains_key(*id))
            .cloned()
            .collect();
        s.retired_policies.extend(retired);
        s.acked_policies = s.sent_policies.clone();
        s.nack = None;
        Some(touched)
    }

    /// Records a NACK (its message cut to [`MAX_NACK_BYTES`]).
    pub(crate) fn nack(&self, namespace: &str, pod: &str, error: &str) {
        if let Some(s) = self
            .lock()
            .get_mut(&(namespace.to_string(), pod.to_string()))
        {
            s.nack = Some(crate::untrusted::logged(error, MAX_NACK_BYTES));
        }
    }

    /// The state of one sidecar.
    pub fn get(&self, namespace: &str, pod: &str) -> Option<SidecarState> {
        self.lock()
            .get(&(namespace.to_string(), pod.to_string()))
            .cloned()
    }

    /// Connected sidecars.
    pub fn connected(&self) -> usize {
        self.lock().len()
    }

    /// Connected sidecars whose last ACK is not of the version last sent to
    /// them: they NACKed it, or their answer is still awaited. One not yet
    /// sent anything has nothing to be out of sync with.
    pub fn out_of_sync(&self) -> usize {
        self.lock()
            .values()
            .filter(|s| s.sent.is_some() && s.acked != s.sent)
            .count()
    }

    /// Of the sidecars `policy` applies to, how many lack one of `needs`
    /// (the capabilities its target needs) or, in another namespace than
    /// the policy's, the routes capability a producer's precedence needs.
    /// `labels` gives a namespace's labels.
    pub(crate) fn outdated(
        &self,
        policy: &RetryPolicy,
        needs: &[&str],
        labels: &dyn Fn(&str) -> BTreeMap<String, String>,
    ) -> i32 {
        let ns = policy.namespace().unwrap_or_default();
        let n = self
            .lock()
            .iter()
            .filter(|((pod_ns, _), s)| {
                let lacks = |c: &&str| !s.capabilities.contains(*c);
                selection::applies(policy, pod_ns, || labels(pod_ns), &s.labels)
                    && (needs.iter().any(lacks)
                        || (*pod_ns != ns
                            && !s
                                .capabilities
                                .contains(reprise_crds::protocol::CAPABILITY_ROUTES)))
            })
            .count();
        i32::try_from(n).unwrap_or(i32::MAX)
    }

    /// Sidecars `policy` applies to (in its namespace and the namespaces a
    /// producer's `callerNamespaces` adds; `labels` gives a namespace's
    /// labels), and how many ACKed its current generation.
    pub(crate) fn counts(
        &self,
        policy: &RetryPolicy,
        labels: &dyn Fn(&str) -> BTreeMap<String, String>,
    ) -> SyncCounts {
        let id = policy::id(policy);
        let generation = policy::generation(policy);
        let mut counts = SyncCounts::default();
        // A namespace's labels are read once per call, not once per sidecar.
        let mut seen: HashMap<String, BTreeMap<String, String>> = HashMap::new();
        for ((pod_ns, _), s) in self.lock().iter() {
            let applies = selection::applies(
                policy,
                pod_ns,
                || {
                    seen.entry(pod_ns.clone())
                        .or_insert_with(|| labels(pod_ns))
                        .clone()
                },
                &s.labels,
            );
            if !applies {
                continue;
            }
            counts.selected += 1;
            if s.acked_policies.get(&id).is_some_and(|g| *g >= generation) {
                counts.in_sync += 1;
            }
        }
        counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), SidecarState>> {
        self.sidecars.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod sync_tests {
    use super::*;

    #[test]
    fn a_sidecar_is_out_of_sync_from_a_push_until_it_acks_that_version() {
        let registry = SidecarRegistry::default();
        for pod in ["acked", "nacked", "waiting", "new"] {
            registry.connect("shop", pod, BTreeMap::new(), BTreeSet::new(), 1);
        }
        for pod in ["acked", "nacked", "waiting"] {
            registry.sent("shop", pod, "v1", HashMap::new());
        }
        assert!(
            registry
                .ack("shop", "acked", "v1")
                .is_some_and(|t| t.is_empty()),
            "no policy"
        );
        registry.ack("shop", "nacked", "v1");
        assert_eq!(registry.out_of_sync(), 1, "only waiting has not ACKed v1");

        // v2 pushed: an ACK of v1 no longer counts, a NACK leaves it out of sync.
        for pod in ["acked", "nacked", "waiting"] {
            registry.sent("shop", pod, "v2", HashMap::new());
        }
        registry.ack("shop", "acked", "v2");
        registry.nack("shop", "nacked", "invalid rule");
        assert_eq!(registry.ack("shop", "waiting", "v1"), None, "a stale ACK");
        assert_eq!(registry.out_of_sync(), 2, "nacked and waiting");

        registry.disconnect("shop", "nacked", 1);
        assert_eq!(
            registry.out_of_sync(),
            1,
            "a disconnected sidecar is not counted"
        );
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;

    #[test]
    fn the_same_ack_again_changes_nothing_the_reconciler_counts() {
        let registry = SidecarRegistry::default();
        registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 1);
        let policies = HashMap::from([("shop/reads".to_string(), 1)]);
        registry.sent("shop", "web-0", "v1", policies);
        assert_eq!(
            registry.ack("shop", "web-0", "v1"),
            Some(vec!["shop/reads".to_string()])
        );
        for _ in 0..10_000 {
            assert_eq!(registry.ack("shop", "web-0", "v1"), Some(Vec::new()));
        }
        // After a NACK, the ACK of the version sent counts again.
        registry.nack("shop", "web-0", "invalid");
        assert_eq!(
            registry.ack("shop", "web-0", "v1"),
            Some(vec!["shop/reads".to_string()])
        );
    }

    #[tokio::test]
    async fn a_reconnect_closes_the_older_stream_of_the_pod() {
        let registry = SidecarRegistry::default();
        let first = registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 1);
        let other = registry.connect("shop", "web-1", BTreeMap::new(), BTreeSet::new(), 2);
        assert!(!first.is_closed());
        let second = registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 3);
        tokio::time::timeout(std::time::Duration::from_secs(1), first.closed())
            .await
            .expect("the older stream is told to close");
        assert!(!second.is_closed() && !other.is_closed());
        assert_eq!(registry.connected(), 2);
    }

    #[test]
    fn a_nack_is_kept_cut_and_escaped() {
        let registry = SidecarRegistry::default();
        registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 1);
        registry.nack("shop", "web-0", &format!("\u{1b}[2J{}", "x".repeat(70_000)));
        let kept = registry
            .get("shop", "web-0")
            .and_then(|s| s.nack)
            .expect("nack");
        assert!(kept.len() < MAX_NACK_BYTES + 64, "{}", kept.len());
        assert!(kept.starts_with("\\u{1b}[2J"), "{}", &kept[..20]);
    }
}

#[cfg(test)]
mod capability_tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn sidecars_that_did_not_announce_what_a_target_needs_are_counted_as_outdated() {
        let registry = SidecarRegistry::default();
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let tls: BTreeSet<String> = ["tls".to_string(), "dns".to_string()].into();
        registry.connect("shop", "new", labels.clone(), tls, 1);
        registry.connect("shop", "old", labels.clone(), BTreeSet::new(), 2);
        registry.connect("other", "old", labels, BTreeSet::new(), 3);
        let policy = fixtures::policy().build();
        let none = |_: &str| BTreeMap::new();
        assert_eq!(
            registry.outdated(&policy, &["tls"], &none),
            1,
            "only shop's old one"
        );
        assert_eq!(
            registry.outdated(&policy, &[], &none),
            0,
            "a plain target needs nothing"
        );
        // A producer's policy needs the routes capability elsewhere only.
        let producer = fixtures::PolicyBuilder::from(policy).callers(None).build();
        assert_eq!(
            registry.outdated(&producer, &[], &none),
            1,
            "other's old sidecar would run it before its own namespace's"
        );
        assert_eq!(registry.counts(&producer, &none).selected, 3);
    }
}

#[cfg(test)]
mod traffic_tests {
    use super::*;
    use reprise_crds::traffic::TrafficCounts;

    #[test]
    fn only_traffic_for_policies_a_sidecar_was_sent_is_kept() {
        let registry = SidecarRegistry::default();
        registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 1);
        registry.sent(
            "shop",
            "web-0",
            "v1",
            HashMap::from([("shop/reads".to_string(), 1)]),
        );
        let counts = TrafficCounts {
            requests: 5,
            ..TrafficCounts::default()
        };
        let report = TrafficReport {
            traffic: [
                ("shop/reads".to_string(), counts.clone()),
                ("shop/made-up".to_string(), counts.clone()),
            ]
            .into(),
            ..TrafficReport::default()
        };
        assert_eq!(
            registry.record_traffic("shop", "web-0", report.clone(), 1_000),
            Taken::Recorded {
                unknown_policies: 1
            }
        );
        assert_eq!(
            registry.record_traffic("shop", "not-connected", report, 1_000),
            Taken::NotConnected
        );
        let all = registry.traffic().all(1_000);
        assert_eq!(all.keys().collect::<Vec<_>>(), ["shop/reads"]);
        assert_eq!(all["shop/reads"].counts.requests, 5);
    }

    #[test]
    fn a_policy_an_ack_took_out_is_taken_in_the_next_report_only() {
        let registry = SidecarRegistry::default();
        registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 1);
        let both = HashMap::from([("shop/reads".to_string(), 1), ("shop/gone".to_string(), 1)]);
        registry.sent("shop", "web-0", "v1", both);
        registry.ack("shop", "web-0", "v1").expect("ack");
        registry.sent(
            "shop",
            "web-0",
            "v2",
            HashMap::from([("shop/reads".to_string(), 1)]),
        );
        registry.ack("shop", "web-0", "v2").expect("ack");
        let report = TrafficReport {
            traffic: [(
                "shop/gone".to_string(),
                TrafficCounts {
                    requests: 3,
                    ..TrafficCounts::default()
                },
            )]
            .into(),
            ..TrafficReport::default()
        };
        assert_eq!(
            registry.record_traffic("shop", "web-0", report.clone(), 1_000),
            Taken::Recorded {
                unknown_policies: 0
            }
        );
        assert_eq!(
            registry.record_traffic("shop", "web-0", report, 1_000),
            Taken::Recorded {
                unknown_policies: 1
            }
        );
        let t = registry.traffic().window("shop/gone", 1_000).expect("kept");
        assert_eq!(t.counts.requests, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pods_reports_are_paced_across_reconnects_and_end_with_its_final_one() {
        let registry = SidecarRegistry::with_report_interval(std::time::Duration::from_secs(10));
        let policies = HashMap::from([("shop/reads".to_string(), 1)]);
        registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 1);
        registry.sent("shop", "web-0", "v1", policies.clone());
        let report = |requests, last| TrafficReport {
            traffic: [(
                "shop/reads".to_string(),
                TrafficCounts {
                    requests,
                    ..TrafficCounts::default()
                },
            )]
            .into(),
            last,
            ..TrafficReport::default()
        };
        let recorded = Taken::Recorded {
            unknown_policies: 0,
        };
        for _ in 0..3 {
            assert_eq!(
                registry.record_traffic("shop", "web-0", report(1, false), 1_000),
                recorded
            );
        }
        assert_eq!(
            registry.record_traffic("shop", "web-0", report(1_000, false), 1_000),
            Taken::TooSoon
        );
        // A reconnect does not rest the pace.
        registry.connect("shop", "web-0", BTreeMap::new(), BTreeSet::new(), 2);
        registry.sent("shop", "web-0", "v1", policies);
        assert_eq!(
            registry.record_traffic("shop", "web-0", report(1_000, false), 1_000),
            Taken::TooSoon
        );
        tokio::time::advance(std::time::Duration::from_secs(10)).await;
        assert_eq!(
            registry.record_traffic("shop", "web-0", report(2, false), 1_010),
            recorded
        );
        // The final report is taken within the interval; nothing after it.
        assert_eq!(
            registry.record_traffic("shop", "web-0", report(4, true), 1_011),
            recorded
        );
        assert_eq!(
            registry.record_traffic("shop", "web-0", report(1_000, false), 1_011),
            Taken::AfterFinal
        );
        let t = registry
            .traffic()
            .window("shop/reads", 1_011)
            .expect("recorded");
        assert_eq!(t.counts.requests, 9, "3 + 2 + 4; the rest refused");
    }
}
