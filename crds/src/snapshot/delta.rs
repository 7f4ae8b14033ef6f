//! Snapshots as entries, and the deltas between them
//! (`docs/src/concepts/controller.md`, deltas).
//!
//! A sidecar that announces [`CAPABILITY_DELTA`](crate::protocol::CAPABILITY_DELTA)
//! on the upgraded stream receives its whole snapshot once, at connection,
//! then only what changed for it: upstreams and policies added, replaced or
//! removed, and, when only an upstream's endpoints changed, the endpoints
//! added and removed. Bytes per change follow the change, not the snapshot.
//!
//! Every entry has a digest (a content hash, so every controller replica
//! computes the same), and the snapshot's version combines its entries'
//! digests by addition: the version after a delta is computed from the
//! digests that changed, without encoding anything else. An upstream's
//! digest likewise adds its endpoints' digests to its head's (everything but
//! the endpoints), so a patch of one endpoint of five hundred updates it in
//! constant time. Both ends run [`Entries::apply`]: the sidecar checks that
//! the result has the version the controller announced, so an ACK means the
//! sidecar runs exactly what a full recomputation would give it, and asks for
//! the whole snapshot again (a [`Resync`](crate::protocol::Resync) line) when it does not.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Fnv1a, Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream};
use crate::Error;

/// What begins every delta line, so a sidecar tells one from a whole
/// snapshot without parsing it twice (the controller writes compact JSON).
pub const DELTA_PREFIX: &[u8] = b"{\"delta\":";

/// A line of the push stream that carries a delta.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeltaLine {
    /// The delta.
    pub delta: SnapshotDelta,
}

/// What changed between the snapshot of version `base` and that of `version`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotDelta {
    /// The version it applies to: the one the sidecar last received.
    pub base: String,
    /// The version once applied.
    pub version: String,
    /// Upstreams added, or replaced whole (anything but their endpoints changed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<SnapshotUpstream>,
    /// Upstreams of which only endpoints changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<EndpointsPatch>,
    /// Names of upstreams removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_upstreams: Vec<String>,
    /// Policies added or replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<SnapshotPolicy>,
    /// Policies removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_policies: Vec<PolicyRef>,
}

/// The endpoints added to and removed from one upstream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointsPatch {
    /// The upstream's `name`.
    pub upstream: String,
    /// Endpoints added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<SnapshotEndpoint>,
    /// Endpoints removed, as they were.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<SnapshotEndpoint>,
}

/// A policy by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// An upstream's digest: its head's (every field but the endpoints) and
/// the sum of its endpoints'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpstreamDigest {
    /// Digest of everything but the endpoints.
    pub head: u64,
    /// Sum of the endpoints' digests (a multiset: order does not count).
    pub endpoints: u64,
}

impl UpstreamDigest {
    /// The upstream's digest as one number.
    pub fn value(&self) -> u64 {
        spread(self.head.wrapping_add(spread(self.endpoints)))
    }
}

/// An upstream with its digest.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamEntry {
    /// The upstream, endpoints sorted by address and port.
    pub upstream: SnapshotUpstream,
    /// Its digest.
    pub digest: UpstreamDigest,
}

impl UpstreamEntry {
    /// `upstream` with its digest computed.
    pub fn new(mut upstream: SnapshotUpstream) -> Self {
        upstream.endpoints.sort_by(full_order);
        let digest = UpstreamDigest {
            head: head_digest(&upstream),
            endpoints: upstream
                .endpoints
                .iter()
                .fold(0u64, |sum, e| sum.wrapping_add(digest(e))),
        };
        UpstreamEntry { upstream, digest }
    }
}

impl UpstreamEntry {
    /// Where `endpoint` is, or would be put, among the upstream's sorted
    /// endpoints: a sidecar that patches its running endpoints keeps them in
    /// the order a whole snapshot gives.
    pub fn position(&self, endpoint: &SnapshotEndpoint) -> usize {
        self.upstream
            .endpoints
            .partition_point(|x| full_order(x, endpoint).is_lt())
    }
}

/// A policy with its digest.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyEntry {
    /// The policy.
    pub policy: SnapshotPolicy,
    /// Its digest.
    pub digest: u64,
}

impl PolicyEntry {
    /// `policy` with its digest computed.
    pub fn new(policy: SnapshotPolicy) -> Self {
        PolicyEntry {
            digest: digest(&policy),
            policy,
        }
    }

    /// Its name.
    pub fn key(&self) -> PolicyRef {
        PolicyRef {
            namespace: self.policy.namespace.clone(),
            name: self.policy.name.clone(),
        }
    }
}

/// A snapshot as entries with their digests: what deltas are computed
/// between (the controller) and applied to (the sidecar). Entries are shared:
/// cloning a snapshot of a five-hundred-endpoint upstream copies a pointer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Entries {
    /// Upstreams by name.
    pub upstreams: BTreeMap<String, Arc<UpstreamEntry>>,
    /// Policies by namespace and name.
    pub policies: BTreeMap<PolicyRef, Arc<PolicyEntry>>,
}

impl Entries {
    /// The entries of `snapshot` (its version is not read).
    pub fn from_snapshot(snapshot: Snapshot) -> Self {
        let mut entries = Entries::default();
        for u in snapshot.upstreams {
            entries
                .upstreams
                .insert(u.name.clone(), Arc::new(UpstreamEntry::new(u)));
        }
        for p in snapshot.policies {
            let p = PolicyEntry::new(p);
            entries.policies.insert(p.key(), Arc::new(p));
        }
        entries
    }

    /// Leaves out the upstreams that need a capability
    /// ([`SnapshotUpstream::needs`]) not in `capabilities`, with the
    /// policies targeting them and those that need one themselves
    /// ([`SnapshotPolicy::needs`]), and returns the upstreams' names: an older sidecar
    /// would ignore a field it does not know, and send plain text,
    /// credentials included, to a TLS port.
    pub fn for_capabilities(
        &mut self,
        capabilities: &std::collections::BTreeSet<String>,
    ) -> Vec<String> {
        let withheld: Vec<String> = self
            .upstreams
            .values()
            .filter(|u| {
                u.upstream
                    .needs()
                    .iter()
                    .any(|c| !capabilities.contains(*c))
            })
            .map(|u| u.upstream.name.clone())
            .collect();
        for name in &withheld {
            self.upstreams.remove(name);
        }
        // And the policies that need what it lacks (a route's, a producer's),
        // or whose target is withheld.
        self.policies.retain(|_, p| {
            !withheld.contains(&p.policy.upstream)
                && p.policy.needs().iter().all(|c| capabilities.contains(*c))
        });
        withheld
    }

    /// The version of a snapshot of these entries: a hash of their digests,
    /// the same on every replica.
    pub fn version(&self) -> String {
        format!("{:016x}", spread(self.digest_sum()))
    }

    /// The whole snapshot of these entries, versioned by [`Entries::version`].
    pub fn to_snapshot(&self) -> Snapshot {
        Snapshot {
            version: self.version(),
            upstreams: self
                .upstreams
                .values()
                .map(|u| u.upstream.clone())
                .collect(),
            policies: self.policies.values().map(|p| p.policy.clone()).collect(),
        }
    }

    /// What turns `self` into `next`: whole entries for what is new or
    /// changed beyond its endpoints, endpoint patches for the rest. Entries
    /// both share (the same `Arc`) cost nothing.
    pub fn delta_to(&self, next: &Entries) -> SnapshotDelta {
        let mut delta = SnapshotDelta {
            base: self.version(),
            version: next.version(),
            ..SnapshotDelta::default()
        };
        for (name, new) in &next.upstreams {
            match self.upstreams.get(name) {
                Some(old) if Arc::ptr_eq(old, new) || old.digest == new.digest => {}
                Some(old) if old.digest.head == new.digest.head => {
                    delta
                        .endpoints
                        .push(endpoints_patch(&old.upstream, &new.upstream));
                }
                _ => delta.upstreams.push(new.upstream.clone()),
            }
        }
        delta.removed_upstreams = self
            .upstreams
            .keys()
            .filter(|name| !next.upstreams.contains_key(*name))
            .cloned()
            .collect();
        for (key, new) in &next.policies {
            match self.policies.get(key) {
                Some(old) if Arc::ptr_eq(old, new) || old.digest == new.digest => {}
                _ => delta.policies.push(new.policy.clone()),
            }
        }
        delta.removed_policies = self
            .policies
            .keys()
            .filter(|key| !next.policies.contains_key(*key))
            .cloned()
            .collect();
        delta
    }

    /// Applies `delta`. Refused, leaving `self` unchanged, when `self` is not
    /// at its base, when it names an upstream, endpoint or policy `self` does
    /// not have, or when the result's version is not the one it announces.
    /// Checked before anything changes, so that what is applied is patched
    /// in place: an upstream's endpoints are not copied to patch one of them.
    pub fn apply(&mut self, delta: &SnapshotDelta) -> Result<(), Error> {
        let refuse = |reason: String| Err(Error::Delta { reason });
        let base = self.version();
        if base != delta.base {
            return refuse(format!("its base is {} but this runs {base}", delta.base));
        }
        // The version once applied, from the digests that change.
        let mut sum = self.digest_sum();
        for name in &delta.removed_upstreams {
            let Some(old) = self.upstreams.get(name) else {
                return refuse(format!("it removes upstream \"{name}\", which is not here"));
            };
            sum = sum.wrapping_sub(old.digest.value());
        }
        let replaced: Vec<UpstreamEntry> = delta
            .upstreams
            .iter()
            .map(|u| UpstreamEntry::new(u.clone()))
            .collect();
        for new in &replaced {
            if let Some(old) = self.upstreams.get(&new.upstream.name) {
                sum = sum.wrapping_sub(old.digest.value());
            }
            sum = sum.wrapping_add(new.digest.value());
        }
        for patch in &delta.endpoints {
            let name = &patch.upstream;
            let Some(old) = self.upstreams.get(name).filter(|_| {
                !delta.removed_upstreams.contains(name)
                    && !delta.upstreams.iter().any(|u| &u.name == name)
            }) else {
                return refuse(format!(
                    "it patches the endpoints of upstream \"{name}\", which is not here"
                ));
            };
            let mut removed: Vec<&SnapshotEndpoint> = patch.removed.iter().collect();
            removed.sort_by(|a, b| full_order(a, b));
            let mut endpoints = old.digest.endpoints;
            for run in removed.chunk_by(|a, b| full_order(a, b).is_eq()) {
                if count(&old.upstream.endpoints, run[0]) < run.len() {
                    let e = run[0];
                    return refuse(format!(
                        "it removes endpoint {}:{} from \"{name}\", which does not have it",
                        e.address, e.port
                    ));
                }
                for e in run {
                    endpoints = endpoints.wrapping_sub(digest(e));
                }
            }
            for e in &patch.added {
                endpoints = endpoints.wrapping_add(digest(e));
            }
            let new = UpstreamDigest {
                head: old.digest.head,
                endpoints,
            };
            sum = sum
                .wrapping_sub(old.digest.value())
                .wrapping_add(new.value());
        }
        for key in &delta.removed_policies {
            let Some(old) = self.policies.get(key) else {
                return refuse(format!(
                    "it removes policy {}/{}, which is not here",
                    key.namespace, key.name
                ));
            };
            sum = sum.wrapping_sub(old.digest);
        }
        let policies: Vec<PolicyEntry> = delta
            .policies
            .iter()
            .map(|p| PolicyEntry::new(p.clone()))
            .collect();
        for new in &policies {
            if let Some(old) = self.policies.get(&new.key()) {
                sum = sum.wrapping_sub(old.digest);
            }
            sum = sum.wrapping_add(new.digest);
        }
        let version = format!("{:016x}", spread(sum));
        if version != delta.version {
            return refuse(format!(
                "applied, it gives version {version}, not the {} announced",
                delta.version
            ));
        }
        // Checked: now patch.
        for name in &delta.removed_upstreams {
            self.upstreams.remove(name);
        }
        for new in replaced {
            self.upstreams
                .insert(new.upstream.name.clone(), Arc::new(new));
        }
        for patch in &delta.endpoints {
            if let Some(entry) = self.upstreams.get_mut(&patch.upstream) {
                let entry = Arc::make_mut(entry);
                for e in &patch.removed {
                    let at = entry.position(e);
                    entry.upstream.endpoints.remove(at);
                    entry.digest.endpoints = entry.digest.endpoints.wrapping_sub(digest(e));
                }
                for e in &patch.added {
                    let at = entry.position(e);
                    entry.upstream.endpoints.insert(at, e.clone());
                    entry.digest.endpoints = entry.digest.endpoints.wrapping_add(digest(e));
                }
            }
        }
        for key in &delta.removed_policies {
            self.policies.remove(key);
        }
        for new in policies {
            self.policies.insert(new.key(), Arc::new(new));
        }
        Ok(())
    }

    /// The sum of every entry's digest, which the version spreads.
    fn digest_sum(&self) -> u64 {
        self.upstreams
            .values()
            .map(|u| u.digest.value())
            .chain(self.policies.values().map(|p| p.digest))
            .fold(0u64, u64::wrapping_add)
    }
}

/// How many of `sorted` are `e`.
fn count(sorted: &[SnapshotEndpoint], e: &SnapshotEndpoint) -> usize {
    let from = sorted.partition_point(|x| full_order(x, e).is_lt());
    let to = sorted.partition_point(|x| full_order(x, e).is_le());
    to - from
}

/// The endpoints `new` has that `old` has not, and the reverse (both sorted).
fn endpoints_patch(old: &SnapshotUpstream, new: &SnapshotUpstream) -> EndpointsPatch {
    let mut patch = EndpointsPatch {
        upstream: new.name.clone(),
        ..EndpointsPatch::default()
    };
    let (mut a, mut b) = (
        old.endpoints.iter().peekable(),
        new.endpoints.iter().peekable(),
    );
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => patch.removed.extend(a.by_ref().cloned()),
            (None, Some(_)) => patch.added.extend(b.by_ref().cloned()),
            (Some(x), Some(y)) => match full_order(x, y) {
                std::cmp::Ordering::Less => patch.removed.extend(a.next().cloned()),
                std::cmp::Ordering::Greater => patch.added.extend(b.next().cloned()),
                std::cmp::Ordering::Equal => {
                    a.next();
                    b.next();
                }
            },
        }
    }
    patch
}

/// The order of endpoints in a snapshot: address, then port, then the
/// rest, so that two endpoints of one address and port (another pod name or
/// zone) are told apart and a patch finds the one it names.
fn full_order(a: &SnapshotEndpoint, b: &SnapshotEndpoint) -> std::cmp::Ordering {
    (&a.address, a.port, &a.pod, &a.zone).cmp(&(&b.address, b.port, &b.pod, &b.zone))
}

/// The digest of one value: FNV-1a over its JSON, spread.
fn digest<T: Serialize>(value: &T) -> u64 {
    let mut h = HashWriter(Fnv1a::default());
    // Writing to a hasher cannot fail, and our types always serialize.
    let _ = serde_json::to_writer(&mut h, value);
    spread(std::hash::Hasher::finish(&h.0))
}

/// The digest of an upstream's head: every field but `endpoints`.
fn head_digest(u: &SnapshotUpstream) -> u64 {
    digest(&Head(u))
}

/// An upstream without its endpoints, serialized as the upstream's other
/// fields are (a test pins that every field but `endpoints` is in it).
struct Head<'a>(&'a SnapshotUpstream);

impl Serialize for Head<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let u = self.0;
        let mut st = s.serialize_struct("Head", 9)?;
        st.serialize_field("name", &u.name)?;
        st.serialize_field("hosts", &u.hosts)?;
        st.serialize_field("protocol", &u.protocol)?;
        if !u.addresses.is_empty() {
            st.serialize_field("addresses", &u.addresses)?;
        }
        if !u.dns.is_empty() {
            st.serialize_field("dns", &u.dns)?;
        }
        if let Some(h) = &u.host_rewrite {
            st.serialize_field("hostRewrite", h)?;
        }
        if let Some(t) = &u.tls {
            st.serialize_field("tls", t)?;
        }
        if let Some(b) = &u.budget {
            st.serialize_field("budget", b)?;
        }
        st.end()
    }
}

struct HashWriter(Fnv1a);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::hash::Hasher::write(&mut self.0, buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// MurmurHash3's 64-bit finalizer: every input bit reaches every output
/// bit, so that sums of digests of alike values (endpoints that differ in
/// one address byte) do not cancel out as sums of raw FNV values could.
fn spread(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests;
